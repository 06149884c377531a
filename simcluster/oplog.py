"""A replica set's oplog (`local.oplog.rs`) and the hybrid logical clock that stamps it.

Invariant: entries are raw BSON in `ts` order; `ts` values come from one `ClusterClock` per
simulated cluster, so every node's timestamps are comparable, as with the server's gossiped
clusterTime. The oplog is capped by bytes; truncating the oldest entries is what makes a resume
from a lost point fail the way the server does.
"""

from __future__ import annotations

import bisect
import struct
import time
from typing import Any

import bson
import trio
from bson import Timestamp
from bson.raw_bson import RawBSONDocument

from mongoformats.codecs import RAW
from mongoformats.errors import MongoError
from mongoformats.wire import BATCH_BYTES_LIMIT, BATCH_ELEMENT_OVERHEAD


def prev_op_ts(entry: bytes) -> Timestamp | None:
    """The ts of the entry before this one in its transaction's chain (prevOpTime), or None for
    the chain's first entry (the null optime)."""
    prev = RawBSONDocument(entry, RAW).get("prevOpTime")
    ts = prev["ts"] if prev is not None else None
    return ts if ts is not None and (ts.time or ts.inc) else None


def ts_key(ts: Timestamp) -> int:
    return (ts.time << 32) | ts.inc


# ts (Timestamp: increment, seconds), t (int64 term), v (int64 2), wall (UTC datetime, ms).
_STAMP = struct.Struct("<4sII3sq3sq6sq")
_I32 = struct.Struct("<i")
# Fields that go before op (OperationSessionInfo) and after wall (prevOpTime, multiOpType).
_SESSION_HEAD = ("lsid", "txnNumber", "txnRetryCounter")
_ENTRY_TAIL = ("prevOpTime", "multiOpType")


def _stamp(inc: int, secs: int, term: int, wall_ms: int) -> bytes:
    return _STAMP.pack(
        b"\x11ts\x00", inc, secs, b"\x12t\x00", term, b"\x12v\x00", 2, b"\x09wall\x00", wall_ms
    )


class ClusterClock:
    """Hybrid logical clock: wall seconds plus an increment within the second."""

    def __init__(self) -> None:
        self._secs = int(time.time())
        self._inc = 0

    def tick(self) -> Timestamp:
        key = self.tick_key()
        return Timestamp(key >> 32, key & 0xFFFFFFFF)

    def tick_key(self, now: int | None = None) -> int:
        """`tick()` as the oplog's integer key (seconds << 32 | increment), with no Timestamp built;
        `now` (wall seconds) may be read once for a batch of writes."""
        now = int(time.time()) if now is None else now
        if now > self._secs:
            self._secs, self._inc = now, 1
        else:
            self._inc += 1
        return (self._secs << 32) | self._inc

    def now(self) -> Timestamp:
        return Timestamp(self._secs, self._inc)

    def advance(self, ts: Timestamp) -> None:
        """Gossip: never hand out a timestamp at or below one the cluster has seen."""
        if (ts.time, ts.inc) > (self._secs, self._inc):
            self._secs, self._inc = ts.time, ts.inc


def _elements(fields: dict[str, object]) -> bytes:
    """The fields as encoded BSON elements, without the document's length and terminator."""
    return bson.encode(fields)[4:-1]


