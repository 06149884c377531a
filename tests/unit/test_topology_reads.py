"""A live tail reads the shard list once a round (buckets/topology.py): a list of the same bytes
as the last one read is not parsed again, and still moves the mark to its own time; a list that
changed is parsed, and its new shard's reader starts before the mark moves past it."""

from __future__ import annotations

from typing import Any

import bson
import pytest
import trio
from bson import Timestamp
from bson.raw_bson import RawBSONDocument

from buckets import topology
from buckets.topology import Topology, TopologyWatcher
from mongoformats.codecs import RAW

_SHARD0 = {"_id": "shard0", "host": "rs0/a:1", "state": 1}
_SHARD1 = {"_id": "shard1", "host": "rs1/b:2,c:3", "state": 1, "topologyTime": Timestamp(22, 1)}


def _reply(shards: list[dict[str, Any]], secs: int) -> RawBSONDocument:
    signed = {"clusterTime": Timestamp(secs, 1), "signature": {"keyId": bson.Int64(0)}}
    doc = {"shards": shards, "ok": 1.0, "$clusterTime": signed, "operationTime": Timestamp(secs, 1)}
    return RawBSONDocument(bson.encode(doc), RAW)


class _Mongos:
    """listShards answered from a script (raw replies, as an UpstreamConnection's), then fails."""

    def __init__(self, replies: list[RawBSONDocument]) -> None:
        self.replies = replies

    async def command(self, db: str, cmd: dict[str, Any], **_: Any) -> RawBSONDocument:
        assert db == "admin" and "listShards" in cmd
        if not self.replies:
            await trio.sleep_forever()
        return self.replies.pop(0)

    async def aclose(self) -> None:
        pass


async def test_a_list_read_again_unchanged_is_not_parsed_and_a_new_shard_starts_first(
    autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[Timestamp] = []
    parse = topology._topology

    def counted(reply: Any) -> Topology:
        parsed.append(reply["operationTime"])
        return parse(reply)

    monkeypatch.setattr(topology, "_topology", counted)
    replies = [_reply([_SHARD0], 20), _reply([_SHARD0], 21)]
    replies += [_reply([_SHARD0, _SHARD1], 22), _reply([_SHARD0, _SHARD1], 23)]
    mongos = _Mongos(replies)

    async def connect() -> Any:
        return mongos

    known = Topology({"shard0": [("a", 1)]}, {}, Timestamp(10, 1))
    watcher = TopologyWatcher(connect, known, holds_back=lambda: 0.0)
    seen: list[tuple[str, Any]] = []

    async def advance(as_of: Timestamp) -> None:
        seen.append(("mark", as_of))

    def add_shard(sid: str, hosts: list[tuple[str, int]], joined: Timestamp) -> None:
        seen.append(("added", (sid, hosts, joined)))

    with trio.move_on_after(5):
        await watcher.run(advance, add_shard)
    assert seen == [
        ("mark", Timestamp(20, 1)),
        ("mark", Timestamp(21, 1)),
        ("added", ("shard1", [("b", 2), ("c", 3)], Timestamp(22, 1))),
        ("mark", Timestamp(22, 1)),
        ("mark", Timestamp(23, 1)),
    ]
    assert parsed == [Timestamp(20, 1), Timestamp(22, 1)]  # the unchanged lists were not
    assert watcher.checks == 4 and watcher.status()["checkedThrough"] == Timestamp(23, 1)
