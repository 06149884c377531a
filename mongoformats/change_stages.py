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
from mongoformats.mql import matches, unsupported_in_query

__all__ = ["SUPPORTED_STAGES", "apply_stages", "encode_in_order", "unsupported_in_stages"]

SUPPORTED_STAGES = frozenset({"$match", "$project", "$addFields", "$set", "$unset"})


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
            found = _unsupported_in_projection(dict.fromkeys(names, 0)) if ok else "an $unset without field names"
        else:
            found = _unsupported_in_projection(arg, computed_only=True)
        if found is not None:
            return found
    return None


def _is_flag(v: Any) -> bool:
    """A $project value that includes (true, a non-zero number) or excludes (false, 0) a field."""
    return isinstance(v, (bool, int, float))


def _is_nested_spec(v: Any) -> bool:
    """A document of fields, which $project and $addFields read as specs of the nested fields (not
    a literal); apply_stages leaves those to the server."""
    return isinstance(v, Mapping) and not any(str(k).startswith("$") for k in v)


def _unsupported_in_projection(spec: Any, *, computed_only: bool = False) -> str | None:
    """What of a $project spec (or, `computed_only`, an $addFields spec) apply_stages leaves to the server."""
    if not isinstance(spec, Mapping) or not spec:
        return "a stage spec that is not a non-empty document"
    try:
        leaves = _leaves(_projection_tree(spec, computed_only=computed_only))
    except ValueError as exc:
        return str(exc)
    flags = {rule == INCLUDE for name, rule in leaves if name != "_id" and rule in (INCLUDE, EXCLUDE)}
    computed = [rule[1] for _, rule in leaves if rule[0] == "compute"]
    if flags == {True, False} or (False in flags and computed):
        return "a $project that mixes inclusion and exclusion"
    return next(filter(None, map(_unsupported_in_expression, computed)), None)


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


def apply_stages(doc: dict[str, Any], stages: Iterable[Mapping[str, Any]], token: Mapping[str, Any]) -> Any:
    """`doc` through `stages`, or None if a `$match` drops it."""
    for stage in stages:
        (name, arg), = stage.items()
        if name == "$match":
            if not matches(doc, arg):
                return None
        elif name == "$project":
            doc = _project(doc, arg)
        elif name == "$unset":  # an exclusion $project
            doc = _exclude(doc, _projection_tree(dict.fromkeys([arg] if isinstance(arg, str) else arg, 0)))
        elif name in ("$addFields", "$set"):
            doc = _add_fields(doc, _projection_tree(arg, computed_only=True), doc)
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
    """Aggregation expressions the suite uses: "$field.path" references, `$literal`, arrays and
    documents of expressions, literals."""
    if isinstance(e, str) and e.startswith("$"):
        cur: Any = doc
        for part in e[1:].split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        return cur
    if isinstance(e, dict):
        if list(e) == ["$literal"]:
            return e["$literal"]
        return {k: _expr(doc, v) for k, v in e.items()}
    if isinstance(e, list):
        return [_expr(doc, v) for v in e]
    return e


# A $project spec as a tree: each field's rule is INCLUDE, EXCLUDE, ("compute", expression) or
# ("nested", subtree), the subtree of a dotted path or of a nested document of fields. Dotted
# paths and nested documents merge: {"a.b": 1, "a": {"c": 1}} is one subtree of a.
_Tree = dict[str, Any]
INCLUDE, EXCLUDE = ("include",), ("exclude",)


