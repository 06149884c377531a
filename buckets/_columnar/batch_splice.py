"""A batch of oplog entries spliced into events at once: plain inserts, updates, replacements
and deletes in compiled loops (numba, buckets/_columnar/byte_kernels.py), the rest one by one.

Why: `splice_crud`'s cost in Python is spread over its lines, none standing out, so no
per-entry rewrite in Python gets much below it. But the inserts
(and deletes, and the usual updates) of a backlog are alike: the same element order, the same
constant bytes, differing only in a few values (ts, the _id, wall, the document) and in
lengths. So a compiled loop reads each entry's elements where they must lie (`_layout`), the
entries are grouped by what their op, ns and ui make of them (their kind: a batch holds a
handful), Python makes each kind's templates once (the event's constant bytes), and a second
loop writes every event into one buffer, its own values (token, clusterTime, wallTime, document,
documentKey, updatedFields) into its kind's template, and its token's KeyString beside it
(`_assemble`): two passes over the batch, where numpy
array operations over it took a few dozen (benchmarks/README.md). An update's updatedFields
is, for the usual diffs (top-level `u` and `i` documents alone), those documents' elements,
copied as an insert's document is; other diffs' descriptions are written for the batch at once by
buckets/_columnar/diff_kernel.py (update_descriptions.py) and copied in.

Which entries: single inserts, updates, replacements and deletes whose documentKey id_keys.py keys:
`{_id: ObjectId}` (drivers give every document one; a TTL index's deletes have it), `{_id: binary of
16 bytes}` (a UUID), and documentKeys of strings, int32s, int64s (below 2**62), ObjectIds and
documents of these (string, numeric and compound `_id`s, shard keys beside `_id`), in the field
order a server writes them, with or without a retryable write's session fields:

    {lsid?, txnNumber?, op: "i", ns, ui, o, o2: {_id}, stmtId?, ts, t, v, wall, prevOpTime?}
    {lsid?, txnNumber?, op: "u", ns, ui, o: {$v: 2, diff}, o2: {_id}, stmtId?, ts, t, v, wall,
     prevOpTime?}
    {lsid?, txnNumber?, op: "u", ns, ui, o: {_id, ...}, o2: {_id}, stmtId?, ts, t, v, wall,
     prevOpTime?}
    {lsid?, txnNumber?, op: "d", ns, ui, o: {_id}, stmtId?, ts, t, v, wall, prevOpTime?}

and of updates, those whose diff `update_description` takes (no expanded events). A replacement
(its o the new document, the event's fullDocument) is an o led by `_id` that holds the bytes
`$v\0` nowhere, which splice_crud tells from a diff without walking o (any other o is its to
judge). Entries of these shapes with another documentKey (other value types, int64s of 2**62 or
more) get `splice_crud`'s event made from the layout the compiled walk found
(`splice_laid_out`). Every other entry (transactions, DDL, noops, a field out of place) gets
None here and goes through `splice_crud` or the general transform. An entry taken here gives
exactly `splice_crud`'s event (tests compare the two on random and broken entries): every
boundary is derived from the entry's BSON lengths, and it is only taken if it is exactly that
sequence of elements.
"""

from __future__ import annotations

import functools
import pickle
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

