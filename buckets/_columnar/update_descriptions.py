"""The updateDescriptions of a batch's updates for its EventBlock: those `describe`
(buckets/_columnar/diff_kernel.py) writes, the few it leaves made one by one by
`update_description`, and all of them laid out as the block's kernel copies them in."""

from __future__ import annotations

import struct
from typing import NamedTuple

from buckets._columnar.numba_cache import CACHE  # picks numba's cache dir before numba loads

# isort: split
import numba
import numpy as np
import numpy.typing as npt

from buckets._columnar.batch_layout import _DIFF_AT, _R_O_START, _R_OP, _R_SIMPLE, _UPDATE
from buckets._columnar.byte_kernels import U, as_bytes, copy
from buckets._columnar.diff_kernel import HEAD, describe
from buckets._columnar.oplog_batch import OplogBatch
from mongoformats.oplog_splice import byte_slices, update_description

__all__ = ["Descriptions", "extras", "other_descriptions"]

_I64 = npt.NDArray[np.int64]
_B8 = npt.NDArray[np.uint8]


@numba.njit(cache=CACHE, nogil=True)
def _gathered(data: _B8, start: _I64, size: _I64) -> tuple[_B8, _I64]:
    """The descriptions data[start[k]:start[k] + size[k]] less their first HEAD bytes (the
    block's update template holds them), each then closing its event, back to back; and where
    each starts."""
    m = len(start)
    at = np.zeros(m + 1, np.int64)
    for k in range(U(m)):
        at[k + 1] = at[k] + (size[k] - HEAD + 1 if size[k] else 0)
    out = np.zeros(max(at[m], 1), np.uint8)  # (never empty: the block reads it as an array)
    for k in range(U(m)):
        n = at[k + 1] - at[k]
        if n:
            copy(out, at[k], data, start[k] + HEAD, n - 1)
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
