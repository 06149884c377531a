"""One shard's oplog read and transformed: an OplogTail and the TailOutput it reports to."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import outcome
import trio
from bson import Int64, Timestamp
from bson.raw_bson import RawBSONDocument

from buckets._columnar.allocator import unfilled_bytearray
from buckets._columnar.items import SplicedItems, above, listed
from buckets._columnar.oplog_batch import SLACK
from buckets._columnar.reply_splice import splice_reply
from buckets.ports import Connection, Connector
from mongoformats.change_events import OplogTransformer, prev_op_ts
from mongoformats.errors import ConnectionLost, MongoError, has_category
from mongoformats.hosts import host_address
from mongoformats.oplog_splice import cursor_batch

log = logging.getLogger("buckets.reader")


_SECONDARY_OK = {"mode": "secondaryPreferred"}
# The oplog's oldest entry, which says whether it still reaches back to a start point.
_OLDEST_ENTRY = {
    "find": "oplog.rs",
    "filter": {},
    "sort": {"$natural": 1},
    "limit": 1,
    "singleBatch": True,
    "$readPreference": _SECONDARY_OK,
}


# Oplog entries a getMore asks for, spliced at once. A catch-up reply holds up to 16 MiB of
# entries unasked; read in batches, each shard's member serves the next batch while this one is
# spliced, and other connections are served between batches. Each batch costs the proxy a fixed
# share of Python and numpy calls (the splice's templates, the reader's delivery, the merge and
# the deal), so fewer batches cost less; but a stream's first events wait for every shard's first
# batch, so the find asks for a small one (FIRST_BATCH_ENTRIES; the getMores then stream the
# large ones, as a raw read with the server's default first batch does). The sizes were chosen
# by A/B runs (benchmarks/README.md, "Figures behind constants and designs").
BATCH_ENTRIES = 16384


FIRST_BATCH_ENTRIES = 128

# After a full first batch (a backlog), the getMores that follow ask for batches of these sizes,
# one at a time, before the exhaust getMore streams BATCH_ENTRIES: the merge waits for every
# shard's batch, and every shard's first large batch takes a member (a cluster's process serving
# several shards) long to make, which left the proxy idle until all had come. Smaller batches
# first start the flow while the large ones are made.
RAMP_ENTRIES = (1024, 4096)


# A reply at least this large is walked and spliced in a worker thread (with the engine's splice
# limiter), beside the event loop: the compiled kernels release the GIL, so the loop receives,
# merges and sends meanwhile. A thread hop costs tens of microseconds and the splice about a
# microsecond an entry, so a batch of this size (a thousand entries of a few hundred bytes: a
# backlog's batches are 16384) gains; a live tail's replies (an entry or a few) stay on the loop,
# with no hop on the latency path.
SPLICE_THREAD_BYTES = 256 << 10


class TailOutput(Protocol):
    """What an OplogTail reports, in order."""

    async def deliver(
        self, events: list[Any], nbytes: int, entries: int, last_ts: Timestamp
    ) -> None:
        """Events of entries read through `last_ts` (`nbytes` of them, as plain tuples): returns
        once they are charged to the shard's budget and handed on."""

    async def checked(self) -> None:
        """The oplog reaches back to the start point (the stream may report itself open)."""

    async def parked(self, waiting: bool) -> None:
        """An awaitData getMore starts (True: the shard's oplog was read to its end) or returns."""

    async def idle(self) -> None:
        """An awaitData getMore returned nothing: the shard's mark may need a note to move."""

    async def connected(self, host: str, reconnects: int) -> None:
        """Reading from member `host`, after `reconnects` lost connections so far."""

    async def lost(self, error: str, reconnects: int) -> None:
        """The member read from was lost, or none could be reached (`error` says why): the tail
        tries again, and stays lost to status until it reads again (a whole shard down)."""


