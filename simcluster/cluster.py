"""A whole sharded cluster in one trio process: a mongos, S shard replica sets, one shared clock."""

from __future__ import annotations

import functools
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from mongoformats.scram import ScramCredential, make_credential
from simcluster.cluster_time import ClusterTimeKey
from simcluster.mongos import Mongos
from simcluster.node import ShardNode
from simcluster.oplog import ClusterClock
from simcluster.replset import Primaries, ReplicaSet
from simcluster.server import CommandServer


@dataclass
class SimCluster:
    mongos: Mongos
    replsets: dict[str, ReplicaSet[ShardNode]]
    clock: ClusterClock
    # Replica sets running beside the cluster but not part of it until `addShard` names them.
    spares: dict[str, ReplicaSet[ShardNode]]

    @property
    def shards(self) -> Primaries:
        return Primaries(self.replsets)

    @property
    def uri(self) -> str:
        return f"mongodb://{self.mongos.address}/"

    def shard_uri(self, shard_id: str) -> str:
        rs = self.replsets.get(shard_id) or self.spares[shard_id]
        return f"mongodb://{','.join(rs.hosts)}/?replicaSet={rs.set_name}"

    def describe(self) -> str:
        lines = [f"mongos   {self.uri}"]
        lines += [f"{sid:8} {self.shard_uri(sid)}" for sid in sorted(self.replsets)]
        lines += [
            f"{sid:8} {self.shard_uri(sid)} (not added: addShard)" for sid in sorted(self.spares)
        ]
        return "\n".join(lines)


@asynccontextmanager
async def open_cluster(
    *,
    shards: int = 3,
    members: int = 1,
    host: str = "127.0.0.1",
    port: int = 0,
    shard_port: int | None = None,
    version: str = "7.0",
    oplog_bytes: int = 1 << 30,
    periodic_noop_s: float = 10.0,
    replication_lag_s: float = 0.0,
    election_timeout_s: float = 10.0,
    spare_shards: int = 0,
    tls: ssl.SSLContext | None = None,
    users: dict[str, str] | None = None,
    roles: dict[str, list[tuple[str, str]]] | None = None,
) -> AsyncIterator[SimCluster]:
    """Start a cluster on loopback. `port=0` picks free ports; otherwise mongos gets `port` and the
    shard members the ports from `shard_port` (default: the ones after `port`; 0: any free ports).
    `periodic_noop_s` is the shards' periodicNoopIntervalSecs
    (server default 10 s): it bounds how long an idle shard holds back a native mongos change
    stream. `members` per shard replica set (1 by default: the benchmarks' cluster; secondaries
    apply every write again, which costs the simulator's one core). `election_timeout_s` is
    electionTimeoutMillis (server default 10 s). `spare_shards` more replica sets run beside the
    cluster, empty, for `addShard` to add (named shard<S>, shard<S+1>, ...). With `tls` (a server
    context holding the certificate) every process requires TLS, like net.tls.mode requireTLS.
    With `users` (name -> password, admin-database users) every process requires SCRAM-SHA-256
    authentication, like security.authorization enabled. A user has the root role unless `roles`
    gives it built-in roles ([(role, db)], see mongoformats.privileges); commands check them."""
    clock = ClusterClock()
    first = _first_shard_port(port, shard_port)

    def replica_set(i: int) -> ReplicaSet[ShardNode]:
        name = f"shard{i}"
        nodes = [
            ShardNode(
                clock,
                host,
                first + i * members + j if first else 0,
                name,
                version=version,
                oplog_bytes=oplog_bytes,
                initiate=j == 0,
            )
            for j in range(members)
        ]
        for node in nodes:
            node.periodic_noop_interval_s = periodic_noop_s  # periodicNoopIntervalSecs
        return ReplicaSet(
            name, nodes, lag_s=replication_lag_s, election_timeout_s=election_timeout_s
        )

    replsets = {rs.set_name: rs for rs in map(replica_set, range(shards))}
    spares = {rs.set_name: rs for rs in map(replica_set, range(shards, shards + spare_shards))}
    mongos = Mongos(clock, host, port, replsets, version=version, spares=spares)
    async with trio.open_nursery() as nursery:
        secure = functools.partial(
            _secure,
            tls=tls,
            credentials=_credentials(users),
            roles=roles or {},
            time_key=ClusterTimeKey.generate(clock.now()),  # signs $clusterTime when auth is on
        )
        secure(mongos)
        for rs in [*replsets.values(), *spares.values()]:
            rs.nursery = nursery
            for node in rs.members:
                secure(node)
                await nursery.start(node.serve)
        await nursery.start(mongos.serve)
        try:
            yield SimCluster(mongos, replsets, clock, spares)
        finally:
            nursery.cancel_scope.cancel()


def _first_shard_port(port: int, shard_port: int | None) -> int:
    """The first shard member's port: shard_port, else the one after mongos's; 0 for any."""
    if shard_port is not None:
        return shard_port
    return port + 1 if port else 0


def _credentials(users: dict[str, str] | None) -> dict[str, ScramCredential] | None:
    if users is None:
        return None
    return {name: make_credential(pw) for name, pw in users.items()}


def _secure(
    server: CommandServer,
    *,
    tls: ssl.SSLContext | None,
    credentials: dict[str, ScramCredential] | None,
    roles: dict[str, list[tuple[str, str]]],
    time_key: ClusterTimeKey,
) -> None:
    """One process's TLS, users, their roles and the cluster's $clusterTime key."""
    server.ssl_context, server.users, server.user_roles = tls, credentials, dict(roles)
    server.time_key = time_key
