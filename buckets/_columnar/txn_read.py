"""Transactions' oplog entries read in a compiled loop: what txn_splice.read_apply_ops reads of
an entry of the server's shape, for a batch's command entries at once.

Why: reading an applyOps or commitTransaction entry in Python (its fixed-offset checks, its ops'
offsets, its times) cost about as much as splicing its ops in the batch splice. The loop here
checks each element where read_apply_ops' fixed-offset reading (txn_splice._server_shape and
_read_server) checks it and takes an entry only if that reading would, or if it is the last
entry of a partialTxn chain (its applyOps followed by an int64 `count`, which read_apply_ops
walks: it reads the same elements, where they lie in the server's shape, and passes `count`
over); every other entry is left to read_apply_ops itself (the caller's), so what is read here
is what it reads.
"""

from __future__ import annotations

from buckets._columnar.numba_cache import CACHE  # picks numba's cache dir before numba loads

# isort: split
import numba
import numpy as np
import numpy.typing as npt

from buckets._columnar.byte_kernels import U, as_bytes, copy, has, i32, put_i32, u8, u64
from buckets._columnar.oplog_batch import SLACK, starts_of
from mongoformats.txn_splice import (
    _COMMIT_O,
    _COMMIT_TS,
    _LSID_HEAD,
    _PREV_HEAD,
    _PREV_T,
    _UID_HEAD,
)

__all__ = [
    "R_BUFFERED",
    "R_NUMBER",
    "R_OK",
    "R_OPS",
    "R_PREV",
    "R_TAIL",
    "R_TS",
    "op_entries",
    "read_rows",
]

_Ints = npt.NDArray[np.int64]
_Bytes = npt.NDArray[np.uint8]

# An entry's row: read here (R_OK); its ops wait for a later commit (R_BUFFERED); its ts and its
# prevOpTime's ts (each as the 8 bytes of the BSON timestamp, increment first, read as one
# little-endian word; 0 for a null prevOpTime); its txnNumber; its ops' range in `read_rows`'
# offsets ([R_OPS], [R_OPS + 1]); where its ts element starts (its stamp, see txn_splice).
R_OK, R_BUFFERED, R_TS, R_PREV, R_NUMBER, R_OPS, R_TAIL = 0, 1, 2, 3, 4, 5, 7
_WIDTH = 8

# The server's entry (txn_splice._ENTRY_HEAD), its parts where they lie from the entry's start:
# lsid's header and its id's, uid's header, txnNumber's, then op "c" and ns's header.
_P_LSID = as_bytes(b"\x03lsid\x00" + _LSID_HEAD)
_P_UID = as_bytes(_UID_HEAD)
_P_NUMBER = as_bytes(b"\x00\x12txnNumber\x00")
_P_OP = as_bytes(b"\x02op\x00\x02\x00\x00\x00c\x00\x02ns\x00")
_LSID_AT, _UID_AT, _NUMBER_AT, _OP_AT, _NS_AT = 4, 39, 81, 101, 115
_NUMBER_VALUE = 93
# Its tail (txn_splice._ENTRY_TAIL), its parts where they lie from the ts element: ts, t, v,
# wall, prevOpTime's headers and ts, its t, its end.
_P_TS, _P_T, _P_V, _P_WALL = (
    as_bytes(h) for h in (b"\x11ts\x00", b"\x12t\x00", b"\x12v\x00", b"\x09wall\x00")
)
_P_PREV = as_bytes(b"\x03prevOpTime\x00" + _PREV_HEAD)
_P_PREV_T = as_bytes(_PREV_T)
_TAIL_SIZE = 89  # the tail's bytes, the entry's end byte included
# Where the values of t and v lie from the ts element (an op's entry has them zero: txn_entry).
_T_VALUE, _V_VALUE = 15, 26
_P_O = as_bytes(b"\x03o\x00")
_P_APPLY_OPS = as_bytes(b"\x04applyOps\x00")
_P_PREPARE = as_bytes(b"\x08prepare\x00\x01")
_P_PARTIAL = as_bytes(b"\x08partialTxn\x00\x01")
# What follows the ops of a chain's last entry (mongodb-formats.md C.6): count, an int64.
_P_COUNT, _COUNT_SIZE = as_bytes(b"\x12count\x00"), 15
_P_COMMIT_O, _P_COMMIT_TS = as_bytes(_COMMIT_O), as_bytes(_COMMIT_TS)


def read_rows(data: bytes | bytearray, starts: _Ints, lengths: _Ints) -> tuple[_Ints, _Ints]:
    """Each entry's row (see R_OK...) and its ops' offsets in `data` ([k, 0] where op k starts,
    [k, 1] where it ends)."""
    return _read_rows(as_bytes(data), starts, lengths)


