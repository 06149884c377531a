"""A batch's EventBlock written from its kinds' templates: each kind's constant bytes made once in
Python (`kind_templates`), then every taken entry's sort key and event written by one compiled
loop (`assemble`) from its template, its own values (ts, wall, token, document, documentKey,
updatedFields) and lengths. batch_splice.py's docstring says which entries, and why.
"""

from __future__ import annotations

from binascii import hexlify
from typing import Any

from buckets._columnar.numba_cache import CACHE  # picks numba's cache dir before numba loads

# isort: split
import numba
import numpy as np
import numpy.typing as npt

from buckets._columnar.batch_layout import (
    _INSERT,
    _OPS,
    _R_FIELDS,
    _R_ID_AT,
    _R_ID_BYTES,
    _R_KEY,
    _R_KEY_END,
    _R_O_END,
    _R_O_START,
    _R_OK,
    _R_OP,
    _R_SIMPLE,
    _R_STAMPS,
    _REPLACE,
    _TS_AT,
    _UPDATE,
    _WALL_AT,
)
from buckets._columnar.byte_kernels import (
    U,
    as_bytes,
    big_endian,
    byte_table,
    hex_at,
    hex_word_at,
    load_word,
    move,
    prefetch_line,
    store_byte,
    store_i32,
    store_word,
)
from buckets._columnar.diff_kernel import HEAD
from buckets._columnar.id_keys import (
    _ID_WALKED,
    _KEY_TAIL,
    _KEY_TS,
    _KIND_MASK,
    fixed_bytes,
    key_template,
    type_bits_element,
)
from mongoformats.oplog_splice import _ID_HEAD, _OP_ELEMENT

__all__ = ["assemble", "kind_templates", "wall_at"]

_Ints = npt.NDArray[np.int64]
_Bytes = npt.NDArray[np.uint8]


# The event up to its _id's hex (the token's: its length varies with the key's, see id_keys.py):
# its length, the _id element's head, the _id document's length, _data's head and length; then
# after the hex, the front's rest up to its clusterTime's value, and where each event's values go.
_ID_ELEMENT = _ID_HEAD.pack(b"\x03_id\x00", 0, b"\x02_data\x00", 0)
_HEX_AT = 4 + len(_ID_ELEMENT)
_ID_LENGTH_AT, _DATA_LENGTH_AT = 4 + 5, _HEX_AT - 4
_CLUSTER_TIME = b"\x11clusterTime\x00"
# "insert", "delete" and "update" have as many letters: their events share one layout; a
# replacement's elements after its operationType lie one byte further (`_assemble`).
assert [len(_OP_ELEMENT[op]) - len(_OP_ELEMENT["insert"]) for op in _OPS] == [0, 0, 0, 1]
_CLUSTER_TIME_AT = len(b"\x00\x00" + _OP_ELEMENT["insert"] + _CLUSTER_TIME)
_WALL_TIME = b"\x09wallTime\x00"
_COLLECTION_UUID = b"\x05collectionUUID\x00"
_UUID_VALUE_BYTES = 21  # a binary value: its length, subtype 4, 16 bytes
_FULL_DOCUMENT = b"\x03fullDocument\x00"
_DOCUMENT_KEY = b"\x03documentKey\x00"
_UPDATED_FIELDS = b"\x03updatedFields\x00"
# An update's event after its documentKey: updateDescription's header, its length (zeros here),
# updatedFields' header; and, for a diff the block reads (`u` and `i` alone), what follows
# updatedFields' elements to the end.
_UPDATE_HEAD = b"\x03updateDescription\x00" + bytes(4) + _UPDATED_FIELDS
_SIMPLE_REST = (
    b"\x00\x04removedFields\x00\x05\x00\x00\x00\x00"
    b"\x04truncatedArrays\x00\x05\x00\x00\x00\x00\x00\x00"
)
_END = b"\x00"
_P_SIMPLE_REST = as_bytes(_SIMPLE_REST)
_P_KEY_TAIL = as_bytes(_KEY_TAIL)
_UPDATED_FIELDS_BYTES = len(_UPDATED_FIELDS)
# A kind's templates: its sort key up to the _id's value, its event's front up to the hex's
# varying part, the front's rest, the tail up to the documentKey's value, what follows that; and
# its token's `_typeBits` element (in the front's rest already: its length is what is read).
_PARTS, _TYPED = 6, 5


