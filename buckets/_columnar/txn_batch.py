"""The transactions a batch of oplog entries holds whole, their writes spliced together by the
batch splice's compiled kernels (batch_splice.splice_block).

Why: the general transform (mongoformats.change_events.OplogTransformer) reads a transaction's
entries and splices its ops one by one in Python (txn_splice.read_apply_ops, splice_txn_op),
each op at the cost of a plain write's one-by-one splice. Here the batch's transaction entries
are read in one compiled loop (txn_read.py); an op of an applyOps entry, given its commit's
stamp (ts, t, v, wall), is a plain write's entry (txn_splice.txn_entry), so the ops of all the
batch's transactions go through the batch splice at once; and its block's events get their
transaction's lsid, txnNumber and txnOpIndex in another compiled loop (txn_events.py), which
writes what txn_splice.txn_event (splice_txn_op's last step) writes.

Which transactions: those whose every entry is in the batch, as read_apply_ops reads them: an
applyOps that commits with a null prevOpTime (a transaction of one entry, or batched writes),
or a chain that starts in the batch (a partialTxn or prepare entry of null prevOpTime) whose
entries each link back to the one before, up to the one that commits it (an applyOps, or a
prepared transaction's commitTransaction). Their entries leave the batch's items: the last
gives its events, the others none; its events stay the block's rows (`placed`), which the batch
splice puts into its block at the commit (batch_splice._with_transactions), unless some op's
event is not the block's or (for a stream that reads pre-images) has an applied-at time: then
as fields. The transformer keeps transactions' state across batches; it gets every other entry
of a transaction, a whole chain at a time: a chain the batch does not hold whole, or one that
an op the splice leaves (DDL, views, migrations' writes, rare shapes) or another entry of its
key (lsid, txnNumber) keeps out.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any, NamedTuple

import bson
import numpy as np
import numpy.typing as npt
from bson import Timestamp

from buckets._columnar.event_block import EventBlock
from buckets._columnar.oplog_batch import OplogBatch, starts_of
from buckets._columnar.txn_chains import STAMP_TAIL, Chains, command_items, server_chains
from buckets._columnar.txn_events import HeadTable, TxnRows, joined, txn_block, txn_done
from buckets._columnar.txn_read import (
    R_BUFFERED,
    R_NUMBER,
    R_OK,
    R_OPS,
    R_PREV,
    R_TAIL,
    R_TS,
    op_entries,
    read_rows,
)
from mongoformats.oplog_splice import splice_crud
from mongoformats.txn_splice import (
    TxnKey,
    read_apply_ops,
    server_stamp,
    txn_event,
)

__all__ = ["TXN_OPS_MIN", "BatchSplice", "warm_up", "whole_chains", "with_transactions"]

# Fewer ops are left to the transformer: this path's fixed cost per batch (the compiled calls,
# the block's templates) is some ten ops' splices one by one.
TXN_OPS_MIN = 12

# batch_splice.splice_block at the batch's `expanded` (given by the caller, which imports this).
BatchSplice = Callable[[OplogBatch], tuple[list[Any], EventBlock | None, npt.NDArray[np.intp]]]


class _Read(NamedTuple):
    """A transaction's entry as read_apply_ops reads it (txn_splice.ApplyOps), its times as
    words (a BSON timestamp's 8 bytes read as one little-endian word: comparable, and only
    made Timestamps for the events that show them); a null prevOpTime as 0. Its ops and its
    stamp's tail (a commit's: ts, t, v, wall; -1 for none) are where they lie in its
    _Reads' data: the ops as rows of its `spans`, the tail as an offset, of `tail_size`
    bytes; its stamp's head (txnNumber, lsid) as bytes."""

    key: TxnKey | None
    ts: int
    prev: int
    buffered: bool
    ops: range
    tail: int
    tail_size: int
    head: bytes


