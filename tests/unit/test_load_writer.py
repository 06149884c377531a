"""benchmarks/load_writer.py: the writers' shared schedule, the load levels a run asks for, what
a writer sends at once, a level's figures, CPU per write and the goal."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pymongo import InsertOne, UpdateOne

from benchmarks.load_writer import (
    LevelPlan,
    WriterResult,
    _send,
    cpu_per_write,
    goal_figures,
    level_figures,
    ops_ahead,
    percentiles,
    plan_levels,
    writes_due,
)


def test_one_writer_owes_its_first_write_at_the_start_and_one_more_each_period() -> None:
    assert writes_due(-0.1, 100.0) == 0
    assert writes_due(0.0, 100.0) == 1
    assert writes_due(0.0099, 100.0) == 1
    assert writes_due(0.01, 100.0) == 2
    assert writes_due(1.0, 100.0) == 101


@given(
    elapsed=st.floats(0.0, 100.0),
    rate=st.floats(1.0, 100_000.0),
    writers=st.integers(1, 8),
)
def test_writers_sharing_a_schedule_owe_together_what_one_writer_would(
    elapsed: float, rate: float, writers: int
) -> None:
    """Writer i of n is due its write j at (j * n + i) / rate: together, evenly spaced writes at
    `rate`, each writer a share that differs from another's by one write at most."""
    shares = [writes_due(elapsed, rate, i, writers) for i in range(writers)]
    # Tolerance for the float rounding of elapsed * rate at a write's exact due time.
    assert abs(sum(shares) - (math.floor(elapsed * rate) + 1)) <= 1
    assert max(shares) - min(shares) <= 1
    assert shares == sorted(shares, reverse=True)


def test_an_unpaced_writer_is_always_owed_more() -> None:
    assert writes_due(0.0, math.inf) > 10**12


def test_levels_are_of_the_catch_up_rate_when_the_cluster_takes_writes_that_fast() -> None:
    plan = plan_levels((0.25, 0.5), max_catchup=1000.0, max_write=2000.0)
    assert plan == LevelPlan(
        "catch-up", 1000.0, {"25%": 250.0, "50%": 500.0}, {"25%": 250.0, "50%": 500.0}
    )


def test_levels_are_of_the_write_rate_when_the_cluster_takes_less_than_the_catch_up_rate() -> None:
    plan = plan_levels((0.25, 0.75), max_catchup=80_000.0, max_write=4000.0)
    assert plan.base == "write"
    assert plan.base_rate == 4000.0
    assert plan.targets == {"25%": 1000.0, "75%": 3000.0}
    assert plan.asked == {"25%": 20_000.0, "75%": 60_000.0}


def test_levels_asked_of_the_catch_up_rate_whatever_the_cluster_takes() -> None:
    plan = plan_levels((0.5,), max_catchup=80_000.0, max_write=None)
    assert plan.base == "catch-up"
    assert plan.targets == plan.asked == {"50%": 40_000.0}


def test_a_writer_generates_its_share_of_the_run_ahead() -> None:
    assert ops_ahead(1000.0, 10.0, 2) >= 5000
    assert ops_ahead(1000.0, 10.0, 2) < ops_ahead(1000.0, 10.0, 1)
    assert ops_ahead(math.inf, 2.0, 2) > ops_ahead(1000.0, 2.0, 2)
    # No more than an unpaced writer's: a rate no writer reaches does not fill the memory.
    assert ops_ahead(1e6, 2.0, 2) == ops_ahead(math.inf, 2.0, 2)


class _Session:
    """A session whose transaction logs its start and its commit (its context's exit)."""

    def __init__(self, log: list[Any], *, transaction: bool = False) -> None:
        self.log = log
        self.transaction = transaction

    def __enter__(self) -> _Session:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.transaction:
            self.log.append("commit")

    def start_transaction(self) -> _Session:
        self.log.append("start")
        return _Session(self.log, transaction=True)


class _Database:
    """Records what a writer sends: (collection, writes, in a session or not)."""

    def __init__(self) -> None:
        self.log: list[Any] = []
        self.client = self

    def start_session(self) -> _Session:
        return _Session(self.log)

    def __getitem__(self, name: str) -> _Collection:
        return _Collection(name, self.log)


