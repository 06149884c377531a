"""A change event's `updateDescription` from a `$v: 2` oplog diff: simcluster's own reading.

Written from the server's rules, separately from the engine's parser, so that the differential
tests compare two implementations (see reference_events).

Diff grammar (src/mongo/db/update/document_diff_serialization.h; mongodb-formats.md C.3):
    object diff: {u: {f: v}, i: {f: v}, d: {f: false}, s<f>: <object or array diff>}
    array diff:  {a: true, l: <new length>?, u<index>: v, s<index>: <sub-diff>}

Traversal (src/mongo/db/pipeline/change_stream_document_diff_parser.cpp,
buildUpdateDescriptionWithDeltaOplog): in an object diff, every `u` field, then every `i` field
(both to updatedFields), then every `d` field (removedFields), then the sub-diffs in the order
they appear; in an array diff, the truncation first (truncatedArrays), then the `u`/`s` entries
in the order they appear. Each section is read by its tag, wherever it sits in the diff.

disambiguatedPaths (expanded events only; same file, DeltaUpdateDescriptionBuilder): a path is
ambiguous from the first component that is a field name (not an array index) which is either
numeric by FieldRef::isNumericPathComponentStrict and not the path's first component, or
contains a dot. Array indices alone never make a path ambiguous. Each ambiguous path reported in
updatedFields, removedFields or truncatedArrays is listed, in the order reported, as its
components: array indices as integers, field names as strings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["describe_update"]


def _numeric_strict(name: str) -> bool:
    """FieldRef::isNumericPathComponentStrict: all ASCII digits, no leading zero unless "0"."""
    return (
        bool(name) and all("0" <= c <= "9" for c in name) and not (len(name) > 1 and name[0] == "0")
    )


class _Path:
    """The current path: components, whether each is an array index, and whether the path is
    ambiguous as of each component (once ambiguous, it stays so for the components below)."""

    def __init__(self) -> None:
        self.parts: list[str | int] = []
        self.ambiguous: list[bool] = []

    def push(self, part: str | int) -> None:
        if self.ambiguous and self.ambiguous[-1]:
            self.ambiguous.append(True)
        elif isinstance(part, int):
            self.ambiguous.append(False)
        else:
            numeric = len(self.parts) > 0 and _numeric_strict(part)
            self.ambiguous.append(numeric or "." in part)
        self.parts.append(part)

    def pop(self) -> None:
        self.parts.pop()
        self.ambiguous.pop()

    def dotted(self) -> str:
        return ".".join(str(p) for p in self.parts)

    def is_ambiguous(self) -> bool:
        return bool(self.ambiguous) and self.ambiguous[-1]


class _Builder:
    def __init__(self) -> None:
        self.path = _Path()
        self.updated: dict[str, Any] = {}
        self.removed: list[str] = []
        self.truncated: list[dict[str, Any]] = []
        self.disambiguated: dict[str, list[Any]] = {}

    def _note_if_ambiguous(self) -> None:
        if self.path.is_ambiguous():
            self.disambiguated[self.path.dotted()] = list(self.path.parts)

    def updated_field(self, part: str | int, value: Any) -> None:
        self.path.push(part)
        self.updated[self.path.dotted()] = value
        self._note_if_ambiguous()
        self.path.pop()

    def removed_field(self, part: str) -> None:
        self.path.push(part)
        self.removed.append(self.path.dotted())
        self._note_if_ambiguous()
        self.path.pop()

    def truncated_array(self, new_size: int) -> None:
        self.truncated.append({"field": self.path.dotted(), "newSize": new_size})
        self._note_if_ambiguous()


def _is_array_diff(diff: Any) -> bool:
    return isinstance(diff, Mapping) and diff.get("a") is True


def _object_diff(diff: Mapping[str, Any], b: _Builder) -> None:
    for name, value in diff.get("u", {}).items():
        b.updated_field(name, value)
    for name, value in diff.get("i", {}).items():
        b.updated_field(name, value)
    for name in diff.get("d", {}):
        b.removed_field(name)
    for key, sub in diff.items():
        if key.startswith("s") and len(key) > 1:
            b.path.push(key[1:])
            (_array_diff if _is_array_diff(sub) else _object_diff)(sub, b)
            b.path.pop()


def _array_diff(diff: Mapping[str, Any], b: _Builder) -> None:
    if "l" in diff:
        b.truncated_array(diff["l"])
    for key, value in diff.items():
        if key in ("a", "l"):
            continue
        index = int(key[1:])
        if key[0] == "u":
            b.updated_field(index, value)
        elif key[0] == "s":
            b.path.push(index)
            (_array_diff if _is_array_diff(value) else _object_diff)(value, b)
            b.path.pop()


def describe_update(o: Mapping[str, Any], *, expanded: bool) -> dict[str, Any]:
    """The updateDescription for an update entry's `o` (`{$v: 2, diff}`, or a legacy `$v: 1`
    `{$set, $unset}`), fields in the server's order."""
    b = _Builder()
    if o.get("$v") != 2:  # $v: 1 modifier style, from servers before 5.0: no disambiguatedPaths
        return {
            "updatedFields": dict(o.get("$set", {})),
            "removedFields": list(o.get("$unset", {})),
            "truncatedArrays": [],
        }
    _object_diff(o["diff"], b)
    out: dict[str, Any] = {
        "updatedFields": b.updated,
        "removedFields": b.removed,
        "truncatedArrays": b.truncated,
    }
    if expanded:
        out["disambiguatedPaths"] = b.disambiguated
    return out
