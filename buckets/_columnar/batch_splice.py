"""A batch of oplog entries spliced into events at once: plain inserts, updates and deletes in
compiled loops (numba, buckets/_columnar/byte_kernels.py), the rest one by one.

Why: `splice_crud`'s cost in Python is spread over its lines, none standing out, so no
per-entry rewrite in Python gets much below it. But the inserts
(and deletes, and the usual updates) of a backlog are alike: the same element order, the same
constant bytes, differing only in a few values (ts, the _id's ObjectId, wall, the document) and
in lengths. So a compiled loop reads each entry's elements where they must lie (`_layout`), the
entries are grouped by what their op, ns and ui make of them (their kind: a batch holds a
handful), Python makes each kind's templates once (the event's constant bytes), and a second
loop writes every event into one buffer, its own values (token, clusterTime, wallTime, document,
updatedFields) into its kind's template (`_assemble`): two passes over the batch, where numpy
array operations over it took a few dozen (benchmarks/README.md). An update's updatedFields
is, for the usual diff (`{u: {...}}` alone), the diff's `u` document, copied as an insert's
document is; other diffs are made one by one by `update_description` and copied in.

Which entries: single inserts, updates and deletes whose documentKey is `{_id: ObjectId}`
(drivers give every document one; a TTL index's deletes have it), in the field order a server
writes them, with or without a retryable write's session fields:

    {lsid?, txnNumber?, op: "i", ns, ui, o, o2: {_id}, stmtId?, ts, t, v, wall, prevOpTime?}
    {lsid?, txnNumber?, op: "u", ns, ui, o: {$v: 2, diff}, o2: {_id}, stmtId?, ts, t, v, wall, prevOpTime?}
    {lsid?, txnNumber?, op: "d", ns, ui, o: {_id}, stmtId?, ts, t, v, wall, prevOpTime?}

and of updates, those whose diff `update_description` takes (top-level sections, no expanded
events). Every other entry (replacements, other keys, nested diffs, transactions, DDL, noops, a
field out of place) gets None here and goes through `splice_crud` or the general transform, as
before. An entry taken here gives exactly `splice_crud`'s event (tests compare the two on random
and broken entries): every boundary is derived from the entry's BSON lengths, and it is only
taken if it is exactly that sequence of elements.
"""

from __future__ import annotations

import struct
from binascii import hexlify
from typing import Any

import bson

from buckets._columnar.numba_cache import CACHE  # picks numba's cache dir before numba loads

# isort: split
import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from buckets._columnar.byte_kernels import U, as_bytes, copy, has, hex_digits, i32, put_i32, u8, u64
from buckets._columnar.event_block import EventBlock
from buckets._columnar.oplog_batch import OplogBatch, reply_batch
from mongoformats.oplog_splice import (
    _ID_HEAD,
    _OP_ELEMENT,
    _OP_HEAD,
    _OP_IDENT,
    _TOKEN_HEAD,
    _UI_HEAD,
    Spliced,
    _fixed_head,
    byte_slices,
    splice_crud,
    update_description,
)

__all__ = ["BATCH_MIN", "splice_block", "splice_entries", "warm_up"]

BATCH_MIN = (
    128  # fewer entries are spliced one by one: numpy's fixed cost per call outweighs its gain
)
BLOCK_RUN_MIN = (
    32  # a shorter run of events between others (noops, DDL) goes as tuples, not a block
)

_Ints = npt.NDArray[np.int64]
_Words = npt.NDArray[np.uint64]
_Bytes = npt.NDArray[np.uint8]

_NS = b"\x02ns\x00"
_HEAD_BYTES = len(_OP_HEAD) + 2 + len(_NS)  # op's element (its one-letter value), ns's header
_OPS = {ord("i"): "insert", ord("d"): "delete", ord("u"): "update"}
_LSID = b"\x03lsid\x00"
_TXN_NUMBER = b"\x12txnNumber\x00"
_O = b"\x03o\x00"
_O2 = b"\x03o2\x00"
# An update's o up to its diff's value: {$v: 2, diff: ...} (the diff is o's last element).
_V2_DIFF = b"\x10$v\x00\x02\x00\x00\x00\x03diff\x00"
_OID_KEY = b"\x16\x00\x00\x00\x07_id\x00"  # a 22-byte document of one ObjectId _id: the documentKey
_OID_KEY_BYTES = 22
_STMT_ID = b"\x10stmtId\x00"
_PREV_OP_TIME = b"\x03prevOpTime\x00"
# ts, t, v and wall follow, each 8 bytes (its header's offset from ts's, the header).
_STAMPS = ((0, b"\x11ts\x00"), (12, b"\x12t\x00"), (23, b"\x12v\x00"), (34, b"\x09wall\x00"))
_TS_AT, _WALL_AT, _STAMP_BYTES = 4, 40, 48

