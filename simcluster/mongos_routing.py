"""The router's routing table: which shard holds a database, a collection, a document; and
the reads that gather documents from the shards a filter targets."""

from __future__ import annotations

import datetime
import uuid as uuidlib
from typing import Any

import trio
from bson import Timestamp

from mongoformats.errors import MongoError
from simcluster import query as q
from simcluster.balancer import Balancer
from simcluster.chunks import (
    ShardedCollection,
    key_text,
)
from simcluster.config_server import CONFIG_DATABASES, ConfigServer
from simcluster.node import ShardNode
from simcluster.replset import Primaries, ReplicaSet
from simcluster.server import CommandServer
from simcluster.transactions import TxnKey


class RouterBase(CommandServer):
    """What every part of the router shares: its metadata, and targeting by shard key."""

    replsets: dict[str, ReplicaSet[ShardNode]]
    shards: Primaries[ShardNode]
    spares: dict[str, ReplicaSet[ShardNode]]
    topology_times: dict[str, Timestamp]
    db_primary: dict[str, str]
    db_versions: dict[str, tuple[uuidlib.UUID, Timestamp]]
    started_at: datetime.datetime
    config: ConfigServer
    sharded: dict[str, ShardedCollection]
    _next_primary: int
    txn_numbers: dict[bytes, int]
    commit_decisions: dict[TxnKey, tuple[list[str], Timestamp]]
    balancer: Balancer
    _migrating: dict[str, trio.Event]

    def primary_of(self, db: str) -> ShardNode:
        if db in CONFIG_DATABASES:
            return self.config.node
        return self.shards[self._primary_id(db)]

    def _primary_id(self, db: str) -> str:
        sid = self.db_primary.get(db)
        if sid is None:
            # Real mongos puts a new database on the shard with the least data; round-robin here
            # spreads databases across shards just as visibly and deterministically.
            ids = sorted(self.shards)
            sid = ids[self._next_primary % len(ids)]
            self._next_primary += 1
            self.db_primary[db] = sid
            self.db_versions[db] = (uuidlib.uuid4(), self.clock.tick())
        return sid

    def _is_view(self, ns: str) -> bool:
        """Whether `ns` is a view in its database's primary shard's catalog (none for a database
        that has no primary shard yet)."""
        db, _, name = ns.partition(".")
        sid = self.db_primary.get(db)
        coll = (
            self.shards[sid].dbs.get(db, {}).get(name)
            if sid is not None and sid in self.shards
            else None
        )
        return coll is not None and "viewOn" in coll.options

    def owner_ids(self, ns: str) -> list[str]:
        """The shards holding a collection of a user database: all for a sharded one, else its
        database's primary shard. Names only, so it answers while a shard has no primary."""
        return (
            sorted(self.shards) if ns in self.sharded else [self._primary_id(ns.split(".", 1)[0])]
        )

    def owners(self, ns: str) -> list[ShardNode]:
        if ns not in self.sharded:
            return [
                self.primary_of(ns.split(".", 1)[0])
            ]  # the config server's, for config and admin
        return [self.shards[s] for s in self.owner_ids(ns)]

    def target(self, ns: str, filt: dict[str, Any]) -> list[ShardNode]:
        sc = self.sharded.get(ns)
        if sc is None:
            return self.owners(ns)
        # Equality on every shard key field names one point, so one shard; anything else may
        # match on any shard (a key prefix is a range of points, which may span chunks).
        point = equality_point(sc, filt)
        return [self.shards[sc.owner(point)]] if point is not NO_POINT else self.owners(ns)

    def shard_for_doc(self, ns: str, doc: dict[str, Any]) -> ShardNode:
        sc = self.sharded.get(ns)
        if sc is None:
            return self.primary_of(ns.split(".", 1)[0])
        return self.shards[sc.owner(sc.key_point(doc))]

    def gather(self, ns: str, filt: dict[str, Any]) -> list[dict[str, Any]]:
        catalog = self.config.catalog(self, ns)
        if catalog is not None:
            return [doc for doc in catalog if q.matches(doc, filt)]
        out: list[dict[str, Any]] = []
        sc = self.sharded.get(ns)
        for shard in self.target(ns, filt):
            found = shard.select(ns, filt)
            out += found if sc is None else _owned(sc, shard.set_name, found)
        return out

    def shard_docs(self) -> list[dict[str, Any]]:
        """config.shards, which listShards returns as it is (ShardType)."""
        return [
            {
                "_id": sid,
                "host": f"{rs.set_name}/{','.join(rs.hosts)}",
                "state": 1,
                "topologyTime": self.topology_times[sid],
            }
            for sid, rs in sorted(self.replsets.items())
        ]

    def _sharded(self, ns: Any) -> ShardedCollection:
        sc = self.sharded.get(ns) if isinstance(ns, str) else None
        if sc is None:
            raise MongoError("NamespaceNotSharded", f"{ns} is not sharded")
        return sc

    def in_transaction(self, ns: str) -> bool:
        """Whether an open or prepared transaction holds writes to `ns` on some shard."""
        return any(
            txn.state in ("open", "prepared") and any(op.get("ns") == ns for op in txn.ops)
            for shard in self.shards.values()
            for txn in shard.transactions.txns.values()
        )

    def migrating(self, ns: str) -> bool:
        return ns in self._migrating

    @staticmethod
    def _bound(
        sc: ShardedCollection, bound: Any, wording: str, *, code: int | str = "InvalidOptions"
    ) -> Any:
        """The key-space point a bound names: {<shard key field>: value, ...} with every field of
        the key, in any order (a hash value for a hashed field), as the server's isShardKey
        requires; else `code` in the command's `wording` (of the bound, then the key)."""
        got = [q.get_path(bound, f) if isinstance(bound, dict) else [] for f in sc.key]
        if not all(got):
            raise MongoError(code, wording.format(key_text(bound), key_text(sc.key)))
        return sc.as_point([v[0] for v in got])

    def _recipient(self, to: Any) -> ShardNode:
        if to not in self.shards:
            raise MongoError("ShardNotFound", f"Shard {to} not found")
        return self.shards[to]


NO_POINT = object()


def equality_point(sc: ShardedCollection, filt: Any) -> Any:
    """The key-space point a query names by equality on every shard key field (a plain value, not
    an operator document), as the server's extractShardKeyFromQuery finds it; else NO_POINT."""
    if not isinstance(filt, dict) or not all(
        f in filt and not _has_operator(filt[f]) for f in sc.key
    ):
        return NO_POINT
    return sc.point([filt[f] for f in sc.key])


def _owned(sc: ShardedCollection, sid: str, found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The documents of `found` (read on shard `sid`) that the shard owns. A migration's copies on
    its recipient are not the recipient's until the commit (and a failed one's stay until
    deleted): shards filter such orphans out of reads by the chunk ownership they know."""
    if all(c.shard == sid for c in sc.chunks):
        return found
    return [d for d in found if sc.owner(sc.key_point(d)) == sid]


def _has_operator(value: Any) -> bool:
    return isinstance(value, dict) and any(str(k).startswith("$") for k in value)
