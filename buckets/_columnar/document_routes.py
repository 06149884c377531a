"""The documentKey buckets of a block's events (buckets/bucketing.py's contract), in one compiled
loop: what `buckets_for_event(ev, n, "documentKey")` gives each event, without making the
event's tuple or its {_id: value} document.

Why compiled: dealing a backlog by documentKey event by event made every event a Python tuple
and walked its bytes in Python, far more than the rest of the engine spends on it; here each
event's top-level elements are walked where they lie (in whichever shard's block), its
documentKey's `_id` element found, and the CRC-32 of {_id: value} continued from the namespace's
(computed once per kind, in Python) over the document's length, the element and its terminator.
zlib's CRC cannot be called from the loop, so the loop has the same CRC-32 (the reflected
0xEDB88320 polynomial, zlib's) by its usual table, pinned to zlib's by the tests.

An event whose bucket the loop does not decide gets -1, and the caller asks the per-event path:
no single namespace, no documentKey (or one that is not a document), an `_id` whose bytes the
contract re-encodes (a type outside bucketing's _COPIED_TYPES, the old binary subtype 2), or
bytes that do not walk as a well-formed document of known types.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from buckets._columnar.numba_cache import CACHE  # picks numba's cache dir before numba loads

# isort: split
import numba
import numpy as np
import numpy.typing as npt
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from buckets._columnar.byte_kernels import U, as_bytes, has, i32, u8

__all__ = ["document_buckets", "event_buckets", "namespace_seeds"]

# The names looked for, NUL included (so that a longer name does not match): the event's
# documentKey, then its `_id`.
_NAMES = (as_bytes(b"documentKey\x00"), as_bytes(b"_id\x00"))

# A value's size by its type byte: fixed (-1: not fixed), or (_PREFIXED, -1: not length-prefixed)
# the bytes it has beyond the int32 at its start (mongoformats.bson_bytes' _FIXED and
# _LENGTH_PREFIXED; a regex, the one type of neither, leaves the event to the per-event path).
_FIXED = np.full(256, -1, np.int64)
_FIXED[[0x01, 0x07, 0x08, 0x09, 0x0A, 0x10, 0x11, 0x12, 0x13, 0x06, 0x7F, 0xFF]] = (
    8,
    12,
    1,
    8,
    0,
    4,
    8,
    8,
    16,
    0,
    0,
    0,
)
_PREFIXED = np.full(256, -1, np.int64)
_PREFIXED[[0x03, 0x04, 0x0F, 0x02, 0x0D, 0x0E, 0x05, 0x0C]] = 0, 0, 0, 4, 4, 4, 5, 16
# The `_id` types whose element bytes bson.encode writes again for their decoded value
# (buckets.bucketing._COPIED_TYPES; binary also checks its subtype).
_COPIED = np.zeros(256, np.bool_)
_COPIED[[0x07, 0x02, 0x10, 0x12, 0x03, 0x05]] = True
_BINARY, _OLD_BINARY = 0x05, 2
_ID_VALUE_AT = len(b"\x05_id\x00")  # an `_id` element's value, from the element's start


def _crc_tables() -> npt.NDArray[np.int64]:
    """The reflected CRC-32's (zlib's) tables for 8 bytes at a step ("slicing by 8"): row 0 the
    byte-at-a-time table, row k a byte's effect k bytes before the step's end."""
    tables = np.empty((8, 256), np.int64)
    table = np.arange(256, dtype=np.int64)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ 0xEDB88320, table >> 1)
    tables[0] = table
    for k in range(1, 8):
        tables[k] = (tables[k - 1] >> 8) ^ table[tables[k - 1] & 255]
    return tables


_CRC = _crc_tables()
_ALL_ONES = 0xFFFFFFFF
_I64 = np.int64


@intrinsic
def _pointer(typingctx: Any, address: Any) -> Any:
    """The memory at `address` (an integer) as a pointer to bytes, for numba.carray."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], ir.IntType(8).as_pointer())

    return types.CPointer(types.uint8)(types.uintp), codegen