# The resume token's KeyString (the sort key; see splice_crud): 0x82, the ts (seconds, then
# increment, big-endian), the token's fixed head, the collection's UUID (19 bytes: 0x5a, its
# length, subtype 4, the 16 bytes), the operation, the ObjectId, the end.
_KEY_OID_HEAD = b"\x46\x64_id\x00\x64"
_KEY_TS = 1
# "insert", "delete" and "update" have as many letters: their tokens and events have one layout.
assert (
    len({len(_OP_IDENT[op]) for op in _OPS.values()})
    == len({len(_OP_ELEMENT[op]) for op in _OPS.values()})
    == 1
)
_KEY_OID = _KEY_TS + 8 + len(_TOKEN_HEAD) + 19 + len(_OP_IDENT["insert"]) + len(_KEY_OID_HEAD)
_KEY_BYTES = _KEY_OID + 12 + 3
# The event up to its fullDocument's value: its length, _id (the token's hex), operationType,
# clusterTime, collectionUUID (expanded events only), wallTime; then where the per-event values go.
_HEX_BYTES = 2 * _KEY_BYTES
_ID_ELEMENT = _ID_HEAD.pack(b"\x03_id\x00", _HEX_BYTES + 17, b"\x02_data\x00", _HEX_BYTES + 1)
_HEX_AT = 4 + len(_ID_ELEMENT)
_CLUSTER_TIME_AT = (
    _HEX_AT + _HEX_BYTES + len(b"\x00\x00" + _OP_ELEMENT["insert"] + b"\x11clusterTime\x00")
)
_OP_CODE_AT = len(_OP_HEAD)  # in the head: the op's letter
_WALL_TIME = b"\x09wallTime\x00"
_COLLECTION_UUID = b"\x05collectionUUID\x00"
_UUID_VALUE_BYTES = 21  # a binary value: its length, subtype 4, 16 bytes
_FULL_DOCUMENT = b"\x03fullDocument\x00"
_DOCUMENT_KEY = b"\x03documentKey\x00"
_UPDATED_FIELDS = b"\x03updatedFields\x00"
# An update's event after its documentKey: updateDescription's header, its length (zeros here),
# updatedFields' header; and, for a diff of `u` alone, what follows updatedFields to the end.
_UPDATE_HEAD = b"\x03updateDescription\x00" + bytes(4) + _UPDATED_FIELDS
_SIMPLE_REST = (
    b"\x04removedFields\x00\x05\x00\x00\x00\x00\x04truncatedArrays\x00\x05\x00\x00\x00\x00\x00\x00"
)
_END = b"\x00"
# What follows the updatedFields of: an insert or a delete (none), a simple update, another update.
_CLOSINGS = (b"", _SIMPLE_REST, _END)
# In an update's o: where its diff's value is; where a diff of `u` alone has the `u` document.
_DIFF_AT = 4 + len(_V2_DIFF)
_U_AT = _DIFF_AT + 7
_HEX_DIGITS = np.frombuffer(b"0123456789ABCDEF", np.uint8)


def _key_template(op: str, uuid_ks: bytes) -> bytes:
    """A kind's sort key, with zeros where each event's ts and ObjectId go."""
    return b"".join(
        (
            b"\x82",
            bytes(8),
            _TOKEN_HEAD,
            uuid_ks,
            _OP_IDENT[op],
            _KEY_OID_HEAD,
            bytes(12),
            b"\x00\x00\x04",
        )
    )


def _front_template(op: str, key: bytes, ui: bytes, expanded: bool) -> bytes:
    """A kind's event up to its document (an insert's fullDocument header ends it), with zeros
    (in the hex too) where each event's length, ts, ObjectId and wall go."""
    uuid = _COLLECTION_UUID + ui if expanded else b""
    return b"".join(
        (
            bytes(4),
            _ID_ELEMENT,
            hexlify(key).upper(),
            b"\x00\x00",
            _OP_ELEMENT[op],
            b"\x11clusterTime\x00",
            bytes(8),
            uuid,
            _WALL_TIME,
            bytes(8),
            _FULL_DOCUMENT if op == "insert" else b"",
        )
    )


