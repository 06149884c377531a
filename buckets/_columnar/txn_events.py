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

from buckets._columnar.numba_cache import CACHE  # picks numba's cache dir before numba loads

# isort: split
import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from buckets._columnar.byte_kernels import U, as_bytes, byte_table, copy, has, i32, put_i32
from buckets._columnar.event_block import EventBlock
from mongoformats.oplog_splice import _ID_HEAD, _TOKEN_HEAD
from mongoformats.txn_splice import _HEAD_AT, _MAX_INDEX, _token_head

__all__ = ["txn_block"]

_Ints = npt.NDArray[np.int64]
_Bytes = npt.NDArray[np.uint8]

_P_TOKEN_HEAD = as_bytes(_TOKEN_HEAD)
_TOKEN_BYTES = len(_TOKEN_HEAD)
_HEX_AT = 4 + _ID_HEAD.size  # where an event's token hex starts (txn_splice's)
_ID_SIZE_AT, _DATA_SIZE_AT = 9, _HEX_AT - 4  # where `_id`'s and `_data`'s lengths are


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
    tokens = [_token_head(k) for k in range(top + 1)]
    events = block.events
    offsets = np.frombuffer(events.buffers()[1], np.int64)[events.offset :][: len(block) + 1]
    values = events.buffers()[2]
    keys, out, out_at, done = _rewrite(
        np.ascontiguousarray(block.keys),
        offsets,
        as_bytes(values if values is not None else b""),
        *byte_table(heads),
        np.array(indexes, np.int64),
        *byte_table([ks for ks, _ in tokens]),
        *byte_table([hex_digits for _, hex_digits in tokens]),
    )
    column = pa.Array.from_buffers(
        pa.large_binary(), len(block), [None, pa.py_buffer(out_at), pa.py_buffer(out)]
    )
    return EventBlock(keys, column, block.kinds, block.kind_table), done.tolist()


@numba.njit(cache=CACHE, nogil=True)
def _rewrite(
    keys: _Bytes,
    offsets: _Ints,
    values: _Bytes,
    heads: _Bytes,
    head_at: _Ints,
    indexes: _Ints,
    ks: _Bytes,
    ks_at: _Ints,
    hexes: _Bytes,
    hex_at: _Ints,
) -> tuple[_Bytes, _Bytes, _Ints, npt.NDArray[np.bool_]]:
    """The rewritten sort keys (rows padded with zeros), events (back to back, and offsets)
    and which rows were rewritten (a row not rewritten keeps no bytes). Two passes: sizes,
    then bytes."""
    m, width = keys.shape[0], keys.shape[1]
    sizes = np.zeros(m, np.int64)  # each key's length
    out_at = np.zeros(m + 1, np.int64)
    done = np.zeros(m, np.bool_)
    for j in range(U(m)):
        n = width
        while n > 0 and keys[j, U(n - 1)] == 0:
            n -= 1
        k = indexes[j]
        grown = ks_at[k + 1] - ks_at[k] - _TOKEN_BYTES
        done[j] = (k == 0) or has(keys[j], _HEAD_AT, _P_TOKEN_HEAD)
        sizes[j] = (n + grown * (k > 0)) * done[j]
        event = offsets[j + 1] - offsets[j] + head_at[j + 1] - head_at[j] + 2 * grown * (k > 0)
        out_at[j + 1] = out_at[j] + event * done[j]
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
                head_at[j + 1],
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
