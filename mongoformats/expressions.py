"""The aggregation expressions a change stream's stages may use, evaluated as the server does
(pure).

Shared by the stages after `$changeStream` (change_stages: projections, new roots), by
queries' `$expr` (mql) and by simcluster's aggregate stages, which add operators of their own
(`evaluate`'s `more`). Evaluated: field paths, the variables `$$ROOT`, `$$CURRENT` (with paths)
and `$$REMOVE`, literals and `$literal`, arrays and documents of expressions, `$concat`,
`$bsonSize`, `$ifNull`, the comparisons `$eq $ne $gt $gte $lt $lte $cmp`, `$in`, and
`$and $or $not`. That covers the drivers' suite and Debezium (its regex filter pipeline, and
its oversize "skip" mode, `{$expr: {$lte: [{$bsonSize: "$fullDocument"}, <limit>]}}`).

`unsupported_in_expression` names anything else, or a known operator given the wrong number of
arguments, so that a caller with a real server behind it can leave such an expression to the
server and its errors instead of answering differently.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import bson
from bson import Decimal128

from mongoformats.bson_order import MISSING, compare_values
from mongoformats.errors import MongoError
from mongoformats.idl import type_name

__all__ = ["VARIABLES", "Operator", "Operators", "evaluate", "is_true", "unsupported_in_expression"]

# The document the expression reads ($$REMOVE aside, the only variables evaluated).
VARIABLES = ("$$ROOT", "$$CURRENT")

# The server's other system variables: defined there, so not "undefined" here, only not evaluated.
_SYSTEM_VARIABLES = frozenset(
    {"$$NOW", "$$CLUSTER_TIME", "$$DESCEND", "$$PRUNE", "$$KEEP", "$$SEARCH_META", "$$USER_ROLES"}
)

# What each comparison makes of Value::compare's -1, 0 or 1.
_COMPARISONS: dict[str, Callable[[int], Any]] = {
    "$eq": lambda c: c == 0,
    "$ne": lambda c: c != 0,
    "$gt": lambda c: c > 0,
    "$gte": lambda c: c >= 0,
    "$lt": lambda c: c < 0,
    "$lte": lambda c: c <= 0,
    "$cmp": lambda c: c,
}

# Operators evaluated on their arguments, with how many they take (at least, at most). A server
# refuses any other count when it parses the pipeline, so such an expression is left to it.
_ARITY: dict[str, tuple[int, float]] = {
    "$concat": (0, math.inf),
    "$and": (0, math.inf),
    "$or": (0, math.inf),
    "$not": (1, 1),
    "$bsonSize": (1, 1),
    "$in": (2, 2),
    "$ifNull": (2, math.inf),
    **dict.fromkeys(_COMPARISONS, (2, 2)),
}


def _arguments(operand: object) -> list[Any]:
    """An operator's arguments as ExpressionNary parses them: an array's elements, or the operand
    alone."""
    return operand if isinstance(operand, list) else [operand]


def unsupported_in_expression(e: object) -> str | None:
    """The first operator, variable or malformed part of expression `e` that `evaluate` does not
    evaluate as the server does (e.g. "$mergeObjects", "$$NOW"); None when it evaluates all of
    it."""
    if isinstance(e, str):
        return _unsupported_in_path(e) if e.startswith("$") else None
    if isinstance(e, list):
        return _first_unsupported(e)
    if isinstance(e, Mapping):
        return _unsupported_in_object(e)
    return None


def _first_unsupported(expressions: Iterable[object]) -> str | None:
    return next(filter(None, map(unsupported_in_expression, expressions)), None)


def _unsupported_in_path(e: str) -> str | None:
    """What `evaluate` does not evaluate in a "$field.path" or "$$VARIABLE.path"."""
    variable, *parts = e.split(".") if e.startswith("$$") else ["", *e[1:].split(".")]
    if variable and variable not in (*VARIABLES, "$$REMOVE"):
        return variable  # $$NOW, $$CLUSTER_TIME, user variables, ...
    if any(not p or p.startswith("$") for p in parts):
        return f"the field path {e!r}"  # the server refuses it (16872, 16410, 15998)
    return None


def _unsupported_in_object(e: Mapping[str, Any]) -> str | None:
    """What `evaluate` does not evaluate in a document of expressions or an {$operator: operand}."""
    if not any(str(k).startswith("$") for k in e):
        return _first_unsupported(e.values())
    if len(e) != 1:
        return "an expression object with an operator and other fields"
    ((op, operand),) = e.items()
    return None if op == "$literal" else _unsupported_in_operator(op, operand)


def _unsupported_in_operator(op: str, operand: object) -> str | None:
    """What `evaluate` does not evaluate in an {$operator: operand}: the operator, its number of
    arguments, or an argument."""
    if op not in _ARITY:
        return str(op)
    low, high = _ARITY[op]
    args = _arguments(operand)
    if not low <= len(args) <= high:
        return f"{op} with {len(args)} arguments"
    return _first_unsupported(args)


# An operator's evaluation: (the document, its arguments, the evaluator's further operators).
Operator = Callable[[Mapping[str, Any], list[Any], "Operators | None"], Any]
Operators = Mapping[str, Operator]


def evaluate(doc: Mapping[str, Any], e: object, more: Operators | None = None) -> Any:
    """The value of expression `e` in document `doc`: one unsupported_in_expression admits, or
    one that uses the operators `more` adds (simcluster's own, looser, for its aggregate stages).

    A path that finds nothing is MISSING (the caller leaves such a field out); inside an array it
    is null, inside a document left out, as on the server."""
    if isinstance(e, str) and e.startswith("$"):
        return _field_or_variable(doc, e)
    if isinstance(e, dict):
        return _evaluate_object(doc, e, more)
    if isinstance(e, list):
        return _evaluate_array(doc, e, more)
    return e


def _field_or_variable(doc: Mapping[str, object], e: str) -> object:
    """The value of a "$field.path" or a "$$VARIABLE.path" in `doc`."""
    return _variable(doc, e) if e.startswith("$$") else _path(doc, e[1:].split("."))


def _evaluate_array(
    doc: Mapping[str, object], e: list[object], more: Operators | None
) -> list[object]:
    """The values of an array of expressions: a path that finds nothing is null there."""
    return [None if (v := evaluate(doc, x, more)) is MISSING else v for x in e]


def _variable(doc: Mapping[str, Any], e: str) -> Any:
    """The value of a "$$VARIABLE.path": $$ROOT and $$CURRENT are `doc`, $$REMOVE is missing."""
    variable, *parts = e.split(".")
    if variable == "$$REMOVE":
        return MISSING
    if variable not in VARIABLES:
        if variable in _SYSTEM_VARIABLES:
            raise MongoError("NotImplemented", f"the variable {variable} is not evaluated here")
        raise MongoError(17276, f"Use of undefined variable: {variable[2:]}")
    return _path(doc, parts)


def _evaluate_object(doc: Mapping[str, Any], e: dict[str, Any], more: Operators | None) -> Any:
    """An {$operator: operand}'s value, or a document of expressions' (missing fields left out)."""
    if len(e) == 1:
        ((op, operand),) = e.items()
        if op.startswith("$"):
            return _apply_operator(doc, op, operand, more)
    return {k: v for k, x in e.items() if (v := evaluate(doc, x, more)) is not MISSING}


def _apply_operator(doc: Mapping[str, Any], op: str, operand: Any, more: Operators | None) -> Any:
    """An {$operator: operand}'s value; NotImplemented for an operator not evaluated here."""
    if op == "$literal":
        return operand
    operator = _operator(op, more)
    if operator is None:
        raise MongoError("NotImplemented", f"the expression operator {op} is not evaluated here")
    return operator(doc, _arguments(operand), more)


def _operator(op: str, more: Operators | None) -> Operator | None:
    """An operator's evaluation: ours, else the one `more` adds, else None."""
    return _OPERATORS.get(op) or (more.get(op) if more is not None else None)


def _comparison(test: Callable[[int], Any]) -> Operator:
    def compared(doc: Mapping[str, Any], args: list[Any], more: Operators | None) -> Any:
        return test(compare_values(evaluate(doc, args[0], more), evaluate(doc, args[1], more)))

    return compared


def _and(doc: Mapping[str, Any], args: list[Any], more: Operators | None) -> bool:
    # Short-circuits, as ExpressionAnd does: a later argument's error is not raised.
    return all(is_true(evaluate(doc, a, more)) for a in args)


def _or(doc: Mapping[str, Any], args: list[Any], more: Operators | None) -> bool:
    return any(is_true(evaluate(doc, a, more)) for a in args)


def _not(doc: Mapping[str, Any], args: list[Any], more: Operators | None) -> bool:
    return not is_true(evaluate(doc, args[0], more))


def _bson_size(doc: Mapping[str, Any], args: list[Any], more: Operators | None) -> Any:
    value = evaluate(doc, args[0], more)
    if value is None or value is MISSING:
        return None
    if not isinstance(value, Mapping):
        raise MongoError(31393, f"$bsonSize requires a document input, found: {type_name(value)}")
    return len(bson.encode(value))


def _in(doc: Mapping[str, Any], args: list[Any], more: Operators | None) -> bool:
    needle, haystack = evaluate(doc, args[0], more), evaluate(doc, args[1], more)
    if not isinstance(haystack, list):
        found = "missing" if haystack is MISSING else type_name(haystack)
        raise MongoError(40081, f"$in requires an array as a second argument, found: {found}")
    return any(compare_values(needle, v) == 0 for v in haystack)


def _concat(doc: Mapping[str, Any], args: list[Any], more: Operators | None) -> Any:
    """$concat as ExpressionConcat evaluates it: argument by argument, null at the first that is
    null or missing, an error at the first that is not a string."""
    out = []
    for arg in args:
        value = evaluate(doc, arg, more)
        if value is None or value is MISSING:
            return None
        if not isinstance(value, str):
            raise MongoError(16702, f"$concat only supports strings, not {type_name(value)}")
        out.append(value)
    return "".join(out)


def _if_null(doc: Mapping[str, Any], args: list[Any], more: Operators | None) -> Any:
    """$ifNull (5.0+, any number of inputs): the first input that is neither null nor missing,
    else the last argument's value, missing included."""
    for arg in args[:-1]:
        value = evaluate(doc, arg, more)
        if value is not None and value is not MISSING:
            return value
    return evaluate(doc, args[-1], more)


_OPERATORS: dict[str, Operator] = {
    **{op: _comparison(test) for op, test in _COMPARISONS.items()},
    "$and": _and,
    "$or": _or,
    "$not": _not,
    "$bsonSize": _bson_size,
    "$in": _in,
    "$concat": _concat,
    "$ifNull": _if_null,
}
assert set(_OPERATORS) == set(_ARITY)


def is_true(value: object) -> bool:
    """A value as a condition (Value::coerceToBool): missing, null, false and numeric zero are
    false; everything else is true, NaN, empty strings and empty arrays included."""
    if value is MISSING or value is None:
        return False
    # bool and Int64 too; NaN != 0, so NaN is true, as on the server
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, Decimal128):
        return not value.to_decimal().is_zero()
    return True


def _path(value: object, parts: list[str]) -> Any:
    """A field path's value: through an array, the values found in its documents and arrays."""
    if not parts:
        return value
    if isinstance(value, Mapping):
        return _path(value[parts[0]], parts[1:]) if parts[0] in value else MISSING
    return _array_path(value, parts) if isinstance(value, list) else MISSING


def _array_path(array: list[object], parts: list[str]) -> list[object]:
    """A field path's values through an array: those found in its documents and arrays."""
    found = (_path(item, parts) for item in array if isinstance(item, (Mapping, list)))
    return [v for v in found if v is not MISSING]
