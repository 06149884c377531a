"""MergedQueue: merges per-shard event streams into cluster-time order, as mongos does.

Invariant (mongos's AsyncResultsMerger rule, shared/reference 000 section 3.5): an event may
leave only when its sort key (resume token bytes) is <= every shard's high-water mark, i.e. every
shard has promised that nothing earlier can still come from it. A shard's mark advances when its
reader has read the oplog through some timestamp T: nothing at or before T can follow.

Each shard's events already arrive in token order (its oplog's order), so the queue keeps one
sorted run per shard and merges the releasable prefixes of the runs with one `list.sort`, whose
run detection makes that a k-way merge in C. A heap push and pop per event cost about as much as
a fifth of the whole splice. Events arrive as runs (buckets/event_run.py); a backlog's runs are
columns, which merge as columns (buckets/_columnar/run.py's merge_runs), and no per-event object
is made.

Pure and synchronous (no I/O, no trio): the async pump around it lives in stream.py.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterable

from buckets._columnar.run import merge_runs
from buckets.event_run import EventRun, count_events

__all__ = ["MergedQueue"]

_COMPACT_AT = 4096  # released events are cut off a run's front in slices of at least this


class _Run:
    """One shard's pending runs of events, in token order: events[head:] are still to be
    released."""

    __slots__ = ("events", "head", "mark")

    def __init__(self, mark: bytes) -> None:
        self.events: list[EventRun] = []
        self.head = 0
        self.mark = mark

    def take_through(self, key: bytes) -> list[EventRun]:
        events, head = self.events, self.head
        if head == len(events) or events[head].first_key > key:
            return []
        if events[-1].last_key <= key:  # all of it (a live tail's every release)
            self.events, self.head = [], 0
            return events[head:] if head else events
        end = (
            len(events)
            if events[-1].first_key <= key
            else bisect.bisect_right(events, key, head, key=_first_key)
        )
        taken = events[head:end]
        last = taken[-1]
        if last.last_key > key:  # a run reaching past the key: its head only
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
        # blocking_shards(), kept until the queue changes: the pump and every reader's note
        # timing ask for it each round.
        self._blocking: list[str] | None = None
        self._frontier: bytes | None = None  # frontier(), kept until a mark moves

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
        self._blocking = self._frontier = None

    def extend(self, shard: str, events: list[EventRun]) -> None:
        """Queue a batch of `shard`'s runs of events, in token order and above its mark."""
        if not events:
            return
        run = self._runs[shard]
        last = run.events[-1].last_key if len(run.events) > run.head else run.mark
        # Only the ends are checked: a batch is one oplog read, in oplog order by construction.
        if events[0].first_key <= last or events[-1].last_key < events[0].first_key:
            raise ValueError(
                f"shard {shard} pushed events out of token order or at or below its mark"
            )
        run.events += events
        self._blocking = None

    def advance(self, shard: str, mark: bytes) -> None:
        """Shard promises nothing at or below `mark` is still to come. Marks never move back."""
        run = self._runs[shard]
        if mark > run.mark:
            run.mark = mark
            self._blocking = self._frontier = None

    def mark_of(self, shard: str) -> bytes:
        return self._runs[shard].mark

    def frontier(self) -> bytes:
        """Everything at or below this key has been pushed by every shard."""
        if self._frontier is None:
            self._frontier = min([r.mark for r in self._runs.values()]) if self._runs else b""
        return self._frontier

    def blocking_shards(self) -> list[str]:
        """Shards whose mark holds back a pending event (they need a noop to move on). The list
        is shared until the queue changes: read it, do not change it."""
        if self._blocking is None:
            self._blocking = self._find_blocking()
        return self._blocking

    def _find_blocking(self) -> list[str]:
        heads = [r.events[r.head].first_key for r in self._runs.values() if len(r.events) > r.head]
        if not heads:
            return []
        head = min(heads)
        return [s for s, r in self._runs.items() if r.mark < head]

    def drop_pending(self) -> None:
        """Forget every queued event (the stream is closing); marks stay."""
        for run in self._runs.values():
            run.events, run.head = [], 0
        self._blocking = None

    def pop_ready(self) -> tuple[list[EventRun], dict[str, int]]:
        """Every event now at or below the frontier, as runs in token order, and the bytes each
        shard's released events hold (for its buffer budget), less those of runs with a hold
        (theirs return with it, once the buckets let the run go). Ties between shards keep
        shard order."""
        frontier = self.frontier()
        out: list[EventRun] = []
        freed: dict[str, int] = {}
        runs = 0
        for shard, run in self._runs.items():
            taken = run.take_through(frontier)
            if taken:
                self._blocking = None
                freed[shard] = sum(map(_RELEASED_BYTES, taken))
                out += taken
                runs += 1
        if runs > 1:
            return merge_runs(out), freed
        return out, freed


_RELEASED_BYTES = operator.attrgetter("released_bytes")


def _first_key(run: EventRun) -> bytes:
    return run.first_key
