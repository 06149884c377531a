"""A batch of oplog entries spliced into events at once: plain inserts, updates and deletes with
numpy, the rest one by one.

Why: `splice_crud` costs ~2.5 us an insert, and each of its ~30 lines costs 0.1-0.7 us; no line
stands out, so no per-entry rewrite gets much below it. But the inserts (and deletes) of one
oplog batch are alike: the same element order, the same constant bytes, differing only in a few
values (ts, the _id's ObjectId, wall, the document) and in lengths. So this module checks and
reads those values for the whole batch with numpy (one array operation per field, not per
entry), builds the parts of the events that have a fixed width (the resume token, its hex,
clusterTime, wallTime) as rows of one array, and joins each event's pieces in C (Arrow) into one
EventBlock: ~0.5 us an insert in batches of 4096 (~1.0 when Python joined them into a tuple
each). An update's event is built the same way. Its updateDescription is,
for the usual diff (`{u: {...}}` alone), the diff's `u` document copied as an insert's document
is (~1.5 us an update); for other diffs `update_description` makes it one by one (~3.4 us),
against ~8.5 us an update when each diff was decoded into dicts.

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

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from mongoformats.event_block import EventBlock, joined, spans
from mongoformats.oplog_batch import OplogBatch, words
from mongoformats.oplog_splice import (
    _ID_HEAD,
    _OP_ELEMENT,
    _OP_HEAD,
    _OP_IDENT,
    _TOKEN_HEAD,
    _UI_HEAD,
    Spliced,
    _fixed_head,
    splice_crud,
    update_description,
)

__all__ = ["BATCH_MIN", "splice_block", "splice_entries"]

BATCH_MIN = 128  # fewer entries are spliced one by one: numpy's fixed cost per call outweighs its gain
BLOCK_RUN_MIN = 32  # a shorter run of events between others (noops, DDL) goes as tuples, not a block

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
assert len({len(_OP_IDENT[op]) for op in _OPS.values()}) == len({len(_OP_ELEMENT[op]) for op in _OPS.values()}) == 1
_KEY_OID = _KEY_TS + 8 + len(_TOKEN_HEAD) + 19 + len(_OP_IDENT["insert"]) + len(_KEY_OID_HEAD)
_KEY_BYTES = _KEY_OID + 12 + 3
# The event up to its fullDocument's value: its length, _id (the token's hex), operationType,
# clusterTime, collectionUUID (expanded events only), wallTime; then where the per-event values go.
_HEX_BYTES = 2 * _KEY_BYTES
_ID_ELEMENT = _ID_HEAD.pack(b"\x03_id\x00", _HEX_BYTES + 17, b"\x02_data\x00", _HEX_BYTES + 1)
_HEX_AT = 4 + len(_ID_ELEMENT)
_CLUSTER_TIME_AT = _HEX_AT + _HEX_BYTES + len(b"\x00\x00" + _OP_ELEMENT["insert"] + b"\x11clusterTime\x00")
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
_SIMPLE_REST = b"\x04removedFields\x00\x05\x00\x00\x00\x00\x04truncatedArrays\x00\x05\x00\x00\x00\x00\x00\x00"
_END = b"\x00"
# What follows the updatedFields of: an insert or a delete (none), a simple update, another update.
_CLOSINGS = (b"", _SIMPLE_REST, _END)
# In an update's o: where its diff's value is; where a diff of `u` alone has the `u` document.
_DIFF_AT = 4 + len(_V2_DIFF)
_U_AT = _DIFF_AT + 7
_HEX_DIGITS = np.frombuffer(b"0123456789ABCDEF", np.uint8)


def _key_template(op: str, uuid_ks: bytes) -> bytes:
    """A kind's sort key, with zeros where each event's ts and ObjectId go."""
    return b"".join((b"\x82", bytes(8), _TOKEN_HEAD, uuid_ks, _OP_IDENT[op], _KEY_OID_HEAD, bytes(12),
                     b"\x00\x00\x04"))


def _front_template(op: str, key: bytes, ui: bytes, expanded: bool) -> bytes:
    """A kind's event up to its document (an insert's fullDocument header ends it), with zeros
    (in the hex too) where each event's length, ts, ObjectId and wall go."""
    uuid = _COLLECTION_UUID + ui if expanded else b""
    return b"".join((bytes(4), _ID_ELEMENT, hexlify(key).upper(), b"\x00\x00", _OP_ELEMENT[op],
                     b"\x11clusterTime\x00", bytes(8), uuid, _WALL_TIME, bytes(8),
                     _FULL_DOCUMENT if op == "insert" else b""))


