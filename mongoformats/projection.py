"""Aggregation projections over decoded documents (pure): `$project`, `$addFields`/`$set`,
`$unset`, with the server's rules for field order, dotted paths, nested documents and arrays.

Shared by the change-stream stages the engine applies (change_stages) and simcluster's
aggregate stages; each brings its own expression evaluator (`evaluate(root, expression)`),
whose MISSING result ($$REMOVE, a missing path) leaves the field out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mongoformats.bson_order import MISSING

__all__ = ["Evaluate", "Projection", "computed_values", "spec_problem"]

Evaluate = Callable[[dict[str, Any], Any], Any]


class Projection:
    """A $project, $addFields/$set or $unset spec, parsed once into a tree of rules and applied to
    many documents. Why once: parsing a spec costs about as much as applying it, and a stream
    applies one spec to every event.

    $project follows the server's rules (its inclusion projection unit tests): included fields
    keep the input's order, `_id` included unless excluded; computed fields follow, in the spec's
    order; a path through an array applies to each element. $unset is an exclusion $project of
    its paths. Expressions read the whole document.
    """

    __slots__ = ("_tree", "_mode")

    def __init__(self, stage: str, spec: Any) -> None:
        if stage == "$unset":
            spec = dict.fromkeys([spec] if isinstance(spec, str) else spec, 0)
        computed_only = stage in ("$addFields", "$set")
        self._tree = _projection_tree(spec, computed_only=computed_only)
        self._mode = "add" if computed_only else _project_mode(self._tree)
        if self._mode == "include":
            self._tree.setdefault("_id", INCLUDE)

    def apply(self, doc: dict[str, Any], evaluate: Evaluate) -> dict[str, Any]:
        if self._mode == "exclude":
            return _exclude(doc, self._tree)
        if self._mode == "add":
            return _add_fields(doc, self._tree, doc, evaluate)
        return _include(doc, self._tree, doc, evaluate)


def _project_mode(tree: _Tree) -> str:
    """Whether a $project excludes or includes: {_id: 0} alone excludes, {_id: 1} alone includes
    only _id; otherwise the other fields say."""
    others = [rule for name, rule in _leaves(tree) if name != "_id"]
    excludes = all(rule == EXCLUDE for rule in others) if others else tree.get("_id") == EXCLUDE
    return "exclude" if excludes else "include"


def spec_problem(spec: object, *, computed_only: bool = False) -> str | None:
    """What makes a $project spec (or, `computed_only`, an $addFields spec) one these functions
    do not apply as the server does (most are specs the server rejects); None if nothing."""
    if not isinstance(spec, Mapping) or not spec:
        return "a stage spec that is not a non-empty document"
    try:
        leaves = _leaves(_projection_tree(spec, computed_only=computed_only))
    except ValueError as exc:
        return str(exc)
    return "a $project that mixes inclusion and exclusion" if _mixes(leaves) else None


def _mixes(leaves: list[tuple[str, Any]]) -> bool:
    """Whether a spec both excludes fields (but _id) and includes or computes others."""
    flags = _inclusion_flags(leaves)
    computes = any(rule[0] == "compute" for _, rule in leaves)
    return flags == {True, False} or (False in flags and computes)


def _inclusion_flags(leaves: list[tuple[str, Any]]) -> set[bool]:
    """Whether a spec includes (True) or excludes (False) fields but _id: both, one, none."""
    return {
        rule == INCLUDE for name, rule in leaves if name != "_id" and rule in (INCLUDE, EXCLUDE)
    }


def computed_values(spec: Mapping[str, Any], *, computed_only: bool = False) -> list[Any]:
    """The expressions of a valid spec's computed fields."""
    return [
        rule[1]
        for _, rule in _leaves(_projection_tree(spec, computed_only=computed_only))
        if rule[0] == "compute"
    ]


def _is_flag(v: object) -> bool:
    """A $project value that includes (true, a non-zero number) or excludes (false, 0) a field."""
    return isinstance(v, (bool, int, float))


def _is_nested_spec(v: object) -> bool:
    """A document of fields, which $project and $addFields read as specs of the nested fields, not
    as a literal document."""
    return isinstance(v, Mapping) and not any(str(k).startswith("$") for k in v)


# A $project spec as a tree: each field's rule is INCLUDE, EXCLUDE, ("compute", expression) or
# ("nested", subtree), the subtree of a dotted path or of a nested document of fields. Dotted
# paths and nested documents merge: {"a.b": 1, "a": {"c": 1}} is one subtree of a.
_Tree = dict[str, Any]
INCLUDE, EXCLUDE = ("include",), ("exclude",)


def _projection_tree(spec: Mapping[str, Any], *, computed_only: bool = False) -> _Tree:
    """The tree of `spec`; ValueError for what the server rejects (a `$` or empty field name, an
    empty nested document, two rules for one path). With `computed_only` ($addFields), true and
    numbers are values, not inclusions."""
    tree: _Tree = {}
    for key, v in spec.items():
        *parents, leaf = _field_path(key)
        node = _parent_node(tree, parents, key)
        if _is_nested_spec(v):
            _merge_nested(node, leaf, v, key, computed_only)
        else:
            _add_leaf(node, leaf, v, key, computed_only)
    return tree


def _add_leaf(node: _Tree, leaf: str, v: object, key: str, computed_only: bool) -> None:
    """Give the field `leaf` of `node` (spec field `key`) its rule; ValueError if it has one."""
    if leaf in node:
        raise ValueError(f"a path collision at {key!r}")
    flag = _is_flag(v) and not computed_only
    node[leaf] = (INCLUDE if v else EXCLUDE) if flag else ("compute", v)


