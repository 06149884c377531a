"""Prefix arithmetic over an EventBlock's event sizes (`EventBlock.sizes`): how many leading
events fit in, or reach, a number of bytes. One cumulative sum in C, not a loop over events, for
the engine's bucket retention and reply cutting (buckets/stream.py)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Sizes = npt.NDArray[np.int64]


def count_within(sizes: Sizes, room: int) -> int:
    """How many leading events fit in `room` bytes."""
    return int(np.searchsorted(np.cumsum(sizes), room, side="right"))


def count_reaching(sizes: Sizes, total: int) -> tuple[int, int]:
    """(the fewest leading events whose bytes reach `total`, all of them if theirs do not, and
    the bytes of those events)."""
    k = min(int(np.searchsorted(np.cumsum(sizes), total)) + 1, len(sizes))
    return k, int(sizes[:k].sum())


def reply_prefix(sizes: Sizes, room: int, overhead: int, measure_above: int) -> tuple[int, int]:
    """(how many leading events go into a reply with `room` bytes left, each costing its size
    plus `overhead`, stopping before the first that costs more than `measure_above`; what they
    cost together)."""
    costs = sizes + overhead
    fit = int(np.searchsorted(np.cumsum(costs), room, side="right"))
    if (large := np.flatnonzero(costs > measure_above)).size:
        fit = min(fit, int(large[0]))
    return fit, int(costs[:fit].sum())
