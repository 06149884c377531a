"""What the splice makes of a batch of oplog entries (a reader's items: EventFields tuples, one
event each, and EventBlocks, a run of events each) and its turn into the engine's runs
(buckets/event_run.py) as the merge takes them. Items cross from the reader processes as they
are: a plain tuple marshals fast, a block's columns travel out of band."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from buckets._columnar.event_block import EventBlock
from buckets._columnar.run import ColumnarRun
from buckets.event_run import EventRun, PlainRun
from mongoformats.change_events import EV_RAW

__all__ = [
    "SplicedItems",
    "above",
    "as_fields",
    "as_runs",
    "count_events",
    "hold_blocks",
    "listed",
]

# What batch_splice.splice_entries makes of a batch: one block, or a list of items (an oplog
# entry's bytes for the general path, a spliced event's tuple, a block, or () for none).
SplicedItems = EventBlock | list[Any]


def count_events(items: Sequence[Any]) -> int:
    """How many events a list of items holds."""
    return sum(len(i) if type(i) is EventBlock else 1 for i in items)


def as_fields(items: Sequence[Any]) -> list[tuple[Any, ...]]:
    """The events of a list of items, each an EventFields tuple."""
    if not any(type(i) is EventBlock for i in items):
        return list(items)
    out: list[tuple[Any, ...]] = []
    for item in items:
        if type(item) is EventBlock:
            out += item.fields()
        else:
            out.append(item)
    return out


def as_runs(items: Sequence[Any]) -> list[EventRun]:
    """A list of items (the readers' and the merge's) as runs: each block a columnar run, each
    stretch of single events between them one plain run. (Not one run of them all: a shard's
    runs are charged to its budget by what each holds, see EventBlock.hold; the merge of several
    shards' puts their single events into the merged block, run.merge_runs.)"""
    out: list[EventRun] = []
    singles: list[Any] = []
    for item in items:
        if type(item) is EventBlock:
            if singles:
                out.append(PlainRun(singles))
                singles = []
            out.append(ColumnarRun(item))
        else:
            singles.append(item)
    if singles:
        out.append(PlainRun(singles))
    return out


def listed(items: SplicedItems) -> list[Any]:
    """A splice's items as a list."""
    return [items] if isinstance(items, EventBlock) else items


def above(item: Any, skip: bytes) -> tuple[Any, int] | None:
    """A spliced item (an event's tuple, a block, or ()) less its events at or below `skip`, and
    their bytes; None if none is left."""
    if type(item) is EventBlock:
        if item.first_key <= skip:
            item = item.sliced(item.bisect_right(skip))
        return (item, item.nbytes) if len(item) else None
    if item and item[0] > skip:
        return item, len(item[EV_RAW])
    return None


def hold_blocks(items: Sequence[Any], hold: Callable[[int], Any]) -> None:
    """Give each block the hold `hold` makes of its bytes (see EventBlock.hold)."""
    for item in items:
        if type(item) is EventBlock:
            item.hold = hold(item.nbytes)
