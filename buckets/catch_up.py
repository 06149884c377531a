"""Where a bucket of a named stream stands against the merge: live, fallen behind, or live again
while its consumers catch up from a replay (pure state, no I/O; buckets/bucket.py drives it).

A bucket whose consumer is slow or gone fills its budget. Waiting for room there stops the merge
for every bucket (head-of-line blocking). A full bucket waits (backpressure, which costs nothing
while every consumer reads) as long as no consumer of another bucket waits for events; while one
does, it waits FALL_BEHIND_AFTER_S at most (its consumer is slow), and only MIN_WAIT_S once its
own consumer has sent no getMore for that long (stalled or gone); a bucket no consumer has read
yet waits FIRST_READ_GRACE_S (its consumer is yet to come). A getMore parked on the bucket is a
consumer present. Then it falls behind:

    live --(full)--> behind --(a consumer waits to rejoin, none reads what it holds)--> live
                       |                                                                  |
                       drops what the merge deals it,                 holds every event after
                       counting it; holds every event                 the rejoin point; the
                       up to `complete_to`                            consumer reads the gap from
                                                                      a replay of the oplogs

The gap (`complete_to`, rejoin point] is never held: a consumer that has read what the bucket
holds is moved to a private replay stream that re-reads the shards' oplogs for this bucket alone
from its resume point, and back to the bucket once the replay reaches the rejoin point.
"""

from __future__ import annotations

from dataclasses import dataclass

LIVE, BEHIND, CATCHING_UP = "live", "behind", "catchingUp"
# How long a full bucket may hold the merge back while another bucket's consumer waits, and how
# long its own consumer may go without a getMore before it counts as stalled. Short beside a
# stall (what the others lose), long beside the jitter of consumers that all read on a busy
# machine (a bucket that falls behind costs a replay re-reading every shard's oplog).
FALL_BEHIND_AFTER_S = 1.0
# How long a full bucket no consumer has read yet may hold the merge back: its consumer is yet to
# come (a worker attaching after the opener, a Spark task being scheduled). Longer than
# FALL_BEHIND_AFTER_S because falling behind at the start costs a replay of every shard's oplog
# for a consumer that was only late, while waiting costs only the start's few seconds.
FIRST_READ_GRACE_S = 5.0
# A full bucket looks at its consumer and the others every WAIT_SLICE_S while it waits, and
# counts only the time it waited with the proxy's event loop running: a pause of the whole
# proxy (a compile, a garbage collection) kept its consumer from being served too. It waits at
# least MIN_WAIT_S even for a consumer long away, in which a getMore already on its way (sent
# during such a pause) is served.
WAIT_SLICE_S = FALL_BEHIND_AFTER_S / 8
MIN_WAIT_S = 2 * WAIT_SLICE_S


@dataclass
class Lag:
    # None while live; behind: the key up to which the bucket holds every event it was dealt.
    complete_to: bytes | None = None
    # The last key the bucket dropped: everything up to it was dealt (and held or dropped).
    last_dropped: bytes = b""
    # What was dropped since the bucket last fell behind, until its consumers are back on it:
    # events a replay re-reads.
    dropped_events: int = 0
    dropped_bytes: int = 0
    fell_behind: int = 0  # how many times, over the stream's life
    dropped_total: int = 0  # events, over the stream's life

    @property
    def behind(self) -> bool:
        return self.complete_to is not None

    def fall(self, complete_to: bytes) -> None:
        """The bucket is full: it holds every event up to `complete_to` and drops what follows."""
        assert self.complete_to is None, "already behind"
        self.complete_to = complete_to
        self.fell_behind += 1

    def drop(self, events: int, nbytes: int, last_key: bytes) -> None:
        """Events the merge dealt while behind: counted, not held."""
        assert self.complete_to is not None, "a live bucket holds what it is dealt"
        self.dropped_events += events
        self.dropped_bytes += nbytes
        self.dropped_total += events
        self.last_dropped = max(self.last_dropped, last_key)

    def holds_after(self, key: bytes) -> bool:
        """Whether the bucket holds (or will be dealt) the events after `key` with no gap: live,
        or behind a point at or above `key`. (Below its floor is the bucket's to say.)"""
        return self.complete_to is None or key <= self.complete_to

    def rejoin_point(self, frontier: bytes, floor: bytes) -> bytes:
        """Where the bucket starts holding events again: every event up to it was dealt, either
        held before the gap or dropped in it."""
        assert self.complete_to is not None
        return max(frontier, self.last_dropped, floor, self.complete_to)

    def rejoin(self) -> None:
        """Live again: the dropped events stay pending until the consumers are back (`settle`)."""
        self.complete_to = None

    def settle(self) -> None:
        """Every consumer that was behind has caught up: nothing dropped is pending any more."""
        if self.complete_to is None:
            self.dropped_events = self.dropped_bytes = 0

    def state(self, awaiting: bool) -> str:
        """LIVE, BEHIND, or CATCHING_UP (live again, or still behind, with a consumer reading a
        replay to come back)."""
        if awaiting:
            return CATCHING_UP
        return BEHIND if self.complete_to is not None else LIVE
