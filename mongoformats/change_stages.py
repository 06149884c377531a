"""The stages a change stream may carry after `$changeStream`, applied to one event (pure).

simcluster's native streams and the proxy's accelerated `watch()` both run them, so an
accelerated stream shapes events exactly as the native one does. Supported: `$match` (the query
operators of mql, `$expr` too), `$project`, `$addFields`/`$set`, `$unset`,
`$replaceRoot`/`$replaceWith`, with the aggregation expressions of the expressions module.
`unsupported_in_stages` names whatever else a pipeline uses, so a caller can leave such a pipeline
to a real server instead of answering it differently. Like the server, a stage that changes the
event's `_id` (its resume token) fails the stream with ChangeStreamFatalError (280).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import bson

from mongoformats.bson_order import MISSING
from mongoformats.codecs import PLAIN
from mongoformats.errors import MongoError
from mongoformats.expressions import VARIABLES, evaluate, unsupported_in_expression
from mongoformats.idl import type_name
from mongoformats.mql import matches, unsupported_in_query
from mongoformats.projection import Projection, computed_values, spec_problem

__all__ = [
    "SUPPORTED_STAGES",
    "Stages",
    "apply_stages",
    "compile_stages",
    "encode_in_order",
    "new_root_expression",
    "replaced_root",
    "shape_events",
    "unsupported_in_stages",
]

SUPPORTED_STAGES = frozenset(
    {"$match", "$project", "$addFields", "$set", "$unset", "$replaceRoot", "$replaceWith"}
)

# Stages ready to apply to many events: (name, the $match query, the parsed Projection, or the
# new root's expression).
Stages = tuple[tuple[str, Any], ...]


def compile_stages(stages: Iterable[Mapping[str, Any]]) -> Stages:
    """`stages` with each projection parsed once, for apply_stages (which runs per event)."""
    out = []
    for stage in stages:
        ((name, arg),) = stage.items()
        if name not in SUPPORTED_STAGES:
            raise MongoError(40324, f"Unrecognized pipeline stage name: '{name}'")
        if name in ("$replaceRoot", "$replaceWith"):
            out.append((name, new_root_expression(name, arg)))
        else:
            out.append((name, arg if name == "$match" else Projection(name, arg)))
    return tuple(out)


def new_root_expression(name: str, arg: Any) -> Any:
    """The expression of a $replaceRoot ({newRoot: <expression>}) or $replaceWith (<expression>)."""
    if name == "$replaceWith":
        return arg
    if not isinstance(arg, Mapping) or "newRoot" not in arg:
        raise MongoError(40231, "no newRoot specified for the $replaceRoot stage")
    return arg["newRoot"]


def replaced_root(name: str, root: Any) -> dict[str, Any]:
    """What a $replaceRoot or $replaceWith (`name`) whose expression evaluated to `root` makes the
    document: `root`, or the server's 40228 if it is not a document."""
    if not isinstance(root, dict):
        what = "'newRoot' expression" if name == "$replaceRoot" else "'replacement document'"
        raise MongoError(
            40228,
            f"{what} must evaluate to an object, but resulting value was: "
            f"{'MISSING' if root is MISSING else root}. Type of resulting value: "
            f"'{'missing' if root is MISSING else type_name(root)}'.",
        )
    return root


def unsupported_in_stages(stages: Iterable[Mapping[str, Any]]) -> str | None:
    """The first stage, operator or expression of `stages` that apply_stages does not evaluate as
    the server does (e.g. "$redact", "$mergeObjects", "a dotted $set field"); None when it
    evaluates them all.

    A new root must be known to be a document (an expression document, `$$ROOT`, or a field an
    earlier $replaceRoot of the pipeline set to one of those): otherwise a server fails the
    stream at the first event where it is not, in words (the event printed) not reproduced here.
    Debezium's pipeline is of that kind: {namespace: {$concat: ...}, event: "$$ROOT"}, a $match,
    then "$event" as the root again."""
    documents: set[str] = set()  # top-level fields known to hold documents (for a later new root)
    for stage in stages:
        if (problem := _stage_shape_problem(stage)) is not None:
            return problem
        ((name, arg),) = stage.items()
        if name in ("$replaceRoot", "$replaceWith"):
            found, documents = _unsupported_in_new_root(name, arg, documents)
        else:
            found = _STAGE_CHECKS.get(name, _unsupported_in_computed)(arg)
            if name != "$match":
                documents = set()  # a projection may have changed them
        if found is not None:
            return found
    return None


def _stage_shape_problem(stage: object) -> str | None:
    """A stage that is not {<a stage apply_stages evaluates>: <its spec>}: what it is instead."""
    if not isinstance(stage, Mapping) or len(stage) != 1:
        return "a stage that is not a document with one field"
    name = next(iter(stage))
    return None if name in SUPPORTED_STAGES else str(name)


