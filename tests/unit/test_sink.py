"""The replication sink's update operators (bucketspark.sink.update_ops) for awkward paths, without
a cluster (tests/integration/test_sink.py applies events to a target simcluster)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from bucketspark.sink import FLUSH_OPS, _Writer, apply_events, update_ops


def test_plain_paths_stay_update_operators_and_a_truncated_array_is_cut_first() -> None:
    """The usual update needs no pipeline (any target version); an array cut short whose
    elements also changed is two updates, since one may not touch a path and its prefix."""
    key = {"_id": 1}
    plain = update_ops(
        key,
        {
            "updatedFields": {"a.b": 1, "arr.0": 5},
            "removedFields": ["c"],
            "truncatedArrays": [{"field": "arr", "newSize": 2}],
            "disambiguatedPaths": {"arr.0": ["arr", 0]},
        },
    )
    assert [op._doc for op in plain] == [
        {"$push": {"arr": {"$each": [], "$slice": 2}}},
        {"$set": {"a.b": 1, "arr.0": 5}, "$unset": {"c": ""}},
    ]
    dotted = update_ops(
        key,
        {
            "updatedFields": {"a.b": 1},
            "removedFields": [],
            "truncatedArrays": [],
            "disambiguatedPaths": {"a.b": ["a.b"]},
        },
    )
    assert dotted[0]._doc == [
        {
            "$replaceWith": {
                "$setField": {
                    "field": {"$literal": "a.b"},
                    "input": "$$ROOT",
                    "value": {"$literal": 1},
                }
            }
        }
    ]


def test_an_ambiguous_path_without_disambiguated_paths_is_refused_not_guessed() -> None:
    """Without expanded events, `x.0.$y` may be field "0" or element 0: no guess is written."""
    with pytest.raises(ValueError, match="showExpandedEvents"):
        update_ops(
            {"_id": 1}, {"updatedFields": {"x.0.$y": 1}, "removedFields": [], "truncatedArrays": []}
        )
    # Without a dot or a $ the target resolves the digits as the source did: operators.
    assert update_ops(
        {"_id": 1}, {"updatedFields": {"x.0.y": 1}, "removedFields": [], "truncatedArrays": []}
    )[0]._doc == {"$set": {"x.0.y": 1}}


class _Recorder:
    """A stand-in for a pymongo client, database and collection: records the writes it is sent
    (bulk writes as their namespace and the operations' kinds), in the order they arrive."""

    def __init__(self, fail_on: str | None = None, name: str = "") -> None:
        self.log: list[tuple[str, ...]] = []
        self.fail_on = fail_on
        self.name = name

    def _child(self, name: str) -> _Recorder:
        child = _Recorder(self.fail_on, f"{self.name}.{name}".lstrip("."))
        child.log = self.log
        return child

    def __getitem__(self, name: str) -> _Recorder:
        return self._child(name)

    def bulk_write(self, ops: list[Any], ordered: bool) -> None:
        assert ordered
        if self.name == self.fail_on:
            raise RuntimeError(f"the target refused {self.name}")
        self.log.append(("bulk", self.name, *(type(op).__name__ for op in ops)))

    def drop_collection(self, coll: str) -> None:
        self.log.append(("drop", f"{self.name}.{coll}"))


def _insert(coll: str, i: int) -> dict[str, Any]:
    return {
        "operationType": "insert",
        "ns": {"db": "d", "coll": coll},
        "documentKey": {"_id": i},
        "fullDocument": {"_id": i, "v": i},
    }


def test_writes_reach_the_target_in_order_and_ddl_only_after_them() -> None:
    """The writer thread sends each namespace's bulk writes in the order gathered, and a DDL
    event waits until every write before it is applied."""
    target = _Recorder()
    events = [_insert("a", 1), _insert("b", 2), _insert("a", 3), _ddl("a"), _insert("a", 4)]
    stats = apply_events(target, events)  # type: ignore[arg-type]
    assert target.log == [
        ("bulk", "d.a", "ReplaceOne", "ReplaceOne"),
        ("bulk", "d.b", "ReplaceOne"),
        ("drop", "d.a"),
        ("bulk", "d.a", "ReplaceOne"),
    ]
    assert (stats.applied, stats.ddl) == (4, 1)


def _ddl(coll: str) -> dict[str, Any]:
    return {"operationType": "drop", "ns": {"db": "d", "coll": coll}}


def test_a_failed_write_fails_the_apply_and_no_later_write_is_sent() -> None:
    """A bulk write the target refuses is raised to the task; the writes after it are not sent
    (the micro-batch is replayed from its start, and replay is idempotent)."""
    target = _Recorder(fail_on="d.b")
    events = [
        *(_insert("a", i) for i in range(FLUSH_OPS)),
        *(_insert("b", i) for i in range(FLUSH_OPS)),
        *(_insert("c", i) for i in range(3 * FLUSH_OPS)),
    ]
    with pytest.raises(RuntimeError, match="refused d.b"):
        apply_events(target, events)  # type: ignore[arg-type]
    assert [entry[:2] for entry in target.log] == [("bulk", "d.a")]


def test_the_writer_runs_writes_in_order_and_none_after_a_failure() -> None:
    """_Writer: FIFO on one thread; after a failure later writes are skipped, and the failure
    reaches drain."""
    writer = _Writer()
    done: list[int] = []

    def fail() -> None:
        raise RuntimeError("refused")

    try:
        for i in range(5):
            writer.submit(lambda i=i: done.append(i))
        writer.drain()
        assert done == [0, 1, 2, 3, 4]
        with pytest.raises(RuntimeError, match="refused"):
            writer.submit(fail)
            writer.submit(lambda: done.append(99))
            writer.drain()
        assert 99 not in done
    finally:
        writer.close()


def test_a_task_start_freezes_what_the_worker_holds_pandas_included() -> None:
    """A Spark task starts by moving the worker's long-lived objects out of the cyclic
    collector's walk (bucketspark.client.settle_worker_heap): those there before it, and
    pandas' modules, which pyarrow loads at its first conversion of Python values."""
    import gc

    from bucketspark.client import settle_worker_heap

    held = len(gc.get_objects())
    try:
        settle_worker_heap()
        assert "pandas" in sys.modules
        assert gc.get_freeze_count() >= held
    finally:
        gc.unfreeze()
