"""Query matching, projection, sorting and update operators over plain Python documents.

Strategy: documents are `dict`s decoded by pymongo's codec (so Int32 stays `int`, Int64 stays
`Int64`, doubles stay `float`: BSON types survive $inc like on the server). Updates return the new
document and the `$v: 2` diff the server would log for it (mongodb-formats.md C.3).
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Mapping
from typing import Any

from bson import Int64, ObjectId, Regex

from mongoformats.errors import MongoError
from mongoformats.mql import _MISSING, _match_value, compare, get_path, matches, sort_key

__all__ = ["compare", "get_path", "matches", "pinned_ids", "project", "sort_docs", "apply_update", "compute_diff",
           "_MISSING", "ObjectId"]

def project(doc: dict[str, Any], projection: Mapping[str, Any] | None) -> dict[str, Any]:
    if not projection:
        return doc
    include = [k for k, v in projection.items() if v and k != "_id"]
    if include:
        out: dict[str, Any] = {}
        if projection.get("_id", 1) and "_id" in doc:
            out["_id"] = doc["_id"]
        for k in doc:
            if k in include:
                out[k] = doc[k]
        return out
    return {k: v for k, v in doc.items() if not (k in projection and not projection[k])}


def pinned_ids(filt: Mapping[str, Any]) -> list[Any] | None:
    """The `_id` values a filter can only match (`{_id: v, ...}`, `{_id: {$in: [...]}, ...}`, or an
    `$or` of such branches), or None when it may match others: those filters are answered from
    the `_id` index, as the server's planner answers them, instead of a collection scan (the
    engine's lookups send an `$or` of up to 500 document keys)."""
    if set(filt) == {"$or"} and isinstance(filt["$or"], list):
        out: list[Any] = []
        for branch in filt["$or"]:
            ids = pinned_ids(branch) if isinstance(branch, Mapping) else None
            if ids is None:
                return None
            out += ids
        return out
    if "_id" not in filt:
        return None
    cond = filt["_id"]
    if not isinstance(cond, Mapping) or not any(str(k).startswith("$") for k in cond):
        return [cond]
    if set(cond) == {"$eq"}:
        return [cond["$eq"]]
    if set(cond) == {"$in"} and isinstance(cond["$in"], list) and not any(
            isinstance(v, (re.Pattern, Regex)) for v in cond["$in"]):
        return list(cond["$in"])
    return None


