"""The router (mongos) and the config metadata it keeps: databases, sharded collections, chunks.

Strategy: the router calls its shards in-process (one trio process hosts the cluster), targeting
by shard key like mongos: an insert goes to the chunk owning its key; reads and multi-writes whose
filter pins the whole shard key go to one shard, the rest are scatter-gather.

Mongos holds the router's state and its command table; the commands live by concern, each part a
mixin over the routing table (mongos_routing.RouterBase): statement hooks and transactions
(mongos_txn), reads and writes (mongos_crud), DDL and shards (mongos_ddl), migrations and the
balancer's commands (mongos_migrate), shard keys (mongos_shard_keys).
"""

from __future__ import annotations

import datetime
import uuid as uuidlib
from typing import Any

import trio
from bson import Timestamp

from simcluster.balancer import Balancer
from simcluster.chunks import (
    ShardedCollection,
)
from simcluster.config_server import ConfigServer
from simcluster.mongos_crud import CrudRouting
from simcluster.mongos_ddl import DdlRouting
from simcluster.mongos_shard_keys import ShardKeyCommands
from simcluster.mongos_txn import TransactionRouting
from simcluster.node import ShardNode
from simcluster.oplog import ClusterClock
from simcluster.replset import Primaries, ReplicaSet
from simcluster.transactions import TxnKey


class Mongos(TransactionRouting, CrudRouting, DdlRouting, ShardKeyCommands):
    process_kind = "mongos"

    def __init__(
        self,
        clock: ClusterClock,
        host: str,
        port: int,
        replsets: dict[str, ReplicaSet[ShardNode]],
        *,
        version: str = "7.0",
        spares: dict[str, ReplicaSet[ShardNode]] | None = None,
    ) -> None:
        super().__init__(clock, host, port, version=version)
        self.replsets = replsets
        self.shards = Primaries(replsets)
        # Replica sets addShard can reach, by set name; and when each shard joined (config.shards'
        # topologyTime): a change stream reads a shard added later from that time on.
        self.spares = spares if spares is not None else {}
        started = clock.tick()
        self.topology_times: dict[str, Timestamp] = dict.fromkeys(replsets, started)
        self.db_primary: dict[str, str] = {}
        # Each database's version (config.databases `version`: uuid, timestamp), set with its
        # primary.
        self.db_versions: dict[str, tuple[uuidlib.UUID, Timestamp]] = {}
        self.started_at = datetime.datetime.now(datetime.UTC)
        self.config = ConfigServer(clock, host, version=version)
        self.sharded: dict[str, ShardedCollection] = {}
        self._next_primary = 0
        self.commands.update(
            {
                "insert": self.cmd_insert,
                "update": self.cmd_update,
                "delete": self.cmd_delete,
                "find": self.cmd_find,
                "count": self.cmd_count,
                "distinct": self.cmd_distinct,
                "aggregate": self.cmd_aggregate,
                "findandmodify": self.cmd_find_and_modify,
                "create": self.cmd_primary_ddl,
                "createindexes": self.cmd_owners_ddl,
                "dropindexes": self.cmd_owners_ddl,
                "collmod": self.cmd_owners_ddl,
                "drop": self.cmd_drop,
                "dropdatabase": self.cmd_drop_database,
                "renamecollection": self.cmd_rename,
                "listdatabases": self.cmd_list_databases,
                "listcollections": self.cmd_list_collections,
                "listindexes": self.cmd_list_indexes,
                "enablesharding": self.cmd_enable_sharding,
                "shardcollection": self.cmd_shard_collection,
                "listshards": self.cmd_list_shards,
                "reshardcollection": self.cmd_reshard_collection,
                "refinecollectionshardkey": self.cmd_refine_collection_shard_key,
                "movechunk": self.cmd_move_chunk,
                "split": self.cmd_split,
                "addshard": self.cmd_add_shard,
                "moverange": self.cmd_move_range,
                "balancerstart": self.cmd_balancer_start,
                "balancerstop": self.cmd_balancer_stop,
                "balancerstatus": self.cmd_balancer_status,
                "configurecollectionbalancing": self.cmd_configure_collection_balancing,
                "balancercollectionstatus": self.cmd_balancer_collection_status,
                "getshardmap": self.cmd_list_shards,
                "dbstats": self.cmd_db_stats,
                "appendoplognote": self.cmd_append_oplog_note,
                "committransaction": self.cmd_commit_transaction,
                "aborttransaction": self.cmd_abort_transaction,
            }
        )
        # Transactions this router has seen start, by session: lsid id -> txnNumber. Shards join a
        # transaction when its first statement reaches them (get_or_start on the shard).
        self.txn_numbers: dict[bytes, int] = {}
        # Two-phase commit decisions (the coordinator's config.transaction_coordinators):
        # participants and commit timestamp, so a commit retried after a failover finishes what was
        # decided.
        self.commit_decisions: dict[TxnKey, tuple[list[str], Timestamp]] = {}
        self.balancer = Balancer(self)
        # Collections with a migration in its critical section: their writes wait for the event.
        self._migrating: dict[str, trio.Event] = {}

    async def background(self) -> None:
        await self.balancer.run()

    def hello_fields(self, cmd: dict[str, Any]) -> dict[str, Any]:
        return {"isWritablePrimary": True, "msg": "isdbgrid"}
