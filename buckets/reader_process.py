"""Reader processes (readerProcesses): shards' oplogs read and transformed outside the proxy
process.

One Python process is one core. With `readerProcesses: k`, a stream deals its shards over k
reader processes; each process runs the shards' OplogTails (connections, getMores, splicing,
transactions) in its own trio loop and sends their events back. The proxy process is left with
merging, dealing and serving consumers, and never touches an oplog reply.

The processes are a pool of the engine's (ReaderPool), started when a stream first asks for
them and kept: streams share them, so opening a stream, or an accelerated watch() on a proxy
with reader processes, does not wait for interpreters to start. A process that
dies fails the streams reading through it (they resume from their tokens); the next stream
that asks gets a new one in its place. One that reads nothing for the engine's stream teardown
time is stopped.

Transport: the proxy process listens on a Unix socket in a private directory; each reader
process (buckets/reader_worker.py), started by trio_parallel (which kills it when the pool closes
or retires it), connects to it. Both directions carry length-prefixed messages
(buckets/reader_channel.py); `key` names one tail (one shard of one stream):

    proxy -> reader:  ("add", key, OplogTail)    ("remove", key)
                      ("grant", {key: bytes the tail may send})
    reader -> proxy:  ("batch", key, events, nbytes, entries, (secs, inc))
                      ("want", key, bytes, bytes of its grant given back)
                      ("checked" | "idle" | "parked" | "connected" | "lost" | "failed", key, ...)
    both ways:        ("ping", None) every HEARTBEAT_S from the proxy, ("pong", None) back

Hangs: a reader process that answers nothing for `hang_s` (SIGSTOPped, its loop stuck) is
killed, which fails its streams as a death does. The pings make the silence mean something: a
process whose tails all wait for budget sends nothing else, and still answers them.

Flow control: a tail sends only bytes the proxy granted it (`_Credit`). It asks for a batch's
size (and, once it has sent one, for the next, so that the grant is there when the batch is),
and the proxy grants it once the shard's budget, and the proxy-wide memory pool, have taken
those bytes (ShardReader.reserve): what a reader process may send is counted before it is sent.
A tail short of credit gives back what it has left when it asks, so that a budget smaller than
two batches still admits the next one. The proxy side then never waits to take a batch, for
budget or for a stream's merge (ShardReader.arrived), so the tails of one process, of any
stream, never hold each other up on the shared socket; a full buffer stops only its own shard's
getMores, in the reader process. Sends are never cut short by a cancellation (MessageStream.send):
half a message would put the rest of the socket out of step for every tail.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import tempfile
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import trio
import trio_parallel
from bson import Timestamp

from buckets.reader_channel import (
    MessageStream,
)
from buckets.reader_worker import serve_readers
from mongoformats.errors import MongoError

if TYPE_CHECKING:
    from buckets.memory_limit import MemoryPool
    from buckets.reader import ShardReader

log = logging.getLogger("buckets.reader_process")

START_TIMEOUT_S = 60.0  # a reader process must connect back this soon (interpreter start, imports)
HEARTBEAT_S = 1.0  # how often the proxy pings each reader process


class ReaderHost:
    """The proxy-side end of one reader process: starts it, hands it tails of any stream, relays
    what they report."""

    def __init__(self, index: int, hang_s: float | None = None) -> None:
        self.index = index
        self.hang_s = hang_s  # killed when it answers nothing this long (None: never)
        self._heard = trio.current_time()  # when it last sent anything
        self.started = False  # connected back and relaying
        self.alive = True
        self.idle_since: float | None = (
            trio.current_time()
        )  # since when it reads nothing (None: it reads)
        self.scope = trio.CancelScope()  # cancelled to retire it
        self._channel: MessageStream | None = None
        self._keys = itertools.count()
        self._readers: dict[int, ShardReader] = {}
        self._failures: dict[int, trio.Event] = {}
        self._errors: dict[int, Exception] = {}
        self._credit: dict[int, int] = {}  # granted, not yet sent to the process
        self._credit_due = trio.Event()
        self._wants: dict[int, int] = {}  # bytes each tail asked for, not yet granted
        self._wanted: dict[int, trio.Event] = {}
        self._death = "closed its connection"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the process, wait for it to connect, then relay until cancelled (which kills it)
        or until it dies (which fails the tails it ran)."""
        try:
            with tempfile.TemporaryDirectory(
                prefix="pcs-readers-"
            ) as private:  # 0700: only this user connects
                path = os.path.join(private, f"r{self.index}.sock")
                listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
                with listener:
                    await listener.bind(path)
                    listener.listen(1)
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._process, path)
                        with trio.fail_after(START_TIMEOUT_S):
                            sock, _ = await listener.accept()
                        self._channel = MessageStream(trio.SocketStream(sock))
                        nursery.start_soon(self._send_credit)
                        if self.hang_s is not None:
                            nursery.start_soon(self._ping, self._channel)
                            nursery.start_soon(self._watch)
                        self.started = True
                        task_status.started()
                        try:
                            await self._relay(self._channel)
                        finally:
                            await self._channel.stream.aclose()
                        nursery.cancel_scope.cancel()
        finally:
            self.alive = False
            for key in list(self._readers):
                self._fail(
                    key, MongoError("InternalError", f"reader process {self.index} {self._death}")
                )

    async def _process(self, path: str) -> None:
        limiter = trio.CapacityLimiter(
            1
        )  # not the default limiter: that one admits only os.cpu_count() jobs
        try:
            await trio_parallel.run_sync(serve_readers, path, kill_on_cancel=True, limiter=limiter)
        except trio_parallel.BrokenWorkerError as exc:  # killed, out of memory, ...
            self._death = f"died: {exc.args[-1] if exc.args else exc}"
        else:
            self._death = "exited"
        raise MongoError("InternalError", f"reader process {self.index} {self._death}")

    async def read(self, reader: ShardReader) -> None:
        """Run `reader`'s tail in this process; returns never, raises what the tail raised. When
        cancelled (its stream closes), the tail is stopped in the process, which goes on."""
        assert self._channel is not None, "ReaderHost.run must be started first"
        key = next(self._keys)
        self._readers[key] = reader
        self.idle_since = None
        failed = self._failures[key] = trio.Event()
        try:
            if not self.alive:
                raise MongoError("InternalError", f"reader process {self.index} {self._death}")
            await self._channel.send(("add", key, reader.tail))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._grant, key, reader)
                await failed.wait()
                nursery.cancel_scope.cancel()
            raise self._errors[key]
        finally:
            gone = self._readers.pop(key, None) is not None
            self._note_idle()
            self._failures.pop(key, None)
            self._errors.pop(key, None)
            self._credit.pop(key, None)
            self._wants.pop(key, None)
            self._wanted.pop(key, None)
            if gone and self.alive:  # still running there: stop it
                with (
                    trio.CancelScope(shield=True),
                    trio.move_on_after(5),
                    contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
                ):
                    await self._channel.send(("remove", key))

    def status(self) -> dict[str, Any]:
        return {"index": self.index, "alive": self.alive, "tails": len(self._readers)}

    def retire(self) -> None:
        """Stop the process (it reads nothing): no stream can be handed it any more."""
        self.alive = False
        self.scope.cancel()

    async def _ping(self, channel: MessageStream) -> None:
        while True:  # a send to a process that stopped reading blocks; _watch goes on meanwhile
            await channel.send(("ping", None))
            await trio.sleep(HEARTBEAT_S)

    async def _watch(self) -> None:
        assert self.hang_s is not None
        silent, heard, last = 0.0, self._heard, trio.current_time()
        while True:
            await trio.sleep(HEARTBEAT_S)
            now = trio.current_time()
            # A stretch in which the proxy's own loop was held up (a long GC, a starved core)
            # counts as two beats at most: the process's answers wait unread in the socket
            # meanwhile, and this task may wake before the one that reads them.
            silent = 0.0 if self._heard != heard else silent + min(now - last, 2 * HEARTBEAT_S)
            heard, last = self._heard, now
            if silent > self.hang_s:
                self._death = f"answered nothing for {silent:.0f} s (hung) and was killed"
                raise MongoError("InternalError", f"reader process {self.index} {self._death}")

    async def _grant(self, key: int, reader: ShardReader) -> None:
        """Grant tail `key` what it asks for once the shard's budget and the memory pool have
        taken it (waiting, like an in-process reader, while they are full)."""
        while True:
            while not (n := self._wants.get(key, 0)):
                wanted = self._wanted[key] = trio.Event()
                await wanted.wait()
            await reader.reserve(n)
            reader.granted += n
            self._wants[key] = 0
            if key in self._readers:
                self._credit[key] = self._credit.get(key, 0) + n
                self._credit_due.set()

    async def _send_credit(self) -> None:
        """Grants go to the tails coalesced: one message per wake-up."""
        assert self._channel is not None
        while True:
            await self._credit_due.wait()
            self._credit_due = trio.Event()
            credit, self._credit = self._credit, {}
            await self._channel.send(("grant", credit))

    async def _relay(self, channel: MessageStream) -> None:
        while (message := await channel.receive()) is not None:
            self._heard = trio.current_time()
            kind, key = message[0], message[1]
            reader = self._readers.get(key)
            if reader is None:  # a tail that was removed: what it sent last is not wanted
                continue
            if (
                kind == "batch"
            ):  # taken without waiting: this connection serves every stream's tails
                _, _, events, nbytes, entries, (secs, inc) = message
                reader.arrived(events, nbytes, entries, Timestamp(secs, inc))
                # Not held while the next message is awaited: its blocks' charges return only
                # once every reference is gone, and the process sends no more until they do.
                del message, events
            elif kind == "want":
                self._want(key, reader, message[2], message[3])
            elif kind == "failed":
                self._fail(key, MongoError(message[2], message[3]))
            else:
                await _report(reader, kind, message)

    def _want(self, key: int, reader: ShardReader, n: int, returned: int) -> None:
        """A tail asks for `n` bytes of credit, giving back `returned`."""
        if returned:  # the grant it had left, given back (too small for its batch)
            reader.granted -= returned
            reader.budget.release(returned)
        self._wants[key] = n
        if (wanted := self._wanted.get(key)) is not None:
            wanted.set()

    def _fail(self, key: int, exc: Exception) -> None:
        if self._readers.pop(key, None) is not None:
            self._errors[key] = exc
            self._failures[key].set()
        self._note_idle()

    def _note_idle(self) -> None:
        if not self._readers and self.idle_since is None:
            self.idle_since = trio.current_time()


