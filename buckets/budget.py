"""ByteBudget: a byte-counting bound that makes producers wait (the backpressure of every
buffer)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import trio

from buckets.memory_limit import PoolAccount


class ByteBudget:
    """`await acquire(n)` waits until `n` more bytes fit under `limit` and, with an `account`, in
    the proxy-wide memory pool (buckets/memory_limit.py).

    One item larger than the whole limit is still let through when the budget is empty, so a
    single huge event (up to 16 MiB) can never deadlock a small budget; the pool counts it all
    the same, and the item waits for the pool's room like any other.
    """

    def __init__(self, limit: int, account: PoolAccount | None = None) -> None:
        if limit <= 0:
            raise ValueError("a byte budget must be positive")
        self.limit = limit
        self.used = 0
        self.high_water = 0
        self.account = account
        self.pool_waits = 0  # takes the pool made wait (status)
        # Made for a waiting acquire only: most releases (each merged round's, each block's
        # hold) find nobody waiting.
        self._freed: trio.Event | None = None

    def fits(self, n: int) -> bool:
        """Whether `n` more bytes fit under the budget's own limit (the one-item rule included)."""
        return not self.used or self.used + n <= self.limit

    def room(self) -> int:
        """Bytes that fit now, under the limit and in the pool (for taking part of a block)."""
        own = self.limit - self.used
        return own if self.account is None else min(own, self.account.room())

    def try_acquire(self, n: int) -> bool:
        """Take `n` bytes if they fit now (same rule as `acquire`); False instead of waiting."""
        if not self.fits(n):
            return False
        if self.account is not None and not self.account.try_take(n):
            self.pool_waits += 1
            return False
        self._count(n)
        return True

    def blocked_by_pool(self, n: int) -> bool:
        """Whether `n` bytes would fit the budget but not the pool (then wait for the pool)."""
        return self.fits(n) and self.account is not None and n > self.account.room()

    def wake_when_pool_frees(self, wake: Callable[[], None]) -> None:
        if self.account is not None:
            self.account.pool.wake_when_freed(wake)

    def _count(self, n: int) -> None:
        self.used += n
        if self.used > self.high_water:
            self.high_water = self.used

    async def acquire(self, n: int) -> None:
        while not self.try_acquire(n):
            if self._freed is None:
                self._freed = trio.Event()
            freed = self._freed
            if self.blocked_by_pool(n):
                self.wake_when_pool_frees(self._wake)
            await freed.wait()

    def _wake(self) -> None:
        freed, self._freed = self._freed, None
        if freed is not None:
            freed.set()

    def release(self, n: int) -> None:
        self.used -= n
        if self.account is not None:
            self.account.give(n)
        self._wake()


class BudgetHold:
    """`n` bytes of a budget, given back when this object is freed: the charge of a shard block
    whose events buckets may point into after the merge dealt them (EventBlock.hold), so the
    shard's budget bounds that memory until the last share pointing into the block is gone.

    Freed by reference counting, as soon as the last block holding it is: blocks sit in no
    reference cycles (a stream's retention is dropped explicitly when it closes, see
    ParallelStream._release), so this does not wait for the collector."""

    __slots__ = ("budget", "n", "_thread", "_loop")

    def __init__(self, budget: ByteBudget, n: int) -> None:
        self.budget = budget
        self.n = n
        # The budget belongs to the event loop's thread. A collection run in another thread (a
        # splice's worker, buckets/oplog_tail.py) may free a hold there: the release then goes
        # to the loop, as trio's objects may only be touched from its thread.
        self._thread = threading.get_ident()
        try:
            self._loop: trio.lowlevel.TrioToken | None = trio.lowlevel.current_trio_token()
        except RuntimeError:  # made outside trio (tests): released wherever it is freed
            self._loop = None

    def __del__(self) -> None:
        if self._loop is None or threading.get_ident() == self._thread:
            self.budget.release(self.n)
            return
        with contextlib.suppress(trio.RunFinishedError):  # (a loop gone, its budgets too)
            self._loop.run_sync_soon(self.budget.release, self.n)
