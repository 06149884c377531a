"""The DDL-noop path's plan: which shards' holders get the notes
(tests/integration/test_ddl_notes.py has the notes turned into events against simcluster)."""

from __future__ import annotations

from buckets.ddl_notes import plan_notes


def test_plan_notes_targets_the_holders() -> None:
    before = {"shard0": {"name": "c", "type": "collection", "options": {}, "info": {"uuid": "u"}}}
    notes = plan_notes(
        {"createIndexes": "c", "indexes": [{"key": {"a": 1}, "name": "a_1"}]}, "d.c", before, before
    )
    assert [(n.op_type, n.shards, n.operation_description) for n in notes] == [
        ("createIndexes", ("shard0",), {"indexes": [{"v": 2, "key": {"a": 1}, "name": "a_1"}]})
    ]
    # A collection's drop is native on every version: no note; a view's drop gets one.
    assert plan_notes({"drop": "c"}, "d.c", before, {}) == []
    assert plan_notes({"drop": "v"}, "d.v", {"shard1": {"type": "view"}}, {})[0].shards == (
        "shard1",
    )
    assert plan_notes({"collMod": "c"}, "d.c", before, before) == []
