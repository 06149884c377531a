"""MergedQueue: merges per-shard event streams into cluster-time order, as mongos does.

Invariant (mongos's AsyncResultsMerger rule, shared/reference 000 section 3.5): an event may
leave only when its sort key (resume token bytes) is <= every shard's high-water mark, i.e. every
shard has promised that nothing earlier can still come from it. A shard's mark advances when its
reader has read the oplog through some timestamp T: nothing at or before T can follow.

Each shard's events already arrive in token order (its oplog's order), so the queue keeps one
sorted run per shard and merges the releasable prefixes of the runs with one `list.sort`, whose
run detection makes that a k-way merge in C. A heap push and pop per event cost about as much as
a fifth of the whole splice. A backlog's batches arrive as EventBlocks (columns, see
buckets/_columnar/event_block.py); the shards' blocks are merged as columns instead (one stable
numpy sort of their keys), and no per-event object is made. Single events released beside them
(a transaction's, a small batch's) are sorted apart and put where they go between parts of the
merged block.

Pure and synchronous (no I/O, no trio): the async pump around it lives in stream.py.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

from buckets._columnar.event_block import EventBlock
from buckets._columnar.items import (
    as_fields,
    count_events,
    first_key,
    is_block,
    items_bytes,
    last_key,
)
from mongoformats.change_events import EVENT_SORT_KEY

__all__ = ["MergedQueue"]

_COMPACT_AT = 4096  # released events are cut off a run's front in slices of at least this


class _Run:
    """One shard's pending events, in token order: items[head:] are still to be released. An item
    is one event's fields or an EventBlock (a run of spliced events)."""

    __slots__ = ("events", "head", "mark")

    def __init__(self, mark: bytes) -> None:
        self.events: list[Any] = []
        self.head = 0
        self.mark = mark

    def take_through(self, key: bytes) -> list[Any]:
        events, head = self.events, self.head
        if head == len(events) or first_key(events[head]) > key:
            return []
        end = (
            len(events)
            if first_key(events[-1]) <= key
            else bisect.bisect_right(events, key, head, key=first_key)
        )
        taken = events[head:end]
        last = taken[-1]
        if is_block(last) and last.last_key > key:  # a block reaching past the key: its head only
            cut = last.bisect_right(key)
            taken[-1] = last.sliced(0, cut)
            end -= 1
            events[end] = last.sliced(cut)
        if end == len(events):
            events.clear()
            self.head = 0
        elif end >= _COMPACT_AT and end * 2 >= len(events):
            del events[:end]
            self.head = 0
        else:
            self.head = end
        return taken


class MergedQueue:
    def __init__(self, shards: Iterable[str]) -> None:
        self._runs: dict[str, _Run] = {s: _Run(b"") for s in shards}

    def __len__(self) -> int:
        return sum(count_events(r.events[r.head :]) for r in self._runs.values())

    @property
    def shards(self) -> list[str]:
        return list(self._runs)

    def add_shard(self, shard: str, mark: bytes) -> None:
        """A shard joins with a mark at or above the frontier: what was released stays in order."""
        if self._runs and mark < self.frontier():
            raise ValueError(f"shard {shard} joins below the merge frontier")
        self._runs[shard] = _Run(mark)

    def extend(self, shard: str, events: list[Any]) -> None:
        """Queue a batch of `shard`'s events (EventFields or EventBlocks), in token order and
        above its mark."""
        if not events:
            return
        run = self._runs[shard]
        last = last_key(run.events[-1]) if len(run.events) > run.head else run.mark
        # Only the ends are checked: a batch is one oplog read, in oplog order by construction.
        if first_key(events[0]) <= last or last_key(events[-1]) < first_key(events[0]):
            raise ValueError(
                f"shard {shard} pushed events out of token order or at or below its mark"
            )
        run.events += events

    def advance(self, shard: str, mark: bytes) -> None:
        """Shard promises nothing at or below `mark` is still to come. Marks never move back."""
        run = self._runs[shard]
        if mark > run.mark:
            run.mark = mark

    def mark_of(self, shard: str) -> bytes:
        return self._runs[shard].mark

    def frontier(self) -> bytes:
        """Everything at or below this key has been pushed by every shard."""
        return min(r.mark for r in self._runs.values()) if self._runs else b""

    def blocking_shards(self) -> list[str]:
        """Shards whose mark holds back a pending event (they need a noop to move on)."""
        heads = [first_key(r.events[r.head]) for r in self._runs.values() if len(r.events) > r.head]
        if not heads:
            return []
        head = min(heads)
        return [s for s, r in self._runs.items() if r.mark < head]

    def drop_pending(self) -> None:
        """Forget every queued event (the stream is closing); marks stay."""
        for run in self._runs.values():
            run.events, run.head = [], 0

    def pop_ready(self) -> tuple[list[Any], dict[str, int]]:
        """Every event now at or below the frontier, in token order (EventFields and EventBlocks),
        and the bytes each shard's released events hold (for its buffer budget), less those of
        blocks with a hold (theirs return with it, once the buckets let the block go). Ties
        between shards keep shard order."""
        frontier = self.frontier()
        out: list[Any] = []
        freed: dict[str, int] = {}
        runs = 0
        for shard, run in self._runs.items():
            taken = run.take_through(frontier)
            if taken:
                freed[shard] = items_bytes([i for i in taken if not is_block(i) or i.hold is None])
                out += taken
                runs += 1
        if runs > 1:
            if all(map(is_block, out)):
                # Blocks merge as columns: one stable sort of their keys (the backlog's case).
                return [EventBlock.merge(out)], freed
            return _merge_mixed(out), freed
        return out, freed


def _merge_mixed(items: list[Any]) -> list[Any]:
    """Blocks and single events (in shard order, each shard's in token order) in token order:
    the blocks merged as columns, the singles sorted, and the merged block cut where each single
    goes. Turning every block into per-event tuples instead would make one transaction's event
    (a single) in a release cost as much as the whole release as tuples. Equal
    keys between a block's event and a single (no two shards write one, in practice) take the
    exact path: everything as tuples, one stable sort, which keeps shard order."""
    singles = sorted(
        (i for i in items if not is_block(i)), key=EVENT_SORT_KEY
    )  # stable: shard order
    blocks = [i for i in items if is_block(i)]
    if not blocks:
        return singles
    merged = EventBlock.merge(blocks)
    cuts, exact = merged.bisect_keys([EVENT_SORT_KEY(single) for single in singles])
    if exact:
        everything = as_fields(items)
        everything.sort(key=EVENT_SORT_KEY)
        return everything
    return _interleave(merged, singles, cuts)


def _interleave(merged: EventBlock, singles: list[Any], cuts: list[int]) -> list[Any]:
    """`merged` cut before each single's position (`cuts`), with the singles between."""
    out: list[Any] = []
    at = 0
    for single, cut in zip(singles, cuts, strict=True):
        if cut > at:
            out.append(merged.sliced(at, cut))
            at = cut
        out.append(single)
    if at < len(merged):
        out.append(merged.sliced(at))
    return out
