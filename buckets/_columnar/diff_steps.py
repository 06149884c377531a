"""The parts `describe` (diff_kernel.py) is made of: the walk's state, reading a diff's elements,
noting the paths it names, and writing a description's parts (updatedFields' elements,
removedFields' and truncatedArrays' entries, the closing): inlined into describe's steps, or
compiled apart (`_kernel`) where diff_kernel.py says.
"""

from __future__ import annotations

from buckets._columnar.numba_cache import CACHE  # picks numba's cache dir before numba loads

# isort: split
import numba
import numpy as np
import numpy.typing as npt

from buckets._columnar.byte_kernels import (
    NO_REFCOUNTS,
    Data,
    U,
    as_bytes,
    i32_at,
    load_byte,
    move,
    store_byte,
    store_i32,
)

_I64 = npt.NDArray[np.int64]
_B8 = npt.NDArray[np.uint8]

_UPDATED_FIELDS = b"\x03updatedFields\x00"
_P_UPDATED_FIELDS = as_bytes(_UPDATED_FIELDS)
_P_REMOVED_FIELDS = as_bytes(b"\x04removedFields\x00")
_P_TRUNCATED_ARRAYS = as_bytes(b"\x04truncatedArrays\x00")
_P_FIELD = as_bytes(b"\x02field\x00")
_P_NEW_SIZE = as_bytes(b"newSize\x00")
# A description's length and updatedFields' header and length: what the block's update template
# already holds (batch_splice's _UPDATEHEAD), skipped when a description is copied in.
HEAD = 4 + len(_UPDATED_FIELDS)
_CLOSING = 1 + len(_P_REMOVED_FIELDS) + 5 + len(_P_TRUNCATED_ARRAYS) + 5 + 1

# What a kernel step says: done, the diff left to Python, a buffer too small (grown, then the
# diff is written again), a sub-diff opened on the stack.
_OK, _NO, _ROOM, _ENTERED = 0, -1, -2, 1
# The walk's state, one array shared by its steps: the write position in the output, the
# removedFields entries and their bytes, the truncatedArrays entries and their bytes, the paths
# hashed; then the frames (four numbers each, see `_frame`); then, from _SEEN on, the paths'
# hashes.
_W, _RN, _RW, _TN, _TW, _SN = range(6)
_DEPTH = 64  # open documents at most (the server nests documents 100 deep, sub-diffs fewer)
# The walk's frames (one per open document) are followed by a scan's table of sections.
_SECTIONS = _DEPTH + 1
_FRAMES = _SN + 1
_SEEN = _FRAMES + 4 * (_SECTIONS + 5)
# The hash's seeds: a path set, removed, or walked into (each kind may name a path once).
_SET, _REMOVED, _WALKED = 1, 2, 3
_FNV_BASIS, _FNV_PRIME = 14695981039346656037 - 2**64, 1099511628211  # (int64 wraps as FNV's)


def _type_tables() -> tuple[_I64, _I64, _I64]:
    """By BSON type byte: a fixed value's size, a length-prefixed value's bytes beyond its length
    and its least length (-1: not of that sort; regex, DBPointer, code with scope and unknown
    types are neither, and leave the diff to Python)."""
    fixed = np.full(256, -1, np.int64)
    extra = np.full(256, -1, np.int64)
    least = np.zeros(256, np.int64)
    for t, n in {1: 8, 6: 0, 7: 12, 8: 1, 9: 8, 10: 0, 16: 4, 17: 8, 18: 8, 19: 16}.items():
        fixed[t] = n
    fixed[0x7F] = fixed[0xFF] = 0
    for t, (n, m) in {2: (4, 1), 3: (0, 5), 4: (0, 5), 5: (5, 0), 13: (4, 1), 14: (4, 1)}.items():
        extra[t], least[t] = n, m
    return fixed, extra, least


_FIXED, _EXTRA, _LEAST = _type_tables()
# A diff document's one-letter sections, by letter: their row in a scan's table.
_SLOT = np.full(256, -1, np.int64)
for _slot, _letter in enumerate(b"uidla"):
    _SLOT[_letter] = _slot
_U, _I, _D, _L, _A = range(5)
# The steps take the entries' bytes and the buffers they write as addresses and lengths
# (byte_kernels' Data) and read and write them through byte_kernels' loads and stores: a call
# between describe's steps (compiled apart) passes each array as seven numbers, and with the four
# buffers, the bytes and two arrays of state that was some fifty arguments a step, which cost
# more than most steps' work.
_inline = numba.njit(inline="always")
# The steps compiled apart allocate nothing (describe gives them their buffers): compiled without
# numba's reference counting (byte_kernels.NO_REFCOUNTS).
_kernel = numba.njit(cache=CACHE, **NO_REFCOUNTS)


