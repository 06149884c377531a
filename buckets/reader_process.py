"""Reader processes (readerProcesses): shards' oplogs read and transformed outside the proxy process.

One Python process is one core. With `readerProcesses: k`, a stream starts k reader processes
and deals its shards over them; each process runs the shards' OplogTails (connections, getMores,
splicing, transactions) in its own trio loop and sends their events back. The proxy process is
left with merging, dealing and serving consumers, and never touches an oplog reply.

Transport: the proxy process listens on a Unix socket in a private directory; each reader
process, started by trio_parallel (which kills it when the stream closes), connects to it. Both
directions carry length-prefixed pickles:

    proxy -> reader:  ("add", OplogTail, budget bytes)    ("credit", {shard: bytes freed})
    reader -> proxy:  ("batch", shard, events, nbytes, entries, (secs, inc))
                      ("checked" | "idle" | "parked" | "connected" | "failed", shard, ...)

Flow control: each tail charges a ByteBudget of the shard's size in its own process before it
sends, and the proxy returns credit as the merge frees the bytes. The proxy side then never waits
for budget, so one process's shards never hold each other up on the shared socket; a full
buffer stops only its own shard's getMores, in the reader process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import struct
import tempfile
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import trio
import trio_parallel
from bson import Timestamp

from buckets.budget import ByteBudget
from mongoformats.errors import MongoError

if TYPE_CHECKING:
    from buckets.reader import OplogTail, ShardReader

log = logging.getLogger("buckets.reader_process")

_HEADER = struct.Struct("<I")
SOCKET_BUFFER_BYTES = 4 << 20  # asked of the kernel; it may grant less (net.core.wmem_max)
START_TIMEOUT_S = 60.0   # a reader process must connect back this soon (interpreter start, imports)


class MessageStream:
    """Length-prefixed pickles over a connected socket; sends are serialized, receives are one
    reader's. A message is received straight into a buffer of its size (`recv_into`): a batch of
    events is large, and reading it in pieces and joining them cost a copy per piece."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._send_lock = trio.StrictFIFOLock()
        for option in (trio.socket.SO_SNDBUF, trio.socket.SO_RCVBUF):  # fewer wake-ups per batch
            stream.setsockopt(trio.socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)

    async def send(self, message: Any) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        async with self._send_lock:
            await self.stream.send_all(_HEADER.pack(len(data)))
            await self.stream.send_all(data)

    async def receive(self) -> Any:
        """The next message, or None once the other side has closed."""
        header = await self._exactly(_HEADER.size)
        if header is None:
            return None
        body = await self._exactly(_HEADER.unpack(header)[0])
        return None if body is None else pickle.loads(body)

    async def _exactly(self, n: int) -> bytearray | None:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = await self.stream.socket.recv_into(view[got:], n - got)
            if not k:
                return None
            got += k
        return buf


class ReaderHost:
    """The proxy-side end of one reader process: starts it, hands it tails, relays what they report."""

    def __init__(self, index: int, stream_name: str) -> None:
        self.index = index
        self.stream_name = stream_name
        self._channel: MessageStream | None = None
        self._readers: dict[str, ShardReader] = {}
        self._failures: dict[str, trio.Event] = {}
        self._errors: dict[str, Exception] = {}
        self._credit: dict[str, int] = {}
        self._credit_due = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the process, wait for it to connect, then relay until cancelled (which kills it)."""
        with tempfile.TemporaryDirectory(prefix="pcs-readers-") as private:  # 0700: only this user connects
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
                    task_status.started()
                    try:
                        await self._relay(self._channel)
                    finally:
                        await self._channel.stream.aclose()
                    nursery.cancel_scope.cancel()

    async def _process(self, path: str) -> None:
        limiter = trio.CapacityLimiter(1)  # not the default limiter: that one admits only os.cpu_count() jobs
        try:
            await trio_parallel.run_sync(serve_readers, path, kill_on_cancel=True, limiter=limiter)
        except trio_parallel.BrokenWorkerError as exc:  # killed, out of memory, ...
            raise MongoError("InternalError", f"reader process {self.index} of stream {self.stream_name!r} "
                             f"died: {exc.args[-1] if exc.args else exc}") from None
        raise MongoError("InternalError", f"reader process {self.index} of stream {self.stream_name!r} exited")

    async def read(self, reader: ShardReader) -> None:
        """Run `reader`'s tail in this process; returns never, raises what the tail raised."""
        assert self._channel is not None, "ReaderHost.run must be started first"
        sid = reader.shard_id
        self._readers[sid] = reader
        failed = self._failures[sid] = trio.Event()
        reader.budget.on_release = lambda n: self._give_credit(sid, n)
        await self._channel.send(("add", reader.tail, reader.budget.limit))
        await failed.wait()
        raise self._errors[sid]

    def _give_credit(self, sid: str, n: int) -> None:
        self._credit[sid] = self._credit.get(sid, 0) + n
        self._credit_due.set()

    async def _send_credit(self) -> None:
        """Budget the merge freed goes back to the tails, coalesced: one message per wake-up."""
        assert self._channel is not None
        while True:
            await self._credit_due.wait()
            self._credit_due = trio.Event()
            credit, self._credit = self._credit, {}
            await self._channel.send(("credit", credit))

    async def _relay(self, channel: MessageStream) -> None:
        while (message := await channel.receive()) is not None:
            kind, sid = message[0], message[1]
            reader = self._readers.get(sid)
            if reader is None:
                continue
            if kind == "batch":
                _, _, events, nbytes, entries, (secs, inc) = message
                await reader.deliver(events, nbytes, entries, Timestamp(secs, inc))
            elif kind == "parked":
                await reader.parked(message[2])
            elif kind == "idle":
                await reader.idle()
            elif kind == "checked":
                await reader.checked()
            elif kind == "connected":
                await reader.connected(message[2], message[3])
            elif kind == "failed":
                self._fail(sid, MongoError(message[2], message[3]))
        for sid in list(self._readers):
            self._fail(sid, MongoError("InternalError", f"reader process {self.index} of stream "
                                       f"{self.stream_name!r} closed its connection"))

    def _fail(self, sid: str, exc: Exception) -> None:
        self._errors[sid] = exc
        self._failures[sid].set()
        self._readers.pop(sid, None)


