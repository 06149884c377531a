"""The updateDescriptions of a batch's updates, written from their `$v: 2` diffs by one compiled
loop over the batch (numba): nested `s<field>` sections at any depth, array sections (`a: true`,
`u<index>`, `s<index>`, `l`), `d`, with `u` and `i`.

Why: the batch splice copies the usual diffs' updatedFields (top-level `u` and `i` alone) in its
own kernels, but an application's updates also `$unset`, `$push`, `$pull` and set nested fields
and array elements; made one by one in Python (`update_description`), those descriptions were
the splice's largest cost on such a backlog. Here each is written as `update_description` writes
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
and diffs nested deeper than its stack.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from buckets._columnar.numba_cache import CACHE  # picks numba's cache dir before numba loads

# isort: split
import numba
import numpy as np
import numpy.typing as npt

from buckets._columnar.batch_layout import _DIFF_AT, _R_O_START, _R_OP, _R_SIMPLE, _UPDATE
from buckets._columnar.byte_kernels import U, as_bytes, copy, i32, put_i32
from buckets._columnar.oplog_batch import OplogBatch
from mongoformats.oplog_splice import byte_slices, update_description

__all__ = ["Descriptions", "describe", "other_descriptions", "extras"]

_I64 = npt.NDArray[np.int64]
_B8 = npt.NDArray[np.uint8]
_Bufs3 = tuple[_B8, _B8, _B8]  # output, removedFields', path
_Bufs = tuple[_B8, _B8, _B8, _B8]  # output, removedFields', truncatedArrays', path

_UPDATED_FIELDS = b"\x03updatedFields\x00"
_P_UPDATED_FIELDS = as_bytes(_UPDATED_FIELDS)
_P_REMOVED_FIELDS = as_bytes(b"\x04removedFields\x00")
_P_TRUNCATED_ARRAYS = as_bytes(b"\x04truncatedArrays\x00")
_P_FIELD = as_bytes(b"\x02field\x00")
_P_NEW_SIZE = as_bytes(b"newSize\x00")
# A description's length and updatedFields' header and length: what the block's update template
# already holds (batch_splice's _UPDATE_HEAD), skipped when a description is copied in.
_HEAD = 4 + len(_UPDATED_FIELDS)
_CLOSING = 1 + len(_P_REMOVED_FIELDS) + 5 + len(_P_TRUNCATED_ARRAYS) + 5 + 1

# What a kernel step says: done, the diff left to Python, a buffer too small (grown, then the
# diff is written again), a sub-diff opened on the stack.
_OK, _NO, _ROOM, _ENTERED = 0, -1, -2, 1
# The walk's counters (an array, shared by its steps): the write position in the output, the
# removedFields entries and their bytes, the truncatedArrays entries and their bytes, the paths
# hashed; the paths' hashes follow from _SEEN on.
_W, _RN, _RW, _TN, _TW, _SN, _SEEN = range(7)
# The hash's seeds: a path set, removed, or walked into (each kind may name a path once).
_SET, _REMOVED, _WALKED = 1, 2, 3
_DEPTH = 64  # open documents at most (the server nests documents 100 deep, sub-diffs fewer)
# The walk's frames (one per open document) are followed by a scan's table of sections.
_SECTIONS = _DEPTH + 1
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
# A scan's findings: a key other than u, i and d; a section that is not a document.
_OTHER_KEY, _NOT_DOCUMENT = 1, 2


@numba.njit(cache=CACHE)
def _doc_end(d: _B8, at: int, limit: int) -> int:
    """Where the document at `at` closes (its last byte, a zero), if it lies before `limit`;
    else -1."""
    n = i32(d, at)
    end = at + n - 1
    if (n < 5) | (end >= limit):
        return -1
    return end if d[U(end)] == 0 else -1


@numba.njit(cache=CACHE)
def _element(d: _B8, p: int, limit: int) -> tuple[int, int]:
    """The element at `p`, which must end by `limit`: where its name's zero is and where its value
    ends; (-1, -1) if it does not read."""
    q = p + 1
    while (q < limit) and d[U(q)] != 0:
        q += 1
    if q >= limit:
        return -1, -1
    t, v = U(d[U(p)]), q + 1
    e = v + _FIXED[t]
    if _FIXED[t] < 0:
        n = i32(d, v)
        e = v + _EXTRA[t] + n
        if (_EXTRA[t] < 0) | (n < _LEAST[t]):
            return -1, -1
    return (q, e) if e <= limit else (-1, -1)


@numba.njit(cache=CACHE)
def _scan(d: _B8, at: int, limit: int, sec: _I64) -> tuple[int, int]:
    """Read the diff document at `at` (ending by `limit`): where it closes (-1 if it does not
    read or holds a section letter twice), and what else it holds (_OTHER_KEY, _NOT_DOCUMENT);
    its one-letter sections' type, value start and end in `sec`'s rows (type 0: absent)."""
    term = _doc_end(d, at, limit)
    sec[:, 0] = 0
    p, kinds = at + 4, 0
    while (term >= 0) and p < term:
        q, e = _element(d, p, term)
        t = d[U(p)]
        slot = _SLOT[U(d[U(p + 1)])] if q == p + 2 else -1
        if (e < 0) or (slot >= 0 and sec[slot, 0] != 0):
            return -1, 0
        if slot >= 0:
            sec[slot, 0], sec[slot, 1], sec[slot, 2] = t, q + 1, e
        kinds |= _OTHER_KEY * ((slot < 0) | (slot > _D)) | _NOT_DOCUMENT * (t != 3)
        p = e
    return term, kinds


@numba.njit(cache=CACHE)
def _hash(path: _B8, n: int, seed: int) -> np.int64:
    """FNV-1a of the byte `seed`, then path[:n]."""
    h = (np.int64(_FNV_BASIS) ^ seed) * _FNV_PRIME
    for j in range(U(n)):
        h = (h ^ path[j]) * _FNV_PRIME
    return h


@numba.njit(cache=CACHE)
def _note(path: _B8, n: int, seed: int, st: _I64) -> bool:
    """Keep path[:n]'s hash (of kind `seed`) for the check for paths named twice; False if
    there is no room for it."""
    if _SEEN + st[_SN] >= len(st):
        return False
    st[U(_SEEN + st[_SN])] = _hash(path, n, seed)
    st[_SN] += 1
    return True


@numba.njit(cache=CACHE)
def _twice(st: _I64) -> bool:
    """Whether two of the paths' hashes are equal."""
    n = st[_SN]
    ordered = np.sort(st[_SEEN : U(_SEEN + n)])
    for j in range(U(1), U(n)):  # noqa: SIM110 (a loop numba compiles)
        if ordered[j] == ordered[j - 1]:
            return True
    return False


