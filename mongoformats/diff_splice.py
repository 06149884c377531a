"""An update's `$v: 2` diff read as its change event's updateDescription, from the diff's bytes.

Why: decoding the diff into dicts, walking them and encoding the result is half the cost of an
update's splice; here no value is decoded (see update_description).
"""

from __future__ import annotations

from mongoformats.bson_bytes import _I32, _cstring_element, _string, document_of, elements

__all__ = ["update_description"]


def update_description(raw: bytes, start: int, *, expanded: bool) -> bytes | None:
    """The updateDescription document of the `$v: 2` diff at raw[start:], as bytes, read as
    update_diff.py's general path reads it (change_stream_document_diff_parser): updatedFields
    are the `u` and `i` sections' elements at their dotted paths, removedFields the names in `d`,
    truncatedArrays the `l` of array diffs, sub-diffs (`s<field>`, `s<index>`) walked in their
    order. None with expanded events (disambiguatedPaths needs every name judged) and for any
    diff whose shape or types the general path would read differently or reject (it then
    decodes the diff and reports what is wrong).

    Why: the general path decodes the diff into dicts, walks them and encodes the result, half of
    an update's splice; here no value is decoded: updatedFields' values are the server's bytes,
    copied under their new names. The usual diff, top-level sections alone (a `$set`, `$inc`,
    `$unset` ... of top-level fields), copies the `u` and `i` documents whole. A diff names each
    path once (the server writes it so); where nested sections make one path twice, the general
    path's dict keeps one entry, so such a diff goes there. One naming a top-level field in both
    `u` and `i` would keep both here.
    """
    if expanded:
        return None
    alone = _updates_alone(raw, start)
    if alone is not None:
        return alone
    return _walked(raw, elements(raw, start))


def _updates_alone(raw: bytes, start: int) -> bytes | None:
    """For `{u: {...}}` alone, the most common diff, the updateDescription: updatedFields is the
    `u` document as it is; None for any other diff."""
    size = _I32.unpack_from(raw, start)[0]
    if (
        raw[start + 4 : start + 7] == b"\x03u\x00"
        and _I32.unpack_from(raw, start + 7)[0] == size - 8
        and not raw[start + size - 1]
    ):
        return document_of(
            b"".join(
                (b"\x03updatedFields\x00", raw[start + 7 : start + size - 1], _NOTHING_REMOVED)
            )
        )
    return None


def _walked(raw: bytes, sections: _Sections) -> bytes | None:
    """The updateDescription of a diff with these top-level `sections`, walked; None if it must
    go the general way."""
    if any(t != 3 for t, _, _ in sections.values()):
        return None
    if sections.keys() <= _TOP_LEVEL_SECTIONS:
        return _top_level(raw, sections)
    paths = _Paths(raw)
    if not paths.walk_object(sections, b""):
        return None
    return _description(b"".join(paths.updated), paths.removed, paths.truncated)


def _top_level(raw: bytes, sections: _Sections) -> bytes:
    """The updateDescription of a diff of top-level sections alone: the `u` and `i` documents'
    elements copied whole (updates, then inserts, wherever they sit in the diff), `d`'s names.
    A function of its own, not a _Paths walk: it is the usual diff after `u` alone, and the
    walk's collector costs more than the copy."""
    u, i = sections.get(b"u"), sections.get(b"i")
    updated = (raw[u[1] + 4 : u[2] - 1] if u else b"") + (raw[i[1] + 4 : i[2] - 1] if i else b"")
    d = sections.get(b"d")
    return _description(updated, list(elements(raw, d[1])) if d else [], [])


def _description(updated: bytes, removed: list[bytes], truncated: list[bytes]) -> bytes:
    """The updateDescription document of these updatedFields elements, removed paths and
    truncatedArrays entries."""
    if not removed and not truncated:  # fields set, none removed, no array cut
        return b"".join(
            (
                _I32.pack(len(updated) + _USUAL_OVERHEAD),
                b"\x03updatedFields\x00",
                _I32.pack(len(updated) + 5),
                updated,
                _USUAL_TAIL,
            )
        )
    removed_fields = b"".join(
        _cstring_element(0x02, b"%d" % i, _string(field)) for i, field in enumerate(removed)
    )
    return document_of(
        b"".join(
            (
                b"\x03updatedFields\x00",
                document_of(updated),
                b"\x04removedFields\x00",
                document_of(removed_fields),
                b"\x04truncatedArrays\x00",
                document_of(b"".join(truncated)),
            )
        )
    )


_Sections = dict[bytes, tuple[int, int, int]]