def _wall_at(expanded: bool) -> int:
    """Where a front's wallTime value is (collectionUUID comes before it in expanded events)."""
    return (
        _CLUSTER_TIME_AT
        + 8
        + (len(_COLLECTION_UUID) + _UUID_VALUE_BYTES if expanded else 0)
        + len(_WALL_TIME)
    )


def _made_of(head: bytes) -> Any:
    """What an entry's bytes from op to ui make of its event (see `_fixed_head`); None, for the
    one-by-one path to report, if its namespace is not UTF-8."""
    try:
        return _fixed_head(head)[0]
    except UnicodeDecodeError:
        return None


def splice_block(
    batch: OplogBatch, *, expanded: bool
) -> tuple[list[Spliced | tuple[()] | None], EventBlock | None, npt.NDArray[np.intp]]:
    """The events of the plain inserts, updates and deletes this module takes, as one EventBlock
    (the second item; None if there are none) and the indices of their entries (the third, an
    array: a batch the block holds whole never needs them as Python integers); and for each entry
    (the first), () for one of an internal namespace, or None for one the block holds or the
    caller must transform (what `splice_crud` says of it)."""
    n, data = len(batch), batch.data
    d = as_bytes(data)
    rows, which, firsts = _layouts(d, batch.starts, batch.lengths, expanded)
    ok = rows[:, _R_OK].astype(np.bool_)
    update, simple = ok & (rows[:, _R_OP] == _UPDATE), rows[:, _R_SIMPLE].astype(np.bool_)

    # Other updates' updateDescription is made one by one (diffs differ in shape); a diff that
    # `update_description` does not take leaves its entry to splice_crud.
    descriptions: dict[int, bytes] = {}
    if update.any():
        tried = {
            i: _description(data, s, e, diff, expanded)
            for i, s, e, diff in zip(
                *(
                    a[update & ~simple].tolist()
                    for a in (
                        np.arange(n),
                        batch.starts,
                        batch.starts + batch.lengths,
                        rows[:, _R_O_START] + _DIFF_AT,
                    )
                ),
                strict=True,
            )
        }
        ok[[i for i, made_here in tried.items() if made_here is None]] = False
        descriptions = {i: made_here for i, made_here in tried.items() if made_here is not None}

    out: list[Spliced | tuple[()] | None] = [None] * n
    # What each kind's op, ns and ui make of its events (the namespace's parts, the UUID), found
    # once per kind: a batch's entries share a handful.
    cut = byte_slices(data)
    made = [
        _made_of(cut[start:stop]) for start, stop in rows[firsts][:, [_R_P, _R_HEAD_END]].tolist()
    ]
    keep = np.fromiter(map(bool, made), np.bool_, len(made))
    if not keep.all():
        dropped = ok & ~keep[which]
        for i, kind in zip(np.flatnonzero(dropped).tolist(), which[dropped].tolist(), strict=True):
            out[i] = made[
                kind
            ]  # () for an internal namespace; None for a view's (the general path)
        ok &= ~dropped
    taken = np.flatnonzero(ok)
    if not len(taken):
        return out, None, taken

    # Each kind's templates: its sort key, its event's front (up to its document: an insert's
    # fullDocument header ends it) and its tail (ns, documentKey, an update's updateDescription
    # header), with zeros where each event's own values go.
    ops = [_OPS[h[0][0]] if h else "insert" for h in made]
    parts: list[bytes] = []
    for op, h in zip(ops, made, strict=True):
        if not h:  # (a kind none of whose entries is taken: no event refers to it)
            parts += (b"", b"", b"")
            continue
        key = _key_template(op, h[3])
        parts += (
            key,
            _front_template(op, key, h[2], expanded),
            h[1][0]
            + _DOCUMENT_KEY
            + _OID_KEY
            + (bytes(13) + _UPDATE_HEAD if op == "update" else bytes(14)),
        )
    at = np.zeros(len(parts) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, parts), np.int64, len(parts)), out=at[1:])
    # Other updates' updatedFields and closing, made above (less their headers, then the end).
    extras = (
        [
            descriptions[i][4 + len(_UPDATED_FIELDS) :] + _END if i in descriptions else b""
            for i in taken.tolist()
        ]
        if descriptions
        else []
    )
    extra_at = np.zeros(len(taken) + 1, np.int64)
    if extras:
        np.cumsum(np.fromiter(map(len, extras), np.int64, len(extras)), out=extra_at[1:])
    keys, events, offsets = _assemble(
        d,
        taken,
        rows,
        which,
        as_bytes(b"".join(parts)),
        at,
        as_bytes(b"".join(extras) or b"\0"),
        extra_at,
        _wall_at(expanded),
    )
    column = pa.Array.from_buffers(
        pa.large_binary(), len(taken), [None, pa.py_buffer(offsets), pa.py_buffer(events)]
    )
    kind_table = tuple(
        (op, h[1][1], h[1][2], h[1][3]) if h else ("", "", "", ())
        for op, h in zip(ops, made, strict=True)
    )
    return out, EventBlock(keys, column, which[taken].astype(np.int32), kind_table), taken


