"""A shard's tail splices a large reply in a worker thread (OplogTail's splice_limiter, see
oplog_tail.SPLICE_THREAD_BYTES) and a small one on the event loop: the events it delivers,
their sort keys and resume tokens, and the ts it delivers them through are those of a tail
that splices every reply on the loop, in the same order. A tail cancelled while a thread
splices its reply waits for that splice to end (no thread is left reading the reply), hands
the limiter's token back, and a tail started afterwards reads as before.

The tail runs against a scripted member connection (no sockets): a `find` reply, then getMore
replies streamed one after another, the last with cursor id 0 (the tail then returns)."""

from __future__ import annotations

import datetime
import threading
import uuid
from typing import Any

import bson
import pytest
import trio
import trio.testing
from bson import Binary, Int64, ObjectId, Timestamp

import buckets.oplog_tail as oplog_tail
from buckets._columnar.event_block import EventBlock
from buckets._columnar.items import hold_blocks
from buckets._columnar.oplog_batch import SLACK
from buckets.budget import BudgetHold, ByteBudget
from buckets.oplog_tail import SPLICE_THREAD_BYTES, OplogTail
from tests.oplog_tails import QuietOutput, handed_tail
from tests.unit.test_txn_batch import _server_transactions

_UI = Binary(uuid.UUID(int=3).bytes, 4)
_WALL = datetime.datetime(2026, 11, 27, tzinfo=datetime.UTC)


def _write(i: int) -> dict[str, Any]:
    """Entry i: an insert, an update of a `u` diff or a delete, as a server writes them."""
    _id = ObjectId(i.to_bytes(12, "big"))
    stamps = {"ts": Timestamp(1_800_000_000, i), "t": Int64(1), "v": Int64(2), "wall": _WALL}
    if i % 3 == 1:
        o = {"$v": 2, "diff": {"u": {"n": i}}}
        return {"op": "u", "ns": "db.c", "ui": _UI, "o": o, "o2": {"_id": _id}, **stamps}
    if i % 3 == 2:
        return {"op": "d", "ns": "db.c", "ui": _UI, "o": {"_id": _id}, **stamps}
    doc = {"_id": _id, "n": i, "pad": "x" * 800}
    return {"op": "i", "ns": "db.c", "ui": _UI, "o": doc, "o2": {"_id": _id}, **stamps}


def _reply(entries: list[Any], cursor_id: int, first: bool = False) -> bytearray:
    batch = "firstBatch" if first else "nextBatch"
    cursor = {batch: entries, "id": Int64(cursor_id), "ns": "local.oplog.rs"}
    return bytearray(bson.encode({"cursor": cursor, "ok": 1.0}) + bytes(SLACK))


def _scripted() -> list[bytearray]:
    """A large first batch, a large one with transactions amid it, small ones (a live tail's),
    an empty one, and a last large one that ends the cursor."""
    large = [_write(i) for i in range(1, 1501)]
    txns = [bson.decode(e) for e in _server_transactions(5000)]
    replies = [
        _reply(large[:1000], 7, first=True),
        _reply(large[1000:1200] + txns + [_write(i) for i in range(6000, 7000)], 7),
        _reply([_write(7001)], 7),
        _reply([], 7),
        _reply([_write(i) for i in range(7002, 7005)], 7),
        _reply([_write(i) for i in range(8000, 9500)], 0),
    ]
    assert len(replies[0]) >= SPLICE_THREAD_BYTES and len(replies[2]) < SPLICE_THREAD_BYTES
    return replies


_SCRIPT = _scripted()


def _replies() -> list[bytearray]:
    """The scripted replies, each in a buffer of its own (as each receive makes one)."""
    return [bytearray(r) for r in _SCRIPT]


class _Member:
    """A secondary that streams the scripted replies."""

    address = "member:27018"
    streaming = True

    def __init__(self, replies: list[bytearray]) -> None:
        self.replies = replies

    async def command_in_place(self, db: str, cmd: dict[str, Any], **_: Any) -> tuple[Any, int]:
        assert "find" in cmd
        return self.replies.pop(0), 0

    async def more_in_place(self, **_: Any) -> tuple[Any, int]:
        await trio.lowlevel.checkpoint()
        return self.replies.pop(0), 0

    async def aclose(self) -> None:
        pass


class _Output(QuietOutput):
    """The merge's end of the tail: what it delivered, as fields, and each batch's last ts; each
    block charged to `budget` until it is let go (as ShardReader charges its shard's)."""

    def __init__(self) -> None:
        self.budget = ByteBudget(1 << 40)
        self.events: list[Any] = []
        self.held: list[Any] = []  # what the merge and the buckets keep
        self.through: list[Timestamp] = []

    def _charge(self, n: int) -> BudgetHold:
        assert self.budget.try_acquire(n)
        return BudgetHold(self.budget, n)

    async def deliver(self, events: list[Any], nbytes: int, entries: int, last_ts: Any) -> None:
        hold_blocks(events, self._charge)
        self.held += events
        for item in events:
            self.events += item.fields() if type(item) is EventBlock else [item]
        self.through.append(last_ts)


def _tail(limiter: trio.CapacityLimiter | None) -> OplogTail:
    return handed_tail(splice_limiter=limiter)


