"""The engine's short reads of mongos at a stream's open (hello, the shard list) share one kept
connection (buckets/spare_upstream.py): later opens pay no connect or login; a spare that mongos
closed while it was idle is replaced without failing the read; a failed or cancelled read's
connection (out of step) is never kept; and a mongos is asked only for its shard list once it
is known to be one."""

from __future__ import annotations

from typing import Any

import bson
import pytest
import trio
from bson import Timestamp
from bson.raw_bson import RawBSONDocument

from buckets.config import EngineConfig
from buckets.cursors import CursorRegistry
from buckets.spare_upstream import SpareUpstream
from buckets.streams import StreamSet
from mongoformats.codecs import RAW
from mongoformats.errors import ConnectionLost, MongoError


def _raw(doc: dict[str, Any]) -> RawBSONDocument:
    return RawBSONDocument(bson.encode({"ok": 1.0, **doc}), RAW)


_HELLO_MONGOS = _raw({"msg": "isdbgrid", "maxWireVersion": 21})
_SHARDS = _raw(
    {"shards": [{"_id": "shard0", "host": "rs0/a:1"}], "operationTime": Timestamp(20, 1)}
)


class _Conn:
    """A connection answering hello and listShards; `lost` makes its next command fail as a
    connection mongos closed."""

    def __init__(self, log: list[str], n: int) -> None:
        self.log, self.n = log, n
        self.lost = False
        self.closed = False

    async def command(self, db: str, cmd: dict[str, Any], **_: Any) -> RawBSONDocument:
        name = next(iter(cmd))
        self.log.append(f"{name}@{self.n}")
        if self.lost:
            raise ConnectionLost("mongos closed the connection")
        await trio.sleep(0)
        return _HELLO_MONGOS if name == "hello" else _SHARDS

    async def aclose(self) -> None:
        self.closed = True


class _Mongos:
    def __init__(self) -> None:
        self.log: list[str] = []
        self.opened: list[_Conn] = []

    async def connect(self) -> Any:
        conn = _Conn(self.log, len(self.opened))
        self.opened.append(conn)
        return conn


async def _hello(conn: Any) -> Any:
    return await conn.command("admin", {"hello": 1})


async def test_reads_share_one_connection(autojump_clock: Any) -> None:
    mongos = _Mongos()
    spare = SpareUpstream(mongos.connect)
    for _ in range(3):
        assert (await spare.run(_hello))["maxWireVersion"] == 21
    assert len(mongos.opened) == 1 and not mongos.opened[0].closed
    await spare.aclose()
    assert mongos.opened[0].closed


async def test_a_spare_lost_while_idle_is_replaced_and_the_read_runs_again(
    autojump_clock: Any,
) -> None:
    mongos = _Mongos()
    spare = SpareUpstream(mongos.connect)
    await spare.run(_hello)
    mongos.opened[0].lost = True
    assert (await spare.run(_hello))["msg"] == "isdbgrid"
    assert mongos.log == ["hello@0", "hello@0", "hello@1"]
    assert mongos.opened[0].closed and not mongos.opened[1].closed


async def test_a_new_connection_that_fails_fails_the_read(autojump_clock: Any) -> None:
    """Only a kept spare is retried: a read's own new connection failing is the caller's error
    (no loop of retries)."""
    mongos = _Mongos()

    async def lost_at_once() -> Any:
        conn = await mongos.connect()
        conn.lost = True
        return conn

    spare = SpareUpstream(lost_at_once)
    with pytest.raises(ConnectionLost):
        await spare.run(_hello)
    assert mongos.log == ["hello@0"] and mongos.opened[0].closed


async def test_a_failed_or_cancelled_read_keeps_no_connection(autojump_clock: Any) -> None:
    mongos = _Mongos()
    spare = SpareUpstream(mongos.connect)

    async def refused(conn: Any) -> Any:
        raise MongoError("Unauthorized", "not authorized on admin to execute command")

    with pytest.raises(MongoError):
        await spare.run(refused)
    with trio.move_on_after(1):
        await spare.run(lambda conn: trio.sleep_forever())
    assert [c.closed for c in mongos.opened] == [True, True]
    await spare.run(_hello)
    assert len(mongos.opened) == 3


async def test_reads_at_once_each_get_a_connection_and_one_is_kept(autojump_clock: Any) -> None:
    mongos = _Mongos()
    spare = SpareUpstream(mongos.connect)
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(spare.run, _hello)
    assert len(mongos.opened) == 3
    assert sorted(c.closed for c in mongos.opened) == [False, True, True]


async def test_a_mongos_is_asked_hello_once_then_only_for_its_shard_list(
    autojump_clock: Any,
) -> None:
    mongos = _Mongos()
    streams = StreamSet(mongos.connect, None, EngineConfig(), CursorRegistry(600, 1800))  # type: ignore[arg-type]
    for _ in range(3):
        topology = await streams.topology()
        assert topology.shards == {"shard0": [("a", 1)]} and topology.sharded
    # The wire version came with the first hello: no read of its own.
    assert await streams.upstream_wire_version() == 21
    assert mongos.log == ["hello@0", "listShards@0", "listShards@0", "listShards@0"]
    await streams.spare.aclose()
