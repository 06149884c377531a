"""The engine's cursors: ids, ownership, timeouts and session reaping, and the private streams
(an accelerated watch()'s, a replay) each serving one cursor."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from buckets.cursor import BucketCursor
from buckets.stream import ParallelStream
from mongoformats.errors import MongoError
from mongoformats.sessions import session_id

log = logging.getLogger("buckets.engine")


class CursorRegistry:
    """Every open cursor by id. A cursor no getMore has used for `cursor_timeout_s` is killed, as
    the server's cursorTimeoutMillis kills idle cursors; one opened in a session after
    `session_cursor_timeout_s` (the session's own lifetime on the server)."""

    def __init__(self, cursor_timeout_s: float, session_cursor_timeout_s: float) -> None:
        self.cursor_timeout_s = cursor_timeout_s
        self.session_cursor_timeout_s = session_cursor_timeout_s
        self.cursors: dict[int, BucketCursor] = {}
        self.private: dict[
            int, ParallelStream
        ] = {}  # watch() and replay streams, by their one cursor
        self._ended_sessions: set[bytes] = set()  # ended since the last session refresh (owners)
        self._rng = random.Random()
        self.timed_out = 0  # idle cursors killed (serverStatus' metrics.cursor.timedOut)

    def new_id(self) -> int:
        """A fresh cursor id: positive, odd, never 0 (which ends a cursor in a reply)."""
        return (self._rng.getrandbits(62) << 1) | 1

    def owned(
        self, cid: int, user: Callable[[], str], lsid: Mapping[str, Any] | None
    ) -> BucketCursor:
        """Cursor `cid` if the caller may use it: its creator (`user()`, asked once the cursor is
        found) and, if opened in a session, in that session."""
        cur = self.cursors.get(cid)
        if cur is None:
            raise MongoError("CursorNotFound", f"cursor id {cid} not found")
        if cur.user != user():
            raise MongoError(
                "Unauthorized", f"cursor id {cid} was not created by the authenticated user"
            )
        if cur.owner and (lsid is None or session_id(lsid["id"]) != cur.owner):
            raise MongoError("Unauthorized", f"cursor id {cid} belongs to another session")
        return cur

    def close_private(self, cid: int) -> None:
        """Close the private stream (a watch()'s, a replay) cursor `cid` reads, if any."""
        private = self.private.pop(cid, None)
        if private is not None:
            private.close()

    def drop(self, cid: int) -> None:
        cur = self.cursors.pop(cid, None)
        if cur is not None:
            cur.killed = True  # before detach wakes a getMore parked on it
            cur.bucket.detach(cur)
        self.close_private(cid)

    def kill_where(self, match: Callable[[BucketCursor], bool], why: str) -> int:
        """Kill every cursor `match` selects (timeouts, ended or killed sessions); how many."""
        doomed = [cid for cid, cur in self.cursors.items() if match(cur)]
        for cid in doomed:
            log.info("killing cursor %d of stream %s: %s", cid, self.cursors[cid].stream.name, why)
            self.drop(cid)
        return len(doomed)

    def kill_idle(self, now: float) -> None:
        def idle(cur: BucketCursor) -> bool:
            limit = self.session_cursor_timeout_s if cur.owner else self.cursor_timeout_s
            return not cur.busy and now - cur.last_used > limit

        self.timed_out += self.kill_where(idle, "unused for the cursor timeout")

    def note_ended(self, sessions: Iterable[Any]) -> None:
        """Sessions a client ended (endSessions' specs): their cursors are killed at the next
        session refresh. Only the sessions of cursors are kept: drivers end thousands."""
        owners = {cur.owner for cur in self.cursors.values()}
        self._ended_sessions.update(
            owner
            for spec in sessions
            if isinstance(spec, Mapping)
            and "id" in spec
            and (owner := session_id(spec["id"])) in owners
        )

    def reap_ended_sessions(self) -> None:
        ended, self._ended_sessions = self._ended_sessions, set()
        self.kill_where(lambda cur: cur.owner in ended, "its session was ended")

    def private_owners(self) -> dict[str, str]:
        """Each private stream's user: its cursor's."""
        return {
            stream.name: self.cursors[cid].user
            for cid, stream in self.private.items()
            if cid in self.cursors
        }