class OplogTail:
    """Reads one shard's oplog from `start`, forever, reconnecting to another member on failures.

    Picklable until it runs (its connector, a buckets.ports.Connector, is settings), so a
    reader process can run it.
    """

    def __init__(
        self,
        shard_id: str,
        hosts: list[tuple[str, int]],
        *,
        start: Timestamp,
        skip_key: bytes,
        transformer: OplogTransformer,
        await_ms: int = 200,
        connect_member: Connector,
        keep_applied: bool = True,
        splice_limiter: trio.CapacityLimiter | None = None,
    ) -> None:
        self.shard_id = shard_id
        self.hosts = hosts
        # Its record of failed members (the connector's) puts the member the tail lost last at
        # the end of the line: a hung one costs the connect timeout each time it is tried.
        self.connect_member = connect_member
        self.position = start  # next read starts at ts >= position (inclusive at first)
        self.inclusive = True
        self.skip_key = skip_key  # events at or below this key were delivered before
        self.transformer = transformer
        # Whether events keep their applied-at times (pre-images are read by them): a block
        # keeps none, so then a prepared transaction's events are not spliced into one.
        self.keep_applied = keep_applied
        self.await_ms = await_ms
        self.reconnects = 0
        self._conn: Connection | None = None  # the member read from now
        self._ahead: _ReadAhead | None = None  # its exhaust cursor's next batch, read ahead
        # Large replies are spliced in worker threads it admits (None: all on the loop). Not
        # picklable: a tail sent to a reader process is made without one.
        self.splice_limiter = splice_limiter

    def reply_arrived(self) -> bool:
        """Whether the member's next batch has arrived and waits to be taken (see `_tail`)."""
        conn = self._conn
        if self._ahead is not None and self._ahead.held():
            return True
        return conn is not None and conn.reply_arrived()

    def check_history(self, reply: Mapping[str, Any]) -> None:
        """Fail like the server if the oplog no longer reaches back to the start point: `reply`
        is the answer to _OLDEST_ENTRY."""
        first = reply["cursor"]["firstBatch"]
        if not first:
            return
        entry = first[0]
        ts = entry["ts"]
        starts_set = entry["op"] == "n" and entry["o"].get("msg") in (
            "initiating set",
            "new primary",
        )
        if (ts.time, ts.inc) > (self.position.time, self.position.inc) and not starts_set:
            raise MongoError(
                "ChangeStreamHistoryLost",
                f"Resume of change stream was not possible, as the resume point may no longer be "
                f"in the oplog of shard {self.shard_id} (its oldest entry is {ts})",
            )

    async def run(self, out: TailOutput) -> None:
        """Read until cancelled; reconnect and resume from the last position on network errors."""
        first_connect = True
        while True:
            try:
                conn = await self.connect_member(self.hosts, secondary=True)
            except ConnectionLost as exc:
                self.reconnects += 1
                await out.lost(str(exc), self.reconnects)
                await trio.sleep(0.2)
                continue
            self._conn = conn
            try:
                await out.connected(conn.address, self.reconnects)
                if first_connect:
                    opened = await self._open_checked(conn, out)
                    first_connect = False
                    await self._tail(conn, out, opened)
                else:
                    await self._tail(conn, out)
            except (ConnectionLost, MongoError) as exc:
                if isinstance(exc, MongoError):
                    if exc.code == 136:  # CappedPositionLost
                        raise MongoError(
                            "ChangeStreamHistoryLost",
                            f"shard {self.shard_id}: oplog truncated past "
                            f"the read position {self.position}",
                        ) from exc
                    if exc.code != 43 and not has_category(exc.code, "RetriableError"):
                        raise
                    # A lost connection has told the connector's record already; an error reply not.
                    self.connect_member.health.failed(conn.address, str(exc))
                # The member was lost (dropped, hung, stepped down, shutting down, recovering, the
                # cursor gone): read on from another one. The log gets the error's text, not the
                # error: a handler that keeps records would keep its traceback's frames.
                error = str(exc)
                log.warning("shard %s: %s; resuming from %s", self.shard_id, error, self.position)
                self.reconnects += 1
                await out.lost(error, self.reconnects)
                await trio.sleep(0.05)
            finally:
                self._conn = None
                await conn.aclose()

    def _find(self) -> dict[str, Any]:
        """The tailable find that opens the member's oplog at the tail's position."""
        return {
            "find": "oplog.rs",
            "filter": {"ts": {"$gte" if self.inclusive else "$gt": self.position}},
            "tailable": True,
            "awaitData": True,
            # A first batch of its own size (see BATCH_ENTRIES): the server's default (101
            # entries) cost a round trip to every shard before the flow began, a large one the
            # time to make it.
            "batchSize": FIRST_BATCH_ENTRIES,
            "readConcern": {"level": "majority"},
            "$readPreference": _SECONDARY_OK,
        }

    async def _open_checked(
        self, conn: Connection, out: TailOutput
    ) -> tuple[bytes | bytearray, int]:
        """The find's first reply, the history checked first (`out` told once it is).

        The check and the find go in one round trip: the member runs the check first, whole,
        then the find (Connection.command_in_place_after), so the find reads nothing the check
        did not pass, as when it was sent once the check was answered; a check that fails
        leaves the find's reply unread, and the connection closed."""

        async def vet(reply: RawBSONDocument) -> None:
            self.check_history(reply)
            await out.checked()

        return await conn.command_in_place_after(
            ("local", _OLDEST_ENTRY),
            vet,
            "local",
            self._find(),
            pad=SLACK,
            allocate=unfilled_bytearray,
        )

    async def _tail(
        self,
        conn: Connection,
        out: TailOutput,
        opened: tuple[bytes | bytearray, int] | None = None,
    ) -> None:
        """Tail the oplog from the find's first reply (`opened`, if taken already)."""
        # Handed over in a list that `_batches` empties: no frame here keeps the reply's bytes.
        first = [] if opened is None else [opened]
        del opened
        # An exhaust cursor's batches are received beside the splice (_ReadAhead), which hands
        # its errors over with the batches; `_batches`' errors leave as they are, not in an
        # exception group, for `run` tells a lost member by them.
        async with trio.open_nursery() as nursery:
            done = await outcome.acapture(self._batches, conn, out, first, nursery)
            nursery.cancel_scope.cancel()
        self._ahead = None
        done.unwrap()

    async def _batches(
        self,
        conn: Connection,
        out: TailOutput,
        first: list[tuple[bytes | bytearray, int]],
        nursery: trio.Nursery,
    ) -> None:
        """Splice and deliver batches from the first (the find's reply, opened here if `first`
        is empty) until the cursor ends."""
        # Replies stay raw bytes: entries are found where they lie in the reply and spliced into
        # events.
        if first:
            data, at = first.pop()
        else:
            data, at = await conn.command_in_place(
                "local", self._find(), pad=SLACK, allocate=unfilled_bytearray
            )
        asked = FIRST_BATCH_ENTRIES  # what the reply in hand was asked for
        ramp = iter(RAMP_ENTRIES)
        while True:
            if self._ahead is None and conn.streaming:
                self._ahead = _ReadAhead(conn)
                nursery.start_soon(self._ahead.run)
            cursor_id, entries = await self._take_reply(data, at, out, conn)
            # Nothing of a delivered batch stays referenced here while the next reply is awaited:
            # its blocks' charges return when the buckets let them go (reader.BudgetHold), and a
            # frame held by an error's traceback (a CursorNotFound kept by a log handler) would
            # keep them, and the reply's bytes, for as long as the error lives.
            del data
            if not cursor_id:
                return
            # A full batch before the stream of large ones: more entries wait, so the next is
            # asked for at the ramp's next size; a short one (the oplog's end) ends the ramp.
            full = entries >= asked
            asked = next(ramp, BATCH_ENTRIES) if full and asked < BATCH_ENTRIES else BATCH_ENTRIES
            await out.parked(True)
            try:
                got = await self._ahead.next() if self._ahead is not None else None
                if got is None:  # not streaming (or no longer): ask
                    self._ahead = None
                    got = await conn.command_in_place(
                        "local",
                        {
                            "getMore": Int64(cursor_id),
                            "collection": "oplog.rs",
                            "batchSize": asked,
                            "maxTimeMS": self.await_ms,
                        },
                        pad=SLACK,
                        exhaust=asked == BATCH_ENTRIES,
                        allocate=unfilled_bytearray,
                    )
                data, at = got
                del got
            finally:
                await out.parked(False)

    async def _take_reply(
        self, data: bytes | bytearray, at: int, out: TailOutput, conn: Connection
    ) -> tuple[int, int]:
        """Splice and deliver the batch of the reply in `data` at `at`; its cursor id and
        entries."""
        transformer = self.transformer
        # Up to the time of an older token resumed from, events keep its version: the general
        # path, which writes any version, makes them.
        splice = transformer.token_version == 2 and transformer.keep_version is None
        args = (data, at, splice, transformer.show_expanded_events, self.keep_applied)
        limiter = self.splice_limiter
        if limiter is not None and len(data) - at >= SPLICE_THREAD_BYTES:
            # Not abandoned on cancellation (trio's default): a cancelled tail waits for its
            # splice to end (milliseconds), so no thread is left reading the reply's buffer.
            # Each tail awaits its own splice: a shard's batches are delivered in order.
            cursor_id, spliced = await trio.to_thread.run_sync(splice_reply, *args, limiter=limiter)
        else:
            cursor_id, spliced = splice_reply(*args)
        if spliced is None:
            await out.idle()
            return cursor_id, 0
        await self._deliver(*spliced, out, conn)
        return cursor_id, spliced[1]

    async def _deliver(
        self,
        items: SplicedItems,
        entries: int,
        last_ts: Timestamp,
        out: TailOutput,
        conn: Connection,
    ) -> None:
        """Deliver what `splice_entries` made of `entries` oplog entries, less what a resumed
        stream delivered before (up to the skip key)."""
        skip = self.skip_key
        events: list[Any] = []  # plain tuples (spliced ones as they are, others' fields) and blocks
        nbytes = 0
        for item in listed(items):
            if type(item) is bytes:  # the general path: transactions, DDL, noops, rare shapes
                nbytes += await self._transform(item, conn, events)
            # A block (a backlog's events as columns) or a spliced event (a plain tuple, which
            # marshals fast, until delivered).
            elif (kept := above(item, skip)) is not None:
                events.append(kept[0])
                nbytes += kept[1]
        await out.deliver(events, nbytes, entries, last_ts)
        self.position, self.inclusive = last_ts, False

    async def _transform(self, entry: bytes, conn: Connection, events: list[Any]) -> int:
        """The events of an oplog entry the splice left whole, appended to `events` as plain
        tuples (after the skip key); their bytes. A transaction's chain that began before the
        stream is read back first."""
        transformer = self.transformer
        if (gap := transformer.missing_chain(entry)) is not None:
            transformer.adopt_chain(await self._chain_through(conn, gap))
        nbytes = 0
        for ev in transformer.transform_decoded(entry):
            if ev.sort_key > self.skip_key:
                events.append(tuple(ev))
                nbytes += len(ev.raw)
        return nbytes

    async def _chain_through(self, conn: Connection, ts: Timestamp) -> list[bytes]:
        """A transaction's entries up to the one at `ts`, oldest first: read back by prevOpTime,
        one entry a query, as the server's change stream reads a chain that began before it."""
        if (
            conn.streaming
        ):  # `conn` carries the member's stream of batches: ask on a connection of its own
            same = [h for h in self.hosts if host_address(*h) == conn.address]
            side = await self.connect_member(same or self.hosts, secondary=True)
            try:
                return await self._chain_through(side, ts)
            finally:
                await side.aclose()
        out: list[bytes] = []
        at: Timestamp | None = ts
        while at is not None:
            reply = await conn.command(
                "local",
                {
                    "find": "oplog.rs",
                    "filter": {"ts": at},
                    "limit": 1,
                    "singleBatch": True,
                    "readConcern": {"level": "majority"},
                    "$readPreference": _SECONDARY_OK,
                },
            )
            _, entries = cursor_batch(bytes(reply.raw))
            if not entries:
                raise MongoError(
                    "IncompleteTransactionHistory",
                    "oplog no longer contains the complete write "
                    f"history of this transaction, log with ts {at} cannot be found on shard "
                    f"{self.shard_id}",
                )
            out.append(entries[0])
            at = prev_op_ts(entries[0])
        return out[::-1]