def _front_templates(
    op: str, key: bytes, ui: bytes, expanded: bool, fixed: int, typed: bytes
) -> tuple[bytes, bytes]:
    """A kind's event up to its document (an insert's or replacement's fullDocument header ends
    it), in two parts: up to where its token's hex differs from event to event (the hex of its
    key template, the key's part that every event of the kind shares), and from the hex's end
    on; with zeros (in the hex too) where each event's lengths, ts and wall go. A kind whose
    keys are `fixed` bytes longer than its template each (an ObjectId's or UUID's) has it all in
    the first part, with room for the hex: one copy an event. `typed` is the token's
    `_typeBits` element."""
    head = _FRONT_HEAD + hexlify(key).upper()
    rest = b"".join(
        (b"\x00", typed, _REST_OP[op], _COLLECTION_UUID + ui if expanded else b"", _REST_WALL[op])
    )
    return (head + bytes(2 * fixed) + rest, b"") if fixed else (head, rest)


# A front's constant parts (made once: the templates are made for every kind of every batch):
# before the hex; after the token's _typeBits up to collectionUUID's place; the rest.
_FRONT_HEAD = bytes(4) + _ID_ELEMENT
_REST_OP = {op: b"\x00" + _OP_ELEMENT[op] + _CLUSTER_TIME + bytes(8) for op in _OPS}
_REST_WALL = {
    op: _WALL_TIME + bytes(8) + (_FULL_DOCUMENT if op in ("insert", "replace") else b"")
    for op in _OPS
}


def wall_at(expanded: bool) -> int:
    """Where a front's wallTime value is in its rest (collectionUUID comes before it in expanded
    events)."""
    return (
        _CLUSTER_TIME_AT
        + 8
        + (len(_COLLECTION_UUID) + _UUID_VALUE_BYTES if expanded else 0)
        + len(_WALL_TIME)
    )


def kind_templates(
    ops: list[str], made: list[Any], id_kinds: list[int], expanded: bool
) -> tuple[_Bytes, _Ints]:
    """Each kind's templates (_PARTS of them), back to back, and where each starts: its sort key
    up to the _id's value (id_keys.py), its event's front in two parts (up to its document: an
    insert's or replacement's fullDocument header ends it), its tail up to the documentKey's value
    (ns, documentKey's header) and after it (an update's updateDescription header, or the event's
    end), with zeros where each event's own values go."""
    parts: list[bytes] = []
    for op, h, id_kind in zip(ops, made, id_kinds, strict=True):
        if not h:  # (a kind none of whose entries is taken: no event refers to it)
            parts += (b"",) * _PARTS
            continue
        key = key_template(op, h[3], id_kind & _KIND_MASK)
        typed = type_bits_element(id_kind)
        parts += (
            key,
            *_front_templates(op, key, h[2], expanded, fixed_bytes(id_kind), typed),
            h[1][0] + _DOCUMENT_KEY,
            _UPDATE_HEAD if op == "update" else _END,
            typed,
        )
    return byte_table(parts)


_KEY_END = _KEY_TAIL[-1]
# The hex of a key's tail (six digits), as two overlapping little-endian int32s: its first four
# digits and its last four.
_HEX_TAIL = tuple(
    int.from_bytes(part, "little") for part in (hexlify(_KEY_TAIL)[:4], hexlify(_KEY_TAIL)[-4:])
)
assert len(_KEY_TAIL) == 3
_PREFETCH_BYTES = 4096  # of an entry's o, asked for ahead (see `assemble`)


@numba.njit(inline="always")
def _placed(sizes: _Ints, cuts: _Ints, gaps: _Ints) -> tuple[_Ints, _Ints]:
    """The offsets of events of `sizes` with those of `gaps` put in (gap j before event
    cuts[j]), and each event's row among them."""
    m, g = len(sizes), len(cuts)
    offsets = np.zeros(m + g + 1, np.int64)
    places = np.empty(m, np.int64)
    j, placed = 0, 0
    for i in range(U(m + 1)):
        while (j < g) and (cuts[U(j)] == i):
            offsets[U(placed + 1)] = offsets[U(placed)] + gaps[U(j)]
            j, placed = j + 1, placed + 1
        if i < m:
            places[i] = placed
            offsets[U(placed + 1)] = offsets[U(placed)] + sizes[i]
            placed += 1
    return offsets, places