@numba.njit(cache=CACHE, nogil=True)
def _document_buckets(
    addresses: npt.NDArray[np.uintp],
    sizes: npt.NDArray[np.int64],
    order: npt.NDArray[np.int64],
    kinds: npt.NDArray[np.int32],
    seeds: npt.NDArray[np.int64],
    n: int,
    out: npt.NDArray[np.int64],
) -> None:
    """out[i]: the bucket (of `n`) of event order[i] (its bytes at addresses[order[i]], of
    sizes[order[i]]) of kind kinds[i], whose namespace's CRC-32 is seeds[kinds[i]] (-1: no
    single namespace); -1 where the loop leaves it to the per-event path.

    The event's elements are walked as mongoformats.bson_bytes.elements walks them (the last of
    a name counts), then the documentKey's: one loop over two levels, one function (a call
    between compiled functions costs about as much as the checks it would hold). Each walk must
    end exactly at its document's terminator; a value must end within it."""
    for i in range(U(len(order))):
        out[i] = -1
        r, k = order[i], kinds[i]
        if not ((0 <= r < len(sizes)) & (0 <= k < len(seeds))):
            continue
        at: Any = _pointer(addresses[U(r)])  # type: ignore[call-arg]  # numba gives typingctx
        d = numba.carray(at, U(sizes[U(r)]))
        seed = seeds[U(k)]
        start, stop = 4, i32(d, 0) - 1
        ok = (seed >= 0) & (stop == len(d) - 1) & (u8(d, stop) == 0)
        found, found_type, found_end = -1, -1, -1
        for level in range(2):
            name = _NAMES[level]
            p, found = start, -1
            while ok & (p < stop):
                # (p and q lie in `d`: the walk's `stop` is at most its last byte.)
                t, q = d[U(p)], p + 1
                while (q < stop) & (d[U(q)] != 0):
                    q += 1
                fixed, extra = _FIXED[U(t)], _PREFIXED[U(t)]
                e = q + 1 + max(fixed, 0) + (extra >= 0) * (extra + i32(d, q + 1))
                ok = ((fixed >= 0) | ((extra >= 0) & (q + 5 <= stop))) & (q < e <= stop)
                if q - p == len(name) and has(d, p + 1, name):
                    found, found_type, found_end = p, t, e
                p = e
            ok &= (p == stop) & (found >= 0) & ((found_type == 3) | (level == 1))
            # Then the documentKey's elements (a document: its length, its elements, a zero).
            value = found + 1 + len(name)
            start, stop = value + 4, value + i32(d, value) - 1
        subtype = u8(d, found + _ID_VALUE_AT + 4)
        if ok & _COPIED[U(found_type & 255)] & ((found_type != _BINARY) | (subtype != _OLD_BINARY)):
            # {_id: value}: its length (4 bytes at a step), the element as it lies (8 at a step,
            # then byte by byte), its terminator. The table reads of a step do not wait for one
            # another: a byte at a time, each waited for the last.
            crc = seed ^ _ALL_ONES ^ (found_end - found + 5)
            crc = (
                _CRC[3, crc & 255]
                ^ _CRC[2, (crc >> 8) & 255]
                ^ _CRC[1, (crc >> 16) & 255]
                ^ (_CRC[0, crc >> 24])
            )
            for j in range(U(found), U(found_end - 7), U(8)):
                crc ^= (
                    _I64(d[j]) | _I64(d[j + 1]) << 8 | _I64(d[j + 2]) << 16 | _I64(d[j + 3]) << 24
                )
                crc = (
                    _CRC[7, crc & 255]
                    ^ _CRC[6, (crc >> 8) & 255]
                    ^ _CRC[5, (crc >> 16) & 255]
                    ^ _CRC[4, crc >> 24]
                    ^ _CRC[3, d[j + 4]]
                    ^ _CRC[2, d[j + 5]]
                    ^ _CRC[1, d[j + 6]]
                    ^ _CRC[0, d[j + 7]]
                )
            for j in range(found_end - (found_end - found) % 8, found_end + 1):
                crc = _CRC[0, (crc ^ (d[U(j)] if j < found_end else 0)) & 255] ^ (crc >> 8)
            out[i] = (crc ^ _ALL_ONES) % n


def namespace_seeds(namespaces: Sequence[Any]) -> npt.NDArray[np.int64]:
    """The CRC-32 of each kind's namespace (its `namespaces`, EventFields' tuple), -1 for a kind
    of no single namespace (its events go where the per-event path says)."""
    return np.fromiter(
        (zlib.crc32(ns[0].encode("utf-8")) if len(ns) == 1 else -1 for ns in namespaces),
        np.int64,
        len(namespaces),
    )


def document_buckets(
    addresses: npt.NDArray[np.uintp],
    sizes: npt.NDArray[np.int64],
    order: npt.NDArray[np.int64],
    kinds: npt.NDArray[np.int32],
    seeds: npt.NDArray[np.int64],
    n: int,
) -> npt.NDArray[np.int64]:
    """Each event's documentKey bucket of `n`, -1 where the per-event path decides (see
    `_document_buckets`)."""
    out = np.empty(len(order), np.int64)
    _document_buckets(addresses, sizes, order, kinds, seeds, n, out)
    return out


def event_buckets(raws: Sequence[Any], namespaces: Sequence[Any], n: int) -> list[int]:
    """`document_buckets` of single events (their bytes `raws`, each of `namespaces`): joined
    into one buffer for the loop, a copy that costs a fraction of walking each in Python."""
    count = len(raws)
    sizes = np.fromiter(map(len, raws), np.int64, count)
    body = np.frombuffer(b"".join(raws), np.uint8)
    addresses = np.zeros(count, np.uintp)
    np.cumsum(sizes[:-1], out=addresses[1:], dtype=np.uintp)
    addresses += np.uintp(body.ctypes.data)
    table: dict[Any, int] = {}
    kinds = np.fromiter((table.setdefault(ns, len(table)) for ns in namespaces), np.int32, count)
    out = document_buckets(
        addresses, sizes, np.arange(count), kinds, namespace_seeds(list(table)), n
    )
    return out.tolist()