@numba.njit(cache=CACHE)
def _decimal(dst: _B8, at: int, n: int) -> int:
    """Write n's decimal digits at dst[at:] (room for 20 is the caller's); how many."""
    digits = 1
    while n >= 10**digits:
        digits += 1
    for j in range(digits):
        dst[U(at + digits - 1 - j)] = 48 + n % 10
        n //= 10
    return digits


@numba.njit(cache=CACHE)
def _set(d: _B8, t: int, v: int, e: int, out: _B8, path: _B8, n: int, st: _I64) -> int:
    """Add updatedFields' element of type t named path[:n] with the value d[v:e]."""
    w = st[_W]
    if (w + n + 2 + e - v > len(out)) or not _note(path, n, _SET, st):
        return _ROOM
    out[U(w)] = t
    copy(out, w + 1, path, 0, n)
    out[U(w + 1 + n)] = 0
    copy(out, w + 2 + n, d, v, e - v)
    st[_W] = w + n + 2 + e - v
    return _OK


@numba.njit(cache=CACHE)
def _fields(d: _B8, at: int, limit: int, out: _B8, path: _B8, n: int, st: _I64) -> int:
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
        if n + name > len(path):
            return _ROOM
        copy(path, n, d, p + 1, name)
        r = _set(d, d[U(p)], q + 1, e, out, path, n + name, st)
        if r != _OK:
            return r
        p = e
    return _OK