class _Collection:
    def __init__(self, name: str, log: list[Any]) -> None:
        self.name = name
        self.log = log

    def bulk_write(self, writes: list[Any], **kwargs: Any) -> None:
        self.log.append((self.name, len(writes), "session" in kwargs))


def test_a_writer_sends_one_bulk_write_per_collection_and_a_transaction_whole() -> None:
    """Writes before a transaction are sent before it (their order within each collection kept),
    the transaction's writes count one each, and `count` takes a transaction as one step."""
    up = UpdateOne({"_id": 1}, {"$inc": {"version": 1}})
    ops = iter(
        [
            ("orders", InsertOne({})),
            ("users", InsertOne({})),
            ("orders", up),
            ("txn", [("orders", up), ("stock", up), ("users", up)]),
            ("stock", up),
            ("orders", up),
        ]
    )
    db = _Database()
    pending: dict[str, list[Any]] = {}
    assert _send(db, ops, 5, pending) == 7
    assert db.log == [
        ("orders", 2, False),
        ("users", 1, False),
        "start",
        ("orders", 1, True),
        ("stock", 1, True),
        ("users", 1, True),
        "commit",
        ("stock", 1, False),
    ]
    assert pending == {}
    assert _send(db, ops, 5, pending) == 1
    assert db.log[-1] == ("orders", 1, False)


def test_a_level_reports_the_rate_asked_and_the_rate_the_writers_reached_together() -> None:
    results = [WriterResult(300, 2.0, 10, 0.03), WriterResult(200, 2.5, 0, 0.02)]
    figures = level_figures(250.0, results, [3.0, 1.0, 2.0, 4.0])
    assert figures["target_rate"] == 250.0
    assert figures["reached_rate"] == 200.0  # 500 writes over the slower writer's 2.5 s
    assert figures["reached_share"] == 0.8
    assert figures["saturated"] is True  # below 90% of the rate asked for
    assert figures["written"] == 500
    assert figures["behind"] == 10
    assert figures["writer_cpu_us_per_write"] == 100.0
    assert figures["events"] == 4
    assert figures["p50_ms"] == 3.0


def test_an_unpaced_level_has_no_target_and_is_saturated_by_definition() -> None:
    figures = level_figures(math.inf, [WriterResult(1000, 1.0, 0, 0.1)], [])
    assert figures["target_rate"] is None
    assert figures["reached_share"] is None
    assert figures["saturated"] is True
    assert "p50_ms" not in figures


def test_percentiles_take_the_nearest_rank() -> None:
    got = percentiles([float(x) for x in range(100, 0, -1)])
    assert got == {
        "p50_ms": 51.0,
        "p90_ms": 91.0,
        "p99_ms": 100.0,
        "max_ms": 100.0,
        "mean_ms": 50.5,
    }
    assert percentiles([]) == {}


def test_cpu_per_write_is_each_parts_cores_over_the_rate_reached() -> None:
    level = {
        "reached_rate": 2000.0,
        "cluster_cpu": 0.3,
        "proxy_cpu": 0.2,
        "proxy_workers_cpu": 0.1,
        "writers_cpu": 0.1,
        "consumers_cpu": 0.04,
    }
    cost = cpu_per_write(level)
    assert cost == pytest.approx(
        {"cluster": 150.0, "proxy": 150.0, "writers": 50.0, "consumers": 20.0}
    )


def test_the_goal_is_met_only_at_the_catch_up_fraction_reached() -> None:
    reached = {"p99_ms": 40.0, "saturated": False}
    assert goal_figures(reached, "catch-up")["met"] is True
    assert goal_figures({"p99_ms": 140.0, "saturated": False}, "catch-up")["met"] is False
    # Within the bound, but at a rate below the one asked for: not the goal.
    assert goal_figures({"p99_ms": 40.0, "saturated": True}, "catch-up")["met"] is False
    on_write = goal_figures(reached, "write")
    assert on_write["met"] is False
    assert on_write["p99_within"] is True
    assert on_write["level"] == "50% of the maximum write rate"
    assert goal_figures({}, "write") == {
        "level": "50% of the maximum write rate",
        "p99_ms": None,
        "p99_within": False,
        "met": False,
    }
