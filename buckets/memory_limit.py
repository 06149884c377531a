"""The proxy-wide memory limit: what every stream holds, and every reader process, under one bound.

Each byte budget of an open stream (one per shard, one per bucket) has an account in the engine's
MemoryPool. An account has a floor, set aside when the stream is admitted, and counts what its
budget holds (a shard's also the batch its reader holds in hand); the pool counts each account at
the larger of the two, and each reader process at its resident size. The sum never passes the
limit: a budget takes bytes above its floor only from what the pool has left, and its producer (a
shard's reader, the merge dealing into a bucket) waits until the pool has room again, as it waits
on a full budget of its own. The budgets themselves
keep their sizes (1 GiB a shard, 64 MiB a bucket by default): a stream whose consumers keep up
holds far less, and only what it holds is counted.

The floor of a stream is what it always takes, whatever its budgets (a budget always admits one
batch, however small it is). A shard's reader reads a batch before it asks its budget for it, and
holds it while it waits, with the next reply read ahead: its account counts those
(SHARD_IN_HAND_BYTES: a reply of the oplog, the events made of it, the next reply) beside what
its budget holds, and its floor is those and one batch more, so that a reader holding nothing
can always place its batch (the merge waits for it; without room of its
own it could wait for ever on other shards' batches that wait for it in the merge; a larger
batch, such as a large transaction's, takes the rest from the pool). A bucket's
floor is a few events (BUCKET_FLOOR_BYTES). A stream is admitted when its floor fits beside what
the others count; it is refused with ExceededMemoryLimit (146) otherwise, as are reader processes
that do not fit.

Readers leave DEAL_HEADROOM_BYTES of the pool to the buckets: a shard's batches wait in the merge
until every shard has been read past them, so read-ahead that took the whole pool would leave the
merge no room to deal an event larger than a bucket's floor, and nothing would ever free it.

Pure accounting, no I/O: waiters register a callback (`wake_when_freed`) and wait their own way.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from mongoformats.errors import MongoError

# cgroup v2, then v1: the limit a container runtime set, when it is below the machine's memory.
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")

# A shard's reader takes a getMore's reply of the oplog (the server caps one at 16 MiB of entries;
# the reader asks for 16,384 entries) and makes a batch of events of it (up to ~1.2x the entries'
# bytes) before its budget is asked: what it holds in hand while it waits.
SHARD_BATCH_BYTES = 32 << 20
# Meanwhile it has received the next reply of its exhaust cursor (oplog_tail._ReadAhead).
READ_AHEAD_BYTES = 16 << 20
SHARD_IN_HAND_BYTES = SHARD_BATCH_BYTES + READ_AHEAD_BYTES
SHARD_FLOOR_BYTES = SHARD_BATCH_BYTES + SHARD_IN_HAND_BYTES
# A bucket always takes one event; 1 MiB is many events of the usual size. A larger one takes the
# rest from the pool, which readers leave DEAL_HEADROOM_BYTES of.
BUCKET_FLOOR_BYTES = 1 << 20
# One event of the largest size (a 16 MiB document and the event's own fields), twice.
DEAL_HEADROOM_BYTES = 32 << 20
# A reader process (buckets/reader_process.py) as measured on Linux, CPython 3.11: 300 MiB
# resident once it has started (130 MiB of it its own heap: interpreter, numpy, the splice's
# compiled loops; the rest mapped libraries), before the replies and batches it reads. Counted
# whole: a limit that leaves room for the proxy must leave room for these too.
READER_PROCESS_BYTES = 300 << 20


def available_memory_bytes() -> int:
    """The machine's memory, or the proxy's cgroup limit if lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in _CGROUP_LIMITS:
        try:
            with open(path) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def default_memory_limit() -> int:
    """Half of the memory available: budgets count event bytes, and the Python objects holding
    them, the proxy's connections and the replies in flight come on top."""
    return available_memory_bytes() // 2


def stream_floor(shards: int, buckets: int) -> int:
    """What a stream with `shards` shards and `buckets` kept buckets is admitted by (and, if it
    shapes its events in worker processes, those: `shaping_processes`)."""
    return shards * SHARD_FLOOR_BYTES + buckets * BUCKET_FLOOR_BYTES


def shaping_processes(stages: bool, reader_processes: int) -> int:
    """The worker processes a stream applies its stages in (buckets/shaping.py): as many as its
    reader processes, when it has stages. Each stream has its own, so each is counted with it."""
    return reader_processes if stages else 0


def mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