# Byte patterns the kernels look for, as arrays (numba takes a global array as a constant).
_P_LSID, _P_TXN_NUMBER, _P_OP_HEAD, _P_NS, _P_UI_HEAD = map(
    as_bytes, (_LSID, _TXN_NUMBER, _OP_HEAD, _NS, _UI_HEAD)
)
_P_O, _P_O2, _P_V2_DIFF, _P_U, _P_OID_KEY = map(
    as_bytes, (_O, _O2, _V2_DIFF, b"\x03u\x00", _OID_KEY)
)
_P_STMT_ID, _P_PREV_OP_TIME, _P_SIMPLE_REST = map(as_bytes, (_STMT_ID, _PREV_OP_TIME, _SIMPLE_REST))
_P_TS, _P_T, _P_V, _P_WALL = (as_bytes(h) for _, h in _STAMPS)
_TS_OFFSET, _T_OFFSET, _V_OFFSET, _WALL_OFFSET = (offset for offset, _ in _STAMPS)
_UPDATED_FIELDS_BYTES = len(_UPDATED_FIELDS)
_UPDATE_HEAD_BYTES = len(_UPDATE_HEAD)
_TXN_NUMBER_BYTES = len(_TXN_NUMBER)
_O2_BYTES = len(_O2)
_NS_BYTES = len(_NS)
_UI_ELEMENT_BYTES = len(_UI_HEAD) + 16
_STMT_ID_BYTES = len(_STMT_ID)
_PREV_OP_TIME_BYTES = len(_PREV_OP_TIME)

# The layout kernel's columns: one row per entry.
_R_OK, _R_OP, _R_P, _R_HEAD_END, _R_O_START, _R_O_END, _R_KEY, _R_STAMPS, _R_SIMPLE = range(
    _ROW_WIDTH := 9
)
_INSERT, _DELETE, _UPDATE = 0, 1, 2


