"""The cluster's shard list as one more input of the merge, so shards added later are read too.

mongos learns of a new shard by watching `config.shards` and opens a cursor on it from the time
it joined (`topologyTime`, the kNewShardDetected path). The proxy does the same with `listShards`:
a reply whose operationTime is T lists every shard that joined at or before T. The watcher feeds
the merge a pseudo-shard, TOPOLOGY, whose high-water mark is the last such T, so no event newer
than T leaves the merge before the shard list has been checked past it. A shard that appears is
read from its topologyTime; since it did not exist at the previous check, that time is above the
merge frontier and nothing it writes can arrive too late.

The list is fetched only while the TOPOLOGY mark is what holds the merge back (at once, one read
at a time: a live tail pays one or two round trips to mongos in latency) or a waiting consumer's
resume point (at most once a second); a catch-up over a backlog older than the last check costs
no round trip at all.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple

import trio
from bson import Timestamp
from bson.raw_bson import RawBSONDocument
from pymongo.uri_parser import split_hosts

from buckets.ports import Connection, ConnectUpstream
from mongoformats.errors import ConnectionLost, MongoError, has_category
from mongoformats.oplog_splice import first_element

log = logging.getLogger("buckets.topology")

# The merge input that stands for the shard list. "config" can never be a shard's id (reserved).
TOPOLOGY = "config"


class Topology(NamedTuple):
    shards: dict[str, list[tuple[str, int]]]  # shard id -> its members' addresses
    joined: dict[str, Timestamp]  # shard id -> topologyTime
    as_of: Timestamp  # every shard that joined at or before this is listed
    # A replica set upstream is its one and only "shard": nothing can join it, so no watcher.
    sharded: bool = True


def _members(hosts: str) -> list[tuple[str, int]]:
    """`h1:p1,[::1]:p2,h3` (members as servers list them) -> [(h1, p1), ("::1", p2), (h3, 27017)],
    split by pymongo's parser, as drivers split them."""
    return [(host, port or 27017) for host, port in split_hosts(hosts)]


async def discover(conn: Connection, hello: Mapping[str, Any] | None = None) -> Topology:
    """What the engine reads behind `conn`: a mongos's shards, or a replica set as one shard;
    `hello` is the server's answer to hello, if asked already.

    A replica set's change stream is the same stream on one shard (same events, tokens and
    errors), so the proxy accelerates it too: one reader, the consumers spread over buckets. A
    standalone server has no oplog to read; like the server, it refuses change streams.
    """
    if hello is None:
        hello = await conn.command("admin", {"hello": 1})
    if hello.get("msg") == "isdbgrid":
        return await read_topology(conn)
    set_name = hello.get("setName")
    if not set_name:
        raise MongoError(40573, "The $changeStream stage is only supported on replica sets")
    members = [*hello.get("hosts", []), *hello.get("passives", [])]
    as_of = hello.get("operationTime") or hello["$clusterTime"]["clusterTime"]
    return Topology(
        {set_name: _members(",".join(members))}, {set_name: Timestamp(0, 0)}, as_of, sharded=False
    )


async def read_topology(conn: Connection) -> Topology:
    return _topology(await conn.command("admin", {"listShards": 1}))


def _as_of(reply: Mapping[str, Any]) -> Timestamp:
    """The time a listShards reply lists every shard that joined at or before."""
    as_of: Timestamp = reply.get("operationTime") or reply["$clusterTime"]["clusterTime"]
    return as_of


def _listed(reply: Mapping[str, Any]) -> bytes | None:
    """The bytes of a listShards reply's `shards` array (None: not a raw reply). The same bytes
    list the same shards: a watcher that read them before has nothing to parse or add."""
    if not isinstance(reply, RawBSONDocument):
        return None
    raw = bytes(reply.raw)  # (the same object when it is bytes)
    found = first_element(raw, b"shards")
    return None if found is None else raw[found[1] : found[2]]


def _topology(reply: Mapping[str, Any]) -> Topology:
    as_of = _as_of(reply)
    shards: dict[str, list[tuple[str, int]]] = {}
    joined: dict[str, Timestamp] = {}
    for s in reply["shards"]:
        shards[s["_id"]] = _members(s["host"].split("/", 1)[-1])
        joined[s["_id"]] = s.get("topologyTime") or Timestamp(0, 0)
    return Topology(shards, joined, as_of)