@_inline
def _frame(row: int, column: int) -> np.uintp:
    """Where frame `row`'s number `column` is in the state: where its document goes on, where it
    closes, whether an array, its prefix's length; a scan's table of sections (rows _SECTIONS
    on) holds each section's type, value start and end."""
    return U(_FRAMES + 4 * row + column)


@_inline
def _byte(d: Data, at: int) -> int:
    """The byte at `at` of d, unchecked (the caller's bounds hold it)."""
    return load_byte(U(d[0] + at))


@_inline
def _copy(to: int, source: int, n: int) -> None:
    """The n bytes at memory `source` written at memory `to`: a loop, for the few bytes of a
    name or a path (a call to memcpy costs more)."""
    for j in range(U(n)):
        store_byte(U(to) + j, load_byte(U(source) + j))


@_inline
def _put(to: int, pattern: _B8) -> None:
    """`pattern`'s bytes written at memory `to`."""
    for j in range(U(len(pattern))):
        store_byte(U(to) + j, pattern[j])


@_inline
def _doc_end(d: Data, at: int, limit: int) -> int:
    """Where the document at `at` closes (its last byte, a zero), if it lies before `limit`;
    else -1."""
    n = i32_at(d, at)
    end = at + n - 1
    if (n < 5) | (end >= limit):
        return -1
    return end if _byte(d, end) == 0 else -1


@_inline
def _element(d: Data, p: int, limit: int) -> tuple[int, int]:
    """The element at `p`, which must end by `limit`: where its name's zero is and where its value
    ends; (-1, -1) if it does not read."""
    q = p + 1
    while (q < limit) and _byte(d, q) != 0:
        q += 1
    if q >= limit:
        return -1, -1
    t, v = U(_byte(d, p)), q + 1
    e = v + _FIXED[t]
    if _FIXED[t] < 0:
        n = i32_at(d, v)
        e = v + _EXTRA[t] + n
        if (_EXTRA[t] < 0) | (n < _LEAST[t]):
            return -1, -1
    return (q, e) if e <= limit else (-1, -1)


@_inline
def _hash(path: Data, n: int, seed: int) -> np.int64:
    """FNV-1a of the byte `seed`, then path[:n]."""
    h = (np.int64(_FNV_BASIS) ^ seed) * _FNV_PRIME
    for j in range(U(n)):
        h = (h ^ load_byte(U(path[0]) + j)) * _FNV_PRIME
    return h


@_inline
def _note(path: Data, n: int, seed: int, st: _I64) -> bool:
    """Keep path[:n]'s hash (of kind `seed`) for the check for paths named twice; False if
    there is no room for it."""
    if _SEEN + st[_SN] >= len(st):
        return False
    st[U(_SEEN + st[_SN])] = _hash(path, n, seed)
    st[_SN] += 1
    return True


@_kernel
def _twice(st: _I64) -> bool:
    """Whether two of the paths' hashes are equal: a diff's few paths compared pairwise, many
    sorted in place first (a shell sort: no allocation)."""
    n, h = st[_SN], st[_SEEN:]
    gap = 1
    while gap < n // 3:
        gap = 3 * gap + 1
    while (n > 16) and (gap > 0):
        for j in range(gap, n):
            x, k = h[U(j)], j
            while (k >= gap) and (h[U(k - gap)] > x):
                h[U(k)] = h[U(k - gap)]
                k -= gap
            h[U(k)] = x
        gap //= 3
    for j in range(1, n):
        for k in range(j - 1 if n > 16 else 0, j):
            if h[U(j)] == h[U(k)]:
                return True
    return False


@_inline
def _decimal(to: int, n: int) -> int:
    """Write n's decimal digits at memory `to` (room for 20 is the caller's); how many."""
    digits = 1
    while n >= 10**digits:
        digits += 1
    for j in range(digits):
        store_byte(U(to + digits - 1 - j), 48 + n % 10)
        n //= 10
    return digits


@_inline
def _set(d: Data, t: int, v: int, e: int, out: Data, path: Data, n: int, st: _I64) -> int:
    """Add updatedFields' element of type t named path[:n] with the value d[v:e]."""
    w = st[_W]
    if (w + n + 2 + e - v > out[1]) or not _note(path, n, _SET, st):
        return _ROOM
    to = out[0] + w
    store_byte(U(to), t)
    _copy(to + 1, path[0], n)
    store_byte(U(to + 1 + n), 0)
    move(U(to + 2 + n), U(d[0] + v), e - v)
    st[_W] = w + n + 2 + e - v
    return _OK


