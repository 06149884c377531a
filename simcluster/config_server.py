"""The config server (CSRS) as mongos sees it: the `admin` and `config` databases.

What tools read there is the sharding catalog: mongosh's `sh.status()` and `sh.getBalancerState()`,
monitoring agents and connectors read config.shards, config.databases, config.collections,
config.chunks and config.settings rather than asking commands. So simcluster serves them.

Two kinds of collections:
- The catalog proper (CATALOG below) is built from mongos's routing metadata on every read, in the
  shapes of the server's IDL types (type_shard, type_database, type_collection, type_chunk_base,
  type_config_version, read for facts only). Built, not stored: a copy kept beside the routing
  table could disagree with it, and the routing table is what decides where documents go. Writes
  to these collections are refused; a server takes them, but they would corrupt its catalog.
- Everything else (config.settings, config.changelog, config.actionlog, the admin database) is
  stored in a one-member replica set of its own, with the same find/update/upsert semantics as a
  shard. config.settings is live: the balancer reads its `balancer` and `chunksize` documents, and
  balancerStart/balancerStop write the former, as on a server.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from bson import Binary, Int64, ObjectId, Timestamp

from mongoformats.errors import MongoError
from simcluster.chunks import Chunk, ShardedCollection
from simcluster.node import ShardNode
from simcluster.oplog import ClusterClock
from simcluster.replset import ReplicaSet
from simcluster.router_roles import CatalogRouter

CONFIG_SET = "configRepl"  # the config server replica set's name in a server's own test clusters
CATALOG = frozenset(
    {"version", "shards", "databases", "collections", "chunks", "mongos", "tags", "locks"}
)
# Databases that live on the config server, never on a shard.
CONFIG_DATABASES = frozenset({"admin", "config"})
CHANGELOG = "config.changelog"
SETTINGS = "config.settings"


class ConfigServer:
    def __init__(self, clock: ClusterClock, host: str, *, version: str) -> None:
        self.node = ShardNode(
            clock, host, 0, CONFIG_SET, version=version
        )  # in-process only: never served
        self.replset = ReplicaSet(CONFIG_SET, [self.node])
        self.cluster_id = ObjectId()  # config.version's clusterId: fixed for the cluster's life
        for name in sorted(
            CATALOG | {"settings", "changelog", "actionlog"}
        ):  # what `show collections` lists
            self.node.coll(f"config.{name}", create=True)

    def catalog(self, mongos: CatalogRouter, ns: str) -> list[dict[str, Any]] | None:
        """The documents of a catalog collection (`config.<one of CATALOG>`), or None for any
        other ns."""
        db, _, coll = ns.partition(".")
        if db != "config" or coll not in CATALOG:
            return None
        if coll == "version":
            return [{"_id": 1, "clusterId": self.cluster_id}]
        build = _CATALOG_BUILDERS.get(coll)
        # tags (no zones here) and locks (a migration here never spans a read) are empty.
        return build(mongos) if build is not None else []

    @staticmethod
    def check_write(ns: str) -> None:
        db, _, coll = ns.partition(".")
        if db == "config" and coll in CATALOG:
            raise MongoError(
                "IllegalOperation",
                f"simcluster builds {ns} from its routing metadata and takes no "
                "writes to it; use the sharding commands",
            )

    def setting(self, name: str) -> dict[str, Any] | None:
        found = self.node.select(SETTINGS, {"_id": name})
        return found[0] if found else None

    def set_balancer_mode(self, mode: str) -> None:
        """What balancerStart/balancerStop write (BalancerConfiguration::setBalancerMode)."""
        self.node.update_docs(
            SETTINGS,
            {
                "q": {"_id": "balancer"},
                "u": {"$set": {"mode": mode, "stopped": mode == "off"}},
                "upsert": True,
            },
            {},
        )

    def balancer_mode(self) -> str:
        """The settings' `mode`, else the legacy `stopped` flag; "full" when there is no
        document."""
        doc = self.setting("balancer") or {}
        mode = doc.get("mode")
        if mode in ("full", "off"):
            return str(mode)
        return "off" if doc.get("stopped") is True else "full"

    def chunk_size_mb(self) -> int | None:
        """The `chunksize` setting's value when it is valid (1 to 1024 MB), else None: the server
        keeps its default, with a warning in its log, for any other value."""
        value = (self.setting("chunksize") or {}).get("value")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 1 <= value <= 1024:
            return int(value)
        return None

    def log_change(
        self, mongos: CatalogRouter, what: str, ns: str, details: dict[str, Any], *, shard: str
    ) -> None:
        """A config.changelog entry, as the server's ShardingLogging writes them."""
        now = datetime.datetime.now(datetime.UTC)
        doc = {
            "_id": f"{mongos.address}-{now.isoformat(timespec='milliseconds')}-{ObjectId()}",
            "server": mongos.address,
            "shard": shard,
            "clientAddr": "",
            "time": now,
            "what": what,
            "ns": ns,
            "details": details,
        }
        self.node.insert_one(CHANGELOG, doc, {})


