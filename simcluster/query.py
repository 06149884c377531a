"""Query matching, projection, sorting and update operators over plain Python documents.

Strategy: documents are `dict`s decoded by pymongo's codec (so Int32 stays `int`, Int64 stays
`Int64`, doubles stay `float`: BSON types survive $inc like on the server). Updates return the new
document and the `$v: 2` diff the server would log for it (mongodb-formats.md C.3).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from bson import ObjectId, Regex

from mongoformats.bson_order import MISSING, compare, sort_key
from mongoformats.errors import MongoError
from mongoformats.mql import get_path, matches

__all__ = ["compare", "get_path", "matches", "pinned_ids", "sort_docs", "MISSING", "ObjectId"]


def pinned_ids(filt: Mapping[str, Any]) -> list[Any] | None:
    """The `_id` values a filter can only match (`{_id: v, ...}`, `{_id: {$in: [...]}, ...}`, an
    `$or` of such branches, or an `$and` with such a clause), or None when it may match others:
    those filters are answered from the `_id` index, as the server's planner answers them, instead
    of a collection scan (the engine's lookups send an `$or` of up to 500 document keys)."""
    if set(filt) == {"$or"} and isinstance(filt["$or"], list):
        return _pinned_by_every(filt["$or"])
    if isinstance(filt.get("$and"), list):
        ids = _pinned_by_any(filt["$and"])
        if ids is not None:
            return ids
    return _pinned_by_condition(filt["_id"]) if "_id" in filt else None


def _pinned_by_any(clauses: list[object]) -> list[object] | None:
    """The `_id` values of an `$and`: any clause that pins _id pins the whole conjunction."""
    for clause in clauses:
        if isinstance(clause, Mapping) and (ids := pinned_ids(clause)) is not None:
            return ids
    return None


def _pinned_by_every(branches: list[Any]) -> list[Any] | None:
    """The `_id` values of an `$or`: those of its branches, if each pins some."""
    out: list[Any] = []
    for branch in branches:
        ids = pinned_ids(branch) if isinstance(branch, Mapping) else None
        if ids is None:
            return None
        out += ids
    return out


def _pinned_by_condition(cond: Any) -> list[Any] | None:
    """The values an `_id` condition allows: a value, `$eq`, or an `$in` without regexes."""
    if not isinstance(cond, Mapping) or not any(str(k).startswith("$") for k in cond):
        return [cond]
    if set(cond) == {"$eq"}:
        return [cond["$eq"]]
    if set(cond) == {"$in"} and _is_plain_list(cond["$in"]):
        return list(cond["$in"])
    return None


def _is_plain_list(values: object) -> bool:
    """An `$in` list the `_id` index answers: one without regexes."""
    return isinstance(values, list) and not any(isinstance(v, (re.Pattern, Regex)) for v in values)


def sort_docs(docs: list[dict[str, Any]], spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`docs` in the order of `spec` ({field: 1 | -1}), values in BSON order (a missing field as
    null).
    One stable sort per field, the last field first: each value's key is built once."""
    out = list(docs)
    for field, direction in reversed(list(spec.items())):
        out.sort(key=functools.partial(_field_key, field), reverse=direction < 0)
    return out


def _field_key(field: str, doc: dict[str, Any]) -> bytes:
    return sort_key(next(iter(get_path(doc, field)), None))


def write_error(index: int, exc: MongoError) -> dict[str, Any]:
    """One entry of a write command's writeErrors, as the server reports it."""
    return {"index": index, "code": exc.code, "errmsg": exc.errmsg, **exc.extra}


def run_inserts(ns: str, cmd: Mapping[str, Any], node_for: Any) -> dict[str, Any]:
    """The insert command's loop, shared by mongod and mongos: `node_for(doc)` is the shard to
    write to."""
    run = _InsertRun(ns, cmd)
    errors = []
    n = 0
    for i, doc in enumerate(cmd.get("documents", [])):
        exc = run.statement(node_for(doc), i, doc)
        if exc is None:
            n += 1
            continue
        errors.append(write_error(i, exc))
        if cmd.get("ordered", True):
            break
    for node in run.batches:
        node.oplog.wake()  # once per command: tailers and secondaries read the whole batch
    return _with_errors({"n": n}, errors)


def _with_errors(out: dict[str, object], errors: list[dict[str, object]]) -> dict[str, object]:
    """A write command's reply, with its writeErrors when there are any."""
    if errors:
        out["writeErrors"] = errors
    return out


class _InsertRun:
    """The statements of one insert command."""

    def __init__(self, ns: str, cmd: Mapping[str, Any]) -> None:
        self.ns, self.cmd = ns, cmd
        self.raws = cmd.get("$raw_documents")
        # Outside a transaction, the documents' own bytes make the oplog entries
        # (member_writes.SentInserts).
        self.sent = self.raws is not None and cmd.get("autocommit") is not False
        self.batches: dict[Any, Any] = {}  # node -> its SentInserts

    def statement(self, node: Any, i: int, doc: dict[str, Any]) -> MongoError | None:
        """Insert document `i` on `node`; the write error it got, if any (an error of the
        session itself fails the whole command)."""
        if self.sent:
            try:
                if self._sent(node, i, doc):
                    return None
            except MongoError as exc:
                return exc
        return self._general(node, i, doc)

    def _general(self, node: Any, i: int, doc: dict[str, Any]) -> MongoError | None:
        """Insert document `i` as a document (with its session fields, in a transaction)."""
        session = node._session_fields(self.cmd, i)
        if node.applier.already_done(session):  # a retried statement the shard already has
            return None
        try:
            node.insert_one(self.ns, doc, session, raw=self.raws[i] if self.raws else None)
        except MongoError as exc:
            return exc
        return None

    def _sent(self, node: Any, i: int, doc: dict[str, Any]) -> bool:
        """Log document `i` from its sent bytes; False when it needs the general path."""
        batch = self.batches.get(node)
        if batch is None:
            batch = self.batches[node] = node.sent_inserts(self.ns, self.cmd)
        assert self.raws is not None
        return bool(batch.insert(doc, self.raws[i], i))


def distinct_values(docs: list[dict[str, Any]], key: str) -> list[Any]:
    values: list[Any] = []
    for d in docs:
        for v in get_path(d, key):
            _add_distinct(values, v if isinstance(v, list) else [v])
    return values


def _add_distinct(values: list[object], items: list[object]) -> None:
    """Append each item not equal (in BSON order) to one of `values` already."""
    for item in items:
        if all(compare(item, x) != 0 for x in values):
            values.append(item)


def run_updates(cmd: Mapping[str, Any], update_one: Any) -> dict[str, Any]:
    """The update command's loop, shared by mongod and mongos: `update_one(i, spec)` applies one
    statement and returns {n, nModified, upserted?: [{_id}]}."""
    n = n_mod = 0
    upserted: list[dict[str, Any]] = []
    errors = []
    for i, spec in enumerate(cmd.get("updates", [])):
        try:
            r = update_one(i, spec)
        except MongoError as exc:
            errors.append(write_error(i, exc))
            if cmd.get("ordered", True):
                break
            continue
        n += r["n"]
        n_mod += r["nModified"]
        upserted += [{"index": i, "_id": u["_id"]} for u in r.get("upserted", [])]
    out: dict[str, Any] = {"n": n, "nModified": n_mod}
    if upserted:
        out["upserted"] = upserted
    return _with_errors(out, errors)