@numba.njit(cache=CACHE, nogil=True)
def _read_rows(d: _Bytes, starts: _Ints, lengths: _Ints) -> tuple[_Ints, _Ints]:
    n = len(starts)
    rows = np.zeros((n, _WIDTH), np.int64)
    ops = np.empty((max(len(d) // 5, 1), 2), np.int64)  # an op takes 5 bytes at least
    used = 0
    for i in range(U(n)):
        used = _read(d, starts[i], lengths[i], rows[i], ops, used)
    return rows, ops[: U(used)]


@numba.njit(cache=CACHE)
def _read(d: _Bytes, s: int, length: int, row: _Ints, ops: _Ints, used: int) -> int:
    """Fill the row of the entry at `s` if read_apply_ops reads it at fixed offsets (its ops
    from ops[used] on); how many ops are used then."""
    tail = s + length - _TAIL_SIZE
    ns = i32(d, s + _NS_AT)
    o_at = s + _NS_AT + 4 + ns
    o = o_at + 3
    o_size = i32(d, o)
    if not (
        (i32(d, s) == length)
        & (length >= _NS_AT + _TAIL_SIZE)
        & has(d, s + _LSID_AT, _P_LSID)
        & has(d, s + _UID_AT, _P_UID)
        & has(d, s + _NUMBER_AT, _P_NUMBER)
        & has(d, s + _OP_AT, _P_OP)
        & has(d, tail, _P_TS)
        & has(d, tail + 12, _P_T)
        & has(d, tail + 23, _P_V)
        & has(d, tail + 34, _P_WALL)
        & has(d, tail + 48, _P_PREV)
        & has(d, tail + 76, _P_PREV_T)
        & (u8(d, tail + 87) == 0)
        & (ns >= 1)
        & has(d, o_at, _P_O)
        & (o_size >= 5)
        & (o + o_size == tail)
    ):
        return used
    first = used
    if has(d, o + 4, _P_APPLY_OPS):
        array = o + 14
        size = i32(d, array)
        rest = o + o_size - 1 - (array + size)  # what follows the array in o: a flag or nothing
        prepare = (rest == len(_P_PREPARE)) and has(d, array + size, _P_PREPARE)
        partial = (rest == len(_P_PARTIAL)) and has(d, array + size, _P_PARTIAL)
        last = (rest == _COUNT_SIZE) and has(d, array + size, _P_COUNT)
        if not ((size >= 5) & ((rest == 0) | prepare | partial | last)):
            return used
        used = _ops(d, array, size, ops, used)
        if used < 0:
            return first
        row[R_BUFFERED] = prepare | partial
    elif not (has(d, o, _P_COMMIT_O) & has(d, o + 27, _P_COMMIT_TS)):
        return used
    row[R_OK] = 1
    row[R_TS] = u64(d, tail + 4)
    row[R_PREV] = u64(d, tail + 68)
    row[R_NUMBER] = u64(d, s + _NUMBER_VALUE)
    row[R_OPS], row[R_OPS + 1], row[R_TAIL] = first, used, tail - s
    return used


@numba.njit(cache=CACHE)
def _ops(d: _Bytes, array: int, size: int, ops: _Ints, used: int) -> int:
    """The documents of the array at `array` (of `size` bytes) into ops[used:], as
    bson_bytes.array_items finds them, if each lies in the array and the last ends where it
    does; how many ops are used then, or -1."""
    end = array + size - 1
    p = array + 4
    while p < end:
        if u8(d, p) != 3:
            return -1
        v = p + 1
        while v < end and d[U(v)] != 0:
            v += 1
        v += 1
        n = i32(d, v)
        if (n < 5) | (v + n > end) | (used >= len(ops)):
            return -1
        ops[U(used), 0], ops[U(used), 1] = v, v + n
        used += 1
        p = v + n
    return used if p == end else -1


def op_entries(
    data: bytes | bytearray,
    spans: _Ints,
    firsts: _Ints,
    counts: _Ints,
    tails: _Ints,
    tail_sizes: _Ints,
) -> tuple[bytearray, _Ints, _Ints]:
    """The ops of entries as plain writes' entries, back to back (what txn_splice.txn_entry
    makes of each, in one buffer that goes on for SLACK bytes), with where each starts and its
    length: of entry j, ops spans[firsts[j]:firsts[j] + counts[j]] of `data`, each given the
    stamp tail at tails[j] in `data` (tail_sizes[j] bytes: ts, t, v and wall, as a server's
    entry or txn_stamp's tail lays them out; its t and v are written as txn_entry's)."""
    d = as_bytes(data)
    lengths = _lengths(spans, firsts, counts, tail_sizes)
    starts = starts_of(lengths)
    out = bytearray(int(lengths.sum()) + SLACK)
    _write(d, spans, firsts, counts, tails, tail_sizes, np.frombuffer(out, np.uint8), starts)
    return out, starts, lengths


@numba.njit(cache=CACHE, nogil=True)
def _lengths(spans: _Ints, firsts: _Ints, counts: _Ints, tail_sizes: _Ints) -> _Ints:
    """Each op's entry's length (see `op_entries`)."""
    lengths = np.empty(counts.sum(), np.int64)
    k = 0
    for j in range(U(len(firsts))):
        for op in range(U(firsts[j]), U(firsts[j] + counts[j])):
            lengths[U(k)] = spans[op, 1] - spans[op, 0] + tail_sizes[j]
            k += 1
    return lengths


@numba.njit(cache=CACHE, nogil=True)
def _write(
    d: _Bytes,
    spans: _Ints,
    firsts: _Ints,
    counts: _Ints,
    tails: _Ints,
    tail_sizes: _Ints,
    out: _Bytes,
    starts: _Ints,
) -> None:
    """Write each op's entry at its start in `out` (see `op_entries`): its length, its
    elements, the tail, its end byte."""
    k = 0
    for j in range(U(len(firsts))):
        tail, size = tails[j], tail_sizes[j]
        for op in range(U(firsts[j]), U(firsts[j] + counts[j])):
            a, b, at = spans[op, 0], spans[op, 1], starts[U(k)]
            put_i32(out, at, b - a + size)
            copy(out, at + 4, d, a + 4, b - a - 5)
            at += b - a - 1
            copy(out, at, d, tail, size)
            out[U(at + _T_VALUE) : U(at + _T_VALUE + 8)] = 0
            out[U(at + _V_VALUE) : U(at + _V_VALUE + 8)] = 0
            out[U(at + size)] = 0
            k += 1
