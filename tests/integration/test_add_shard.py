"""A shard added while streams run: simcluster's `addShard`, mongos's native stream and the engine
both read the new shard from the time it joined, so nothing written there is lost."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from pymongo.errors import OperationFailure

from simcluster import SimCluster, open_cluster
from tests.conftest import _close_all, client, proxy_uri, sync
from tests.integration.test_engine import drain, end_point, key, reference
from wireproxy.app import serve_proxy
from wireproxy.config import ProxyConfig


@pytest.fixture
async def growing() -> Any:
    """Two shards and one spare replica set, with the proxy in front."""
    async with open_cluster(shards=2, spare_shards=1) as cluster, trio.open_nursery() as nursery:
        server = await nursery.start(serve_proxy, ProxyConfig(upstream=cluster.uri, listen_port=0))
        yield cluster, server
        await sync(_close_all)
        nursery.cancel_scope.cancel()


def add_spare(c: Any, cluster: SimCluster) -> str:
    spare = cluster.replsets.get("shard2") or cluster.spares["shard2"]
    return str(c.admin.command("addShard", f"{spare.set_name}/{spare.hosts[0]}")["shardAdded"])


async def test_add_shard_errors_and_listing(growing):
    cluster, _ = growing

    def work() -> None:
        c = client(cluster.uri)
        with pytest.raises(OperationFailure) as info:
            c.admin.command("addShard", "nowhere/127.0.0.1:1")
        assert info.value.code == 96  # OperationFailed: nothing answers there
        spare = cluster.spares["shard2"]
        with pytest.raises(OperationFailure) as info:
            c.admin.command("addShard", f"wrongName/{spare.hosts[0]}")
        assert info.value.code == 96 and "does not belong to replica set" in str(info.value)
        before = c.admin.command("ping")["operationTime"]
        assert add_spare(c, cluster) == "shard2"
        assert add_spare(c, cluster) == "shard2"  # adding it again answers the same
        shards = {s["_id"]: s for s in c.admin.command("listShards")["shards"]}
        assert sorted(shards) == ["shard0", "shard1", "shard2"]
        assert shards["shard2"]["topologyTime"] > before >= shards["shard0"]["topologyTime"]

    await sync(work)


@pytest.mark.parametrize("reader_processes", [0, 2])
async def test_streams_read_a_shard_added_while_they_run(growing, reader_processes):
    """With readerProcesses the new shard's tail goes to one of the stream's reader processes."""
    cluster, proxy = growing

    def work() -> None:
        c = client(proxy_uri(proxy))
        direct = client(cluster.uri)
        start = c.admin.command("ping")["operationTime"]
        opened = c.admin.command(
            {
                "parallelChangeStream": 1,
                "nBuckets": 4,
                "name": "grow",
                "showExpandedEvents": True,
                "startAtOperationTime": start,
                "readerProcesses": reader_processes,
            }
        )
        native = direct.watch(
            start_at_operation_time=start, show_expanded_events=True, max_await_time_ms=200
        )
        c.admin.command("shardCollection", "g.h", key={"_id": "hashed"})
        c.g.h.insert_many([{"_id": i} for i in range(50)])
        assert add_spare(c, cluster) == "shard2"
        # The first chunk to reach the new shard: the donor writes migrateChunkToNewShard.
        c.admin.command("moveChunk", "g.h", find={"_id": 0}, to="shard2")
        c.g.h.insert_many([{"_id": i} for i in range(50, 400)])
        c.g.h.update_many({}, {"$set": {"later": True}})
        on_new = cluster.replsets["shard2"].primary
        assert any(on_new.select("g.h", {})), "the moved chunk put documents on the new shard"
        end = end_point(c)

        union: set[bytes] = set()
        for cur in opened["cursors"]:
            union |= {key(e["_id"]) for e in drain(c, cur["id"], end)}
        expected = reference(cluster, start, end)
        assert sorted(union) == expected
        # Among them every write that landed on the new shard:
        new_keys = set(reference_of(cluster, "shard2", start, end))
        assert new_keys and new_keys <= union

        seen = []
        while len(seen) < len(expected):
            change = native.try_next()
            if change is not None:
                seen.append(bytes.fromhex(change["_id"]["_data"]))
        assert seen == expected  # mongos's own stream picked the new shard up too
        native.close()

        status = c.admin.command({"parallelChangeStreamStatus": 1, "name": "grow"})["streams"][0]
        assert status["topology"]["shardsAdded"] == ["shard2"]
        assert sorted(s["shard"] for s in status["shards"]) == ["shard0", "shard1", "shard2"]

    await sync(work)


def reference_of(cluster: SimCluster, shard: str, start: Any, end: bytes) -> list[bytes]:
    only = SimCluster(cluster.mongos, {shard: cluster.replsets[shard]}, cluster.clock, {})
    return reference(only, start, end)