async def _read(limiter: trio.CapacityLimiter | None) -> _Output:
    out = _Output()
    await _tail(limiter)._tail(_Member(_replies()), out)  # type: ignore[arg-type]
    return out


async def test_a_tail_splicing_in_threads_delivers_what_one_on_the_loop_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spliced_on: list[tuple[int, bool]] = []  # (reply size, in a worker thread)
    loop_thread = threading.get_ident()
    splice = oplog_tail.splice_reply

    def recorded(data: Any, *args: Any) -> Any:
        spliced_on.append((len(data), threading.get_ident() != loop_thread))
        return splice(data, *args)

    monkeypatch.setattr(oplog_tail, "splice_reply", recorded)
    inline = await _read(None)
    assert not any(threaded for _, threaded in spliced_on)
    spliced_on.clear()
    threaded = await _read(trio.CapacityLimiter(1))
    assert [t for _, t in spliced_on] == [n >= SPLICE_THREAD_BYTES for n, _ in spliced_on]
    assert any(t for _, t in spliced_on) and not all(t for _, t in spliced_on)
    assert threaded.events == inline.events
    assert threaded.through == inline.through
    assert len(inline.events) > 3700  # every write, and the transactions' events


async def test_a_tail_cancelled_mid_splice_waits_for_its_thread_and_leaves_nothing_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started, go, finished = threading.Event(), threading.Event(), threading.Event()
    splice = oplog_tail.splice_reply

    def held(*args: Any) -> Any:
        if threading.current_thread() is not threading.main_thread() and not started.is_set():
            started.set()
            go.wait()
            out = splice(*args)
            finished.set()
            return out
        return splice(*args)

    monkeypatch.setattr(oplog_tail, "splice_reply", held)
    limiter = trio.CapacityLimiter(1)
    out = _Output()
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_tail(limiter)._tail, _Member(_replies()), out)
            await trio.to_thread.run_sync(started.wait)
            scope.cancel()
            try:
                with trio.CancelScope(shield=True):
                    await trio.sleep(0.05)  # the tail stays in its splice: cancelled, not out
                assert not finished.is_set()
            finally:
                go.set()
    assert scope.cancelled_caught and finished.is_set()
    assert limiter.borrowed_tokens == 0
    assert out.budget.used
    out.held.clear()  # the merge and the buckets let the delivered blocks go
    # The worker thread may hold its splice's result a moment longer: its last reference goes
    # there, and the charge comes back to the loop (BudgetHold).
    with trio.fail_after(10):
        while out.budget.used:
            await trio.sleep(0.01)
    # The next tail, with the same limiter, reads the whole oplog as one on the loop does.
    monkeypatch.setattr(oplog_tail, "splice_reply", splice)
    assert (await _read(limiter)).events == (await _read(None)).events


async def test_a_hold_freed_in_a_worker_thread_is_released_on_the_loop() -> None:
    """A block's charge (BudgetHold) let go in another thread (a collection that a splice's
    worker runs frees what it finds there) returns to the budget on the event loop's thread,
    and wakes a reader waiting for room, as one let go on the loop does."""
    budget = ByteBudget(100)
    assert budget.try_acquire(100)
    held = [BudgetHold(budget, 100)]
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(budget.acquire, 60)
            await trio.testing.wait_all_tasks_blocked()
            worker = threading.Thread(target=held.clear)  # the last reference goes there
            worker.start()
            await trio.to_thread.run_sync(worker.join)
    assert budget.used == 60


class _CountingMember(_Member):
    """The scripted member, counting the replies it has handed over (the find's included)."""

    handed = 0

    async def command_in_place(self, db: str, cmd: dict[str, Any], **_: Any) -> tuple[Any, int]:
        self.handed += 1
        return await super().command_in_place(db, cmd)

    async def more_in_place(self, **_: Any) -> tuple[Any, int]:
        got = await super().more_in_place()
        self.handed += 1
        return got


async def test_a_tail_receives_the_next_streamed_batch_while_it_splices_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A member makes an exhaust cursor's next batch once the last is sent, and a 16 MiB batch
    fits in no socket buffer: the tail receives batch k+1 while a worker thread splices batch k
    (oplog_tail._ReadAhead), and no further ahead than that one."""
    member = _CountingMember(_replies())
    seen: list[tuple[int, int]] = []  # (the batch spliced, batches handed over meanwhile)
    splice = oplog_tail.splice_reply
    spliced = 0

    def watched(*args: Any) -> Any:
        nonlocal spliced
        k, spliced = spliced, spliced + 1
        if threading.current_thread() is not threading.main_thread() and k + 1 < len(_SCRIPT):
            # Every task of the loop waits (the tail on this splice, its read-ahead on the tail
            # or on the member): as many batches are handed over as ever will be meanwhile.
            trio.from_thread.run(trio.testing.wait_all_tasks_blocked)
            seen.append((k, member.handed))
        return splice(*args)

    monkeypatch.setattr(oplog_tail, "splice_reply", watched)
    out = _Output()
    with trio.fail_after(30):
        await _tail(trio.CapacityLimiter(1))._tail(member, out)  # type: ignore[arg-type]
    assert seen and seen == [(k, k + 2) for k, _ in seen]
    assert out.events == (await _read(None)).events
