"""An oplog cursor reply's entries as offsets into the reply, not as bytes objects of their own.

Why: slicing each entry out of a getMore reply (up to 16 MB, ~50k entries) cost a reader 0.37 us
an entry, a tenth of all the proxy does with it, and the batch splice then joined the slices back
into one buffer to read them with numpy. Here the reply is walked once for its entries' offsets
(0.13 us an entry) and kept whole; the splice reads it in place, and an entry is sliced out only
when something needs its own bytes (the one-by-one transform, the last entry's ts).

The walk relies on what BSON asks of every array: its keys are "0", "1", ... So it reads only
each element's length, and numpy then checks every element's header (type document, then that
key) at once; a batch laid out otherwise raises ValueError.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from mongoformats.oplog_splice import cursor_span

__all__ = ["SLACK", "OplogBatch", "batch_in_place", "reply_batch", "words"]

SLACK = 256  # zero bytes after a batch's data: a reader of any entry may overrun it by that much

_I32 = struct.Struct("<i")
_Ints = npt.NDArray[np.int64]
_MAX_KEYED = 10**6  # headers up to index 999999 fit in 8 bytes (type, 6 digits, NUL): one word


@dataclass(frozen=True)
class OplogBatch:
    """Entries at `starts`, `lengths` in `data`, which goes on for SLACK bytes past the last one."""

    data: bytes
    starts: _Ints
    lengths: _Ints

    @classmethod
    def of(cls, entries: list[bytes]) -> OplogBatch:
        """A batch of entries that come as bytes objects of their own (as tests make them)."""
        lengths = np.fromiter(map(len, entries), np.int64, len(entries))
        starts = np.zeros(len(entries), np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        return cls(b"".join(entries) + bytes(SLACK), starts, lengths)

    def __len__(self) -> int:
        return len(self.starts)

    def entry(self, i: int) -> bytes:
        start = int(self.starts[i])
        return self.data[start:start + int(self.lengths[i])]

    def entries(self) -> list[bytes]:
        return list(map(self.data.__getitem__, map(slice, self.starts.tolist(), (self.starts + self.lengths).tolist())))


def reply_batch(reply: bytes) -> tuple[int, OplogBatch]:
    """(cursor id, the entries of firstBatch/nextBatch) of a find/getMore reply on the oplog;
    ValueError if the batch is not an array of documents."""
    return batch_in_place(reply + bytes(SLACK), 0)


def batch_in_place(data: bytes, at: int) -> tuple[int, OplogBatch]:
    """`reply_batch` of the reply at `at` in `data`, which goes on for SLACK bytes or more past
    the reply's end (what UpstreamConnection.command_in_place gives): the entries are read where
    they lie, the reply is not copied."""
    cursor_id, start, end = cursor_span(data, at)
    starts = _walk(data, start, end)
    return cursor_id, OplogBatch(data, starts, words(data, "<i4")[starts].astype(np.int64))


def words(data: bytes, dtype: str) -> Any:
    """`data` read as overlapping words: element i is the word that starts at byte i. So one
    fancy index reads a field at every entry's own offset, where a (rows, width) gather of bytes
    costs an index array the size of the rows."""
    size = np.dtype(dtype).itemsize
    return np.ndarray((len(data) - size + 1,), dtype, data, 0, (1,))


def _walk(data: bytes, start: int, end: int) -> _Ints:
    """The offsets of the documents of the array in [start, end): only their lengths are read on
    the way, then every element's header is checked at once."""
    unpack = _I32.unpack_from
    last = end - 1  # the array's terminating zero
    out: list[int] = []
    append = out.append
    p, width, wider_at = start + 4, 3, 10  # a header: type byte, the key's digits, NUL
    # An element takes 8 bytes at least, so the loop ends even if lengths lead it astray.
    for i in range((end - start) // 8):
        if p >= last:
            break
        if i == wider_at:
            width, wider_at = width + 1, wider_at * 10
        p += width
        append(p)
        size = unpack(data, p)[0]
        if size < 5:
            break
        p += size
    starts = np.array(out, np.int64)
    n = len(starts)
    if p != last or data[last] != 0 or n > _MAX_KEYED:
        raise ValueError("the cursor's batch is not an array of documents")
    expected, masks, widths = _headers(max(n, 1).bit_length())
    if not ((words(data, "<u8")[starts - widths[:n]] & masks[:n]) == expected[:n]).all():
        raise ValueError("the cursor's batch is not an array of documents keyed 0, 1, ...")
    return starts


@functools.lru_cache(maxsize=21)
def _headers(size_class: int) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], _Ints]:
    """The first 2**size_class (at most 10**6) element headers of an array of documents, each as
    a little-endian word, the mask of its bytes and its width."""
    headers = [b"\x03%d\x00" % i for i in range(min(1 << size_class, _MAX_KEYED))]
    expected = np.array([int.from_bytes(h, "little") for h in headers], np.uint64)
    masks = np.array([(1 << 8 * len(h)) - 1 for h in headers], np.uint64)
    return expected, masks, np.array(list(map(len, headers)), np.int64)
