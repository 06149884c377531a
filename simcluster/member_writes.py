"""A shard member's CRUD writes: insert (also from the bytes the client sent), update,
delete, findAndModify, and the end of a transaction.
"""

from __future__ import annotations

import functools
import struct
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import bson
from bson import Int64, ObjectId, Timestamp
from bson.raw_bson import RawBSONDocument

from mongoformats.codecs import RAW
from mongoformats.errors import MongoError
from mongoformats.oplog_splice import leading_id
from simcluster import query as q
from simcluster.aggregate import run_pipeline
from simcluster.member_core import MemberCore, _logged_lsid
from simcluster.server import Request
from simcluster.storage import Collection, id_key
from simcluster.transactions import (
    txn_key,
)
from simcluster.updates import apply_update, pipeline_entry, replaced_by_pipeline, update_with_entry

_I32 = struct.Struct("<i")


class _SessionBytes(NamedTuple):
    """A retryable write's session fields as bytes, around each statement's stmtId."""

    lsid_id: bytes
    txn_number: int
    head: bytes  # lsid, txnNumber: before op
    tail: bytes  # prevOpTime: after wall


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


def _sent_id_key(bson_type: int, value: bytes, doc: dict[str, object]) -> bytes:
    """A string's or an ObjectId's id_key is its BSON bytes: made straight from the sent bytes."""
    if bson_type in (0x02, 0x07):
        return b"%b%c\x00%b\x00" % (_I32.pack(len(value) + 7), bson_type, value)
    return id_key(doc["_id"])


class SentInserts:
    """The inserts of one insert command on one node, outside a transaction, logged from the
    bytes the client sent: the same entries ShardNode.insert_one writes, with what every
    document shares (collection, entry head, session fields) worked out once per command."""

    def __init__(self, node: WriteCommands, ns: str, cmd: Any) -> None:
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
        coll = self._collection()
        if coll.name != self.ns.partition(".")[2]:
            return False  # a time-series collection: its writes go to its buckets (insert_one)
        t, value = ident
        key = _sent_id_key(t, value, doc)
        coll.check_unique(doc, self.ns, key=key)
        coll.put(doc, key=key)
        self._append(raw, self._o2(doc, raw, value), stmt_id)
        return True

    def _o2(self, doc: dict[str, object], raw: bytes, id_value: bytes) -> bytes:
        """The entry's o2, the document key: the shard key's fields, or the sent _id element."""
        if self.whole_key:
            return bson.encode(self.node.document_key(self.ns, doc))
        return b"%b%b\x00" % (_I32.pack(len(id_value) + 10), raw[4 : 9 + len(id_value)])

    def _collection(self) -> Collection:
        """The collection written to, made (and logged) by the command's first insert."""
        coll = self.coll
        if coll is None:
            coll = self.coll = self.node.coll(self.ns, create=True)
            assert coll is not None
            self.head = bson.encode({"op": "i", "ns": self.ns, "ui": coll.ui})[4:-1] + b"\x03o\x00"
        return coll

    def _append(self, raw: bytes, o2: bytes, stmt_id: int) -> None:
        """Log one insert's entry, with the command's session fields if it has them."""
        session = self.session
        if session is None:
            self.node.oplog.append_body(
                b"%b%b\x03o2\x00%b" % (self.head, raw, o2), wake=False, wall_ms=self.wall_ms
            )
            return
        self.node.oplog.append_body(
            b"%b%b\x03o2\x00%b\x10stmtId\x00%b" % (self.head, raw, o2, _I32.pack(stmt_id)),
            head=session.head,
            tail=session.tail,
            wake=False,
            wall_ms=self.wall_ms,
        )
        assert self.known is not None
        self.known.add(stmt_id)


# The stages an update pipeline may hold (the others fail as on a server).
_UPDATE_PIPELINE_STAGES = frozenset(
    {"$addFields", "$set", "$project", "$unset", "$replaceRoot", "$replaceWith"}
)


def _equalities(filt: dict[str, Any]) -> dict[str, Any]:
    """The fields an upsert's new document takes from its filter: its plain equalities."""
    return {k: v for k, v in filt.items() if not k.startswith("$") and not isinstance(v, dict)}


def _upsert_document(filt: dict[str, Any], upd: dict[str, Any], operators: bool) -> dict[str, Any]:
    """The document an upsert inserts: the update applied to the filter's equalities (or the
    replacement alone), with the filter's _id or a new one."""
    base = _equalities(filt)
    new = apply_update(base if operators else None, upd, is_insert=True)
    if "_id" not in new:
        new = {"_id": base.get("_id", ObjectId()), **new}
    return new


