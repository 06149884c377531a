"""The aggregation stages simcluster supports: $match $project $addFields/$set $unset $replaceRoot
$replaceWith $group $sort $skip $limit $count $unwind. Enough for drivers' helpers (count_documents,
estimated counts), simple reports and pipeline-style updates."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping
from typing import Any

import bson

from mongoformats.bson_order import MISSING
from mongoformats.change_stages import new_root_expression, replaced_root
from mongoformats.errors import MongoError
from mongoformats.expressions import Operator, Operators, evaluate
from mongoformats.idl import type_name
from mongoformats.projection import Projection, spec_problem
from simcluster import query as q


# simcluster's operators beyond the shared ones (mongoformats/expressions.py), for its own
# aggregate stages: looser than a server's (no type checks, no numeric promotion rules), and for
# that reason not among the operators an accelerated watch() may use.
def _arithmetic(doc: Mapping[str, Any], args: list[Any], more: Operators | None, op: str) -> Any:
    values = [_value(evaluate(doc, a, more)) for a in args]
    if op == "$subtract":
        return values[0] - values[1]
    combine, start = _FOLDS[op]
    return functools.reduce(combine, values, start)


# $add and $multiply: the operation that folds the values, and the value of no values.
_FOLDS: dict[str, tuple[Callable[[Any, Any], Any], int]] = {
    "$add": (operator.add, 0),
    "$multiply": (operator.mul, 1),
}


def _size(doc: Mapping[str, Any], args: list[Any], more: Operators | None) -> Any:
    v = evaluate(doc, args[0], more)
    return len(v) if isinstance(v, list) else 0


def _merge_objects(doc: Mapping[str, Any], args: list[Any], more: Operators | None) -> Any:
    merged: dict[str, Any] = {}
    for part in args:
        v = _value(evaluate(doc, part, more))
        if v is not None:
            merged.update(v)
    return merged


# The codes of a bad `field` (a field path, a non-constant, not a string) of each operator.
_FIELD_NAME_CODES = {
    "$getField": (5654600, 5654601, 5654602),
    "$setField": (4161108, 4161106, 4161107),
}


def _field_name(spec: Any, op: str) -> str:
    """$getField/$setField/$unsetField's `field`: a constant string, given plainly or as a
    $literal (the only way to name a field starting with $). As ExpressionGetField/SetField::parse
    (src/mongo/db/pipeline/expression.cpp) refuse anything else; $unsetField reports as
    $setField."""
    name = "$getField" if op == "$getField" else "$setField"
    path_code, constant_code, string_code = _FIELD_NAME_CODES[name]
    if isinstance(spec, str) and spec.startswith("$"):
        _refuse_field_path(spec, path_code)
    if isinstance(spec, Mapping):
        spec = _literal(spec, name, constant_code)
    if not isinstance(spec, str):
        raise MongoError(
            string_code,
            f"{name} requires 'field' to evaluate to type String, but got {type_name(spec)}",
        )
    return spec


def _refuse_field_path(spec: str, code: int) -> None:
    ref = f"${spec[2:]}" if spec.startswith("$$") else f"$CURRENT.{spec[1:]}"
    raise MongoError(
        code,
        f"'{ref}' is a field path reference which "
        f"is not allowed in this context. Did you mean {{$literal: '{ref}'}}?",
    )


def _literal(spec: Mapping[str, object], name: str, code: int) -> object:
    """The constant of a `field` given as an object: only {$literal: ...} is one."""
    if set(spec) != {"$literal"}:
        raise MongoError(
            code,
            f"{name} requires 'field' to evaluate to a constant, but got a non-constant argument",
        )
    return spec["$literal"]


def _field(doc: Mapping[str, Any], args: list[Any], more: Operators | None, op: str) -> Any:
    spec = args[0] if isinstance(args[0], dict) and "field" in args[0] else {"field": args[0]}
    field = _field_name(spec["field"], op)
    source = evaluate(doc, spec.get("input", "$$CURRENT"), more)
    if op == "$getField":
        return source.get(field, MISSING) if isinstance(source, Mapping) else MISSING
    if _nullish(source):
        return None
    if not isinstance(source, Mapping):  # $unsetField is $setField's sugar, named so here too
        raise MongoError(4161105, "$setField requires 'input' to evaluate to type Object")
    value = evaluate(doc, spec["value"], more) if op == "$setField" else MISSING
    return _with_field(source, field, value)


def _with_field(source: Mapping[str, object], field: str, value: object) -> dict[str, object]:
    """A copy of `source` with `field` set to `value`, or without it when `value` is missing."""
    fields = dict(source)
    if value is MISSING:
        fields.pop(field, None)
    else:
        fields[field] = value
    return fields


# The array operators an update pipeline uses to rebuild an array, as the server evaluates them
# (ExpressionConcatArrays, ExpressionArrayElemAt, ExpressionSlice in expression.cpp): null when
# an argument is null or missing, the server's codes for arguments of the wrong type.
def _nullish(*values: Any) -> bool:
    """Whether any of the values is null or missing (which makes these operators' result
    null)."""
    return any(v is None or v is MISSING for v in values)


def _int_argument(value: Any, code: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise MongoError(
            code,
            f"{what} must be a numeric value representable as a 32-bit integral "
            f"value, but is {type_name(value)}",
        )
    return int(value)


def _concat_arrays(doc: Mapping[str, Any], args: list[Any], more: Operators | None) -> Any:
    out: list[Any] = []
    for arg in args:
        value = evaluate(doc, arg, more)
        if _nullish(value):
            return None
        if not isinstance(value, list):
            raise MongoError(28664, f"$concatArrays only supports arrays, not {type_name(value)}")
        out.extend(value)
    return out


def _array_elem_at(doc: Mapping[str, Any], args: list[Any], more: Operators | None) -> Any:
    array, index = (evaluate(doc, a, more) for a in args)
    if _nullish(array, index):
        return None
    if not isinstance(array, list):
        raise MongoError(
            28689, f"$arrayElemAt's first argument must be an array, but is {type_name(array)}"
        )
    i = _int_argument(index, 28690, "$arrayElemAt's second argument")
    i = i + len(array) if i < 0 else i
    return array[i] if 0 <= i < len(array) else MISSING


def _slice(doc: Mapping[str, Any], args: list[Any], more: Operators | None) -> Any:
    values = [evaluate(doc, a, more) for a in args]
    if _nullish(*values):
        return None
    array = values[0]
    if not isinstance(array, list):
        raise MongoError(
            28724, f"First argument to $slice must be an array, but is of type: {type_name(array)}"
        )
    if len(values) == 2:
        return _slice_count(array, _int_argument(values[1], 28725, "Second argument to $slice"))
    return _slice_range(array, values[1], values[2])


def _slice_count(array: list[object], n: int) -> list[object]:
    """$slice [array, n]: the first n elements, or the last -n."""
    return array[:n] if n >= 0 else array[max(len(array) + n, 0) :]


def _slice_range(array: list[object], position: object, count: object) -> list[object]:
    """$slice [array, position, n]: n elements from position (counted from the end when
    negative)."""
    pos = _int_argument(position, 28725, "Second argument to $slice")
    n = _int_argument(count, 28726, "Third argument to $slice")
    if n <= 0:
        raise MongoError(28727, f"Third argument to $slice must be positive: {n}")
    start = max(len(array) + pos, 0) if pos < 0 else min(pos, len(array))
    return array[start : start + n]


_OPERATORS: dict[str, Operator] = {
    **{op: functools.partial(_arithmetic, op=op) for op in ("$add", "$multiply", "$subtract")},
    **{op: functools.partial(_field, op=op) for op in ("$getField", "$setField", "$unsetField")},
    "$size": _size,
    "$mergeObjects": _merge_objects,
    "$concatArrays": _concat_arrays,
    "$arrayElemAt": _array_elem_at,
    "$slice": _slice,
}


def _expr(doc: Mapping[str, Any], e: Any) -> Any:
    """An aggregation expression's value in `doc`: the shared operators and simcluster's own."""
    return evaluate(doc, e, _OPERATORS)


def _value(v: Any) -> Any:
    """A missing value where a value is needed: null."""
    return None if v is MISSING else v


def run_pipeline(
    docs: list[dict[str, Any]], pipeline: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    for stage in pipeline:
        if len(stage) != 1:
            raise MongoError(
                40323, "A pipeline stage specification object must contain exactly one field."
            )
        ((name, spec),) = stage.items()
        run = _STAGES.get(name)
        if run is None:
            raise MongoError(40324, f"Unrecognized pipeline stage name: '{name}'")
        docs = run(docs, name, spec)
    return docs


_Docs = list[dict[str, Any]]


def _match(docs: _Docs, name: str, spec: Any) -> _Docs:
    return [d for d in docs if q.matches(d, spec)]


def _project(docs: _Docs, name: str, spec: Any) -> _Docs:
    return list(map(_compiled(name, spec), docs))


def _replace_root(docs: _Docs, name: str, spec: Any) -> _Docs:
    expression = new_root_expression(name, spec)
    return [replaced_root(name, _expr(d, expression)) for d in docs]


def _unwind(docs: _Docs, name: str, spec: Any) -> _Docs:
    path = (spec if isinstance(spec, str) else spec["path"])[1:]
    return [{**d, path: v} for d in docs for v in _unwound(d.get(path))]


def _unwound(value: object) -> list[object]:
    """The values $unwind makes one document each of: an array's elements, nothing for null."""
    if isinstance(value, list):
        return value
    return [] if value is None else [value]