class TopologyWatcher:
    def __init__(
        self,
        connect: ConnectUpstream,
        known: Topology,
        *,
        holds_back: Callable[[], float | None],
        min_interval_s: float = 0.02,
        lazy_check_s: float = 0.25,
    ) -> None:
        self.connect = connect
        self.known = set(known.shards)
        self.as_of = known.as_of
        # How soon the mark should move (seconds between reads), or None: at most min_interval_s
        # means events wait on it (read at once); more is a waiting consumer's resume point.
        self.holds_back = holds_back
        self.min_interval_s = min_interval_s
        self.lazy_check_s = (
            lazy_check_s  # how often the lazy case is looked at (no one nudges for it)
        )
        self.checks = 0
        self.added: list[str] = []
        self._nudged = trio.Event()
        self._listed: bytes | None = None  # the `shards` array of the last list read

    def nudge(self) -> None:
        """Events wait on the shard list's mark: re-read it now, or once the read under way is
        taken by the merge."""
        self._nudged.set()

    async def run(
        self,
        advance: Callable[[Timestamp], Awaitable[None]],
        add_shard: Callable[[str, list[tuple[str, int]], Timestamp], None],
    ) -> None:
        """Forever: when the shard list holds the merge back, re-read it; start readers for new
        shards (`add_shard`) before the mark moves past their start (`advance`).

        Reads follow demand: the merge nudges after each release that leaves events waiting on
        the mark, and the list is read at once, one read at a time. Nudges made while a read is
        under way came before the merge took its mark; the merge nudges again if events still
        wait after it (they came after the read began), so those are dropped."""
        conn: Connection | None = None
        last_check = -1e9
        try:
            while True:
                with trio.move_on_after(self.lazy_check_s):
                    await self._nudged.wait()
                self._nudged = trio.Event()
                if not self._due(last_check):
                    continue
                last_check = trio.current_time()
                try:
                    if conn is None:
                        conn = await self.connect()
                    reply = await conn.command("admin", {"listShards": 1})
                except (ConnectionLost, MongoError) as exc:
                    _check_retriable(exc)
                    if conn is not None:
                        await conn.aclose()
                    conn = None
                    continue
                self.checks += 1
                self.as_of = self._take(reply, add_shard)
                del reply
                await advance(self.as_of)
                if self._nudged.is_set():  # (answered by this mark; none waits on a set event)
                    self._nudged = trio.Event()
        finally:
            if conn is not None:
                await conn.aclose()

    def _due(self, last_check: float) -> bool:
        """Whether the shard list holds the merge back enough to be read again now."""
        interval = self.holds_back()
        return interval is not None and (
            interval <= self.min_interval_s or trio.current_time() - last_check >= interval
        )

    def _take(
        self,
        reply: Mapping[str, Any],
        add_shard: Callable[[str, list[tuple[str, int]], Timestamp], None],
    ) -> Timestamp:
        """Start readers for the shards a listShards reply lists that were not known yet; the
        time it lists them as of. A list of the same bytes as the last one read lists no new
        shard: a live tail reads the list once a round, and parsing it each time cost more than
        the rest of its handling."""
        listed = _listed(reply)
        if listed is None or listed != self._listed:
            topology = _topology(reply)
            self._add_new(topology, add_shard)
            self._listed = listed
            return topology.as_of
        return _as_of(reply)

    def _add_new(
        self,
        topology: Topology,
        add_shard: Callable[[str, list[tuple[str, int]], Timestamp], None],
    ) -> None:
        """Start readers for the shards `topology` lists that were not known yet."""
        for sid, hosts in topology.shards.items():
            if sid not in self.known:
                log.info(
                    "shard %s joined at %s: reading it from then on",
                    sid,
                    topology.joined[sid],
                )
                self.known.add(sid)
                self.added.append(sid)
                add_shard(sid, hosts, topology.joined[sid])

    def status(self) -> dict[str, Any]:
        return {
            "checkedThrough": self.as_of,
            "checks": self.checks,
            "shardsAdded": list(self.added),
        }


def _check_retriable(exc: ConnectionLost | MongoError) -> None:
    """A failed listShards that a retry may cure is logged; any other fails the stream."""
    if isinstance(exc, MongoError) and not has_category(exc.code, "RetriableError"):
        raise MongoError(
            exc.code, f"reading the shard list (listShards) failed: {exc.errmsg}"
        ) from exc
    log.warning("listShards: %s; retrying", str(exc))
