"""MQL query matching over decoded documents: comparison order, dotted paths, arrays, operators.

Pure functions shared by the simulator (find, update filters) and the engine ($match on change
events). BSON types are the codec's: int (Int32), Int64, float, str, dict, list, ObjectId, ...
"""

from __future__ import annotations

import datetime
import functools
import re
import reprlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeGuard

import re2
from bson import Binary, Code, DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.datetime_ms import DatetimeMS
from bson.son import SON

from mongoformats.bson_order import compare, sort_key
from mongoformats.errors import MongoError
from mongoformats.expressions import evaluate, is_true, unsupported_in_expression
from mongoformats.keystring import FALSE, NUMERIC_NAN, STRING, TRUE

# $type: BSON type numbers -> the Python types pymongo decodes them to (string aliases below).
_TYPES: dict[int | str, tuple[type, ...]] = {
    1: (float,),
    2: (str,),
    3: (dict, SON, DBRef),
    4: (list,),
    5: (bytes, Binary),
    7: (ObjectId,),
    8: (bool,),
    9: (datetime.datetime, DatetimeMS),
    10: (type(None),),
    11: (Regex,),
    13: (Code,),
    16: (int,),
    17: (Timestamp,),
    18: (Int64,),
    19: (Decimal128,),
    -1: (MinKey,),
    127: (MaxKey,),
    "number": (int, Int64, float, Decimal128),
}
_TYPE_ALIASES = {
    "double": 1,
    "string": 2,
    "object": 3,
    "array": 4,
    "binData": 5,
    "objectId": 7,
    "bool": 8,
    "date": 9,
    "null": 10,
    "regex": 11,
    "javascript": 13,
    "int": 16,
    "timestamp": 17,
    "long": 18,
    "decimal": 19,
    "minKey": -1,
    "maxKey": 127,
}


def _bracket(value: object) -> int:
    """The canonical type of `value` (canonicalizeBSONType): a query's comparisons only match
    values of the comparand's type ("type bracketing"), every number being of one type."""
    ctype = sort_key(value)[0]
    if NUMERIC_NAN <= ctype < STRING:
        return NUMERIC_NAN
    return FALSE if ctype == TRUE else ctype


def get_path(doc: Any, path: str) -> list[Any]:
    """All values at a dotted path, expanding arrays the way the query engine does."""
    values: list[Any] = [doc]
    for part in path.split("."):
        values = [found for v in values for found in _step(v, part)]
    return values


def _step(value: Any, part: str) -> list[Any]:
    """The values one path component leads to from `value`: a document's field; an array's
    element at that index, then the field of each of its documents."""
    if isinstance(value, Mapping):
        return [value[part]] if part in value else []
    return _array_step(value, part) if isinstance(value, list) else []


def _array_step(array: list[object], part: str) -> list[object]:
    """The values one path component leads to from an array: its element at that index, then
    the field of each of its documents."""
    out = [array[int(part)]] if part.isdigit() and int(part) < len(array) else []
    out += [item[part] for item in array if isinstance(item, Mapping) and part in item]
    return out


def _candidates(values: list[object]) -> list[object]:
    out = []
    for v in values:
        out.append(v)
        if isinstance(v, list):
            out.extend(v)
    return out


_LIST_ARGUMENTS = frozenset({"$in", "$nin", "$all"})

# The server's MatchExpressionParser refuses a query nested deeper than this (kMaximumTreeDepth,
# src/mongo/db/matcher/expression_parser.cpp: BadValue "exceeded maximum query tree depth of 100
# at ..."); $and/$or/$nor, $elemMatch and $not each go one level down. It also bounds the
# recursion of `matches` on such a query.
MAX_QUERY_DEPTH = 100


def _too_deep(query: object) -> MongoError:
    return MongoError(
        "BadValue",
        f"exceeded maximum query tree depth of {MAX_QUERY_DEPTH} at {_SHORT.repr(query)}",
    )


