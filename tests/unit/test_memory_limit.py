"""The proxy-wide memory limit's accounting (buckets/memory_limit.py): streams admitted by a floor
plus what they hold, budgets that take their bytes from one pool, reader processes counted at
their size and sending only what was granted. tests/integration/test_memory_limit.py has the
engine under the limit, through a proxy.

Refusals are ExceededMemoryLimit (146), the code a server gives an operation over its memory
limit (src/mongo/base/error_codes.yml in mongodb/mongo)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from trio.testing import MockClock

from buckets.budget import ByteBudget
from buckets.memory_limit import (
    BUCKET_FLOOR_BYTES,
    DEAL_HEADROOM_BYTES,
    READER_PROCESS_BYTES,
    SHARD_BATCH_BYTES,
    SHARD_FLOOR_BYTES,
    SHARD_IN_HAND_BYTES,
    MemoryPool,
    stream_floor,
)
from mongoformats.errors import MongoError

MIB = 1 << 20


def test_an_account_counts_its_floor_or_what_it_holds_if_more():
    pool = MemoryPool(100 * MIB)
    acct = pool.account(10 * MIB, reader=False)
    assert (pool.counted, pool.held) == (10 * MIB, 0)
    assert acct.try_take(4 * MIB)
    assert (pool.counted, pool.held) == (10 * MIB, 4 * MIB)  # within its floor
    assert acct.try_take(20 * MIB)
    assert (pool.counted, pool.held) == (24 * MIB, 24 * MIB)
    acct.give(24 * MIB)
    assert pool.counted == 10 * MIB
    acct.close()
    assert (pool.counted, pool.floors, pool.held) == (0, 0, 0)
    assert acct.try_take(1 << 40)  # closed: its stream is going, nothing is counted any more
    assert pool.counted == 0


def test_a_reader_counts_the_batch_it_holds_in_hand_beside_its_budget():
    """A shard's reader reads a batch before its budget takes it, and holds it while it waits,
    with the next reply read ahead: its account counts those beside what the budget holds,
    within a floor of those and one batch."""
    pool = MemoryPool(1 << 40)
    shard = pool.account(SHARD_FLOOR_BYTES, reader=True, in_hand=SHARD_IN_HAND_BYTES)
    assert SHARD_FLOOR_BYTES == SHARD_BATCH_BYTES + SHARD_IN_HAND_BYTES
    assert pool.counted == SHARD_FLOOR_BYTES
    assert shard.try_take(SHARD_BATCH_BYTES)
    assert pool.counted == SHARD_FLOOR_BYTES  # one held, one in hand: the floor
    assert shard.try_take(MIB)
    assert pool.counted == SHARD_FLOOR_BYTES + MIB


def test_readers_leave_the_dealing_headroom_to_the_buckets():
    """A shard's read-ahead never takes the last DEAL_HEADROOM_BYTES: the merge needs them to
    deal an event larger than a bucket's floor, and only dealing frees what the shards hold."""
    pool = MemoryPool(SHARD_FLOOR_BYTES + BUCKET_FLOOR_BYTES + DEAL_HEADROOM_BYTES + 8 * MIB)
    shard = pool.account(SHARD_FLOOR_BYTES, reader=True, in_hand=SHARD_IN_HAND_BYTES)
    bucket = pool.account(BUCKET_FLOOR_BYTES, reader=False)
    assert shard.try_take(SHARD_BATCH_BYTES + 8 * MIB)
    assert not shard.try_take(1)
    assert bucket.try_take(BUCKET_FLOOR_BYTES + DEAL_HEADROOM_BYTES)
    assert not bucket.try_take(1)
    assert pool.counted == pool.limit
    assert pool.refusals == 2


def test_a_tiny_budget_admits_one_batch_and_the_pool_counts_it():
    """A 1-byte budget still takes a whole batch when it is empty (nothing can deadlock on a small
    budget); the pool counts those bytes, and a batch the pool has no room for waits."""
    pool = MemoryPool(2 * SHARD_FLOOR_BYTES + DEAL_HEADROOM_BYTES)
    budgets = [
        ByteBudget(1, pool.account(SHARD_FLOOR_BYTES, reader=True, in_hand=SHARD_IN_HAND_BYTES))
        for _ in range(2)
    ]
    batch = SHARD_BATCH_BYTES
    assert budgets[0].try_acquire(batch)  # within its floor
    assert not budgets[0].try_acquire(1)  # its own limit: one batch at a time
    assert not budgets[1].try_acquire(batch + 1)  # over its floor; the pool is full
    assert budgets[1].blocked_by_pool(batch + 1)
    assert pool.held == batch and pool.counted <= pool.limit
    budgets[0].release(batch)
    assert not budgets[0].try_acquire(batch + 1)  # nothing left above the floors
    assert budgets[1].try_acquire(batch)


