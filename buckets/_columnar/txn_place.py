"""A batch's items put together (batch_splice.splice_entries): the block of its plain writes
with the events of the transactions it holds whole (txn_batch.py) put in at their commits, as
one block of its own columns (batch_splice._with_transactions), cut around the entries left to
other paths.

Why one block: a transaction's events as tuples between the block's parts cut a shard's run
into short parts and singles, which the merge then made a block again (run.merge_runs); a
block of them all is merged, dealt and replied as columns from the start.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from buckets._columnar.event_block import EventBlock

__all__ = ["cut_around"]


def cut_around(
    whole: EventBlock | None,
    places: npt.NDArray[np.intp],
    order: list[int],
    at: list[int],
    items: list[Any],
    replaced: dict[int, list[Any]],
    run_min: int,
) -> list[Any]:
    """The items `order` (of `items`, item j the entry at at[j]; a transaction's commit's
    replaced by its events' fields) in batch order, and between them the parts of the block
    `whole` (whose events' entries, by index in the batch, are `places`), a part shorter than
    `run_min` as fields."""
    cuts = np.searchsorted(places, [at[j] for j in order]).tolist()
    out: list[Any] = []
    start = 0
    for j, cut in zip(order, cuts, strict=True):
        if whole is not None and cut > start:
            out += _part(whole, start, cut, run_min)
        start = cut
        out += replaced[j] if j in replaced else [items[j]]
    if whole is not None and start < len(whole):
        out += _part(whole, start, len(whole), run_min)
    return out


def _part(whole: EventBlock, start: int, stop: int, run_min: int) -> list[Any]:
    """Events [start, stop) of the block, as a block or (fewer than `run_min`) as fields."""
    part = whole.sliced(start, stop)
    return [part] if len(part) >= run_min else part.fields()