# Each stage the simulator runs: (documents in, stage name, its argument) -> documents out.
_STAGES: dict[str, Callable[[_Docs, str, Any], _Docs]] = {
    "$match": _match,
    "$project": _project,
    "$addFields": _project,
    "$set": _project,
    "$unset": _project,
    "$replaceRoot": _replace_root,
    "$replaceWith": _replace_root,
    "$sort": lambda docs, name, spec: q.sort_docs(docs, spec),
    "$skip": lambda docs, name, spec: docs[spec:],
    "$limit": lambda docs, name, spec: docs[:spec],
    "$count": lambda docs, name, spec: [{spec: len(docs)}] if docs else [],
    "$unwind": _unwind,
    "$group": lambda docs, name, spec: _group(docs, spec),
}


def _compiled(stage: str, spec: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """$project, $addFields/$set, $unset: the server's rules, shared with the engine's stages."""
    if (
        stage != "$unset"
        and (problem := spec_problem(spec, computed_only=stage != "$project")) is not None
    ):
        raise MongoError("NotImplemented", f"simcluster does not evaluate {problem}")
    projection = Projection(stage, spec)
    return lambda doc: projection.apply(doc, _expr)


def find_projection(spec: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A find's projection: since 4.4 the rules and expressions of $project. The find-only forms
    ($slice, $elemMatch, a positional `a.$`) are not simulated, and are refused rather than read
    as something else."""
    if not spec:
        return lambda doc: doc
    for name, value in spec.items():
        _refuse_find_only(name, value)
    return _compiled("$project", spec)


def _refuse_find_only(name: str, value: object) -> None:
    if name.endswith("$") or isinstance(value, dict) and {"$slice", "$elemMatch"} & set(value):
        raise MongoError(
            "NotImplemented",
            f"simcluster does not evaluate the find projection {name}: {value}",
        )


def _group(docs: list[dict[str, Any]], spec: dict[str, Any]) -> list[dict[str, Any]]:
    groups: dict[bytes, dict[str, Any]] = {}
    for d in docs:
        key = _group_key(d, spec["_id"])
        acc = groups.setdefault(bson.encode({"k": key}), {"_id": key})
        for field, op_spec in spec.items():
            if field != "_id":
                _accumulate(acc, field, op_spec, d)
    return [_averaged(acc) for acc in groups.values()]


def _accumulate(
    acc: dict[str, object], field: str, op_spec: Mapping[str, object], doc: dict[str, object]
) -> None:
    """Add `doc`'s value to the group's `field` by the field's accumulator."""
    ((op, arg),) = op_spec.items()
    v = _value(_expr(doc, arg))
    accumulate = _ACCUMULATORS.get(op)
    if accumulate is None:
        raise MongoError(15952, f"unknown group operator '{op}'")
    accumulate(acc, field, v)


def _averaged(acc: dict[str, Any]) -> dict[str, Any]:
    """The group with each running $avg (sum, count) replaced by its mean."""
    for k in [k for k in acc if k.startswith("__avg_")]:
        s, n = acc.pop(k)
        acc[k[6:]] = s / n if n else None
    return acc


def _group_key(doc: dict[str, Any], id_spec: Any) -> Any:
    if not isinstance(id_spec, dict):
        return _value(_expr(doc, id_spec))
    return {k: _value(_expr(doc, v)) for k, v in id_spec.items()}


def _sum(acc: dict[str, Any], field: str, v: Any) -> None:
    acc[field] = acc.get(field, 0) + (v if isinstance(v, (int, float)) else 0)


def _avg(acc: dict[str, Any], field: str, v: Any) -> None:
    """A running (sum, count) under a hidden key, divided once every document is in."""
    s, n = acc.get("__avg_" + field, (0, 0))
    acc["__avg_" + field] = (s + v, n + 1)


def _min(acc: dict[str, Any], field: str, v: Any) -> None:
    acc[field] = v if field not in acc or q.compare(v, acc[field]) < 0 else acc[field]


def _max(acc: dict[str, Any], field: str, v: Any) -> None:
    acc[field] = v if field not in acc or q.compare(v, acc[field]) > 0 else acc[field]


def _last(acc: dict[str, Any], field: str, v: Any) -> None:
    acc[field] = v


def _add_to_set(acc: dict[str, Any], field: str, v: Any) -> None:
    lst = acc.setdefault(field, [])
    if all(q.compare(v, x) for x in lst):
        lst.append(v)


def _count(acc: dict[str, Any], field: str, v: Any) -> None:
    acc[field] = acc.get(field, 0) + 1


# Each $group accumulator: (the group's document so far, the output field, this document's value).
_ACCUMULATORS: dict[str, Callable[[dict[str, Any], str, Any], None]] = {
    "$sum": _sum,
    "$avg": _avg,
    "$min": _min,
    "$max": _max,
    "$first": lambda acc, field, v: acc.setdefault(field, v),
    "$last": _last,
    "$push": lambda acc, field, v: acc.setdefault(field, []).append(v),
    "$addToSet": _add_to_set,
    "$count": _count,
}