def test_a_take_that_would_wait_first_sheds_what_other_accounts_only_cache():
    pool = MemoryPool(3 * MIB + DEAL_HEADROOM_BYTES)
    cache = pool.account(MIB, reader=False)
    assert cache.try_take(MIB + DEAL_HEADROOM_BYTES)

    def shed():
        cache.give(DEAL_HEADROOM_BYTES)

    cache.shed = shed
    other = pool.account(MIB, reader=False)
    assert other.try_take(3 * MIB)
    assert cache.held == MIB and pool.refusals == 0


def test_admission_counts_the_floor_and_the_reader_processes_to_start():
    pool = MemoryPool(stream_floor(3, 2) + DEAL_HEADROOM_BYTES + READER_PROCESS_BYTES)
    pool.check_admits(stream_floor(3, 2), 1, streams=0, shards=3, buckets=2, reader_processes=1)
    with pytest.raises(MongoError) as info:
        pool.check_admits(stream_floor(3, 2), 4, streams=0, shards=3, buckets=2, reader_processes=4)
    assert info.value.code == 146
    assert (
        "readerProcesses: 4 needs 4 more reader processes of 300 MiB each, but only 1 fit"
        in info.value.errmsg
    )
    assert "pass readerProcesses: 1 or fewer" in info.value.errmsg
    for _ in range(6):
        pool.account(SHARD_FLOOR_BYTES, reader=True)
    with pytest.raises(MongoError) as info:
        pool.check_admits(stream_floor(3, 2), 0, streams=1, shards=3, buckets=2, reader_processes=0)
    assert info.value.code == 146
    assert "needs 242 MiB to start (3 shards x 80 MiB + 2 buckets x 1 MiB)" in info.value.errmsg


async def test_a_budget_waiting_for_the_pool_resumes_when_another_gives_bytes_back(
    autojump_clock: MockClock,
) -> None:
    pool = MemoryPool(2 * MIB + DEAL_HEADROOM_BYTES + MIB)
    full = ByteBudget(1 << 30, pool.account(MIB, reader=True))
    waiting = ByteBudget(1 << 30, pool.account(MIB, reader=True))
    await full.acquire(2 * MIB)
    got = trio.Event()

    async def take() -> None:
        await waiting.acquire(2 * MIB)
        got.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(take)
        await trio.testing.wait_all_tasks_blocked()
        assert not got.is_set() and pool.waiting
        full.release(MIB)
        await got.wait()
    assert pool.counted == pool.limit - DEAL_HEADROOM_BYTES


class _Channel:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send(self, message: Any) -> None:
        self.sent.append(message)


async def test_a_reader_process_sends_only_what_was_granted_and_gives_back_what_is_too_little(
    autojump_clock: MockClock,
) -> None:
    """The reader process's side of the flow control (buckets/reader_worker.py): a tail asks for
    its batch's size and waits for the grant; once it has sent, it asks ahead for a batch as large;
    short of credit for a larger one, it gives back what it has, so a budget too small for both
    still admits the batch."""
    from buckets.reader_worker import _Credit

    channel = _Channel()
    credit = _Credit(7, channel)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        sent = trio.Event()

        async def send(n: int) -> None:
            await credit.spend(n)
            sent.set()

        nursery.start_soon(send, 100)
        await trio.testing.wait_all_tasks_blocked()
        assert channel.sent == [("want", 7, 100, 0)] and not sent.is_set()
        credit.grant(100)
        await sent.wait()
        assert channel.sent[-1] == ("want", 7, 100, 0)  # ahead, for the next batch
        assert len(channel.sent) == 2
        credit.grant(100)
        sent = trio.Event()
        nursery.start_soon(send, 150)
        await trio.testing.wait_all_tasks_blocked()
        assert channel.sent[-1] == ("want", 7, 150, 100) and credit.available == 0
        credit.grant(150)
        await sent.wait()
        assert channel.sent[-1] == ("want", 7, 150, 0)


async def test_a_waiting_acquire_takes_the_bytes_a_release_frees(autojump_clock: MockClock) -> None:
    """Releases with nobody waiting make nothing to wake; an acquire that waits is woken by the
    next release that makes its bytes fit, and not before."""
    budget = ByteBudget(100)
    budget.try_acquire(60)
    budget.release(10)  # nobody waits
    budget.try_acquire(10)
    got: list[float] = []

    async def take() -> None:
        await budget.acquire(50)
        got.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(take)
        await trio.sleep(1)
        budget.release(5)  # 55 used: 50 more still do not fit
        await trio.sleep(1)
        assert got == []
        budget.release(10)
    assert got == [2.0] and budget.used == 95
