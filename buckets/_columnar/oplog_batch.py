"""An oplog cursor reply's entries as offsets into the reply, not as bytes objects of their own.

Why: slicing each entry out of a getMore reply (up to 16 MB of entries) is a large share of what
a reader does with it, and the batch splice then joined the slices back into one buffer to read
them. Here the reply is walked once for its entries' offsets, in a compiled loop, and kept
whole; the splice reads it in place, and an entry is sliced out only when something needs its
own bytes (the one-by-one transform, the last entry's ts).

The walk checks what BSON asks of every array: each element's header is the type (document
here) and its index as its key, "0", "1", ...; a batch laid out otherwise raises ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from buckets._columnar.numba_cache import CACHE  # picks numba's cache dir before numba loads

# isort: split
import numba
import numpy as np
import numpy.typing as npt

from buckets._columnar.byte_kernels import U, as_bytes, prefetch_line
from buckets._columnar.byte_kernels import i32_at as i32
from buckets._columnar.byte_kernels import u8_at as u8
from mongoformats.oplog_splice import _CRUD_CODES, _OP_HEAD, byte_slices, cursor_span, not_crud

__all__ = ["SLACK", "OplogBatch", "batch_in_place", "reply_batch", "starts_of"]

SLACK = 256  # zero bytes after a batch's data: a reader of any entry may overrun it by that much

_Ints = npt.NDArray[np.int64]


@dataclass(frozen=True)
class OplogBatch:
    """Entries at `starts`, `lengths` in `data`, which goes on for SLACK bytes past the last one.
    `data` is a bytearray when the reply was received straight into a buffer of its own
    (UpstreamConnection); an entry taken out of it is bytes either way."""

    data: bytes | bytearray
    starts: _Ints
    lengths: _Ints

    @classmethod
    def of(cls, entries: list[bytes]) -> OplogBatch:
        """A batch of entries that come as bytes objects of their own (as tests make them)."""
        lengths = np.fromiter(map(len, entries), np.int64, len(entries))
        return cls(b"".join(entries) + bytes(SLACK), starts_of(lengths), lengths)

    def __len__(self) -> int:
        return len(self.starts)

    def entry(self, i: int) -> bytes:
        start = int(self.starts[i])
        return byte_slices(self.data)[start : start + int(self.lengths[i])]

    def entries(self, start: int = 0, stop: int | None = None) -> list[bytes]:
        """The entries from `start` to `stop`, cut out with one slicer (not one `entry()` each)."""
        return self.entries_at(slice(start, stop))

    def entries_at(self, which: Any) -> list[bytes]:
        """The entries `which` (a slice, or indices) picks, cut out as `entries` cuts them."""
        starts = self.starts[which]
        cuts = map(slice, starts.tolist(), (starts + self.lengths[which]).tolist())
        if type(self.data) is bytes:
            return list(map(self.data.__getitem__, cuts))
        # A reply received into its own buffer: each entry copied out of a view of it as bytes,
        # in C calls alone (byte_slices' wrapper would run a Python method per entry).
        return list(map(bytes, map(memoryview(self.data).__getitem__, cuts)))

    def not_crud(self, which: list[int], entries: list[bytes]) -> list[bool]:
        """oplog_splice.not_crud of the entries `which` (whose bytes are `entries`), read where
        they lie with a few array operations for them all: a batch's transactions' entries are
        hundreds, and the check one by one cost microseconds each. An entry whose lsid's length
        points outside it is checked one by one."""
        if not which:
            return []
        d = as_bytes(self.data)
        starts, lengths = self.starts[which], self.lengths[which]
        # An lsid first (at 4, its header 6 bytes): the op follows txnNumber (11 + 8 bytes).
        has_lsid = (lengths >= 10) & _matches(d, starts + 4, _LSID_HEAD)
        p = np.full(len(which), 4, np.int64)
        odd = np.zeros(len(which), np.bool_)
        if has_lsid.any():
            at = starts[has_lsid]
            after = 10 + _i32_at(d, at + 10)
            ends = lengths[has_lsid]
            # (where the lsid's length points outside the entry, Python's slicing decides)
            odd[has_lsid] = (after < 0) | (after > ends)
            numbered = ~odd[has_lsid] & (after + len(_TXN_NUMBER_HEAD) <= ends)
            numbered &= _matches(d, at + np.where(numbered, after, 0), _TXN_NUMBER_HEAD)
            # An lsid that txnNumber does not follow: no op where a server writes it.
            p[has_lsid] = np.where(numbered, after + 19, -1)
            odd[has_lsid] |= lengths[has_lsid] < 14
        room = (p >= 0) & (p + 10 <= lengths)
        op_at = starts + np.where(room, p, 0)
        code = d[op_at + 8]
        crud = (code == _CRUD_BYTES[0]) | (code == _CRUD_BYTES[1]) | (code == _CRUD_BYTES[2])
        out = room & _matches(d, op_at, _OP_HEAD) & (d[op_at + 9] == 0) & ~crud
        result: list[bool] = out.tolist()
        for k in np.flatnonzero(odd).tolist():
            result[k] = not_crud(entries[k])
        return result


_LSID_HEAD = b"\x03lsid\x00"
_TXN_NUMBER_HEAD = b"\x12txnNumber\x00"
_CRUD_BYTES = tuple(code[0] for code in _CRUD_CODES)


def _matches(d: npt.NDArray[np.uint8], at: _Ints, head: bytes) -> npt.NDArray[np.bool_]:
    """Whether the bytes at each of `at` in `d` are `head`'s."""
    return (d[at[:, None] + np.arange(len(head))] == np.frombuffer(head, np.uint8)).all(axis=1)


