"""A stream opens its shards at once: each shard's reader connects, checks its history and
opens its find on its own, so a shard whose member is slow to answer holds up no other shard's
set-up (the open itself waits for every shard's check, as it must to fail at once when one
shard's history is lost). A shard whose check fails fails the open with the server's error,
and the other shards' set-ups under way are cancelled and leave no connection open.

Members are scripted connections (no sockets); one shard's connect waits on the test."""

from __future__ import annotations

from typing import Any

import bson
import trio
import trio.testing
from bson import Int64, Timestamp
from bson.raw_bson import RawBSONDocument

from buckets._columnar.oplog_batch import SLACK
from buckets.stream import ParallelStream, StreamOptions
from buckets.topology import Topology
from mongoformats.codecs import RAW
from mongoformats.errors import MongoError
from mongoformats.resume_token import high_water_mark, token_sort_key

START = Timestamp(1_800_000_000, 5)
SHARDS = ["shard0", "shard1", "shard2", "shard3"]


def _oldest(ts: Timestamp) -> RawBSONDocument:
    entry = {"op": "n", "ns": "", "o": {"msg": "periodic noop"}, "ts": ts}
    cursor = {"firstBatch": [entry], "id": Int64(0), "ns": "local.oplog.rs"}
    return RawBSONDocument(bson.encode({"cursor": cursor, "ok": 1.0}), RAW)


class _Member:
    """One shard's member: its oldest entry is at `oldest`; its find opens a cursor with an
    empty first batch, whose getMores wait forever (an idle oplog)."""

    def __init__(self, shard: str, oldest: Timestamp, log: list[str]) -> None:
        self.shard, self.oldest, self.log = shard, oldest, log
        self.address = f"{shard}:27018"
        self.closed = False
        self.streaming = False

    async def command_in_place_after(
        self, before: Any, vet: Any, db: str, cmd: dict[str, Any], **_: Any
    ) -> tuple[bytes, int]:
        self.log.append(f"{self.shard} opens")
        await vet(_oldest(self.oldest))
        cursor = {"firstBatch": [], "id": Int64(7), "ns": "local.oplog.rs"}
        return bson.encode({"cursor": cursor, "ok": 1.0}) + bytes(SLACK), 0

    async def command_in_place(self, db: str, cmd: dict[str, Any], **_: Any) -> Any:
        assert "getMore" in cmd
        await trio.sleep_forever()

    def reply_arrived(self) -> bool:
        return False

    async def aclose(self) -> None:
        self.closed = True


class _Connector:
    """Connects to each shard's member at once, but to `slow`'s only once `release` is set."""

    def __init__(self, slow: str, lost: str | None = None) -> None:
        self.slow, self.lost = slow, lost
        self.release = trio.Event()
        self.log: list[str] = []
        self.members: list[_Member] = []
        self.health = self

    def failed(self, address: str, error: str) -> None: ...

    async def __call__(self, hosts: list[tuple[str, int]], *, secondary: bool) -> _Member:
        shard = hosts[0][0]
        if shard == self.slow:
            await self.release.wait()
        # A shard whose oplog was truncated past the start point.
        oldest = Timestamp(START.time, 9) if shard == self.lost else Timestamp(START.time, 1)
        member = _Member(shard, oldest, self.log)
        self.members.append(member)
        return member


def _stream(connector: _Connector) -> ParallelStream:
    topology = Topology(
        {s: [(s, 27018)] for s in SHARDS}, {}, Timestamp(START.time, 1), sharded=False
    )
    return ParallelStream(
        "s",
        StreamOptions(n_buckets=2),
        topology,
        START,
        [token_sort_key(high_water_mark(START))] * 2,
        connect_member=connector,  # type: ignore[arg-type]
    )


async def test_a_slow_shard_holds_up_no_other_shards_set_up() -> None:
    connector = _Connector(slow="shard0")
    stream = _stream(connector)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.run)
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(connector.log) == ["shard1 opens", "shard2 opens", "shard3 opens"]
        assert not stream.started.is_set()  # the open waits for every shard's check
        connector.release.set()
        await stream.started.wait()
        assert stream.error is None and connector.log[-1] == "shard0 opens"
        stream.close()
    assert all(m.closed for m in connector.members)


async def test_a_shard_whose_history_is_lost_fails_the_open_and_stops_the_others() -> None:
    connector = _Connector(slow="shard0", lost="shard2")
    stream = _stream(connector)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.run)
        await stream.started.wait()  # (shard0 is still connecting: cancelled)
    assert isinstance(stream.error, MongoError) and stream.error.code == 286
    assert "shard2" in stream.error.errmsg
    assert len(connector.members) == 3 and all(m.closed for m in connector.members)