@numba.njit(cache=CACHE)
def _copied(d: _B8, at: int, limit: int, out: _B8, st: _I64) -> int:
    """Add the elements of a top-level `u` or `i` section (the document at `at`) as they are, as
    `update_description` copies them for a diff of top-level sections alone."""
    term = _doc_end(d, at, limit)
    w = st[_W]
    if term < 0:
        return _NO
    if w + term - at - 4 > len(out):
        return _ROOM
    copy(out, w, d, at + 4, term - at - 4)
    st[_W] = w + term - at - 4
    return _OK


@numba.njit(cache=CACHE)
def _removed(d: _B8, at: int, limit: int, rem: _B8, path: _B8, n: int, st: _I64) -> int:
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
        if (n + name > len(path)) or (w + 27 + n + name > len(rem)):
            return _ROOM
        copy(path, n, d, p + 1, name)
        if not _note(path, n + name, _REMOVED, st):
            return _ROOM
        rem[U(w)] = 2
        w += 1 + _decimal(rem, w + 1, st[_RN])
        rem[U(w)] = 0
        put_i32(rem, w + 1, n + name + 1)
        copy(rem, w + 5, path, 0, n + name)
        rem[U(w + 5 + n + name)] = 0
        st[_RW], st[_RN] = w + 6 + n + name, st[_RN] + 1
        p = e
    return _OK


@numba.njit(cache=CACHE)
def _truncated(d: _B8, sec: _I64, tru: _B8, path: _B8, n: int, st: _I64) -> int:
    """Add truncatedArrays' entry of an array diff at path[:n] whose `l` is in sec's row:
    `{field: path, newSize: l}`, l a number of the type the diff gives (a double, int32 or int64,
    written back as it came)."""
    t, v, e = sec[_L, 0], sec[_L, 1], sec[_L, 2]
    if (t != 1) & (t != 16) & (t != 18):
        return _NO
    w = st[_TW]
    size = 4 + len(_P_FIELD) + 4 + n + 1 + 1 + len(_P_NEW_SIZE) + e - v + 1
    if w + 22 + size > len(tru):
        return _ROOM
    tru[U(w)] = 3
    w += 1 + _decimal(tru, w + 1, st[_TN])
    tru[U(w)] = 0
    put_i32(tru, w + 1, size)
    copy(tru, w + 5, _P_FIELD, 0, len(_P_FIELD))
    w += 5 + len(_P_FIELD)
    put_i32(tru, w, n + 1)
    copy(tru, w + 4, path, 0, n)
    tru[U(w + 4 + n)] = 0
    tru[U(w + 5 + n)] = t
    copy(tru, w + 6 + n, _P_NEW_SIZE, 0, len(_P_NEW_SIZE))
    w += 6 + n + len(_P_NEW_SIZE)
    copy(tru, w, d, v, e - v)
    tru[U(w + e - v)] = 0
    st[_TW], st[_TN] = w + e - v + 1, st[_TN] + 1
    return _OK


@numba.njit(cache=CACHE)
def _object(d: _B8, term: int, sec: _I64, buffers: _Bufs3, n: int, st: _I64, walked: bool) -> int:
    """An object diff's `u`, then `i` (each element under the prefix path[:n]; a diff of
    top-level sections alone, not `walked`, has them copied as they are), then `d`."""
    out, rem, path = buffers
    for slot in range(2):
        t = sec[slot, 0]
        if (t != 0) and (t != 3):
            return _NO
        if t == 0:
            continue
        if walked:
            r = _fields(d, sec[slot, 1], term, out, path, n, st)
        else:
            r = _copied(d, sec[slot, 1], term, out, st)
        if r != _OK:
            return r
    t = sec[_D, 0]
    if t == 0:
        return _OK
    return _removed(d, sec[_D, 1], term, rem, path, n, st) if t == 3 else _NO


