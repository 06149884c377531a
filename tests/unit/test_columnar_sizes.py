"""buckets/_columnar/sizes.py against the same prefixes counted event by event in plain Python."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from buckets._columnar.sizes import count_reaching, count_within, reply_prefix

SIZES = st.lists(st.integers(1, 5000), min_size=1, max_size=40)
BYTES = st.integers(-10, 100_000)


def _leading(costs: list[int], fits) -> int:
    n, total = 0, 0
    for cost in costs:
        if not fits(total + cost, cost):
            break
        n, total = n + 1, total + cost
    return n


@given(SIZES, BYTES)
def test_count_within_is_how_many_leading_events_fit(sizes: list[int], room: int) -> None:
    assert count_within(np.array(sizes, np.int64), room) == _leading(
        sizes, lambda total, _: total <= room
    )


@given(SIZES, st.integers(1, 100_000))
def test_count_reaching_is_the_fewest_leading_events_that_reach(
    sizes: list[int], total: int
) -> None:
    k = next((i + 1 for i in range(len(sizes)) if sum(sizes[: i + 1]) >= total), len(sizes))
    assert count_reaching(np.array(sizes, np.int64), total) == (k, sum(sizes[:k]))


@given(SIZES, BYTES, st.integers(0, 30), st.integers(0, 6000))
def test_reply_prefix_stops_at_the_room_or_before_a_large_event(
    sizes: list[int], room: int, overhead: int, measure_above: int
) -> None:
    costs = [size + overhead for size in sizes]
    fit = _leading(costs, lambda total, cost: total <= room and cost <= measure_above)
    assert reply_prefix(np.array(sizes, np.int64), room, overhead, measure_above) == (
        fit,
        sum(costs[:fit]),
    )
