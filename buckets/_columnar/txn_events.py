"""A block of events the batch splice made of transactions' ops (txn_batch.py), made their
transactions' events in one compiled loop: what txn_splice.txn_event does to one event.

Each event gets its transaction's txnNumber and lsid elements (the commit's, given as `heads`)
before its `_id`, and, at an index past 0, the index's txnOpIndex in its token: the sort key's
KeyString head after the cluster time (version, tokenType, txnOpIndex, fromInvalidate) and, in
the event, the hex digits of that head, with the lengths of `_id` and `_data` grown to match.
An event whose token head is not the one the splice writes (txnOpIndex 0) is left (None), for
txn_event to judge.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from buckets._columnar.numba_cache import CACHE  # picks numba's cache dir before numba loads

# isort: split
import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from buckets._columnar.byte_kernels import (
    U,
    as_bytes,
    byte_table,
    copy,
    has,
    i32,
    put_i32,
)
from buckets._columnar.event_block import EventBlock
from mongoformats.oplog_splice import _ID_HEAD, _TOKEN_HEAD
from mongoformats.txn_splice import _HEAD_AT, _MAX_INDEX, _token_head

__all__ = ["HeadTable", "Room", "TxnRows", "joined", "put_in", "room", "txn_block", "txn_done"]

_Ints = npt.NDArray[np.int64]
_Bytes = npt.NDArray[np.uint8]

_P_TOKEN_HEAD = as_bytes(_TOKEN_HEAD)
_TOKEN_BYTES = len(_TOKEN_HEAD)
_HEX_AT = 4 + _ID_HEAD.size  # where an event's token hex starts (txn_splice's)
_ID_SIZE_AT, _DATA_SIZE_AT = 9, _HEX_AT - 4  # where `_id`'s and `_data`'s lengths are


class HeadTable(NamedTuple):
    """Transactions' heads (txnNumber's and lsid's elements) as the kernels read them: row j's
    head is data[starts[j]:ends[j]]. The rows of one transaction's ops share its head's bytes:
    a table of a batch's commits serves their ops by their starts and ends alone."""

    data: _Bytes
    starts: _Ints
    ends: _Ints

    @classmethod
    def of(cls, heads: list[bytes]) -> HeadTable:
        """A table of the heads, row j heads[j]."""
        data, at = byte_table(heads)
        return cls(data, at[:-1], at[1:])

    def take(self, rows: npt.NDArray[Any]) -> HeadTable:
        """Rows `rows`, in that order."""
        return HeadTable(self.data, self.starts[rows], self.ends[rows])

    def repeat(self, counts: _Ints) -> HeadTable:
        """Row j counts[j] times."""
        return HeadTable(self.data, np.repeat(self.starts, counts), np.repeat(self.ends, counts))

    def rows(self) -> list[bytes]:
        """Each row's head as bytes."""
        data = self.data.tobytes()
        return list(map(data.__getitem__, map(slice, self.starts.tolist(), self.ends.tolist())))


def txn_block(
    block: EventBlock, heads: list[bytes], indexes: list[int]
) -> tuple[EventBlock, list[bool]]:
    """The block's events (its rows' in order: each an op's, as splice_crud makes it) made their
    transactions': `heads[j]` and txnOpIndex `indexes[j]` written into row j's, as
    txn_splice.txn_event writes them; as a block of the same kinds, and which rows were made so:
    a row left has no bytes and an empty key, its event is txn_event's to judge."""
    top = max(indexes, default=0)
    if top > _MAX_INDEX:
        return block, [False] * len(block)
    table = HeadTable.of(heads)
    ks, ks_at, hexes, hex_at = _tokens(top)
    keys, out, out_at, done = _rewrite(
        *_columns(block),
        *table,
        np.array(indexes, np.int64),
        ks,
        ks_at,
        hexes,
        hex_at,
    )
    column = pa.Array.from_buffers(
        pa.large_binary(), len(block), [None, pa.py_buffer(out_at), pa.py_buffer(out)]
    )
    return EventBlock(keys, column, block.kinds, block.kind_table), done.tolist()


