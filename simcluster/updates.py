"""Updates as a server applies and logs them: operators in path order, positional paths, and the
`$v: 2` diff it writes to the oplog.

Why a diff is not just "old versus new" here: the server logs what each operator did
(update_executor's log builder), not a comparison of the documents. `$set: {a: {x: 1}}` over
`a: {x: 0, y: 1}` logs `u: {a: {x: 1}}`, where a comparison would log a sub-diff; `$pull` logs the
whole array; `$push` logs only the appended elements. Change events carry those shapes as their
updateDescription, so a simulator that compared documents would show drivers other events than
a server does. Pipeline updates are the exception: the server does compare the two documents
(`pipeline_diff`), and logs the whole new document instead when the diff is not smaller.

Facts from the server (src/mongo/db/update): operators apply in the order of their paths, names
compared as numbers when both are numeric (update_object_node); a modifier that changes nothing
logs nothing (binary-equal values); a path that did not exist is logged where it starts to be
new, with its whole new subtree; $unset of an array element sets it to null and logs that; $push
that only appends logs each new element; the diff's sections come d, u, i, then sub-diffs, and an
array diff is `{a: true, u<i>|s<i>...}` by index (v2_log_builder, document_diff_calculator).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import Any

import bson

from mongoformats.bson_order import MISSING
from mongoformats.errors import MongoError
from mongoformats.mql import matches
from simcluster.modifiers import MODIFIERS, modify, same, unknown_modifier
from simcluster.update_log import DocDiff, UpdateLog

__all__ = [
    "apply_update",
    "pipeline_diff",
    "pipeline_entry",
    "replaced_by_pipeline",
    "update_with_entry",
]

# -- applying the operators ----------------------------------------------------------------------


def _numeric(name: str) -> bool:
    return name.isdigit() and name.isascii()


def _compare_parts(a: str, b: str) -> int:
    """Field names in the order the server applies them: numbers by value, the rest bytewise."""
    if _numeric(a) and _numeric(b):
        return (int(a) > int(b)) - (int(a) < int(b))
    x, y = a.encode(), b.encode()
    return (x > y) - (x < y)


def _path_order(parts: list[str]) -> Any:
    return [functools.cmp_to_key(_compare_parts)(p) for p in parts]


def _lookup(doc: Any, parts: list[str]) -> tuple[int, list[bool], Any]:
    """(how many leading parts exist, whether each existing part indexes an array, the value at
    the deepest existing part)."""
    cur, flags = doc, list[bool]()
    for depth, part in enumerate(parts):
        step = _child(cur, part)
        if step is None:
            return depth, flags, cur
        flags.append(step[0])
        cur = step[1]
    return len(parts), flags, cur


def _child(value: object, part: str) -> tuple[bool, object] | None:
    """(whether `part` indexes an array, the value it names in `value`), or None where it names
    nothing."""
    if isinstance(value, list) and _numeric(part) and int(part) < len(value):
        return True, value[int(part)]
    if isinstance(value, dict) and part in value:
        return False, value[part]
    return None


def _not_viable(field: str, name: str, value: Any) -> MongoError:
    return MongoError(28, f"Cannot create field '{field}' in element {{{name}: {value!r}}}")


def _create(doc: dict[str, Any], parts: list[str], value: Any) -> tuple[int, list[bool]]:
    """Put `value` at `parts`, making missing documents on the way as the server does (an index
    past an array's end pads it with nulls); (the first part created, array flags of the path)."""
    found, flags, _ = _lookup(doc, parts)
    cur: Any = doc
    for j in range(len(parts)):
        key = _slot(cur, parts, j)
        if j >= found:
            flags.append(isinstance(cur, list))
        if j == len(parts) - 1:
            cur[key] = value
        elif j >= found:
            cur[key] = {}
        cur = cur[key]
    return found, flags


def _slot(cur: object, parts: list[str], j: int) -> int | str:
    """The key of parts[j] in `cur`: an index (the array padded with nulls up to it) or a field
    name."""
    part = parts[j]
    if isinstance(cur, list) and _numeric(part):
        cur.extend([None] * (int(part) + 1 - len(cur)))
        return int(part)
    if isinstance(cur, dict):
        return part
    # a scalar in the way, or a field name asked of an array
    raise _not_viable(part, parts[j - 1] if j else "", cur)


def _is_positional(part: str) -> bool:
    return part.startswith("$[") or part == "$"


def _expand(
    doc: Any,
    parts: list[str],
    array_filters: Mapping[str, Any],
    query: Mapping[str, Any],
    path: str,
) -> list[list[str]]:
    """The concrete paths of one update path: `$[]`, `$[<id>]` and `$` become the indexes they
    select in this document, in index order."""
    out: list[list[str]] = [[]]
    for part in parts:
        if not _is_positional(part):
            for p in out:
                p.append(part)
            continue
        out = [
            [*prefix, index]
            for prefix in out
            for index in _selected(doc, prefix, part, array_filters, query, path)
        ]
    return out


def _selected(
    doc: Any,
    prefix: list[str],
    part: str,
    array_filters: Mapping[str, Any],
    query: Mapping[str, Any],
    path: str,
) -> list[str]:
    """The indexes positional `part` selects in the array at `prefix`."""
    array, where = _array_at(doc, prefix)
    if part == "$":
        return [str(_positional(array, where, query))]
    ident = part[2:-1]
    _check_filter_exists(ident, array_filters, path)
    return [
        str(idx)
        for idx, element in enumerate(array)
        if not ident or matches({ident: element}, array_filters[ident])
    ]


def _check_filter_exists(ident: str, array_filters: Mapping[str, object], path: str) -> None:
    """`$[<ident>]` needs an arrayFilter naming `ident` (`$[]` needs none)."""
    if ident and ident not in array_filters:
        raise MongoError(
            "BadValue", f"No array filter found for identifier '{ident}' in path '{path}'"
        )


def _array_at(doc: Any, prefix: list[str]) -> tuple[list[Any], str]:
    """The array a positional path part applies to, and its dotted path."""
    found, _, value = _lookup(doc, prefix)
    where = ".".join(prefix)
    if found < len(prefix):
        raise MongoError(
            "BadValue",
            f"The path '{where}' must exist in the document in order to apply array updates.",
        )
    if not isinstance(value, list):
        raise MongoError(
            "BadValue", f"Cannot apply array updates to non-array element {where}: {value!r}"
        )
    return value, where


def _positional(array: list[Any], where: str, query: Mapping[str, Any]) -> int:
    """The index `$` stands for: the first element the query's conditions on this array match."""
    terms = _query_terms_on(query, where)
    if terms:
        for idx, element in enumerate(array):
            if all(_element_matches(element, where, k, v) for k, v in terms):
                return idx
    raise MongoError(
        "BadValue", "The positional operator did not find the match needed from the query."
    )


def _query_terms_on(query: Mapping[str, Any], where: str) -> list[tuple[str, Any]]:
    """The conditions on the array at `where`: the query's own and its top-level $and's."""
    terms = _terms_on(query, where)
    for clause in query.get("$and", []):
        terms += _terms_on(clause, where)
    return terms


def _terms_on(query: Mapping[str, Any], where: str) -> list[tuple[str, Any]]:
    """The query's conditions on the array at `where` or inside its elements."""
    return [(k, v) for k, v in query.items() if k == where or k.startswith(where + ".")]


def _element_matches(element: Any, where: str, key: str, cond: Any) -> bool:
    return matches({where: [element]} if key == where else {where: element}, {key: cond})


def update_with_entry(
    doc: dict[str, Any] | None,
    update: Mapping[str, Any],
    *,
    is_insert: bool = False,
    array_filters: list[Any] | None = None,
    query: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], Any]:
    """(the updated copy of `doc`, the `o` of the oplog entry the server writes for it, or None when
    nothing changed): a `$v: 2` diff for update operators, the new document for a replacement."""
    if not update or not all(k.startswith("$") for k in update):
        return _replacement_with_entry(doc, update, is_insert)
    new = copy.deepcopy(doc) if doc is not None else {}
    steps = _steps(new, update, _filters_by_identifier(array_filters), query or {})
    if not is_insert:
        _check_top_level_names(_stored_top_level(steps, new))
    _check_conflicts(steps)
    log = _run_steps(new, steps, is_insert)
    _check_id_kept(doc, new)
    return new, {"$v": 2, "diff": log.diff()} if log.changed else None


