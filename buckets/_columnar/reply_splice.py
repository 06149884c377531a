"""An oplog reply walked and spliced in one call that may run in a worker thread
(buckets/oplog_tail.py runs a large one beside the event loop: the kernels release the GIL).

It reads the reply and makes new objects only: no trio object, budget, transformer or cache of
the stream's. What it returns is complete (a block's events are its own columns, not a merge's
gathered on first use), so the loop reads it without racing the thread."""

from __future__ import annotations

from bson import Timestamp

from buckets._columnar.batch_splice import splice_entries
from buckets._columnar.event_block import EventBlock
from buckets._columnar.items import SplicedItems, listed
from buckets._columnar.oplog_batch import OplogBatch, batch_in_place
from mongoformats.oplog_splice import timestamp_of

__all__ = ["last_ts", "splice_reply"]


def last_ts(batch: OplogBatch) -> Timestamp:
    """The ts of the batch's last entry, read where it lies in the reply (a live tail's batches
    are an entry or a few: a copy of the entry costs more than the splice of it)."""
    return timestamp_of(batch.data, b"ts", int(batch.starts[-1]))


def splice_reply(
    data: bytes | bytearray, at: int, splice: bool, expanded: bool, applied: bool
) -> tuple[int, tuple[SplicedItems, int, Timestamp] | None]:
    """The cursor id of the reply at `at` in `data`, and its batch's events (what
    `splice_entries` makes of them, their entries, the last one's ts; None for an empty
    batch)."""
    cursor_id, batch = batch_in_place(data, at)
    if not len(batch):
        return cursor_id, None
    items = splice_entries(batch, splice, expanded, applied)
    for item in listed(items):
        if type(item) is EventBlock:
            item.events  # noqa: B018 (a merge's block gathers its events here, once)
    return cursor_id, (items, len(batch), last_ts(batch))