def _wall_at(expanded: bool) -> int:
    """Where a front's wallTime value is (collectionUUID comes before it in expanded events)."""
    return _CLUSTER_TIME_AT + 8 + (len(_COLLECTION_UUID) + _UUID_VALUE_BYTES if expanded else 0) + len(_WALL_TIME)


def _is(u64: _Words, offsets: _Ints, expected: bytes) -> npt.NDArray[np.bool_]:
    """Whether each offset starts with `expected`, compared 8 bytes at a time. (The word read at
    every offset, a gather, is most of the cost: no other array is made than needed.)"""
    ok = None
    for i in range(0, len(expected), 8):
        part = expected[i:i + 8]
        word = u64[offsets + i if i else offsets]
        if len(part) < 8:
            word &= np.uint64((1 << 8 * len(part)) - 1)
        same = word == np.uint64(int.from_bytes(part, "little"))
        if ok is None:
            ok = same
        else:
            ok &= same
    assert ok is not None
    return ok


def _clamp(ok: npt.NDArray[np.bool_], length: _Ints, low: int, high: _Ints) -> _Ints:
    """`length` where it is in [low, high] and the entry is still a candidate, else `low`: a
    rejected entry's later offsets then stay within 150 bytes past its end (inside the buffer's
    slack), whatever its bytes say."""
    fits = ok & (length >= low) & (length <= high)
    ok &= fits
    return np.where(fits, length, low)


def _hex(columns: _Bytes) -> _Bytes:
    """Upper-case hex digits of each row's bytes."""
    digits = np.empty((len(columns), 2 * columns.shape[1]), np.uint8)
    digits[:, 0::2] = _HEX_DIGITS[columns >> 4]
    digits[:, 1::2] = _HEX_DIGITS[columns & 15]
    return digits


def _as_bytes(words: _Words) -> _Bytes:
    """Each little-endian word as a row of its bytes."""
    return words.astype(words.dtype.newbyteorder("<")).view(np.uint8).reshape(len(words), -1)


def _made_of(head: bytes) -> Any:
    """What an entry's bytes from op to ui make of its event (see `_fixed_head`); None, for the
    one-by-one path to report, if its namespace is not UTF-8."""
    try:
        return _fixed_head(head)[0]
    except UnicodeDecodeError:
        return None


def splice_block(batch: OplogBatch, *, expanded: bool) -> tuple[list[Spliced | tuple[()] | None], EventBlock | None,
                                                                 list[int]]:
    """The events of the plain inserts, updates and deletes this module takes, as one EventBlock
    (the second item; None if there are none) and the indices of their entries (the third); and
    for each entry (the first), () for one of an internal namespace, or None for one the block
    holds or the caller must transform (what `splice_crud` says of it)."""
    return _splice(batch, expanded=expanded)


