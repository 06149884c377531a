"""The `$v: 2` diff of an update, built as the server's log builder builds it (V2LogBuilder in
src/mongo/db/update/v2_log_builder.cpp): the paths the operators changed, then serialized with
the sections d, u, i and the sub-diffs in the order entries were logged."""

from __future__ import annotations

from typing import Any

from mongoformats.bson_order import MISSING


class _DocDiff:
    """A document's sub-diff: its sections in the order entries were logged."""

    def __init__(self) -> None:
        self.deletes: list[str] = []
        self.updates: dict[str, Any] = {}
        self.inserts: dict[str, Any] = {}
        self.children: dict[
            str, _DocDiff | _ArrayDiff
        ] = {}  # the s<name> sub-diffs, in order added

    def serialize(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.deletes:
            out["d"] = dict.fromkeys(self.deletes, False)
        if self.updates:
            out["u"] = dict(self.updates)
        if self.inserts:
            out["i"] = dict(self.inserts)
        for name, child in self.children.items():
            out["s" + name] = child.serialize()
        return out


class _ArrayDiff:
    def __init__(self) -> None:
        self.items: dict[int, Any] = {}  # index -> a new value, or a _DocDiff/_ArrayDiff

    def serialize(self) -> dict[str, Any]:
        out: dict[str, Any] = {"a": True}
        for idx in sorted(self.items):
            item = self.items[idx]
            if isinstance(item, (_DocDiff, _ArrayDiff)):
                out[f"s{idx}"] = item.serialize()
            else:
                out[f"u{idx}"] = item
        return out


class _Log:
    """What the operators did, as the paths they changed (V2LogBuilder's tree)."""

    def __init__(self) -> None:
        self.root = _DocDiff()
        self.changed = False

    def add(self, parts: list[str], in_array: list[bool], kind: str, value: Any = None) -> None:
        """Log `kind` ("u" updated, "i" created, "d" deleted) at `parts`; `in_array[j]` says whether
        parts[j] is an index into an array."""
        self.changed = True
        node: _DocDiff | _ArrayDiff = self.root
        for j, part in enumerate(parts[:-1]):
            if isinstance(node, _ArrayDiff):
                child = node.items.get(int(part), MISSING)
            else:
                child = node.children.get(part, node.inserts.get(part, MISSING))
            if child is MISSING:
                child = _ArrayDiff() if in_array[j + 1] else _DocDiff()
                if isinstance(node, _ArrayDiff):
                    node.items[int(part)] = child
                else:
                    node.children[part] = child
            elif not isinstance(child, (_DocDiff, _ArrayDiff)):
                # Inside a value logged whole (a created subtree): that value is the final one.
                return
            node = child
        last = parts[-1]
        if isinstance(node, _ArrayDiff):
            node.items[int(last)] = value  # array entries are u<i>, created or updated
        elif kind == "d":
            node.deletes.append(last)
        elif kind == "u":
            node.updates[last] = value
        else:
            node.inserts[last] = value

    def diff(self) -> dict[str, Any]:
        return self.root.serialize()