class _Reads(NamedTuple):
    """The transactions' entries of a list of items (each with its index) and where their ops
    and stamps lie (`data`; each op's start and end in it, `spans`)."""

    data: bytes | bytearray
    spans: npt.NDArray[np.int64]
    reads: list[tuple[int, _Read]]


# A transaction's entries in the batch: each one's index among the items, and what it reads.
_Chain = list[tuple[int, _Read]]


class Placed(NamedTuple):
    """What the transactions a list of items holds whole become (`placed`): the items that
    replace theirs (`replaced`: a commit's its events' fields, another entry none), and the
    events of those kept as columns (`block`, in the order of their commits, their heads and
    txnOpIndexes written when they are put into the batch's block, txn_events.put_in; None if
    none), each with the index of its commit's item (`commits`, sorted)."""

    replaced: dict[int, list[Any]]
    block: TxnRows | None
    commits: npt.NDArray[np.int64]


def with_transactions(items: list[Any], expanded: bool, splice: BatchSplice) -> list[Any]:
    """`items` (batch_splice.splice_entries') with the entries of the transactions they hold
    whole (see the module's docstring) replaced by their events' fields; the others as they
    are."""
    replaced = placed(items, expanded, splice, columns=False, applied=True).replaced
    out: list[Any] = []
    last = 0
    for at in sorted(replaced):
        out += items[last:at]
        out += replaced[at]
        last = at + 1
    return out + items[last:]


def placed(
    items: list[Any], expanded: bool, splice: BatchSplice, columns: bool, applied: bool
) -> Placed:
    """The transactions the items hold whole (see the module's docstring), their entries' items
    replaced; with `columns`, the events of those whose ops the block splice made all of (and
    nothing else) kept in a block, not made into fields. A block keeps no applied-at time: with
    `applied` (a stream that reads pre-images, see buckets/lookup.py), only transactions whose
    events have none (their ops all in their commit) are kept so."""
    chains = _chains(items)
    if int(chains.counts.sum()) < TXN_OPS_MIN:
        return Placed({}, None, _NO_COMMITS)
    made = _spliced(chains, expanded, splice, columns, applied)
    replaced, commits = _placed_items(chains, made)
    return Placed(replaced, made.block, commits)


def _placed_items(
    chains: Chains, made: _Made
) -> tuple[dict[int, list[Any]], npt.NDArray[np.int64]]:
    """Placed's `replaced` and `commits` of the chains' events `made`: every entry of a chain
    not left to the transformer replaced by none of its events, its commit by its events'
    fields, or by rows of the block (its index in `commits` for each). Chains may interleave:
    each entry is replaced where it is. Done as columns: a batch holds hundreds."""
    counts = made.counts
    kept = np.repeat(counts >= 0, chains.lengths)
    items = np.asarray(chains.items, np.int64)
    # (the lists are never changed: one empty list serves every entry)
    replaced: dict[int, list[Any]] = dict.fromkeys(items[kept].tolist(), _NO_EVENTS)
    commits = items[starts_of(chains.lengths) + chains.lengths - 1]
    for c, events in made.fields.items():
        if events:
            replaced[int(commits[c])] = events
    placed = counts > 0
    return replaced, np.repeat(commits[placed], counts[placed])


_NO_EVENTS: list[Any] = []
_NO_COMMITS = np.zeros(0, np.int64)


def _chains(items: list[Any]) -> Chains:
    """The transactions the items hold whole, as columns: read at once if their entries are of
    the server's shape (txn_chains.py), else one by one (`whole_chains`)."""
    at = command_items(items)
    chains = server_chains(items, at) if at else None
    return chains if chains is not None else _columns_of(*whole_chains(items))