def _run_steps(new: dict[str, object], steps: list[_Step], is_insert: bool) -> UpdateLog:
    """Apply each step to `new` in order; the log of what they did."""
    log = UpdateLog()
    for target, op, parts, value in steps:
        _STEPS.get(op, _modify_step)(new, target, op, parts, value, is_insert, log)
    return log


def _replacement_with_entry(
    doc: dict[str, Any] | None, update: Mapping[str, Any], is_insert: bool
) -> tuple[dict[str, Any], Any]:
    """A replacement logs the new document, unless it changed nothing."""
    if not is_insert:
        _check_top_level_names(update)
    new = _replace(doc, update)
    replacement = not any(k.startswith("$") for k in update)
    changed = doc is None or bson.encode(new) != bson.encode(doc)
    return new, new if replacement and changed else None


def _filters_by_identifier(array_filters: list[Any] | None) -> dict[str, Any]:
    """arrayFilters by the identifier each names (`{"x.a": ..}` belongs to `$[x]`)."""
    filters: dict[str, Any] = {}
    for spec in array_filters or ():
        for key in spec:
            filters.setdefault(key.split(".")[0], {})[key] = spec[key]
    return filters


# (the path applied to, operator, concrete path, argument)
_Step = tuple[list[str], str, list[str], Any]