class _Paths:
    """What a diff's walk collects, in the general path's order: updatedFields' elements at their
    dotted paths, removedFields' paths, truncatedArrays' entries, and the paths seen so far (a
    path met twice sends the diff the general way)."""

    __slots__ = ("raw", "updated", "removed", "truncated", "seen")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.updated: list[bytes] = []
        self.removed: list[bytes] = []
        self.truncated: list[bytes] = []
        self.seen: set[bytes] = set()

    def walk_object(self, sections: _Sections, prefix: bytes) -> bool:
        """Add an object diff's paths (under `prefix`, "" or "a.b.") in the general path's order:
        `u`, `i`, `d`, then the sub-diffs. False if it must go the general way: a section that
        is not a document, a path met twice, an array diff read otherwise."""
        if not (self._set_fields(sections, prefix) and self._remove_fields(sections, prefix)):
            return False
        return self._walk_subs(sections, prefix)

    def _walk_subs(self, sections: _Sections, prefix: bytes) -> bool:
        """Add the paths of an object diff's sub-diffs (`s<field>`), in order; False if one must
        go the general way."""
        for key, (t, v, _) in sections.items():
            if key[:1] != b"s" or len(key) == 1:
                continue  # u, i, d (read above), and what the general path ignores (`b`)
            if t != 3 or not self._walk_sub(v, prefix + key[1:]):
                return False
        return True

    def walk_array(self, sections: _Sections, path: bytes) -> bool:
        """`walk_object` for an array diff at `path`: its new length (`l`), then its entries in
        order, `u<index>` a new value, `s<index>` a sub-diff."""
        if b"l" in sections and not self._truncate(sections[b"l"], path):
            return False
        for key, (t, v, e) in sections.items():
            if key not in (b"a", b"l") and not self._array_entry(key, t, v, e, path):
                return False
        return True

    def _array_entry(self, key: bytes, t: int, v: int, e: int, path: bytes) -> bool:
        """Add one entry of an array diff at `path` (`u<index>` or `s<index>`, its value of BSON
        type `t` at raw[v:e]); False if it must go the general way."""
        letter, index = key[:1], key[1:]
        if not _int_index(index):
            return False  # the general path reads every other key's index as int() does
        at = path + b"." + index
        if letter == b"u":
            return self._update(at, t, self.raw[v:e])
        return letter != b"s" or (t == 3 and self._walk_sub(v, at))

    def _update(self, path: bytes, t: int, value: bytes) -> bool:
        if path in self.seen:
            return False
        self.seen.add(path)
        self.updated.append(b"%c%s\x00%s" % (t, path, value))
        return True

    def _set_fields(self, sections: _Sections, prefix: bytes) -> bool:
        raw = self.raw
        for name in (b"u", b"i"):
            if name in sections:
                t, v, _ = sections[name]
                if t != 3:
                    return False
                for field, (ft, fv, fe) in elements(raw, v).items():
                    if not self._update(prefix + field, ft, raw[fv:fe]):
                        return False
        return True

    def _remove_fields(self, sections: _Sections, prefix: bytes) -> bool:
        if b"d" in sections:
            t, v, _ = sections[b"d"]
            if t != 3:
                return False
            self.removed += (prefix + field for field in elements(self.raw, v))
        return True

    def _walk_sub(self, at: int, path: bytes) -> bool:
        """The sub-diff document at `at` for `path`: an array diff (`{a: true}`) or an object's."""
        raw = self.raw
        sub = elements(raw, at)
        a = sub.get(b"a")
        if a is not None and a[0] == 0x08 and raw[a[1]] == 1:
            return self.walk_array(sub, path)
        return self.walk_object(sub, path + b".")

    def _truncate(self, length: tuple[int, int, int], path: bytes) -> bool:
        t, v, e = length
        if t not in (0x01, 0x10, 0x12):  # numbers, which decode and encode back to these bytes
            return False
        field = _cstring_element(0x02, b"field", _string(path))
        size = b"%cnewSize\x00%s" % (t, self.raw[v:e])
        entry = document_of(field + size)
        self.truncated.append(_cstring_element(0x03, b"%d" % len(self.truncated), entry))
        return True


_TOP_LEVEL_SECTIONS = frozenset((b"u", b"i", b"d"))
_NOTHING_REMOVED = (
    b"\x04removedFields\x00\x05\x00\x00\x00\x00\x04truncatedArrays\x00\x05\x00\x00\x00\x00"
)
# The usual description around its updatedFields elements: the document's length less theirs,
# and what follows updatedFields' closing zero.
_USUAL_TAIL = b"\x00" + _NOTHING_REMOVED + b"\x00"
_USUAL_OVERHEAD = 4 + len(b"\x03updatedFields\x00") + 4 + len(_USUAL_TAIL)


def _int_index(index: bytes) -> bool:
    """Whether an array diff's `index` is written as int() writes it: digits, no leading 0."""
    return index.isdigit() and not (index[:1] == b"0" and len(index) > 1)
