"""MergedQueue: merges per-shard event streams into cluster-time order, as mongos does.

Invariant (mongos's AsyncResultsMerger rule, shared/reference 000 section 3.5): an event may
leave only when its sort key (resume token bytes) is <= every shard's high-water mark, i.e. every
shard has promised that nothing earlier can still come from it. A shard's mark advances when its
reader has read the oplog through some timestamp T: nothing at or before T can follow.

Pure and synchronous (no I/O, no trio): the async pump around it lives in stream.py.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable

from mongoformats.change_events import ChangeEvent

__all__ = ["MergedQueue"]


class MergedQueue:
    def __init__(self, shards: Iterable[str]) -> None:
        self._heap: list[tuple[bytes, int, str, ChangeEvent]] = []
        self._marks: dict[str, bytes] = {s: b"" for s in shards}
        self._seq = itertools.count()
        self.pending_bytes: dict[str, int] = {s: 0 for s in self._marks}

    def __len__(self) -> int:
        return len(self._heap)

    @property
    def shards(self) -> list[str]:
        return list(self._marks)

    def add_shard(self, shard: str, mark: bytes) -> None:
        """A shard joins with a mark at or above the frontier: what was released stays in order."""
        if self._marks and mark < self.frontier():
            raise ValueError(f"shard {shard} joins below the merge frontier")
        self._marks[shard] = mark
        self.pending_bytes[shard] = 0

    def push(self, shard: str, event: ChangeEvent) -> None:
        if event.sort_key <= self._marks[shard]:
            raise ValueError(f"shard {shard} pushed an event at or below its own high-water mark")
        heapq.heappush(self._heap, (event.sort_key, next(self._seq), shard, event))
        self.pending_bytes[shard] += len(event.raw)

    def advance(self, shard: str, mark: bytes) -> None:
        """Shard promises nothing at or below `mark` is still to come. Marks never move back."""
        if mark > self._marks[shard]:
            self._marks[shard] = mark

    def mark_of(self, shard: str) -> bytes:
        return self._marks[shard]

    def frontier(self) -> bytes:
        """Everything at or below this key has been pushed by every shard."""
        return min(self._marks.values()) if self._marks else b""

    def blocking_shards(self) -> list[str]:
        """Shards whose mark holds back a pending event (they need a noop to move on)."""
        if not self._heap:
            return []
        head = self._heap[0][0]
        return [s for s, m in self._marks.items() if m < head]

    def pop_ready(self, limit: int = 1 << 30) -> list[tuple[str, ChangeEvent]]:
        frontier = self.frontier()
        out: list[tuple[str, ChangeEvent]] = []
        heap = self._heap
        while heap and heap[0][0] <= frontier and len(out) < limit:
            _, _, shard, event = heapq.heappop(heap)
            self.pending_bytes[shard] -= len(event.raw)
            out.append((shard, event))
        return out