@contextlib.asynccontextmanager
async def reader_hosts(count: int, stream_name: str) -> AsyncIterator[list[ReaderHost]]:
    """`count` running reader processes for one stream, stopped (killed) on exit."""
    async with trio.open_nursery() as nursery:
        hosts = [ReaderHost(i, stream_name) for i in range(count)]
        async with trio.open_nursery() as starting:  # processes start side by side (~0.5 s each)
            for host in hosts:
                starting.start_soon(nursery.start, host.run)
        yield hosts
        nursery.cancel_scope.cancel()


# -- the reader process's side -----------------------------------------------------------------------


def serve_readers(path: str) -> None:
    """Entry point of a reader process (run by trio_parallel): connect back, run tails until closed."""
    trio.run(_serve, path)


class _Report:
    """A tail's TailOutput in a reader process: every report becomes a message to the proxy."""

    def __init__(self, sid: str, channel: MessageStream, budget: ByteBudget) -> None:
        self.sid = sid
        self.channel = channel
        self.budget = budget

    async def deliver(self, events: list[Any], nbytes: int, entries: int, last_ts: Timestamp) -> None:
        await self.budget.acquire(nbytes)
        await self.channel.send(("batch", self.sid, events, nbytes, entries, (last_ts.time, last_ts.inc)))

    async def checked(self) -> None:
        await self.channel.send(("checked", self.sid))

    async def parked(self, waiting: bool) -> None:
        await self.channel.send(("parked", self.sid, waiting))

    async def idle(self) -> None:
        await self.channel.send(("idle", self.sid))

    async def connected(self, host: str, reconnects: int) -> None:
        await self.channel.send(("connected", self.sid, host, reconnects))


async def _serve(path: str) -> None:
    channel = MessageStream(await trio.open_unix_socket(path))
    budgets: dict[str, ByteBudget] = {}
    async with trio.open_nursery() as nursery:
        while (message := await channel.receive()) is not None:
            if message[0] == "add":
                _, tail, limit = message
                budgets[tail.shard_id] = ByteBudget(limit)
                nursery.start_soon(_run_tail, tail, _Report(tail.shard_id, channel, budgets[tail.shard_id]))
            elif message[0] == "credit":
                for sid, n in message[1].items():
                    budgets[sid].release(n)
        nursery.cancel_scope.cancel()  # the proxy closed the stream: stop every tail


async def _run_tail(tail: OplogTail, report: _Report) -> None:
    try:
        await tail.run(report)
    except MongoError as exc:
        await report.channel.send(("failed", tail.shard_id, exc.code, exc.errmsg))
    except Exception as exc:  # a bug, or an entry the transform cannot handle: this stream fails alone
        log.exception("shard %s: reader failed", tail.shard_id)
        await report.channel.send(("failed", tail.shard_id, 1, f"{type(exc).__name__}: {exc}"))
