"""A batch's items put together (batch_splice.splice_entries): the block of its plain writes
with the events of the transactions it holds whole (txn_batch.py) put in at their commits, as
one block of its own columns, and that block cut around the entries left to other paths.

Why one block: a transaction's events as tuples between the block's parts cut a shard's run
into short parts and singles, which the merge then made a block again (run.merge_runs); a
block of them all is merged, dealt and replied as columns from the start.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from buckets._columnar.event_block import EventBlock
from buckets._columnar.txn_events import TxnRows, joined

__all__ = ["cut_around", "with_transactions_in"]


def with_transactions_in(
    block: EventBlock | None,
    taken: npt.NDArray[np.intp],
    txns: TxnRows | None,
    commits: list[int],
) -> tuple[EventBlock | None, npt.NDArray[np.intp]]:
    """The block with the transactions' events in it (their commits at `commits` in the batch),
    as one block of its own columns (txn_events.joined); and the entry (its index in the batch)
    of each of its events. Put in at its commit, a transaction's events are in token order:
    their clusterTime is the ts of the entry that commits it (the last applyOps or the
    commitTransaction: shared/reference/mongodb-formats.md C.6, "Change-stream semantics"),
    which no other entry of the shard's oplog has, and their txnOpIndex counts up."""
    places = np.asarray(commits, np.intp)
    if txns is None:
        return block, taken
    if block is None:
        return joined(None, np.zeros(len(places), np.int64), txns), places
    whole = joined(block, np.searchsorted(taken, places), txns)
    # Each of the batch's spliced entries' events moves past the transactions' before it.
    return whole, np.sort(np.concatenate([taken, places]))


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