class WriteCommands(MemberCore):
    """The write commands of a member."""

    def sent_inserts(self, ns: str, cmd: Any) -> SentInserts:
        """The logger of one insert command's documents from their sent bytes
        (query.run_inserts)."""
        return SentInserts(self, ns, cmd)

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
        filt, upd = spec.get("q", {}), spec.get("u", {})
        multi = spec.get("multi", False)
        if isinstance(upd, list):
            return self._pipeline_update(ns, filt, upd, multi, session, bool(spec.get("upsert")))
        operators = bool(upd) and next(iter(upd)).startswith("$")
        _check_multi(multi, upd, operators)
        matched = self.select(ns, filt, limit=0 if multi else 1)
        filters = spec.get("arrayFilters")
        n_modified = self._update_matched(
            ns,
            matched,
            lambda old: update_with_entry(old, upd, array_filters=filters, query=filt),
            session,
        )
        if not matched and spec.get("upsert"):
            return self._upserted(ns, _upsert_document(filt, upd, operators), session)
        return {"n": len(matched), "nModified": n_modified}

    def _update_matched(
        self,
        ns: str,
        matched: list[dict[str, Any]],
        change: Callable[[dict[str, Any]], tuple[dict[str, Any], Any]],
        session: dict[str, Any],
    ) -> int:
        """Replace each matched document by its `change` (the new document, and the `o` the
        oplog entry logs, None when nothing changed); how many changed."""
        coll = self.coll(ns)
        n_modified = 0
        for old in matched:
            new, o = change(old)
            assert coll is not None
            coll.check_unique(new, ns, ignore=id_key(old["_id"]))
            if o is None:
                continue  # nothing changed: no oplog entry, not counted as modified
            coll.put(new, old)
            n_modified += 1
            entry = {"op": "u", "ns": ns, "ui": coll.ui, "o": o, "o2": self.document_key(ns, old)}
            self._log(entry, session, functools.partial(coll.put, old, new), (old, new), coll)
        return n_modified

    def _upserted(self, ns: str, new: dict[str, Any], session: dict[str, Any]) -> dict[str, Any]:
        self.insert_one(ns, new, session)
        return {"n": 1, "nModified": 0, "upserted": [{"index": 0, "_id": new["_id"]}]}

    def _pipeline_update(
        self,
        ns: str,
        filt: dict[str, Any],
        pipeline: list[Any],
        multi: bool,
        session: dict[str, Any],
        upsert: bool = False,
    ) -> dict[str, Any]:
        """An update given as an aggregation pipeline; logged as the server logs it: the $v:2
        diff of old -> new, or the whole new document when that diff is not smaller
        (updates.pipeline_entry)."""
        _check_update_pipeline(pipeline)

        def change(old: dict[str, Any]) -> tuple[dict[str, Any], Any]:
            new = replaced_by_pipeline(old, run_pipeline([dict(old)], pipeline)[0])
            return new, pipeline_entry(old, new)

        matched = self.select(ns, filt, limit=0 if multi else 1)
        n_modified = self._update_matched(ns, matched, change, session)
        if not matched and upsert:
            return self._upserted(ns, _pipeline_upsert_document(filt, pipeline), session)
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
        old = self._first_match(ns, cmd.get("query", {}), cmd.get("sort"))
        session = self._session_fields(cmd, 0)
        if cmd.get("remove"):
            return self._find_and_remove(ns, old, session)
        return self._find_and_update(ns, cmd, old, session)

    def _find_and_remove(
        self, ns: str, old: dict[str, object] | None, session: dict[str, object]
    ) -> dict[str, object]:
        if old is not None:
            self.delete_docs(ns, {"_id": old["_id"]}, 1, session)
        return {"lastErrorObject": {"n": 1 if old else 0}, "value": old}

    def _find_and_update(
        self,
        ns: str,
        cmd: dict[str, object],
        old: dict[str, object] | None,
        session: dict[str, object],
    ) -> dict[str, object]:
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
        leo: dict[str, Any] = {"n": r["n"], "updatedExisting": bool(old)}
        if r.get("upserted"):
            leo["upserted"] = r["upserted"][0]["_id"]
        if not cmd.get("new"):
            return {"lastErrorObject": leo, "value": old}
        return {"lastErrorObject": leo, "value": self._updated(ns, old, r)}

    def _updated(self, ns: str, old: dict[str, Any] | None, r: dict[str, Any]) -> Any:
        """The document as the update left it (findAndModify's `new: true`)."""
        target = old["_id"] if old else (r.get("upserted") or [{"_id": None}])[0]["_id"]
        coll = self.coll(ns)
        return coll.docs.get(id_key(target)) if coll else None

    def _first_match(self, ns: str, query: dict[str, Any], sort: Any) -> dict[str, Any] | None:
        """The document findAndModify acts on: the first match, in `sort` order if given."""
        coll = self.coll(ns)
        docs = [d for d in coll if q.matches(d, query)] if coll else []
        if sort:
            docs = q.sort_docs(docs, sort)
        return docs[0] if docs else None

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


def _check_multi(multi: bool, update: object, operators: bool) -> None:
    if multi and update and not operators:
        raise MongoError(
            "FailedToParse", "multi update is not supported for replacement-style update"
        )


def _check_update_pipeline(pipeline: list[Any]) -> None:
    """Only the stages an update pipeline allows."""
    for stage in pipeline:
        name = next(iter(stage), "")
        if name not in _UPDATE_PIPELINE_STAGES:
            raise MongoError("InvalidOptions", f"{name} is not allowed to be used within an update")


def _pipeline_upsert_document(filt: dict[str, Any], pipeline: list[Any]) -> dict[str, Any]:
    """As the server: the pipeline runs on a document made of the filter's equalities."""
    base = _equalities(filt)
    new = replaced_by_pipeline(base, run_pipeline([dict(base)], pipeline)[0])
    return new if "_id" in new else {"_id": ObjectId(), **new}
