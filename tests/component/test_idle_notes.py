"""When idle shards get a note, and when the shard list is re-read: on demand, not on a timer.

The merge may release an event only once every shard's mark is past it (buckets/merge.py). An
idle shard's mark moves only when something is written to its oplog: a server writes a periodic
noop every periodicNoopIntervalSecs (10 s; src/mongo/db/repl/noop_writer.cpp), which is what a
native change stream on mongos waits for; the proxy writes an `appendOplogNote` noop instead
(src/mongo/db/commands/oplog_note.cpp, `_performNoopWrite`: an `op: "n"` entry on the primary),
which its tail then reads like any other entry. These tests drive a ShardReader through its tail's
reports (TailOutput) with a fake primary, and the TopologyWatcher with a fake mongos, on a clock
that only moves when told to: no timing is asserted, only how many notes and reads there are.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from bson import Timestamp

from buckets.budget import ByteBudget
from buckets.oplog_tail import BATCH_ENTRIES, OplogTail
from buckets.reader import (
    NOTE_PATIENCE_S,
    NOTE_SPACING_S,
    PARKED_S,
    URGENT_NOTE_S,
    ShardReader,
)
from buckets.topology import Topology, TopologyWatcher
from mongoformats.change_events import OplogTransformer


class _Primary:
    """Stands in for the connection to a shard's primary: records the notes written to it."""

    def __init__(self) -> None:
        self.notes = 0

    async def command(self, db: str, cmd: dict[str, Any], **_: Any) -> dict[str, Any]:
        assert db == "admin" and "appendOplogNote" in cmd
        self.notes += 1
        return {"ok": 1.0}

    async def aclose(self) -> None:
        pass


class _ScriptedTail(OplogTail):
    """A tail whose reads the test makes: each `read(entries)` delivers a batch of that many
    oplog entries (no events: the noops), then parks in the next awaitData getMore."""

    def __init__(self, primary: _Primary) -> None:
        async def connect(hosts: Any, *, secondary: bool) -> Any:
            assert not secondary  # notes go to the primary
            return primary

        super().__init__(
            "shard1",
            [("member", 27018)],
            start=Timestamp(1, 0),
            skip_key=b"",
            transformer=OplogTransformer(),
            connect_member=connect,
        )  # type: ignore[arg-type]
        self.send, self.recv = trio.open_memory_channel[int](0)
        self.at = 1
        self.arrived = False  # whether the next reply has arrived and waits to be taken

    def reply_arrived(self) -> bool:
        return self.arrived

    async def run(self, out: Any) -> None:
        await out.checked()
        async for entries in self.recv:
            await out.parked(False)
            self.arrived = False
            if entries:
                self.at += 1
                await out.deliver([], 0, entries, Timestamp(self.at, 1))
            await out.parked(True)

    async def read(self, entries: int) -> None:
        """A batch of `entries` entries is read (0: the tail parks again with none, as after
        reconnecting to another member)."""
        await self.send.send(entries)
        await trio.testing.wait_all_tasks_blocked()


async def _reader(
    nursery: trio.Nursery,
) -> tuple[ShardReader, _ScriptedTail, _Primary, dict[str, bool]]:
    primary = _Primary()
    tail = _ScriptedTail(primary)
    reader = ShardReader(tail, budget=ByteBudget(1 << 20))
    waits = {"events": True}  # whether the merge holds events back on this shard's mark
    reader.wants_progress = lambda shard: URGENT_NOTE_S if waits["events"] else None
    send, recv = trio.open_memory_channel[Any](100)
    nursery.start_soon(reader.run, send)
    nursery.start_soon(_drain, recv)
    await trio.testing.wait_all_tasks_blocked()
    return reader, tail, primary, waits


async def _drain(recv: trio.MemoryReceiveChannel[Any]) -> None:
    async for _ in recv:
        pass


async def _nudge(reader: ShardReader) -> None:
    reader.nudge()
    await trio.testing.wait_all_tasks_blocked()


async def test_an_idle_shard_gets_one_note_per_round_trip_while_events_wait(
    mock_clock: Any,
) -> None:
    """A nudge writes a note at once; more nudges write none until the tail has read again (the
    note written covers the events that were waiting then); after that read, a nudge (events
    still wait: they came after the note) writes the next note as soon as NOTE_SPACING_S has
    passed (the clock moves only by that here)."""
    async with trio.open_nursery() as nursery:
        reader, tail, primary, waits = await _reader(nursery)
        await tail.read(1)  # a short reply: the tail has read the shard's oplog to its end
        await _nudge(reader)
        assert primary.notes == 1
        await _nudge(reader)
        await _nudge(reader)
        assert primary.notes == 1
        await tail.read(1)  # the note
        await _nudge(reader)
        assert primary.notes == 1  # not before NOTE_SPACING_S
        mock_clock.jump(NOTE_SPACING_S)
        await trio.testing.wait_all_tasks_blocked()
        assert primary.notes == 2
        await tail.read(1)
        waits["events"] = False  # that note let every waiting event go: no more notes
        await _nudge(reader)
        assert primary.notes == 2
        nursery.cancel_scope.cancel()


async def test_a_note_not_read_back_is_written_again_after_patience(mock_clock: Any) -> None:
    """A note that never comes back (rolled back in a failover, or below the waiting events on
    a shard whose clock lagged) does not hold the merge for good: once NOTE_PATIENCE_S passed,
    a nudge writes another."""
    async with trio.open_nursery() as nursery:
        reader, tail, primary, _ = await _reader(nursery)
        await tail.read(1)
        await _nudge(reader)
        assert primary.notes == 1
        await _nudge(reader)  # events still wait: for the note, or for patience to run out
        assert primary.notes == 1
        mock_clock.jump(NOTE_PATIENCE_S)
        await trio.testing.wait_all_tasks_blocked()
        assert primary.notes == 2
        nursery.cancel_scope.cancel()