def _steps(
    new: dict[str, Any],
    update: Mapping[str, Any],
    filters: Mapping[str, Any],
    query: Mapping[str, Any],
) -> list[_Step]:
    """Every (operator, concrete path, argument), in the path order they apply in (renames at
    their target)."""
    steps: list[_Step] = []
    for op, fields in update.items():
        if op not in MODIFIERS:
            raise unknown_modifier(op)
        for path, value in fields.items():
            steps += _path_steps(new, op, path, value, filters, query)
    steps.sort(key=lambda s: _path_order(s[0]))
    return steps


def _path_steps(
    new: dict[str, Any],
    op: str,
    path: str,
    value: Any,
    filters: Mapping[str, Any],
    query: Mapping[str, Any],
) -> list[_Step]:
    """One operator's steps at one path: a rename applies at its target, the others at each
    concrete path the (positional) path stands for."""
    if op == "$rename":
        return [(value.split("."), op, path.split("."), value)]
    return [
        (parts, op, parts, value) for parts in _expand(new, path.split("."), filters, query, path)
    ]


def _stored_top_level(steps: list[_Step], new: dict[str, Any]) -> dict[str, None]:
    """The top-level fields the update stores: set whole, or created."""
    return {
        t[0]: None for t, op, _, _ in steps if op != "$unset" and (len(t) == 1 or t[0] not in new)
    }


def _check_id_kept(doc: dict[str, Any] | None, new: dict[str, Any]) -> None:
    if doc is not None and "_id" in doc and not same(new.get("_id"), doc["_id"]):
        raise MongoError(
            "ImmutableField",
            "Performing an update on the path '_id' would modify the immutable field '_id'",
        )


def _check_conflicts(steps: list[_Step]) -> None:
    """Two operators may not update the same path, or a path and a part of it."""
    for a, b in zip(steps, steps[1:], strict=False):
        if b[0][: len(a[0])] == a[0]:
            raise MongoError(
                "ConflictingUpdateOperators",
                f"Updating the path '{'.'.join(b[0])}' would create a "
                f"conflict at '{'.'.join(a[0])}'",
            )


def _unset_step(
    new: dict[str, Any],
    target: list[str],
    op: str,
    parts: list[str],
    value: Any,
    is_insert: bool,
    log: UpdateLog,
) -> None:
    found, flags, _ = _lookup(new, parts)
    if found == len(parts):
        _unset(new, parts, flags, log)


def _rename_step(
    new: dict[str, Any],
    target: list[str],
    op: str,
    parts: list[str],
    value: Any,
    is_insert: bool,
    log: UpdateLog,
) -> None:
    found, flags, old = _lookup(new, parts)
    if found < len(parts):
        return
    # As RenameNode: the target is set, then the source removed.
    if flags[-1]:
        raise MongoError(
            "BadValue", f"The source field cannot be an array element, '{'.'.join(parts)}'"
        )
    _put(new, target, old, log)
    _unset(new, parts, flags, log)