def _database_docs(mongos: CatalogRouter) -> list[dict[str, Any]]:
    return [
        {
            "_id": name,
            "primary": sid,
            "partitioned": False,
            "version": {
                "uuid": Binary(mongos.db_versions[name][0].bytes, 4),
                "timestamp": mongos.db_versions[name][1],
                "lastMod": 1,
            },
        }
        for name, sid in sorted(mongos.db_primary.items())
        if name not in CONFIG_DATABASES
    ]


def _mongos_docs(mongos: CatalogRouter) -> list[dict[str, Any]]:
    now = datetime.datetime.now(datetime.UTC)
    return [
        {
            "_id": mongos.address,
            "advisoryHostFQDNs": [],
            "created": mongos.started_at,
            "mongoVersion": mongos.full_version,
            "ping": now,
            "up": Int64((now - mongos.started_at).total_seconds()),
            "waiting": True,
        }
    ]


# The catalog collections built from the router's metadata, each by its builder.
_CATALOG_BUILDERS: dict[str, Callable[[CatalogRouter], list[dict[str, Any]]]] = {
    "shards": lambda mongos: mongos.shard_docs(),
    "databases": _database_docs,
    "collections": lambda mongos: [collection_doc(sc) for _, sc in sorted(mongos.sharded.items())],
    "chunks": lambda mongos: [
        chunk_doc(sc, c) for _, sc in sorted(mongos.sharded.items()) for c in sc.chunks
    ],
    "mongos": _mongos_docs,
}


def collection_doc(sc: ShardedCollection) -> dict[str, Any]:
    """sc's config.collections document (CollectionType, fields in the IDL's order)."""
    doc: dict[str, Any] = {
        "_id": sc.ns,
        "lastmodEpoch": sc.epoch,
        "lastmod": sc.sharded_at,
        "timestamp": sc.timestamp,
        "uuid": Binary(sc.uuid.bytes, 4),
        "key": dict(sc.key),
        "unique": sc.unique,
    }
    if sc.chunk_bytes is not None:
        doc["maxChunkSizeBytes"] = Int64(sc.chunk_bytes)
    doc["noBalance"] = False
    return doc


def chunk_doc(sc: ShardedCollection, chunk: Chunk) -> dict[str, Any]:
    """A chunk's config.chunks document (ChunkType: keyed by collection UUID since 5.0)."""
    return {
        "_id": chunk.id,
        "uuid": Binary(sc.uuid.bytes, 4),
        "min": bound_doc(sc, chunk.min),
        "max": bound_doc(sc, chunk.max),
        "shard": chunk.shard,
        "lastmod": Timestamp(*chunk.version),
        "onCurrentShardSince": chunk.history[0][0] if chunk.history else sc.timestamp,
        "history": [{"validAfter": ts, "shard": shard} for ts, shard in chunk.history],
    }


def bound_doc(sc: ShardedCollection, point: Any) -> dict[str, Any]:
    """A chunk bound as the catalog writes it: a value for every shard key field."""
    return dict(zip(sc.key, sc.values_of(point), strict=True))