def _columns_of(reads: _Reads, chains: list[_Chain]) -> Chains:
    """`whole_chains`' transactions as columns (txn_chains.Chains)."""
    members = [read for chain in chains for _, read in chain]
    commits = [chain[-1][1] for chain in chains]
    tails = _column(commits, "tail")
    assert (tails >= 0).all()  # read_apply_ops gives a commit its stamp
    return Chains(
        reads.data,
        reads.spans,
        [i for chain in chains for i, _ in chain],
        np.fromiter(map(len, chains), np.int64, len(chains)),
        np.fromiter((read.ops.start for read in members), np.int64, len(members)),
        np.fromiter((len(read.ops) for read in members), np.int64, len(members)),
        _column(members, "ts", np.uint64),
        tails,
        _column(commits, "tail_size"),
        HeadTable.of([read.head for read in commits]),
    )


def whole_chains(items: list[Any]) -> tuple[_Reads, list[_Chain]]:
    """The items' transactions' entries read, and the transactions they hold whole, in the order
    of their commits."""
    reads = _reads(items)
    open_chains: dict[TxnKey, _Chain] = {}
    general: set[TxnKey] = set()  # keys whose entries stay the transformer's
    whole: list[_Chain] = []
    for i, read in reads.reads:
        if read.key is None:  # batched writes: no transaction's chain
            if not read.prev:
                whole.append([(i, read)])
            continue
        chain = _linked(open_chains.pop(read.key, None), i, read)
        if chain is None or read.key in general:
            general.add(read.key)
        elif read.buffered:
            open_chains[read.key] = chain
        else:
            whole.append(chain)
    return reads, whole


def _reads(items: list[Any]) -> _Reads:
    """The items' applyOps and commitTransaction entries, each with its index, as read_apply_ops
    reads them: at once in a compiled loop (txn_read.py) if of the server's shape, else by
    read_apply_ops itself."""
    at = command_items(items)
    if not at:
        return _Reads(b"", np.zeros((0, 2), np.int64), [])
    entries = [items[i] for i in at]
    batch = OplogBatch.of(entries)
    rows, spans = read_rows(batch.data, batch.starts, batch.lengths)
    walked = _Walked(len(batch.data), len(spans))
    out = []
    for i, entry, start, row, (ts, prev) in zip(
        at,
        entries,
        batch.starts.tolist(),
        rows.tolist(),
        rows.view(np.uint64)[:, R_TS : R_PREV + 1].tolist(),
        strict=True,
    ):
        read = _server_read(entry, start, row, ts, prev) if row[R_OK] else walked.read(entry)
        if read is not None:
            out.append((i, read))
    return walked.joined(batch.data, spans, out)


def _server_read(entry: bytes, start: int, row: list[int], ts: int, prev: int) -> _Read:
    """An entry the compiled loop read (its `row`), at `start` in the reads' data."""
    buffered = bool(row[R_BUFFERED])
    return _Read(
        (entry[23:39], row[R_NUMBER]),  # (where server_elements finds the lsid's id)
        ts,
        prev,
        buffered,
        range(row[R_OPS], row[R_OPS + 1]),
        -1 if buffered else start + row[R_TAIL],
        0 if buffered else STAMP_TAIL,
        b"" if buffered else server_stamp(entry, row[R_TAIL])[1],
    )


class _Walked:
    """The entries not of the server's shape, read by read_apply_ops: their ops and stamps'
    tails put after the reads' data (of `size` bytes, `ops` ops' spans)."""

    def __init__(self, size: int, ops: int) -> None:
        self.size, self.ops = size, ops
        self.parts: list[bytes] = []
        self.spans: list[tuple[int, int]] = []

    def read(self, entry: bytes) -> _Read | None:
        """The entry's _Read, None if read_apply_ops does not read it."""
        read = read_apply_ops(entry)
        if read is None:
            return None
        first = self.ops + len(self.spans)
        for op in read.ops:
            self.spans.append((self.size, self.size + len(op)))
            self._put(op)
        tail, tail_size, head = -1, 0, b""
        if read.stamp is not None:
            tail, tail_size, head = self.size, len(read.stamp[0]), read.stamp[1]
            self._put(read.stamp[0])
        prev = 0 if read.prev is None else _word(read.prev)
        ops = range(first, first + len(read.ops))
        return _Read(read.key, _word(read.ts), prev, read.buffered, ops, tail, tail_size, head)

    def _put(self, part: bytes) -> None:
        self.parts.append(part)
        self.size += len(part)

    def joined(
        self, data: bytes | bytearray, spans: npt.NDArray[np.int64], reads: list[tuple[int, _Read]]
    ) -> _Reads:
        """The reads, their data and spans with the walked entries' parts after them."""
        if not self.parts:
            return _Reads(data, spans, reads)
        walked = np.array(self.spans, np.int64).reshape(-1, 2)
        return _Reads(b"".join([data, *self.parts]), np.concatenate([spans, walked]), reads)


