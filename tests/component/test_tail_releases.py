"""A shard's tail keeps nothing of a batch it delivered: each block's charge returns to the shard's
budget when the merge and the buckets let the block go (buckets/budget.py, BudgetHold), so a
reference left in the tail's own frame would hold the budget, and stop the reader, for as long as
that frame lives. The frame lives on in the traceback of an error raised while the next reply is
awaited (a member's CursorNotFound, code 43) for as long as anything keeps that error; a log
handler that keeps records keeps it (pytest's own capture does).

The tail runs against a scripted member connection (no sockets): a `find` reply of server-shaped
insert entries, then a getMore that fails with CursorNotFound."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import bson
import pytest
from bson import Binary, Int64, ObjectId, Timestamp

from buckets._columnar.event_block import EventBlock
from buckets._columnar.items import hold_blocks
from buckets._columnar.oplog_batch import SLACK
from mongoformats.errors import MongoError
from tests.oplog_tails import QuietOutput, handed_tail

ENTRIES = 400  # enough for the batch to be spliced as a block (batch_splice.BATCH_MIN)


def _find_reply() -> bytearray:
    ui = Binary(uuid.uuid4().bytes, 4)
    wall = datetime.datetime(2026, 11, 27, tzinfo=datetime.UTC)
    ids = [ObjectId() for _ in range(ENTRIES)]
    entries = [  # in the server's field order, which the block splice reads at fixed offsets
        {
            "op": "i",
            "ns": "db.c",
            "ui": ui,
            "o": {"_id": ids[i], "n": i},
            "o2": {"_id": ids[i]},
            "ts": Timestamp(1_800_000_000, i + 1),
            "t": Int64(1),
            "v": Int64(2),
            "wall": wall,
        }
        for i in range(ENTRIES)
    ]
    reply = bson.encode(
        {"cursor": {"firstBatch": entries, "id": Int64(7), "ns": "local.oplog.rs"}, "ok": 1.0}
    )
    return bytearray(reply + bytes(SLACK))


class _Member:
    """A secondary whose oplog cursor is timed out after its first batch."""

    address = "member:27018"
    streaming = True

    async def command_in_place(self, db: str, cmd: dict[str, Any], **_: Any) -> tuple[Any, int]:
        assert "find" in cmd
        return _find_reply(), 0

    async def more_in_place(self, **_: Any) -> tuple[Any, int]:
        raise MongoError("CursorNotFound", "cursor id 7 not found")

    async def aclose(self) -> None:
        pass


class _Charge:
    """Stands in for a BudgetHold: counts itself out when the last reference goes."""

    def __init__(self, live: set[int], n: int) -> None:
        self.live = live
        live.add(id(self))

    def __del__(self) -> None:
        self.live.discard(id(self))


class _Output(QuietOutput):
    """The merge's end of the tail: holds each delivered batch until `let_go`."""

    def __init__(self) -> None:
        self.live: set[int] = set()
        self.delivered: list[Any] = []

    async def deliver(self, events: list[Any], nbytes: int, entries: int, last_ts: Any) -> None:
        hold_blocks(events, lambda n: _Charge(self.live, n))
        self.delivered += events


async def test_an_error_awaiting_the_next_reply_keeps_no_delivered_block() -> None:
    out = _Output()
    with pytest.raises(MongoError) as caught:
        await handed_tail()._tail(_Member(), out)  # type: ignore[arg-type]
    assert caught.value.code == 43
    assert any(type(item) is EventBlock for item in out.delivered)
    assert out.live
    out.delivered.clear()  # the merge and the buckets let the batch go
    assert not out.live, "the error's traceback keeps a delivered block's charge"