# The part of a query an error shows: a few levels and elements (reprlib stops at them).
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxdict, _SHORT.maxlist, _SHORT.maxstring, _SHORT.maxother = 3, 4, 4, 60, 60


def unsupported_in_query(query: object, *, top_level: bool = True, level: int = 0) -> str | None:
    """The first operator of `query` that `matches` does not evaluate as the server does (e.g.
    "$where", or a regular expression only a backtracking engine runs), or None when it
    evaluates all of it. `top_level`: whether `$expr` may be used (not inside $elemMatch, where
    the server refuses it). A query nested past MAX_QUERY_DEPTH raises the server's BadValue.

    Why: a caller that can hand the query to a real server instead (the proxy, for a watch()'s
    $match) must know before it answers anything, not find out on some later event.
    """
    if level > MAX_QUERY_DEPTH:
        raise _too_deep(query)
    if not isinstance(query, Mapping):
        return "a query that is not a document"
    for key, cond in query.items():
        if (found := _unsupported_in_clause(key, cond, top_level, level)) is not None:
            return found
    return None


def _unsupported_in_clause(key: str, cond: Any, top_level: bool, level: int) -> str | None:
    """What in one {key: cond} of a query `matches` does not evaluate as the server does."""
    if key in ("$and", "$or", "$nor"):
        return _unsupported_in_logical(key, cond, top_level, level)
    if key == "$comment":
        return None
    if key == "$expr" and top_level:
        return unsupported_in_expression(cond)
    if str(key).startswith("$"):
        return str(key)  # $expr, $where, $text, $jsonSchema, ...
    return _unsupported_in_condition(cond, level)


def _unsupported_in_logical(key: str, cond: Any, top_level: bool, level: int) -> str | None:
    if not isinstance(cond, list) or not cond:
        return f"{key} without a non-empty array"
    for sub in cond:
        found = unsupported_in_query(sub, top_level=top_level, level=level + 1)
        if found is not None:
            return found
    return None


def _unsupported_in_condition(cond: object, level: int) -> str | None:
    if level > MAX_QUERY_DEPTH:
        raise _too_deep(cond)
    if not _is_operator_doc(cond):
        return _unsupported_in_value(cond)
    for op, arg in cond.items():
        found = _unsupported_in_operator(op, arg, cond, level)
        if found is not None:
            return found
    return None


def _unsupported_in_value(cond: object) -> str | None:
    """What in a condition that is not an operator document `matches` does not evaluate."""
    if isinstance(cond, Mapping) and any(str(k).startswith("$") for k in cond):
        return "a condition that mixes operators and fields"
    if isinstance(cond, (re.Pattern, Regex)):
        return _regex_problem(*_pattern_of(cond))
    return None  # equality with a value


def _unsupported_in_operator(op: str, arg: Any, cond: Mapping[str, Any], level: int) -> str | None:
    """What in one {op: arg} of the operator document `cond` `matches` does not evaluate."""
    if op not in _FIELD_OPERATORS:
        return op
    shape = _operand_shape_problem(op, arg)
    if shape is not None:
        return shape
    if op == "$regex":
        return _regex_operator_problem(cond)
    return _operand_problem(op, arg, level)


def _operand_shape_problem(op: str, arg: object) -> str | None:
    """What makes a field operator's operand not of the kind it takes: an array for the list
    operators, an operator document or a regular expression for `$not`."""
    if op in _LIST_ARGUMENTS and not isinstance(arg, list):
        return f"{op} without an array"
    if op == "$not" and not (_is_operator_doc(arg) or isinstance(arg, (re.Pattern, Regex))):
        return "$not without an operator document or a regular expression"
    return None


def _operand_problem(op: str, arg: Any, level: int) -> str | None:
    """What in the operand of a field operator `matches` does not evaluate as the server does."""
    if op in ("$not", "$elemMatch") and _is_operator_doc(arg):
        return _unsupported_in_condition(arg, level + 1)
    if op == "$not":
        return _regex_problem(*_pattern_of(arg))
    if op == "$elemMatch":
        return unsupported_in_query(arg, top_level=False, level=level + 1)
    return _in_problem(arg) if op == "$in" else None


