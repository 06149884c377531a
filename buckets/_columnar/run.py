"""The columnar run: an EventBlock (a backlog's events as columns, see event_block.py) behind
the engine's run interface (buckets/event_run.py)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from buckets._columnar.event_block import EventBlock
from buckets._columnar.sizes import count_reaching, count_within, reply_prefix
from buckets.event_run import EventRun, PlainRun, Route, fields_of
from mongoformats.change_events import (
    EV_RAW,
    EV_SHARD,
    EVENT_SORT_KEY,
    EventFields,
)
from mongoformats.resume_token import token_from_key

__all__ = ["SLICE_MIN", "ColumnarRun", "merge_runs"]

SLICE_MIN = 32  # a merged block's part between single events shorter than this goes as tuples


class ColumnarRun:
    """The events of one EventBlock. Its events' type bits are their kinds' (see EventBlock): a
    resume token is a sort key and its kind's type bits."""

    __slots__ = ("block",)

    def __init__(self, block: EventBlock) -> None:
        self.block = block

    def __len__(self) -> int:
        return len(self.block)

    def __repr__(self) -> str:
        return f"<ColumnarRun of {len(self.block)} events>"

    @property
    def first_key(self) -> bytes:
        return self.block.first_key

    @property
    def last_key(self) -> bytes:
        return self.block.last_key

    @property
    def nbytes(self) -> int:
        return self.block.nbytes

    @property
    def pins(self) -> bool:
        return self.block.pins

    @property
    def released_bytes(self) -> int:
        return 0 if self.block.hold is not None else self.block.nbytes

    def key(self, i: int) -> bytes:
        return self.block.key(i)

    def keys(self) -> list[bytes]:
        return self.block.key_list()

    def bisect_right(self, key: bytes) -> int:
        return self.block.bisect_right(key)

    def sliced(self, start: int, stop: int | None = None) -> ColumnarRun:
        return ColumnarRun(self.block.sliced(start, stop))

    def pieces(self) -> Iterator[EventRun]:
        """Whole: a block's slices are views, cut to a bucket's room with one cumulative sum."""
        yield self

    def own(self) -> ColumnarRun:
        return ColumnarRun(self.block.own())

    def shares(self, route: Route) -> dict[int, EventRun]:
        """Taken as columns: one mask per bucket over the block's kinds, each kind routed by
        its namespaces."""
        routes = [route(kind[3]) for kind in self.block.kind_table]
        return {b: ColumnarRun(share) for b, share in self.block.shares(routes).items()}

    def document_shares(
        self, n: int, kept: Collection[int], decide: Callable[[EventFields], tuple[int, ...]]
    ) -> dict[int, EventRun]:
        """Taken as columns by documentKey (bucketing.py's contract): each event's bucket of `n`
        computed where it lies, those the compiled loop leaves undecided made tuples alone and
        given to `decide` (the per-event path: one bucket, or all `n` for a barrier). Only the
        `kept` buckets get a share."""
        block = self.block
        buckets = block.document_buckets(n)
        undecided = np.flatnonzero(buckets < 0)
        if len(undecided):
            routes = map(decide, block.take(undecided).fields())
            buckets[undecided] = [route[0] if len(route) == 1 else -1 for route in routes]
        return {b: ColumnarRun(share) for b, share in block.dealt(buckets, kept).items()}

    def fields(self) -> list[EventFields]:
        return self.block.fields()

    def last_token(self) -> dict[str, Any]:
        block = self.block
        return token_from_key(block.last_key, block.kind_table[int(block.kinds[-1])][4])

    def reply_parts(self) -> list[Any]:
        return [self.block]

    def count_within(self, room: int) -> int:
        return count_within(self.block.sizes, room)

    def count_reaching(self, total: int) -> tuple[int, int]:
        return count_reaching(self.block.sizes, total)

    def reply_prefix(self, room: int, overhead: int, measure_above: int) -> tuple[int, int]:
        return reply_prefix(self.block.sizes, room, overhead, measure_above)


def merge_runs(runs: list[EventRun]) -> list[EventRun]:
    """Several shards' runs (in shard order, each shard's in token order) in token order: the
    columnar runs merged as columns (one pass over their keys, see EventBlock.merge), the single
    events sorted and merged with them as one more block of their own columns: where writes go
    to every shard in turn, as hashed sharding sends them, the singles (transactions' events)
    fall every few events, and cutting the merge around them left parts too short to be worth a
    run, each made into tuples (and putting them into the merged block afterwards copied every
    key once more). Singles a block cannot hold cut the merged block instead (`_interleaved`).
    Equal keys between a block's event and a single (no two shards write one, in practice)
    take the exact path: everything as single events, one stable sort, which keeps shard
    order."""
    blocks = [run.block for run in runs if isinstance(run, ColumnarRun)]
    singles = sorted(
        fields_of(run for run in runs if not isinstance(run, ColumnarRun)), key=EVENT_SORT_KEY
    )  # stable: shard order
    if not blocks:
        return [PlainRun(singles)] if singles else []
    if not singles:
        return [ColumnarRun(EventBlock.merge(blocks))]
    if all(map(_block_holds, singles)):
        merged = EventBlock.merge([*blocks, EventBlock.of_fields(singles)])
        if not merged.ties_last(len(singles)):
            return [ColumnarRun(merged)]
        return [PlainRun(sorted(fields_of(runs), key=EVENT_SORT_KEY))]
    merged = EventBlock.merge(blocks)
    cuts, exact = merged.bisect_keys([EVENT_SORT_KEY(single) for single in singles])
    if exact:
        return [PlainRun(sorted(fields_of(runs), key=EVENT_SORT_KEY))]
    return _interleaved(merged, singles, cuts)


def _block_holds(event: EventFields) -> bool:
    """Whether a block can hold the single event (see event_block.py): no shard tag and its
    bytes a bytes object. Its applied-at time (a transaction's op's) is not kept: only pre-image
    lookups read it, and their streams tag every event with its shard."""
    return not event[EV_SHARD] and type(event[EV_RAW]) is bytes


def _interleaved(merged: EventBlock, singles: list[EventFields], cuts: list[int]) -> list[EventRun]:
    """`merged` cut at `cuts`, single i going before the part from cuts[i] on. A part shorter
    than SLICE_MIN goes as tuples, among the singles around it: a run costs the engine a few
    array operations wherever it goes (its buckets' shares, a reply's cut), tens of microseconds
    that a short part's events do not repay; all those parts' tuples are made in one call."""
    bounds = [0, *cuts, len(merged)]
    short = [j for j in range(len(bounds) - 1) if 0 < bounds[j + 1] - bounds[j] < SLICE_MIN]
    made = iter(merged.take(_ranges(bounds, short)).fields() if short else [])
    out: list[EventRun] = []
    pending: list[EventFields] = []
    for j in range(len(bounds) - 1):
        start, stop = bounds[j], bounds[j + 1]
        if stop - start >= SLICE_MIN:
            if pending:
                out.append(PlainRun(pending))
                pending = []
            out.append(ColumnarRun(merged.sliced(start, stop)))
        else:
            pending += itertools.islice(made, stop - start)
        if j < len(singles):
            pending.append(singles[j])
    if pending:
        out.append(PlainRun(pending))
    return out


def _ranges(bounds: list[int], parts: list[int]) -> npt.NDArray[np.int64]:
    """The indices of parts `parts` (part j: bounds[j] to bounds[j + 1]), in order."""
    return np.concatenate([np.arange(bounds[j], bounds[j + 1]) for j in parts])