@numba.njit(cache=CACHE)
def _layout(d: _Bytes, start: int, length: int, expanded: bool, row: _Ints) -> None:
    """Fill `row` with where an entry's parts are if it is one this module takes (row[_R_OK] = 1),
    checking each element where it must start, as splice_crud's fixed layout does; every boundary
    comes from the entry's own lengths, so it is taken only if it is exactly that sequence."""
    end = start + length - 1  # where its terminating zero must be
    if length < 5 + _HEAD_BYTES + 4 or u8(d, end) != 0:
        return
    p = start + 4
    if has(d, p, _P_LSID):  # a retryable write's lsid and txnNumber lead (OplogEntryBase's order)
        lsid = i32(d, start + 10)
        if lsid < 5 or lsid > length - 40:
            return
        p = start + 10 + lsid
        if not has(d, p, _P_TXN_NUMBER):
            return
        p += _TXN_NUMBER_BYTES + 8
    if not has(d, p, _P_OP_HEAD) or u8(d, p + _OP_CODE_AT + 1) != 0:
        return
    code = u8(d, p + _OP_CODE_AT)
    op = (
        _INSERT if code == 105 else _DELETE if code == 100 else _UPDATE if code == 117 else -1
    )  # i, d, u
    if op < 0 or not has(d, p + _HEAD_BYTES - _NS_BYTES, _P_NS):
        return
    ns = i32(d, p + _HEAD_BYTES)
    if ns < 2 or ns > end - p:
        return
    ui = p + _HEAD_BYTES + 4 + ns
    head_end = ui + _UI_ELEMENT_BYTES
    if not has(d, ui, _P_UI_HEAD) or not has(d, head_end, _P_O):
        return
    o_start = head_end + 3
    o_length = i32(d, o_start)
    if o_length < 5 or o_length > end - o_start:
        return
    o_end = o_start + o_length
    simple = False
    if op == _UPDATE:  # o is {$v: 2, diff}, the diff ending where o does
        diff = o_start + _DIFF_AT
        diff_length = i32(d, diff)
        if (
            diff_length < 5
            or diff_length > o_end - diff - 1
            or not has(d, o_start + 4, _P_V2_DIFF)
            or diff + diff_length + 1 != o_end
            or u8(d, o_end - 1) != 0
        ):
            return
        # The usual diff, `{u: {...}}` alone (a $set of existing top-level fields): its `u`
        # document, which ends where the diff does, is the event's updatedFields as it is.
        if not expanded and has(d, diff + 4, _P_U):
            u_length = i32(d, o_start + _U_AT)
            simple = (
                5 <= u_length <= diff_length - 8
                and o_start + _U_AT + u_length == o_end - 2
                and u8(d, o_end - 3) == 0
            )
    # An insert's and an update's o2 is its documentKey (an insert's o its document); a delete's o is it.
    if op == _DELETE:
        key = o_start
        if o_end != o_start + _OID_KEY_BYTES:
            return
    else:
        key = o_end + _O2_BYTES
        if not has(d, o_end, _P_O2):
            return
    if not has(d, key, _P_OID_KEY) or u8(d, key + _OID_KEY_BYTES - 1) != 0:
        return
    stamps = key + _OID_KEY_BYTES
    if has(d, stamps, _P_STMT_ID):
        stamps += _STMT_ID_BYTES + 4
    if not (
        has(d, stamps + _TS_OFFSET, _P_TS)
        and has(d, stamps + _T_OFFSET, _P_T)
        and has(d, stamps + _V_OFFSET, _P_V)
        and has(d, stamps + _WALL_OFFSET, _P_WALL)
    ):
        return
    after = stamps + _STAMP_BYTES
    if after != end:  # prevOpTime, if there is one, must fill the rest of the entry exactly
        prev_length = i32(d, after + _PREV_OP_TIME_BYTES)
        if (
            not has(d, after, _P_PREV_OP_TIME)
            or prev_length < 5
            or after + _PREV_OP_TIME_BYTES + prev_length != end
        ):
            return
    row[_R_OK], row[_R_OP], row[_R_P], row[_R_HEAD_END] = 1, op, p, head_end
    row[_R_O_START], row[_R_O_END] = o_start, o_end
    row[_R_KEY], row[_R_STAMPS], row[_R_SIMPLE] = key, stamps, simple


@numba.njit(cache=CACHE)
def _layouts(
    d: _Bytes, starts: _Ints, lengths: _Ints, expanded: bool
) -> tuple[_Ints, _Ints, _Ints]:
    """Each entry's layout row (see _layout); which kind its bytes from op to ui are (an index,
    -1 for an entry not taken); and the first entry of each kind. Entries of one kind have the
    same bytes: found by a fingerprint (the length, the word after the ns's length, the last two
    words: the UUID's) in an open-addressed table, then compared in full."""
    n = len(starts)
    rows = np.zeros((n, _ROW_WIDTH), np.int64)
    which = np.full(n, -1, np.int64)
    firsts = np.empty(n, np.int64)
    kinds = 0
    slots = 1
    while slots < 2 * n:
        slots *= 2
    table = np.full(slots, -1, np.int64)  # a kind's index, or -1
    mask = np.uint64(slots - 1)
    for i in range(U(n)):
        row = rows[i]
        _layout(d, starts[i], lengths[i], expanded, row)
        if not row[_R_OK]:
            continue
        p, stop = row[_R_P], row[_R_HEAD_END]
        fingerprint = (
            (np.uint64(stop - p) * np.uint64(0x9E3779B97F4A7C15))
            ^ u64(d, p + _HEAD_BYTES + 4)
            ^ (u64(d, stop - 16) * np.uint64(0xC2B2AE3D27D4EB4F))
            ^ u64(d, stop - 8)
        )
        slot = (fingerprint ^ (fingerprint >> np.uint64(29))) & mask
        while True:
            kind = table[slot]
            if kind < 0:
                table[slot] = kinds
                firsts[U(kinds)] = i
                which[i] = kinds
                kinds += 1
                break
            q = rows[U(firsts[U(kind)]), _R_P]
            if rows[U(firsts[U(kind)]), _R_HEAD_END] - q == stop - p and has(
                d, p, d[U(q) : U(q + stop - p)]
            ):
                which[i] = kind
                break
            slot = (slot + np.uint64(1)) & mask
    return rows, which, firsts[:kinds]