def _in_problem(arg: list[object]) -> str | None:
    """What keeps a regular expression among an `$in` operand from running on RE2, or None."""
    patterns = (_pattern_of(a) for a in arg if isinstance(a, (re.Pattern, Regex)))
    return next(filter(None, (_regex_problem(*p) for p in patterns)), None)


def _regex_operator_problem(cond: Mapping[str, Any]) -> str | None:
    """What keeps a {$regex, $options?} condition from running on RE2, or None."""
    pattern, options = cond["$regex"], cond.get("$options", "")
    if not isinstance(options, str):
        return "$options that is not a string"
    pattern, options = _with_own_flags(pattern, options)
    if not isinstance(pattern, str):
        return "a $regex that is neither a string nor a regular expression"
    return _regex_problem(pattern, options)


def _with_own_flags(pattern: object, options: str) -> tuple[object, str]:
    """A $regex's pattern and $options, a regular expression's own flags added to the options
    (its pattern a string then)."""
    if isinstance(pattern, (re.Pattern, Regex)):
        pattern, own = _pattern_of(pattern)
        options += own
    return pattern, options


# Types whose Python equality is BSON's, between two values of the one type: equal values need
# no KeyString (compare builds two for each test). Not float: NaN equals NaN in BSON's order.
_EXACT_TYPES = frozenset({str, int, Int64, bool, ObjectId, type(None)})


def _equals(arg: object, cands: list[object], values: list[object]) -> bool:
    """$eq: some candidate equals `arg`, or `arg` is null and the path has no value."""
    t = type(arg)
    exact = t in _EXACT_TYPES
    return any(v == arg if exact and type(v) is t else compare(v, arg) == 0 for v in cands) or (
        arg is None and not values
    )


def _match_op(op: str, arg: object, values: list[object]) -> bool:
    match = _OPERATORS.get(op)
    if match is None:
        raise MongoError("BadValue", f"unknown operator: {op}")
    return match(arg, values)


# Each field operator's test: (its operand, the values at the field's path) -> bool.
_Operator = Callable[[Any, list[object]], bool]


def _eq(arg: object, values: list[object]) -> bool:
    return _equals(arg, _candidates(values), values)


def _ne(arg: object, values: list[object]) -> bool:
    return not _eq(arg, values)


def _comparison(outcomes: tuple[int, ...]) -> _Operator:
    """$gt, $gte, $lt or $lte: some candidate of the operand's type bracket compares as one of
    `outcomes` (compare's -1, 0, 1) with it."""

    def match(arg: object, values: list[object]) -> bool:
        bracket = _bracket(arg)
        cands = _candidates(values)
        return any(_bracket(v) == bracket and compare(v, arg) in outcomes for v in cands)

    return match


def _in(arg: Iterable[object], values: list[object]) -> bool:
    # A regular expression in the list matches strings, as one outside it does.
    cands = _candidates(values)
    return any(
        _regex_matches(a, values)
        if isinstance(a, (re.Pattern, Regex))
        else _equals(a, cands, values)
        for a in arg
    )


def _nin(arg: Iterable[object], values: list[object]) -> bool:
    return not _in(arg, values)


def _all(arg: Iterable[object], values: list[object]) -> bool:
    return all(_eq(a, values) for a in arg)


def _elem_match(arg: Mapping[str, Any], values: list[object]) -> bool:
    by_query = not _is_operator_doc(arg)  # {field: ...} tests documents, {$op: ...} any element

    def item_matches(item: object) -> bool:
        if by_query and isinstance(item, Mapping):
            return matches(item, arg)
        return condition_matches(arg, [item])

    return any(isinstance(v, list) and any(item_matches(item) for item in v) for v in values)