def _modify_step(
    new: dict[str, Any],
    target: list[str],
    op: str,
    parts: list[str],
    value: Any,
    is_insert: bool,
    log: UpdateLog,
) -> None:
    found, flags, old = _lookup(new, parts)
    modified = modify(op, old if found == len(parts) else MISSING, value, is_insert)
    if modified is None:
        return
    result, appended = modified
    if not appended:
        _put(new, parts, result, log)
        return
    # A $push that only appended logs each new element, not the array.
    for idx in range(len(result) - appended, len(result)):
        log.add([*parts, str(idx)], [*flags, True], "u", result[idx])
    _create(new, parts, result)


_STEPS = {"$unset": _unset_step, "$rename": _rename_step}


_DBREF_FIELDS = frozenset({"$ref", "$id", "$db"})


def _check_top_level_names(fields: Mapping[str, Any]) -> None:
    """DollarPrefixedFieldName for a top-level field starting with $ that an update would store,
    unless the update inserts (an upsert that creates the document): storage_validation.cpp
    (scanDocument, validateDollarPrefixElement) and the manual's "Dollar-Prefixed Field Names"
    (a replacement, or $set of such a field, fails on an existing document; a pipeline's
    $replaceWith/$setField may store one). DBRef's $ref/$id/$db pass (their order unchecked)."""
    for name in fields:
        if name.startswith("$") and name not in _DBREF_FIELDS:
            raise MongoError(
                "DollarPrefixedFieldName",
                f"The dollar ($) prefixed field '{name}' in '{name}' is not allowed in "
                "the context of an update's replacement document. Consider using an "
                "aggregation pipeline with $replaceWith.",
            )


def _put(doc: dict[str, Any], parts: list[str], value: Any, log: UpdateLog) -> None:
    """Set `parts` to `value` and log it: updated where the path existed, else created from its
    first new part (with that part's whole new subtree)."""
    found, flags = _create(doc, parts, value)
    if found == len(parts):
        log.add(parts, flags, "u", value)
    else:
        _, _, subtree = _lookup(doc, parts[: found + 1])
        log.add(parts[: found + 1], flags[: found + 1], "i", subtree)


def _unset(doc: dict[str, Any], parts: list[str], flags: list[bool], log: UpdateLog) -> None:
    _, _, parent = _lookup(doc, parts[:-1])
    if flags[-1]:
        parent[int(parts[-1])] = None  # $unset of an array element leaves a null in its place
        log.add(parts, flags, "u", None)
    else:
        del parent[parts[-1]]
        log.add(parts, flags, "d")


def _replace(doc: Mapping[str, Any] | None, replacement: Mapping[str, Any]) -> dict[str, Any]:
    """A replacement keeps `_id` first, and may not change it."""
    out: dict[str, Any] = {}
    if doc is not None and "_id" in doc:
        out["_id"] = doc["_id"]
        _check_same_id(doc["_id"], replacement)
    out.update(replacement)
    return out


def _check_same_id(old_id: object, replacement: Mapping[str, object]) -> None:
    if "_id" in replacement and not same(replacement["_id"], old_id):
        raise MongoError(
            "ImmutableField",
            "After applying the update, the (immutable) field '_id' was found "
            "to have been altered to _id: " + repr(replacement["_id"]),
        )


