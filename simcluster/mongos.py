"""The router (mongos) and the config metadata it keeps: databases, sharded collections, chunks.

Strategy: the router calls its shards in-process (one trio process hosts the cluster), targeting
by shard key like mongos: an insert goes to the chunk owning its key; reads and multi-writes whose
filter pins the whole shard key go to one shard, the rest are scatter-gather.
"""

from __future__ import annotations

import datetime
import uuid as uuidlib
from typing import Any

import trio
from bson import Binary, Int64, MaxKey, MinKey, ObjectId, Timestamp

from mongoformats.errors import MongoError, has_category
from mongoformats.sessions import UNKNOWN_USER, SessionsNamed
from simcluster import query as q
from simcluster.aggregate import find_projection, run_pipeline
from simcluster.balancer import Balancer, plan_migrations, range_end
from simcluster.catalog import index_name
from simcluster.chunks import (
    Chunk,
    ShardedCollection,
    clone_range,
    commit_migration,
    delete_orphans,
    key_text,
)
from simcluster.config_server import CONFIG_DATABASES, ConfigServer, bound_doc
from simcluster.cursors import Cursor
from simcluster.node import READ_COMMANDS, WRITE_COMMANDS, ShardNode
from simcluster.oplog import ClusterClock, ts_key
from simcluster.replset import Primaries, ReplicaSet
from simcluster.server import CommandServer, Request
from simcluster.transactions import TxnKey, no_such_transaction, txn_key
from simcluster.updates import apply_update

# How long a migration's commit waits for the recipient's copies to be majority-committed.
MIGRATION_MAJORITY_TIMEOUT_S = 60