def _type(arg: Any, values: list[object]) -> bool:
    wanted: set[type] = set()
    for name in arg if isinstance(arg, list) else [arg]:
        types = _TYPES.get(_TYPE_ALIASES.get(name, name) if isinstance(name, str) else name)
        if types is None:
            raise MongoError("BadValue", f"Unknown type name alias: {name}")
        wanted.update(types)
    # Like every leaf operator, $type also tests an array's elements.
    return any(type(v) in wanted for v in _candidates(values))


_OPERATORS: dict[str, _Operator] = {
    "$eq": _eq,
    "$ne": _ne,
    "$gt": _comparison((1,)),
    "$gte": _comparison((0, 1)),
    "$lt": _comparison((-1,)),
    "$lte": _comparison((-1, 0)),
    "$in": _in,
    "$nin": _nin,
    "$exists": lambda arg, values: bool(values) == bool(arg),
    "$size": lambda arg, values: any(isinstance(v, list) and len(v) == arg for v in values),
    "$all": _all,
    "$elemMatch": _elem_match,
    "$not": lambda arg, values: not condition_matches(arg, values),
    "$regex": lambda arg, values: _regex_matches(arg, values),
    "$options": lambda arg, values: True,  # read with its $regex
    "$type": _type,
}

# The operators _match_op evaluates; unsupported_in_query names anything else a query uses.
_FIELD_OPERATORS = frozenset(_OPERATORS)


def _is_operator_doc(v: object) -> TypeGuard[Mapping[str, Any]]:
    return isinstance(v, Mapping) and bool(v) and all(str(k).startswith("$") for k in v)


def condition_matches(cond: object, values: list[object]) -> bool:
    """Whether the values at a field's path (get_path) meet a query's condition on that field: an
    operator document ({$gt: 1, $lt: 5}), a regular expression, or a value to equal."""
    if _is_operator_doc(cond):
        if "$regex" in cond:
            return _regex_condition_matches(cond, values)
        return all(_match_op(k, v, values) for k, v in cond.items())
    if isinstance(cond, (re.Pattern, Regex)):
        return _regex_matches(cond, values)
    return _match_op("$eq", cond, values)


def _regex_condition_matches(cond: Mapping[str, Any], values: list[object]) -> bool:
    """An operator document with $regex (and its $options, and the pattern's own flags), then
    its other operators."""
    regex, options = _with_own_flags(cond["$regex"], cond.get("$options", ""))
    search = _compiled(regex, options)
    rest = {k: v for k, v in cond.items() if k not in ("$regex", "$options")}
    return any(isinstance(v, str) and search(v) for v in _candidates(values)) and all(
        _match_op(k, v, values) for k, v in rest.items()
    )


def _match_value(cond: object, values: list[object], doc: object, path: str) -> bool:
    """condition_matches under the name and arguments simcluster.updates calls it by (the
    document and path are not needed)."""
    return condition_matches(cond, values)


# User-supplied patterns run on RE2, whose matching time is linear in the subject: a pattern
# such as ^(a+)+$ cannot make one event's test take seconds (Python's re, like PCRE,
# backtracks). RE2 lacks backreferences, lookaround, possessive quantifiers and the x option;
# unsupported_in_query names such patterns, so that the engine never runs them (a watch() goes to
# mongos, a parallelChangeStream is refused). Only simcluster, a simulator, runs them, on re.
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is an answer, not a line on stderr
_RE2_OPTIONS.never_capture = True  # matching only tests; groups would cost time and memory
# $options letters and their inline flags (RE2 and re alike); PCRE's x has no RE2 equivalent.
_INLINE = {"i": "i", "m": "m", "s": "s"}
_RE_FLAGS = {"i": re.I, "m": re.M, "s": re.S, "x": re.X}
_FLAG_LETTERS = ((re.I, "i"), (re.M, "m"), (re.S, "s"), (re.X, "x"))

Search = Callable[[str], object]  # a match (truthy) or None