def _i32_at(d: npt.NDArray[np.uint8], at: _Ints) -> _Ints:
    """The little-endian int32 at each of `at` in `d`."""
    return d[at[:, None] + np.arange(4)].copy().view("<i4").ravel().astype(np.int64)


def starts_of(lengths: Any) -> _Ints:
    """Where each of parts of these lengths starts, laid back to back from 0."""
    lengths = np.asarray(lengths, np.int64)
    starts = np.zeros(len(lengths), np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return starts


def reply_batch(reply: bytes) -> tuple[int, OplogBatch]:
    """(cursor id, the entries of firstBatch/nextBatch) of a find/getMore reply on the oplog;
    ValueError if the batch is not an array of documents."""
    return batch_in_place(reply + bytes(SLACK), 0)


def batch_in_place(data: bytes | bytearray, at: int) -> tuple[int, OplogBatch]:
    """`reply_batch` of the reply at `at` in `data`, which goes on for SLACK bytes or more past
    the reply's end (what UpstreamConnection.command_in_place gives): the entries are read where
    they lie, the reply is not copied."""
    cursor_id, start, end = cursor_span(data, at)
    return cursor_id, OplogBatch(data, *_walk(data, start, end))


def _walk(data: bytes | bytearray, start: int, end: int) -> tuple[_Ints, _Ints]:
    """The offsets and lengths of the documents of the array in [start, end): each element's
    header (type document, then its index as its key: BSON asks "0", "1", ... of every array) and
    length are read on the way, in a compiled loop (byte_kernels)."""
    starts, lengths = _walk_kernel(as_bytes(data), start, end)
    if len(starts) and starts[0] < 0:
        raise ValueError(
            "the cursor's batch is not an array of documents keyed 0, 1, ..."
            if starts[0] == _BAD_KEY
            else "the cursor's batch is not an array of documents"
        )
    return starts, lengths


_BAD_LENGTH, _BAD_KEY = -1, -2
_STREAM = 8192  # how far ahead of the walk its bytes are asked for


@numba.njit(cache=CACHE, nogil=True)
def _walk_kernel(data: Any, start: int, end: int) -> tuple[_Ints, _Ints]:
    """`_walk`'s offsets and lengths; or one negative offset, _BAD_KEY or _BAD_LENGTH, for a
    batch that is not such an array. (Bytes read by address, byte_kernels' u8_at and i32_at.)"""
    d = (data.ctypes.data, len(data))
    last = end - 1  # the array's terminating zero
    out = np.empty(max((end - start) // 8, 1), np.int64)  # an element takes 8 bytes at least
    sizes = np.empty(len(out), np.int64)
    p, n, width = start + 4, 0, 3  # a header: type byte, the key's digits, NUL
    # The next key's digits, kept as a counter of digit bytes (adding one carries through 9s):
    # working each key's digits out of n with % 10 and // 10 took half the walk's time.
    key = np.zeros(24, np.uint8)
    key[0] = 48
    ahead = p
    while p < last and n < len(out):
        # The bytes _STREAM ahead, asked for a line at a time: each entry's header is read at
        # an offset the one before gives, so a batch read from memory waited on every entry's
        # line in turn; asked for in advance, the lines come in a stream.
        while ahead < min(p + _STREAM, last):
            prefetch_line(U(d[0] + ahead))
            ahead += 64
        if u8(d, p) != 3 or u8(d, p + width - 1) != 0:
            out[0] = _BAD_KEY
            return out[:1], sizes[:1]
        for j in range(U(width - 2)):  # (p + width - 1 lies in d: checked above)
            if data[U(p + 1) + j] != key[j]:
                out[0] = _BAD_KEY
                return out[:1], sizes[:1]
        p += width
        out[U(n)] = p
        n += 1
        k = width - 3  # the last digit
        while k >= 0 and key[U(k)] == 57:
            key[U(k)] = 48
            k -= 1
        if k >= 0:
            key[U(k)] += 1
        else:  # 9, 99, ... became 10, 100, ...: one digit more
            key[0], key[U(width - 2)] = 49, 48
            width += 1
        size = i32(d, p)
        sizes[U(n - 1)] = size
        if size < 5:
            break
        p += size
    if p != last or u8(d, last) != 0:
        out[0] = _BAD_LENGTH
        return out[:1], sizes[:1]
    return out[:n], sizes[:n]