async def test_no_note_while_the_shards_next_reply_has_arrived(mock_clock: Any) -> None:
    """A nudge that finds the tail's next reply received and not yet taken writes no note: a
    note's entry would come after that reply, which may move the mark past the waiting events
    by itself. Once the reply is delivered, the merge says again whether events wait, and the
    note put off is written at once then (not after PARKED_S more, as for a shard written this
    fast); a tail that parks again without delivering anything is noted as if nothing had
    arrived."""
    async with trio.open_nursery() as nursery:
        reader, tail, primary, _ = await _reader(nursery)
        for _ in range(40):  # writes PARKED_S / 2 apart: not idle as soon as it parks
            mock_clock.jump(PARKED_S / 2)
            await tail.read(1)
        tail.arrived = True
        await _nudge(reader)
        mock_clock.jump(PARKED_S)  # parked long enough to count as idle
        await trio.testing.wait_all_tasks_blocked()
        assert primary.notes == 0
        await tail.read(1)  # the reply that had arrived
        assert primary.notes == 0
        await _nudge(reader)  # events still wait (they came after it)
        assert primary.notes == 1
        await tail.read(1)  # the note
        mock_clock.jump(NOTE_SPACING_S)
        tail.arrived = True
        await _nudge(reader)
        assert primary.notes == 1
        await tail.read(0)  # nothing delivered
        assert primary.notes == 2
        nursery.cancel_scope.cancel()


async def test_a_reading_tail_gets_no_note(mock_clock: Any) -> None:
    """A tail that is catching up (its last reply was a full batch and it is not parked long)
    moves its mark by itself: nudges write no note until it has read the oplog to its end."""
    async with trio.open_nursery() as nursery:
        reader, tail, primary, _ = await _reader(nursery)
        await tail.read(BATCH_ENTRIES)  # full: more may be there at once
        await _nudge(reader)
        assert primary.notes == 0
        await tail.read(3)  # short: read to the end
        await _nudge(reader)
        assert primary.notes == 1
        nursery.cancel_scope.cancel()


async def test_a_shard_written_faster_than_a_note_is_noted_only_if_its_next_write_is_late(
    mock_clock: Any,
) -> None:
    """A shard whose own writes come less than PARKED_S apart moves its mark by its next write
    sooner than a note's round trip would: a nudge right after a write writes no note, and one
    is written once the tail has waited PARKED_S with nothing read. A shard whose writes slow
    down past PARKED_S apart is noted at once again."""
    async with trio.open_nursery() as nursery:
        reader, tail, primary, _ = await _reader(nursery)
        for _ in range(40):  # writes PARKED_S / 2 apart
            mock_clock.jump(PARKED_S / 2)
            await tail.read(1)
        await _nudge(reader)
        assert primary.notes == 0
        await tail.read(1)  # the next write came: it answers the nudge
        await _nudge(reader)
        assert primary.notes == 0
        mock_clock.jump(PARKED_S)  # it is late
        await trio.testing.wait_all_tasks_blocked()
        assert primary.notes == 1
        await tail.read(1)  # the note: the shard is idle but for it, a nudge writes the next
        mock_clock.jump(NOTE_SPACING_S)
        await _nudge(reader)
        assert primary.notes == 2
        for _ in range(20):  # writes slow down: 20 * PARKED_S apart
            mock_clock.jump(20 * PARKED_S)
            await tail.read(1)
        await _nudge(reader)
        assert primary.notes == 3
        nursery.cancel_scope.cancel()


class _Mongos:
    """Stands in for a connection to mongos: answers listShards at a growing operationTime."""

    def __init__(self) -> None:
        self.reads = 0

    async def command(self, db: str, cmd: dict[str, Any], **_: Any) -> dict[str, Any]:
        assert db == "admin" and "listShards" in cmd
        self.reads += 1
        return {
            "shards": [{"_id": "shard0", "host": "rs0/member:27018"}],
            "operationTime": Timestamp(10 + self.reads, 1),
        }

    async def aclose(self) -> None:
        pass


async def test_the_shard_list_is_read_at_once_while_events_wait_on_it(mock_clock: Any) -> None:
    """listShards's operationTime T says every shard that joined at or before T is listed
    (buckets/topology.py); the watcher's mark moves only by reading it. A nudge reads it at
    once, also right after the last read (no rate limit while events wait), and nudges made
    before the merge took a read's mark are answered by that read."""
    mongos = _Mongos()
    waits = {"events": True}
    marks: list[Timestamp] = []

    async def connect() -> Any:
        return mongos

    watcher = TopologyWatcher(
        connect,
        Topology({"shard0": [("member", 27018)]}, {}, Timestamp(10, 1)),
        holds_back=lambda: URGENT_NOTE_S if waits["events"] else None,
    )

    async def advance(as_of: Timestamp) -> None:
        watcher.nudge()  # the merge's nudges that came while this read was under way
        marks.append(as_of)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watcher.run, advance, lambda *_: None)
        await trio.testing.wait_all_tasks_blocked()
        assert mongos.reads == 0  # nothing waits: no read
        await _nudge(watcher)  # type: ignore[arg-type]
        assert mongos.reads == 1
        await _nudge(watcher)  # type: ignore[arg-type]
        assert mongos.reads == 2 and marks == [Timestamp(11, 1), Timestamp(12, 1)]
        waits["events"] = False
        await _nudge(watcher)  # type: ignore[arg-type]
        assert mongos.reads == 2
        nursery.cancel_scope.cancel()