def _pattern_of(value: Any) -> tuple[str, str]:
    """A regular expression value (bson Regex, re.Pattern) as its pattern and option letters."""
    flags = value.flags
    if isinstance(flags, str):  # a Regex made with letters
        return str(value.pattern), flags
    return str(value.pattern), "".join(letter for flag, letter in _FLAG_LETTERS if flags & flag)


# The server's limit on a $regex pattern (RegexMatchExpression::kMaxPatternSize,
# src/mongo/db/matcher/expression_leaf.h), refused with BadValue like a pattern or options
# string holding a NUL byte (expression_leaf.cpp).
MAX_PATTERN_LENGTH = 32764


def _regex_problem(pattern: str, options: str) -> str | None:
    """Why RE2 cannot run `pattern` with `options`, or None when it can; the server's BadValue
    for a pattern it refuses to parse."""
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise MongoError("BadValue", "Regular expression is too long")
    if "\0" in pattern:
        raise MongoError("BadValue", "Regular expression cannot contain an embedded null byte")
    if "\0" in options:
        raise MongoError(
            "BadValue", "Regular expression options string cannot contain an embedded null byte"
        )
    if "x" in options:
        return "a regular expression with the x option"
    try:
        _re2_compiled(pattern, options)
    except re2.error as exc:
        return f"a regular expression RE2 cannot run ({_reason(exc)})"
    return None


def _reason(exc: Exception) -> str:
    reason = exc.args[0] if exc.args else exc
    return reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)


@functools.lru_cache(maxsize=256)
def _re2_compiled(pattern: str, options: str) -> Search:
    inline = "".join(sorted({_INLINE[c] for c in options if c in _INLINE}))
    if "m" not in options and _ends_with_dollar(pattern):
        # PCRE's $ also matches before a final newline, RE2's only at the end: the same test.
        pattern = pattern[:-1] + r"(?:\n?\z)"
    return re2.compile(f"(?{inline}){pattern}" if inline else pattern, _RE2_OPTIONS).search


def _ends_with_dollar(pattern: str) -> bool:
    """Whether `pattern` ends with the anchor $ (not an escaped \\$)."""
    backslashes = len(pattern) - 1 - len(pattern[:-1].rstrip("\\"))
    return pattern.endswith("$") and backslashes % 2 == 0


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str, options: str) -> Search:
    """A $regex with its $options, compiled once (a stream's $match tests it on every event):
    on RE2, or on re for what only a backtracking engine runs (see _RE2_OPTIONS)."""
    if _regex_problem(pattern, options) is None:
        return _re2_compiled(pattern, options)
    flags = 0
    for letter in options:
        flags |= _RE_FLAGS.get(letter, 0)
    return re.compile(pattern, flags).search


def _regex_matches(pattern: object, values: list[object]) -> bool:
    search = (
        _compiled(*_pattern_of(pattern))
        if isinstance(pattern, (re.Pattern, Regex))
        else _compiled(pattern, "")
    )
    return any(isinstance(v, str) and search(v) for v in _candidates(values))


def matches(doc: Mapping[str, Any], query: Mapping[str, Any]) -> bool:
    return all(_clause_matches(doc, key, cond) for key, cond in query.items())


def _clause_matches(doc: Mapping[str, Any], key: str, cond: Any) -> bool:
    top = _TOP_LEVEL.get(key)
    if top is not None:
        return top(doc, cond)
    return condition_matches(cond, get_path(doc, key))


# A query's top-level operators: (the document, the operand) -> whether it matches. $comment
# and $where match every document.
_TOP_LEVEL: dict[str, Callable[[Mapping[str, Any], Any], bool]] = {
    "$and": lambda doc, cond: all(matches(doc, q) for q in cond),
    "$or": lambda doc, cond: any(matches(doc, q) for q in cond),
    "$nor": lambda doc, cond: not any(matches(doc, q) for q in cond),
    "$expr": lambda doc, cond: bool(is_true(evaluate(doc, cond))),
    "$comment": lambda doc, cond: True,
    "$where": lambda doc, cond: True,
}