@numba.njit(cache=CACHE)
def _enter(
    d: _B8, at: int, limit: int, buffers: _Bufs, n: int, st: _I64, frames: _I64, f: int
) -> int:
    """Open the sub-diff at `at` for path[:n]: an array diff (`a: true`: its `l`) or an object
    diff (its `u`, `i`, `d`, under path[:n] and a dot), its entries left for the walk in
    frames[f] (where it goes on, where it closes, whether an array, its prefix's length)."""
    out, rem, tru, path = buffers
    sec = frames[_SECTIONS:]
    if not _note(path, n, _WALKED, st):
        return _ROOM
    term, _ = _scan(d, at, limit, sec)
    if term < 0:
        return _NO
    array = (sec[_A, 0] == 8) and d[U(sec[_A, 1])] == 1
    if array:
        r = _truncated(d, sec, tru, path, n, st) if sec[_L, 0] != 0 else _OK
    elif n + 1 > len(path):
        return _ROOM
    else:
        path[U(n)] = 46  # "."
        n += 1
        r = _object(d, term, sec, (out, rem, path), n, st, True)
    frames[U(f), 0], frames[U(f), 1], frames[U(f), 2], frames[U(f), 3] = at + 4, term, array, n
    return _ENTERED if r == _OK else r


@numba.njit(cache=CACHE)
def _index(d: _B8, p: int, q: int) -> int:
    """Whether d[p:q], an array diff's index, is written as int() writes it (digits, no leading
    zero): its length, or -1."""
    for j in range(U(p), U(q)):
        if (d[j] < 48) or (d[j] > 57):
            return -1
    return q - p if (q > p) and ((d[U(p)] != 48) or (q == p + 1)) else -1


@numba.njit(cache=CACHE)
def _step(d: _B8, buffers: _Bufs, st: _I64, frames: _I64, f: int) -> int:
    """Read the next element of the open document frames[f]: in an object diff, a sub-diff
    `s<field>`, at the prefix and the field; in an array diff, `u<index>` (a new value) or
    `s<index>` (a sub-diff) at the path, a dot and the index. Others are not the walk's."""
    path, (p, term, array, n) = buffers[3], frames[U(f)]
    q, e = _element(d, p, term)  # (read by the scan that opened the document)
    frames[U(f), 0] = e
    t, letter = d[U(p)], d[U(p + 1)]
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
    if start + digits > len(path):
        return _ROOM
    if array:
        path[U(n)] = 46  # "." (an object's prefix ends with its own)
    copy(path, start, d, p + 2, digits)
    if letter == 117:
        return _set(d, t, q + 1, e, buffers[0], path, start + digits, st)
    if t != 3:
        return _NO
    return _enter(d, q + 1, term, buffers, start + digits, st, frames, f + 1)


@numba.njit(cache=CACHE)
def _walk(d: _B8, buffers: _Bufs, st: _I64, frames: _I64) -> int:
    """Walk the open documents' sub-diffs and array entries (frames[0] the diff's own), in their
    order, depth first, as `update_description` walks them; a diff nested deeper than _DEPTH
    is left to it."""
    depth = 1
    while depth > 0:
        f = depth - 1
        if frames[U(f), 0] >= frames[U(f), 1]:
            depth -= 1
            continue
        r = _step(d, buffers, st, frames, f)
        depth += r == _ENTERED
        if (r != _OK) and (r != _ENTERED) or (depth > _DEPTH):
            return _NO if r == _ENTERED else r
    return _OK