class Mongos(CommandServer):
    process_kind = "mongos"

    def __init__(
        self,
        clock: ClusterClock,
        host: str,
        port: int,
        replsets: dict[str, ReplicaSet],
        *,
        version: str = "7.0",
        spares: dict[str, ReplicaSet] | None = None,
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
        # Each database's version (config.databases `version`: uuid, timestamp), set with its primary.
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
        # Two-phase commit decisions (the coordinator's config.transaction_coordinators): participants
        # and commit timestamp, so a commit retried after a failover finishes what was decided.
        self.commit_decisions: dict[TxnKey, tuple[list[str], Timestamp]] = {}
        self.balancer = Balancer(self)
        # Collections with a migration in its critical section: their writes wait for the event.
        self._migrating: dict[str, trio.Event] = {}

    async def background(self) -> None:
        await self.balancer.run()

    def hello_fields(self, cmd: dict[str, Any]) -> dict[str, Any]:
        return {"isWritablePrimary": True, "msg": "isdbgrid"}

    # -- transactions ------------------------------------------------------------------------------

    async def check_command(self, name: str, db: str, cmd: dict[str, Any]) -> None:
        # During an election a command for the shards waits for the new primary
        # (defaultFindReplicaSetHostTimeoutMS, 20 s) before it fails with FailedToSatisfyReadPreference;
        # what mongos answers itself (hello, ping, ...) does not wait, nor does a command on a
        # collection wait for shards that hold none of it.
        if name.lower() in WRITE_COMMANDS or name.lower() in READ_COMMANDS:
            coll = cmd.get(name)
            targets = (
                [self.replsets[sid] for sid in self.owner_ids(f"{db}.{coll}")]
                if isinstance(coll, str) and db not in CONFIG_DATABASES
                else list(self.replsets.values())
            )
            for rs in targets:
                if rs.primary_node is None:
                    await rs.wait_primary(20.0)
        if cmd.get("autocommit") is not False or "lsid" not in cmd:
            return
        lsid, number = txn_key(cmd)
        if cmd.get("startTransaction"):
            self.txn_numbers[lsid] = number
        elif self.txn_numbers.get(lsid) != number:
            raise no_such_transaction((lsid, number))

    async def settle(self, name: str, cmd: dict[str, Any], reply: dict[str, Any]) -> None:
        if name.lower() not in WRITE_COMMANDS:
            return
        # Each shard's newest entry, taken before any wait: no other task ran since the handler wrote.
        written = [
            (rs, rs.primary_node.oplog.last_key())
            for rs in self.replsets.values()
            if len(rs.members) > 1 and rs.primary_node is not None
        ]
        for rs, key in written:
            try:
                await rs.write_concern(cmd, reply, key)
            except MongoError as exc:
                if not has_category(exc.code, "NotPrimaryError"):
                    raise
                # A state-change error from a shard would make the driver mark mongos itself
                # Unknown: mongos reports the shard connection it lost instead, which a driver
                # retries (the retryable-write label) without doubting mongos.
                raise MongoError(
                    "HostUnreachable",
                    f"write to shard {rs.set_name} was interrupted :: caused by "
                    f":: {exc.code_name}: {exc.errmsg}",
                ) from exc

    def _participants(self, key: TxnKey) -> list[str]:
        return [
            sid for sid, s in sorted(self.shards.items()) if s.transactions.open(key) is not None
        ]

    async def cmd_commit_transaction(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        """One participant commits directly; several go through two-phase commit, as mongos's
        coordinator does: prepare everywhere, wait until every prepare is majority-committed (so
        a new primary still holds it), record the decision, then commit on each shard's current
        primary. A retried commit finishes a recorded decision (after a failover, on the shards'
        new primaries, which took the prepared transaction over)."""
        key = txn_key(cmd)
        decided = self.commit_decisions.get(key)
        if decided is not None:
            await self._write_decision(key, *decided)
            self.commit_decisions.pop(key, None)
            return {}
        participants = self._participants(key)
        if any(
            getattr(s.transactions.txns.get(key), "state", None) == "aborted"
            for s in self.shards.values()
        ):
            # A participant already ended it (killSessions, transactionLifetimeLimitSeconds): the
            # router, which knows every participant, aborts the rest rather than commit a part.
            for sid in participants:
                self.shards[sid].transactions.abort(key)
            raise no_such_transaction(key)
        if len(participants) == 1:
            self.shards[participants[0]].transactions.commit(key)
        elif participants:
            prepared = {sid: self.shards[sid].transactions.prepare(key) for sid in participants}
            commit_ts = max(prepared.values(), key=lambda ts: (ts.time, ts.inc))
            for sid, ts in prepared.items():
                rs = self.replsets[sid]
                if len(rs.members) > 1:
                    await rs.wait_majority(ts_key(ts), timeout_s=30.0)
                    await rs.wait_primary(20.0)
                    if rs.primary_node is None or rs.primary_node.transactions.open(key) is None:
                        # A failover lost the prepare: the coordinator decides to abort.
                        for other in participants:
                            node = self.replsets[other].primary_node
                            if node is not None and node.transactions.open(key) is not None:
                                node.transactions.abort(key)
                        raise no_such_transaction(key)
            self.commit_decisions[key] = (participants, commit_ts)
            await self.hang_while("hangBeforeWritingDecision")
            await self._write_decision(key, participants, commit_ts)
            # Written everywhere: a commit retried from now on finds no participant and answers ok.
            self.commit_decisions.pop(key, None)
        return {}

    async def _write_decision(
        self, key: TxnKey, participants: list[str], commit_ts: Timestamp
    ) -> None:
        for sid in participants:
            rs = self.replsets[sid]
            await rs.wait_primary(20.0)
            node = rs.primary  # FailedToSatisfyReadPreference if the shard still has none: retry
            txn = node.transactions.open(key)
            if txn is not None and txn.state == "prepared":
                node.transactions.commit_prepared(key, commit_ts)

    def kill_sessions(self, named: SessionsNamed) -> None:
        """Its own cursors, then on to every shard (cluster_kill_sessions forwards it), whose
        unprepared transactions of those sessions end; the router forgets them too."""
        super().kill_sessions(named)
        for shard in self.shards.values():
            shard.transactions.kill_sessions(named)
        for lsid in [lsid for lsid in self.txn_numbers if named(lsid, UNKNOWN_USER)]:
            del self.txn_numbers[lsid]

    async def cmd_abort_transaction(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        key = txn_key(cmd)
        participants = self._participants(key)
        if not participants and self.txn_numbers.get(key[0]) != key[1]:
            raise no_such_transaction(key)
        for sid in participants:
            self.shards[sid].transactions.abort(key)
        self.txn_numbers.pop(key[0], None)
        return {}

    # -- metadata ----------------------------------------------------------------------------------

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
        point = _equality_point(sc, filt)
        return [self.shards[sc.owner(point)]] if point is not _NO_POINT else self.owners(ns)

    def shard_for_doc(self, ns: str, doc: dict[str, Any]) -> ShardNode:
        sc = self.sharded.get(ns)
        if sc is None:
            return self.primary_of(ns.split(".", 1)[0])
        return self.shards[sc.owner(sc.key_point(doc))]

    # -- writes ------------------------------------------------------------------------------------

    async def _writable(self, ns: str) -> None:
        """Writes to a collection wait while a migration of it is in its critical section (the
        server's shards hold them, then mongos retries them at the new owner): a write in between
        would land on the donor after its documents were copied, and be lost at the commit."""
        self.config.check_write(ns)
        while (held := self._migrating.get(ns)) is not None:
            await held.wait()

    async def cmd_insert(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['insert']}"
        await self._writable(ns)
        if ns not in self.sharded:  # every document goes to the database's primary shard
            primary = self.primary_of(db)
            return q.run_inserts(ns, cmd, lambda doc: primary)
        return q.run_inserts(ns, cmd, lambda doc: self.shard_for_doc(ns, doc))

    async def cmd_update(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['update']}"
        await self._writable(ns)
        return q.run_updates(cmd, lambda i, spec: self._route_update(ns, cmd, i, spec))

    def _route_update(
        self, ns: str, cmd: dict[str, Any], i: int, spec: dict[str, Any]
    ) -> dict[str, Any]:
        """One update statement: targeted by shard key when the filter pins it, else broadcast."""
        shards = self.target(ns, spec.get("q", {}))
        result: dict[str, Any] = {"n": 0, "nModified": 0, "upserted": []}
        for shard in shards:
            sub = dict(spec, upsert=False) if len(shards) > 1 else spec
            r = shard.update_docs(ns, sub, shard._session_fields(cmd, i))
            result["n"] += r["n"]
            result["nModified"] += r["nModified"]
            result["upserted"] += r.get("upserted", [])
            if r["n"] and not spec.get("multi"):
                break
        if not result["n"] and spec.get("upsert") and len(shards) > 1:
            # A broadcast upsert that matched nothing inserts on the shard owning the new document.
            new = apply_update(
                {k: v for k, v in spec.get("q", {}).items() if not k.startswith("$")},
                spec["u"],
                is_insert=True,
            )
            shard = self.shard_for_doc(ns, new)
            r = shard.update_docs(ns, spec, shard._session_fields(cmd, i))
            result["n"] += r["n"]
            result["upserted"] += r.get("upserted", [])
        return result

    async def cmd_delete(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['delete']}"
        await self._writable(ns)
        n = 0
        for i, spec in enumerate(cmd.get("deletes", [])):
            limit = spec.get("limit", 0)
            for shard in self.target(ns, spec.get("q", {})):
                got = shard.delete_docs(ns, spec.get("q", {}), limit, shard._session_fields(cmd, i))
                n += got
                if got and limit:
                    break
        return {"n": n}

    async def cmd_find_and_modify(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        ns = f"{db}.{cmd['findAndModify']}"
        await self._writable(ns)
        shards = self.target(ns, cmd.get("query", {}))
        for shard in shards:
            if shard.select(ns, cmd.get("query", {}), limit=1):
                return await shard.cmd_find_and_modify(db, cmd, req)
        if cmd.get("upsert"):
            new = apply_update(
                {k: v for k, v in cmd.get("query", {}).items() if not k.startswith("$")},
                cmd.get("update", {}),
                is_insert=True,
            )
            return await self.shard_for_doc(ns, new).cmd_find_and_modify(db, cmd, req)
        return {"lastErrorObject": {"n": 0, "updatedExisting": False}, "value": None}

    # -- reads -------------------------------------------------------------------------------------

    def gather(self, ns: str, filt: dict[str, Any]) -> list[dict[str, Any]]:
        catalog = self.config.catalog(self, ns)
        if catalog is not None:
            return [doc for doc in catalog if q.matches(doc, filt)]
        out: list[dict[str, Any]] = []
        sc = self.sharded.get(ns)
        for shard in self.target(ns, filt):
            found = shard.select(ns, filt)
            if sc is not None and any(c.shard != shard.set_name for c in sc.chunks):
                # A migration's copies on its recipient are not the recipient's until the commit (and
                # a failed one's stay until deleted): shards filter such orphans out of reads by the
                # chunk ownership they know.
                found = [d for d in found if sc.owner(sc.key_point(d)) == shard.set_name]
            out += found
        return out

    async def cmd_find(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['find']}"
        docs = self.gather(ns, cmd.get("filter", {}))
        if cmd.get("sort"):
            docs = q.sort_docs(docs, cmd["sort"])
        docs = docs[cmd.get("skip", 0) :]
        if cmd.get("limit"):
            docs = docs[: abs(cmd["limit"])]
        docs = list(map(find_projection(cmd.get("projection")), docs))
        if cmd.get("singleBatch"):
            docs = docs[: cmd.get("batchSize", 101) or None]
        return {"cursor": await self.cursors.first_batch(Cursor(ns, docs), cmd.get("batchSize"))}

    async def cmd_count(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        docs = self.gather(f"{db}.{cmd['count']}", cmd.get("query") or {})
        docs = docs[cmd.get("skip", 0) :]
        return {"n": min(len(docs), cmd["limit"]) if cmd.get("limit") else len(docs)}

    async def cmd_distinct(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        return {
            "values": q.distinct_values(
                self.gather(f"{db}.{cmd['distinct']}", cmd.get("query") or {}), cmd["key"]
            )
        }

    async def cmd_aggregate(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        coll = cmd["aggregate"]
        pipeline = cmd.get("pipeline", [])
        if pipeline and "$changeStream" in pipeline[0]:
            from simcluster.native_stream import open_native_stream

            def lookup(ns: str, key: dict[str, Any]) -> Any:
                found = self.gather(ns, key)
                return found[0] if found else None

            def topology() -> list[tuple[ReplicaSet, Timestamp]]:  # in the order shards were added
                return [(rs, self.topology_times[sid]) for sid, rs in self.replsets.items()]

            return await open_native_stream(
                self, db, cmd, list(self.replsets.values()), lookup, topology, self._is_view
            )
        ns = f"{db}.{coll}" if isinstance(coll, str) else f"{db}.$cmd.aggregate"
        if pipeline and "$shardedDataDistribution" in pipeline[0]:
            if db != "admin" or coll != 1:
                raise MongoError(
                    "InvalidNamespace",
                    "The $shardedDataDistribution stage can only be run on "
                    "the admin database with {aggregate: 1}",
                )
            docs, pipeline = self.sharded_data_distribution(), pipeline[1:]
        else:
            first_match = pipeline[0].get("$match", {}) if pipeline else {}
            docs = self.gather(ns, first_match) if isinstance(coll, str) else []
        out = run_pipeline(docs, pipeline)
        return {
            "cursor": await self.cursors.first_batch(
                Cursor(ns, out), cmd.get("cursor", {}).get("batchSize")
            )
        }

    def sharded_data_distribution(self) -> list[dict[str, Any]]:
        """$shardedDataDistribution (6.0.3+): per sharded collection, each shard holding it with its
        documents and their BSON bytes. A migration here deletes its range at once, and a failed
        one its copies on the recipient, so nothing stays orphaned; except (not counted here) the
        copies of a migration that failed while its recipient had no primary, which stay until the
        next migration of their range (see `migrate`)."""
        out = []
        for ns in sorted(self.sharded):
            shards = []
            for sid, shard in sorted(self.shards.items()):
                coll = shard.coll(ns)
                if coll is not None:
                    shards.append(
                        {
                            "shardName": sid,
                            "numOrphanedDocs": 0,
                            "numOwnedDocuments": len(coll.docs),
                            "ownedSizeBytes": coll.data_size(),
                            "orphanedSizeBytes": 0,
                        }
                    )
            out.append({"ns": ns, "shards": shards})
        return out

    # -- DDL ---------------------------------------------------------------------------------------

    async def cmd_primary_ddl(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        name = next(iter(cmd)).lower()
        shard = self.primary_of(db)
        return await shard.commands[name](db, cmd, req)

    async def cmd_owners_ddl(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        name = next(iter(cmd))
        ns = f"{db}.{cmd[name]}"
        reply: dict[str, Any] = {}
        for shard in self.owners(ns):
            sc = self.sharded.get(ns)
            sub = (
                dict(cmd, collectionUUID=Binary(sc.uuid.bytes, 4))
                if sc and name == "createIndexes"
                else cmd
            )
            reply = await shard.commands[name.lower()](db, sub, req)
        return reply

    async def cmd_drop(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['drop']}"
        reply: dict[str, Any] = {}
        primary = self.primary_of(db)
        # 7.0's DropCollectionCoordinator drops on the other shards first, with fromMigrate, then
        # on the primary shard without it: change streams show one drop (buildNotFromMigrateFilter).
        owners = self.owners(ns)
        for shard in [s for s in owners if s is not primary]:
            await shard.cmd_drop(db, cmd, req, from_migrate=True)
        if primary in owners:
            reply = await primary.cmd_drop(db, cmd, req)
        self.sharded.pop(ns, None)
        for rs in self.replsets.values():
            for member in rs.members:
                member.shard_keys.pop(ns, None)
        return reply

    async def cmd_drop_database(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        for shard in self.shards.values():
            if db in shard.dbs or self.db_primary.get(db) == shard.set_name:
                await shard.cmd_drop_database(db, cmd, req)
        for ns in [n for n in self.sharded if n.startswith(db + ".")]:
            del self.sharded[ns]
        self.db_primary.pop(db, None)
        self.db_versions.pop(db, None)
        return {"dropped": db}

    async def cmd_rename(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        src = cmd["renameCollection"]
        if src in self.sharded:
            raise MongoError(
                "IllegalOperation",
                "renameCollection of a sharded collection is not supported by simcluster",
            )
        return await self.primary_of(src.split(".", 1)[0]).cmd_rename(db, cmd, req)

    async def cmd_list_databases(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        names = sorted({n for s in [self.config.node, *self.shards.values()] for n in s.dbs})
        dbs = [{"name": n, "sizeOnDisk": Int64(4096), "empty": False} for n in names]
        if cmd.get("nameOnly"):
            dbs = [{"name": n} for n in names]
        return {"databases": dbs, "totalSize": Int64(4096 * len(dbs))}

    async def cmd_list_collections(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        return await self.primary_of(db).cmd_list_collections(db, cmd, req)

    async def cmd_list_indexes(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['listIndexes']}"
        return await self.owners(ns)[0].cmd_list_indexes(db, cmd, req)

    async def cmd_db_stats(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        objects = sum(len(c.docs) for s in self.shards.values() for c in s.dbs.get(db, {}).values())
        return {"db": db, "objects": objects, "raw": {}}

    async def cmd_append_oplog_note(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        # mongos writes the note on every shard (cluster_oplog_note_cmd).
        for shard in self.shards.values():
            await shard.cmd_append_oplog_note(db, cmd, req)
        return {}

    # -- sharding ----------------------------------------------------------------------------------

    async def cmd_enable_sharding(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        self.primary_of(cmd["enableSharding"])
        return {}

    async def cmd_list_shards(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        if db != "admin":
            raise MongoError(
                "Unauthorized", "listShards may only be run against the admin database."
            )
        return {"shards": self.shard_docs()}

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

    async def cmd_add_shard(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        """`{addShard: "<set>/<host:port>,...", name?}`: the set must be running (one of the
        cluster's spares) and hold no databases; the default shard name is the set name."""
        if db != "admin":
            raise MongoError("Unauthorized", "addShard may only be run against the admin database.")
        seed = cmd["addShard"]
        if not isinstance(seed, str):
            raise MongoError(
                "TypeMismatch",
                "BSON field 'addShard.addShard' is the wrong type, expected type 'string'",
            )
        if "maxSize" in cmd:  # removed in 6.2
            raise MongoError("InvalidOptions", "addShard no longer supports maxSize field")
        set_name, _, hosts = seed.rpartition("/")
        seeds = set(hosts.split(","))
        for sid, member in self.replsets.items():
            if seeds & set(member.hosts):  # adding the same set again answers as the first time did
                if cmd.get("name", sid) != sid:
                    raise MongoError(
                        "IllegalOperation",
                        f"A shard already exists containing the replica set '{member.set_name}'",
                    )
                return {"shardAdded": sid}
        rs = next((r for r in self.spares.values() if seeds & set(r.hosts)), None)
        if rs is None:
            raise MongoError(
                "OperationFailed",
                f"failed to run command {{ isMaster: 1 }} when attempting to add "
                f"shard {seed} :: caused by :: HostUnreachable: no member of {seed} answered",
            )
        if set_name and set_name != rs.set_name:
            raise MongoError(
                "OperationFailed",
                f"in seed list {seed}, host {next(iter(seeds))} does not belong to "
                f'replica set {set_name}; found {{ setName: "{rs.set_name}" }}',
            )
        name = cmd.get("name") or rs.set_name
        if name in self.replsets:
            raise MongoError("IllegalOperation", f"A shard named {name} already exists")
        databases = sorted(
            d
            for d, colls in rs.primary.dbs.items()
            if colls and d not in ("admin", "config", "local")
        )
        if databases:
            raise MongoError(
                "IllegalOperation",
                f"can't add shard '{seed}' because a local database "
                f"'{databases[0]}' exists in another shard",
            )
        del self.spares[rs.set_name]
        self.topology_times[name] = self.clock.tick()
        self.replsets[name] = rs
        return {"shardAdded": name}

    # -- balancing (simcluster/balancer.py) -------------------------------------------------------

    async def cmd_balancer_status(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        return self.balancer.status()

    async def cmd_balancer_start(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        self.config.set_balancer_mode("full")
        self.balancer.wake()
        return {}

    async def cmd_balancer_stop(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        self.config.set_balancer_mode("off")
        self.balancer.wake()
        await (
            self.balancer.wait_round_over()
        )  # the round's migration in progress ends; no other starts
        return {}

    def in_transaction(self, ns: str) -> bool:
        """Whether an open or prepared transaction holds writes to `ns` on some shard."""
        return any(
            txn.state in ("open", "prepared") and any(op.get("ns") == ns for op in txn.ops)
            for shard in self.shards.values()
            for txn in shard.transactions.txns.values()
        )

    def migrating(self, ns: str) -> bool:
        return ns in self._migrating

    async def _wait_to_migrate(self, ns: str) -> None:
        """Until no other migration of the collection runs (one at a time, as the server's
        ActiveMigrationsRegistry allows) and no transaction holds its locks (a migration's critical
        section waits for them). Transactions end by commit, abort, killSessions or expiry
        (transactionLifetimeLimitSeconds), none of which signals here, so this polls. No task runs
        between its return and the start of the caller's migration."""
        while self.in_transaction(ns) or self.migrating(ns):
            await trio.sleep(0.01)

    async def migrate(self, sc: ShardedCollection, chunk: Chunk, to: str) -> None:
        """Move a chunk (moveChunk, moveRange, the balancer) and log it in config.changelog.

        As the server's migrations: the collection's writes are held from the clone to the commit,
        and the commit waits until the recipient's copies are majority-committed. A recipient or
        donor failover meanwhile fails the migration (OperationFailed) and leaves the chunk where it
        was; the copies the recipient still holds are deleted as orphans. Committing on w:1 copies
        lost the documents when the recipient's primary stepped down before its secondaries had them.
        """
        assert not self.migrating(sc.ns), (
            "callers wait for the collection's other migration (_wait_to_migrate)"
        )
        # Each side's current primary (an election may have come since the caller looked).
        donor, recipient = self.shards[chunk.shard], self.shards[to]
        lo, hi = chunk.min, chunk.max
        held = self._migrating[sc.ns] = trio.Event()
        try:
            moved = clone_range(sc, chunk, donor, recipient)
            await self._wait_for_copies(recipient, bool(moved))
            if self.replsets[donor.set_name].primary_node is not donor:
                raise MongoError(
                    "InterruptedDueToReplStateChange", f"donor {donor.set_name} stepped down"
                )
            commit_migration(sc, chunk, donor, recipient, moved)
        except MongoError as exc:
            rs = self.replsets[recipient.set_name]
            if rs.primary_node is not None:
                delete_orphans(sc, chunk, rs.primary_node)
            self.config.log_change(
                self,
                "moveChunk.from",
                sc.ns,
                {
                    "min": bound_doc(sc, lo),
                    "max": bound_doc(sc, hi),
                    "from": donor.set_name,
                    "to": recipient.set_name,
                    "note": "aborted",
                },
                shard=donor.set_name,
            )
            raise MongoError(
                "OperationFailed",
                f"Data transfer error: migrate failed: {exc.code_name}: {exc.errmsg}",
            ) from exc
        finally:
            del self._migrating[sc.ns]
            held.set()
        self.config.log_change(
            self,
            "moveChunk.from",
            sc.ns,
            {
                "min": bound_doc(sc, lo),
                "max": bound_doc(sc, hi),
                "from": donor.set_name,
                "to": recipient.set_name,
                "note": "success",
            },
            shard=donor.set_name,
        )

    async def _wait_for_copies(self, recipient: ShardNode, copied: bool) -> None:
        """Until the recipient's newest entry is majority-committed (the server's cloner waits for
        majority before the commit), at most MIGRATION_MAJORITY_TIMEOUT_S."""
        rs = self.replsets[recipient.set_name]
        if not copied or len(rs.members) == 1:
            return
        reply: dict[str, Any] = {}
        await rs.write_concern(
            {"writeConcern": {"w": "majority", "wtimeout": MIGRATION_MAJORITY_TIMEOUT_S * 1000}},
            reply,
            recipient.oplog.last_key(),
        )
        if "writeConcernError" in reply:
            raise MongoError(
                "WriteConcernFailed",
                f"the copies on {recipient.set_name} were not majority-committed "
                f"within {MIGRATION_MAJORITY_TIMEOUT_S} s",
            )

    def _sharded(self, ns: Any) -> ShardedCollection:
        sc = self.sharded.get(ns) if isinstance(ns, str) else None
        if sc is None:
            raise MongoError("NamespaceNotSharded", f"{ns} is not sharded")
        return sc

    async def cmd_configure_collection_balancing(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        """chunkSize in MB, 1 to 1024; 0 goes back to the cluster's chunk size."""
        sc = self._sharded(cmd["configureCollectionBalancing"])
        if "chunkSize" in cmd:
            mb = cmd["chunkSize"]
            if not isinstance(mb, int) or isinstance(mb, bool) or not 0 <= mb <= 1024:
                raise MongoError(
                    "InvalidOptions",
                    f"chunk size must be an integer between 1 and 1024 MB, or 0 for "
                    f"the default; got {mb!r}",
                )
            sc.chunk_bytes = mb << 20 or None
        return {}

    async def cmd_balancer_collection_status(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        sc = self._sharded(cmd["balancerCollectionStatus"])
        size = self.balancer.chunk_bytes(sc)
        reply: dict[str, Any] = {"chunkSize": size / (1 << 20), "balancerCompliant": True}
        if plan_migrations(sc, self.balancer.data_sizes(sc), size, set(self.replsets)):
            reply.update(balancerCompliant=False, firstComplianceViolation="chunksImbalance")
        return reply

    async def cmd_shard_collection(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        ns = cmd["shardCollection"]
        key = dict(cmd["key"])
        if ns in self.sharded:
            if self.sharded[ns].key == key:
                return {"collectionsharded": ns}
            raise MongoError("AlreadyInitialized", f"sharding already enabled for collection {ns}")
        dbname = ns.split(".", 1)[0]
        primary = self.primary_of(dbname)
        existing = primary.coll(ns)
        coll_uuid = existing.uuid if existing else uuidlib.uuid4()
        if existing is None:
            primary._create(dbname, ns.split(".", 1)[1], {}, coll_uuid)
        coll = primary.coll(ns)
        assert coll is not None
        if not coll.docs and not any(ix.key == key for ix in coll.indexes.values()):
            # Sharding an empty or new collection creates its shard key index first, logged as
            # a createIndexes (CreateCollectionCoordinator; "When sharding a non-existent
            # collection, MongoDB implicitly ... creates the shard key index").
            index = {"key": key, "name": index_name(key)}
            await primary.cmd_create_indexes(
                dbname, {"createIndexes": ns.split(".", 1)[1], "indexes": [index]}, req
            )
        created = self.clock.tick()
        sc = ShardedCollection(ns, key, coll_uuid, bool(cmd.get("unique")), timestamp=created)
        ids = sorted(self.shards)
        low, high = sc.edge(MinKey), sc.edge(MaxKey)
        if sc.presplit and (existing is None or not existing.docs):
            # An empty collection hashed on its first field starts with one chunk per shard (7.0
            # default), cut on hash values; the fields after it sit at MinKey in each cut.
            step = 2**64 // len(ids)
            cuts = [Int64(-(2**63) + step * i) for i in range(1, len(ids))]
            bounds = [low, *(sc.as_point([cut, *sc.values_of(low)[1:]]) for cut in cuts), high]
            owners = ids
        else:
            bounds, owners = [low, high], [primary.set_name]
        # Versions 1|0, 1|1, ... in key order; each chunk on its first shard since the collection's timestamp.
        sc.chunks = [
            Chunk(bounds[i], bounds[i + 1], sid, (1, i), [(created, sid)])
            for i, sid in enumerate(owners)
        ]
        self.sharded[ns] = sc
        for sid in ids:
            shard = self.shards[sid]
            for member in self.replsets[sid].members:
                member.shard_keys[ns] = key
            if shard is not primary and shard.coll(ns) is None and sid in owners:
                # Created silently on the other shards given chunks: the server does not log these
                # as user DDL. A shard given none creates it when a migration first brings it a
                # chunk (chunks.clone_range).
                shard.dbs.setdefault(dbname, {})
                from simcluster.storage import Collection

                shard.dbs[dbname][ns.split(".", 1)[1]] = Collection(
                    ns.split(".", 1)[1], uuid=coll_uuid
                )
        # The request as the coordinator logs it (notifyChangeStreamsOnShardCollection): what was
        # given, in the IDL's order (shardCollection_events jstest: numInitialChunks as given,
        # collation when given).
        o2 = {
            "shardCollection": ns,
            "shardKey": key,
            "unique": sc.unique,
            "numInitialChunks": Int64(cmd.get("numInitialChunks") or 0),
            "presplitHashedZones": bool(cmd.get("presplitHashedZones", False)),
        }
        if "collation" in cmd:
            o2["collation"] = dict(cmd["collation"])
        primary.append_noop({"msg": {"shardCollection": ns}}, o2, Binary(coll_uuid.bytes, 4), ns)
        return {"collectionsharded": ns, "collectionUUID": Binary(coll_uuid.bytes, 4)}

    def _key_argument(
        self, db: str, cmd: dict[str, Any], name: str
    ) -> tuple[ShardedCollection, dict[str, Any]]:
        """The sharded collection and new key of a reshardCollection/refineCollectionShardKey."""
        if db != "admin":
            raise MongoError("Unauthorized", f"{name} may only be run against the admin database.")
        if "key" not in cmd:
            raise MongoError(
                "IDLFailedToParse", f"BSON field '{name}.key' is missing but a required field"
            )
        if not isinstance(cmd["key"], dict) or not cmd["key"]:
            raise MongoError(
                "TypeMismatch", f"BSON field '{name}.key' is the wrong type, expected type 'object'"
            )
        return self._sharded(cmd[name]), dict(cmd["key"])

    def _set_shard_key(self, sc: ShardedCollection, key: dict[str, Any]) -> None:
        sc.key = key
        sc.epoch, sc.timestamp = ObjectId(), self.clock.tick()
        for rs in self.replsets.values():
            for member in rs.members:
                member.shard_keys[sc.ns] = key

    async def cmd_refine_collection_shard_key(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        """`{refineCollectionShardKey: ns, key}`: the key gains suffix fields; every chunk keeps
        its range, its bounds extended with MinKey (MaxKey for the top). The coordinator on the
        primary shard then logs the noop change streams show as refineCollectionShardKey
        (refine_collection_shard_key_coordinator.cpp,
        notifyChangeStreamsOnRefineCollectionShardKeyComplete: o2 {refineCollectionShardKey,
        shardKey, oldShardKey})."""
        sc, key = self._key_argument(db, cmd, "refineCollectionShardKey")
        old = dict(sc.key)
        if list(key.items())[: len(old)] != list(old.items()) or len(key) <= len(old):
            # simcluster's words
            raise MongoError(
                "InvalidOptions",
                "refineCollectionShardKey: the proposed shard key "
                f"{key_text(key)} does not extend the current shard key "
                f"{key_text(old)}",
            )
        dbname = sc.ns.split(".", 1)[0]
        primary = self.primary_of(dbname)
        coll = primary.coll(sc.ns)
        wanted = list(key.items())
        if coll is None or not any(
            list(ix.key.items())[: len(wanted)] == wanted for ix in coll.indexes.values()
        ):
            raise MongoError(
                "InvalidOptions",
                "Please create an index that starts with the "
                "proposed shard key before sharding the collection",
            )
        await self._wait_to_migrate(sc.ns)
        added = len(key) - len(old)
        for chunk in sc.chunks:
            for end in ("min", "max"):
                values = sc.values_of(getattr(chunk, end))
                fill = MaxKey if all(isinstance(v, MaxKey) for v in values) else MinKey
                setattr(chunk, end, [*values, *(fill() for _ in range(added))])
        self._set_shard_key(sc, key)
        o2 = {"refineCollectionShardKey": sc.ns, "shardKey": key, "oldShardKey": old}
        msg = f"Refine shard key for collection {sc.ns} with {key_text(key)}"
        primary.append_noop({"msg": msg}, o2, Binary(sc.uuid.bytes, 4), sc.ns)
        return {}

    async def cmd_reshard_collection(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        """`{reshardCollection: ns, key, unique?, numInitialChunks?, collation?}`: the collection
        is rebuilt under the new key as the server's resharding does, simulated with one
        recipient, the primary shard: a temporary `system.resharding.<old uuid>` collection with
        the resharding UUID, the collection's indexes and the new key's, every shard's documents
        copied into it (fromMigrate), then renamed over the original (fromMigrate, dropTarget);
        the other shards delete their copies (fromMigrate). Streams see none of that (system.*,
        fromMigrate), only the coordinator's noop (reshard_collection_coordinator.cpp,
        notifyChangeStreamsOnReshardCollectionComplete: ui the old collection UUID; o2
        {reshardCollection, reshardUUID, shardKey, oldShardKey, unique, numInitialChunks?,
        collation?}; 8.0 adds provenance). Later events carry the new UUID."""
        sc, key = self._key_argument(db, cmd, "reshardCollection")
        dbname, name = sc.ns.split(".", 1)
        primary = self.primary_of(dbname)
        await self._wait_to_migrate(sc.ns)
        old, old_uuid, reshard_uuid = dict(sc.key), sc.uuid, uuidlib.uuid4()
        source = primary.coll(sc.ns)
        temp = f"system.resharding.{old_uuid}"
        primary._create(
            dbname, temp, dict(source.options) if source is not None else {}, reshard_uuid
        )
        specs = [
            dict(ix.spec)
            for ix in (source.indexes.values() if source is not None else [])
            if ix.name != "_id_"
        ]
        if not any(spec["key"] == key for spec in specs):
            specs.append({"key": key, "name": index_name(key)})
        await primary.cmd_create_indexes(dbname, {"createIndexes": temp, "indexes": specs}, req)
        self._set_shard_key(sc, key)
        sc.unique = bool(cmd.get("unique", False))
        for shard in self.shards.values():
            for doc in list(shard.coll(sc.ns) or []):
                primary.insert_one(f"{dbname}.{temp}", doc, {}, from_migrate=True)
                if shard is not primary:
                    shard.delete_docs(sc.ns, {"_id": doc["_id"]}, 1, {}, from_migrate=True)
            if shard is not primary:
                # Its (now empty) copy takes the new UUID unlogged on every member, as
                # shardCollection makes the other shards' copies.
                for member in self.replsets[shard.set_name].members:
                    copy = member.dbs.get(dbname, {}).get(name)
                    if copy is not None:
                        copy.uuid = reshard_uuid
        await primary.cmd_rename(
            dbname,
            {"renameCollection": f"{dbname}.{temp}", "to": sc.ns, "dropTarget": True},
            req,
            from_migrate=True,
        )
        sc.uuid = reshard_uuid
        created = sc.timestamp
        sc.chunks = [
            Chunk(
                sc.edge(MinKey),
                sc.edge(MaxKey),
                primary.set_name,
                (1, 0),
                [(created, primary.set_name)],
            )
        ]
        o2: dict[str, Any] = {
            "reshardCollection": sc.ns,
            "reshardUUID": Binary(reshard_uuid.bytes, 4),
            "shardKey": key,
            "oldShardKey": old,
            "unique": sc.unique,
        }
        if "numInitialChunks" in cmd:
            o2["numInitialChunks"] = Int64(cmd["numInitialChunks"])
        if "collation" in cmd:
            o2["collation"] = dict(cmd["collation"])
        if self.version >= "8.0":
            o2["provenance"] = "reshardCollection"
        msg = f"Reshard collection {sc.ns} with shard key {key_text(key)}"
        primary.append_noop({"msg": msg}, o2, Binary(old_uuid.bytes, 4), sc.ns)
        return {}

    async def cmd_split(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        """sh.splitAt: `{split: ns, middle: {<shard key>: value}}` cuts the chunk holding `middle`
        in two there (for a hashed key, `middle` holds a hash value, as on the server). Both halves
        stay on the chunk's shard; nothing moves, nothing is logged."""
        ns = cmd["split"]
        sc = self._sharded(ns)
        if not isinstance(cmd.get("middle"), dict):
            raise MongoError(
                "InvalidOptions",
                "split needs a 'middle' key here (the 'find' and 'bounds' forms are not simulated)",
            )
        point = self._bound(
            sc, cmd["middle"], "new split key {} is not valid for shard key pattern {}"
        )
        chunk = sc.chunk_at(point)
        if q.compare(point, chunk.min) == 0:
            lo, hi = (key_text(bound_doc(sc, p)) for p in (chunk.min, chunk.max))
            raise MongoError(
                "CannotSplit",
                f"new split key {key_text(bound_doc(sc, point))} is a boundary key of "
                f"existing chunk [{lo},{hi})",
            )
        sc.split(chunk, point)
        return {}

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

    async def cmd_move_chunk(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        """`{moveChunk: ns, find: <doc> | bounds: [min, max], to}` moves the whole chunk."""
        sc = self._sharded(cmd["moveChunk"])
        recipient = self._recipient(cmd["to"])
        await self._wait_to_migrate(sc.ns)
        if "find" in cmd:
            point = _equality_point(sc, cmd["find"])
            if point is _NO_POINT:
                raise MongoError(
                    656450, f"no shard key found in chunk query {key_text(cmd['find'])}"
                )
            chunk = sc.chunk_at(point)
        else:
            lo = self._bound(
                sc,
                cmd["bounds"][0],
                "shard key bounds [{},...) are not valid for shard key pattern {}",
                code=656451,
            )
            starting = [c for c in sc.chunks if q.compare(c.min, lo) == 0]
            if not starting:
                raise MongoError(
                    "InvalidOptions", f"no chunk of {sc.ns} starts at {cmd['bounds'][0]}"
                )
            chunk = starting[0]
        if chunk.shard != recipient.set_name:
            await self.migrate(sc, chunk, recipient.set_name)
        return {"millis": 0}

    async def cmd_move_range(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        """`{moveRange: ns, toShard, min, max?}` (6.0+, what the balancer runs): the range from `min`
        moves, cut out of its chunk first; without `max` it ends where the donor counts about one
        chunk size of documents (simcluster/balancer.py: range_end)."""
        sc = self._sharded(cmd["moveRange"])
        recipient = self._recipient(cmd.get("toShard"))
        if not isinstance(cmd.get("min"), dict):
            raise MongoError(
                "InvalidOptions",
                "moveRange needs 'min' here (a range given by 'max' alone is not simulated)",
            )
        await self._wait_to_migrate(sc.ns)
        wording = "moveRange bound {} is not a full shard key of pattern {}"  # simcluster's words
        lo = self._bound(sc, cmd["min"], wording)
        chunk = sc.chunk_at(lo)
        hi = self._bound(sc, cmd["max"], wording) if isinstance(cmd.get("max"), dict) else None
        if hi is not None and (
            q.compare(hi, lo) <= 0 or q.compare(hi, chunk.max) > 0
        ):  # checked before any change
            raise MongoError(
                "InvalidOptions",
                f"the range of moveRange must lie within one chunk: {cmd['max']} "
                f"is not inside the chunk holding {cmd['min']}",
            )
        if q.compare(chunk.min, lo) != 0:
            chunk = sc.split(chunk, lo)
        donor = self.shards[chunk.shard]
        if hi is None:
            hi = range_end(sc, donor, chunk, self.balancer.chunk_bytes(sc))
        elif q.compare(hi, chunk.max) == 0:
            hi = None
        if hi is not None:
            sc.split(chunk, hi)
        if chunk.shard != recipient.set_name:
            await self.migrate(sc, chunk, recipient.set_name)
        return {}


_NO_POINT = object()


def _equality_point(sc: ShardedCollection, filt: Any) -> Any:
    """The key-space point a query names by equality on every shard key field (a plain value, not
    an operator document), as the server's extractShardKeyFromQuery finds it; else _NO_POINT."""
    if not isinstance(filt, dict) or not all(
        f in filt and not _has_operator(filt[f]) for f in sc.key
    ):
        return _NO_POINT
    return sc.point([filt[f] for f in sc.key])


def _has_operator(value: Any) -> bool:
    return isinstance(value, dict) and any(str(k).startswith("$") for k in value)
