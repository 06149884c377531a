"""A shard member's state and the storage helpers every command family shares: its
collections, how a write is logged (alone, with its session fields, or in its transaction),
and what of its oplog is majority-committed.
"""

from __future__ import annotations

import datetime
import itertools
import logging
import math
import uuid as uuidlib
from collections.abc import Callable
from typing import Any

from bson import Binary, Int64, ObjectId, Timestamp

from mongoformats.errors import MongoError
from simcluster import query as q
from simcluster.aggregate import find_projection
from simcluster.apply import Applier
from simcluster.catalog import (
    catalog_options,
    create_entry_o,
    view_document,
)
from simcluster.oplog import ClusterClock, Oplog
from simcluster.replset import ReplicaSet
from simcluster.server import CommandServer
from simcluster.storage import Collection, id_key
from simcluster.transactions import (
    TransactionTable,
    no_such_transaction,
    txn_key,
)

log = logging.getLogger("simcluster")


def _wall(key: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(key >> 32, datetime.UTC)


# lsid.uid of an unauthenticated session: SHA-256 of the empty user name (mongodb-formats.md C.1).
_ANONYMOUS_UID = __import__("hashlib").sha256(b"").digest()


def _logged_lsid(cmd: dict[str, Any]) -> dict[str, Any]:
    """The lsid a command's writes log (with the user's uid), built once per command."""
    lsid = cmd.get("$lsid_logged")
    if lsid is None:
        lsid = cmd["$lsid_logged"] = cmd["lsid"] | {"uid": Binary(_ANONYMOUS_UID, 0)}
    return lsid


def _matching(coll: Collection, filt: dict[str, Any], stop_at: int) -> list[dict[str, Any]]:
    """The documents of `coll` that match `filt`, at most `stop_at` of them unless that is 0; a
    filter that pins `_id` values is answered from the `_id` index."""
    ids = q.pinned_ids(filt)
    if ids is not None:
        return _matching_ids(coll, filt, ids)
    scan = (d for d in coll.docs.values() if q.matches(d, filt))
    return list(itertools.islice(scan, stop_at or None))


def _matching_ids(
    coll: Collection, filt: dict[str, Any], ids: list[object]
) -> list[dict[str, Any]]:
    """The documents with the given `_id`s (each once) that match `filt`, from the `_id`
    index."""
    found = {id(d): d for d in map(coll.docs.get, map(id_key, ids)) if d is not None}
    return [d for d in found.values() if q.matches(d, filt)]


def _is_timeseries_request(name: str, options: dict[str, Any]) -> bool:
    """A create of a time-series collection (not of its view or buckets, made on the way)."""
    is_buckets = name.startswith("system.buckets.")
    return "timeseries" in options and "viewOn" not in options and not is_buckets


def _as_uuid(uuid: Any) -> uuidlib.UUID:
    """A collection UUID given as a UUID or as its 16 bytes (a BSON binary)."""
    return uuid if isinstance(uuid, uuidlib.UUID) else uuidlib.UUID(bytes=bytes(uuid))


class MemberCore(CommandServer):
    """One replica-set member's data, oplog and write logging."""

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
        self.replset: ReplicaSet[Any]

    @property
    def is_primary(self) -> bool:
        return self.state == "PRIMARY"

    def applied_key(self) -> int:
        """The newest entry of this member's that is on the set's history (what counts toward a
        majority)."""
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

    def _optime(self, key: int) -> dict[str, Any]:
        return {"ts": Timestamp(key >> 32, key & 0xFFFFFFFF), "t": Int64(self.oplog.term)}

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
        if _is_timeseries_request(name, options):
            return self._create_timeseries(db, name, options, session)
        stored = catalog_options({k: v for k, v in options.items() if k != "idIndex"})
        coll = Collection(name, options=stored)
        if uuid is not None:
            coll.uuid = _as_uuid(uuid)
        if "viewOn" in stored:
            return self._create_view(db, coll, session)
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

    def _create_view(self, db: str, view: Collection, session: dict[str, Any] | None) -> Collection:
        """A view is a document in <db>.system.views (ViewCatalog), made by that collection's
        first view; the insert is what the oplog shows, with system.views' UUID."""
        name = view.name
        views = self._system_views(db, session)
        view.uuid = views.uuid
        self.dbs[db][name] = view
        doc = {"_id": f"{db}.{name}", **view_document(view.options)}
        views.put(doc)

        def drop_view() -> None:  # the transaction aborted
            self.dbs.get(db, {}).pop(name, None)
            views.remove(doc)

        entry = {"op": "i", "ns": f"{db}.system.views", "ui": views.ui, "o": doc}
        self._log_ddl(entry, session, drop_view)
        return view

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
        """What each write of `cmd` logs besides itself: retryable-write fields, or its
        transaction."""
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
        # Without a sort or skip, the scan stops at the limit.
        docs = _matching(coll, filt, 0 if sort or skip else abs(limit))
        if sort:
            docs = q.sort_docs(docs, sort)
        if skip:
            docs = docs[skip:]
        if limit:
            docs = docs[: abs(limit)]
        return list(map(find_projection(projection), docs))