def _splice(batch: OplogBatch, *, expanded: bool) -> tuple[list[Spliced | tuple[()] | None], EventBlock | None,
                                                            list[int]]:
    n, data, start, lengths = len(batch), batch.data, batch.starts, batch.lengths
    end = start + lengths - 1  # where each entry's terminating zero must be
    u64, i32, u8 = words(data, "<u8"), words(data, "<i4"), np.frombuffer(data, np.uint8)

    ok = lengths >= 5 + _HEAD_BYTES + 4
    # A retryable write's lsid and txnNumber lead (OplogEntryBase's order).
    session = ok & _is(u64, start + 4, _LSID)
    lsid = _clamp(session, i32[start + 10].astype(np.int64), 5, lengths - 40)
    p = np.where(session, start + 10 + lsid, start + 4)
    ok &= ~session | _is(u64, p, _TXN_NUMBER)
    p = np.where(session, p + len(_TXN_NUMBER) + 8, p)
    code = u8[p + _OP_CODE_AT]
    delete, update = code == ord("d"), code == ord("u")
    ok &= _is(u64, p, _OP_HEAD) & (delete | update | (code == ord("i"))) & (u8[p + _OP_CODE_AT + 1] == 0)
    ok &= _is(u64, p + _HEAD_BYTES - len(_NS), _NS)
    ns = _clamp(ok, i32[p + _HEAD_BYTES].astype(np.int64), 2, end - p)
    ui = p + _HEAD_BYTES + 4 + ns
    ok &= _is(u64, ui, _UI_HEAD)
    head_end = ui + len(_UI_HEAD) + 16
    ok &= _is(u64, head_end, _O)
    o_start = head_end + len(_O)
    o_end = o_start + _clamp(ok, i32[o_start].astype(np.int64), 5, end - o_start)
    # An update's o is {$v: 2, diff}, the diff ending where o does. (Only read in a batch with
    # updates: a batch of inserts, the bulk of a backlog, pays nothing for them.)
    simple: npt.NDArray[np.bool_] = np.zeros(n, np.bool_)
    if (ok & update).any():
        diff = o_start + _DIFF_AT
        diff_length = _clamp(ok & update, i32[diff].astype(np.int64), 5, o_end - diff - 1)
        ok &= ~update | (_is(u64, o_start + 4, _V2_DIFF) & (diff + diff_length + 1 == o_end) & (u8[o_end - 1] == 0))
        # The usual diff, `{u: {...}}` alone (a $set of existing top-level fields): its `u`
        # document, which ends where the diff does, is the event's updatedFields as it is,
        # copied like an insert's document.
        simple = ok & update & (not expanded) & _is(u64, diff + 4, b"\x03u\x00")
        u_length = _clamp(simple, i32[o_start + _U_AT].astype(np.int64), 5, diff_length - 8)
        simple &= (o_start + _U_AT + u_length == o_end - 2) & (u8[o_end - 3] == 0)
    # An insert's and an update's o2 is its documentKey (an insert's o its document); a delete's o is it.
    key = np.where(delete, o_start, o_end + len(_O2))
    ok &= (delete & (o_end == o_start + _OID_KEY_BYTES)) | (~delete & _is(u64, o_end, _O2))
    ok &= _is(u64, key, _OID_KEY) & (u8[key + _OID_KEY_BYTES - 1] == 0)
    stamps = key + _OID_KEY_BYTES
    stamps = np.where(ok & _is(u64, stamps, _STMT_ID), stamps + len(_STMT_ID) + 4, stamps)
    for offset, header in _STAMPS:
        ok &= _is(u64, stamps + offset, header)
    after = stamps + _STAMP_BYTES
    # prevOpTime, if there is one, must fill the rest of the entry exactly.
    prev = ~(after == end) & _is(u64, after, _PREV_OP_TIME)
    prev_length = _clamp(ok & prev, i32[after + len(_PREV_OP_TIME)].astype(np.int64), 5, end - after)
    ok &= (after == end) | (prev & (after + len(_PREV_OP_TIME) + prev_length == end))
    ok &= u8[end] == 0
    # fullDocument: an insert's o; a delete and an update have none (an empty range).
    full_end = np.where(delete | update, o_start, o_end)
    # updatedFields copied (a simple update's `u` document; an empty range for other entries).
    u_start, u_end = np.where(simple, o_start + _U_AT, 0), np.where(simple, o_end - 2, 0)

    # Other updates' updateDescription is made one by one (diffs differ in shape); a diff that
    # `update_description` does not take leaves its entry to splice_crud.
    descriptions: dict[int, bytes] = {}
    if (ok & update).any():
        tried = {i: _description(data, s, e, d, expanded) for i, s, e, d in zip(
            *(a[ok & update & ~simple].tolist() for a in (np.arange(n), start, end + 1, o_start + _DIFF_AT)),
            strict=True)}
        ok[[i for i, d in tried.items() if d is None]] = False
        descriptions = {i: d for i, d in tried.items() if d is not None}

    taken = np.flatnonzero(ok)
    out: list[Spliced | tuple[()] | None] = [None] * n
    if not len(taken):
        return out, None, []
    p, head_end, o_start, full_end, key, stamps, u_start, u_end = (
        a[taken] for a in (p, head_end, o_start, full_end, key, stamps, u_start, u_end))
    update, simple = update[taken], simple[taken]
    # What each entry's op, ns and ui make of its event (the namespace's parts, the UUID), found
    # once per kind (distinct bytes from op to ui): a batch's entries share a handful.
    which, firsts = _kinds(data, u64, p, head_end)
    made = [_made_of(data[start:stop]) for start, stop in zip(p[firsts].tolist(), head_end[firsts].tolist(),
                                                              strict=True)]
    keep = np.fromiter(map(bool, made), np.bool_, len(made))[which]
    if not keep.all():
        for i, kind in zip(taken[~keep].tolist(), which[~keep].tolist(), strict=True):
            out[i] = made[kind]  # () for an internal namespace; None for a view's (the general path)
        taken, which = taken[keep], which[keep]
        o_start, full_end, key, stamps, u_start, u_end = (
            a[keep] for a in (o_start, full_end, key, stamps, u_start, u_end))
        update, simple = update[keep], simple[keep]
    m = len(taken)
    if not m:
        return out, None, []

    # Each event's sort key, front and tail: its kind's template, then its own ts, ObjectId and
    # wall. The event is its front, its document (an insert's), its tail, its updateDescription
    # (an update's). Fronts differ in length by kind (fullDocument's header ends an insert's) and
    # are left-aligned in their rows, tails (ns, documentKey, and an update's updateDescription
    # header) are right-aligned: so each per-event value has one column (two for the ObjectId in
    # the tail: an update's is further from the end).
    ops = [_OPS[h[0][0]] if h else "insert" for h in made]
    key_templates = [_key_template(op, h[3]) if h else bytes(_KEY_BYTES) for op, h in zip(ops, made, strict=True)]
    front_templates = [_front_template(op, k, h[2], expanded) if h else b""
                       for op, k, h in zip(ops, key_templates, made, strict=True)]
    tail_templates = [h[1][0] + _DOCUMENT_KEY + _OID_KEY + (bytes(13) + _UPDATE_HEAD if op == "update"
                                                             else bytes(14)) if h else b""
                      for op, h in zip(ops, made, strict=True)]
    front_width, tail_width = max(map(len, front_templates)), max(map(len, tail_templates))
    ts = u64[stamps + _TS_AT]
    ts_key = _as_bytes(ts.byteswap())  # a token's ts: seconds, then increment, big-endian
    oid = np.empty((m, 12), np.uint8)
    oid[:, :8] = _as_bytes(u64[key + 9])
    oid[:, 8:] = _as_bytes(u64[key + 17])[:, :4]
    keys = np.frombuffer(b"".join(key_templates), np.uint8).reshape(-1, _KEY_BYTES)[which]
    keys[:, _KEY_TS:_KEY_TS + 8] = ts_key
    keys[:, _KEY_OID:_KEY_OID + 12] = oid
    fronts = _rows(front_templates, front_width, bytes.ljust)[which]
    fronts[:, _HEX_AT + 2 * _KEY_TS:_HEX_AT + 2 * _KEY_TS + 16] = _hex(ts_key)
    fronts[:, _HEX_AT + 2 * _KEY_OID:_HEX_AT + 2 * _KEY_OID + 24] = _hex(oid)
    fronts[:, _CLUSTER_TIME_AT:_CLUSTER_TIME_AT + 8] = _as_bytes(ts)
    wall_at = _wall_at(expanded)
    fronts[:, wall_at:wall_at + 8] = _as_bytes(u64[stamps + _WALL_AT])
    tails = _rows(tail_templates, tail_width, bytes.rjust)[which]
    front_lengths = np.array(list(map(len, front_templates)), np.int64)[which]
    tail_lengths = np.array(list(map(len, tail_templates)), np.int64)[which]
    sizes = front_lengths + (full_end - o_start) + tail_lengths
    updates = update.any()
    if updates:
        # After an update's documentKey: its updateDescription's header, length and updatedFields
        # header in the tail; then its updatedFields (the diff's `u` document, or what
        # `update_description` made, less those headers) and what closes the event
        # (_SIMPLE_REST or _END; nothing for an insert or a delete).
        oid_at = tail_width - np.where(update, 13 + len(_UPDATE_HEAD), 14)
        tails[np.arange(m)[:, None], oid_at[:, None] + np.arange(12)] = oid
        rows = np.flatnonzero(update)
        made_here = [descriptions[i] for i in taken[update & ~simple].tolist()]
        lengths = np.where(simple, u_end - u_start + len(_SIMPLE_REST) - 1 + 4 + len(_UPDATED_FIELDS), 0)
        lengths[update & ~simple] = np.fromiter(map(len, made_here), np.int64, len(made_here))
        at = tail_width - 4 - len(_UPDATED_FIELDS)
        tails[rows, at:at + 4] = _as_bytes(lengths[rows].astype("<u4"))
        updated_fields = list(map(data.__getitem__, map(slice, u_start.tolist(), u_end.tolist())))
        for i, made_description in zip(np.flatnonzero(update & ~simple).tolist(), made_here, strict=True):
            updated_fields[i] = made_description[4 + len(_UPDATED_FIELDS):]
        closing = list(map(_CLOSINGS.__getitem__, np.where(simple, 1, np.where(update, 2, 0)).tolist()))
        # The description less its headers in the tail, and the event's end.
        sizes += np.where(update, lengths - 4 - len(_UPDATED_FIELDS) + 1, 0)
    else:
        tails[:, tail_width - 14:tail_width - 2] = oid
    fronts[:, :4] = _as_bytes(sizes.astype("<u4"))

    front_bytes, tail_bytes = fronts.tobytes(), tails.tobytes()
    front_at = np.arange(m) * front_width
    tail_end = np.arange(1, m + 1) * tail_width
    # The pieces as columns, joined in C: no per-event object (mongoformats/event_block.py).
    columns = [spans(front_bytes, front_at, front_at + front_lengths), spans(data, o_start, full_end),
               spans(tail_bytes, tail_end - tail_lengths, tail_end)]
    if updates:
        columns += (pa.array(updated_fields, pa.large_binary()), pa.array(closing, pa.large_binary()))
    # (A kind none of whose entries was taken gets a placeholder: no event refers to it.)
    kind_table = tuple((op, h[1][1], h[1][2], h[1][3]) if h else ("", "", "", ())
                       for op, h in zip(ops, made, strict=True))
    return out, EventBlock(keys, joined(columns), which.astype(np.int32), kind_table), taken.tolist()


