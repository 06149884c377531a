"""A whole sharded cluster in one trio process: a mongos, S shard primaries, one shared clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from simcluster.mongos import Mongos
from simcluster.node import ShardNode
from simcluster.oplog import ClusterClock


@dataclass
class SimCluster:
    mongos: Mongos
    shards: dict[str, ShardNode]
    clock: ClusterClock

    @property
    def uri(self) -> str:
        return f"mongodb://{self.mongos.address}/"

    def shard_uri(self, shard_id: str) -> str:
        node = self.shards[shard_id]
        return f"mongodb://{node.address}/?replicaSet={node.set_name}"

    def describe(self) -> str:
        lines = [f"mongos   {self.uri}"]
        lines += [f"{sid:8} {self.shard_uri(sid)}" for sid in sorted(self.shards)]
        return "\n".join(lines)


@asynccontextmanager
async def open_cluster(*, shards: int = 3, host: str = "127.0.0.1", port: int = 0, version: str = "7.0",
                       oplog_bytes: int = 1 << 30, periodic_noop_s: float = 10.0) -> AsyncIterator[SimCluster]:
    """Start a cluster on loopback. `port=0` picks free ports; otherwise mongos gets `port` and the
    shards the ports after it. `periodic_noop_s` is the shards' periodicNoopIntervalSecs (server
    default 10 s): it bounds how long an idle shard holds back a native mongos change stream."""
    clock = ClusterClock()
    nodes = {f"shard{i}": ShardNode(clock, host, port + 1 + i if port else 0, f"shard{i}", version=version,
                                    oplog_bytes=oplog_bytes) for i in range(shards)}
    for node in nodes.values():
        node.periodic_noop_interval_s = periodic_noop_s  # periodicNoopIntervalSecs
    mongos = Mongos(clock, host, port, nodes, version=version)
    async with trio.open_nursery() as nursery:
        for node in nodes.values():
            await nursery.start(node.serve)
        await nursery.start(mongos.serve)
        try:
            yield SimCluster(mongos, nodes, clock)
        finally:
            nursery.cancel_scope.cancel()
