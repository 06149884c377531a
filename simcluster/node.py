"""A shard replica set's primary (mongod): storage, the oplog each write produces, oplog tailing.

Oplog shapes follow shared/reference/mongodb-formats.md C.1-C.10 (field order op, ns, ui, o, o2,
session fields, then ts, t, v, wall; inserts carry o2 = documentKey since 5.3; updates log `$v: 2`
diffs; DDL is `op: "c"` on `<db>.$cmd`; appendOplogNote writes `{op: "n", ns: "", o: data}`).
"""

from __future__ import annotations

import copy
import datetime
import functools
import logging
import math
import struct
import time
import uuid as uuidlib
from collections.abc import Callable
from typing import Any, NamedTuple

import bson
import trio
from bson import Binary, Int64, ObjectId, Timestamp
from bson.raw_bson import RawBSONDocument

from mongoformats.codecs import RAW
from mongoformats.errors import MongoError
from mongoformats.oplog_splice import leading_id
from mongoformats.sessions import SessionsNamed
from simcluster import query as q
from simcluster.aggregate import find_projection
from simcluster.apply import Applier, take_prepared
from simcluster.catalog import (
    catalog_options,
    create_entry_o,
    fix_index_spec,
    modified_index_spec,
    options_before_change,
    view_document,
)
from simcluster.cursors import Cursor, RawBatch
from simcluster.oplog import ClusterClock, Oplog, ts_key
from simcluster.replset import ReplicaSet
from simcluster.server import DECODE, CommandServer, Request
from simcluster.storage import Collection, id_key
from simcluster.transactions import (
    Transaction,
    TransactionTable,
    TxnKey,
    no_such_transaction,
    txn_key,
)
from simcluster.updates import apply_update, pipeline_entry, replaced_by_pipeline, update_with_entry

log = logging.getLogger("simcluster")

OPLOG_NS = "local.oplog.rs"
PREIMAGES_NS = "config.system.preimages"
# Commands a secondary refuses with NotWritablePrimary, and reads it serves only with secondaryOk
# (a non-primary $readPreference; drivers send primaryPreferred on a direct connection).
WRITE_COMMANDS = frozenset(
    {
        "insert",
        "update",
        "delete",
        "findandmodify",
        "create",
        "drop",
        "dropdatabase",
        "createindexes",
        "dropindexes",
        "collmod",
        "renamecollection",
        "appendoplognote",
        "committransaction",
        "aborttransaction",
    }
)
READ_COMMANDS = frozenset(
    {
        "find",
        "aggregate",
        "count",
        "distinct",
        "listcollections",
        "listindexes",
        "listdatabases",
        "dbstats",
        "collstats",
    }
)