def _field_path(key: str) -> list[str]:
    """A spec's field name as its path components; ValueError for an empty or `$` one."""
    parts = key.split(".")
    if any(not part or part.startswith("$") for part in parts):
        raise ValueError(f"the field name {key!r}")
    return parts


def _parent_node(tree: _Tree, parents: list[str], key: str) -> _Tree:
    """The subtree a dotted path's leaf goes in, made as needed."""
    node = tree
    for name in parents:
        rule = node.setdefault(name, ("nested", {}))
        if rule[0] != "nested":
            raise ValueError(f"a path collision at {key!r}")
        node = rule[1]
    return node


def _merge_nested(
    node: _Tree, leaf: str, v: Mapping[str, Any], key: str, computed_only: bool
) -> None:
    """A nested document of fields, merged into the leaf's subtree (dotted paths may have made
    it already)."""
    if not v:
        raise ValueError(f"an empty document for the field {key!r}")
    rule = node.setdefault(leaf, ("nested", {}))
    sub = _projection_tree(v, computed_only=computed_only)
    if rule[0] != "nested" or set(sub) & set(rule[1]):
        raise ValueError(f"a path collision at {key!r}")
    rule[1].update(sub)


def _computes(tree: _Tree) -> bool:
    return any(
        rule[0] == "compute" or (rule[0] == "nested" and _computes(rule[1]))
        for rule in tree.values()
    )


def _leaves(tree: _Tree, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for name, rule in tree.items():
        nested = rule[0] == "nested"
        out += _leaves(rule[1], f"{prefix}{name}.") if nested else [(prefix + name, rule)]
    return out


def _include(
    doc: dict[str, Any], tree: _Tree, root: dict[str, Any], evaluate: Evaluate
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in doc.items():
        rule = tree.get(name)
        if rule == INCLUDE:
            out[name] = value
        elif rule is not None and _projects_into(rule, value):
            out[name] = _include_value(value, rule[1], root, evaluate)
    _add_computed(out, doc, tree, root, evaluate)
    return out


def _add_computed(
    out: dict[str, Any], doc: dict[str, Any], tree: _Tree, root: dict[str, Any], evaluate: Evaluate
) -> None:
    """An inclusion's computed fields, after the included ones, in the spec's order; a nested
    rule that computes makes a document where `doc` has no such field."""
    for name, rule in tree.items():
        if rule[0] == "compute":
            _put(out, name, evaluate(root, rule[1]))
        elif rule[0] == "nested" and name not in doc and _computes(rule[1]):
            out[name] = _include({}, rule[1], root, evaluate)


def _projects_into(rule: Any, value: Any) -> bool:
    """Whether a nested rule gives a field's value: a document or array, or any value when the
    rule computes a field (which makes it a document)."""
    if rule[0] != "nested":
        return False
    return isinstance(value, (dict, list)) or _computes(rule[1])


def _include_value(value: Any, tree: _Tree, root: dict[str, Any], evaluate: Evaluate) -> Any:
    """A nested rule on one value: documents are projected, arrays element by element (dropping
    what is neither unless the rule computes a field, which makes it a document)."""
    if isinstance(value, list):
        return [
            _include_value(v, tree, root, evaluate)
            for v in value
            if isinstance(v, (dict, list)) or _computes(tree)
        ]
    return _include(value if isinstance(value, dict) else {}, tree, root, evaluate)


def _add_fields(
    doc: dict[str, Any], tree: _Tree, root: dict[str, Any], evaluate: Evaluate
) -> dict[str, Any]:
    """$addFields/$set, with the server's rules (its add-fields unit tests): a field set anew keeps
    its place, new ones follow in the spec's order; a nested rule keeps the sub-document's other
    fields, makes documents of scalars and applies to each element of an array."""
    out: dict[str, Any] = {}
    for name, value in doc.items():
        rule = tree.get(name)
        if rule is None:
            out[name] = value
        else:
            _add_field(out, name, value, rule, root, evaluate)
    for name, rule in tree.items():
        if name not in doc:
            _add_field(out, name, {}, rule, root, evaluate)
    return out


def _add_field(
    out: dict[str, Any],
    name: str,
    value: Any,
    rule: Any,
    root: dict[str, Any],
    evaluate: Evaluate,
) -> None:
    """Set `name` by its rule: computed, or the nested rules applied to its value."""
    if rule[0] == "compute":
        _put(out, name, evaluate(root, rule[1]))
    else:
        out[name] = _add_to_value(value, rule[1], root, evaluate)


def _add_to_value(value: Any, tree: _Tree, root: dict[str, Any], evaluate: Evaluate) -> Any:
    if isinstance(value, list):
        return [_add_to_value(v, tree, root, evaluate) for v in value]
    return _add_fields(value if isinstance(value, dict) else {}, tree, root, evaluate)


def _put(out: dict[str, object], name: str, value: object) -> None:
    if value is not MISSING:
        out[name] = value


def _exclude(value: Any, tree: _Tree) -> Any:
    if isinstance(value, list):
        return [_exclude(v, tree) for v in value]
    if not isinstance(value, dict):
        return value
    return {
        name: _exclude_in(v, tree.get(name))
        for name, v in value.items()
        if tree.get(name) != EXCLUDE
    }


def _exclude_in(value: Any, rule: Any) -> Any:
    """A kept field's value: its nested rules applied, if it has any."""
    return _exclude(value, rule[1]) if rule is not None and rule[0] == "nested" else value
