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

from buckets._columnar.byte_kernels import NO_REFCOUNTS, Data, U, prefetch_line, store_byte
from buckets._columnar.diff_steps import (
    _A,
    _D,
    _DEPTH,
    _ENTERED,
    _L,
    _NO,
    _OK,
    _RN,
    _ROOM,
    _RW,
    _SECTIONS,
    _SEEN,
    _SLOT,
    _SN,
    _TN,
    _TW,
    _W,
    _WALKED,
    HEAD,
    _byte,
    _close,
    _copied,
    _copy,
    _doc_end,
    _element,
    _frame,
    _inline,
    _note,
    _removed,
    _set,
    _truncated,
    _twice,
)

__all__ = ["HEAD", "describe"]

_I64 = npt.NDArray[np.int64]
_B8 = npt.NDArray[np.uint8]
_Bufs = tuple[Data, Data, Data, Data]  # output, removedFields', truncatedArrays', path

# The walk's steps allocate nothing (describe gives them their buffers): compiled without numba's
# reference counting (byte_kernels.NO_REFCOUNTS).
_kernel = numba.njit(cache=CACHE, **NO_REFCOUNTS)
# The steps take the bytes and buffers as addresses (diff_steps.py says why). The small steps run
# per element (reading one, hashing and noting a path, setting a field) and are inlined into the
# steps that call them, as are the steps run per section or per sub-diff from one place alone (a
# section's fields; the walk, its step and its entering of a sub-diff). The steps called from two
# places (the scan, an object diff's sections) and those run about once a diff (removals,
# truncation, the check for paths named twice, the closing) stay compiled apart: inlined, the
# former compile twice, and the latter lengthened the kernel's compilation by more than they
# saved; one kernel of every step made it far longer.
# A scan's findings: a key other than u, i and d; a section that is not a document.
_OTHER_KEY, _NOT_DOCUMENT = 1, 2


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