def _wall(key: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(key >> 32, datetime.UTC)


# lsid.uid of an unauthenticated session: SHA-256 of the empty user name (mongodb-formats.md C.1).
_ANONYMOUS_UID = __import__("hashlib").sha256(b"").digest()
_I32 = struct.Struct("<i")


# The bucket span of each time-series granularity (timeseries::getMaxSpanSecondsFromGranularity).
_BUCKET_SPAN = {"seconds": 3600, "minutes": 86400, "hours": 2592000}


class _SessionBytes(NamedTuple):
    """A retryable write's session fields as bytes, around each statement's stmtId."""

    lsid_id: bytes
    txn_number: int
    head: bytes  # lsid, txnNumber: before op
    tail: bytes  # prevOpTime: after wall


def _logged_lsid(cmd: dict[str, Any]) -> dict[str, Any]:
    """The lsid a command's writes log (with the user's uid), built once per command."""
    lsid = cmd.get("$lsid_logged")
    if lsid is None:
        lsid = cmd["$lsid_logged"] = cmd["lsid"] | {"uid": Binary(_ANONYMOUS_UID, 0)}
    return lsid


def _session_bytes(cmd: dict[str, Any]) -> _SessionBytes | None:
    """The session fields every statement of `cmd` logs (encoded once per command), or None."""
    if "lsid" not in cmd or "txnNumber" not in cmd:
        return None
    cached = cmd.get("$session_bytes")
    if cached is None:
        head = bson.encode({"lsid": _logged_lsid(cmd), "txnNumber": Int64(cmd["txnNumber"])})[4:-1]
        tail = bson.encode({"prevOpTime": {"ts": Timestamp(0, 0), "t": Int64(-1)}})[4:-1]
        cached = cmd["$session_bytes"] = _SessionBytes(
            bytes(cmd["lsid"]["id"]), int(cmd["txnNumber"]), head, tail
        )
    return cached


class SentInserts:
    """The inserts of one insert command on one node, outside a transaction, logged from the
    bytes the client sent: the same entries ShardNode.insert_one writes, with what every
    document shares (collection, entry head, session fields) worked out once per command."""

    def __init__(self, node: ShardNode, ns: str, cmd: Any) -> None:
        self.node, self.ns = node, ns
        self.session = _session_bytes(cmd)
        self.known = (
            node.applier.statements_of(self.session.lsid_id, self.session.txn_number)
            if self.session is not None
            else None
        )
        shard_key = node.shard_keys.get(ns)
        self.whole_key = bool(shard_key) and set(shard_key or ()) != {
            "_id"
        }  # documentKey beyond _id
        self.coll: Collection | None = None
        self.head = b""
        self.wall_ms = int(time.time() * 1000)  # one clock reading for the command's writes

    def insert(self, doc: dict[str, Any], raw: bytes, stmt_id: int) -> bool:
        """Insert one document; False when it needs the general path (its _id is not first)."""
        ident = leading_id(raw)
        if ident is None or ".system." in self.ns:
            return False
        if self.known is not None and stmt_id in self.known:
            return True  # a retried statement the shard already has: done
        node = self.node
        coll = self.coll
        if coll is None:
            coll = self.coll = node.coll(self.ns, create=True)
            assert coll is not None
            self.head = bson.encode({"op": "i", "ns": self.ns, "ui": coll.ui})[4:-1] + b"\x03o\x00"
        if coll.name != self.ns.partition(".")[2]:
            return False  # a time-series collection: its writes go to its buckets (insert_one)
        t, value = ident
        # A string's or an ObjectId's id_key is its BSON bytes: made straight from the sent bytes.
        key = (
            b"%b%c\x00%b\x00" % (_I32.pack(len(value) + 7), t, value)
            if t in (0x02, 0x07)
            else id_key(doc["_id"])
        )
        coll.check_unique(doc, self.ns, key=key)
        coll.put(doc, key=key)
        if self.whole_key:
            o2 = bson.encode(node.document_key(self.ns, doc))
        else:
            o2 = b"%b%b\x00" % (_I32.pack(len(value) + 10), raw[4 : 9 + len(value)])
        session = self.session
        if session is None:
            node.oplog.append_body(
                b"%b%b\x03o2\x00%b" % (self.head, raw, o2), wake=False, wall_ms=self.wall_ms
            )
        else:
            node.oplog.append_body(
                b"%b%b\x03o2\x00%b\x10stmtId\x00%b" % (self.head, raw, o2, _I32.pack(stmt_id)),
                head=session.head,
                tail=session.tail,
                wake=False,
                wall_ms=self.wall_ms,
            )
            assert self.known is not None
            self.known.add(stmt_id)
        return True


def _drop_index(coll: Collection, name: str) -> None:
    """Undo an index built in a transaction that aborted."""
    coll.indexes.pop(name, None)


# Generic command arguments (and the simulator's own cached keys): never collection options.
_GENERIC_ARGS = frozenset(
    {
        "lsid",
        "txnNumber",
        "autocommit",
        "startTransaction",
        "$clusterTime",
        "writeConcern",
        "readConcern",
        "$readPreference",
        "$db",
        "comment",
        "maxTimeMS",
        "apiVersion",
        "apiStrict",
        "apiDeprecationErrors",
        "stmtId",
        "$lsid_logged",
        "$session_bytes",
        "$raw_documents",
    }
)

# The stages an update pipeline may hold (the others fail as on a server).
_UPDATE_PIPELINE_STAGES = frozenset(
    {"$addFields", "$set", "$project", "$unset", "$replaceRoot", "$replaceWith"}
)


class ShardNode(CommandServer):
    """One member of shard replica set `set_name`: a primary takes writes, a secondary replicates them.

    Roles and the commit point live in `simcluster.replset.ReplicaSet`; a node alone (the
    default) is the primary of a set of one.
    """

    runtime_parameters = {
        **CommandServer.runtime_parameters,
        "periodicNoopIntervalSecs": "periodic_noop_interval_s",
        "transactionLifetimeLimitSeconds": "transaction_lifetime_s",
    }

    def __init__(
        self,
        clock: ClusterClock,
        host: str,
        port: int,
        set_name: str,
        *,
        version: str = "7.0",
        oplog_bytes: int = 1 << 30,
        initiate: bool = True,
    ) -> None:
        super().__init__(clock, host, port, version=version)
        self.set_name = set_name
        self.oplog = Oplog(clock, cap_bytes=oplog_bytes)
        self.dbs: dict[str, dict[str, Collection]] = {}
        self.applier = Applier(self.dbs)
        self.election_id = ObjectId("7fffffff0000000000000001")
        self.state = "PRIMARY" if initiate else "SECONDARY"
        self.up = True
        self.in_sync = True  # False from a restart until it caught up (or resynced)
        self.frozen_until = -math.inf  # replSetStepDown: not electable before this trio time
        # After an election this member lost entries to: its last entry the set's history shares.
        # Entries after it are rolled back at its next sync; until then they count for nothing.
        self.branch_end: int | None = None
        # ns -> shard key pattern (set by the router), so o2/documentKey holds shard key + _id.
        self.shard_keys: dict[str, dict[str, Any]] = {}
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
                "create": self.cmd_create,
                "drop": self.cmd_drop,
                "dropdatabase": self.cmd_drop_database,
                "listdatabases": self.cmd_list_databases,
                "listcollections": self.cmd_list_collections,
                "listindexes": self.cmd_list_indexes,
                "createindexes": self.cmd_create_indexes,
                "dropindexes": self.cmd_drop_indexes,
                "collmod": self.cmd_coll_mod,
                "renamecollection": self.cmd_rename,
                "appendoplognote": self.cmd_append_oplog_note,
                "replsetgetstatus": self.cmd_repl_status,
                "replsetstepdown": self.cmd_step_down,
                "dbstats": self.cmd_db_stats,
                "collstats": self.cmd_coll_stats,
                "committransaction": self.cmd_commit_transaction,
                "aborttransaction": self.cmd_abort_transaction,
            }
        )
        self.transactions = TransactionTable(self.oplog, self.applier.record_images)
        if initiate:
            self.oplog.append({"op": "n", "ns": "", "o": {"msg": "initiating set"}})
        # periodicNoopIntervalSecs (server default 10 s): an idle primary writes a noop so that
        # change streams on mongos can move past it. Settable with setParameter.
        self.periodic_noop_interval_s = 10.0
        # transactionLifetimeLimitSeconds (server default 60): an unprepared transaction older than
        # this is aborted by a periodic pass, so an abandoned one frees what it holds (the
        # balancer waits for transactions on a collection). Settable with setParameter.
        self.transaction_lifetime_s = 60
        self.expired_transaction_passes = 0  # serverStatus metrics.abortExpiredTransactions.passes
        # Assigned by the ReplicaSet this member joins (open_cluster builds both).
        self.replset: ReplicaSet[ShardNode]

    @property
    def is_primary(self) -> bool:
        return self.state == "PRIMARY"

    def become_primary(self, term: int, election_id: ObjectId) -> None:
        self.state = "PRIMARY"
        self.oplog.term = term
        self.election_id = election_id
        self.oplog.append({"op": "n", "ns": "", "o": {"msg": "new primary"}})
        # Transactions prepared under the old primary stay prepared: the coordinator commits or
        # aborts them here (the server restores them from the oplog the same way at step-up).
        for key, lsid, prepare_ts, ops in take_prepared(self.applier):
            self.transactions.restore_prepared(key, dict(lsid), prepare_ts, ops, self.applier.apply)

    async def background(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._periodic_noops)
            nursery.start_soon(self._replicate)
            nursery.start_soon(self._abort_expired_transactions)

    async def _abort_expired_transactions(self) -> None:
        """The server's abortExpiredTransactions job: a pass every half lifetime, at most a
        minute apart. The period is read again every quarter second, so a setParameter takes
        effect at once, as the server's parameter hook resets the job's period."""

        def expired(key: TxnKey, txn: Transaction) -> bool:
            return time.monotonic() - txn.started >= self.transaction_lifetime_s

        last = trio.current_time()
        while True:
            await trio.sleep(0.25)
            await self.wait_running()
            if trio.current_time() - last < min(self.transaction_lifetime_s / 2, 60.0):
                continue
            last = trio.current_time()
            if self.is_primary:
                self.transactions.abort_unprepared(expired)
            self.expired_transaction_passes += 1

    async def _periodic_noops(self) -> None:
        last_seen = self.oplog.last_key()
        while True:
            await trio.sleep(self.periodic_noop_interval_s)
            await self.wait_running()
            # Only a primary writes, and only when nothing was written since the last check, as
            # the server's NoopWriter does (noop_writer.cpp): an idle shard may wait two intervals.
            if self.is_primary and self.oplog.last_key() == last_seen:
                self.oplog.append({"op": "n", "ns": "", "o": {"msg": "periodic noop"}})
            last_seen = self.oplog.last_key()

    async def _replicate(self) -> None:
        """A secondary's sync loop: copy the primary's new entries (after the set's lag) and apply them."""
        rs = self.replset
        while True:
            await self.wait_running()
            source = rs.primary_node
            # stopReplProducer: the server's fail point that stops this member fetching entries.
            if (
                self.is_primary
                or source is None
                or source is self
                or "stopReplProducer" in self.fail_points
            ):
                await trio.sleep(0.05)  # nothing to sync from: roles change rarely, look again soon
                continue
            mine = self.oplog.last_key()
            if source.oplog.last_key() <= mine and self.in_sync:
                await source.oplog.wait_beyond(mine, trio.current_time() + 0.1)
                continue
            if rs.lag_s:
                await trio.sleep(rs.lag_s)
            if source is not rs.primary_node:
                continue
            if mine and (not source.oplog.contains(mine) or mine < source.oplog.first_key()):
                self._resync(
                    source
                )  # rolled-back entries, or too stale to catch up: copy the primary
            else:
                for raw in source.oplog.read_after(mine, 10_000):
                    doc = bson.decode(raw, DECODE)
                    self.oplog.append_raw(ts_key(doc["ts"]), raw)
                    self.applier.apply(doc)
            if not self.in_sync:  # RECOVERING -> SECONDARY: tell the drivers watching
                self.in_sync = True
                rs.notify()
            rs.member_applied()
            await trio.lowlevel.checkpoint()

    def _resync(self, source: ShardNode) -> None:
        log.info(
            "%s: rolling back to the primary's state (resync from %s)", self.address, source.address
        )
        self.dbs.clear()
        self.dbs.update(copy.deepcopy(source.dbs))
        self.applier.pending = copy.deepcopy(source.applier.pending)
        self.applier.prepared = copy.deepcopy(source.applier.prepared)
        self.applier.images = copy.deepcopy(source.applier.images)
        self.applier.statements = copy.deepcopy(source.applier.statements)
        self.oplog.copy_from(source.oplog)
        self.branch_end = None
        self.replset.notify()  # ROLLBACK -> SECONDARY; majority readers here may read on

    # -- what a change stream on this member may see: the majority-committed part of its oplog ---------

    def applied_key(self) -> int:
        """The newest entry of this member's that is on the set's history (what counts toward a majority)."""
        last = self.oplog.last_key()
        return last if self.branch_end is None else min(last, self.branch_end)

    def commit_key(self) -> int:
        return min(self.replset.commit_key(), self.applied_key())

    @property
    def images(self) -> dict[tuple[bytes, int, int], tuple[Any, Any]]:
        return self.applier.images

    async def wait_commit_beyond(self, key: int, deadline: float) -> bool:
        """Wait until this member's own commit point passes `key`: the set's has, and this member
        applied that far on the set's history (a lagging member may know a commit point beyond
        what it has; one on a lost branch sees nothing more until it rolled back)."""
        while self.branch_end is not None and self.branch_end <= key:
            if not await self.replset.wait_changed(deadline):
                return False
        return await self.replset.wait_commit_beyond(
            key, deadline
        ) and await self.oplog.wait_beyond(key, deadline)

    # -- roles: what a secondary refuses (mongodb-formats.md D: 10107, 13435) -------------------------

    async def check_command(self, name: str, db: str, cmd: dict[str, Any]) -> None:
        lname = name.lower()
        if not self.in_sync and lname in READ_COMMANDS:
            # A member that rejoined serves no reads until it caught up or rolled back (RECOVERING),
            # so no reader sees entries a rollback is about to remove.
            raise MongoError("NotPrimaryOrSecondary", "node is not in primary or recovering state")
        if not self.is_primary:
            # State-change errors carry the topologyVersion (4.4+), so a driver that already knows
            # this version keeps the server instead of marking it Unknown (SDAM "stale errors").
            tv = {"processId": self.process_id, "counter": Int64(self.topology_counter)}
            if lname in WRITE_COMMANDS:
                raise MongoError("NotWritablePrimary", "not primary", topologyVersion=tv)
            rp = cmd.get("$readPreference")
            secondary_ok = isinstance(rp, dict) and rp.get("mode", "primary") != "primary"
            if lname in READ_COMMANDS and not secondary_ok:
                raise MongoError(
                    "NotPrimaryNoSecondaryOk",
                    "not primary and secondaryOk=false",
                    topologyVersion=tv,
                )
        self.check_session(name, cmd)

    async def settle(self, name: str, cmd: dict[str, Any], reply: dict[str, Any]) -> None:
        # The command's last write is the newest entry: no other task ran since the handler wrote.
        if name.lower() in WRITE_COMMANDS and len(self.replset.members) > 1:
            await self.replset.write_concern(cmd, reply, self.oplog.last_key())

    # -- identity ----------------------------------------------------------------------------------

    def _optime(self, key: int) -> dict[str, Any]:
        return {"ts": Timestamp(key >> 32, key & 0xFFFFFFFF), "t": Int64(self.oplog.term)}

    def hello_fields(self, cmd: dict[str, Any]) -> dict[str, Any]:
        rs = self.replset
        last, committed = self.oplog.last_key(), self.commit_key()
        primary = rs.primary_node
        out: dict[str, Any] = {
            "isWritablePrimary": self.is_primary,
            "hosts": rs.hosts,
            "setName": self.set_name,
            "setVersion": 1,
            "secondary": not self.is_primary and self.in_sync,
        }
        if primary is not None:
            out["primary"] = primary.address
        out["me"] = self.address
        if self.is_primary:
            out["electionId"] = self.election_id
        out["lastWrite"] = {
            "opTime": self._optime(last),
            "lastWriteDate": _wall(last),
            "majorityOpTime": self._optime(committed),
            "majorityWriteDate": _wall(committed),
        }
        return out

    async def cmd_repl_status(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        rs = self.replset
        committed = self._optime(rs.commit_key())
        members = []
        for i, m in enumerate(rs.members):
            state, name = (
                (
                    (1, "PRIMARY")
                    if m.is_primary
                    else (2, "SECONDARY")
                    if m.in_sync
                    else (3, "RECOVERING")
                )
                if m.up
                else (8, "(not reachable/healthy)")
            )
            members.append(
                {
                    "_id": i,
                    "name": m.address,
                    "health": 1.0 if m.up else 0.0,
                    "state": state,
                    "stateStr": name,
                    "optime": m._optime(m.oplog.last_key()),
                    "optimeDate": _wall(m.oplog.last_key()),
                    **({"self": True} if m is self else {}),
                }
            )
        me = self._optime(self.oplog.last_key())
        my_state = next(
            m["state"] for m in members if m.get("self")
        )  # RECOVERING (3) while catching up
        return {
            "set": self.set_name,
            "myState": my_state,
            "term": Int64(rs.term),
            "optimes": {"lastCommittedOpTime": committed, "appliedOpTime": me, "durableOpTime": me},
            "members": members,
        }

    async def cmd_step_down(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        if db != "admin":
            raise MongoError(
                "Unauthorized", "replSetStepDown may only be run against the admin database."
            )
        secs = float(cmd.get("replSetStepDown") or 60)
        catch_up = float(cmd.get("secondaryCatchUpPeriodSecs", 10))
        await self.replset.step_down(self, secs, catch_up, bool(cmd.get("force")))
        return {}

    # -- storage helpers ---------------------------------------------------------------------------

    def coll(
        self,
        ns: str,
        *,
        create: bool = False,
        uuid: Any = None,
        session: dict[str, Any] | None = None,
    ) -> Collection | None:
        """A collection; with `create`, made (and logged) when missing, inside the transaction
        of `session` if it has one."""
        db, _, name = ns.partition(".")
        colls = self.dbs.get(db)
        if colls is None or name not in colls:
            if not create:
                return None
            return self._create(db, name, {}, uuid, session=session)
        coll = colls[name]
        if "timeseries" in coll.options and "viewOn" in coll.options:
            # A time-series collection's documents live in its buckets collection.
            return colls.get(coll.options["viewOn"], coll)
        return coll

    def _log_ddl(
        self, entry: dict[str, Any], session: dict[str, Any] | None, undo: Callable[[], None]
    ) -> None:
        """A DDL entry: inside the session's transaction when there is one (the server logs a
        create or createIndexes run in a transaction inside its applyOps, ddl_create_index_txn.js),
        else on its own. Retryable-write session fields are never logged on DDL."""
        txn = (session or {}).get("$txn")
        if txn is not None:
            txn.record(entry, undo)
        else:
            self.oplog.append(entry)

    def _create(
        self,
        db: str,
        name: str,
        options: dict[str, Any],
        uuid: Any = None,
        *,
        session: dict[str, Any] | None = None,
    ) -> Collection:
        if not name or "$" in name or not db:
            raise MongoError("InvalidNamespace", f"Invalid collection name: {db}.{name}")
        is_buckets = name.startswith("system.buckets.")
        if "timeseries" in options and "viewOn" not in options and not is_buckets:
            return self._create_timeseries(db, name, options, session)
        stored = catalog_options({k: v for k, v in options.items() if k != "idIndex"})
        coll = Collection(name, options=stored)
        if uuid is not None:
            coll.uuid = uuid if isinstance(uuid, uuidlib.UUID) else uuidlib.UUID(bytes=bytes(uuid))
        if "viewOn" in stored:
            # A view is a document in <db>.system.views (ViewCatalog), made by that collection's
            # first view; the insert is what the oplog shows, with system.views' UUID.
            views = self._system_views(db, session)
            coll.uuid = views.uuid
            self.dbs[db][name] = coll
            doc = {"_id": f"{db}.{name}", **view_document(stored)}
            views.put(doc)

            def drop_view() -> None:  # the transaction aborted
                self.dbs.get(db, {}).pop(name, None)
                views.remove(doc)

            entry = {"op": "i", "ns": f"{db}.system.views", "ui": views.ui, "o": doc}
            self._log_ddl(entry, session, drop_view)
            return coll
        self.dbs.setdefault(db, {})[name] = coll
        entry = {
            "op": "c",
            "ns": f"{db}.$cmd",
            "ui": coll.ui,
            "o": create_entry_o(name, stored, options.get("idIndex")),
        }

        def drop() -> None:  # the transaction aborted
            self.dbs.get(db, {}).pop(name, None)

        self._log_ddl(entry, session, drop)
        return coll

    def _system_views(self, db: str, session: dict[str, Any] | None) -> Collection:
        views = self.dbs.get(db, {}).get("system.views")
        return views if views is not None else self._create(db, "system.views", {}, session=session)

    def _create_timeseries(
        self, db: str, name: str, options: dict[str, Any], session: dict[str, Any] | None
    ) -> Collection:
        """A time-series collection, as 7.0/8.0 make one (timeseries::createCollection): the
        clustered `system.buckets.<name>` collection, then a view `<name>` on it that unpacks the
        buckets (ddl_view_events.js: the create event is the view's, on system.buckets.<name>)."""
        ts = dict(options["timeseries"])
        meta = {"metaField": ts["metaField"]} if "metaField" in ts else {}
        ts_opts = {
            "timeField": ts["timeField"],
            **meta,
            "granularity": ts.get("granularity", "seconds"),
            "bucketMaxSpanSeconds": ts.get("bucketMaxSpanSeconds", 3600),
        }
        buckets = f"system.buckets.{name}"
        rest = {k: v for k, v in options.items() if k not in ("timeseries", "idIndex")}
        self._create(
            db, buckets, {**rest, "clusteredIndex": True, "timeseries": ts_opts}, session=session
        )
        unpack = {
            "timeField": ts_opts["timeField"],
            **meta,
            "bucketMaxSpanSeconds": ts_opts["bucketMaxSpanSeconds"],
        }
        pipeline = [{"$_internalUnpackBucket": unpack}]
        view = self._create(db, name, {"viewOn": buckets, "pipeline": pipeline}, session=session)
        view.options["timeseries"] = ts_opts
        return view

    def document_key(self, ns: str, doc: dict[str, Any]) -> dict[str, Any]:
        key = self.shard_keys.get(ns)
        out: dict[str, Any] = {}
        if key:
            for f in key:
                if f != "_id":
                    got = q.get_path(doc, f)
                    out[f] = got[0] if got else None
        out["_id"] = doc["_id"]
        return out

    def _session_fields(self, cmd: dict[str, Any], stmt_id: int) -> dict[str, Any]:
        """What each write of `cmd` logs besides itself: retryable-write fields, or its transaction."""
        if "lsid" not in cmd or "txnNumber" not in cmd:
            return {}
        lsid = _logged_lsid(cmd)
        if cmd.get("autocommit") is False:
            return {"$txn": self.transactions.get_or_start(cmd, lsid)}
        return {
            "lsid": lsid,
            "txnNumber": Int64(cmd["txnNumber"]),
            "stmtId": stmt_id,
            "prevOpTime": {"ts": Timestamp(0, 0), "t": Int64(-1)},
        }

    def _log(
        self,
        entry: dict[str, Any],
        session: dict[str, Any],
        undo: Callable[[], None],
        images: tuple[Any, Any] | None = None,
        coll: Collection | None = None,
    ) -> None:
        """Append a write's oplog entry, or hold it in its transaction until commit. `images` are
        the document before and after an update or delete, kept if the collection asks for them
        (in a transaction, at its commit)."""
        txn = session.get("$txn")
        if txn is not None:
            txn.record(
                entry, undo, (coll, *images) if images is not None and coll is not None else None
            )
            return
        entry.update(session)
        ts, _ = self.oplog.append(entry)
        self.applier.record_statement(entry)
        if images is not None and coll is not None:
            self.applier.record_images(coll, ts, *images)

    def check_session(self, name: str, cmd: dict[str, Any]) -> None:
        """A statement of a transaction this node never started fails as the server does (251)."""
        if (
            cmd.get("autocommit") is False
            and not cmd.get("startTransaction")
            and "lsid" in cmd
            and name.lower() not in ("committransaction", "aborttransaction")
            and self.transactions.open(txn_key(cmd)) is None
        ):
            raise no_such_transaction(txn_key(cmd))

    def kill_sessions(self, named: SessionsNamed) -> None:
        """Cursors, then the sessions' unprepared transactions (killSessionsAbortUnpreparedTransactions)."""
        super().kill_sessions(named)
        self.transactions.kill_sessions(named)

    async def cmd_server_status(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        reply = await super().cmd_server_status(db, cmd, req)
        reply["metrics"]["abortExpiredTransactions"] = {
            "passes": Int64(self.expired_transaction_passes)
        }
        return reply

    async def cmd_commit_transaction(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        self.transactions.commit(txn_key(cmd))
        return {}

    async def cmd_abort_transaction(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        self.transactions.abort(txn_key(cmd))
        return {}

    # -- writes ------------------------------------------------------------------------------------

    def insert_one(
        self,
        ns: str,
        doc: dict[str, Any],
        session: dict[str, Any],
        *,
        from_migrate: bool = False,
        raw: bytes | None = None,
    ) -> None:
        coll = self.coll(ns, create=True, session=session)
        assert coll is not None
        ns = f"{ns.partition('.')[0]}.{coll.name}"
        if "_id" not in doc:
            doc = {"_id": ObjectId(), **doc}
            raw = None
        key = id_key(doc["_id"])
        coll.check_unique(doc, ns, key=key)
        coll.put(doc, key=key)
        entry: dict[str, Any] = {
            "op": "i",
            "ns": ns,
            "ui": coll.ui,
            "o": RawBSONDocument(raw, RAW) if raw is not None else doc,
            "o2": self.document_key(ns, doc),
        }
        if from_migrate:
            entry["fromMigrate"] = True
        self._log(entry, session, lambda: coll.remove(doc))

    async def cmd_insert(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        return q.run_inserts(f"{db}.{cmd['insert']}", cmd, lambda doc: self)

    def update_docs(self, ns: str, spec: dict[str, Any], session: dict[str, Any]) -> dict[str, Any]:
        if self.applier.already_done(session):  # a retried statement: it matched and modified one
            return {"n": 1, "nModified": 1}
        coll = self.coll(ns)
        filt, upd = spec.get("q", {}), spec.get("u", {})
        if isinstance(upd, list):
            return self._pipeline_update(
                ns, filt, upd, spec.get("multi", False), session, bool(spec.get("upsert"))
            )
        multi = spec.get("multi", False)
        if multi and upd and not next(iter(upd)).startswith("$"):
            raise MongoError(
                "FailedToParse", "multi update is not supported for replacement-style update"
            )
        matched = self.select(ns, filt, limit=0 if multi else 1)
        n_modified = 0
        for old in matched:
            new, o = update_with_entry(old, upd, array_filters=spec.get("arrayFilters"), query=filt)
            assert coll is not None
            coll.check_unique(new, ns, ignore=id_key(old["_id"]))
            if o is None:
                continue  # nothing changed: no oplog entry, not counted as modified
            coll.put(new, old)
            n_modified += 1
            entry = {"op": "u", "ns": ns, "ui": coll.ui, "o": o, "o2": self.document_key(ns, old)}
            self._log(entry, session, functools.partial(coll.put, old, new), (old, new), coll)
        out: dict[str, Any] = {"n": len(matched), "nModified": n_modified}
        if not matched and spec.get("upsert"):
            base = {
                k: v for k, v in filt.items() if not k.startswith("$") and not isinstance(v, dict)
            }
            new = apply_update(
                base if upd and next(iter(upd)).startswith("$") else None, upd, is_insert=True
            )
            if "_id" not in new:
                new = {"_id": base.get("_id", ObjectId()), **new}
            self.insert_one(ns, new, session)
            out = {"n": 1, "nModified": 0, "upserted": [{"index": 0, "_id": new["_id"]}]}
        return out

    def _pipeline_update(
        self,
        ns: str,
        filt: dict[str, Any],
        pipeline: list[Any],
        multi: bool,
        session: dict[str, Any],
        upsert: bool = False,
    ) -> dict[str, Any]:
        """An update given as an aggregation pipeline; logged as the server logs it: the $v:2 diff of
        old -> new, or the whole new document when that diff is not smaller (updates.pipeline_entry)."""
        from simcluster.aggregate import run_pipeline

        for stage in pipeline:
            name = next(iter(stage), "")
            if name not in _UPDATE_PIPELINE_STAGES:
                raise MongoError(
                    "InvalidOptions", f"{name} is not allowed to be used within an update"
                )
        coll = self.coll(ns)
        matched = self.select(ns, filt, limit=0 if multi else 1)
        n_modified = 0
        for old in matched:
            new = replaced_by_pipeline(old, run_pipeline([dict(old)], pipeline)[0])
            o = pipeline_entry(old, new)
            if o is None:
                continue
            assert coll is not None
            coll.check_unique(new, ns, ignore=id_key(old["_id"]))
            coll.put(new, old)
            n_modified += 1
            entry = {"op": "u", "ns": ns, "ui": coll.ui, "o": o, "o2": self.document_key(ns, old)}
            self._log(entry, session, functools.partial(coll.put, old, new), (old, new), coll)
        if not matched and upsert:
            # As the server: the pipeline runs on a document made of the filter's equalities.
            base = {
                k: v for k, v in filt.items() if not k.startswith("$") and not isinstance(v, dict)
            }
            new = replaced_by_pipeline(base, run_pipeline([dict(base)], pipeline)[0])
            if "_id" not in new:
                new = {"_id": ObjectId(), **new}
            self.insert_one(ns, new, session)
            return {"n": 1, "nModified": 0, "upserted": [{"index": 0, "_id": new["_id"]}]}
        return {"n": len(matched), "nModified": n_modified}

    async def cmd_update(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['update']}"
        return q.run_updates(
            cmd, lambda i, spec: self.update_docs(ns, spec, self._session_fields(cmd, i))
        )

    def delete_docs(
        self,
        ns: str,
        filt: dict[str, Any],
        limit: int,
        session: dict[str, Any],
        *,
        from_migrate: bool = False,
    ) -> int:
        if self.applier.already_done(session):  # a retried statement: it deleted one
            return 1
        coll = self.coll(ns)
        if coll is None:
            return 0
        removed = 0
        for doc in self.select(ns, filt, limit=limit):
            coll.remove(doc)
            removed += 1
            entry: dict[str, Any] = {
                "op": "d",
                "ns": ns,
                "ui": coll.ui,
                "o": self.document_key(ns, doc),
            }
            if from_migrate:
                entry["fromMigrate"] = True
            self._log(entry, session, functools.partial(coll.put, doc), (doc, None), coll)
        return removed

    async def cmd_delete(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['delete']}"
        n = 0
        for i, spec in enumerate(cmd.get("deletes", [])):
            n += self.delete_docs(
                ns, spec.get("q", {}), spec.get("limit", 0), self._session_fields(cmd, i)
            )
        return {"n": n}

    async def cmd_find_and_modify(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        ns = f"{db}.{cmd['findAndModify']}"
        coll = self.coll(ns)
        docs = [d for d in coll if q.matches(d, cmd.get("query", {}))] if coll else []
        if cmd.get("sort"):
            docs = q.sort_docs(docs, cmd["sort"])
        old = docs[0] if docs else None
        session = self._session_fields(cmd, 0)
        if cmd.get("remove"):
            if old is not None:
                self.delete_docs(ns, {"_id": old["_id"]}, 1, session)
            return {"lastErrorObject": {"n": 1 if old else 0}, "value": old}
        # The document found, by _id; the query still stands beside it for a positional `$` path.
        query = cmd.get("query", {})
        r = self.update_docs(
            ns,
            {
                "q": {"$and": [{"_id": old["_id"]}, query]} if old else query,
                "u": cmd.get("update", {}),
                "upsert": cmd.get("upsert", False),
            },
            session,
        )
        after = None
        if cmd.get("new"):
            target = old["_id"] if old else (r.get("upserted") or [{"_id": None}])[0]["_id"]
            c = self.coll(ns)
            after = c.docs.get(id_key(target)) if c else None
        leo: dict[str, Any] = {"n": r["n"], "updatedExisting": bool(old)}
        if r.get("upserted"):
            leo["upserted"] = r["upserted"][0]["_id"]
        return {"lastErrorObject": leo, "value": after if cmd.get("new") else old}

    # -- reads -------------------------------------------------------------------------------------

    def select(
        self,
        ns: str,
        filt: dict[str, Any],
        *,
        sort: Any = None,
        skip: int = 0,
        limit: int = 0,
        projection: Any = None,
    ) -> list[dict[str, Any]]:
        coll = self.coll(ns)
        if coll is None:
            return []
        ids = q.pinned_ids(filt)
        if ids is not None:
            found = {id(d): d for d in map(coll.docs.get, map(id_key, ids)) if d is not None}
            docs = [d for d in found.values() if q.matches(d, filt)]
        elif limit and not sort and not skip:
            docs = []
            for d in coll.docs.values():
                if q.matches(d, filt):
                    docs.append(d)
                    if len(docs) >= abs(limit):
                        break
        else:
            docs = [d for d in coll.docs.values() if q.matches(d, filt)]
        if sort:
            docs = q.sort_docs(docs, sort)
        if skip:
            docs = docs[skip:]
        if limit:
            docs = docs[: abs(limit)]
        return list(map(find_projection(projection), docs))

    def _preimage_docs(self, filt: dict[str, Any]) -> list[dict[str, Any]]:
        """config.system.preimages as the server keeps it: {_id: {nsUUID, ts, applyOpsIndex},
        operationTime, preImage}; an `_id: {$in: [...]}` or `_id: {...}` filter is looked up directly."""
        ids = filt.get("_id")
        wanted = (
            ids.get("$in")
            if isinstance(ids, dict) and "$in" in ids
            else [ids]
            if isinstance(ids, dict)
            else None
        )
        keys = (
            [
                (bytes(i["nsUUID"]), ts_key(i["ts"]), int(i.get("applyOpsIndex", 0)))
                for i in wanted
                if isinstance(i, dict) and "nsUUID" in i
            ]
            if wanted is not None
            else list(self.applier.images)
        )
        out = []
        for uuid_bytes, key, index in keys:
            images = self.applier.images.get((uuid_bytes, key, index))
            if images is None or images[0] is None:
                continue
            ts = Timestamp(key >> 32, key & 0xFFFFFFFF)
            out.append(
                {
                    "_id": {
                        "nsUUID": Binary(uuid_bytes, 4),
                        "ts": ts,
                        "applyOpsIndex": Int64(index),
                    },
                    "operationTime": datetime.datetime.fromtimestamp(ts.time, datetime.UTC),
                    "preImage": images[0],
                }
            )
        return out

    async def cmd_find(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['find']}"
        if ns == OPLOG_NS:
            return await self._find_oplog(cmd)
        if ns == PREIMAGES_NS:
            docs = [
                d
                for d in self._preimage_docs(cmd.get("filter") or {})
                if q.matches(d, cmd.get("filter") or {})
            ]
            return {
                "cursor": await self.cursors.first_batch(Cursor(ns, docs), cmd.get("batchSize"))
            }
        docs = self.select(
            ns,
            cmd.get("filter", {}),
            sort=cmd.get("sort"),
            skip=cmd.get("skip", 0),
            limit=cmd.get("limit", 0),
            projection=cmd.get("projection"),
        )
        if cmd.get("singleBatch"):
            docs = docs[: cmd.get("batchSize", 101) or None]
        return {"cursor": await self.cursors.first_batch(Cursor(ns, docs), cmd.get("batchSize"))}

    async def _find_oplog(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """A (tailable, awaitData) find on local.oplog.rs; its `ts` condition (`$gt`, `$gte`, `$lt`,
        `$lte` or a timestamp) bounds the scan, as the server bounds an oplog scan by record id."""
        filt = cmd.get("filter", {})
        cond = filt.get("ts", {})
        oplog = self.oplog
        position, upper = 0, None
        if isinstance(cond, Timestamp):
            position, upper = ts_key(cond) - 1, ts_key(cond)
        elif isinstance(cond, dict):
            if "$gte" in cond or "$gt" in cond:
                start = ts_key(cond["$gte"] if "$gte" in cond else cond["$gt"])
                position = start - 1 if "$gte" in cond else start
            if "$lte" in cond or "$lt" in cond:
                upper = ts_key(cond["$lte"]) if "$lte" in cond else ts_key(cond["$lt"]) - 1
        # A scan that starts before the oldest entry starts at the oldest entry; only a cursor whose
        # position is truncated away later dies with CappedPositionLost.
        position = max(position, oplog.truncated_before)
        rest = {k: v for k, v in filt.items() if k != "ts"}
        tailable = bool(cmd.get("tailable"))
        remaining = cmd.get("limit") or 0
        # Oplog entries are as visible as the writes they record (SERVER-23186): a majority read
        # sees nothing past the commit point, so nothing it returns can be rolled back.
        majority = (cmd.get("readConcern") or {}).get("level") == "majority"

        async def fetch(limit: int, deadline: float) -> list[Any]:
            nonlocal position
            if oplog.truncated_before and position < oplog.truncated_before:
                raise MongoError(
                    "CappedPositionLost",
                    "CollectionScan died due to position in capped collection being deleted",
                )
            nonlocal remaining
            while True:
                upto = self.commit_key() if majority else None
                if upper is not None:
                    upto = upper if upto is None else min(upto, upper)
                raws = oplog.read_after(
                    position, min(limit, remaining) if remaining else limit, upto=upto
                )
                if cmd.get("limit"):
                    if not remaining:
                        return []
                    remaining -= len(raws)
                if raws:
                    position = oplog.entry_key(raws[-1])
                    if rest:
                        return [
                            bson.decode(r, DECODE)
                            for r in raws
                            if q.matches(bson.decode(r, DECODE), rest)
                        ]
                    return RawBatch(raws)
                if not tailable:
                    return []
                waited = self.wait_commit_beyond if majority else oplog.wait_beyond
                if not await waited(position, deadline):
                    return []

        # A non-tailable scan ends (cursor id 0) once it has returned everything there is, its
        # `limit`, or its first batch if that is all it asked for (singleBatch), as on a server:
        # no cursor is left open, to time out.
        def done() -> bool:
            return (
                bool(cmd.get("singleBatch"))
                or (bool(cmd.get("limit")) and not remaining)
                or position >= min(oplog.last_key(), upper or 1 << 64)
            )

        cursor = Cursor(
            OPLOG_NS,
            fetch=fetch,
            tailable=tailable,
            await_data=bool(cmd.get("awaitData")),
            done=None if tailable else done,
        )
        return {"cursor": await self.cursors.first_batch(cursor, cmd.get("batchSize"))}

    async def cmd_count(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        return {
            "n": len(
                self.select(
                    f"{db}.{cmd['count']}",
                    cmd.get("query") or {},
                    skip=cmd.get("skip", 0),
                    limit=cmd.get("limit", 0),
                )
            )
        }

    async def cmd_distinct(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        return {
            "values": q.distinct_values(
                self.select(f"{db}.{cmd['distinct']}", cmd.get("query") or {}), cmd["key"]
            )
        }

    async def cmd_aggregate(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        from simcluster.aggregate import run_pipeline

        coll = cmd["aggregate"]
        ns = f"{db}.{coll}" if isinstance(coll, str) else f"{db}.$cmd.aggregate"
        pipeline = cmd.get("pipeline", [])
        if pipeline and "$changeStream" in pipeline[0]:
            from simcluster.native_stream import open_native_stream

            def lookup(ns: str, key: dict[str, Any]) -> Any:
                found = self.select(ns, key, limit=1)
                return found[0] if found else None

            def is_view(ns: str) -> bool:
                coll = self.dbs.get(db, {}).get(ns.partition(".")[2])
                return coll is not None and "viewOn" in coll.options

            return await open_native_stream(self, db, cmd, [self], lookup, is_view=is_view)
        docs = self.select(ns, {}) if isinstance(coll, str) else []
        out = run_pipeline(docs, pipeline)
        return {
            "cursor": await self.cursors.first_batch(
                Cursor(ns, out), cmd.get("cursor", {}).get("batchSize")
            )
        }

    # -- DDL ---------------------------------------------------------------------------------------

    async def cmd_create(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        name = cmd["create"]
        if self.coll(f"{db}.{name}") is not None:
            raise MongoError("NamespaceExists", f"Collection {db}.{name} already exists.")
        opts = {
            k: v
            for k, v in cmd.items()
            if k not in ("create", "collectionUUID") and k not in _GENERIC_ARGS
        }
        self._create(db, name, opts, cmd.get("collectionUUID"), session=self._ddl_session(cmd))
        return {}

    async def cmd_drop(
        self, db: str, cmd: dict[str, Any], req: Request, *, from_migrate: bool = False
    ) -> dict[str, Any]:
        """Drop a collection or view. `from_migrate`: a sharded collection's drop on a shard other
        than the database's primary, which 7.0's DropCollectionCoordinator sends with fromMigrate
        (sendDropCollectionParticipantCommandToShards), so change streams show one drop."""
        name = cmd["drop"]
        coll = self.dbs.get(db, {}).pop(name, None)
        if coll is None:
            return {"ns": f"{db}.{name}", "nIndexesWas": 0}
        if "viewOn" in coll.options:  # dropping a view deletes its system.views document
            views = self.dbs.get(db, {}).get("system.views")
            if views is not None:
                views.docs.pop(id_key(f"{db}.{name}"), None)
                self.oplog.append(
                    {
                        "op": "d",
                        "ns": f"{db}.system.views",
                        "ui": views.ui,
                        "o": {"_id": f"{db}.{name}"},
                    }
                )
            if "timeseries" in coll.options:  # and a time-series collection its buckets
                await self.cmd_drop(db, {"drop": coll.options["viewOn"]}, req)
            return {"ns": f"{db}.{name}"}
        entry: dict[str, Any] = {
            "op": "c",
            "ns": f"{db}.$cmd",
            "ui": coll.ui,
            "o": {"drop": name},
            "o2": {"numRecords": len(coll.docs)},
        }
        if from_migrate:
            entry["fromMigrate"] = True
        self.oplog.append(entry)
        return {"ns": f"{db}.{name}", "nIndexesWas": len(coll.indexes)}

    async def cmd_drop_database(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        colls = self.dbs.get(db, {})
        # Views first: each deletes its document of system.views, which is dropped after them.
        for name in sorted(colls, key=lambda n: "viewOn" not in colls[n].options):
            if name in colls:
                await self.cmd_drop(db, {"drop": name}, req)
        self.dbs.pop(db, None)
        self.oplog.append({"op": "c", "ns": f"{db}.$cmd", "o": {"dropDatabase": 1}})
        return {"dropped": db}

    async def cmd_rename(
        self, db: str, cmd: dict[str, Any], req: Request, *, from_migrate: bool = False
    ) -> dict[str, Any]:
        """renameCollection; `from_migrate` for resharding's rename of its temporary collection
        over the original (RenameCollectionOptions markFromMigrate), which streams hide."""
        src, dst = cmd["renameCollection"], cmd["to"]
        coll = self.coll(src)
        if coll is None:
            raise MongoError("NamespaceNotFound", f"Source collection {src} does not exist")
        target = self.coll(dst)
        if target is not None and not cmd.get("dropTarget"):
            raise MongoError("NamespaceExists", f"Target collection {dst} exists")
        o: dict[str, Any] = {"renameCollection": src, "to": dst, "stayTemp": False}
        if target is not None:
            o["dropTarget"] = target.ui
        sdb, _, sname = src.partition(".")
        ddb, _, dname = dst.partition(".")
        self.dbs[sdb].pop(sname)
        coll.name = dname
        self.dbs.setdefault(ddb, {})[dname] = coll
        entry: dict[str, Any] = {"op": "c", "ns": f"{sdb}.$cmd", "ui": coll.ui, "o": o}
        if from_migrate:
            entry["fromMigrate"] = True
        self.oplog.append(entry)
        return {}

    def _ddl_session(self, cmd: dict[str, Any]) -> dict[str, Any] | None:
        """The transaction a DDL command runs in, if any (a create or createIndexes may)."""
        return self._session_fields(cmd, 0) if cmd.get("autocommit") is False else None

    async def cmd_create_indexes(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        """On an empty collection (or one made in this transaction) each new index is one
        createIndexes entry; on a collection with documents the build is two-phase: one
        startIndexBuild and one commitIndexBuild entry holding all the new indexes
        (IndexBuildsCoordinator; real token research #14 decodes to one event with both)."""
        ns = f"{db}.{cmd['createIndexes']}"
        session = self._ddl_session(cmd)
        existed = self.coll(ns) is not None
        coll = self.coll(ns, create=True, uuid=cmd.get("collectionUUID"), session=session)
        assert coll is not None
        txn = (session or {}).get("$txn")
        if txn is not None and not any(
            op["ns"] == f"{db}.$cmd" and op["o"].get("create") == coll.name for op in txn.ops
        ):
            # Only a collection this transaction created may get indexes in it (create_indexes.cpp).
            raise MongoError(
                "OperationNotSupportedInTransaction",
                f"Cannot create new indexes on "
                f"existing collection {ns} in a multi-document transaction.",
            )
        before = len(coll.indexes)
        added: list[dict[str, Any]] = []
        try:
            for spec in cmd.get("indexes", []):
                fixed = fix_index_spec({"v": 2, **spec})
                if coll.add_index(fixed, ns):
                    added.append(fixed)
        except MongoError:
            for spec in added:
                coll.indexes.pop(spec["name"], None)
            raise
        if added and coll.docs and session is None:
            build = {"indexBuildUUID": Binary(uuidlib.uuid4().bytes, 4), "indexes": added}
            for phase in ("startIndexBuild", "commitIndexBuild"):
                self.oplog.append(
                    {"op": "c", "ns": f"{db}.$cmd", "ui": coll.ui, "o": {phase: coll.name, **build}}
                )
        else:
            for spec in added:
                entry = {
                    "op": "c",
                    "ns": f"{db}.$cmd",
                    "ui": coll.ui,
                    "o": {"createIndexes": coll.name, **spec},
                }
                self._log_ddl(entry, session, functools.partial(_drop_index, coll, spec["name"]))
        return {
            "numIndexesBefore": before,
            "numIndexesAfter": len(coll.indexes),
            "createdCollectionAutomatically": not existed,
        }

    async def cmd_drop_indexes(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['dropIndexes']}"
        coll = self.coll(ns)
        if coll is None:
            raise MongoError("NamespaceNotFound", f"ns not found {ns}")
        which: Any = cmd.get("index")
        names = (
            [n for n in coll.indexes if n != "_id_"]
            if which == "*"
            else (
                [which]
                if isinstance(which, str)
                else [n for n, ix in coll.indexes.items() if ix.key == dict(which)]
                if isinstance(which, dict)
                else list(which)
            )
        )
        before = len(coll.indexes)
        for name in names:
            ix = coll.indexes.get(name)
            if ix is None or name == "_id_":
                raise MongoError("IndexNotFound", f"index not found with name [{name}]")
            del coll.indexes[name]
            self.oplog.append(
                {
                    "op": "c",
                    "ns": f"{db}.$cmd",
                    "ui": coll.ui,
                    "o": {"dropIndexes": coll.name, "index": name},
                    "o2": fix_index_spec(ix.spec),
                }
            )
        return {"nIndexesWas": before}

    async def cmd_coll_mod(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['collMod']}"
        coll = self.coll(ns)
        if coll is None:
            raise MongoError("NamespaceNotFound", f"ns does not exist: {ns}")
        changes = {k: v for k, v in cmd.items() if k != "collMod" and k not in _GENERIC_ARGS}
        named = self.dbs.get(db, {}).get(cmd["collMod"])
        if named is not None and "timeseries" in named.options and "timeseries" in changes:
            return self._modify_timeseries(db, named, coll, changes["timeseries"])
        if "viewOn" in coll.options:
            return self._modify_view(db, coll, changes)
        old_options = dict(coll.options)
        coll.options.update({k: v for k, v in changes.items() if k != "index"})
        if "validator" in changes:
            # A validator comes with a validation level and action, the defaults unless given
            # (the next collMod's stateBeforeChange shows them:
            # jstests/change_streams/ddl_coll_mod_event.js, testCollModValidator).
            coll.options.setdefault("validationLevel", "strict")
            coll.options.setdefault("validationAction", "error")
        o2: dict[str, Any] = {"collectionOptions_old": options_before_change(coll.ui, old_options)}
        if "index" in changes:
            ix = next(
                (
                    i
                    for i in coll.indexes.values()
                    if i.name == changes["index"].get("name")
                    or i.key == changes["index"].get("keyPattern")
                ),
                None,
            )
            if ix is None:
                raise MongoError("IndexNotFound", "cannot find index for collMod")
            changed = [k for k in changes["index"] if k not in ("name", "keyPattern")]
            o2["indexOptions_old"] = {k: ix.spec.get(k, False) for k in changed}
            ix.spec = modified_index_spec(ix.spec, changes["index"])
        self.oplog.append(
            {
                "op": "c",
                "ns": f"{db}.$cmd",
                "ui": coll.ui,
                "o": {"collMod": coll.name, **changes},
                "o2": o2,
            }
        )
        return {}

    def _modify_timeseries(
        self, db: str, view: Collection, buckets: Collection, change: dict[str, Any]
    ) -> dict[str, Any]:
        """collMod of a time-series collection's granularity: its buckets collection takes the
        new options (a collMod of system.buckets.<name>, which change streams do not show) and
        its view's unpack stage the new bucket span, a replacement of its system.views document
        (ddl_view_events.js: the modify event's pipeline has bucketMaxSpanSeconds 86400 for
        "minutes"; timeseries::getMaxSpanSecondsFromGranularity: 3600, 86400, 2592000)."""
        ts = {**view.options["timeseries"], **change}
        ts["bucketMaxSpanSeconds"] = change.get(
            "bucketMaxSpanSeconds", _BUCKET_SPAN[ts["granularity"]]
        )
        old_options = dict(buckets.options)
        buckets.options["timeseries"] = ts
        self.oplog.append(
            {
                "op": "c",
                "ns": f"{db}.$cmd",
                "ui": buckets.ui,
                "o": {"collMod": buckets.name, "timeseries": change},
                "o2": {"collectionOptions_old": options_before_change(buckets.ui, old_options)},
            }
        )
        meta = {"metaField": ts["metaField"]} if "metaField" in ts else {}
        unpack = {
            "timeField": ts["timeField"],
            **meta,
            "bucketMaxSpanSeconds": ts["bucketMaxSpanSeconds"],
        }
        view.options["timeseries"] = ts
        return self._modify_view(
            db,
            view,
            {"viewOn": view.options["viewOn"], "pipeline": [{"$_internalUnpackBucket": unpack}]},
        )

    def _modify_view(self, db: str, view: Collection, changes: dict[str, Any]) -> dict[str, Any]:
        """collMod of a view replaces its system.views document (ViewCatalog::modifyView): the
        oplog shows a replacement update of system.views, never a collMod command
        (change_stream_event_transform.cpp, ChangeStreamViewDefinitionEventTransformation)."""
        view.options.update({k: v for k, v in changes.items() if k in ("viewOn", "pipeline")})
        views = self._system_views(db, None)
        doc = {"_id": f"{db}.{view.name}", **view_document(view.options)}
        views.put(doc)
        self.oplog.append(
            {
                "op": "u",
                "ns": f"{db}.system.views",
                "ui": views.ui,
                "o": doc,
                "o2": {"_id": doc["_id"]},
            }
        )
        return {}

    async def cmd_list_databases(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        dbs = [
            {"name": n, "sizeOnDisk": Int64(4096), "empty": not colls}
            for n, colls in sorted(self.dbs.items())
        ]
        if cmd.get("nameOnly"):
            dbs = [{"name": d["name"]} for d in dbs]
        return {"databases": dbs, "totalSize": Int64(4096 * len(dbs))}

    def collection_infos(self, db: str) -> list[dict[str, Any]]:
        out = []
        for name, coll in sorted(self.dbs.get(db, {}).items()):
            is_view = "viewOn" in coll.options
            # A time-series collection lists as its own type, writable (list_collections.cpp).
            kind = (
                ("timeseries" if "timeseries" in coll.options else "view")
                if is_view
                else "collection"
            )
            options = (
                {"timeseries": coll.options["timeseries"]}
                if kind == "timeseries"
                else dict(coll.options)
            )
            info: dict[str, Any] = {
                "name": name,
                "type": kind,
                "options": options,
                "info": {"readOnly": kind == "view"},
            }
            if not is_view:
                info["info"]["uuid"] = coll.ui
                info["idIndex"] = {"v": 2, "key": {"_id": 1}, "name": "_id_"}
            out.append(info)
        return out

    async def cmd_list_collections(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        infos = [i for i in self.collection_infos(db) if q.matches(i, cmd.get("filter") or {})]
        if cmd.get("nameOnly"):
            infos = [{"name": i["name"], "type": i["type"]} for i in infos]
        return {
            "cursor": await self.cursors.first_batch(
                Cursor(f"{db}.$cmd.listCollections", infos), cmd.get("cursor", {}).get("batchSize")
            )
        }

    async def cmd_list_indexes(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['listIndexes']}"
        coll = self.coll(ns)
        if coll is None:
            raise MongoError("NamespaceNotFound", f"ns does not exist: {ns}")
        specs = [dict(ix.spec) for ix in coll.indexes.values()]
        return {"cursor": await self.cursors.first_batch(Cursor(ns, specs), None)}

    async def cmd_db_stats(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        colls = self.dbs.get(db, {})
        return {
            "db": db,
            "collections": len(colls),
            "objects": sum(len(c.docs) for c in colls.values()),
        }

    async def cmd_coll_stats(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        coll = self.coll(f"{db}.{cmd['collStats']}")
        return {"ns": f"{db}.{cmd['collStats']}", "count": len(coll.docs) if coll else 0}

    # -- oplog notes -------------------------------------------------------------------------------

    async def cmd_append_oplog_note(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        if db != "admin":
            raise MongoError(
                "Unauthorized", "appendOplogNote may only be run against the admin database."
            )
        data = cmd.get("data")
        if not isinstance(data, dict):
            raise MongoError("BadValue", "'data' field must be a document")
        max_ct = cmd.get("maxClusterTime")
        if max_ct is not None and ts_key(max_ct) <= self.oplog.last_key():
            raise MongoError(
                "StaleClusterTime", "maxClusterTime is not greater than the last applied timestamp"
            )
        self.oplog.append({"op": "n", "ns": "", "o": data})
        return {}

    def append_noop(
        self, o: dict[str, Any], o2: dict[str, Any] | None = None, ui: Any = None, ns: str = ""
    ) -> Timestamp:
        """A noop entry; sharding's notices for change streams name their collection (`ns`, `ui`)."""
        entry: dict[str, Any] = {"op": "n", "ns": ns, "o": o}
        if ui is not None:
            entry["ui"] = ui
        if o2 is not None:
            entry["o2"] = o2
        ts, _ = self.oplog.append(entry)
        return ts
