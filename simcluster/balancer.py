"""The balancer (in 7.0 a thread of the config server primary; here a task of mongos, which holds
the config metadata): rounds that even out each sharded collection's data across the shards by
moving ranges of about the collection's chunk size, so change streams see migrations nobody asked
for.

The rules, from the server's source (read for facts only):
- balancer.cpp: on by default (mode "full"); a round every 10 s, 1 s after a round that moved
  something; the `overrideBalanceRoundInterval` fail point ({intervalMs}) sets the pause, as tests
  do; balancerStart and balancerStop end the pause.
- balancer_policy.cpp, `_singleZoneBalanceBasedOnDataSize`: per collection, the most loaded shard
  gives to the least loaded one only if it holds more than the ideal (total / shards), the receiver
  less, and they differ by at least 3 chunk sizes; it moves from the min of the giver's first chunk.
  A shard takes part in at most one migration a round, across all collections.
- migration_source_manager.cpp `computeOtherBound` with `autoSplitVector`: the donor ends the range
  where about one chunk size of documents (by average size) has been counted, at a new key value;
  a chunk smaller than that moves whole.
- The chunk size is config.settings' `chunksize` (MB; 128 when absent or not in 1..1024), unless
  `configureCollectionBalancing` gives a collection its own (1 to 1024 MB); at 128 MB nothing
  moves until shards differ by 384 MB.
- On or off is config.settings' `balancer` document (`mode`, or the legacy `stopped`), which
  balancerStart and balancerStop write; a round reads it, so a write to the document also counts.

A migration does not start while a transaction holds writes to the collection on some shard (the
server's critical section waits for such transactions). A round does nothing while any shard has
no primary: the server's round first gathers every shard's data size (cluster_statistics_impl.cpp)
and fails as a whole, "Unable to obtain shard utilization information", if one shard does not
answer. A migration that fails (a failover on its recipient or donor) is tried again in a later
round.
"""

from __future__ import annotations

import logging
from typing import Any

import bson
import trio
from bson import Int64

from mongoformats.bson_order import compare
from mongoformats.errors import MongoError
from simcluster.chunks import Chunk, ShardedCollection
from simcluster.roles import ShardMember
from simcluster.router_roles import BalancedRouter

log = logging.getLogger("simcluster.balancer")

DEFAULT_CHUNK_BYTES = 128 << 20
ROUND_S = 10.0
SHORT_ROUND_S = 1.0


