"""A shard member's DDL: create, drop, dropDatabase, renameCollection, index builds and
drops, collMod (of collections, views and time-series collections).
"""

from __future__ import annotations

import functools
import uuid as uuidlib
from typing import Any

from bson import Binary

from mongoformats.errors import MongoError
from simcluster.catalog import (
    fix_index_spec,
    modified_index_spec,
    options_before_change,
    view_document,
)
from simcluster.member_core import MemberCore
from simcluster.server import Request
from simcluster.storage import Collection, Index, id_key

# The bucket span of each time-series granularity (timeseries::getMaxSpanSecondsFromGranularity).
_BUCKET_SPAN = {"seconds": 3600, "minutes": 86400, "hours": 2592000}


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


def _created_in(txn: Any, db: str, name: str) -> bool:
    """Whether transaction `txn` created collection `name` of `db`."""
    return any(op["ns"] == f"{db}.$cmd" and op["o"].get("create") == name for op in txn.ops)


def _add_indexes(coll: Collection, specs: list[dict[str, Any]], ns: str) -> list[dict[str, Any]]:
    """Add the indexes of a createIndexes to `coll`; the specs of those that are new. One that
    fails takes back the ones added before it."""
    added: list[dict[str, Any]] = []
    try:
        for spec in specs:
            fixed = fix_index_spec({"v": 2, **spec})
            if coll.add_index(fixed, ns):
                added.append(fixed)
    except MongoError:
        for spec in added:
            coll.indexes.pop(spec["name"], None)
        raise
    return added


def _index_names(coll: Collection, which: Any) -> list[str]:
    """The index names a dropIndexes `index` argument names: "*" (all but _id_), a name, a key
    pattern, or a list of names."""
    if which == "*":
        return [n for n in coll.indexes if n != "_id_"]
    if isinstance(which, dict):
        return _names_by_key(coll, which)
    return [which] if isinstance(which, str) else list(which)


def _names_by_key(coll: Collection, key: dict[str, object]) -> list[str]:
    return [n for n, ix in coll.indexes.items() if ix.key == dict(key)]


def _modify_options(coll: Collection, changes: dict[str, Any]) -> None:
    coll.options.update({k: v for k, v in changes.items() if k != "index"})
    if "validator" in changes:
        # A validator comes with a validation level and action, the defaults unless given
        # (the next collMod's stateBeforeChange shows them:
        # jstests/change_streams/ddl_coll_mod_event.js, testCollModValidator).
        coll.options.setdefault("validationLevel", "strict")
        coll.options.setdefault("validationAction", "error")


def _modify_index(coll: Collection, change: dict[str, Any]) -> dict[str, Any]:
    """Apply a collMod's `index` change (found by name or key pattern); the options it had
    before, for the entry's o2.indexOptions_old."""
    ix = _index_to_modify(coll, change)
    changed = [k for k in change if k not in ("name", "keyPattern")]
    old = {k: ix.spec.get(k, False) for k in changed}
    ix.spec = modified_index_spec(ix.spec, change)
    return old


def _index_to_modify(coll: Collection, change: dict[str, object]) -> Index:
    """The index a collMod's `index` names, by name or key pattern: IndexNotFound without one."""
    for ix in coll.indexes.values():
        if ix.name == change.get("name") or ix.key == change.get("keyPattern"):
            return ix
    raise MongoError("IndexNotFound", "cannot find index for collMod")


