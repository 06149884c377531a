"""`$v: 2` update diffs (the oplog's update format since 5.0) -> a change event's updateDescription.

Grammar (mongodb/mongo src/mongo/db/update/document_diff_serialization.h, see
shared/reference/mongodb-formats.md C.3):
    object diff: {d: {f: false}, u: {f: v}, i: {f: v}, s<f>: <object or array diff>}
    array diff:  {a: true, l: <new length>?, u<idx>: v, s<idx>: <sub-diff>}
Mapping (change_stream_document_diff_parser): `u`/`i` -> updatedFields at dotted paths, `d` ->
removedFields, `l` -> truncatedArrays {field, newSize}. disambiguatedPaths (6.1+, expanded events
only) lists, for each reported path that a dotted string cannot describe unambiguously (an array
index, or a field name that is numeric or contains a dot), the path as an array of components
with array indices as integers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["update_description_from_diff"]


def _is_ambiguous_field(name: str) -> bool:
    return name.isdigit() or "." in name


def update_description_from_diff(diff: Mapping[str, Any], *, disambiguate: bool = False) -> dict[str, Any]:
    updated: dict[str, Any] = {}
    removed: list[str] = []
    truncated: list[dict[str, Any]] = []
    disambiguated: dict[str, list[Any]] = {}

    def note(path: list[Any], ambiguous: bool) -> str:
        dotted = ".".join(str(p) for p in path)
        if ambiguous:
            disambiguated[dotted] = list(path)
        return dotted

    def walk_object(d: Mapping[str, Any], path: list[Any], amb: bool) -> None:
        for key, value in d.items():
            if key == "d":
                for f in value:
                    removed.append(note(path + [f], amb or _is_ambiguous_field(f)))
            elif key in ("u", "i"):
                for f, v in value.items():
                    updated[note(path + [f], amb or _is_ambiguous_field(f))] = v
            elif key.startswith("s"):
                f = key[1:]
                sub_amb = amb or _is_ambiguous_field(f)
                if isinstance(value, Mapping) and value.get("a") is True:
                    walk_array(value, path + [f], sub_amb)
                else:
                    walk_object(value, path + [f], sub_amb)
            # "b" (binary diffs, newest servers) carries no path information we report.

    def walk_array(d: Mapping[str, Any], path: list[Any], amb: bool) -> None:
        for key, value in d.items():
            if key == "a":
                continue
            if key == "l":
                truncated.append({"field": note(path, amb), "newSize": value})
            elif key.startswith("u"):
                updated[note(path + [int(key[1:])], True)] = value
            elif key.startswith("s"):
                idx = int(key[1:])
                if isinstance(value, Mapping) and value.get("a") is True:
                    walk_array(value, path + [idx], True)
                else:
                    walk_object(value, path + [idx], True)

    walk_object(diff, [], False)
    out: dict[str, Any] = {"updatedFields": updated, "removedFields": removed, "truncatedArrays": truncated}
    if disambiguate:
        out["disambiguatedPaths"] = disambiguated
    return out


def post_image(before: Mapping[str, Any], description: Mapping[str, Any]) -> dict[str, Any]:
    """The document after an update, from the document before it and the event's updateDescription
    (what the server computes for `fullDocument: whenAvailable | required` from a pre-image).

    A dotted path is walked through `before`: a numeric component indexes an array, else it names
    a field; `disambiguatedPaths` (expanded events) gives the exact components when present.
    """
    import copy

    doc: Any = copy.deepcopy(dict(before))
    exact = description.get("disambiguatedPaths") or {}

    def parts(path: str) -> list[Any]:
        return list(exact[path]) if path in exact else path.split(".")

    def parent(path: str) -> tuple[Any, Any]:
        steps = parts(path)
        node = doc
        for step in steps[:-1]:
            key = _index(node, step)
            if isinstance(node, list):
                while len(node) <= key:
                    node.append(None)
                if not isinstance(node[key], (dict, list)):
                    node[key] = {}
                node = node[key]
            else:
                node = node.setdefault(key, {})
        return node, _index(node, steps[-1])

    for t in description.get("truncatedArrays") or []:
        node, key = parent(t["field"])
        del node[key][t["newSize"]:]
    for path in description.get("removedFields") or []:
        node, key = parent(path)
        if isinstance(node, dict):
            node.pop(key, None)
    for path, value in (description.get("updatedFields") or {}).items():
        node, key = parent(path)
        if isinstance(node, list):
            while len(node) <= key:
                node.append(None)
        node[key] = value
    return doc


def _index(node: Any, step: Any) -> Any:
    """A path component as the key it is in `node`: an array index, or a field name."""
    if isinstance(node, list):
        return int(step)
    return str(step)
