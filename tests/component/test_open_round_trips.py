"""A shard's tail opens in one round trip: the history check (the oplog's oldest entry) and the
tailable find are sent at once, and the member, which answers a connection's messages one at a
time in the order they came (src/mongo/transport/README.md in mongodb/mongo: a session sources
the next message only once it has sunk its reply to the last), runs the check first, whole. The
check stays as strict: a start point older than the oldest entry fails with
ChangeStreamHistoryLost (286) before the find's reply is read, the tail is never told it was
checked, the cursor the find opened behind it is killed, and its connection is closed.

The member is scripted over a socket pair: it answers nothing until it holds both messages, so a
tail that waited for the check's answer before sending the find would never be answered."""

from __future__ import annotations

import contextlib
from typing import Any

import bson
import pytest
import trio
from bson import Int64, Timestamp

from buckets._columnar.oplog_batch import SLACK
from buckets.oplog_tail import OplogTail
from mongoformats import wire
from mongoformats.errors import MongoError
from tests.oplog_tails import handed_tail
from wireproxy.upstream import UpstreamConnection

START = Timestamp(1_800_000_000, 5)
ENTRY = {"op": "n", "ns": "", "o": {"msg": "periodic noop"}, "ts": START}


def _reply(request: wire.OpMsg, doc: dict[str, Any]) -> bytes:
    return wire.encode_op_msg(100 + request.request_id, request.request_id, bson.encode(doc))


def _batch(entries: list[Any], cursor_id: int = 0) -> dict[str, Any]:
    cursor = {"firstBatch": entries, "id": Int64(cursor_id), "ns": "local.oplog.rs"}
    return {"cursor": cursor, "ok": 1.0}


async def _member(
    stream: trio.SocketStream, check: dict[str, Any], seen: list[Any], fails: bool
) -> None:
    """Take two messages, then answer them in order: `check` to the first, a batch of one entry
    to the second (the tailable find); if the check `fails`, answer one more (a killCursors)."""
    framer = wire.MessageFramer()
    got: list[wire.OpMsg] = []
    async with stream:
        while len(got) < 2:
            msg = framer.next_message()
            if msg is wire.NEED_DATA:
                framer.receive_data(await stream.receive_some(1 << 16))
                continue
            assert isinstance(msg, wire.OpMsg)
            got.append(msg)
        seen.extend(bson.decode(m.body) for m in got)
        await stream.send_all(_reply(got[0], check))
        # (the tail may have closed the connection after a failed check)
        with contextlib.suppress(trio.BrokenResourceError):
            await stream.send_all(_reply(got[1], _batch([ENTRY], 42)))
            if not fails:
                return
            # After a failed check, the tail kills the cursor the find opened, then closes.
            while (msg := framer.next_message()) is wire.NEED_DATA:
                if not (data := await stream.receive_some(1 << 16)):
                    return
                framer.receive_data(data)
            assert isinstance(msg, wire.OpMsg)
            seen.append(bson.decode(msg.body))
            await stream.send_all(_reply(msg, {"cursorsKilled": [Int64(42)], "ok": 1.0}))


class _Output:
    def __init__(self) -> None:
        self.times_checked = 0

    async def checked(self) -> None:
        self.times_checked += 1


def _tail() -> OplogTail:
    return handed_tail(start=START)


async def _open(
    check: dict[str, Any], fails: bool = False
) -> tuple[Any, _Output, list[Any], UpstreamConnection]:
    ours, theirs = trio.socket.socketpair()
    conn = UpstreamConnection(trio.SocketStream(ours), "member:27018")
    out, seen = _Output(), []
    result: Any = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_member, trio.SocketStream(theirs), check, seen, fails)
        with trio.fail_after(10):
            try:
                result = await _tail()._open_checked(conn, out)  # type: ignore[arg-type]
            except MongoError as exc:
                result = exc
    return result, out, seen, conn


async def test_the_check_and_the_find_go_at_once_and_the_check_runs_first() -> None:
    oldest = _batch([{**ENTRY, "ts": Timestamp(START.time, 1)}])
    (data, at), out, seen, conn = await _open(oldest)
    assert [next(iter(cmd)) for cmd in seen] == ["find", "find"]
    assert seen[0]["sort"] == {"$natural": 1} and seen[0]["limit"] == 1
    assert seen[1]["tailable"] and seen[1]["filter"] == {"ts": {"$gte": START}}
    assert bson.decode(bytes(data[at : len(data) - SLACK]))["cursor"]["id"] == 42
    assert out.times_checked == 1 and not conn.closed
    await conn.aclose()


@pytest.mark.parametrize(
    "check",
    [
        _batch([{**ENTRY, "ts": Timestamp(START.time, 6)}]),  # the oplog starts after START
        {"ok": 0.0, "code": 13, "codeName": "Unauthorized", "errmsg": "not authorized"},
    ],
    ids=["history-lost", "check-refused"],
)
async def test_a_failed_check_fails_the_open_and_closes_the_connection(
    check: dict[str, Any],
) -> None:
    error, out, seen, conn = await _open(check, fails=True)
    assert isinstance(error, MongoError)
    assert error.code == (286 if check["ok"] else 13)
    assert out.times_checked == 0 and conn.closed
    # The find still ran behind the check: its tailable cursor is killed, not left to the
    # server's cursor timeout.
    assert seen[2] == {"killCursors": "oplog.rs", "cursors": [42], "$db": "local"}


async def test_an_oplog_that_starts_with_the_set_passes_the_check() -> None:
    """A set's first entry ("initiating set") newer than the start point is its whole history:
    nothing was lost (as before: only the round trips changed)."""
    first = {**ENTRY, "ts": Timestamp(START.time, 9), "o": {"msg": "initiating set"}}
    (data, at), out, _, conn = await _open(_batch([first]))
    assert out.times_checked == 1
    await conn.aclose()