@numba.njit(cache=CACHE)
def _assemble(
    d: _Bytes,
    taken: _Ints,
    rows: _Ints,
    which: _Ints,
    templates: _Bytes,
    at: _Ints,
    extra: _Bytes,
    extra_at: _Ints,
    wall_at: int,
) -> tuple[_Bytes, _Bytes, _Ints]:
    """The taken entries' sort keys (rows of _KEY_BYTES) and events (their bytes back to back, and
    offsets): each is its kind's templates (key, front, tail: `templates` from at[3k] to at[3k+3])
    with its own ts, ObjectId and wall written in, then its document (an insert's), its
    updatedFields (an update's: the diff's `u` document, or extra[extra_at[i]:extra_at[i+1]])
    and what closes it."""
    m = len(taken)
    offsets = np.zeros(m + 1, np.int64)
    for i in range(U(m)):
        row, k = rows[U(taken[i])], U(3 * which[U(taken[i])])
        size = at[k + 3] - at[k + 1]  # its front and tail
        if row[_R_OP] == _INSERT:
            size += row[_R_O_END] - row[_R_O_START]
        elif row[_R_OP] == _UPDATE:
            size += (
                row[_R_O_END] - 2 - row[_R_O_START] - _U_AT + len(_P_SIMPLE_REST)
                if row[_R_SIMPLE]
                else extra_at[i + 1] - extra_at[i]
            )
        offsets[i + 1] = offsets[i] + size
    keys = np.empty(m * _KEY_BYTES, np.uint8)
    out = np.empty(offsets[m], np.uint8)
    for i in range(U(m)):
        row, k = rows[U(taken[i])], U(3 * which[U(taken[i])])
        op, o_start, o_end, stamps = row[_R_OP], row[_R_O_START], row[_R_O_END], row[_R_STAMPS]
        ts, oid = stamps + _TS_AT, row[_R_KEY] + 9
        key = U(i * _KEY_BYTES)
        copy(keys, key, templates, at[k], _KEY_BYTES)
        for j in range(U(8)):  # a token's ts: seconds, then increment, big-endian
            keys[key + _KEY_TS + j] = d[U(ts + 7) - j]
        copy(keys, key + _KEY_OID, d, oid, 12)
        e, stop = offsets[i], offsets[i + 1]
        front = at[k + 2] - at[k + 1]
        copy(out, e, templates, at[k + 1], front)
        put_i32(out, e, stop - e)
        hex_digits(out, e + _HEX_AT + 2 * _KEY_TS, keys, key + _KEY_TS, 8)
        hex_digits(out, e + _HEX_AT + 2 * _KEY_OID, d, oid, 12)
        copy(out, e + _CLUSTER_TIME_AT, d, ts, 8)
        copy(out, e + wall_at, d, stamps + _WALL_AT, 8)
        e += front
        if op == _INSERT:  # fullDocument: the insert's o
            copy(out, e, d, o_start, o_end - o_start)
            e += o_end - o_start
        tail = at[k + 3] - at[k + 2]
        copy(out, e, templates, at[k + 2], tail)
        e += tail
        if op != _UPDATE:
            copy(out, e - 14, d, oid, 12)
            continue
        # After an update's documentKey: updateDescription's header, its length and
        # updatedFields' header (the tail's end), then its updatedFields and what closes it.
        copy(out, e - 13 - _UPDATE_HEAD_BYTES, d, oid, 12)
        put_i32(out, e - 4 - _UPDATED_FIELDS_BYTES, stop - e - 1 + 4 + _UPDATED_FIELDS_BYTES)
        if row[_R_SIMPLE]:
            u = o_start + _U_AT
            copy(out, e, d, u, o_end - 2 - u)
            copy(out, stop - len(_P_SIMPLE_REST), _P_SIMPLE_REST, 0, len(_P_SIMPLE_REST))
        else:
            copy(out, e, extra, extra_at[i], stop - e)
    return keys.reshape(m, _KEY_BYTES), out, offsets


