"""ByteBudget: a byte-counting bound that makes producers wait (the backpressure of every buffer)."""

from __future__ import annotations

from collections.abc import Callable

import trio


class ByteBudget:
    """`await acquire(n)` waits until `n` more bytes fit under `limit`.

    One item larger than the whole limit is still let through when the budget is empty, so a
    single huge event (up to 16 MiB) can never deadlock a small budget.
    """

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError("a byte budget must be positive")
        self.limit = limit
        self.used = 0
        self.high_water = 0
        self._freed = trio.Event()
        # Told of every release: a reader process's own budget for this shard gets the bytes back.
        self.on_release: Callable[[int], None] | None = None

    def try_acquire(self, n: int) -> bool:
        """Take `n` bytes if they fit now (same rule as `acquire`); False instead of waiting."""
        if self.used and self.used + n > self.limit:
            return False
        self.charge(n)
        return True

    def charge(self, n: int) -> None:
        """Count `n` bytes that were admitted elsewhere: a reader process acquired them from its
        own budget for this shard, which gets them back only as this one releases them."""
        self.used += n
        if self.used > self.high_water:
            self.high_water = self.used

    async def acquire(self, n: int) -> None:
        while not self.try_acquire(n):
            await self._freed.wait()

    def release(self, n: int) -> None:
        self.used -= n
        self._freed.set()
        self._freed = trio.Event()
        if self.on_release is not None:
            self.on_release(n)


class BudgetHold:
    """`n` bytes of a budget, given back when this object is freed: the charge of a shard block
    whose events buckets may point into after the merge dealt them (EventBlock.hold), so the
    shard's budget bounds that memory until the last share pointing into the block is gone.

    Freed by reference counting, as soon as the last block holding it is: blocks sit in no
    reference cycles (a stream's retention is dropped explicitly when it closes, see
    ParallelStream._release), so this does not wait for the collector."""

    __slots__ = ("budget", "n")

    def __init__(self, budget: ByteBudget, n: int) -> None:
        self.budget = budget
        self.n = n

    def __del__(self) -> None:
        self.budget.release(self.n)