class _ReadAhead:
    """An exhaust cursor's batches, each received while the tail splices the one before it.

    The member makes its next batch only once the last one is sent, and a 16 MiB batch fits in
    no socket buffer: a tail that read only between splices left each member waiting on it, and
    the shard read last held back the merge of every other. A shard's tail so holds at most one
    received batch beyond what its budget has taken (the one being spliced waits for the budget
    in `deliver`; this one waits for the tail).
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._send, self._receive = trio.open_memory_channel[outcome.Outcome](0)

    def held(self) -> bool:
        """Whether a received batch waits for the tail (unbuffered: its send waits)."""
        return self._send.statistics().tasks_waiting_send > 0

    async def run(self) -> None:
        """Receive batches while the connection streams them; a failed receive, as its error,
        is the last batch."""
        async with self._send:
            while self.conn.streaming:
                got = await outcome.acapture(
                    self.conn.more_in_place, pad=SLACK, allocate=unfilled_bytearray
                )
                failed = isinstance(got, outcome.Error)
                await self._send.send(got)
                del got
                if failed:
                    return

    async def next(self) -> tuple[bytes | bytearray, int] | None:
        """The next batch (its reply and where its body starts), or None once the cursor
        stopped streaming; raises what its receive raised."""
        try:
            got = await self._receive.receive()
        except trio.EndOfChannel:
            return None
        return got.unwrap()