class Balancer:
    def __init__(self, mongos: BalancedRouter) -> None:
        self.mongos = mongos
        self.rounds = 0
        self.migrations = 0
        self._wake = trio.Event()
        self.in_round = False
        self._round_over = trio.Event()

    def status(self) -> dict[str, Any]:
        return {
            "mode": self.mongos.config.balancer_mode(),
            "inBalancerRound": self.in_round,
            "numBalancerRounds": Int64(self.rounds),
        }

    async def wait_round_over(self) -> None:
        """Until no round is running (balancerStop returns once the balancer has stopped)."""
        while self.in_round:
            await self._round_over.wait()

    def wake(self) -> None:
        """balancerStart / balancerStop: like the server's notice of changed balancer settings, it
        cuts the pause short, so a fail point set before it takes effect at once."""
        self._wake.set()

    def chunk_bytes(self, sc: ShardedCollection) -> int:
        """The collection's chunk size, else the cluster's setting, else 128 MB."""
        cluster_mb = self.mongos.config.chunk_size_mb()
        return sc.chunk_bytes or (cluster_mb << 20 if cluster_mb else DEFAULT_CHUNK_BYTES)

    async def run(self) -> None:
        while True:
            moved = 0
            if self.mongos.config.balancer_mode() == "full":
                self.in_round = True
                try:
                    moved = await self.round()
                finally:
                    self.in_round = False
                    self._round_over.set()
                    self._round_over = trio.Event()
            self._wake = trio.Event()
            with trio.move_on_after(self._pause(moved)):
                await self._wake.wait()

    def _pause(self, moved: int) -> float:
        fp = self.mongos.fail_points.get("overrideBalanceRoundInterval")
        if fp is not None:
            return float(fp["data"].get("intervalMs", ROUND_S * 1000)) / 1000
        return SHORT_ROUND_S if moved else ROUND_S

    async def round(self) -> int:
        """One balancing round; returns how many ranges moved."""
        self.rounds += 1
        if self._shard_without_primary():
            return 0
        available = set(self.mongos.replsets)
        moved = 0
        for ns in sorted(self.mongos.sharded):
            sc = self.mongos.sharded.get(ns)
            if sc is None or self._busy(ns):
                continue
            moved += await self._balance(sc, available)
        self.migrations += moved
        return moved

    def _busy(self, ns: str) -> bool:
        """Whether a transaction or another migration holds the collection now."""
        return self.mongos.in_transaction(ns) or self.mongos.migrating(ns)

    async def _balance(self, sc: ShardedCollection, available: set[str]) -> int:
        """The round's migrations of one collection; how many ranges moved."""
        size = self.chunk_bytes(sc)
        moved = 0
        for chunk, to in plan_migrations(sc, self.data_sizes(sc), size, available):
            # Migrations yield (the commit waits for the recipient's majority): the plan may
            # have gone stale, and the balancer may have been stopped, meanwhile.
            if self._stale(sc, chunk, to):
                break
            end = range_end(sc, self.mongos.shards[chunk.shard], chunk, size)
            if end is not None:
                sc.split(chunk, end)
            try:
                await self.mongos.migrate(sc, chunk, to)
            except MongoError as exc:
                log.info(
                    "balancer: moving a range of %s to %s failed, retried next round: %s",
                    sc.ns,
                    to,
                    exc,
                )
                break
            moved += 1
        return moved

    def _stale(self, sc: ShardedCollection, chunk: Chunk, to: str) -> bool:
        """Whether a planned migration is no longer to run."""
        return (
            self.mongos.config.balancer_mode() != "full"
            or self._busy(sc.ns)
            or chunk not in sc.chunks
            or chunk.shard == to
            or self._shard_without_primary()
        )

    def _shard_without_primary(self) -> bool:
        """Whether some shard has no primary: a round then does nothing (see the module's notes)."""
        return any(rs.primary_node is None for rs in self.mongos.replsets.values())

    def data_sizes(self, sc: ShardedCollection) -> dict[str, int]:
        """Each shard's bytes of the collection (the server's _shardsvrGetStatsForBalancing, orphans
        aside)."""
        sizes = {}
        for sid, shard in sorted(self.mongos.shards.items()):
            coll = shard.coll(sc.ns)
            sizes[sid] = coll.data_size() if coll is not None else 0
        return sizes


def plan_migrations(
    sc: ShardedCollection, sizes: dict[str, int], max_bytes: int, available: set[str]
) -> list[tuple[Chunk, str]]:
    """The round's migrations for one collection, as (chunk to move from its min, receiving shard).
    Takes the shards it uses out of `available`. Ties go to the first shard id, as the server walks
    its shard statistics in order."""
    ideal = sum(sizes.values()) // max(len(sizes), 1)
    planned: list[tuple[Chunk, str]] = []
    while True:
        pair = _giver_and_taker(sizes, available, ideal, max_bytes)
        if pair is None:
            return planned
        giver, taker = pair
        chunk = next((c for c in sc.chunks if c.shard == giver), None)
        if chunk is None:
            return planned
        planned.append((chunk, taker))
        available -= {giver, taker}


def _giver_and_taker(
    sizes: dict[str, int], available: set[str], ideal: int, max_bytes: int
) -> tuple[str, str] | None:
    """The most loaded available shard and the least loaded one, if the first holds more than
    the ideal, the second less, and they differ by at least 3 chunk sizes."""
    candidates = [sid for sid in sorted(sizes) if sid in available]
    if len(candidates) < 2:
        return None
    giver = max(candidates, key=lambda sid: (sizes[sid], -candidates.index(sid)))
    taker = min(candidates, key=lambda sid: (sizes[sid], candidates.index(sid)))
    if (
        giver == taker
        or sizes[giver] <= ideal
        or sizes[taker] >= ideal
        or sizes[giver] - sizes[taker] < 3 * max_bytes
    ):
        return None
    return giver, taker


def range_end(
    sc: ShardedCollection, donor: ShardMember, chunk: Chunk, max_bytes: int
) -> Any | None:
    """Where a range of about `max_bytes` starting at the chunk's min ends: the key of the first
    document past that many documents of average size (moved on past equal keys, which cannot be
    split), or None when the chunk holds less or has no such key (it moves whole)."""
    docs = sc.documents_in(donor, chunk)
    sizes = [len(bson.encode(doc)) for _, doc in docs]
    total = sum(sizes)
    if total <= max_bytes:
        return None
    per_range = max(1, int(max_bytes // (total / len(docs))))
    for i in range(per_range, len(docs)):
        if compare(docs[i][0], docs[i - 1][0]) != 0:
            return docs[i][0]
    return None
