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
(block_events.py's `assemble`): two passes over the batch, where numpy
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
from typing import Any, NamedTuple

import bson
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from buckets._columnar.batch_layout import (
    _DELETE,
    _OPS,
    _R_HEAD_END,
    _R_KEY,
    _R_KEY_END,
    _R_LAID,
    _R_O_END,
    _R_O_START,
    _R_OK,
    _R_OP,
    _R_P,
    _R_STAMPS,
    _TS_AT,
    _WALL_AT,
    _layouts,
)
from buckets._columnar.block_events import assemble, kind_templates, wall_at
from buckets._columnar.block_merge import joined_kinds
from buckets._columnar.byte_kernels import as_bytes
from buckets._columnar.event_block import EventBlock
from buckets._columnar.id_keys import type_bits_of
from buckets._columnar.oplog_batch import OplogBatch, reply_batch
from buckets._columnar.txn_batch import placed, with_transactions
from buckets._columnar.txn_batch import warm_up as warm_up_transactions
from buckets._columnar.txn_events import TxnRows, joined, put_in, room
from buckets._columnar.txn_place import cut_around
from buckets._columnar.update_descriptions import Descriptions, other_descriptions
from mongoformats.oplog_splice import (
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
    out, laid, taken = _laid_out(batch, expanded)
    return out, _block(laid) if laid is not None else None, taken


class _Laid(NamedTuple):
    """What `assemble` writes a batch's block from (its arguments but the room it leaves), and
    its events' kinds and kind table."""

    d: npt.NDArray[np.uint8]
    ids: npt.NDArray[np.uint8]
    taken: npt.NDArray[np.intp]
    rows: _Ints
    which: _Ints
    templates: npt.NDArray[np.uint8]
    at: _Ints
    descriptions: Descriptions
    wall_at: int
    kinds: npt.NDArray[np.int32]
    kind_table: tuple[Any, ...]


def _assemble(
    laid: _Laid, cuts: _Ints, gaps: _Ints, least_width: int
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8], _Ints]:
    """`assemble` of what `laid` holds, with that room."""
    return assemble(
        laid.d,
        laid.ids,
        laid.taken,
        laid.rows,
        laid.which,
        laid.templates,
        laid.at,
        *laid.descriptions,
        laid.wall_at,
        cuts,
        gaps,
        least_width,
    )


def _laid_out(
    batch: OplogBatch, expanded: bool
) -> tuple[list[Spliced | tuple[()] | None], _Laid | None, npt.NDArray[np.intp]]:
    """`splice_block`'s first and third items, and what its block is written from (None if it
    has no events): all but the writing of the block's bytes, which splice_entries may leave
    room in for a batch's transactions' events (`_with_transactions`)."""
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
    templates, at = kind_templates(ops, made, id_kinds, expanded)
    kind_table = tuple(
        (op, h[1][1], h[1][2], h[1][3], type_bits_of(id_kind)) if h else ("", "", "", (), b"")
        for op, h, id_kind in zip(ops, made, id_kinds, strict=True)
    )
    kinds = which[taken].astype(np.int32)
    laid = _Laid(
        d,
        ids,
        taken,
        rows,
        which,
        templates,
        at,
        descriptions,
        wall_at(expanded),
        kinds,
        kind_table,
    )
    return out, laid, taken


_NO_ROOM = np.zeros(0, np.int64)


def _block(laid: _Laid) -> EventBlock:
    """The batch's block, written."""
    keys, events, offsets = _assemble(laid, _NO_ROOM, _NO_ROOM, 0)
    return EventBlock(keys, _column(events, offsets), laid.kinds, laid.kind_table)


def _column(events: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64]) -> pa.Array:
    return pa.Array.from_buffers(
        pa.large_binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(events)]
    )


def _with_transactions(
    laid: _Laid, txns: TxnRows, commits: npt.NDArray[np.intp]
) -> tuple[EventBlock, npt.NDArray[np.intp]]:
    """The batch's block with the transactions' events put in at their commits (`commits`, in
    the batch), as one block of its own columns, and the entry (its index in the batch) of each
    of its events: the block written with room for the transactions' events, which are then
    written into it (each event written once). Put in at its commit, a transaction's events
    are in token order: their clusterTime is the ts of the entry that commits it (the last
    applyOps or the commitTransaction: shared/reference/mongodb-formats.md C.6, "Change-stream
    semantics"), which no other entry of the shard's oplog has, and their txnOpIndex counts
    up."""
    cuts = np.searchsorted(laid.taken, commits)
    theirs = room(txns)
    keys, events, offsets = _assemble(laid, cuts.astype(np.int64), theirs.events, theirs.width)
    put_in(keys, events, offsets, cuts, theirs)
    kinds, table = joined_kinds((laid, txns.block))
    n = len(laid.taken)
    whole = EventBlock(keys, _column(events, offsets), np.insert(kinds[:n], cuts, kinds[n:]), table)
    # Each of the batch's spliced entries' events moves past the transactions' before it.
    return whole, np.sort(np.concatenate([laid.taken, commits]))


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
    out, laid, taken = _laid_out(batch, expanded)
    if laid is not None and len(taken) == len(batch):
        return _block(laid)
    at, items = _outside(batch, out, taken, expanded)
    txns = placed(items, expanded, transactions, True, applied)
    # Where the block's events (the batch's, and the transactions' at their commits) go among
    # the items left.
    commits = np.asarray(at, np.intp)[txns.commits]
    whole: EventBlock | None
    if txns.block is None:
        whole, places = _block(laid) if laid is not None else None, taken
    elif laid is None:
        whole, places = joined(txns.block), commits
    else:
        whole, places = _with_transactions(laid, txns.block, commits)
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
    entries = batch.entries_at(todo) if todo else []
    # Commands' and noops' entries (a batch's transactions) are told apart at once: each is its
    # own item, for the general path.
    made = iter(
        [
            entry if command else _one_by_one(entry, None, expanded)
            for entry, command in zip(entries, batch.not_crud(todo, entries), strict=True)
        ]
    )
    return at, [next(made) if out[i] is None else out[i] for i in at]


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
