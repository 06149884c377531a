"""Binary search of sorted byte-string keys over an event block's key rows, compiled: the
merge cuts a block at many keys in one call instead of one Python bisection (and one bytes object
per probed row) each."""

from __future__ import annotations

from buckets._columnar.numba_cache import CACHE  # picks numba's cache dir before numba loads

# isort: split
import numba
import numpy as np
import numpy.typing as npt

from buckets._columnar.byte_kernels import Index


@numba.njit(cache=CACHE)
def row_order(
    rows: npt.NDArray[np.uint8], row: Index, keys: npt.NDArray[np.uint8], k0: Index, k1: Index
) -> int:
    """-1, 0 or 1 as row `row` of `rows` is below, equal to or above keys[k0:k1] in Python's
    bytes order (the first differing byte, else the shorter is below); the row's key is the row
    less its padding, its trailing zero bytes (a key ends with a non-zero byte: id_keys.py)."""
    width, n = rows.shape[1], k1 - k0
    while width > 0 and rows[row, width - 1] == 0:
        width -= 1
    for j in range(min(width, n)):
        a, b = rows[row, j], keys[k0 + j]
        if a != b:
            return 1 if a > b else -1
    return 0 if width == n else (1 if width > n else -1)


@numba.njit(cache=CACHE)
def bisect_keys_kernel(
    rows: npt.NDArray[np.uint8],
    order: npt.NDArray[np.int64],
    ordered: bool,
    keys: npt.NDArray[np.uint8],
    bounds: npt.NDArray[np.int64],
    lo: int,
    cuts: npt.NDArray[np.int64],
) -> bool:
    """EventBlock.bisect_keys' loop: cuts[i] is bisect_right of key i
    (keys[bounds[i]:bounds[i + 1]], in ascending order, so each search starts where the last
    ended) over the rows (row order[j] the j-th, if `ordered`); whether some key equals the row
    before its cut."""
    n = len(order) if ordered else rows.shape[0]
    exact = False
    for i in range(len(cuts)):
        k0, k1 = bounds[i], bounds[i + 1]
        hi = n
        while lo < hi:
            mid = (lo + hi) // 2
            if row_order(rows, order[mid] if ordered else mid, keys, k0, k1) > 0:
                hi = mid
            else:
                lo = mid + 1
        cuts[i] = lo
        if lo > 0 and row_order(rows, order[lo - 1] if ordered else lo - 1, keys, k0, k1) == 0:
            exact = True
    return exact
