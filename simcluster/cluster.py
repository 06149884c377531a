"""A whole sharded cluster in one trio process: a mongos, S shard replica sets, one shared clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from simcluster.mongos import Mongos
from simcluster.node import ShardNode
from simcluster.oplog import ClusterClock
from simcluster.replset import Primaries, ReplicaSet


@dataclass
class SimCluster:
    mongos: Mongos
    replsets: dict[str, ReplicaSet]
    clock: ClusterClock

    @property
    def shards(self) -> Primaries:
        return Primaries(self.replsets)

    @property
    def uri(self) -> str:
        return f"mongodb://{self.mongos.address}/"

    def shard_uri(self, shard_id: str) -> str:
        rs = self.replsets[shard_id]
        return f"mongodb://{','.join(rs.hosts)}/?replicaSet={rs.set_name}"

    def describe(self) -> str:
        lines = [f"mongos   {self.uri}"]
        lines += [f"{sid:8} {self.shard_uri(sid)}" for sid in sorted(self.replsets)]
        return "\n".join(lines)


@asynccontextmanager
async def open_cluster(*, shards: int = 3, members: int = 1, host: str = "127.0.0.1", port: int = 0,
                       version: str = "7.0", oplog_bytes: int = 1 << 30, periodic_noop_s: float = 10.0,
                       replication_lag_s: float = 0.0, election_timeout_s: float = 10.0) -> AsyncIterator[SimCluster]:
    """Start a cluster on loopback. `port=0` picks free ports; otherwise mongos gets `port` and the
    shard members the ports after it. `periodic_noop_s` is the shards' periodicNoopIntervalSecs
    (server default 10 s): it bounds how long an idle shard holds back a native mongos change
    stream. `members` per shard replica set (1 by default: the benchmarks' cluster; secondaries
    apply every write again, which costs the simulator's one core). `election_timeout_s` is
    electionTimeoutMillis (server default 10 s)."""
    clock = ClusterClock()
    replsets: dict[str, ReplicaSet] = {}
    for i in range(shards):
        name = f"shard{i}"
        nodes = [ShardNode(clock, host, port + 1 + i * members + j if port else 0, name, version=version,
                           oplog_bytes=oplog_bytes, initiate=j == 0) for j in range(members)]
        for node in nodes:
            node.periodic_noop_interval_s = periodic_noop_s  # periodicNoopIntervalSecs
        replsets[name] = ReplicaSet(name, nodes, lag_s=replication_lag_s, election_timeout_s=election_timeout_s)
    mongos = Mongos(clock, host, port, replsets, version=version)
    async with trio.open_nursery() as nursery:
        for rs in replsets.values():
            rs.nursery = nursery
            for node in rs.members:
                await nursery.start(node.serve)
        await nursery.start(mongos.serve)
        try:
            yield SimCluster(mongos, replsets, clock)
        finally:
            nursery.cancel_scope.cancel()