@_kernel
def _copied(d: Data, at: int, limit: int, out: Data, st: _I64) -> int:
    """Add the elements of a top-level `u` or `i` section (the document at `at`) as they are, as
    `update_description` copies them for a diff of top-level sections alone."""
    term = _doc_end(d, at, limit)
    w = st[_W]
    if term < 0:
        return _NO
    if w + term - at - 4 > out[1]:
        return _ROOM
    move(U(out[0] + w), U(d[0] + at + 4), term - at - 4)
    st[_W] = w + term - at - 4
    return _OK


@_kernel
def _removed(d: Data, at: int, limit: int, rem: Data, path: Data, n: int, st: _I64) -> int:
    """Add removedFields' entries of a `d` section (the document at `at`) under path[:n]: each a
    string, keyed by its index."""
    term = _doc_end(d, at, limit)
    if term < 0:
        return _NO
    p = at + 4
    while p < term:
        q, e = _element(d, p, term)
        if e < 0:
            return _NO
        name = q - p - 1
        w = st[_RW]
        if (n + name > path[1]) or (w + 27 + n + name > rem[1]):
            return _ROOM
        _copy(path[0] + n, d[0] + p + 1, name)
        if not _note(path, n + name, _REMOVED, st):
            return _ROOM
        to = rem[0]
        store_byte(U(to + w), 2)
        w += 1 + _decimal(to + w + 1, st[_RN])
        store_byte(U(to + w), 0)
        store_i32(U(to + w + 1), n + name + 1)
        _copy(to + w + 5, path[0], n + name)
        store_byte(U(to + w + 5 + n + name), 0)
        st[_RW], st[_RN] = w + 6 + n + name, st[_RN] + 1
        p = e
    return _OK


@_kernel
def _truncated(d: Data, tru: Data, path: Data, n: int, st: _I64) -> int:
    """Add truncatedArrays' entry of an array diff at path[:n] whose `l` is in the sections' table:
    `{field: path, newSize: l}`, l a number of the type the diff gives (a double, int32 or int64,
    written back as it came)."""
    row = _SECTIONS + _L
    t, v, e = st[_frame(row, 0)], st[_frame(row, 1)], st[_frame(row, 2)]
    if (t != 1) & (t != 16) & (t != 18):
        return _NO
    w = st[_TW]
    size = 4 + len(_P_FIELD) + 4 + n + 1 + 1 + len(_P_NEW_SIZE) + e - v + 1
    if w + 22 + size > tru[1]:
        return _ROOM
    to = tru[0]
    store_byte(U(to + w), 3)
    w += 1 + _decimal(to + w + 1, st[_TN])
    store_byte(U(to + w), 0)
    store_i32(U(to + w + 1), size)
    _put(to + w + 5, _P_FIELD)
    w += 5 + len(_P_FIELD)
    store_i32(U(to + w), n + 1)
    _copy(to + w + 4, path[0], n)
    store_byte(U(to + w + 4 + n), 0)
    store_byte(U(to + w + 5 + n), t)
    _put(to + w + 6 + n, _P_NEW_SIZE)
    w += 6 + n + len(_P_NEW_SIZE)
    _copy(to + w, d[0] + v, e - v)
    store_byte(U(to + w + e - v), 0)
    st[_TW], st[_TN] = w + e - v + 1, st[_TN] + 1
    return _OK


@_inline
def _array(to: int, header: _B8, body: int, n: int) -> int:
    """Write at memory `to` an array element: its `header` (type and name), then the array of
    the n bytes of elements at memory `body`; the address where it ends."""
    _put(to, header)
    store_i32(U(to + len(header)), n + 5)
    move(U(to + len(header) + 4), U(body), n)
    to += len(header) + 4 + n
    store_byte(U(to), 0)
    return to + 1


@_kernel
def _close(out: Data, w0: int, rem: Data, tru: Data, st: _I64) -> int:
    """Close the description begun at out[w0] (its updatedFields' elements written): its
    lengths, removedFields and truncatedArrays."""
    w = st[_W]
    if w + _CLOSING + st[_RW] + st[_TW] > out[1]:
        return _ROOM
    base = out[0]
    store_byte(U(base + w), 0)
    _put(base + w0 + 4, _P_UPDATED_FIELDS)
    store_i32(U(base + w0 + HEAD), w + 1 - w0 - HEAD)
    to = _array(base + w + 1, _P_REMOVED_FIELDS, rem[0], st[_RW])
    to = _array(to, _P_TRUNCATED_ARRAYS, tru[0], st[_TW])
    store_byte(U(to), 0)
    w = to + 1 - base
    store_i32(U(base + w0), w - w0)
    st[_W] = w
    return _OK