class Oplog:
    """Capped, append-only log with awaitable growth.

    `wait_beyond(key, deadline)` parks until an entry newer than `key` exists: tailable awaitData
    cursors and replication both wait on it.
    """

    def __init__(self, clock: ClusterClock, *, cap_bytes: int = 1 << 30, term: int = 1) -> None:
        self.clock = clock
        self.cap_bytes = cap_bytes
        self.term = term
        self._keys: list[int] = []
        self._entries: list[bytes] = []
        self._bytes = 0
        self._grew = trio.Event()
        self.truncated_before: int = 0  # ts key of the newest entry ever truncated (0 = none)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def first_key(self) -> int:
        return self._keys[0] if self._keys else 0

    def last_key(self) -> int:
        return self._keys[-1] if self._keys else 0

    def last_optime(self) -> tuple[int, int]:
        """(term, ts key) of the newest entry: the order in which elections compare members'
        oplogs."""
        if not self._entries:
            return (0, 0)
        return (int(RawBSONDocument(self._entries[-1], RAW)["t"]), self._keys[-1])

    def last_ts(self) -> Timestamp:
        k = self.last_key()
        return Timestamp(k >> 32, k & 0xFFFFFFFF)

    def append(self, fields: dict[str, Any]) -> tuple[Timestamp, bytes]:
        """Stamp and append one entry: `fields` (op, ns, ui, o, ..., session fields), in the
        server's field order (see `append_body`)."""
        head = {k: fields[k] for k in _SESSION_HEAD if k in fields}
        tail = {k: fields[k] for k in _ENTRY_TAIL if k in fields}
        body = {k: v for k, v in fields.items() if k not in head and k not in tail}
        key, raw = self.append_body(_elements(body), head=_elements(head), tail=_elements(tail))
        return Timestamp(key >> 32, key & 0xFFFFFFFF), raw

    def append_body(
        self,
        body: bytes,
        *,
        head: bytes = b"",
        tail: bytes = b"",
        wake: bool = True,
        wall_ms: int | None = None,
    ) -> tuple[int, bytes]:
        """Stamp and append an entry given as encoded elements, in the order of the server's
        OplogEntryBase IDL: `head` (the session: lsid, txnNumber), `body` (op, ns, ui, o, o2,
        stmtId, fromMigrate), the stamp (ts, t, v, wall), then `tail` (prevOpTime). `wall_ms` is the
        write's wall time if the caller read the clock once for a batch. The stamp is spliced in
        as bytes: the same BSON as encoding the four fields, without building four objects per
        write."""
        wall_ms = int(time.time() * 1000) if wall_ms is None else wall_ms
        key = self.clock.tick_key(wall_ms // 1000)
        raw = b"".join(
            (
                _I32.pack(len(head) + len(body) + len(tail) + 5 + _STAMP.size),
                head,
                body,
                _stamp(key & 0xFFFFFFFF, key >> 32, self.term, wall_ms),
                tail,
                b"\x00",
            )
        )
        self.append_raw(key, raw, wake=wake)
        return key, raw

    def wake(self) -> None:
        """Wake the tailers and secondaries waiting on this oplog (after quiet appends)."""
        self._grew.set()
        self._grew = trio.Event()

    def append_raw(self, key: int, raw: bytes, *, wake: bool = True) -> None:
        if self._keys and key <= self._keys[-1]:
            raise ValueError("oplog entries must be appended in ts order")
        self._keys.append(key)
        self._entries.append(raw)
        self._bytes += len(raw)
        if self._bytes > self.cap_bytes:
            self._truncate()
        if wake:
            self.wake()

    def _truncate(self) -> None:
        # Drop the oldest tenth past the cap at once, so truncation is amortized O(1) per entry.
        target = self.cap_bytes * 9 // 10
        n = 0
        freed = 0
        while self._bytes - freed > target and n < len(self._entries) - 1:
            freed += len(self._entries[n])
            n += 1
        self.truncated_before = self._keys[n - 1]
        del self._keys[:n]
        del self._entries[:n]
        self._bytes -= freed

    def chain_through(self, ts: Timestamp) -> list[bytes]:
        """A transaction's entries up to the one at `ts`, oldest first, found as the server's
        transaction history iterator finds them: by prevOpTime, back to the chain's first."""
        out: list[bytes] = []
        at: Timestamp | None = ts
        while at is not None:
            key = ts_key(at)
            i = bisect.bisect_left(self._keys, key)
            if i == len(self._keys) or self._keys[i] != key:
                raise MongoError(
                    "IncompleteTransactionHistory",
                    "oplog no longer contains the complete write "
                    f"history of this transaction, log with opTime {{ ts: {at}, t: {self.term} }} "
                    "cannot be found",
                )
            out.append(self._entries[i])
            at = prev_op_ts(self._entries[i])
        return out[::-1]

    def contains(self, key: int) -> bool:
        i = bisect.bisect_left(self._keys, key)
        return i < len(self._keys) and self._keys[i] == key

    def copy_from(self, other: Oplog) -> None:
        """Become a copy of another member's oplog (a resync)."""
        self._keys, self._entries = list(other._keys), list(other._entries)
        self._bytes, self.truncated_before, self.term = (
            other._bytes,
            other.truncated_before,
            other.term,
        )
        self._grew.set()
        self._grew = trio.Event()

    def read_after(
        self, key: int, limit: int, max_bytes: int = BATCH_BYTES_LIMIT, upto: int | None = None
    ) -> list[bytes]:
        """Entries with ts > key (and <= `upto`, a commit point): at most `limit`, and few enough
        that the reply stays under 16 MiB."""
        i = bisect.bisect_right(self._keys, key)
        if upto is not None:
            limit = min(limit, bisect.bisect_right(self._keys, upto) - i)
            if limit <= 0:
                return []
        out = self._entries[i : i + limit]
        total = 0
        for n, e in enumerate(out):
            total += len(e) + BATCH_ELEMENT_OVERHEAD
            if total > max_bytes and n:
                return out[:n]
        return out

    def entry_key(self, raw: bytes) -> int:
        return ts_key(RawBSONDocument(raw, RAW)["ts"])

    async def wait_beyond(self, key: int, deadline: float) -> bool:
        """Wait until an entry newer than `key` exists or the trio deadline passes."""
        while self.last_key() <= key:
            with trio.move_on_at(deadline):
                await self._grew.wait()
                continue
            return False
        return True
