"""An update event's updateDescription as the writes that apply it to a target: update operators
when every path is plain, else an update pipeline addressing each exact path (`update_ops`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pymongo import UpdateOne

# A path's components: a field name (str) or an array index (int).
Path = list[str | int]

_SLICE_ALL = (1 << 31) - 1  # "to the end" as $slice's count (a positive int32)
_ROOT_CHUNK = 50  # top-level fields per $replaceWith stage: bounds the expression's nesting


class _Set:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


_UNSET = object()


class _Node:
    """A subdocument or array along an update's paths: what happens under each of its fields
    (or indices), and the array's new length if the update truncated it."""

    __slots__ = ("children", "truncate")

    def __init__(self) -> None:
        self.children: dict[str | int, Any] = {}  # -> _Node, _Set or _UNSET
        self.truncate: int | None = None

    def at(self, path: Path) -> _Node:
        node = self
        for step in path:
            child = node.children.get(step)
            if not isinstance(child, _Node):
                child = node.children[step] = _Node()
            node = child
        return node


def _compile(node: _Node, current: Any) -> Any:
    """The expression computing the new value of `node` from `current`, its value before."""
    if node.truncate is not None or any(isinstance(k, int) for k in node.children):
        return _compile_array(node, current)
    expr = current
    for name, child in node.children.items():
        field = {"$literal": name}  # a constant, whatever the name: dots, a leading $
        if child is _UNSET:
            expr = {"$unsetField": {"field": field, "input": expr}}
            continue
        value = (
            {"$literal": child.value}
            if isinstance(child, _Set)
            else _compile(child, {"$getField": {"field": field, "input": current}})
        )
        expr = {"$setField": {"field": field, "input": expr, "value": value}}
    return expr


def _compile_array(node: _Node, current: Any) -> Any:
    """The array rebuilt from slices of `current` and the new elements, cut at the new length.

    An index past the end pads with nulls, as an update's $set of it does (the server's diff
    names only the set index): each gap between new elements is filled from `current`, then
    with nulls."""
    pieces: list[Any] = []
    pos = 0
    for idx in sorted(k for k in node.children if isinstance(k, int)):
        if idx > pos:
            gap = idx - pos
            pieces.append(
                {
                    "$slice": [
                        {
                            "$concatArrays": [
                                {"$slice": [current, pos, gap]},
                                {"$literal": [None] * gap},
                            ]
                        },
                        gap,
                    ]
                }
            )
        child = node.children[idx]
        pieces.append(
            [
                {"$literal": child.value}
                if isinstance(child, _Set)
                else _compile(child, {"$arrayElemAt": [current, idx]})
            ]
        )
        pos = idx + 1
    end = node.truncate
    if end is None or end > pos:
        pieces.append({"$slice": [current, pos, _SLICE_ALL if end is None else end - pos]})
    return {"$concatArrays": pieces}


def _array_index(component: str) -> bool:
    """True for an all-digit path component the server reads as an array index (no leading
    zero but "0" itself: isNumericPathComponentStrict)."""
    return component.isdigit() and (component == "0" or not component.startswith("0"))


def _plain(path: Path) -> bool:
    """True if the dotted string of `path` names it for an update operator: no component holds
    a dot, starts with $ (a positional operator, or refused at the top level) or is empty."""
    return all(isinstance(p, int) or (p and "." not in p and not p.startswith("$")) for p in path)


