"""The stages a change stream may carry after `$changeStream`, applied to one event (pure).

simcluster's native streams and the proxy's accelerated `watch()` both run them, so an
accelerated stream shapes events exactly as the native one does. Supported: `$match` (the query
operators of mql), `$project`, `$addFields`/`$set`, `$unset`, with the aggregation expressions
the drivers' suite uses (field paths, literals, `$literal`, arrays and documents of those).
`unsupported_in_stages` names whatever else a pipeline uses, so a caller can leave such a pipeline
to a real server instead of answering it differently. Like the server, a stage that changes the
event's `_id` (its resume token) fails the stream with ChangeStreamFatalError (280).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import bson

from mongoformats.errors import MongoError
from mongoformats.mql import MISSING, matches, unsupported_in_query
from mongoformats.projection import Projection, computed_values, spec_problem

__all__ = ["SUPPORTED_STAGES", "Stages", "apply_stages", "compile_stages", "encode_in_order", "unsupported_in_stages"]

SUPPORTED_STAGES = frozenset({"$match", "$project", "$addFields", "$set", "$unset"})

# Stages ready to apply to many events: (name, the $match query or the parsed Projection).
Stages = tuple[tuple[str, Any], ...]


def compile_stages(stages: Iterable[Mapping[str, Any]]) -> Stages:
    """`stages` with each projection parsed once, for apply_stages (which runs per event)."""
    out = []
    for stage in stages:
        (name, arg), = stage.items()
        if name not in SUPPORTED_STAGES:
            raise MongoError(40324, f"Unrecognized pipeline stage name: '{name}'")
        out.append((name, arg if name == "$match" else Projection(name, arg)))
    return tuple(out)


def unsupported_in_stages(stages: Iterable[Mapping[str, Any]]) -> str | None:
    """The first stage, operator or expression of `stages` that apply_stages does not evaluate as
    the server does (e.g. "$replaceRoot", "$expr", "$concat", "a dotted $set field"); None when it
    evaluates them all."""
    for stage in stages:
        if not isinstance(stage, Mapping) or len(stage) != 1:
            return "a stage that is not a document with one field"
        (name, arg), = stage.items()
        if name not in SUPPORTED_STAGES:
            return str(name)
        if name == "$match":
            found = unsupported_in_query(arg)
        elif name == "$project":
            found = _unsupported_in_projection(arg)
        elif name == "$unset":
            names = [arg] if isinstance(arg, str) else arg
            ok = isinstance(names, list) and names and all(isinstance(n, str) for n in names)
            found = spec_problem(dict.fromkeys(names, 0)) if ok else "an $unset without field names"
        else:
            found = _unsupported_in_projection(arg, computed_only=True)
        if found is not None:
            return found
    return None


def _unsupported_in_projection(spec: Any, *, computed_only: bool = False) -> str | None:
    if (problem := spec_problem(spec, computed_only=computed_only)) is not None:
        return problem
    return next(filter(None, map(_unsupported_in_expression, computed_values(spec, computed_only=computed_only))),
                None)


def _unsupported_in_expression(e: Any) -> str | None:
    if isinstance(e, str):
        return e if e.startswith("$$") else None  # variables ($$ROOT, $$REMOVE, ...)
    if isinstance(e, list):
        return next(filter(None, map(_unsupported_in_expression, e)), None)
    if isinstance(e, Mapping):
        if any(str(k).startswith("$") for k in e):
            return None if list(e) == ["$literal"] else str(next(iter(e)))
        return next(filter(None, map(_unsupported_in_expression, e.values())), None)
    return None


def encode_in_order(doc: Mapping[str, Any]) -> bytes:
    """`doc` as BSON in its own field order. (bson.encode moves a top-level `_id` first, which
    would move a transaction event's lsid and txnNumber after it.)"""
    wrapped = bson.encode({"": doc})
    return wrapped[6:-1]  # int32 length, type 0x03, empty name NUL, the document, NUL


def apply_stages(doc: dict[str, Any], stages: Stages, token: Mapping[str, Any]) -> Any:
    """`doc` through `stages` (compile_stages), or None if a `$match` drops it."""
    for name, arg in stages:
        if name == "$match":
            if not matches(doc, arg):
                return None
        else:
            doc = arg.apply(doc, _expr)
    # The server compares tokens by _data only (ResumeToken::operator==).
    _id = doc.get("_id")
    if not isinstance(_id, dict) or _id.get("_data") != token["_data"]:
        raise MongoError("ChangeStreamFatalError", "Encountered an event whose _id field, which contains the "
                         "resume token, was modified by the pipeline. Modifying the _id field of an event makes "
                         "it impossible to resume the stream from that point. Only transformations that retain "
                         "the unmodified _id field are allowed.")
    return doc


def _expr(doc: dict[str, Any], e: Any) -> Any:
    """Aggregation expressions the suite uses: "$field.path" references, `$literal`, arrays and
    documents of expressions, literals. A path that finds nothing is MISSING (the field is left
    out); inside an array it is null, inside a document left out, as on the server."""
    if isinstance(e, str) and e.startswith("$"):
        return _path(doc, e[1:].split("."))
    if isinstance(e, dict):
        if list(e) == ["$literal"]:
            return e["$literal"]
        return {k: v for k, x in e.items() if (v := _expr(doc, x)) is not MISSING}
    if isinstance(e, list):
        return [None if (v := _expr(doc, x)) is MISSING else v for x in e]
    return e


def _path(value: Any, parts: list[str]) -> Any:
    """A field path's value: through an array, the values found in its documents and arrays."""
    if not parts:
        return value
    if isinstance(value, dict):
        return _path(value[parts[0]], parts[1:]) if parts[0] in value else MISSING
    if isinstance(value, list):
        return [v for item in value if isinstance(item, (dict, list)) and (v := _path(item, parts)) is not MISSING]
    return MISSING