async def _report(reader: ShardReader, kind: str, message: tuple[Any, ...]) -> None:
    """A tail's report in a reader process, made to its ShardReader in this one."""
    if kind == "parked":
        await reader.parked(message[2])
    elif kind == "idle":
        await reader.idle()
    elif kind == "checked":
        await reader.checked()
    elif kind == "connected":
        await reader.connected(message[2], message[3])
    elif kind == "lost":
        await reader.lost(message[2], message[3])


class ReaderPool:
    """The reader processes the streams of one engine share, started on first use and kept while
    they read something; one that has read nothing for `idle_s` is stopped (memory is bounded by
    what streams use, not by the most they ever asked for) and started again when asked."""

    def __init__(
        self,
        nursery: trio.Nursery,
        idle_s: float,
        hang_s: float | None = None,
        memory: MemoryPool | None = None,
    ) -> None:
        self._nursery = nursery
        self.memory = memory  # each running process is counted in it (READER_PROCESS_BYTES)
        self._slots: list[ReaderHost] = []
        self._lock = trio.Lock()  # one caller starts missing processes at a time
        self.idle_s = idle_s
        self.hang_s = hang_s

    async def retire_idle(self) -> None:
        while True:
            await trio.sleep(min(self.idle_s, 10.0))
            now = trio.current_time()
            for host in self._slots:
                if (
                    host.alive
                    and host.idle_since is not None
                    and now - host.idle_since >= self.idle_s
                ):
                    log.info(
                        "reader process %d read nothing for %.0f s: stopped",
                        host.index,
                        self.idle_s,
                    )
                    host.retire()

    def status(self) -> list[dict[str, Any]]:
        """Each process started so far: its index, whether it runs, how many tails it reads."""
        return [host.status() for host in self._slots]

    def missing(self, count: int) -> int:
        """How many processes `hosts(count)` would start."""
        return sum(i >= len(self._slots) or not self._slots[i].alive for i in range(count))

    async def hosts(self, count: int) -> list[ReaderHost]:
        """The first `count` processes, starting any that are missing or dead (side by side)."""
        async with self._lock:
            fresh = [
                ReaderHost(i, self.hang_s)
                for i in range(count)
                if i >= len(self._slots) or not self._slots[i].alive
            ]
            async with trio.open_nursery() as starting:
                for host in fresh:
                    starting.start_soon(self._nursery.start, self._keep, host)
            for host in fresh:
                if host.index < len(self._slots):
                    self._slots[host.index] = host
                else:
                    self._slots.append(host)
            handed = self._slots[:count]
            for host in handed:  # a fresh idle timer: the stream hands it tails in a moment
                if host.idle_since is not None:
                    host.idle_since = trio.current_time()
            return handed

    async def _keep(
        self, host: ReaderHost, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run `host`, counted in the memory pool while it runs; once it has started, however it
        ends (the process killed, its socket broken), that fails only its own tails (host.run
        does that), never the engine and the other processes."""
        if self.memory is not None:
            self.memory.add_processes(1)
        try:
            with host.scope:
                await host.run(task_status=task_status)
        except* Exception as group:
            if not host.started:
                raise  # the stream that asked for it fails to open
            log.warning(
                "reader process %d ended (%s); streams reading through it fail and resume from "
                "their tokens",
                host.index,
                group.exceptions[0],
            )
        finally:
            if self.memory is not None:
                self.memory.add_processes(-1)


@contextlib.asynccontextmanager
async def reader_pool(
    idle_s: float = 300.0, hang_s: float | None = None, memory: MemoryPool | None = None
) -> AsyncIterator[ReaderPool]:
    """A pool of reader processes, all killed on exit; with `hang_s`, also one that answers
    nothing for that long; with `memory`, each counted in that pool while it runs."""
    async with trio.open_nursery() as nursery:
        pool = ReaderPool(nursery, idle_s, hang_s, memory)
        nursery.start_soon(pool.retire_idle)
        yield pool
        nursery.cancel_scope.cancel()