def _word(ts: Timestamp) -> int:
    """A timestamp as _Read's word."""
    return ts.time << 32 | ts.inc


def _linked(chain: _Chain | None, i: int, read: _Read) -> _Chain | None:
    """The chain the entry at `i` continues (`chain`, its key's open one) or starts; None if it
    does neither (its chain began before the batch, or its key's entries do not link up)."""
    if chain is None:
        return [(i, read)] if not read.prev else None
    return [*chain, (i, read)] if read.prev == chain[-1][1].ts else None


class _Ops(NamedTuple):
    """The ops of the transactions spliced together: those of each of their entries (`firsts`,
    `counts`: its ops' rows in the _Reads' spans) with its commit's stamp's tail (`tails`,
    `tail_sizes`); then each op's transaction's head (txn_event's `head`: its txnNumber and
    lsid), its txnOpIndex, and its applied-at time (`timed`: whether it has one, `when`: the
    ts of its entry as _Read's word, `at`: its index in its entry); `bounds`: where each
    transaction's ops start, and where the last ends."""

    firsts: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]
    tails: npt.NDArray[np.int64]
    tail_sizes: npt.NDArray[np.int64]
    heads: HeadTable
    indexes: npt.NDArray[np.int64]
    timed: npt.NDArray[np.bool_]
    when: npt.NDArray[np.uint64]
    at: npt.NDArray[np.int64]
    bounds: npt.NDArray[np.int64]

    def entries(self, chains: Chains) -> OplogBatch:
        """The ops as plain writes' entries (txn_entry), in one batch (txn_read.op_entries)."""
        columns = (self.firsts, self.counts, self.tails, self.tail_sizes)
        return OplogBatch(*op_entries(chains.data, chains.spans, *columns))


def _ops(chains: Chains) -> _Ops:
    """The chains' ops, as columns (see _Ops). Their applied-at times are as the transformer's
    `_unwind` gives them: where each was written, unless at its index in the commit (the
    commit's ops, if they come first)."""
    lengths, counts = chains.lengths, chains.counts
    firsts = starts_of(lengths)  # each chain's first entry
    per_chain = np.add.reduceat(np.append(counts, 0), firsts)[: len(lengths)]
    bounds = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(per_chain, out=bounds[1:])
    read_starts = starts_of(counts)  # where each entry's ops start
    commit_ts = np.repeat(chains.ts[firsts + lengths - 1], lengths)
    timed = (read_starts > np.repeat(bounds[:-1], lengths)) | (chains.ts != commit_ts)
    ops = np.arange(int(bounds[-1]))
    return _Ops(
        chains.firsts,
        counts,
        np.repeat(chains.tails, lengths),
        np.repeat(chains.tail_sizes, lengths),
        chains.heads.repeat(per_chain),
        ops - np.repeat(bounds[:-1], per_chain),
        np.repeat(timed, counts),
        np.repeat(chains.ts, counts),
        ops - np.repeat(read_starts, counts),
        bounds,
    )


def _column(reads: list[_Read], name: str, dtype: Any = np.int64) -> npt.NDArray[Any]:
    """The reads' field `name` as an array."""
    return np.array(list(map(attrgetter(name), reads)), dtype)


