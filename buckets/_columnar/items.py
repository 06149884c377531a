"""What the splice makes of a batch of oplog entries (a reader's items: EventFields tuples, one
event each, and EventBlocks, a run of events each) and its turn into the engine's runs
(buckets/event_run.py) as the merge takes them. Items cross from the reader processes as they
are: a plain tuple marshals fast, a block's columns travel out of band."""

from __future__ import annotations

import contextlib
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


def _blocks_at(items: Sequence[Any]) -> list[int]:
    """Where the blocks are in a list of items. Found in C (list.index over the items' types):
    a batch of a backlog is thousands of single events around a few blocks, and the reader, the
    merge and the budget each ask."""
    types = list(map(type, items))
    at: list[int] = []
    with contextlib.suppress(ValueError):
        while True:
            at.append(types.index(EventBlock, at[-1] + 1 if at else 0))
    return at


def count_events(items: Sequence[Any]) -> int:
    """How many events a list of items holds."""
    blocks = _blocks_at(items)
    return len(items) + sum(len(items[i]) - 1 for i in blocks)


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
    items = items if type(items) is list else list(items)
    out: list[EventRun] = []
    start = 0  # the first single event not yet in a run
    for at in _blocks_at(items):
        if start < at:
            out.append(PlainRun(items[start:at]))
        out.append(ColumnarRun(items[at]))
        start = at + 1
    if start < len(items):
        out.append(PlainRun(items[start:]))
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
    for at in _blocks_at(items):
        item = items[at]
        item.hold = hold(item.nbytes)
