"""The stages a change stream may carry after `$changeStream`, applied to one event (pure).

simcluster's native streams and the proxy's accelerated `watch()` both run them, so an
accelerated stream shapes events exactly as the native one does. Supported: `$match`, `$project`,
`$addFields`/`$set`, `$unset`, with the aggregation expressions the drivers' suite uses (field
paths, nested documents, literals). Like the server, a stage that changes the event's `_id` (its
resume token) fails the stream with ChangeStreamFatalError (280).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import bson

from mongoformats.errors import MongoError
from mongoformats.mql import matches

__all__ = ["SUPPORTED_STAGES", "apply_stages", "encode_in_order"]

SUPPORTED_STAGES = frozenset({"$match", "$project", "$addFields", "$set", "$unset"})


def encode_in_order(doc: Mapping[str, Any]) -> bytes:
    """`doc` as BSON in its own field order. (bson.encode moves a top-level `_id` first, which
    would move a transaction event's lsid and txnNumber after it.)"""
    wrapped = bson.encode({"": doc})
    return wrapped[6:-1]  # int32 length, type 0x03, empty name NUL, the document, NUL


def apply_stages(doc: dict[str, Any], stages: Iterable[Mapping[str, Any]], token: Mapping[str, Any]) -> Any:
    """`doc` through `stages`, or None if a `$match` drops it."""
    for stage in stages:
        (name, arg), = stage.items()
        if name == "$match":
            if not matches(doc, arg):
                return None
        elif name == "$project":
            doc = _project(doc, arg)
        elif name == "$unset":
            names = [arg] if isinstance(arg, str) else arg
            doc = {k: v for k, v in doc.items() if k not in names}
        elif name in ("$addFields", "$set"):
            doc = {**doc, **{k: _expr(doc, v) for k, v in arg.items()}}
        else:
            raise MongoError(40324, f"Unrecognized pipeline stage name: '{name}'")
    # The server compares tokens by _data only (ResumeToken::operator==).
    _id = doc.get("_id")
    if not isinstance(_id, dict) or _id.get("_data") != token["_data"]:
        raise MongoError("ChangeStreamFatalError", "Encountered an event whose _id field, which contains the "
                         "resume token, was modified by the pipeline. Modifying the _id field of an event makes "
                         "it impossible to resume the stream from that point. Only transformations that retain "
                         "the unmodified _id field are allowed.")
    return doc


def _expr(doc: dict[str, Any], e: Any) -> Any:
    """Aggregation expressions the suite uses: "$field.path" references, nested documents, literals."""
    if isinstance(e, str) and e.startswith("$"):
        cur: Any = doc
        for part in e[1:].split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        return cur
    if isinstance(e, dict):
        return {k: _expr(doc, v) for k, v in e.items()}
    return e


def _project(doc: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    if all(v in (0, False) for v in spec.values()):
        return {k: v for k, v in doc.items() if k not in spec}
    out: dict[str, Any] = {}
    if spec.get("_id", 1) not in (0, False) and "_id" in doc:
        out["_id"] = doc["_id"]
    for k, v in spec.items():
        if k == "_id":
            continue
        if "." in k:  # a dotted key computes (or includes) a nested field
            head, rest = k.split(".", 1)
            found = doc.get(head)
            sub: dict[str, Any] = found if isinstance(found, dict) else {}
            nested = _project({**sub, "_id": None}, {"_id": 0, rest: v}) if v in (1, True) else \
                _set_path({}, rest, _expr(doc, v))
            out[head] = {**out.get(head, {}), **nested}
        elif v is True or (type(v) is int and v == 1):
            if k in doc:
                out[k] = doc[k]
        else:
            out[k] = _expr(doc, v)
    return out


def _set_path(target: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    head, _, rest = path.partition(".")
    target[head] = _set_path(target.get(head, {}), rest, value) if rest else value
    return target