def apply_update(
    doc: dict[str, Any] | None,
    update: Mapping[str, Any],
    *,
    is_insert: bool = False,
    array_filters: list[Any] | None = None,
    query: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The updated copy of `doc` (None for an upsert's new document)."""
    return update_with_entry(
        doc, update, is_insert=is_insert, array_filters=array_filters, query=query
    )[0]


def replaced_by_pipeline(doc: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, Any]:
    """The document a pipeline update stores: its result, `_id` kept (and put first) when the
    pipeline dropped it, ImmutableField when it changed it (ObjectReplaceExecutor)."""
    return _replace(doc, result)


# -- pipeline updates: the server compares the documents -----------------------------------------

_DELTA_METADATA_BYTES = (
    15  # `$v: 2` and the `diff` element around a diff (kSizeOfDeltaOplogEntryMetadata)
)


def _size(value: Any) -> int:
    return len(
        bson.encode(
            value if isinstance(value, Mapping) else {str(i): v for i, v in enumerate(value)}
        )
    )


def pipeline_entry(old: Mapping[str, Any], new: Mapping[str, Any]) -> Any:
    """The `o` of the oplog entry for a pipeline update from `old` to `new`: the diff when it is
    smaller than the document, else the whole document (a replace event); None if nothing
    changed."""
    if bson.encode(new) == bson.encode(old):
        return None
    diff = pipeline_diff(old, new)
    return {"$v": 2, "diff": diff} if diff is not None else new


def pipeline_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any] | None:
    """The diff the server logs for a pipeline update from `old` to `new`, or None when it logs the
    whole new document instead (a diff, with its metadata, no smaller than the document)."""
    return _doc_diff(old, new, _DELTA_METADATA_BYTES)


def _doc_diff(
    old: Mapping[str, Any], new: Mapping[str, Any], padding: int = 0
) -> dict[str, Any] | None:
    """computeDocDiff: both documents walked side by side; a field whose name differs from the new
    document's field at that place is deleted unless it comes again later (then it is an insert,
    which moves it); None if the diff is no smaller than `new`."""
    node = DocDiff()
    subs: dict[str, Any] = {}  # already serialized, bottom-up
    old_items, new_items = list(old.items()), list(new.items())
    i, j, gone = _diff_side_by_side(old_items, new_items, node, subs)
    node.deletes += (name for name, _ in old_items[i:])
    for name, after in new_items[j:]:
        node.inserts[name] = after
        gone.discard(name)
    node.deletes += sorted(gone, key=str.encode)
    out = node.serialize()  # the sections in the log builder's order, then the sub-diffs
    out.update(subs)
    return out if _size(out) + padding < _size(new) else None


def _diff_side_by_side(
    old_items: list[tuple[str, object]],
    new_items: list[tuple[str, object]],
    node: DocDiff,
    subs: dict[str, object],
) -> tuple[int, int, set[str]]:
    """Walk both documents while both have fields: a changed field goes into `node` (or `subs`);
    (where each walk stopped, the old names passed over)."""
    gone: set[str] = set()
    i = j = 0
    while i < len(old_items) and j < len(new_items):
        (name, before), (new_name, after) = old_items[i], new_items[j]
        if name != new_name:
            gone.add(name)
            i += 1
            continue
        if not same(before, after):
            _log_field(node, subs, name, before, after)
        i, j = i + 1, j + 1
    return i, j, gone


def _log_field(
    node: DocDiff, subs: dict[str, object], name: str, before: object, after: object
) -> None:
    kind, logged = _logged(before, after)
    if kind == "u":
        node.updates[name] = logged
    else:
        subs["s" + name] = logged


def _array_diff(old: list[Any], new: list[Any]) -> dict[str, Any] | None:
    """computeArrayDiff: index by index; a shorter array is a resize (`l`)."""
    out: dict[str, Any] = {"a": True}
    if len(old) > len(new):
        out["l"] = len(new)
    for idx, after in enumerate(new):
        before = old[idx] if idx < len(old) else MISSING
        if before is MISSING or not same(before, after):
            kind, logged = _logged(before, after)
            out[f"{kind}{idx}"] = logged
    return out if _size(out) < _size(new) else None


def _logged(before: object, after: object) -> tuple[str, object]:
    """How a changed value is logged: ("s", its sub-diff), or ("u", the new value whole)."""
    sub = _sub_diff(before, after)
    return ("u", after) if sub is None else ("s", sub)


def _sub_diff(before: Any, after: Any) -> dict[str, Any] | None:
    """The sub-diff of two documents or two arrays, or None: then the new value is logged whole."""
    if isinstance(before, dict) and isinstance(after, dict):
        return _doc_diff(before, after)
    if isinstance(before, list) and isinstance(after, list):
        return _array_diff(before, after)
    return None