def _description(data: bytes, start: int, end: int, diff: int, expanded: bool) -> bytes | None:
    """The updateDescription of the update entry data[start:end] whose diff is at `diff`, read
    from the entry alone as splice_crud reads it (bytes past a broken entry are another's); None
    if `update_description` does not take it or cannot read it (splice_crud then says why)."""
    try:
        return update_description(data[start:end], diff - start, expanded=expanded)
    except (ValueError, IndexError, struct.error):
        return None


def _rows(templates: list[bytes], width: int, align: Any) -> _Bytes:
    """The templates as the rows of an array, padded with zeros to `width` on the side `align`
    (bytes.ljust or bytes.rjust) says."""
    return np.frombuffer(b"".join(align(t, width, b"\0") for t in templates), np.uint8).reshape(-1, width)


def _kinds(data: bytes, u64: _Words, start: _Ints, stop: _Ints) -> tuple[_Ints, _Ints]:
    """Which kind each entry's bytes in [start, stop) are (an index into the second array), and
    the first entry of each kind: entries of one kind have the same bytes. Grouped by a fingerprint of their length and
    first and last words, then every entry is compared with its kind's first in full: entries
    with a fingerprint alike and bytes not (a rename between them keeping the name's length and
    ends) are told apart by their bytes, one by one."""
    length = stop - start
    fingerprint = (length.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ u64[start] ^ (
        u64[stop - 8] * np.uint64(0xC2B2AE3D27D4EB4F))
    _, firsts, which = np.unique(fingerprint, return_index=True, return_inverse=True)
    first = start[firsts[which]]
    same = length == length[firsts[which]]
    # Word by word, the last word ending where the bytes do (overlapping the one before it).
    last = stop - 8
    for offset in range(0, int(length.max()), 8):
        at = np.minimum(start + offset, last)
        same &= u64[at] == u64[at - start + first]
    if same.all():
        return which, firsts
    heads = list(map(data.__getitem__, map(slice, start.tolist(), stop.tolist())))
    kinds: dict[bytes, int] = {}
    which = np.fromiter((kinds.setdefault(head, i) for i, head in enumerate(heads)), np.int64, len(heads))
    return np.unique(which, return_inverse=True)[1], np.array(list(kinds.values()), np.int64)


def splice_entries(batch: OplogBatch, splice: bool = True, expanded: bool = False) -> EventBlock | list[Any]:
    """The batch's events as one EventBlock when every entry is a plain insert, update or
    delete this module takes (the usual batch of a backlog); else one item for each entry, in
    order: its event's fields (`splice_crud`'s), () for an entry with no event, or the entry's own
    bytes when the general, stateful transform must handle it (transactions, DDL, noops), except
    that runs of at least BLOCK_RUN_MIN events are one EventBlock item each."""
    if not splice:
        return batch.entries()
    out: list[Any]
    block: EventBlock | None
    where: list[int]
    if len(batch) < BATCH_MIN:
        out, block, where = [None] * len(batch), None, []
    else:
        out, block, where = splice_block(batch, expanded=expanded)
    if block is not None and len(where) == len(batch):
        return block
    items: list[Any] = []
    raws = batch.entries()
    k = 0
    i = 0
    while i < len(raws):
        if k < len(where) and where[k] == i:  # a run of events in the block
            run = k
            while k + 1 < len(where) and where[k + 1] == where[k] + 1:
                k += 1
            k += 1
            assert block is not None
            part = block.sliced(run, k)
            items += [part] if len(part) >= BLOCK_RUN_MIN else part.fields()
            i = where[k - 1] + 1
            continue
        item = out[i]
        if item is None:
            item = splice_crud(raws[i], expanded=expanded)
        items.append(raws[i] if item is None else item)
        i += 1
    return items
