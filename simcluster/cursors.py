"""Server-side cursors: a materialized result list, or a tailable awaitData cursor on the oplog.

Idle cursors time out as the server's do (cursorTimeoutMillis, 10 minutes by default, settable
with setParameter): a cursor opened outside any session that no getMore has used for that long is
killed by the process's cursor monitor, which runs every clientCursorMonitorFrequencySecs (4 s),
and its next getMore finds no cursor (CursorNotFound). A cursor opened in a session, or with
noCursorTimeout, is exempt: it ends with its session (4.4.8+; DOCS-13976). A session-less reader,
such as the proxy's oplog readers, must therefore be ready to lose a cursor it left idle.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from bson import Int64

from mongoformats.errors import MongoError
from mongoformats.oplog_splice import cursor_document

DEFAULT_AWAIT_MS = 1000  # the server's default await time for a tailable getMore


class RawBatch(list[bytes]):
    """A batch of documents kept as their BSON bytes (the oplog's entries): spliced into the reply
    as they are, which makes serving the oplog a copy rather than an object per entry."""


@dataclass
class Cursor:
    ns: str
    # A list cursor: documents not yet returned. A tailable cursor: `fetch(max_docs, deadline)`.
    docs: list[Any] = field(default_factory=list)
    fetch: Callable[[int, float], Awaitable[list[Any]]] | None = None
    tailable: bool = False
    await_data: bool = False
    lsid: bytes | None = None  # the id of the session that opened it (killSessions closes it)
    user: str | None = None  # who opened it, when auth is on
    # Extra cursor-reply fields computed per batch (change streams: postBatchResumeToken).
    extra: Callable[[], dict[str, Any]] | None = None
    # A tailable cursor that can end (a change stream after its invalidate event).
    done: Callable[[], bool] | None = None
    change_stream: bool = False
    # While a getMore has it checked out: killing the cursor interrupts that getMore (CursorKilled).
    operation: trio.CancelScope | None = None
    no_timeout: bool = False  # noCursorTimeout
    last_used: float = field(default_factory=time.monotonic)  # when a batch was last made

    @property
    def busy(self) -> bool:
        return self.operation is not None


def _await_ms(cursor: Cursor, max_time_ms: int | None, first: bool) -> float:
    """How long a getMore on an awaitData cursor waits for data; a first batch never waits."""
    if first or not cursor.await_data:
        return 0
    return max_time_ms if max_time_ms is not None else DEFAULT_AWAIT_MS


def _reply(cid: int, cursor: Cursor, key: str, batch: Any) -> Any:
    """The cursor document of a reply: `cid` (0 once the cursor is done), ns and the batch."""
    if isinstance(batch, RawBatch):
        extra = cursor.extra() if cursor.extra is not None else None
        return cursor_document(cid, cursor.ns, key, batch, extra)
    out: dict[str, Any] = {"id": Int64(cid), "ns": cursor.ns, key: batch}
    if cursor.extra is not None:
        out.update(cursor.extra())
    return out


class CursorManager:
    """Cursor ids belong to one server; ids are random non-zero int64s, as the server's are."""

    def __init__(self, seed: int | None = None) -> None:
        self._cursors: dict[int, Cursor] = {}
        self._rng = random.Random(seed)
        self.timed_out = 0  # serverStatus metrics.cursor.timedOut

    def __len__(self) -> int:
        return len(self._cursors)

    def __contains__(self, cid: object) -> bool:
        return cid in self._cursors

    def register(self, cursor: Cursor) -> int:
        cid = (self._rng.getrandbits(62) << 1) | 1
        self._cursors[cid] = cursor
        return cid

    def get(self, cid: int, ns: str) -> Cursor:
        cur = self._cursors.get(cid)
        if cur is None:
            raise MongoError("CursorNotFound", f"cursor id {cid} not found")
        if cur.ns != ns:
            raise MongoError(
                "Unauthorized",
                f"Requested getMore on namespace '{ns}', but cursor belongs to a "
                f"different namespace {cur.ns}",
            )
        return cur

    def kill(self, cid: int) -> bool:
        cursor = self._cursors.pop(cid, None)
        if cursor is not None and cursor.operation is not None:
            cursor.operation.cancel()  # a pinned cursor: its getMore fails with CursorKilled
        return cursor is not None

    def opened_in(
        self, cid: int, lsid: bytes | None, user: str | None, *, no_timeout: bool = False
    ) -> None:
        """Record the session (and user) a cursor was opened in, and whether it has
        noCursorTimeout."""
        if (cursor := self._cursors.get(cid)) is not None:
            cursor.lsid, cursor.user, cursor.no_timeout = lsid, user, no_timeout

    def time_out(self, idle_s: float) -> int:
        """Kill every cursor opened outside a session, without noCursorTimeout, that no getMore
        is using and none has used for `idle_s` seconds (the cursor monitor's pass); how many."""
        cutoff = time.monotonic() - idle_s
        idle = [
            cid
            for cid, c in self._cursors.items()
            if c.lsid is None and not c.no_timeout and not c.busy and c.last_used < cutoff
        ]
        for cid in idle:
            self.kill(cid)
        self.timed_out += len(idle)
        return len(idle)

    def kill_sessions(self, match: Callable[[Cursor], bool]) -> None:
        """Kill every cursor opened in a session that `match` selects (killSessions,
        killAllSessions)."""
        for cid, cursor in list(self._cursors.items()):
            if cursor.lsid is not None and match(cursor):
                self.kill(cid)

    async def first_batch(self, cursor: Cursor, batch_size: int | None) -> Any:
        cid = self.register(cursor)
        return await self._batch(
            cid,
            cursor,
            batch_size if batch_size is not None else 101,
            "firstBatch",
            None,
            first=True,
        )

    async def get_more(
        self,
        cid: int,
        ns: str,
        batch_size: int | None,
        max_time_ms: int | None,
        fail_after_checkout: MongoError | None = None,
    ) -> Any:
        cursor = self.get(cid, ns)
        if fail_after_checkout is not None:
            # failGetMoreAfterCursorCheckout: the getMore fails but the cursor survives.
            fail_after_checkout.change_stream = cursor.change_stream  # type: ignore[attr-defined]
            raise fail_after_checkout
        if max_time_ms is not None and not cursor.await_data:
            raise MongoError(
                "BadValue", "cannot set maxTimeMS on getMore command for a non-awaitData cursor"
            )
        if cursor.busy:
            raise MongoError("CursorInUse", f"cursor id {cid} is already in use")
        return await self._batch(cid, cursor, batch_size or 0, "nextBatch", max_time_ms)

    async def _batch(
        self,
        cid: int,
        cursor: Cursor,
        batch_size: int,
        key: str,
        max_time_ms: int | None,
        first: bool = False,
    ) -> Any:
        limit = batch_size if batch_size > 0 else 1 << 30
        if first and batch_size == 0:
            # find's and aggregate's batchSize 0: the cursor is made and nothing read yet (an empty
            # first batch, the cursor open), where a getMore's 0 means the default batch.
            batch, alive = [], True
        elif cursor.fetch is not None:
            batch = await self._fetch(cid, cursor, limit, _await_ms(cursor, max_time_ms, first))
            alive = not (cursor.done is not None and cursor.done())
        else:
            batch, cursor.docs = cursor.docs[:limit], cursor.docs[limit:]
            alive = bool(cursor.docs)
        cursor.last_used = time.monotonic()
        if not alive:
            self.kill(cid)
        return _reply(cid if alive else 0, cursor, key, batch)

    async def _fetch(self, cid: int, cursor: Cursor, limit: int, await_ms: float) -> Any:
        """A batch from the cursor's `fetch`; a failure (or a kill meanwhile) kills the cursor."""
        fetch = cursor.fetch
        assert fetch is not None
        operation = cursor.operation = trio.CancelScope()
        try:
            with operation:
                batch = await fetch(limit, trio.current_time() + await_ms / 1000)
            if operation.cancelled_caught:
                raise MongoError("CursorKilled", "operation was interrupted")
        except MongoError as exc:
            self.kill(cid)
            exc.change_stream = cursor.change_stream  # type: ignore[attr-defined]
            raise
        finally:
            cursor.operation = None
        return batch