class DDLCommands(MemberCore):
    """The DDL commands of a member."""

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
        if "viewOn" in coll.options:
            return await self._drop_view(db, name, coll, req)
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

    async def _drop_view(
        self, db: str, name: str, view: Collection, req: Request
    ) -> dict[str, object]:
        """Dropping a view deletes its system.views document, and a time-series collection's
        also drops its buckets."""
        views = self.dbs.get(db, {}).get("system.views")
        if views is not None:
            views.discard(id_key(f"{db}.{name}"))
            self.oplog.append(
                {
                    "op": "d",
                    "ns": f"{db}.system.views",
                    "ui": views.ui,
                    "o": {"_id": f"{db}.{name}"},
                }
            )
        if "timeseries" in view.options:
            await self.cmd_drop(db, {"drop": view.options["viewOn"]}, req)
        return {"ns": f"{db}.{name}"}

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
        _check_indexes_in_transaction(session, db, coll, ns)
        before = len(coll.indexes)
        added = _add_indexes(coll, cmd.get("indexes", []), ns)
        if added and coll.docs and session is None:
            self._log_index_build(db, coll, added)
        else:
            self._log_created_indexes(db, coll, added, session)
        return {
            "numIndexesBefore": before,
            "numIndexesAfter": len(coll.indexes),
            "createdCollectionAutomatically": not existed,
        }

    def _log_created_indexes(
        self,
        db: str,
        coll: Collection,
        added: list[dict[str, Any]],
        session: dict[str, Any] | None,
    ) -> None:
        """One createIndexes entry per new index (an empty collection, or in a transaction)."""
        for spec in added:
            entry = {
                "op": "c",
                "ns": f"{db}.$cmd",
                "ui": coll.ui,
                "o": {"createIndexes": coll.name, **spec},
            }
            self._log_ddl(entry, session, functools.partial(_drop_index, coll, spec["name"]))

    def _log_index_build(self, db: str, coll: Collection, added: list[dict[str, Any]]) -> None:
        """A two-phase build's startIndexBuild and commitIndexBuild entries."""
        build = {"indexBuildUUID": Binary(uuidlib.uuid4().bytes, 4), "indexes": added}
        for phase in ("startIndexBuild", "commitIndexBuild"):
            self.oplog.append(
                {"op": "c", "ns": f"{db}.$cmd", "ui": coll.ui, "o": {phase: coll.name, **build}}
            )

    async def cmd_drop_indexes(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['dropIndexes']}"
        coll = self.coll(ns)
        if coll is None:
            raise MongoError("NamespaceNotFound", f"ns not found {ns}")
        before = len(coll.indexes)
        for name in _index_names(coll, cmd.get("index")):
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
        changes = _coll_mod_changes(cmd)
        view = self._timeseries_view(db, cmd["collMod"])
        if view is not None and "timeseries" in changes:
            return self._modify_timeseries(db, view, coll, changes["timeseries"])
        if "viewOn" in coll.options:
            return self._modify_view(db, coll, changes)
        return self._modify_collection(db, coll, changes)

    def _timeseries_view(self, db: str, name: str) -> Collection | None:
        """The time-series collection (its view) named `name`, if it is one."""
        named = self.dbs.get(db, {}).get(name)
        return named if named is not None and "timeseries" in named.options else None

    def _modify_collection(
        self, db: str, coll: Collection, changes: dict[str, Any]
    ) -> dict[str, Any]:
        """collMod of a collection's options or one of its indexes; its entry's o2 holds what
        they were before."""
        old_options = dict(coll.options)
        _modify_options(coll, changes)
        o2: dict[str, Any] = {"collectionOptions_old": options_before_change(coll.ui, old_options)}
        if "index" in changes:
            o2["indexOptions_old"] = _modify_index(coll, changes["index"])
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


def _coll_mod_changes(cmd: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cmd.items() if k != "collMod" and k not in _GENERIC_ARGS}


def _check_indexes_in_transaction(
    session: dict[str, object] | None, db: str, coll: Collection, ns: str
) -> None:
    """Only a collection this transaction created may get indexes in it (create_indexes.cpp)."""
    txn = (session or {}).get("$txn")
    if txn is not None and not _created_in(txn, db, coll.name):
        raise MongoError(
            "OperationNotSupportedInTransaction",
            f"Cannot create new indexes on "
            f"existing collection {ns} in a multi-document transaction.",
        )