@numba.njit(cache=CACHE)
def _array(out: _B8, w: int, header: _B8, body: _B8, n: int) -> int:
    """Write at out[w] an array element: its `header` (type and name), then the array of the
    elements body[:n]; where it ends."""
    copy(out, w, header, 0, len(header))
    put_i32(out, w + len(header), n + 5)
    copy(out, w + len(header) + 4, body, 0, n)
    w += len(header) + 4 + n
    out[U(w)] = 0
    return w + 1


@numba.njit(cache=CACHE)
def _close(out: _B8, w0: int, rem: _B8, tru: _B8, st: _I64) -> int:
    """Close the description begun at out[w0] (its updatedFields' elements written): its
    lengths, removedFields and truncatedArrays."""
    w = st[_W]
    if w + _CLOSING + st[_RW] + st[_TW] > len(out):
        return _ROOM
    out[U(w)] = 0
    copy(out, w0 + 4, _P_UPDATED_FIELDS, 0, len(_P_UPDATED_FIELDS))
    put_i32(out, w0 + _HEAD, w + 1 - w0 - _HEAD)
    w = _array(out, w + 1, _P_REMOVED_FIELDS, rem, st[_RW])
    w = _array(out, w, _P_TRUNCATED_ARRAYS, tru, st[_TW])
    out[U(w)] = 0
    put_i32(out, w0, w + 1 - w0)
    st[_W] = w + 1
    return _OK


@numba.njit(cache=CACHE)
def _one(d: _B8, start: int, end: int, diff: int, buffers: _Bufs, st: _I64, frames: _I64) -> int:
    """Write the description of the diff at `diff` of the entry d[start:end] at out[st[_W]]:
    a diff of top-level `u`, `i` and `d` sections alone as `update_description` copies it
    (`u` and `i` as they are), any other walked."""
    out, rem, tru, path = buffers
    sec, w0 = frames[_SECTIONS:], st[_W]
    st[_RN] = st[_RW] = st[_TN] = st[_TW] = st[_SN] = 0
    if w0 + _HEAD + 4 > len(out):
        return _ROOM
    st[_W] = w0 + _HEAD + 4
    term, kinds = _scan(d, diff, end, sec)
    if (term < 0) or (diff < start) or (kinds & _NOT_DOCUMENT):
        return _NO
    walked = (kinds & _OTHER_KEY) != 0
    r = _object(d, term, sec, (out, rem, path), 0, st, walked)
    if walked and (r == _OK):
        frames[0, 0], frames[0, 1], frames[0, 2], frames[0, 3] = diff + 4, term, 0, 0
        r = _walk(d, buffers, st, frames)
    if r != _OK:
        return r
    return _NO if _twice(st) else _close(out, w0, rem, tru, st)


@numba.njit(cache=CACHE)
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
    st, frames = np.zeros(_SEEN + 64, np.int64), np.zeros((_SECTIONS + 5, 4), np.int64)
    for k in range(U(m)):
        w0 = st[_W]
        r = _one(d, starts[k], ends[k], diffs[k], (out, rem, tru, path), st, frames)
        while r == _ROOM:  # a buffer too small: all twice as large, and the diff again
            out = _grown(out, w0)
            rem, tru, path = _grown(rem, 0), _grown(tru, 0), _grown(path, 0)
            st = _grown(st, _SEEN)
            st[_W] = w0
            r = _one(d, starts[k], ends[k], diffs[k], (out, rem, tru, path), st, frames)
        taken[k] = r == _OK
        if not taken[k]:
            st[_W] = w0
        at[k + 1] = st[_W]
    return out[: U(st[_W])], at, taken


@numba.njit(cache=CACHE)
def _grown(a: npt.NDArray[Any], keep: int) -> npt.NDArray[Any]:
    """An array twice as long as `a`, with a[:keep]."""
    bigger = np.empty(2 * len(a), a.dtype)
    bigger[: U(keep)] = a[: U(keep)]
    return bigger