def _description(
    data: bytes | bytearray, start: int, end: int, diff: int, expanded: bool
) -> bytes | None:
    """The updateDescription of the update entry data[start:end] whose diff is at `diff`, read
    from the entry alone as splice_crud reads it (bytes past a broken entry are another's); None
    if `update_description` does not take it or cannot read it (splice_crud then says why)."""
    try:
        return update_description(byte_slices(data)[start:end], diff - start, expanded=expanded)
    except (ValueError, IndexError, struct.error):
        return None


def splice_entries(
    batch: OplogBatch, splice: bool = True, expanded: bool = False
) -> EventBlock | list[Any]:
    """The batch's events as one EventBlock when every entry is a plain insert, update or
    delete this module takes (the usual batch of a backlog); else one item for each entry, in
    order: its event's fields (`splice_crud`'s), () for an entry with no event, or the entry's own
    bytes when the general, stateful transform must handle it (transactions, DDL, noops), except
    that runs of at least BLOCK_RUN_MIN events are one EventBlock item each."""
    if not splice:
        return batch.entries()
    if len(batch) < BATCH_MIN:
        return [_one_by_one(entry, None, expanded) for entry in batch.entries()]
    out, block, taken = splice_block(batch, expanded=expanded)

    def outside(start: int, stop: int) -> list[Any]:
        """The items of the entries in [start, stop), none of them in the block."""
        entries = batch.entries(start, stop)
        return [
            _one_by_one(entry, made, expanded)
            for entry, made in zip(entries, out[start:stop], strict=True)
        ]

    if block is None:
        return outside(0, len(batch))
    if len(taken) == len(batch):
        return block
    # The block's runs of consecutive entries, found as arrays: a batch that starts a stream (its
    # first entries DDL or noops) or holds a few notes is mostly one run, and walking its thousands
    # of entries in Python (each one's bytes cut out) would cost more than the splice itself.
    ends = np.append(np.flatnonzero(np.diff(taken) != 1) + 1, len(taken)).tolist()
    items: list[Any] = []
    where = taken.tolist()
    following, run = 0, 0  # the entry after the last run, the first event of the next
    for end in ends:
        items += outside(following, where[run])
        part = block.sliced(run, end)
        items += [part] if len(part) >= BLOCK_RUN_MIN else part.fields()
        following, run = where[end - 1] + 1, end
    return items + outside(following, len(batch))


def _one_by_one(entry: bytes, made: Spliced | tuple[()] | None, expanded: bool) -> Any:
    """What splice_entries gives for an entry outside the block: what splice_block made of it,
    else its event's fields (splice_crud's), else its bytes, for the general transform."""
    if made is None:
        made = splice_crud(entry, expanded=expanded)
    return entry if made is None else made


def warm_up() -> None:
    """Compile the walk's, the splice's and the blocks' kernels now, or load them from numba's
    cache: a process that starts serving pays it before its first batch, not inside it (compiling
    on a cold cache takes seconds, once), and its reader processes then find the cache made."""
    ui = bson.Binary(bytes(16), 4)
    oid = bson.ObjectId(bytes(12))
    stamps = {
        "ts": bson.Timestamp(1, 1),
        "t": bson.Int64(1),
        "v": bson.Int64(2),
        "wall": bson.datetime_ms.DatetimeMS(0),
    }
    entries = [
        {"op": "i", "ns": "db.c", "ui": ui, "o": {"_id": oid}, "o2": {"_id": oid}, **stamps},
        {
            "op": "u",
            "ns": "db.c",
            "ui": ui,
            "o": {"$v": 2, "diff": {"u": {"a": 1}}},
            "o2": {"_id": oid},
            **stamps,
        },
        {
            "op": "u",
            "ns": "db.c",
            "ui": ui,
            "o": {"$v": 2, "diff": {"d": {"a": False}}},
            "o2": {"_id": oid},
            **stamps,
        },
        {"op": "d", "ns": "db.c", "ui": ui, "o": {"_id": oid}, **stamps},
    ]
    reply = bson.encode(
        {"cursor": {"nextBatch": entries, "id": bson.Int64(0), "ns": "local.oplog.rs"}}
    )
    for expanded in (False, True):
        _, block, _ = splice_block(reply_batch(reply)[1], expanded=expanded)
    # And what a release does with blocks: merge, take each bucket's share, key a reply's batch
    # from where its events lie (or from a block's own column), gather a column.
    if block is not None:
        share = EventBlock.merge([block, block]).take(np.arange(2))
        share.array_body(0).materialize()
        share.own().array_body(0).materialize()
