"""The compiled loops of event blocks: merging sorted runs of sort keys, gathering events from
where they lie, and keying them as a BSON array's elements (see event_block.py)."""

from __future__ import annotations

from buckets._columnar.numba_cache import CACHE  # picks numba's cache dir before numba loads

# isort: split
import numba
import numpy as np
import numpy.typing as npt

from buckets._columnar.byte_kernels import Index, U, copy_from, move, prefetch_line

# Bytes of events ahead of the one being copied that the gather asks the CPU for: far enough
# that they arrive before they are copied, whatever the events' size (rows ahead: this over
# their mean size).
PREFETCH_BYTES = 8 << 10


@numba.njit(cache=CACHE)
def _head(keys: npt.NDArray[np.uint8], row: Index, start: Index) -> np.uint64:
    """Row `row`'s 8 bytes from `start` on as a big-endian number: they order as the bytes do
    (bytes past the row's end count as zeros, the padding's value)."""
    stop = min(start + U(8), U(keys.shape[1]))
    if stop <= start:
        return np.uint64(0)
    value = np.uint64(0)
    for j in range(start, stop):
        value = (value << np.uint64(8)) | np.uint64(keys[row, j])
    return value << np.uint64(8 * (start + U(8) - stop))


@numba.njit(cache=CACHE, nogil=True)
def _merge_runs(
    keys: npt.NDArray[np.uint8], bounds: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """The order of the rows of `keys` (at least 8 bytes wide) that merges its sorted runs (run
    r: rows bounds[r] to bounds[r + 1]); equal keys keep the runs' order. Each run's next row
    and that row's heads (its first 16 bytes as two big-endian numbers) are kept at hand (`at`,
    `cur`; a spent run's `at` is -1), so most comparisons are one or two: a resume token's
    first 8 bytes are its type and most of its cluster time, which the events of a second
    share; equal heads compare the rest byte by byte."""
    k = U(len(bounds) - 1)
    at, cur = _run_heads(keys, bounds)
    order = np.empty(bounds[k], np.int64)
    for i in range(U(bounds[k])):
        best = _best_run(keys, at, cur)
        row = at[best]
        order[i] = row
        row += 1
        if row < bounds[best + U(1)]:
            at[best] = row
            cur[best, 0] = _head(keys, U(row), U(0))
            cur[best, 1] = _head(keys, U(row), U(8))
        else:
            at[best] = -1
    return order


@numba.njit(cache=CACHE)
def _run_heads(
    keys: npt.NDArray[np.uint8], bounds: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint64]]:
    """Each run's first row (-1 for an empty run) and that row's heads; the bounds checked."""
    k = U(len(bounds) - 1)
    if bounds[0] != 0:
        raise IndexError("the first run must start at row 0")
    at = np.empty(k, np.int64)
    cur = np.zeros((k, 2), np.uint64)
    for r in range(k):
        if not 0 <= bounds[r] <= bounds[r + U(1)] <= len(keys):
            raise IndexError("run out of range")
        at[r] = bounds[r] if bounds[r] < bounds[r + U(1)] else -1
        if at[r] >= 0:
            cur[r, 0] = _head(keys, U(at[r]), U(0))
            cur[r, 1] = _head(keys, U(at[r]), U(8))
    return at, cur


@numba.njit(cache=CACHE)
def _best_run(
    keys: npt.NDArray[np.uint8], at: npt.NDArray[np.int64], cur: npt.NDArray[np.uint64]
) -> np.uintp:
    """The run whose next row has the lowest key, the first such run on a tie."""
    best = U(0)
    while at[best] < 0:
        best += U(1)
    for r in range(best + U(1), len(at)):
        if at[r] < 0 or cur[r, 0] > cur[best, 0]:
            continue
        if (
            cur[r, 0] < cur[best, 0]
            or cur[r, 1] < cur[best, 1]
            or (cur[r, 1] == cur[best, 1] and _tail_less(keys, U(at[r]), U(at[best])))
        ):
            best = U(r)
    return best


@numba.njit(cache=CACHE)
def _tail_less(keys: npt.NDArray[np.uint8], a: Index, b: Index) -> bool:
    """Whether row `a`'s bytes after its heads order before row `b`'s."""
    for j in range(U(16), U(keys.shape[1])):
        if keys[a, j] != keys[b, j]:
            return bool(keys[a, j] < keys[b, j])
    return False


