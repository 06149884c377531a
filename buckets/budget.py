"""ByteBudget: a byte-counting bound that makes producers wait (the backpressure of every buffer)."""

from __future__ import annotations

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

    async def acquire(self, n: int) -> None:
        while self.used and self.used + n > self.limit:
            await self._freed.wait()
        self.used += n
        self.high_water = max(self.high_water, self.used)

    def release(self, n: int) -> None:
        self.used -= n
        self._freed.set()
        self._freed = trio.Event()
