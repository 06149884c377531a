"""The `$v: 2` diff of an update, built as the server's log builder builds it (V2LogBuilder in
src/mongo/db/update/v2_log_builder.cpp): the paths the operators changed, then serialized with
the sections d, u, i and the sub-diffs in the order entries were logged."""

from __future__ import annotations

from typing import Any

from mongoformats.bson_order import MISSING


class DocDiff:
    """A document's sub-diff: its sections in the order entries were logged."""

    def __init__(self) -> None:
        self.deletes: list[str] = []
        self.updates: dict[str, Any] = {}
        self.inserts: dict[str, Any] = {}
        self.children: dict[str, DocDiff | ArrayDiff] = {}  # the s<name> sub-diffs, in order added

    def serialize(self) -> dict[str, object]:
        sections = {
            "d": dict.fromkeys(self.deletes, False),
            "u": self.updates,
            "i": self.inserts,
        }
        out: dict[str, Any] = {key: dict(section) for key, section in sections.items() if section}
        for name, child in self.children.items():
            out["s" + name] = child.serialize()
        return out

    def child(self, name: str) -> object:
        """What is logged at `name`: a sub-diff, a created value, or MISSING."""
        return self.children.get(name, self.inserts.get(name, MISSING))

    def adopt(self, name: str, child: DocDiff | ArrayDiff) -> None:
        self.children[name] = child

    def record(self, name: str, kind: str, value: object) -> None:
        if kind == "d":
            self.deletes.append(name)
        elif kind == "u":
            self.updates[name] = value
        else:
            self.inserts[name] = value


class ArrayDiff:
    def __init__(self) -> None:
        self.items: dict[int, Any] = {}  # index -> a new value, or a DocDiff/ArrayDiff

    def serialize(self) -> dict[str, object]:
        out: dict[str, Any] = {"a": True}
        for idx in sorted(self.items):
            item = self.items[idx]
            if isinstance(item, (DocDiff, ArrayDiff)):
                out[f"s{idx}"] = item.serialize()
            else:
                out[f"u{idx}"] = item
        return out

    def child(self, index: str) -> object:
        return self.items.get(int(index), MISSING)

    def adopt(self, index: str, child: DocDiff | ArrayDiff) -> None:
        self.items[int(index)] = child

    def record(self, index: str, kind: str, value: object) -> None:
        self.items[int(index)] = value  # array entries are u<i>, created or updated


class UpdateLog:
    """What the operators did, as the paths they changed (V2LogBuilder's tree)."""

    def __init__(self) -> None:
        self.root = DocDiff()
        self.changed = False

    def add(self, parts: list[str], in_array: list[bool], kind: str, value: Any = None) -> None:
        """Log `kind` ("u" updated, "i" created, "d" deleted) at `parts`; `in_array[j]` says whether
        parts[j] is an index into an array."""
        self.changed = True
        node: DocDiff | ArrayDiff = self.root
        for j, part in enumerate(parts[:-1]):
            child = _descend(node, part, in_array[j + 1])
            if child is None:
                return
            node = child
        node.record(parts[-1], kind, value)

    def diff(self) -> dict[str, object]:
        return self.root.serialize()


def _descend(node: DocDiff | ArrayDiff, part: str, is_array: bool) -> DocDiff | ArrayDiff | None:
    """The sub-diff at `part`, made when missing; None inside a value logged whole (a created
    subtree), which is then the final value."""
    child = node.child(part)
    if child is MISSING:
        child = ArrayDiff() if is_array else DocDiff()
        node.adopt(part, child)
    elif not isinstance(child, (DocDiff, ArrayDiff)):
        return None
    return child