def txn_done(block: EventBlock, indexes: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Which of the block's rows `txn_block` would make its transaction's (its `done`), read
    from their keys at once: index 0, or a key of the token head the splice writes."""
    if len(indexes) and indexes.max() > _MAX_INDEX:
        return np.zeros(len(indexes), np.bool_)
    keys, end = block.keys, _HEAD_AT + _TOKEN_BYTES
    if keys.shape[1] < end:
        return indexes == 0
    return (indexes == 0) | (keys[:, _HEAD_AT:end] == _P_TOKEN_HEAD).all(axis=1)


class TxnRows(NamedTuple):
    """Rows of a block the batch splice made of transactions' ops (each `txn_done`), with each
    one's transaction's head and txnOpIndex (see `txn_block`), not yet written into them."""

    block: EventBlock
    heads: HeadTable
    indexes: npt.NDArray[np.int64]


class Room(NamedTuple):
    """The rows of a TxnRows as the kernels read them (`columns`: the block's keys, offsets and
    values, the heads' table, the txnOpIndexes, the token heads' tables), and each row's key's
    and event's bytes made its transaction's (`sizes`, `events`), the width their keys need
    (`width`): what a block leaves for them (block_events.assemble) and `put_in` writes from."""

    columns: tuple[_Bytes, _Ints, _Bytes, _Bytes, _Ints, _Ints, _Ints, _Bytes, _Ints, _Bytes, _Ints]
    sizes: _Ints
    events: _Ints
    width: int


def room(txns: TxnRows) -> Room:
    """The room the rows of `txns` made their transactions' (as `txn_block` makes them) take."""
    keys, offsets, values = _columns(txns.block)
    heads = txns.heads
    indexes = txns.indexes.astype(np.int64)
    tokens = _tokens(int(indexes.max()) if len(indexes) else 0)
    sizes, events, _ = _sizes(keys, offsets, heads.starts, heads.ends, indexes, tokens[1])
    width = max(int(sizes.max()), 1) if len(sizes) else 1
    return Room((keys, offsets, values, *heads, indexes, *tokens), sizes, events, width)


def put_in(
    keys: _Bytes, out: _Bytes, out_at: _Ints, cuts: npt.NDArray[np.int64], room: Room
) -> None:
    """Write the rows `room` holds made their transactions' (as `txn_block` writes them) into
    the room a block's kernel left for them (block_events.assemble with `room`'s events and
    width): the i-th into key row and event cuts[i] + i of `keys`, `out` and `out_at`."""
    _put_in(keys, out, out_at, *room.columns, room.sizes, np.asarray(cuts, np.int64))


def joined(txns: TxnRows) -> EventBlock:
    """The rows of `txns` made their transactions' (as `txn_block` makes them), as a block of
    its own columns (a shard's blocks are charged to its budget by their own bytes,
    EventBlock.hold): a batch's transactions when it has no block of its own to put them in."""
    made = room(txns)
    m = len(made.events)
    offsets = np.zeros(m + 1, np.int64)
    np.cumsum(made.events, out=offsets[1:])
    keys, out = np.zeros((m, made.width), np.uint8), np.empty(offsets[m], np.uint8)
    put_in(keys, out, offsets, np.zeros(m, np.int64), made)
    column = pa.Array.from_buffers(
        pa.large_binary(), m, [None, pa.py_buffer(offsets), pa.py_buffer(out)]
    )
    return EventBlock(keys, column, txns.block.kinds, txns.block.kind_table)


def _columns(block: EventBlock) -> tuple[_Bytes, _Ints, _Bytes]:
    """A block's keys, offsets and values, as the kernels read them."""
    events = block.events
    offsets = np.frombuffer(events.buffers()[1], np.int64)[events.offset :][: len(block) + 1]
    values = events.buffers()[2]
    return (
        np.ascontiguousarray(block.keys),
        offsets,
        as_bytes(values if values is not None else b""),
    )


def _tokens(top: int) -> tuple[_Bytes, _Ints, _Bytes, _Ints]:
    """The token heads of indexes 0 to `top` (KeyString, then hex digits), as byte tables."""
    tokens = [_token_head(k) for k in range(top + 1)]
    return (
        *byte_table([ks for ks, _ in tokens]),
        *byte_table([hex_digits for _, hex_digits in tokens]),
    )


@numba.njit(cache=CACHE, nogil=True)
def _sizes(
    keys: _Bytes, offsets: _Ints, head_at: _Ints, head_end: _Ints, indexes: _Ints, ks_at: _Ints
) -> tuple[_Ints, _Ints, npt.NDArray[np.bool_]]:
    """Each row's rewritten key's length and event's, and whether it is rewritten (see
    `txn_done`)."""
    m, width = keys.shape[0], keys.shape[1]
    sizes = np.zeros(m, np.int64)
    events = np.zeros(m, np.int64)
    done = np.zeros(m, np.bool_)
    for j in range(U(m)):
        n = width
        while n > 0 and keys[j, U(n - 1)] == 0:
            n -= 1
        k = indexes[j]
        grown = (ks_at[k + 1] - ks_at[k] - _TOKEN_BYTES) * (k > 0)
        done[j] = (k == 0) or has(keys[j], _HEAD_AT, _P_TOKEN_HEAD)
        sizes[j] = n + grown
        events[j] = offsets[j + 1] - offsets[j] + head_end[j] - head_at[j] + 2 * grown
    return sizes, events, done


@numba.njit(cache=CACHE, nogil=True)
def _rewrite(
    keys: _Bytes,
    offsets: _Ints,
    values: _Bytes,
    heads: _Bytes,
    head_at: _Ints,
    head_end: _Ints,
    indexes: _Ints,
    ks: _Bytes,
    ks_at: _Ints,
    hexes: _Bytes,
    hex_at: _Ints,
) -> tuple[_Bytes, _Bytes, _Ints, npt.NDArray[np.bool_]]:
    """The rewritten sort keys (rows padded with zeros), events (back to back, and offsets)
    and which rows were rewritten (a row not rewritten keeps no bytes). Two passes: sizes,
    then bytes."""
    m = keys.shape[0]
    sizes, events, done = _sizes(keys, offsets, head_at, head_end, indexes, ks_at)
    sizes *= done
    out_at = np.zeros(m + 1, np.int64)
    for j in range(U(m)):
        out_at[j + 1] = out_at[j] + events[j] * done[j]
    new_keys = np.zeros((m, max(sizes.max(), 1) if m else 1), np.uint8)
    out = np.empty(out_at[m], np.uint8)
    for j in range(U(m)):
        if done[j]:
            _one(
                keys[j],
                values,
                offsets[j],
                offsets[j + 1],
                heads,
                head_at[j],
                head_end[j],
                indexes[j],
                ks,
                ks_at,
                hexes,
                hex_at,
                new_keys[j],
                sizes[j],
                out,
                out_at[j],
            )
    return new_keys, out, out_at, done


@numba.njit(cache=CACHE, nogil=True)
def _put_in(
    new_keys: _Bytes,
    out: _Bytes,
    out_at: _Ints,
    keys: _Bytes,
    offsets: _Ints,
    values: _Bytes,
    heads: _Bytes,
    head_at: _Ints,
    head_end: _Ints,
    indexes: _Ints,
    ks: _Bytes,
    ks_at: _Ints,
    hexes: _Bytes,
    hex_at: _Ints,
    sizes: _Ints,
    cuts: _Ints,
) -> None:
    """`put_in`'s rows written where the room for them is, row i's key of sizes[i] bytes."""
    for i in range(U(len(cuts))):
        r = U(cuts[i] + i)
        _one(
            keys[i],
            values,
            offsets[i],
            offsets[i + 1],
            heads,
            head_at[i],
            head_end[i],
            indexes[i],
            ks,
            ks_at,
            hexes,
            hex_at,
            new_keys[r],
            sizes[i],
            out,
            out_at[r],
        )


@numba.njit(cache=CACHE)
def _one(
    key: _Bytes,
    values: _Bytes,
    start: int,
    end: int,
    heads: _Bytes,
    head: int,
    head_end: int,
    k: int,
    ks: _Bytes,
    ks_at: _Ints,
    hexes: _Bytes,
    hex_at: _Ints,
    new_key: _Bytes,
    size: int,
    out: _Bytes,
    e: int,
) -> None:
    """One event rewritten (see `_rewrite`): its key into `new_key` (`size` bytes), the event
    at out[e:]. At index 0 the key and the token stay; else the token's head is index k's."""
    h = head_end - head
    if k == 0:
        copy(new_key, 0, key, 0, size)
        put_i32(out, e, end - start + h)
        copy(out, e + 4, heads, head, h)
        copy(out, e + 4 + h, values, start + 4, end - start - 4)
        return
    token, token_end = ks_at[k], ks_at[k + 1]
    grown = token_end - token - _TOKEN_BYTES
    copy(new_key, 0, key, 0, _HEAD_AT)
    copy(new_key, _HEAD_AT, ks, token, token_end - token)
    copy(
        new_key,
        _HEAD_AT + token_end - token,
        key,
        _HEAD_AT + _TOKEN_BYTES,
        size - _HEAD_AT - (token_end - token),
    )
    put_i32(out, e, end - start + h + 2 * grown)
    copy(out, e + 4, heads, head, h)
    at = e + 4 + h  # the event's `_id` element, then the hex up to its head's digits
    copy(out, at, values, start + 4, _HEX_AT - 4 + 2 * _HEAD_AT)
    put_i32(out, at + _ID_SIZE_AT - 4, i32(values, start + _ID_SIZE_AT) + 2 * grown)
    put_i32(out, at + _DATA_SIZE_AT - 4, 2 * size + 1)
    at += _HEX_AT - 4 + 2 * _HEAD_AT
    digits = hex_at[k + 1] - hex_at[k]
    copy(out, at, hexes, hex_at[k], digits)
    rest = start + _HEX_AT + 2 * (_HEAD_AT + _TOKEN_BYTES)
    copy(out, at + digits, values, rest, end - rest)
