"""`$v: 2` update diffs (the oplog's update format since 5.0) -> a change event's updateDescription.

Grammar (mongodb/mongo src/mongo/db/update/document_diff_serialization.h, see
shared/reference/mongodb-formats.md C.3):
    object diff: {d: {f: false}, u: {f: v}, i: {f: v}, s<f>: <object or array diff>}
    array diff:  {a: true, l: <new length>?, u<idx>: v, s<idx>: <sub-diff>}
Mapping (change_stream_document_diff_parser): `u`/`i` -> updatedFields at dotted paths, `d` ->
removedFields, `l` -> truncatedArrays {field, newSize}. disambiguatedPaths (6.1+, expanded events
only) lists, for each reported path that a dotted string cannot describe unambiguously (a field
name that contains a dot, or a numeric one below the top level), the path as an array of
components with array indices as integers.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["update_description_from_diff"]


def _is_numeric_strict(name: str) -> bool:
    """FieldRef::isNumericPathComponentStrict: ASCII digits only, no leading zero but in "0"."""
    return name.isascii() and name.isdigit() and (len(name) == 1 or name[0] != "0")


def update_description_from_diff(
    diff: Mapping[str, Any], *, disambiguate: bool = False
) -> dict[str, Any]:
    """The server's reading (change_stream_document_diff_parser.cpp, buildUpdateDescriptionWith-
    DeltaOplog): in an object diff the `u` fields, then the `i` fields, then the `d` fields, then
    the sub-diffs in their order; in an array diff the truncation, then the entries in order.

    A path is ambiguous (listed in disambiguatedPaths) from its first field-name component that
    contains a dot or is numeric (isNumericPathComponentStrict) without being the path's first
    component; array indices alone never make it so (DeltaUpdateDescriptionBuilder::
    _appendFieldToPath; jstests/change_streams/expanded_update_description.js)."""
    updated: dict[str, Any] = {}
    removed: list[str] = []
    truncated: list[dict[str, Any]] = []
    disambiguated: dict[str, list[Any]] = {}

    def step(path: list[Any], amb: bool, part: Any) -> bool:
        """Whether the path is ambiguous once `part` (a str field or an int index) is appended."""
        if amb or isinstance(part, int):
            return amb
        return (bool(path) and _is_numeric_strict(part)) or "." in part

    def note(path: list[Any], ambiguous: bool) -> str:
        dotted = ".".join(str(p) for p in path)
        if ambiguous:
            disambiguated[dotted] = list(path)
        return dotted

    def walk(value: Any, path: list[Any], amb: bool) -> None:
        if isinstance(value, Mapping) and value.get("a") is True:
            walk_array(value, path, amb)
        else:
            walk_object(value, path, amb)

    def walk_object(d: Mapping[str, Any], path: list[Any], amb: bool) -> None:
        for section in ("u", "i"):
            for f, v in d.get(section, {}).items():
                updated[note(path + [f], step(path, amb, f))] = v
        for f in d.get("d", {}):
            removed.append(note(path + [f], step(path, amb, f)))
        for key, value in d.items():
            if key.startswith("s") and len(key) > 1:
                f = key[1:]
                walk(value, path + [f], step(path, amb, f))
        # "b" (binary diffs, newest servers) carries no path information we report.

    def walk_array(d: Mapping[str, Any], path: list[Any], amb: bool) -> None:
        if "l" in d:
            truncated.append({"field": note(path, amb), "newSize": d["l"]})
        for key, value in d.items():
            if key in ("a", "l"):
                continue
            idx = int(key[1:])
            if key.startswith("u"):
                updated[note(path + [idx], amb)] = value
            elif key.startswith("s"):
                walk(value, path + [idx], amb)

    walk_object(diff, [], False)
    out: dict[str, Any] = {
        "updatedFields": updated,
        "removedFields": removed,
        "truncatedArrays": truncated,
    }
    if disambiguate:
        out["disambiguatedPaths"] = disambiguated
    return out


def post_image(before: Mapping[str, Any], description: Mapping[str, Any]) -> dict[str, Any]:
    """The document after an update, from the document before it and the event's updateDescription
    (what the server computes for `fullDocument: whenAvailable | required` from a pre-image).

    A dotted path is walked through `before`: a numeric component indexes an array, else it names
    a field; `disambiguatedPaths` (expanded events) gives the exact components when present.
    """
    doc: Any = copy.deepcopy(dict(before))
    exact = description.get("disambiguatedPaths") or {}

    def parent(path: str) -> tuple[Any, Any]:
        return _parent(doc, list(exact[path]) if path in exact else path.split("."))

    _truncate(parent, description.get("truncatedArrays") or [])
    _remove(parent, description.get("removedFields") or [])
    _update(parent, description.get("updatedFields") or {})
    return doc


_Parent = Callable[[str], tuple[Any, Any]]


def _truncate(parent: _Parent, truncated: list[Mapping[str, Any]]) -> None:
    """Cut the arrays of the updateDescription's truncatedArrays to their new sizes."""
    for t in truncated:
        node, key = parent(t["field"])
        del node[key][t["newSize"] :]


def _remove(parent: _Parent, removed: list[str]) -> None:
    """Remove the updateDescription's removedFields."""
    for path in removed:
        node, key = parent(path)
        if isinstance(node, dict):
            node.pop(key, None)


def _update(parent: _Parent, updated: Mapping[str, object]) -> None:
    """Set the updateDescription's updatedFields (an array index past the end pads it)."""
    for path, value in updated.items():
        node, key = parent(path)
        if isinstance(node, list):
            _pad(node, key)
        node[key] = value


def _parent(doc: Any, steps: list[Any]) -> tuple[Any, Any]:
    """The node a path's last step is in, made as needed, and that step as its key there."""
    node = doc
    for step in steps[:-1]:
        node = _child(node, _index(node, step))
    return node, _index(node, steps[-1])


def _child(node: Any, key: Any) -> Any:
    """The document or array at `key` in `node`, made (a document) if it holds neither."""
    if not isinstance(node, list):
        return node.setdefault(key, {})
    _pad(node, key)
    if not isinstance(node[key], (dict, list)):
        node[key] = {}
    return node[key]


def _pad(array: list[Any], index: int) -> None:
    """Extend `array` with nulls up to `index`, as the server does for a path past its end."""
    while len(array) <= index:
        array.append(None)


def _index(node: Any, step: Any) -> Any:
    """A path component as the key it is in `node`: an array index, or a field name."""
    if isinstance(node, list):
        return int(step)
    return str(step)