class _Made(NamedTuple):
    """Each chain's events: kept in columns, counts[c] rows of `block`; made fields, fields[c]
    (counts[c] 0); or left to the transformer, fields[c] None (counts[c] -1)."""

    counts: npt.NDArray[np.int64]
    fields: dict[int, list[Any] | None]
    block: TxnRows | None


def _spliced(
    chains: Chains,
    expanded: bool,
    splice: BatchSplice,
    columns: bool,
    applied: bool,
) -> _Made:
    """Each chain's events (see _Made); in `block`, with `columns`, those of the chains whose
    ops' events are all the block splice's (or none), and with `applied`, have no applied-at
    time."""
    ops = _ops(chains)
    bounds = ops.bounds
    batch = ops.entries(chains)
    out, block, taken = splice(batch)
    indexes = ops.indexes[taken]
    counts = np.full(len(bounds) - 1, -1, np.int64)
    if columns and block is not None:
        done = txn_done(block, indexes)
        counts = _columnar(taken, out, done, bounds, ops.timed if applied else None)
    fields: dict[int, list[Any] | None] = {}
    left = np.flatnonzero(counts < 0).tolist()
    if left:
        rows = np.full(len(batch), -1, np.int64)  # each op's row in the block, if it has one
        rows[taken] = np.arange(len(taken))
        # The rows made their transactions' here only for chains made fields.
        rewritten, done_list = (
            txn_block(block, ops.heads.take(taken).rows(), indexes.tolist())
            if block is not None
            else (None, [])
        )
        made = _Fields(ops, batch, rows.tolist(), out, rewritten, done_list, expanded)
        edges = bounds.tolist()
        fields = {c: made.chain(edges[c], edges[c + 1]) for c in left}
        counts[[c for c in left if fields[c] is not None]] = 0
    kept_rows = None
    if block is not None:
        kept_rows = _kept_rows(block, ops.heads.take(taken), indexes, taken, counts, bounds)
    return _Made(counts, fields, kept_rows)


class _Fields:
    """The ops' events as fields, for the chains not kept in a block (see `_made`); the
    rewritten block's fields are made once, for the first such chain."""

    def __init__(
        self,
        ops: _Ops,
        batch: OplogBatch,
        rows: list[int],
        out: list[Any],
        rewritten: EventBlock | None,
        done: list[bool],
        expanded: bool,
    ) -> None:
        self.batch = batch
        self.ops, self.rows, self.out, self.done, self.expanded = ops, rows, out, done, expanded
        self.rewritten = rewritten
        self.fields: list[tuple[Any, ...]] | None = None
        self.listed: _Listed | None = None

    def chain(self, a: int, b: int) -> list[Any] | None:
        """The events of ops [a, b) (a chain's); None if one is left to the transformer."""
        if self.fields is None or self.listed is None:
            self.fields = self.rewritten.fields() if self.rewritten is not None else []
            o = self.ops
            self.listed = _Listed(
                o.heads.rows(), *(c.tolist() for c in (o.indexes, o.timed, o.when, o.at))
            )
        ops, rows, out, fields, done = self.listed, self.rows, self.out, self.fields, self.done
        made = [
            _made(ops, self.batch, i, rows[i], out[i], fields, done, self.expanded)
            for i in range(a, b)
        ]
        return None if None in made else list(filter(None, made))


def _columnar(
    taken: npt.NDArray[np.intp],
    out: list[Any],
    done: npt.NDArray[np.bool_],
    bounds: npt.NDArray[np.int64],
    applied: npt.NDArray[np.bool_] | None,
) -> npt.NDArray[np.int64]:
    """Of each chain, its count of rows in the block if its every op has its row there (the
    `taken` ops), made (`done`), or makes no event (out's ()), and if `applied` (the ops'
    applied-at times) is given, none has one; else -1."""
    has = np.zeros(len(out), np.bool_)
    has[taken] = True
    ok = np.zeros(len(out), np.bool_)
    ok[taken] = done
    if len(taken) < len(out):
        outside = np.flatnonzero(~has)
        ok[outside] = [out[i] == () for i in outside.tolist()]
    if applied is not None:
        ok &= ~applied
    # (one more op, neutral, past the last: an empty chain's start is then one to read)
    starts = bounds[:-1]
    good = np.logical_and.reduceat(np.append(ok, True), starts) & (bounds[1:] > starts)
    counts = np.add.reduceat(np.append(has, False).astype(np.int64), starts)
    return np.where(good, counts, -1)