def _paths(
    desc: Mapping[str, Any],
) -> tuple[list[tuple[Path, Any]], list[Path], list[tuple[Path, int]], bool]:
    """(sets, removals, truncations) of an updateDescription as exact paths, and whether they
    are exact. `disambiguatedPaths` (expanded events, 6.1+) gives the components of every path
    that holds a field name with a dot, or an all-digit field name below the top level
    (change_stream_document_diff_parser.cpp); so in a path it does not list, an all-digit
    component below the top level is an array index. Without it, such a component may be
    either."""
    exact = desc.get("disambiguatedPaths")
    known = exact is not None
    exact = exact or {}
    unresolved = False

    def parts(path: str) -> Path:
        nonlocal unresolved
        if path in exact:
            return [
                p if isinstance(p, int) and not isinstance(p, bool) else str(p) for p in exact[path]
            ]
        first, *rest = path.split(".")
        if known:
            return [first, *(int(p) if _array_index(p) else p for p in rest)]
        unresolved = unresolved or any(p.isdigit() for p in rest)
        return [first, *rest]

    sets = [(parts(k), v) for k, v in (desc.get("updatedFields") or {}).items()]
    removed = [parts(k) for k in desc.get("removedFields") or []]
    truncated = [(parts(t["field"]), int(t["newSize"])) for t in desc.get("truncatedArrays") or []]
    return sets, removed, truncated, not unresolved


def _dotted(path: Path) -> str:
    return ".".join(map(str, path))


def _set_and_unset(sets: list[tuple[Path, Any]], removed: list[Path]) -> dict[str, Any]:
    """The $set and $unset of an update, each only when it has paths."""
    main: dict[str, Any] = {}
    if sets:
        main["$set"] = {_dotted(p): v for p, v in sets}
    if removed:
        main["$unset"] = {_dotted(p): "" for p in removed}
    return main


def _operators(
    sets: list[tuple[Path, Any]], removed: list[Path], truncated: list[tuple[Path, int]]
) -> list[dict[str, Any]]:
    """The update as operator documents: one, or two when a truncated array is also updated
    (one update may not touch a path and its prefix: ConflictingUpdateOperators)."""
    main = _set_and_unset(sets, removed)
    cut = {_dotted(p): {"$each": [], "$slice": n} for p, n in truncated}
    if not cut:
        return [main] if main else []
    touched = [p for p, _ in sets] + removed
    clash = any(q[: len(p)] == p for p, _ in truncated for q in touched)
    if clash or not main:
        return [{"$push": cut}] + ([main] if main else [])
    return [{**main, "$push": cut}]


def _pipeline(
    sets: list[tuple[Path, Any]], removed: list[Path], truncated: list[tuple[Path, int]]
) -> list[dict[str, Any]]:
    """The update as a pipeline of $replaceWith stages that set, unset and cut each exact path
    with $setField/$unsetField/$getField and array slices: a field whose name holds a dot or
    starts with $ is that one field, an array index that element (MongoDB 5.0+ targets)."""
    root = _Node()
    for p, n in truncated:
        root.at(p).truncate = n
    for p in removed:
        root.at(p[:-1]).children[p[-1]] = _UNSET
    for p, v in sets:
        root.at(p[:-1]).children[p[-1]] = _Set(v)
    names = list(root.children)
    stages = []
    for i in range(0, len(names), _ROOT_CHUNK):
        part = _Node()
        part.children = {k: root.children[k] for k in names[i : i + _ROOT_CHUNK]}
        stages.append({"$replaceWith": _compile(part, "$$ROOT")})
    return stages


def update_ops(key: Mapping[str, Any], desc: Mapping[str, Any]) -> list[UpdateOne]:
    """The writes that apply an update event's updateDescription to the document `key` names.

    Update operators when every path is plain (the common case, any target version), else an
    update pipeline that addresses each exact path. Never an upsert: replaying an update after a
    later delete leaves the document deleted."""
    sets, removed, truncated, exact = _paths(desc)
    every = [p for p, _ in sets] + removed + [p for p, _ in truncated]
    if all(_plain(p) for p in every):
        return [UpdateOne(key, spec) for spec in _operators(sets, removed, truncated)]
    if not exact:
        raise ValueError(
            "an update of a field whose name holds a dot or starts with $, under a "
            "path with an all-digit component, needs the stream's disambiguatedPaths "
            f"(showExpandedEvents: true) to be applied exactly: {dict(desc)!r}"
        )
    return [UpdateOne(key, _pipeline(sets, removed, truncated))]
