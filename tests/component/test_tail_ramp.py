"""A shard's tail asks for its oplog's batches in growing sizes: after a full first batch (a
backlog), the getMores that follow ask for oplog_tail.RAMP_ENTRIES, one round trip each, before
the exhaust getMore that streams batches of BATCH_ENTRIES (a stream's merge waits for every
shard's batch, and a large first one took the shards' members long to make). A short batch (the
oplog's end) ends the ramp: a live tail's first getMore is the exhaust one, as before.

The member is scripted (no sockets): it serves an oplog of noop entries and records each
request's batch size and whether it allowed exhaust."""

from __future__ import annotations

from typing import Any

import bson
import pytest
from bson import Int64, Timestamp

from buckets._columnar.oplog_batch import SLACK
from buckets.oplog_tail import BATCH_ENTRIES, FIRST_BATCH_ENTRIES, RAMP_ENTRIES, OplogTail
from mongoformats.change_events import OplogTransformer

START = Timestamp(1_800_000_000, 1)


class _Member:
    """An oplog of `entries` noops, served from the start, and `later` more written once a batch
    came short of its size (the tail read to the oplog's end); the cursor ends with the last."""

    address = "member:27018"

    def __init__(self, entries: int, later: int = 0) -> None:
        self.entries, self.later = entries, later
        self.served = 0
        self.streaming = False
        self.asked: list[tuple[str, int, bool]] = []  # (command, batchSize, exhaust)

    def _batch(self, size: int, field: str) -> tuple[bytearray, int]:
        take = min(size, self.entries - self.served)
        batch = [
            {"op": "n", "ns": "", "o": {"msg": "periodic noop"}, "ts": Timestamp(START.time, i + 1)}
            for i in range(self.served, self.served + take)
        ]
        self.served += take
        if take < size:
            self.entries, self.later = self.entries + self.later, 0
        cursor_id = 7 if self.served < self.entries else 0
        cursor = {field: batch, "id": Int64(cursor_id), "ns": "local.oplog.rs"}
        return bytearray(bson.encode({"cursor": cursor, "ok": 1.0}) + bytes(SLACK)), 0

    async def command_in_place(
        self, db: str, cmd: dict[str, Any], *, exhaust: bool = False, **_: Any
    ) -> tuple[bytearray, int]:
        name = next(iter(cmd))
        self.asked.append((name, cmd["batchSize"], exhaust))
        self.streaming = exhaust
        return self._batch(cmd["batchSize"], "firstBatch" if name == "find" else "nextBatch")

    async def more_in_place(self, **_: Any) -> tuple[bytearray, int]:
        self.asked.append(("more", BATCH_ENTRIES, True))
        return self._batch(BATCH_ENTRIES, "nextBatch")


class _Output:
    def __init__(self) -> None:
        self.entries = 0

    async def deliver(self, events: list[Any], nbytes: int, entries: int, last_ts: Any) -> None:
        self.entries += entries

    async def checked(self) -> None: ...
    async def parked(self, waiting: bool) -> None: ...
    async def idle(self) -> None: ...
    async def connected(self, host: str, reconnects: int) -> None: ...
    async def lost(self, error: str, reconnects: int) -> None: ...


async def _asked(entries: int, later: int = 0) -> list[tuple[str, int, bool]]:
    member = _Member(entries, later)

    async def connect(hosts: Any, *, secondary: bool) -> Any:
        return member

    tail = OplogTail(
        "shard0",
        [("member", 27018)],
        start=START,
        skip_key=b"",
        transformer=OplogTransformer(),
        connect_member=connect,  # type: ignore[arg-type]
    )
    out = _Output()
    await tail._tail(member, out)  # type: ignore[arg-type]
    assert out.entries == entries + later  # every entry delivered, once
    return member.asked


async def test_a_backlog_is_read_in_growing_batches_then_streamed() -> None:
    entries = FIRST_BATCH_ENTRIES + sum(RAMP_ENTRIES) + 2 * BATCH_ENTRIES + 5
    asked = await _asked(entries)
    assert asked[0] == ("find", FIRST_BATCH_ENTRIES, False)
    assert asked[1 : 1 + len(RAMP_ENTRIES)] == [("getMore", n, False) for n in RAMP_ENTRIES]
    assert asked[1 + len(RAMP_ENTRIES)] == ("getMore", BATCH_ENTRIES, True)
    assert all(a == ("more", BATCH_ENTRIES, True) for a in asked[2 + len(RAMP_ENTRIES) :])


@pytest.mark.parametrize("entries", [FIRST_BATCH_ENTRIES - 1, FIRST_BATCH_ENTRIES + 10])
async def test_a_short_batch_ends_the_ramp(entries: int) -> None:
    """Fewer entries than a batch asked for: the oplog's end is reached, so the next getMore
    streams (a live tail's wait for new entries is an exhaust getMore's, as before)."""
    asked = await _asked(entries, later=BATCH_ENTRIES + 1)
    short = 0 if entries < FIRST_BATCH_ENTRIES else 1  # the find's batch, or the first getMore's
    assert asked[short][1] > entries - (FIRST_BATCH_ENTRIES if short else 0)
    assert asked[short + 1] == ("getMore", BATCH_ENTRIES, True)
    assert all(a == ("more", BATCH_ENTRIES, True) for a in asked[short + 2 :])
