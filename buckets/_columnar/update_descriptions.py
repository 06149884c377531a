"""The updateDescriptions of a batch's updates for its EventBlock: those `describe`
(buckets/_columnar/diff_kernel.py) writes, the few it leaves made one by one by
`update_description`, and all of them laid out as the block's kernel copies them in."""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from buckets._columnar.batch_layout import _DIFF_AT, _R_O_START, _R_OP, _R_SIMPLE, _UPDATE
from buckets._columnar.byte_kernels import as_bytes
from buckets._columnar.diff_kernel import describe
from buckets._columnar.oplog_batch import OplogBatch
from mongoformats.oplog_splice import byte_slices, update_description

__all__ = ["Descriptions", "other_descriptions"]

_I64 = npt.NDArray[np.int64]
_B8 = npt.NDArray[np.uint8]
_NONE = as_bytes(b"\0")  # (a batch's descriptions when it has none: the kernel reads none of it)


class Descriptions(NamedTuple):
    """The updateDescriptions made for a batch's entries: `data` from start[i], size[i] bytes,
    for entry i (size 0: none). The block's kernel (block_events.py) copies each into its event
    from there, less its first HEAD bytes (the block's update template holds them)."""

    data: _B8
    start: _I64
    size: _I64


def other_descriptions(
    batch: OplogBatch, rows: _I64, ok: npt.NDArray[np.bool_], expanded: bool
) -> Descriptions:
    """The updateDescription of each taken update whose diff is not `u` and `i` alone (the block
    copies those, see batch_layout's _R_SIMPLE): written by `describe`, and those it leaves
    made one by one by `update_description`; an update whose diff neither takes is dropped from
    `ok`, for splice_crud (none is taken with expanded events: disambiguatedPaths judges every
    name)."""
    other = np.flatnonzero(ok & (rows[:, _R_OP] == _UPDATE) & (rows[:, _R_SIMPLE] == 0))
    start = np.zeros(len(batch), np.int64)
    size = np.zeros(len(batch), np.int64)
    if expanded:
        ok[other] = False
    if expanded or not len(other):
        return Descriptions(_NONE, start, size)
    starts = batch.starts[other]
    data, at, taken = describe(
        as_bytes(batch.data),
        starts,
        starts + batch.lengths[other],
        rows[other, _R_O_START] + _DIFF_AT,
    )
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


def _description(data: bytes | bytearray, start: int, end: int, diff: int) -> bytes | None:
    """The updateDescription of the update entry data[start:end] whose diff is at `diff`, read
    from the entry alone as splice_crud reads it (bytes past a broken entry are another's); None
    if `update_description` does not take it or cannot read it (splice_crud then says why)."""
    try:
        return update_description(byte_slices(data)[start:end], diff - start, expanded=False)
    except (ValueError, IndexError, struct.error):
        return None
