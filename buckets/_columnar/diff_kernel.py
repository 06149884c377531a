"""The updateDescriptions of a batch's updates, written from their `$v: 2` diffs by one compiled
loop over the batch (numba): nested `s<field>` sections at any depth, array sections (`a: true`,
`u<index>`, `s<index>`, `l`), `d`, with `u` and `i`.

Why: the batch splice copies the usual diffs' updatedFields (top-level `u` and `i` alone) in its
own kernels, but an application's updates also `$unset`, `$push`, `$pull` and set nested fields
and array elements; made one by one in Python (`update_description`), their descriptions cost
more than the rest of their splice. Here each is written as `update_description` writes
it (mongoformats/diff_splice.py says how it reads the diff, after the server's
change_stream_document_diff_parser.cpp): updatedFields' elements under their dotted paths with
the diff's own value bytes, removedFields' paths, truncatedArrays' entries, sub-diffs walked in
their order with a bounded stack of open documents.

What it leaves to `update_description` (a flag per diff): anything it does not read exactly as
that function does, so that a diff it takes gets the same bytes. It reads every document
strictly (lengths that add up, closing zeros, known value types: no regex, DBPointer or code with
scope), and leaves a diff where the general path's dicts would keep one of two same names: a
section letter twice in one document, one path set, removed or walked twice (paths compared by a
64-bit hash: two different paths with one hash are left too, which only costs the Python path),
and diffs nested deeper than its stack. (With expanded events no diff is described here:
disambiguatedPaths judges every name, see update_descriptions.py.)
"""

from __future__ import annotations

from typing import Any

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
    prefetch_line,
    store_byte,
    store_i32,
)

__all__ = ["HEAD", "describe"]

_I64 = npt.NDArray[np.int64]
_B8 = npt.NDArray[np.uint8]
_Bufs = tuple[Data, Data, Data, Data]  # output, removedFields', truncatedArrays', path

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
# The walk's steps allocate nothing (describe gives them their buffers): compiled without numba's
# reference counting (byte_kernels.NO_REFCOUNTS).
_kernel = numba.njit(cache=CACHE, **NO_REFCOUNTS)
# The steps take the entries' bytes and the buffers they write as addresses and lengths
# (byte_kernels' Data) and read and write them through byte_kernels' loads and stores: a call
# between the steps (compiled apart, see `describe`) passes each array as seven numbers, and
# with the four buffers, the bytes and two arrays of state that was some fifty arguments a
# step, which cost more than most steps' work. The small steps run per element (reading one,
# hashing and noting a path, setting a field) and are inlined into the steps that call them, as
# are the steps called from one place alone (a section's fields, removals, truncation; the walk
# and its step into a sub-diff; the closing): that compiles no code twice. The steps called from
# two places (the scan, an object diff's sections) stay compiled apart: inlining them as well
# would compile them twice over, and one kernel of every step made its compilation far longer.
_inline = numba.njit(inline="always")
# A scan's findings: a key other than u, i and d; a section that is not a document.
_OTHER_KEY, _NOT_DOCUMENT = 1, 2


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


@_kernel
def _scan(d: Data, at: int, limit: int, st: _I64) -> tuple[int, int]:
    """Read the diff document at `at` (ending by `limit`): where it closes (-1 if it does not
    read or holds a section letter twice), and what else it holds (_OTHER_KEY, _NOT_DOCUMENT);
    its one-letter sections' type, value start and end in the sections' table (type 0: absent)."""
    term = _doc_end(d, at, limit)
    for slot in range(_SECTIONS, _SECTIONS + 5):
        st[_frame(slot, 0)] = 0
    p, kinds = at + 4, 0
    while (term >= 0) and p < term:
        q, e = _element(d, p, term)
        t = _byte(d, p)
        slot = _SLOT[U(_byte(d, p + 1))] if q == p + 2 else -1
        row = _SECTIONS + slot
        if (e < 0) or (slot >= 0 and st[_frame(row, 0)] != 0):
            return -1, 0
        if slot >= 0:
            st[_frame(row, 0)], st[_frame(row, 1)], st[_frame(row, 2)] = t, q + 1, e
        kinds |= _OTHER_KEY * ((slot < 0) | (slot > _D)) | _NOT_DOCUMENT * (t != 3)
        p = e
    return term, kinds


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


@_inline
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


@_inline
def _fields(d: Data, at: int, limit: int, out: Data, path: Data, n: int, st: _I64) -> int:
    """Add the elements of a `u` or `i` section (the document at `at`) under the prefix path[:n]."""
    term = _doc_end(d, at, limit)
    if term < 0:
        return _NO
    p = at + 4
    while p < term:
        q, e = _element(d, p, term)
        if e < 0:
            return _NO
        name = q - p - 1
        if n + name > path[1]:
            return _ROOM
        _copy(path[0] + n, d[0] + p + 1, name)
        r = _set(d, _byte(d, p), q + 1, e, out, path, n + name, st)
        if r != _OK:
            return r
        p = e
    return _OK


