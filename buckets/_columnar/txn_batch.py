"""The transactions a batch of oplog entries holds whole, their writes spliced together by the
batch splice's compiled kernels (batch_splice.splice_block).

Why: the general transform (mongoformats.change_events.OplogTransformer) splices a transaction's
ops one by one in Python (txn_splice.splice_txn_op), each at the cost of a plain write's
one-by-one splice. An op of an applyOps entry, given its commit's stamp (ts, t, v, wall), is a
plain write's entry (txn_splice.txn_entry): so the ops of all the transactions of a batch go
through the batch splice at once, and each event then gets its transaction's lsid, txnNumber
and txnOpIndex (txn_splice.txn_event), which gives what splice_txn_op gives.

Which transactions: those read from their bytes (txn_splice.read_apply_ops) whose every entry
is in the batch: an applyOps that commits with a null prevOpTime (a transaction of one entry,
or batched writes), or a chain that starts in the batch (a partialTxn or prepare entry of null
prevOpTime) whose entries each link back to the one before, up to the one that commits it (an
applyOps, or a prepared transaction's commitTransaction). Their entries leave the batch's items:
the last gives its events, the others none. The transformer keeps transactions' state across
batches; it gets every other entry of a transaction, a whole chain at a time: a chain the batch
does not hold whole, or one that an op the splice leaves (DDL, views, migrations' writes, rare
shapes) or another entry of its key (lsid, txnNumber) keeps out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from bson import Timestamp

from buckets._columnar.event_block import EventBlock
from buckets._columnar.oplog_batch import OplogBatch
from buckets._columnar.txn_read import (
    R_BUFFERED,
    R_NUMBER,
    R_OK,
    R_OPS,
    R_PREV,
    R_TAIL,
    R_TS,
    read_rows,
)
from mongoformats.oplog_splice import Spliced, splice_crud
from mongoformats.txn_splice import (
    TxnKey,
    TxnStamp,
    read_apply_ops,
    server_stamp,
    txn_entry,
    txn_event,
)

__all__ = ["TXN_OPS_MIN", "BatchSplice", "whole_chains", "with_transactions"]

# Fewer ops are left to the transformer: the batch splice's fixed cost per call outweighs its
# gain (a few dozen microseconds, some ops' splices one by one).
TXN_OPS_MIN = 16

_COMMAND_OP = b"\x02op\x00\x02\x00\x00\x00c\x00"  # the element op: "c"

# batch_splice.splice_block at the batch's `expanded` (given by the caller, which imports this).
BatchSplice = Callable[[OplogBatch], tuple[list[Any], EventBlock | None, npt.NDArray[np.intp]]]


class _Read(NamedTuple):
    """A transaction's entry as read_apply_ops reads it (txn_splice.ApplyOps), its times as
    words (a BSON timestamp's 8 bytes read as one little-endian word: comparable, and only
    made Timestamps for the events that show them); a null prevOpTime as 0."""

    key: TxnKey | None
    ts: int
    prev: int
    buffered: bool
    ops: list[bytes]
    stamp: TxnStamp | None


# A transaction's entries in the batch: each one's index among the items, and what it reads.
_Chain = list[tuple[int, _Read]]


def with_transactions(items: list[Any], expanded: bool, splice: BatchSplice) -> list[Any]:
    """`items` (batch_splice.splice_entries') with the entries of the transactions they hold
    whole (see the module's docstring) replaced by their events' fields; the others as they
    are."""
    chains = whole_chains(items)
    if sum(len(read.ops) for chain in chains for _, read in chain) < TXN_OPS_MIN:
        return items
    made = _spliced(chains, expanded, splice)
    out: list[Any] = []
    last = 0
    for chain, events in zip(chains, made, strict=True):
        if events is None:  # left to the transformer, whole
            continue
        for at, _ in chain:
            out += items[last:at]
            last = at + 1
        out += events
    return out + items[last:] if last else items


def whole_chains(items: list[Any]) -> list[_Chain]:
    """The transactions the items hold whole, in the order of their commits."""
    open_chains: dict[TxnKey, _Chain] = {}
    general: set[TxnKey] = set()  # keys whose entries stay the transformer's
    whole: list[_Chain] = []
    for i, read in _reads(items):
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
    return whole


def _reads(items: list[Any]) -> list[tuple[int, _Read]]:
    """The items' applyOps and commitTransaction entries, each with its index, as read_apply_ops
    reads them: at once in a compiled loop (txn_read.py) if of the server's shape, else by
    read_apply_ops itself."""
    at = [i for i, item in enumerate(items) if type(item) is bytes and _COMMAND_OP in item]
    if not at:
        return []
    entries = [items[i] for i in at]
    batch = OplogBatch.of(entries)
    rows, spans = read_rows(batch.data, batch.starts, batch.lengths)
    data, ops = batch.data, spans.tolist()
    out = []
    for i, entry, row, (ts, prev) in zip(
        at, entries, rows.tolist(), rows.view(np.uint64)[:, R_TS : R_PREV + 1].tolist(), strict=True
    ):
        if row[R_OK]:
            read: _Read | None = _Read(
                (entry[23:39], row[R_NUMBER]),  # (where server_elements finds the lsid's id)
                ts,
                prev,
                bool(row[R_BUFFERED]),
                [data[a:b] for a, b in ops[row[R_OPS] : row[R_OPS + 1]]],
                None if row[R_BUFFERED] else server_stamp(entry, row[R_TAIL]),
            )
        else:
            read = _walked(entry)
        if read is not None:
            out.append((i, read))
    return out


def _walked(entry: bytes) -> _Read | None:
    """An entry not of the server's shape, read by read_apply_ops."""
    read = read_apply_ops(entry)
    if read is None:
        return None
    prev = 0 if read.prev is None else _word(read.prev)
    return _Read(read.key, _word(read.ts), prev, read.buffered, read.ops, read.stamp)


def _word(ts: Timestamp) -> int:
    """A timestamp as _Read's word."""
    return ts.time << 32 | ts.inc


def _linked(chain: _Chain | None, i: int, read: _Read) -> _Chain | None:
    """The chain the entry at `i` continues (`chain`, its key's open one) or starts; None if it
    does neither (its chain began before the batch, or its key's entries do not link up)."""
    if chain is None:
        return [(i, read)] if not read.prev else None
    return [*chain, (i, read)] if read.prev == chain[-1][1].ts else None


def _spliced(
    chains: list[_Chain], expanded: bool, splice: BatchSplice
) -> list[list[Spliced] | None]:
    """Each chain's events; None for a chain with an op the splice leaves to the transformer."""
    entries = [
        txn_entry(op, chain[-1][1].stamp[0])  # (a commit's stamp is never None)
        for chain in chains
        for _, read in chain
        for op in read.ops
    ]
    made = _made(entries, expanded, splice)
    out: list[list[Spliced] | None] = []
    at = 0
    for chain in chains:
        n = sum(len(read.ops) for _, read in chain)
        out.append(_events(chain, made[at : at + n]))
        at += n
    return out


def _made(
    entries: list[bytes], expanded: bool, splice: BatchSplice
) -> list[Spliced | tuple[()] | None]:
    """splice_crud's event of each entry (of an op given its commit's stamp), made by the batch
    splice: the block's events, or what it made one by one, or splice_crud's."""
    out, block, taken = splice(OplogBatch.of(entries))
    if block is not None:
        for i, fields in zip(taken.tolist(), block.fields(), strict=True):
            out[i] = fields
    return [
        made if made is not None else splice_crud(entry, expanded=expanded)
        for entry, made in zip(entries, out, strict=True)
    ]


def _events(chain: _Chain, made: list[Spliced | tuple[()] | None]) -> list[Spliced] | None:
    """The events of a transaction, from what the splice made of its ops (in order, every op of
    every entry): as the transformer's `_unwind` gives them (its txnOpIndex counts every op; an
    op's applied-at time is where it was written, unless at its index in the commit); None if
    one is left to the transformer."""
    commit = chain[-1][1]
    assert commit.stamp is not None  # read_apply_ops gives a commit its stamp
    head, ts = commit.stamp[1], commit.ts
    out: list[Spliced] = []
    where = [(read.ts, i) for _, read in chain for i in range(len(read.ops))]
    for index, ((entry_ts, entry_index), fields) in enumerate(zip(where, made, strict=True)):
        if fields is None:
            return None
        event = txn_event(fields, head, index) if fields else ()
        if event is None:
            return None
        if event:
            out.append(_applied(event, entry_ts, entry_index, index, ts))
    return out


def _applied(event: Spliced, entry_ts: int, entry_index: int, index: int, ts: int) -> Any:
    """The event with its applied-at time: None for an op at its index in the commit, else
    where it was written (a chain's or a prepare's entry and its index there)."""
    if entry_index == index and entry_ts == ts:
        return event
    return (*event[:-1], (Timestamp(entry_ts >> 32, entry_ts & 0xFFFFFFFF), entry_index))