def _unsupported_in_new_root(
    name: str, arg: object, documents: set[str]
) -> tuple[str | None, set[str]]:
    """What in a $replaceRoot or $replaceWith apply_stages does not evaluate as the server does,
    and the top-level fields known to hold documents after it (`documents`: those before it)."""
    if name == "$replaceRoot" and not (isinstance(arg, Mapping) and set(arg) == {"newRoot"}):
        return "a $replaceRoot spec other than {newRoot: <expression>}", documents
    root = new_root_expression(name, arg)
    found = unsupported_in_expression(root)
    if found is None and not _known_document(root, documents):
        return f"a {name} whose new root may not be a document", documents
    return found, _document_fields(root)


def _known_document(root: object, documents: set[str]) -> bool:
    """Whether a new root is a document: an expression that always is one, or a field path to a
    top-level field known to hold one."""
    return _is_document(root) or (isinstance(root, str) and root[1:] in documents)


def _document_fields(root: object) -> set[str]:
    """The top-level fields known to hold documents after a new root."""
    if not isinstance(root, Mapping):
        return set()
    return {k for k, v in root.items() if _is_document(v)}


def _unsupported_in_unset(arg: object) -> str | None:
    names = [arg] if isinstance(arg, str) else arg
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        return "an $unset without field names"
    return spec_problem(dict.fromkeys(names, 0))


def _unsupported_in_computed(arg: object) -> str | None:
    """$addFields and $set: a projection of computed fields only."""
    return _unsupported_in_projection(arg, computed_only=True)


def _is_document(e: object) -> bool:
    """Whether expression `e` always evaluates to a document: a document of expressions (not an
    operator), or the stage's input document."""
    return (isinstance(e, Mapping) and not any(str(k).startswith("$") for k in e)) or e in VARIABLES


def _unsupported_in_projection(spec: Any, *, computed_only: bool = False) -> str | None:
    if (problem := spec_problem(spec, computed_only=computed_only)) is not None:
        return problem
    computed = computed_values(spec, computed_only=computed_only)
    return next(filter(None, map(unsupported_in_expression, computed)), None)


# The checks of the stages that keep the document's shape or project it, by stage name;
# $addFields and $set: _unsupported_in_computed.
_STAGE_CHECKS: dict[str, Callable[[object], str | None]] = {
    "$match": unsupported_in_query,
    "$project": _unsupported_in_projection,
    "$unset": _unsupported_in_unset,
}


def encode_in_order(doc: Mapping[str, Any]) -> bytes:
    """`doc` as BSON in its own field order. (bson.encode moves a top-level `_id` first, which
    would move a transaction event's lsid and txnNumber after it.)"""
    wrapped = bson.encode({"": doc})
    return wrapped[6:-1]  # int32 length, type 0x03, empty name NUL, the document, NUL


def shape_events(
    raws: Sequence[bytes], tokens: Sequence[Mapping[str, Any]], stages: Stages
) -> list[bytes | None]:
    """Each event (its BSON and its token) through `stages`: the event's new BSON, or None where a
    $match dropped it. Whole batches at a time, so that a worker process can shape one."""
    out: list[bytes | None] = []
    for raw, token in zip(raws, tokens, strict=True):
        doc = apply_stages(bson.decode(raw, PLAIN), stages, token)
        out.append(None if doc is None else encode_in_order(doc))
    return out


def apply_stages(doc: dict[str, Any], stages: Stages, token: Mapping[str, Any]) -> Any:
    """`doc` through `stages` (compile_stages), or None if a `$match` drops it."""
    for name, arg in stages:
        doc = _apply_stage(doc, name, arg)
        if doc is None:
            return None
    _check_token_kept(doc, token)
    return doc


def _apply_stage(doc: dict[str, Any], name: str, arg: Any) -> Any:
    """`doc` through one compiled stage, or None if a `$match` drops it."""
    if name == "$match":
        return doc if matches(doc, arg) else None
    if name in ("$replaceRoot", "$replaceWith"):
        # unsupported_in_stages admits only roots that are documents: the check is for
        # simcluster's.
        return replaced_root(name, evaluate(doc, arg))
    return arg.apply(doc, evaluate)


def _check_token_kept(doc: dict[str, Any], token: Mapping[str, Any]) -> None:
    """The server's error for a pipeline that modified the event's `_id`; it compares tokens by
    _data only (ResumeToken::operator==)."""
    _id = doc.get("_id")
    if not isinstance(_id, dict) or _id.get("_data") != token["_data"]:
        raise MongoError(
            "ChangeStreamFatalError",
            "Encountered an event whose _id field, which contains the resume token, was modified "
            "by the pipeline. Modifying the _id field of an event makes it impossible to resume "
            "the stream from that point. Only transformations that retain the unmodified _id "
            "field are allowed.",
        )