@_inline
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


@_inline
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


@_inline
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


@_kernel
def _object(d: Data, term: int, buffers: _Bufs, n: int, st: _I64, walked: bool) -> int:
    """An object diff's `u`, then `i` (each element under the prefix path[:n]; a diff of
    top-level sections alone, not `walked`, has them copied as they are), then `d`."""
    out, rem, _, path = buffers
    for slot in range(_SECTIONS, _SECTIONS + 2):
        t = st[_frame(slot, 0)]
        if (t != 0) and (t != 3):
            return _NO
        if t == 0:
            continue
        if walked:
            r = _fields(d, st[_frame(slot, 1)], term, out, path, n, st)
        else:
            r = _copied(d, st[_frame(slot, 1)], term, out, st)
        if r != _OK:
            return r
    t = st[_frame(_SECTIONS + _D, 0)]
    if t == 0:
        return _OK
    return _removed(d, st[_frame(_SECTIONS + _D, 1)], term, rem, path, n, st) if t == 3 else _NO


@_inline
def _enter(d: Data, at: int, limit: int, buffers: _Bufs, n: int, st: _I64, f: int) -> int:
    """Open the sub-diff at `at` for path[:n]: an array diff (`a: true`: its `l`) or an object
    diff (its `u`, `i`, `d`, under path[:n] and a dot), its entries left for the walk in
    frame f (where it goes on, where it closes, whether an array, its prefix's length)."""
    _, _, tru, path = buffers
    if not _note(path, n, _WALKED, st):
        return _ROOM
    term, _ = _scan(d, at, limit, st)
    if term < 0:
        return _NO
    a = _SECTIONS + _A
    array = (st[_frame(a, 0)] == 8) and _byte(d, st[_frame(a, 1)]) == 1
    if array:
        r = _truncated(d, tru, path, n, st) if st[_frame(_SECTIONS + _L, 0)] != 0 else _OK
    elif n + 1 > path[1]:
        return _ROOM
    else:
        store_byte(U(path[0] + n), 46)  # "."
        n += 1
        r = _object(d, term, buffers, n, st, True)
    st[_frame(f, 0)], st[_frame(f, 1)], st[_frame(f, 2)], st[_frame(f, 3)] = at + 4, term, array, n
    return _ENTERED if r == _OK else r


@_inline
def _index(d: Data, p: int, q: int) -> int:
    """Whether d[p:q], an array diff's index, is written as int() writes it (digits, no leading
    zero): its length, or -1."""
    for j in range(p, q):
        c = _byte(d, j)
        if (c < 48) or (c > 57):
            return -1
    return q - p if (q > p) and ((_byte(d, p) != 48) or (q == p + 1)) else -1


@_inline
def _step(d: Data, buffers: _Bufs, st: _I64, f: int) -> int:
    """Read the next element of the open document in frame f: in an object diff, a sub-diff
    `s<field>`, at the prefix and the field; in an array diff, `u<index>` (a new value) or
    `s<index>` (a sub-diff) at the path, a dot and the index. Others are not the walk's."""
    path = buffers[3]
    p, term, array, n = st[_frame(f, 0)], st[_frame(f, 1)], st[_frame(f, 2)], st[_frame(f, 3)]
    q, e = _element(d, p, term)  # (read by the scan that opened the document)
    st[_frame(f, 0)] = e
    t, letter = _byte(d, p), _byte(d, p + 1)
    if array:
        if (q == p + 2) and ((letter == 97) or (letter == 108)):  # a, l
            return _OK
        digits, start = _index(d, p + 2, q), n + 1
        if (digits >= 0) and (letter != 115) and (letter != 117):  # s<index>, u<index>
            return _OK
    elif (letter != 115) or (q == p + 2):  # s<field>
        return _OK
    else:
        digits, start = q - p - 2, n
    if digits < 0:
        return _NO
    if start + digits > path[1]:
        return _ROOM
    if array:
        store_byte(U(path[0] + n), 46)  # "." (an object's prefix ends with its own)
    _copy(path[0] + start, d[0] + p + 2, digits)
    if letter == 117:
        return _set(d, t, q + 1, e, buffers[0], path, start + digits, st)
    if t != 3:
        return _NO
    return _enter(d, q + 1, term, buffers, start + digits, st, f + 1)


@_inline
def _walk(d: Data, buffers: _Bufs, st: _I64) -> int:
    """Walk the open documents' sub-diffs and array entries (frame 0 the diff's own), in their
    order, depth first, as `update_description` walks them; a diff nested deeper than _DEPTH
    is left to it."""
    depth = 1
    while depth > 0:
        f = depth - 1
        if st[_frame(f, 0)] >= st[_frame(f, 1)]:
            depth -= 1
            continue
        r = _step(d, buffers, st, f)
        depth += r == _ENTERED
        if (r != _OK) and (r != _ENTERED) or (depth > _DEPTH):
            return _NO if r == _ENTERED else r
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


