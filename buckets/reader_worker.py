"""The reader process's side: tails run, their reports sent back to the proxy (see
buckets/reader_process.py)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio
from bson import Timestamp

from buckets._columnar.allocator import keep_large_allocations
from buckets._columnar.batch_splice import warm_up
from buckets.reader_channel import (
    MessageStream,
)
from mongoformats.errors import MongoError

if TYPE_CHECKING:
    from buckets.oplog_tail import OplogTail

log = logging.getLogger("buckets.reader_process")


def serve_readers(path: str) -> None:
    """Entry point of a reader process (run by trio_parallel): connect back, run tails until
    closed."""
    keep_large_allocations()
    # The splice's compiled loops, loaded (compiled on a cold cache) before connecting back:
    # loaded on the first batches instead, they hold a new stream's first events back (the p99
    # of bench_latency's first readerProcesses workload).
    warm_up()
    trio.run(_serve, path)


class _Credit:
    """What a tail may send: bytes the proxy granted and the tail has not spent (see Flow
    control)."""

    def __init__(self, key: int, channel: MessageStream) -> None:
        self.key = key
        self.channel = channel
        self.available = 0
        self.asked = 0  # the bytes of the one request the proxy has not answered yet
        self._granted = trio.Event()

    async def spend(self, n: int) -> None:
        """Wait until `n` bytes are granted and spend them; then ask ahead for a batch as large."""
        while self.available < n:
            if not self.asked:
                await self._ask(n)
            await self._granted.wait()
        self.available -= n
        if not self.asked and self.available < n:
            await self._ask(n)

    async def _ask(self, n: int) -> None:
        # What is left goes back with the request: the budget may be too small to hold it and
        # `n` beside it, and it then waits on bytes this tail would never send.
        returned, self.available, self.asked = self.available, 0, n
        await self.channel.send(("want", self.key, n, returned))

    def grant(self, n: int) -> None:
        self.available += n
        self.asked = 0
        self._granted.set()
        self._granted = trio.Event()


class _Report:
    """A tail's TailOutput in a reader process: every report becomes a message to the proxy."""

    def __init__(self, key: int, channel: MessageStream, credit: _Credit) -> None:
        self.key = key
        self.channel = channel
        self.credit = credit

    async def deliver(
        self, events: list[Any], nbytes: int, entries: int, last_ts: Timestamp
    ) -> None:
        await self.credit.spend(nbytes)
        await self.channel.send(
            ("batch", self.key, events, nbytes, entries, (last_ts.time, last_ts.inc))
        )

    async def checked(self) -> None:
        await self.channel.send(("checked", self.key))

    async def parked(self, waiting: bool) -> None:
        await self.channel.send(("parked", self.key, waiting))

    async def idle(self) -> None:
        await self.channel.send(("idle", self.key))

    async def connected(self, host: str, reconnects: int) -> None:
        await self.channel.send(("connected", self.key, host, reconnects))

    async def lost(self, error: str, reconnects: int) -> None:
        await self.channel.send(("lost", self.key, error, reconnects))


async def _serve(path: str) -> None:
    channel = MessageStream(await trio.open_unix_socket(path))
    credits: dict[int, _Credit] = {}
    tails: dict[int, trio.CancelScope] = {}

    async def run_tail(key: int, tail: OplogTail) -> None:
        try:
            with tails[key]:
                await _run_tail(tail, _Report(key, channel, credits[key]))
        finally:
            tails.pop(key, None)
            credits.pop(key, None)

    async with trio.open_nursery() as nursery:
        while (message := await channel.receive()) is not None:
            if message[0] == "add":
                _, key, tail = message
                credits[key], tails[key] = _Credit(key, channel), trio.CancelScope()
                nursery.start_soon(run_tail, key, tail)
            elif message[0] == "remove":  # its stream closed
                if (scope := tails.get(message[1])) is not None:
                    scope.cancel()
            elif message[0] == "grant":
                for key, n in message[1].items():
                    if key in credits:
                        credits[key].grant(n)
            elif (
                message[0] == "ping"
            ):  # answered beside the tails' sends, never behind a blocked one
                nursery.start_soon(channel.send, ("pong", None))
        nursery.cancel_scope.cancel()  # the proxy closed the pool: stop every tail


async def _run_tail(tail: OplogTail, report: _Report) -> None:
    try:
        await tail.run(report)
    except MongoError as exc:
        await report.channel.send(("failed", report.key, exc.code, exc.errmsg))
    except (
        Exception
    ) as exc:  # a bug, or an entry the transform cannot handle: this stream fails alone
        log.exception("shard %s: reader failed", tail.shard_id)
        await report.channel.send(("failed", report.key, 1, f"{type(exc).__name__}: {exc}"))