def sort_docs(docs: list[dict[str, Any]], spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`docs` in the order of `spec` ({field: 1 | -1}), values in BSON order (a missing field as null).
    One stable sort per field, the last field first: each value's key is built once."""
    out = list(docs)
    for field, direction in reversed(list(spec.items())):
        out.sort(key=functools.partial(_field_key, field), reverse=direction < 0)
    return out


def _field_key(field: str, doc: dict[str, Any]) -> bytes:
    return sort_key(next(iter(get_path(doc, field)), None))


# ---------------------------------------------------------------------------------------------
# updates


def _walk(doc: dict[str, Any], path: str, create: bool) -> tuple[Any, str]:
    """(the element holding `path`'s last part, that part). With `create` the missing parents are
    made as the server makes them: documents, and an array index past the end pads the array with
    nulls. A scalar (or an array asked for a field name) in the way is PathNotViable (28) then;
    without `create` it means the path is missing: (None, last)."""
    parts = path.split(".")
    cur: Any = doc
    name = ""
    for part in parts[:-1]:
        if isinstance(cur, list) and part.isdigit():
            idx = int(part)
            if idx >= len(cur):
                if not create:
                    return None, parts[-1]
                cur.extend([None] * (idx - len(cur)))
                cur.append({})
            cur = cur[idx]
        elif isinstance(cur, dict):
            if part not in cur:
                if not create:
                    return None, parts[-1]
                cur[part] = {}
            cur = cur[part]
        elif create:
            raise _not_viable(part, name, cur)
        else:
            return None, parts[-1]
        name = part
    if create and not isinstance(cur, (dict, list)):
        raise _not_viable(parts[-1], name, cur)
    return cur, parts[-1]


def _not_viable(field: str, name: str, value: Any) -> MongoError:
    return MongoError(28, f"Cannot create field '{field}' in element {{{name}: {value!r}}}")


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    parent, last = _walk(doc, path, True)
    if isinstance(parent, list):
        if not last.isdigit():
            raise _not_viable(last, path.rpartition(".")[0].rpartition(".")[2], parent)
        idx = int(last)
        while len(parent) <= idx:
            parent.append(None)
        parent[idx] = value
    else:
        parent[last] = value


def _get(doc: dict[str, Any], path: str) -> Any:
    parent, last = _walk(doc, path, False)
    if isinstance(parent, dict):
        return parent.get(last, _MISSING)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    return _MISSING


def _unset(doc: dict[str, Any], path: str) -> None:
    parent, last = _walk(doc, path, False)
    if isinstance(parent, dict):
        parent.pop(last, None)
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        parent[int(last)] = None


def _arith(old: Any, operand: Any, op: str) -> Any:
    if old is _MISSING:
        old = 0 if op == "$inc" else type(operand)(0) if isinstance(operand, (int, float)) else 0
    if not isinstance(old, (int, float)) or isinstance(old, bool):
        raise MongoError("TypeMismatch", f"Cannot apply {op} to a value of non-numeric type")
    result = old + operand if op == "$inc" else old * operand
    # The server keeps the wider of the two types: Int32 + Int32 stays Int32 unless it overflows.
    if isinstance(old, float) or isinstance(operand, float):
        return float(result)
    if isinstance(old, Int64) or isinstance(operand, Int64) or not -(2**31) <= result < 2**31:
        return Int64(result)
    return int(result)


def apply_update(doc: dict[str, Any] | None, update: Mapping[str, Any], *, is_insert: bool = False,
                 array_filters: list[Any] | None = None) -> dict[str, Any]:
    """A new document: `update` applied to a deep copy of `doc` (None for an upsert's new doc)."""
    new = copy.deepcopy(doc) if doc is not None else {}
    if not update or not all(k.startswith("$") for k in update):
        # Replacement: keep _id first.
        out: dict[str, Any] = {}
        if doc is not None and "_id" in doc:
            out["_id"] = doc["_id"]
        for k, v in update.items():
            if k == "_id" and doc is not None and v != doc["_id"]:
                raise MongoError("ImmutableField", "After applying the update, the (immutable) field '_id' "
                                 "was found to have been altered")
            out[k] = v
        return out
    for op, fields in update.items():
        for path, value in fields.items():
            if op == "$set" or (op == "$setOnInsert" and is_insert):
                _set(new, path, copy.deepcopy(value))
            elif op == "$setOnInsert":
                continue
            elif op == "$unset":
                _unset(new, path)
            elif op in ("$inc", "$mul"):
                _set(new, path, _arith(_get(new, path), value, op))
            elif op in ("$min", "$max"):
                old = _get(new, path)
                if old is _MISSING or (compare(value, old) < 0) == (op == "$min") and compare(value, old) != 0:
                    _set(new, path, value)
            elif op == "$rename":
                old = _get(new, path)
                if old is not _MISSING:
                    _unset(new, path)
                    _set(new, value, old)
            elif op == "$currentDate":
                import datetime

                _set(new, path, datetime.datetime.now(datetime.UTC).replace(microsecond=0))
            elif op in ("$push", "$addToSet"):
                arr = _get(new, path)
                arr = [] if arr is _MISSING else list(arr)
                items = value["$each"] if isinstance(value, Mapping) and "$each" in value else [value]
                for item in items:
                    if op == "$push" or all(compare(item, a) != 0 for a in arr):
                        arr.append(copy.deepcopy(item))
                if isinstance(value, Mapping) and "$slice" in value:
                    n = value["$slice"]
                    arr = arr[:n] if n >= 0 else arr[n:]
                _set(new, path, arr)
            elif op == "$pop":
                arr = _get(new, path)
                if isinstance(arr, list) and arr:
                    _set(new, path, arr[1:] if value == -1 else arr[:-1])
            elif op in ("$pull", "$pullAll"):
                arr = _get(new, path)
                if isinstance(arr, list):
                    gone = value if op == "$pullAll" else [value]
                    keep = [a for a in arr if not any(
                        (matches(a, g) if isinstance(g, Mapping) and isinstance(a, Mapping) else
                         _match_value(g, [a], a, "")) for g in gone)]
                    _set(new, path, keep)
            else:
                raise MongoError("FailedToParse", f"Unknown modifier: {op}. Expected a valid update modifier or "
                                 "pipeline-style update specified as an array")
    if doc is not None and "_id" in doc and new.get("_id") != doc["_id"]:
        raise MongoError("ImmutableField", "Performing an update on the path '_id' would modify the immutable "
                         "field '_id'")
    return new


def compute_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The `$v: 2` object diff from `old` to `new`: sections d, u, i, then s<field> sub-diffs."""
    d = {k: False for k in old if k not in new}
    u: dict[str, Any] = {}
    i: dict[str, Any] = {}
    s: dict[str, Any] = {}
    for k, v in new.items():
        if k not in old:
            i[k] = v
            continue
        ov = old[k]
        if type(ov) is type(v) and ov == v:
            continue
        if isinstance(ov, dict) and isinstance(v, dict) and list(ov)[: len(v)] == [x for x in v if x in ov]:
            s["s" + k] = compute_diff(ov, v)
        elif isinstance(ov, list) and isinstance(v, list):
            s["s" + k] = _array_diff(ov, v)
        else:
            u[k] = v
    out: dict[str, Any] = {}
    if d:
        out["d"] = d
    if u:
        out["u"] = u
    if i:
        out["i"] = i
    out.update(s)
    return out


def _array_diff(old: list[Any], new: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"a": True}
    if len(new) < len(old):
        out["l"] = len(new)
    for idx, v in enumerate(new):
        if idx < len(old) and type(old[idx]) is type(v) and old[idx] == v:
            continue
        if idx < len(old) and isinstance(v, dict) and isinstance(old[idx], dict) and \
                list(old[idx])[: len(v)] == [x for x in v if x in old[idx]]:
            out[f"s{idx}"] = compute_diff(old[idx], v)  # a modified sub-document: a sub-diff
        elif idx < len(old) and isinstance(v, list) and isinstance(old[idx], list):
            out[f"s{idx}"] = _array_diff(old[idx], v)
        else:
            out[f"u{idx}"] = v
    return out


def write_error(index: int, exc: MongoError) -> dict[str, Any]:
    """One entry of a write command's writeErrors, as the server reports it."""
    return {"index": index, "code": exc.code, "errmsg": exc.errmsg, **exc.extra}


def run_inserts(ns: str, cmd: Mapping[str, Any], node_for: Any) -> dict[str, Any]:
    """The insert command's loop, shared by mongod and mongos: `node_for(doc)` is the shard to write to."""
    raws = cmd.get("$raw_documents")
    # Outside a transaction, the documents' own bytes make the oplog entries (ShardNode.insert_sent).
    sent = raws is not None and cmd.get("autocommit") is not False
    errors = []
    n = 0
    batches: dict[Any, Any] = {}  # node -> SentInserts
    for i, doc in enumerate(cmd.get("documents", [])):
        node = node_for(doc)
        if sent:
            assert raws is not None
            batch = batches.get(node)
            if batch is None:
                from simcluster.node import SentInserts

                batch = batches[node] = SentInserts(node, ns, cmd)
            try:
                done = batch.insert(doc, raws[i], i)
            except MongoError as exc:
                errors.append(write_error(i, exc))
                if cmd.get("ordered", True):
                    break
                continue
            if done:
                n += 1
                continue
        session = node._session_fields(cmd, i)
        if node.applier.already_done(session):  # a retried statement the shard already has: done
            n += 1
            continue
        try:
            node.insert_one(ns, doc, session, raw=raws[i] if raws else None)
            n += 1
        except MongoError as exc:
            errors.append(write_error(i, exc))
            if cmd.get("ordered", True):
                break
    for node in batches:
        node.oplog.wake()  # once per command: tailers and secondaries read the whole batch
    out: dict[str, Any] = {"n": n}
    if errors:
        out["writeErrors"] = errors
    return out


def distinct_values(docs: list[dict[str, Any]], key: str) -> list[Any]:
    values: list[Any] = []
    for d in docs:
        for v in get_path(d, key):
            for item in v if isinstance(v, list) else [v]:
                if all(compare(item, x) != 0 for x in values):
                    values.append(item)
    return values


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
    if errors:
        out["writeErrors"] = errors
    return out