@_inline
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


@_kernel
def _one(d: Data, start: int, end: int, diff: int, buffers: _Bufs, st: _I64) -> int:
    """Write the description of the diff at `diff` of the entry d[start:end] at out[st[_W]]:
    a diff of top-level `u`, `i` and `d` sections alone as `update_description` copies it
    (`u` and `i` as they are), any other walked."""
    out, rem, tru, _ = buffers
    w0 = st[_W]
    st[_RN] = st[_RW] = st[_TN] = st[_TW] = st[_SN] = 0
    if w0 + HEAD + 4 > out[1]:
        return _ROOM
    st[_W] = w0 + HEAD + 4
    term, kinds = _scan(d, diff, end, st)
    if (term < 0) or (diff < start) or (kinds & _NOT_DOCUMENT):
        return _NO
    walked = (kinds & _OTHER_KEY) != 0
    r = _object(d, term, buffers, 0, st, walked)
    if walked and (r == _OK):
        st[_frame(0, 0)], st[_frame(0, 1)], st[_frame(0, 2)], st[_frame(0, 3)] = (
            diff + 4,
            term,
            0,
            0,
        )
        r = _walk(d, buffers, st)
    if r != _OK:
        return r
    return _NO if _twice(st) else _close(out, w0, rem, tru, st)


@numba.njit(cache=CACHE, nogil=True)
def describe(
    d: _B8, starts: _I64, ends: _I64, diffs: _I64
) -> tuple[_B8, _I64, npt.NDArray[np.bool_]]:
    """The updateDescriptions of the diffs at `diffs` of the update entries d[starts:ends],
    back to back (the first item) from offsets (the second: description k is at
    [at[k], at[k + 1]), empty if not taken), and whether each was taken (the third): False for
    one left to `update_description`."""
    m = len(diffs)
    at = np.zeros(m + 1, np.int64)
    taken = np.zeros(m, np.bool_)
    longest, total = 64, 64
    for k in range(U(m)):
        longest, total = max(longest, ends[k] - starts[k]), total + ends[k] - starts[k] + 64
    # (an entry's bytes other than its diff outweigh what a description adds to it: the buffers
    # rarely grow, and a path is never longer than its entry)
    out = np.empty(total, np.uint8)
    rem, tru, path = (
        np.empty(longest, np.uint8),
        np.empty(longest, np.uint8),
        np.empty(longest, np.uint8),
    )
    st = np.zeros(_SEEN + 64, np.int64)
    k = 0
    while k < m:  # (a buffer too small: all twice as large, and that diff again)
        k = _run(d, starts, ends, diffs, out, rem, tru, path, st, at, taken, k)
        if k < m:
            out, rem, tru, path = (
                _grown(out, st[_W]),
                _grown(rem, 0),
                _grown(tru, 0),
                _grown(path, 0),
            )
            st = _grown(st, _SEEN)
    return out[: U(st[_W])], at, taken


@_kernel
def _run(
    d: _B8,
    starts: _I64,
    ends: _I64,
    diffs: _I64,
    out: _B8,
    rem: _B8,
    tru: _B8,
    path: _B8,
    st: _I64,
    at: _I64,
    taken: npt.NDArray[np.bool_],
    k: int,
) -> int:
    """Describe diffs from the k-th on, until one finds a buffer too small: its index (len(diffs)
    when all are done). (A loop apart from `describe`'s, whose buffers change: numba then counts
    references to them at every step.)"""
    base = np.int64(d.ctypes.data)
    data = (base, len(d))
    buffers = (
        (np.int64(out.ctypes.data), len(out)),
        (np.int64(rem.ctypes.data), len(rem)),
        (np.int64(tru.ctypes.data), len(tru)),
        (np.int64(path.ctypes.data), len(path)),
    )
    while k < len(diffs):
        # The diff four ahead, asked for now: a backlog's entries come from memory, and a
        # diff's walk waits on each of its lines in turn.
        ahead = U(min(k + 4, len(diffs) - 1))
        stop = min(ends[ahead], diffs[ahead] + 4096)  # (a longer diff's rest: read in order)
        for line in range(U(base + diffs[ahead]), U(base + stop), U(64)):
            prefetch_line(line)
        w0 = st[_W]
        r = _one(data, starts[U(k)], ends[U(k)], diffs[U(k)], buffers, st)
        if r == _ROOM:
            st[_W] = w0
            return k
        taken[U(k)] = r == _OK
        if r != _OK:
            st[_W] = w0
        at[U(k + 1)] = st[_W]
        k += 1
    return k


@numba.njit(cache=CACHE)
def _grown(a: npt.NDArray[Any], keep: int) -> npt.NDArray[Any]:
    """An array twice as long as `a`, with a[:keep]."""
    bigger = np.empty(2 * len(a), a.dtype)
    bigger[: U(keep)] = a[: U(keep)]
    return bigger