def _projection_tree(spec: Mapping[str, Any], *, computed_only: bool = False) -> _Tree:
    """The tree of `spec`; ValueError for what the server rejects (a `$` or empty field name, an
    empty nested document, two rules for one path) or apply_stages leaves to it. With
    `computed_only` ($addFields), true and numbers are values, not inclusions."""
    tree: _Tree = {}
    for key, v in spec.items():
        parts = key.split(".")
        if any(not part or part.startswith("$") for part in parts):
            raise ValueError(f"the $project field {key!r}")
        node = tree
        *parents, leaf = parts
        for name in parents:
            rule = node.setdefault(name, ("nested", {}))
            if rule[0] != "nested":
                raise ValueError(f"a $project path collision at {key!r}")
            node = rule[1]
        if _is_nested_spec(v):
            if not v:
                raise ValueError(f"an empty document for the $project field {key!r}")
            rule = node.setdefault(leaf, ("nested", {}))
            sub = _projection_tree(v, computed_only=computed_only)
            if rule[0] != "nested" or set(sub) & set(rule[1]):
                raise ValueError(f"a $project path collision at {key!r}")
            rule[1].update(sub)
        elif leaf in node:
            raise ValueError(f"a $project path collision at {key!r}")
        else:
            node[leaf] = (INCLUDE if v else EXCLUDE) if _is_flag(v) and not computed_only else ("compute", v)
    return tree


def _computes(tree: _Tree) -> bool:
    return any(rule[0] == "compute" or (rule[0] == "nested" and _computes(rule[1])) for rule in tree.values())


def _project(doc: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """$project, with the server's rules (its inclusion projection unit tests): included fields
    keep the input's order, `_id` included unless excluded; computed fields follow, in the spec's
    order; a path through an array applies to each element. Expressions read the whole event."""
    tree = _projection_tree(spec)
    if all(rule == EXCLUDE for name, rule in _leaves(tree) if name != "_id"):
        return _exclude(doc, tree)
    tree.setdefault("_id", INCLUDE)
    return _include(doc, tree, doc)


def _leaves(tree: _Tree, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for name, rule in tree.items():
        out += _leaves(rule[1], f"{prefix}{name}.") if rule[0] == "nested" else [(prefix + name, rule)]
    return out


def _include(doc: dict[str, Any], tree: _Tree, root: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in doc.items():
        rule = tree.get(name)
        if rule == INCLUDE:
            out[name] = value
        elif rule is not None and rule[0] == "nested" and (isinstance(value, (dict, list)) or _computes(rule[1])):
            out[name] = _include_value(value, rule[1], root)
    for name, rule in tree.items():
        if rule[0] == "compute":
            out[name] = _expr(root, rule[1])
        elif rule[0] == "nested" and name not in doc and _computes(rule[1]):
            out[name] = _include({}, rule[1], root)
    return out


def _include_value(value: Any, tree: _Tree, root: dict[str, Any]) -> Any:
    """A nested rule on one value: documents are projected, arrays element by element (dropping
    what is neither unless the rule computes a field, which makes it a document)."""
    if isinstance(value, list):
        return [_include_value(v, tree, root) for v in value if isinstance(v, (dict, list)) or _computes(tree)]
    return _include(value if isinstance(value, dict) else {}, tree, root)


def _add_fields(doc: dict[str, Any], tree: _Tree, root: dict[str, Any]) -> dict[str, Any]:
    """$addFields/$set, with the server's rules (its add-fields unit tests): a field set anew keeps
    its place, new ones follow in the spec's order; a nested rule keeps the sub-document's other
    fields, makes documents of scalars and applies to each element of an array."""
    out: dict[str, Any] = {}
    for name, value in doc.items():
        rule = tree.get(name)
        out[name] = value if rule is None else _expr(root, rule[1]) if rule[0] == "compute" else \
            _add_to_value(value, rule[1], root)
    for name, rule in tree.items():
        if name not in doc:
            out[name] = _expr(root, rule[1]) if rule[0] == "compute" else _add_fields({}, rule[1], root)
    return out


def _add_to_value(value: Any, tree: _Tree, root: dict[str, Any]) -> Any:
    if isinstance(value, list):
        return [_add_to_value(v, tree, root) for v in value]
    return _add_fields(value if isinstance(value, dict) else {}, tree, root)


def _exclude(value: Any, tree: _Tree) -> Any:
    if isinstance(value, list):
        return [_exclude(v, tree) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for name, v in value.items():
        rule = tree.get(name)
        if rule == EXCLUDE:
            continue
        out[name] = _exclude(v, rule[1]) if rule is not None and rule[0] == "nested" else v
    return out