@numba.njit(cache=CACHE, nogil=True)
def _gather_rows(
    addresses: npt.NDArray[np.uintp], sizes: npt.NDArray[np.int64], rows: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """`_Scattered.gather`'s loop: sizes first, so the output is one array, then one copy each."""
    n = len(rows)
    offsets = np.empty(n + 1, np.int64)
    offsets[0] = 0
    for i in range(U(n)):
        r = rows[i]
        if r < 0 or r >= len(sizes):
            raise IndexError("row out of range")
        offsets[i + U(1)] = offsets[i] + sizes[U(r)]
    out = np.empty(offsets[n], np.uint8)
    for i in range(U(n)):
        r = U(rows[i])
        copy_from(out, offsets[i], addresses[r], sizes[r])
    return out, offsets


@numba.njit(cache=CACHE)
def _digits(n: int) -> int:
    """How many decimal digits n >= 0 has."""
    width = 1
    while n >= 10:
        width, n = width + 1, n // 10
    return width


_inline_digits = numba.njit(inline="always")(_digits.py_func)


@numba.njit(cache=CACHE)
def _element_bytes(size: int, index: int) -> int:
    """The bytes of an event of `size` bytes as the array element `index` (see `_put_key`)."""
    return size + _digits(index) + 2


@numba.njit(cache=CACHE, nogil=True)
def _keyed_size(sizes: npt.NDArray[np.int64], rows: npt.NDArray[np.int64], first_index: int) -> int:
    """The bytes of the events at `rows` as array elements keyed from `first_index` on: their
    sizes, and their keys' digits counted a digit width at a time (the keys are consecutive)."""
    total = 0
    for i in range(U(len(rows))):
        r = rows[i]
        if r < 0 or r >= len(sizes):
            raise IndexError("row out of range")
        total += sizes[U(r)]
    return total + 2 * len(rows) + _digits_between(first_index, first_index + len(rows))


@numba.njit(cache=CACHE)
def _digits_between(lo: int, hi: int) -> int:
    """The decimal digits of all the numbers from `lo` to `hi` (0 <= lo, hi excluded)."""
    total, width, low, bound = 0, 1, 0, 10
    while low < hi:
        a, b = max(lo, low), min(hi, bound)
        if a < b:
            total += (b - a) * width
        if width == 18:  # (the next bound would overflow: every larger number has 19 digits)
            return total + max(hi - max(lo, bound), 0) * 19
        low, bound, width = bound, bound * 10, width + 1
    return total


@numba.njit(cache=CACHE, nogil=True)
def _keyed_gather_into(
    out: npt.NDArray[np.uint8],
    addresses: npt.NDArray[np.uintp],
    sizes: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
    start: int,
    first_index: int,
    ahead: int,
) -> tuple[int, int]:
    """The events at rows[start:] of a scattered column (each at its address) as array
    elements (type 3 (a document), its index first_index + i in decimal as its key, then its
    bytes), written from out[0] on for as long as they fit: (the next row's index, the bytes
    written). A bucket's share reads every few events of each shard's block, a stride the CPU's
    own prefetch does not follow, so the loop asks for the event `ahead` rows on as it copies
    this one (see PREFETCH_BYTES). (One loop, not Arrow's element-wise join of a column of keys
    and the events, which costs more: benchmarks/README.md.) Its steps are inlined (the
    element's head as `_put_key` writes it, its key's digits counted on from the last
    element's, the copy and the prefetch by address): it runs once per event, and a call to
    another cached kernel costs about as much as a step."""
    n = len(rows)
    if start < 0:
        raise IndexError("start out of range")
    # The key's digits (ASCII), counted up by one an element: computing each index's digits
    # anew cost a division per digit, twice, more than the element's copy.
    key = np.empty(20, np.uint8)
    index = first_index + start
    width = _inline_digits(index)
    for j in range(width - 1, -1, -1):
        key[j] = 48 + index % 10
        index //= 10
    at, i, out_at = 0, start, U(out.ctypes.data)
    while i < n:
        r = rows[U(i)]
        if r < 0 or r >= len(sizes):
            raise IndexError("row out of range")
        size = sizes[U(r)]
        if at + size + width + 2 > len(out):  # (`_element_bytes`)
            break
        if i + ahead < n:
            q = U(rows[U(i + ahead)])
            if q < U(len(sizes)):
                for line in range(addresses[q], addresses[q] + U(sizes[q]), U(64)):
                    prefetch_line(line)
        out[U(at)] = 3
        for j in range(U(width)):
            out[U(at) + U(1) + j] = key[j]
        out[U(at + width + 1)] = 0
        move(out_at + U(at + width + 2), addresses[U(r)], size)
        at += width + 2 + size
        i += 1
        j = width - 1  # the next index: ...x9 becomes ...(x+1)0, 9...9 becomes 10...0
        while j >= 0 and key[j] == 57:
            key[j] = 48
            j -= 1
        if j >= 0:
            key[j] += 1
        else:
            key[0] = 49
            key[width] = 48
            width += 1
    return i, at


@numba.njit(cache=CACHE)
def _put_key(out: npt.NDArray[np.uint8], at: int, index: int) -> int:
    """An array element's head at out[at:]: type 3 (a document), then `index` in decimal as its
    key; where the element's value goes."""
    width = _digits(index)
    out[U(at)] = 3
    for j in range(U(width), U(0), -1):  # its digits, from the last
        out[U(at) + j] = 48 + index % 10
        index //= 10
    out[U(at + width + 1)] = 0
    return at + width + 2