class PoolAccount:
    """One budget's share of the pool: `floor` set aside, `held` what the budget holds now, and
    `in_hand` what its producer may hold beside it (a shard reader's batch that waits for room)."""

    __slots__ = ("floor", "held", "in_hand", "pool", "reader", "shed")

    def __init__(self, pool: MemoryPool, floor: int, *, reader: bool, in_hand: int = 0) -> None:
        self.pool = pool
        self.floor = floor
        self.held = 0
        self.in_hand = in_hand
        self.reader = reader  # a shard's reader: leaves the dealing headroom to the buckets
        # Lets go of what its budget holds only as a cache (a bucket's delivered events), when
        # some take would otherwise wait for the pool.
        self.shed: Callable[[], None] | None = None

    @property
    def counted(self) -> int:
        return max(self.floor, self.held + self.in_hand)

    def _above(self, held: int) -> int:
        return max(0, held + self.in_hand - self.floor)

    def room(self) -> int:
        """Bytes this account may take now."""
        pool = self.pool
        if self not in pool.accounts:
            return 1 << 62  # closed: its stream is going away, nothing more is counted
        free = pool.limit - (DEAL_HEADROOM_BYTES if self.reader else 0) - pool.counted
        return max(0, self.floor - self.in_hand - self.held) + max(0, free)

    def try_take(self, n: int) -> bool:
        """Count `n` more bytes if the pool has room for them; False (nothing counted) if not."""
        if n <= 0 or self not in self.pool.accounts:
            return True
        if n > self.room():
            self.pool.shed()
            if n > self.room():
                self.pool.refusals += 1
                return False
        self.take(n)
        return True

    def take(self, n: int) -> None:
        """Count `n` more bytes without asking (bytes the budget took before it was limited)."""
        pool = self.pool
        if self in pool.accounts:
            pool.above += self._above(self.held + n) - self._above(self.held)
            pool.held += n
        self.held += n

    def give(self, n: int) -> None:
        pool = self.pool
        if self in pool.accounts:
            freed = self._above(self.held) - self._above(self.held - n)
            pool.above -= freed
            pool.held -= n
            if freed:
                pool.freed()
        self.held -= n

    def close(self) -> None:
        """Stop counting this account (its stream closed): its floor and what it holds return
        at once."""
        pool = self.pool
        if pool.accounts.pop(self, False):
            pool.floors -= self.floor
            pool.above -= self._above(self.held)
            pool.held -= self.held
            pool.freed()


class MemoryPool:
    """The engine's memory limit and what counts against it (see the module docstring)."""

    def __init__(self, limit: int, *, process_bytes: int = READER_PROCESS_BYTES) -> None:
        self.limit = limit
        self.process_bytes = process_bytes
        self.accounts: dict[PoolAccount, bool] = {}  # open accounts (insertion-ordered set)
        self.floors = 0  # the open accounts' floors
        self.above = 0  # what they hold above their floors
        self.held = 0  # what they hold
        self.processes = 0  # reader processes running (or starting)
        self.refusals = 0  # takes that had to wait for room
        self._waiters: dict[Callable[[], None], None] = {}

    @property
    def counted(self) -> int:
        """What counts against the limit: floors, bytes above them, reader processes."""
        return self.floors + self.above + self.processes * self.process_bytes

    def account(self, floor: int, *, reader: bool, in_hand: int = 0) -> PoolAccount:
        """A new budget's account. Its floor is set aside unconditionally: admission checked it
        (`check_admits`), or a shard joined an open stream, which cannot be refused."""
        acct = PoolAccount(self, floor, reader=reader, in_hand=in_hand)
        self.accounts[acct] = True
        self.floors += floor
        self.above += acct._above(0)
        return acct

    def add_processes(self, n: int) -> None:
        self.processes += n
        if n < 0:
            self.freed()

    @property
    def waiting(self) -> bool:
        """Whether some take waits for the pool to free bytes."""
        return bool(self._waiters)

    def shed(self) -> None:
        """Every account's cache let go of (see PoolAccount.shed), to make room for a take."""
        for acct in list(self.accounts):
            if acct.shed is not None:
                acct.shed()

    def wake_when_freed(self, wake: Callable[[], None]) -> None:
        """Call `wake` (once) the next time the pool frees bytes."""
        self._waiters[wake] = None

    def freed(self) -> None:
        waiters, self._waiters = self._waiters, {}
        for wake in waiters:
            wake()

    def status(self) -> dict[str, int]:
        return {
            "limitBytes": self.limit,
            "reservedBytes": self.counted,
            "heldBytes": self.held,
            "floorBytes": self.floors,
            "readerProcessBytes": self.processes * self.process_bytes,
        }

    def check_admits(
        self,
        floor: int,
        processes: int,
        *,
        streams: int,
        shards: int,
        buckets: int,
        reader_processes: int,
    ) -> None:
        """ExceededMemoryLimit unless a stream with `floor` (and `processes` reader processes to
        start) fits beside what is counted, with the dealing headroom left; the message says what
        to change."""
        need = floor + processes * self.process_bytes
        if self.counted + need + DEAL_HEADROOM_BYTES <= self.limit:
            return
        room = max(0, self.limit - DEAL_HEADROOM_BYTES - self.counted)
        if processes and floor <= room:
            fit = (room - floor) // self.process_bytes
            raise MongoError(
                "ExceededMemoryLimit",
                f"readerProcesses: {reader_processes} needs {processes} more reader processes of "
                f"{mib(self.process_bytes)} each, but only {fit} fit in the {mib(room)} left of "
                f"the proxy's {mib(self.limit)} memory limit ({self.processes} running); pass "
                f"readerProcesses: {self.processes + fit} or fewer (0 reads in the proxy "
                "process), or start the proxy with a higher --memory-limit-bytes",
            )
        processes_part = (
            f" + {processes} reader processes x {mib(self.process_bytes)}" if processes else ""
        )
        raise MongoError(
            "ExceededMemoryLimit",
            f"a parallel change stream needs {mib(need)} to start ({shards} shards x "
            f"{mib(SHARD_FLOOR_BYTES)} + {buckets} buckets x {mib(BUCKET_FLOOR_BYTES)}"
            f"{processes_part}), but {mib(self.counted)} of the proxy's {mib(self.limit)} memory "
            f"limit is held by {streams} open streams and {self.processes} reader processes; "
            "read or close streams you no longer need (killCursors: a stream left without cursors "
            "makes room at once), open fewer buckets, or start the proxy with a higher "
            "--memory-limit-bytes",
        )