from buckets._columnar.batch_layout import (
    _DELETE,
    _INSERT,
    _OPS,
    _R_FIELDS,
    _R_HEAD_END,
    _R_ID_AT,
    _R_ID_BYTES,
    _R_KEY,
    _R_KEY_END,
    _R_LAID,
    _R_O_END,
    _R_O_START,
    _R_OK,
    _R_OP,
    _R_P,
    _R_SIMPLE,
    _R_STAMPS,
    _REPLACE,
    _TS_AT,
    _UPDATE,
    _WALL_AT,
    _layouts,
)
from buckets._columnar.byte_kernels import (
    U,
    as_bytes,
    byte_table,
    hex_at,
    move,
    prefetch_line,
    store_byte,
    store_i32,
)
from buckets._columnar.event_block import EventBlock
from buckets._columnar.id_keys import (
    _ID_WALKED,
    _KEY_TAIL,
    _KEY_TS,
    _KIND_MASK,
    fixed_bytes,
    key_template,
    type_bits_element,
    type_bits_of,
)
from buckets._columnar.oplog_batch import OplogBatch, reply_batch
from buckets._columnar.txn_batch import placed, with_transactions
from buckets._columnar.txn_batch import warm_up as warm_up_transactions
from buckets._columnar.txn_place import cut_around, with_transactions_in
from buckets._columnar.update_descriptions import extras, other_descriptions
from mongoformats.oplog_splice import (
    _ID_HEAD,
    _OP_ELEMENT,
    Spliced,
    _fixed_head,
    byte_slices,
    not_crud,
    splice_crud,
    splice_laid_out,
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


def _wall_at(expanded: bool) -> int:
    """Where a front's wallTime value is in its rest (collectionUUID comes before it in expanded
    events)."""
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
    """The events of the plain inserts, updates, replacements and deletes this module takes, as
    one EventBlock (the second item; None if there are none) and the indices of their entries (the
    third, an array: a batch the block holds whole never needs them as Python integers); and for
    each entry (the first): its event's fields if it was spliced here outside the block (another
    documentKey), () for one of an internal namespace, or None for one the block holds or the
    caller must transform (what `splice_crud` says of it)."""
    n, data = len(batch), batch.data
    d = as_bytes(data)
    rows, which, firsts, ids = _layouts(d, batch.starts, batch.lengths, expanded)
    ok = rows[:, _R_OK].astype(np.bool_)
    descriptions = other_descriptions(batch, rows, ok, expanded)
    out: list[Spliced | tuple[()] | None] = [None] * n
    # What each kind's op, ns and ui make of its events (the namespace's parts, the UUID), found
    # once per kind: a batch's entries share a handful.
    cut = byte_slices(data)
    made = [
        _made_of(cut[start:stop]) for start, stop in rows[firsts][:, [_R_P, _R_HEAD_END]].tolist()
    ]
    _leave_unmade(made, which, ok, out)
    _splice_laid_out(batch, rows, out, expanded)
    taken = np.flatnonzero(ok)
    if not len(taken):
        return out, None, taken
    ops = [_OPS[op] for op in rows[firsts, _R_OP].tolist()]
    id_kinds = rows[firsts, _R_OK].tolist()
    templates, at = _templates(ops, made, id_kinds, expanded)
    extra, extra_at = extras(descriptions, taken)
    keys, events, offsets = _assemble(
        d, ids, taken, rows, which, templates, at, extra, extra_at, _wall_at(expanded)
    )
    column = pa.Array.from_buffers(
        pa.large_binary(), len(taken), [None, pa.py_buffer(offsets), pa.py_buffer(events)]
    )
    kind_table = tuple(
        (op, h[1][1], h[1][2], h[1][3], type_bits_of(id_kind)) if h else ("", "", "", (), b"")
        for op, h, id_kind in zip(ops, made, id_kinds, strict=True)
    )
    return out, EventBlock(keys, column, which[taken].astype(np.int32), kind_table), taken


def _splice_laid_out(
    batch: OplogBatch, rows: _Ints, out: list[Spliced | tuple[()] | None], expanded: bool
) -> None:
    """Splice, one by one, the entries that have the block's layout but another documentKey
    (see batch_layout's _R_OK) from the layout the compiled walk found: their events are
    splice_crud's, without its reading the entry's elements again. An entry that cannot be read
    so stays None in `out`, for splice_crud to say what is wrong with it."""
    laid = (rows[:, _R_LAID] != 0) & (rows[:, _R_OK] == 0)
    if not laid.any():
        return
    where = np.flatnonzero(laid)
    # Offsets within each entry: its start taken off the columns at once.
    columns = rows[where][:, [_R_OP, _R_P, _R_HEAD_END, _R_O_START, _R_O_END, _R_KEY, _R_KEY_END]]
    columns[:, 1:] -= batch.starts[where, None]
    stamps = (rows[where, _R_STAMPS] - batch.starts[where]).tolist()
    for i, entry, (op, p, head_end, o0, o1, k0, k1), at in zip(
        where.tolist(), batch.entries_at(where), columns.tolist(), stamps, strict=True
    ):
        head = _made_of(entry[p:head_end])
        if head is None:
            continue
        layout = (
            head,
            (o0, o1),
            None if op == _DELETE else (k0, k1),
            at + _TS_AT,
            (at + _WALL_AT, at + _WALL_AT + 8),
        )
        # try, not contextlib.suppress: it costs nothing until something is raised, where a
        # context manager per entry costs a call in and out.
        try:  # noqa: SIM105
            out[i] = splice_laid_out(entry, layout, expanded=expanded)
        except (ValueError, IndexError, struct.error, bson.errors.BSONError):
            pass  # left to splice_crud, which reports it


def _leave_unmade(
    made: list[Any],
    which: _Ints,
    ok: npt.NDArray[np.bool_],
    out: list[Spliced | tuple[()] | None],
) -> None:
    """Drop from `ok` the entries of kinds that make no event here: () in `out` for an internal
    namespace's, None for a view's (the general path)."""
    keep = np.fromiter(map(bool, made), np.bool_, len(made))
    if keep.all():
        return
    dropped = ok & ~keep[which]
    for i, kind in zip(np.flatnonzero(dropped).tolist(), which[dropped].tolist(), strict=True):
        out[i] = made[kind]
    ok &= ~dropped


def _templates(
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


@numba.njit(cache=CACHE)
def _assemble(
    d: _Bytes,
    ids: _Bytes,
    taken: _Ints,
    rows: _Ints,
    which: _Ints,
    templates: _Bytes,
    at: _Ints,
    extra: _Bytes,
    extra_at: _Ints,
    wall_at: int,
) -> tuple[_Bytes, _Bytes, _Ints]:
    """The taken entries' sort keys (rows padded with zeros to the longest's width, see
    id_keys.py) and events (their bytes back to back, and offsets). Each key is its kind's key
    template (`templates` from at[_PARTS k], see `_templates`) with its ts, then its `_id`'s bytes
    (an ObjectId's or UUID's in d, a walked key's elements in `ids`: see batch_layout's
    _R_ID_AT) and the key's tail. Each event is its kind's other templates with its own lengths,
    token (its key's hex), ts and wall written in, then its document (an insert's or
    replacement's), its documentKey, its updatedFields (an update's: its diff's `u` and `i`
    elements, or extra[extra_at[i]:extra_at[i+1]]) and what closes it. Two passes: sizes, then
    bytes."""
    m = len(taken)
    offsets = np.zeros(m + 1, np.int64)
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
                else extra_at[i + 1] - extra_at[i]
            )
        offsets[i + 1] = offsets[i] + size
    width = lengths.max() if m else 0
    keys = np.zeros(m * width, np.uint8)
    out = np.empty(offsets[m], np.uint8)
    # The event's parts are written through addresses (byte_kernels' move, store_i32), inlined:
    # a call to a cached kernel per part (or one that takes the arrays) costs more than a copy.
    # (as signed integers, as the offsets added to them are: numba makes a float of a sum of
    # a signed and an unsigned integer)
    template_at, d_at = np.int64(templates.ctypes.data), np.int64(d.ctypes.data)
    keys_at, out_at = np.int64(keys.ctypes.data), np.int64(out.ctypes.data)
    ids_at, extra_data_at = np.int64(ids.ctypes.data), np.int64(extra.ctypes.data)
    for i in range(U(m)):
        # The lines of the entry two ahead that are copied (its o, documentKey and stamps), asked
        # for now: a backlog's entries come from memory, and a document's copy waits on each of
        # its lines in turn.
        ahead = U(taken[min(i + U(2), U(m - 1))])
        for line in range(
            U(d_at + rows[ahead, _R_O_START]), U(d_at + rows[ahead, _R_STAMPS] + 48), U(64)
        ):
            prefetch_line(line)
        r, k = U(taken[i]), U(_PARTS * which[U(taken[i])])
        op, o_start, o_end, stamps = (
            rows[r, _R_OP],
            rows[r, _R_O_START],
            rows[r, _R_O_END],
            rows[r, _R_STAMPS],
        )
        key, n, fixed = keys_at + np.int64(i) * width, lengths[i], at[k + 1] - at[k]
        # The key: its kind's template, its ts (seconds, then increment, big-endian), its _id's
        # bytes, its tail (zeros but its last byte).
        move(key, template_at + at[k], fixed)
        for j in range(8):
            store_byte(key + _KEY_TS + j, d[U(stamps + _TS_AT + 7 - j)])
        source = ids_at if rows[r, _R_OK] & _KIND_MASK == _ID_WALKED else d_at
        move(key + fixed, source + rows[r, _R_ID_AT], rows[r, _R_ID_BYTES])
        store_byte(key + n - 1, _KEY_END)
        # The event: its front up to the hex's varying part, its lengths, the hex, the rest.
        e, stop = offsets[i], offsets[i + 1]
        front = at[k + 2] - at[k + 1]
        move(out_at + e, template_at + at[k + 1], front)
        store_i32(out_at + e, stop - e)
        typed = at[k + _TYPED + 1] - at[k + _TYPED]
        store_i32(out_at + e + _ID_LENGTH_AT, 2 * n + 17 + typed)
        store_i32(out_at + e + _DATA_LENGTH_AT, 2 * n + 1)
        hex_at(out_at + e + _HEX_AT + 2 * _KEY_TS, key + _KEY_TS, 8)
        hex_at(out_at + e + _HEX_AT + 2 * fixed, key + fixed, n - fixed)
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
        else:
            move(out_at + e, extra_data_at + extra_at[i], stop - e)
    return keys.reshape(m, width), out, offsets


def splice_entries(
    batch: OplogBatch, splice: bool = True, expanded: bool = False, applied: bool = True
) -> EventBlock | list[Any]:
    """The batch's events as one EventBlock when every entry is a plain insert, update,
    replacement or delete this module takes (the usual batch of a backlog), or an entry of a
    transaction the batch holds whole whose ops are (txn_batch.py: its events at its commit's
    place); else one item for each other entry, in order: its event's fields (`splice_crud`'s),
    () for an entry with no event, or the entry's own bytes when the general, stateful
    transform must handle it (transactions, DDL, noops), with the block's runs of at least
    BLOCK_RUN_MIN events between them one EventBlock item each, shorter ones as fields. A block
    keeps no applied-at time (a prepared or multi-entry transaction's ops'): with `applied` (a
    stream that reads pre-images), such transactions' events are fields, at their commit's
    place."""
    if not splice:
        return batch.entries()
    transactions = functools.partial(splice_block, expanded=expanded)
    if len(batch) < BATCH_MIN:
        items = [_one_by_one(entry, None, expanded) for entry in batch.entries()]
        return with_transactions(items, expanded, transactions)
    out, block, taken = splice_block(batch, expanded=expanded)
    if block is not None and len(taken) == len(batch):
        return block
    at, items = _outside(batch, out, taken, expanded)
    txns = placed(items, expanded, transactions, True, applied)
    # Where the block's events (the batch's, and the transactions' at their commits) go among
    # the items left.
    whole, places = with_transactions_in(block, taken, txns.block, [at[i] for i in txns.commits])
    order = _left(len(items), txns.replaced)
    if whole is not None and not order:
        return whole
    return cut_around(whole, places, order, at, items, txns.replaced, BLOCK_RUN_MIN)


def _left(n: int, replaced: dict[int, list[Any]]) -> list[int]:
    """Of n items, those that stay, in order: all but the entries of transactions whose events
    are in the block (replaced by none)."""
    return [j for j in range(n) if replaced.get(j, True)]


def _outside(
    batch: OplogBatch, out: list[Any], taken: npt.NDArray[np.intp], expanded: bool
) -> tuple[list[int], list[Any]]:
    """The entries outside the block: where each is in the batch, and its item (see
    `_one_by_one`). Only those splice_block did not splice are cut out of the batch."""
    outside = np.ones(len(batch), np.bool_)
    outside[taken] = False
    at = np.flatnonzero(outside).tolist()
    todo = [i for i in at if out[i] is None]
    entries = iter(batch.entries_at(todo) if todo else [])
    return at, [
        _one_by_one(next(entries), None, expanded) if out[i] is None else out[i] for i in at
    ]


def _one_by_one(entry: bytes, made: Spliced | tuple[()] | None, expanded: bool) -> Any:
    """What splice_entries gives for an entry outside the block: what splice_block made of it,
    else its event's fields (splice_crud's), else its bytes, for the general transform.

    splice_crud takes the CRUD shapes the block does not: other documentKeys (see batch_layout's
    _R_OK), replacements whose o holds the bytes `$v\0` or is not led by `_id` (walked there),
    and entries of any field order. The stateful transform (OplogTransformer) keeps the
    transactions a batch does not hold whole (applyOps chains and prepared commits carry state
    across entries: the transaction's lsid, txnNumber and each op's txnOpIndex in its token; it
    splices their plain writes with mongoformats.txn_splice; txn_batch.py takes the others),
    DDL and noops: an entry whose op is a command's or a noop's (`not_crud`) is not walked."""
    if made is None and not not_crud(entry):
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
    warm_up_transactions(functools.partial(splice_block, expanded=False))
    # And what a release does with blocks: merge, take each bucket's share, key a reply's batch
    # from where its events lie (or from a block's own column), gather a column.
    if block is not None:
        share = EventBlock.merge([block, block]).take(np.arange(2))
        share.array_body(0).materialize()
        share.own().array_body(0).materialize()
        # The deal by documentKey, of a block made here and of one a reader process sent (its
        # columns read-only: numba compiles that signature apart).
        for dealt in (share, pickle.loads(pickle.dumps(block, protocol=5))):
            dealt.document_buckets(4)