@numba.njit(cache=CACHE, nogil=True)
def assemble(
    d: _Bytes,
    ids: _Bytes,
    taken: _Ints,
    rows: _Ints,
    which: _Ints,
    templates: _Bytes,
    at: _Ints,
    described: _Bytes,
    described_at: _Ints,
    described_size: _Ints,
    wall_at: int,
    cuts: _Ints,
    gaps: _Ints,
    least_width: int,
) -> tuple[_Bytes, _Bytes, _Ints]:
    """The taken entries' sort keys (rows padded with zeros to the longest's width, see
    id_keys.py) and events (their bytes back to back, and offsets). Each key is its kind's key
    template (`templates` from at[_PARTS k], see `kind_templates`) with its ts, then its `_id`'s
    bytes (an ObjectId's or UUID's in d, a walked key's elements in `ids`: see batch_layout's
    _R_ID_AT) and the key's tail. Each event is its kind's other templates with its own lengths,
    token (its key's hex), ts and wall written in, then its document (an insert's or
    replacement's), its documentKey, its updatedFields (an update's: its diff's `u` and `i`
    elements, or for entry r's other diffs its description, described_size[r] bytes from
    described_at[r] in `described`, less the HEAD bytes its template holds) and what closes it.
    Two passes: sizes, then bytes.

    Room is left for other events (a batch's transactions', txn_events.put_in writes them): the
    j-th, of gaps[j] bytes, before the cuts[j]-th taken entry's (cuts in order; len(taken): at
    the end), its key row left zeros, the rows at least `least_width` wide; each such row
    comes before the taken entries' from there on, as they would be put in after."""
    m, g = len(taken), len(cuts)
    sizes = np.empty(m, np.int64)
    lengths = np.empty(m, np.int64)
    for i in range(U(m)):
        r, k = U(taken[i]), U(_PARTS * which[U(taken[i])])
        # the key: its template, the _id's bytes, the tail
        n = at[k + 1] - at[k] + rows[r, _R_ID_BYTES] + len(_P_KEY_TAIL)
        lengths[i] = n
        # its front up to the hex's end (or its first part, which holds the hex, see
        # `_front_templates`), its other templates, its documentKey
        size = max(at[k + 2] - at[k + 1], _HEX_AT + 2 * n) + at[k + _TYPED] - at[k + 2]
        size += rows[r, _R_KEY_END] - rows[r, _R_KEY]
        if (rows[r, _R_OP] == _INSERT) | (rows[r, _R_OP] == _REPLACE):
            size += rows[r, _R_O_END] - rows[r, _R_O_START]
        elif rows[r, _R_OP] == _UPDATE:
            size += (
                4
                + rows[r, _R_FIELDS + 1]
                - rows[r, _R_FIELDS]
                + rows[r, _R_FIELDS + 3]
                - rows[r, _R_FIELDS + 2]
                + len(_P_SIMPLE_REST)
                if rows[r, _R_SIMPLE]
                else described_size[r] - HEAD + 1
            )
        sizes[i] = size
    offsets, places = _placed(sizes, cuts, gaps)
    width = max(lengths.max() if m else 0, least_width)
    keys = np.zeros((m + g) * width, np.uint8)
    out = np.empty(offsets[m + g], np.uint8)
    # The event's parts are written through addresses (byte_kernels' move, store_i32), inlined:
    # a call to a cached kernel per part (or one that takes the arrays) costs more than a copy.
    # (as signed integers, as the offsets added to them are: numba makes a float of a sum of
    # a signed and an unsigned integer)
    template_at, d_at = np.int64(templates.ctypes.data), np.int64(d.ctypes.data)
    keys_at, out_at = np.int64(keys.ctypes.data), np.int64(out.ctypes.data)
    ids_at, described_data_at = np.int64(ids.ctypes.data), np.int64(described.ctypes.data)
    for i in range(U(m)):
        # The lines of the entry two ahead that are copied (its o's first _PREFETCH_BYTES, its
        # documentKey, its stamps), asked for now: a backlog's entries come from memory, and a
        # document's copy waits on each of its lines in turn until the CPU's own prefetch
        # follows it (a long document's rest: asked for a line at a time, it would fill the
        # CPU's queue of fetches).
        ahead = U(taken[min(i + U(2), U(m - 1))])
        start, stamps_end = rows[ahead, _R_O_START], rows[ahead, _R_STAMPS] + 48
        for line in range(
            U(d_at + start), U(d_at + min(stamps_end, start + _PREFETCH_BYTES)), U(64)
        ):
            prefetch_line(line)
        prefetch_line(U(d_at + rows[ahead, _R_KEY]))
        prefetch_line(U(d_at + stamps_end - 48))
        prefetch_line(U(d_at + stamps_end - 1))
        r, k = U(taken[i]), U(_PARTS * which[U(taken[i])])
        op, o_start, o_end, stamps = (
            rows[r, _R_OP],
            rows[r, _R_O_START],
            rows[r, _R_O_END],
            rows[r, _R_STAMPS],
        )
        row = U(places[i])
        key, n, fixed = keys_at + np.int64(row) * width, lengths[i], at[k + 1] - at[k]
        # The key: its kind's template, its ts (seconds, then increment, big-endian: the
        # entry's little-endian word's bytes reversed), its _id's bytes, its tail (zeros but its
        # last byte).
        move(key, template_at + at[k], fixed)
        ts = big_endian(load_word(U(d_at + stamps + _TS_AT)))
        store_word(U(key + _KEY_TS), ts)
        source = ids_at if rows[r, _R_OK] & _KIND_MASK == _ID_WALKED else d_at
        id_at, id_bytes = source + rows[r, _R_ID_AT], rows[r, _R_ID_BYTES]
        move(key + fixed, id_at, id_bytes)
        store_byte(key + n - 1, _KEY_END)
        # The event: its front up to the hex's varying part, its lengths, the hex, the rest.
        e, stop = offsets[row], offsets[row + 1]
        front = at[k + 2] - at[k + 1]
        move(out_at + e, template_at + at[k + 1], front)
        store_i32(out_at + e, stop - e)
        typed = at[k + _TYPED + 1] - at[k + _TYPED]
        store_i32(out_at + e + _ID_LENGTH_AT, 2 * n + 17 + typed)
        store_i32(out_at + e + _DATA_LENGTH_AT, 2 * n + 1)
        # The hex of the key's varying parts, from where they were read (not from the key just
        # written: a word read across the smaller stores that wrote it waits for them): its ts,
        # its _id's bytes, its tail.
        hex_word_at(out_at + e + _HEX_AT + 2 * _KEY_TS, ts)
        hex_at(out_at + e + _HEX_AT + 2 * fixed, id_at, id_bytes)
        store_i32(out_at + e + _HEX_AT + 2 * (n - len(_KEY_TAIL)), _HEX_TAIL[0])
        store_i32(out_at + e + _HEX_AT + 2 * n - 4, _HEX_TAIL[1])
        # The front's rest, after the hex (in the first part, for a fixed-size key's kind)
        rest, rest_at = at[k + 3] - at[k + 2], e + _HEX_AT + 2 * n
        move(out_at + rest_at, template_at + at[k + 2], rest)
        # (after the token's _typeBits; a replacement's operationType is a letter longer)
        stamps_at = out_at + rest_at + typed + (op == _REPLACE)
        move(stamps_at + _CLUSTER_TIME_AT, d_at + stamps + _TS_AT, 8)
        move(stamps_at + wall_at, d_at + stamps + _WALL_AT, 8)
        e = max(e + front, rest_at) + rest
        if (op == _INSERT) | (op == _REPLACE):  # fullDocument: the insert's or replacement's o
            move(out_at + e, d_at + o_start, o_end - o_start)
            e += o_end - o_start
        # ns and documentKey's header, the documentKey, what follows it
        tail = at[k + 4] - at[k + 3]
        move(out_at + e, template_at + at[k + 3], tail)
        move(out_at + e + tail, d_at + rows[r, _R_KEY], rows[r, _R_KEY_END] - rows[r, _R_KEY])
        e += tail + rows[r, _R_KEY_END] - rows[r, _R_KEY]
        tail = at[k + 5] - at[k + 4]
        move(out_at + e, template_at + at[k + 4], tail)
        e += tail
        if op != _UPDATE:
            continue
        # After an update's documentKey: updateDescription's header, its length and
        # updatedFields' header (the tail's end), then its updatedFields and what closes it.
        store_i32(out_at + e - 4 - _UPDATED_FIELDS_BYTES, stop - e - 1 + 4 + _UPDATED_FIELDS_BYTES)
        if rows[r, _R_SIMPLE]:  # updatedFields' length, u's elements, i's, what closes it
            u, u_end = rows[r, _R_FIELDS], rows[r, _R_FIELDS + 1]
            i_at, i_end = rows[r, _R_FIELDS + 2], rows[r, _R_FIELDS + 3]
            store_i32(out_at + e, stop - e - len(_P_SIMPLE_REST) + 1)
            move(out_at + e + 4, d_at + u, u_end - u)
            move(out_at + e + 4 + u_end - u, d_at + i_at, i_end - i_at)
            for j in range(U(len(_P_SIMPLE_REST))):  # (inlined: a call counts references)
                store_byte(out_at + stop - len(_P_SIMPLE_REST) + j, _P_SIMPLE_REST[j])
        else:  # its description, less what the template holds, and the event's closing zero
            move(out_at + e, described_data_at + described_at[r] + HEAD, stop - e - 1)
            store_byte(out_at + stop - 1, 0)
    return keys.reshape(m + g, width), out, offsets