def _kept_rows(
    block: EventBlock,
    heads: HeadTable,
    indexes: npt.NDArray[np.int64],
    taken: npt.NDArray[np.intp],
    counts: npt.NDArray[np.int64],
    bounds: npt.NDArray[np.int64],
) -> TxnRows | None:
    """The rows of the chains kept in columns (those of `counts` above 0, of the block splice's
    `block` of the ops `taken`, each row's head and txnOpIndex), in their order; None if none.
    `bounds`: where each chain's ops start."""
    total = int(counts[counts > 0].sum())
    if not total:
        return None
    if total == len(block):
        return TxnRows(block, heads, indexes)
    at = np.flatnonzero(np.repeat(counts > 0, np.diff(bounds))[taken])
    return TxnRows(block.take(at), heads.take(at), indexes[at])


class _Listed(NamedTuple):
    """_Ops' columns of each op, as lists."""

    heads: list[bytes]
    indexes: list[int]
    timed: list[bool]
    when: list[int]
    at: list[int]


def _made(
    ops: _Listed,
    batch: OplogBatch,
    i: int,
    row: int,
    spliced: Any,
    fields: list[tuple[Any, ...]],
    done: list[bool],
    expanded: bool,
) -> Any:
    """Op i's event as the transformer makes it (None: left to it; (): no event): its row of
    the rewritten block (txn_events.py), else the splice's or splice_crud's event made its
    transaction's by txn_event (splice_txn_op's last step)."""
    when = _applied_at(ops.when[i], ops.at[i]) if ops.timed[i] else None
    if row >= 0 and done[row]:
        return (*fields[row][:-1], when)
    made = spliced if spliced is not None else splice_crud(batch.entry(i), expanded=expanded)
    event = txn_event(made, ops.heads[i], ops.indexes[i]) if made else made
    return (*event[:-1], when) if event else event


def _applied_at(when: int, at: int) -> tuple[Timestamp, int]:
    """An applied-at time of _Ops' (a word and an index) as the transformer gives it."""
    return Timestamp(when >> 32, when & 0xFFFFFFFF), at


def warm_up(splice: BatchSplice) -> None:
    """Compile the kernels of the read (txn_read.py) and of the rewrite (txn_events.py), or
    load them from numba's cache, on a transaction of two inserts (see batch_splice.warm_up)."""
    ui, oid = bson.Binary(bytes(16), 4), bson.ObjectId(bytes(12))
    op = {"op": "i", "ns": "db.c", "ui": ui, "o": {"_id": oid}, "o2": {"_id": oid}}
    entry = {
        "lsid": {"id": ui, "uid": bson.Binary(bytes(32), 0)},
        "txnNumber": bson.Int64(1),
        "op": "c",
        "ns": "admin.$cmd",
        "o": {"applyOps": [op, op]},
        "ts": Timestamp(1, 1),
        "t": bson.Int64(1),
        "v": bson.Int64(2),
        "wall": bson.datetime_ms.DatetimeMS(0),
        "prevOpTime": {"ts": Timestamp(0, 0), "t": bson.Int64(-1)},
    }
    rows = _spliced(_chains([bson.encode(entry)]), False, splice, True, False).block
    assert rows is not None
    # their writing into a block of their own (the room a batch's block leaves for them is
    # written by the same kernel), and the rewrite of a block's rows one by one
    joined(rows)
    txn_block(rows.block, rows.heads.rows(), rows.indexes.tolist())