@numba.njit(cache=CACHE)
def _gathered(data: _B8, start: _I64, size: _I64) -> tuple[_B8, _I64]:
    """The descriptions data[start[k]:start[k] + size[k]] less their first _HEAD bytes (the
    block's update template holds them), each then closing its event, back to back; and where
    each starts."""
    m = len(start)
    at = np.zeros(m + 1, np.int64)
    for k in range(U(m)):
        at[k + 1] = at[k] + (size[k] - _HEAD + 1 if size[k] else 0)
    out = np.zeros(max(at[m], 1), np.uint8)  # (never empty: the block reads it as an array)
    for k in range(U(m)):
        n = at[k + 1] - at[k]
        if n:
            copy(out, at[k], data, start[k] + _HEAD, n - 1)
            out[U(at[k + 1] - 1)] = 0
    return out, at


class Descriptions(NamedTuple):
    """The updateDescriptions made for a batch's entries: `data` from start[i], size[i] bytes,
    for entry i (size 0: none)."""

    data: _B8
    start: _I64
    size: _I64


def other_descriptions(
    batch: OplogBatch, rows: _I64, ok: npt.NDArray[np.bool_], expanded: bool
) -> Descriptions | None:
    """The updateDescription of each taken update whose diff is not `u` and `i` alone (the block
    copies those, see batch_layout's _R_SIMPLE): written by `describe`, and those it leaves
    made one by one by `update_description`; an update whose diff neither takes is dropped from
    `ok`, for splice_crud (none is taken with expanded events: disambiguatedPaths judges every
    name)."""
    other = np.flatnonzero(ok & (rows[:, _R_OP] == _UPDATE) & (rows[:, _R_SIMPLE] == 0))
    if not len(other):
        return None
    if expanded:
        ok[other] = False
        return None
    starts = batch.starts[other]
    data, at, taken = describe(
        as_bytes(batch.data),
        starts,
        starts + batch.lengths[other],
        rows[other, _R_O_START] + _DIFF_AT,
    )
    start = np.zeros(len(batch), np.int64)
    size = np.zeros(len(batch), np.int64)
    start[other], size[other] = at[:-1], np.diff(at)
    left = other[~taken]
    if not len(left):
        return Descriptions(data, start, size)
    made: list[bytes] = []
    ends = (batch.starts[left] + batch.lengths[left]).tolist()
    diffs = (rows[left, _R_O_START] + _DIFF_AT).tolist()
    end = len(data)
    for i, s, e, diff in zip(left.tolist(), batch.starts[left].tolist(), ends, diffs, strict=True):
        description = _description(batch.data, s, e, diff)
        if description is None:
            ok[i] = False
            continue
        start[i], size[i] = end, len(description)
        end += len(description)
        made.append(description)
    return Descriptions(np.concatenate((data, as_bytes(b"".join(made)))), start, size)


def extras(descriptions: Descriptions | None, taken: _I64) -> tuple[_B8, _I64]:
    """The taken entries' updatedFields and what closes their events (an update whose
    description is made here; nothing for the others), back to back in the order of `taken`,
    and where each starts."""
    if descriptions is None:
        return as_bytes(b"\0"), np.zeros(len(taken) + 1, np.int64)
    return _gathered(descriptions.data, descriptions.start[taken], descriptions.size[taken])


def _description(data: bytes | bytearray, start: int, end: int, diff: int) -> bytes | None:
    """The updateDescription of the update entry data[start:end] whose diff is at `diff`, read
    from the entry alone as splice_crud reads it (bytes past a broken entry are another's); None
    if `update_description` does not take it or cannot read it (splice_crud then says why)."""
    try:
        return update_description(byte_slices(data)[start:end], diff - start, expanded=False)
    except (ValueError, IndexError, struct.error):
        return None
