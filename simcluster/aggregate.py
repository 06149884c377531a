"""The aggregation stages simcluster supports: $match $project $addFields $group $sort $skip $limit
$count $unwind. Enough for drivers' helpers (count_documents, estimated counts) and simple reports."""

from __future__ import annotations

from typing import Any

from mongoformats.errors import MongoError
from simcluster import query as q


def _expr(doc: dict[str, Any], e: Any) -> Any:
    if isinstance(e, str) and e.startswith("$"):
        got = q.get_path(doc, e[1:])
        return got[0] if got else None
    if isinstance(e, dict) and len(e) == 1:
        (op, arg), = e.items()
        if op == "$literal":
            return arg
        if op in ("$add", "$multiply", "$subtract"):
            vals = [_expr(doc, a) for a in arg]
            if op == "$subtract":
                return vals[0] - vals[1]
            out = 0 if op == "$add" else 1
            for v in vals:
                out = out + v if op == "$add" else out * v
            return out
        if op == "$size":
            v = _expr(doc, arg)
            return len(v) if isinstance(v, list) else 0
    return e


def run_pipeline(docs: list[dict[str, Any]], pipeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for stage in pipeline:
        if len(stage) != 1:
            raise MongoError(40323, "A pipeline stage specification object must contain exactly one field.")
        (name, spec), = stage.items()
        if name == "$match":
            docs = [d for d in docs if q.matches(d, spec)]
        elif name == "$project":
            if any(isinstance(v, (dict, str)) for v in spec.values()):
                docs = [{"_id": d.get("_id"), **{k: _expr(d, v) for k, v in spec.items() if v not in (0, False)}}
                        if spec.get("_id", 1) else {k: _expr(d, v) for k, v in spec.items() if k != "_id"}
                        for d in docs]
            else:
                docs = [q.project(d, spec) for d in docs]
        elif name in ("$addFields", "$set"):
            docs = [{**d, **{k: _expr(d, v) for k, v in spec.items()}} for d in docs]
        elif name == "$sort":
            docs = q.sort_docs(docs, spec)
        elif name == "$skip":
            docs = docs[spec:]
        elif name == "$limit":
            docs = docs[:spec]
        elif name == "$count":
            docs = [{spec: len(docs)}] if docs else []
        elif name == "$unwind":
            path = (spec if isinstance(spec, str) else spec["path"])[1:]
            out = []
            for d in docs:
                vals = d.get(path)
                for v in vals if isinstance(vals, list) else ([] if vals is None else [vals]):
                    out.append({**d, path: v})
            docs = out
        elif name == "$group":
            docs = _group(docs, spec)
        else:
            raise MongoError(40324, f"Unrecognized pipeline stage name: '{name}'")
    return docs


def _group(docs: list[dict[str, Any]], spec: dict[str, Any]) -> list[dict[str, Any]]:
    groups: dict[bytes, dict[str, Any]] = {}
    import bson

    for d in docs:
        key = _expr(d, spec["_id"]) if not isinstance(spec["_id"], dict) else {
            k: _expr(d, v) for k, v in spec["_id"].items()}
        gk = bson.encode({"k": key})
        acc = groups.setdefault(gk, {"_id": key})
        for field, op_spec in spec.items():
            if field == "_id":
                continue
            (op, arg), = op_spec.items()
            v = _expr(d, arg)
            if op == "$sum":
                acc[field] = acc.get(field, 0) + (v if isinstance(v, (int, float)) else 0)
            elif op == "$avg":
                s, n = acc.get("__avg_" + field, (0, 0))
                acc["__avg_" + field] = (s + v, n + 1)
            elif op == "$min":
                acc[field] = v if field not in acc or q.compare(v, acc[field]) < 0 else acc[field]
            elif op == "$max":
                acc[field] = v if field not in acc or q.compare(v, acc[field]) > 0 else acc[field]
            elif op == "$first":
                acc.setdefault(field, v)
            elif op == "$last":
                acc[field] = v
            elif op == "$push":
                acc.setdefault(field, []).append(v)
            elif op == "$addToSet":
                lst = acc.setdefault(field, [])
                if all(q.compare(v, x) for x in lst):
                    lst.append(v)
            elif op == "$count":
                acc[field] = acc.get(field, 0) + 1
            else:
                raise MongoError(15952, f"unknown group operator '{op}'")
    out = []
    for acc in groups.values():
        for k in [k for k in acc if k.startswith("__avg_")]:
            s, n = acc.pop(k)
            acc[k[6:]] = s / n if n else None
        out.append(acc)
    return out
