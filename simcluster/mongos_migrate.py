"""Chunk migrations and the commands that cut and move chunks, and that steer the balancer."""

from __future__ import annotations

from typing import Any

import trio

from mongoformats.errors import MongoError
from simcluster import query as q
from simcluster.balancer import plan_migrations, range_end
from simcluster.chunks import (
    Chunk,
    ShardedCollection,
    clone_range,
    commit_migration,
    delete_orphans,
    key_text,
)
from simcluster.config_server import bound_doc
from simcluster.mongos_routing import NO_POINT, RouterBase, equality_point
from simcluster.node import ShardNode
from simcluster.server import Request

# How long a migration's commit waits for the recipient's copies to be majority-committed.
MIGRATION_MAJORITY_TIMEOUT_S = 60


class MigrationRouting(RouterBase):
    """migrate (moveChunk, moveRange, the balancer), split, and the balancer's commands."""

    async def cmd_balancer_status(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        return self.balancer.status()

    async def cmd_balancer_start(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        self.config.set_balancer_mode("full")
        self.balancer.wake()
        return {}

    async def cmd_balancer_stop(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        self.config.set_balancer_mode("off")
        self.balancer.wake()
        await (
            self.balancer.wait_round_over()
        )  # the round's migration in progress ends; no other starts
        return {}

    async def _wait_to_migrate(self, ns: str) -> None:
        """Until no other migration of the collection runs (one at a time, as the server's
        ActiveMigrationsRegistry allows) and no transaction holds its locks (a migration's critical
        section waits for them). Transactions end by commit, abort, killSessions or expiry
        (transactionLifetimeLimitSeconds), none of which signals here, so this polls. No task runs
        between its return and the start of the caller's migration."""
        while self.in_transaction(ns) or self.migrating(ns):
            await trio.sleep(0.01)

    async def migrate(self, sc: ShardedCollection, chunk: Chunk, to: str) -> None:
        """Move a chunk (moveChunk, moveRange, the balancer) and log it in config.changelog.

        As the server's migrations: the collection's writes are held from the clone to the commit,
        and the commit waits until the recipient's copies are majority-committed. A recipient or
        donor failover meanwhile fails the migration (OperationFailed) and leaves the chunk where it
        was; the copies the recipient still holds are deleted as orphans. Committing on w:1 copies
        would lose the documents if the recipient's primary stepped down before its secondaries had
        them.
        """
        assert not self.migrating(sc.ns), (
            "callers wait for the collection's other migration (_wait_to_migrate)"
        )
        # Each side's current primary (an election may have come since the caller looked).
        donor, recipient = self.shards[chunk.shard], self.shards[to]
        lo, hi = chunk.min, chunk.max
        held = self._migrating[sc.ns] = trio.Event()
        try:
            moved = clone_range(sc, chunk, donor, recipient)
            await self._wait_for_copies(recipient, bool(moved))
            if self.replsets[donor.set_name].primary_node is not donor:
                raise MongoError(
                    "InterruptedDueToReplStateChange", f"donor {donor.set_name} stepped down"
                )
            commit_migration(sc, chunk, donor, recipient, moved)
        except MongoError as exc:
            rs = self.replsets[recipient.set_name]
            if rs.primary_node is not None:
                delete_orphans(sc, chunk, rs.primary_node)
            self.config.log_change(
                self,
                "moveChunk.from",
                sc.ns,
                {
                    "min": bound_doc(sc, lo),
                    "max": bound_doc(sc, hi),
                    "from": donor.set_name,
                    "to": recipient.set_name,
                    "note": "aborted",
                },
                shard=donor.set_name,
            )
            raise MongoError(
                "OperationFailed",
                f"Data transfer error: migrate failed: {exc.code_name}: {exc.errmsg}",
            ) from exc
        finally:
            del self._migrating[sc.ns]
            held.set()
        self.config.log_change(
            self,
            "moveChunk.from",
            sc.ns,
            {
                "min": bound_doc(sc, lo),
                "max": bound_doc(sc, hi),
                "from": donor.set_name,
                "to": recipient.set_name,
                "note": "success",
            },
            shard=donor.set_name,
        )

    async def _wait_for_copies(self, recipient: ShardNode, copied: bool) -> None:
        """Until the recipient's newest entry is majority-committed (the server's cloner waits for
        majority before the commit), at most MIGRATION_MAJORITY_TIMEOUT_S."""
        rs = self.replsets[recipient.set_name]
        if not copied or len(rs.members) == 1:
            return
        reply: dict[str, Any] = {}
        await rs.write_concern(
            {"writeConcern": {"w": "majority", "wtimeout": MIGRATION_MAJORITY_TIMEOUT_S * 1000}},
            reply,
            recipient.oplog.last_key(),
        )
        if "writeConcernError" in reply:
            raise MongoError(
                "WriteConcernFailed",
                f"the copies on {recipient.set_name} were not majority-committed "
                f"within {MIGRATION_MAJORITY_TIMEOUT_S} s",
            )

    async def cmd_configure_collection_balancing(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        """chunkSize in MB, 1 to 1024; 0 goes back to the cluster's chunk size."""
        sc = self._sharded(cmd["configureCollectionBalancing"])
        if "chunkSize" in cmd:
            mb = cmd["chunkSize"]
            if not isinstance(mb, int) or isinstance(mb, bool) or not 0 <= mb <= 1024:
                raise MongoError(
                    "InvalidOptions",
                    f"chunk size must be an integer between 1 and 1024 MB, or 0 for "
                    f"the default; got {mb!r}",
                )
            sc.chunk_bytes = mb << 20 or None
        return {}

    async def cmd_balancer_collection_status(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        sc = self._sharded(cmd["balancerCollectionStatus"])
        size = self.balancer.chunk_bytes(sc)
        reply: dict[str, Any] = {"chunkSize": size / (1 << 20), "balancerCompliant": True}
        if plan_migrations(sc, self.balancer.data_sizes(sc), size, set(self.replsets)):
            reply.update(balancerCompliant=False, firstComplianceViolation="chunksImbalance")
        return reply

    async def cmd_split(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        """sh.splitAt: `{split: ns, middle: {<shard key>: value}}` cuts the chunk holding `middle`
        in two there (for a hashed key, `middle` holds a hash value, as on the server). Both halves
        stay on the chunk's shard; nothing moves, nothing is logged."""
        ns = cmd["split"]
        sc = self._sharded(ns)
        if not isinstance(cmd.get("middle"), dict):
            raise MongoError(
                "InvalidOptions",
                "split needs a 'middle' key here (the 'find' and 'bounds' forms are not simulated)",
            )
        point = self._bound(
            sc, cmd["middle"], "new split key {} is not valid for shard key pattern {}"
        )
        chunk = sc.chunk_at(point)
        if q.compare(point, chunk.min) == 0:
            lo, hi = (key_text(bound_doc(sc, p)) for p in (chunk.min, chunk.max))
            raise MongoError(
                "CannotSplit",
                f"new split key {key_text(bound_doc(sc, point))} is a boundary key of "
                f"existing chunk [{lo},{hi})",
            )
        sc.split(chunk, point)
        return {}

    async def cmd_move_chunk(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        """`{moveChunk: ns, find: <doc> | bounds: [min, max], to}` moves the whole chunk."""
        sc = self._sharded(cmd["moveChunk"])
        recipient = self._recipient(cmd["to"])
        await self._wait_to_migrate(sc.ns)
        if "find" in cmd:
            point = equality_point(sc, cmd["find"])
            if point is NO_POINT:
                raise MongoError(
                    656450, f"no shard key found in chunk query {key_text(cmd['find'])}"
                )
            chunk = sc.chunk_at(point)
        else:
            lo = self._bound(
                sc,
                cmd["bounds"][0],
                "shard key bounds [{},...) are not valid for shard key pattern {}",
                code=656451,
            )
            starting = [c for c in sc.chunks if q.compare(c.min, lo) == 0]
            if not starting:
                raise MongoError(
                    "InvalidOptions", f"no chunk of {sc.ns} starts at {cmd['bounds'][0]}"
                )
            chunk = starting[0]
        if chunk.shard != recipient.set_name:
            await self.migrate(sc, chunk, recipient.set_name)
        return {"millis": 0}

    async def cmd_move_range(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        """`{moveRange: ns, toShard, min, max?}` (6.0+, what the balancer runs): the range from
        `min` moves, cut out of its chunk first; without `max` it ends where the donor counts about
        one chunk size of documents (simcluster/balancer.py: range_end)."""
        sc = self._sharded(cmd["moveRange"])
        recipient = self._recipient(cmd.get("toShard"))
        if not isinstance(cmd.get("min"), dict):
            raise MongoError(
                "InvalidOptions",
                "moveRange needs 'min' here (a range given by 'max' alone is not simulated)",
            )
        await self._wait_to_migrate(sc.ns)
        wording = "moveRange bound {} is not a full shard key of pattern {}"  # simcluster's words
        lo = self._bound(sc, cmd["min"], wording)
        chunk = sc.chunk_at(lo)
        hi = self._bound(sc, cmd["max"], wording) if isinstance(cmd.get("max"), dict) else None
        if hi is not None and (q.compare(hi, lo) <= 0 or q.compare(hi, chunk.max) > 0):
            # Checked before any change.
            raise MongoError(
                "InvalidOptions",
                f"the range of moveRange must lie within one chunk: {cmd['max']} "
                f"is not inside the chunk holding {cmd['min']}",
            )
        if q.compare(chunk.min, lo) != 0:
            chunk = sc.split(chunk, lo)
        self._cut_range_end(sc, chunk, hi)
        if chunk.shard != recipient.set_name:
            await self.migrate(sc, chunk, recipient.set_name)
        return {}

    def _cut_range_end(self, sc: ShardedCollection, chunk: Chunk, hi: Any) -> None:
        """Split the chunk where the moved range ends: at `hi`, or (none given) where the donor
        counts about one chunk size of documents; not at all when the range is the whole
        chunk."""
        if hi is None:
            donor = self.shards[chunk.shard]
            hi = range_end(sc, donor, chunk, self.balancer.chunk_bytes(sc))
        elif q.compare(hi, chunk.max) == 0:
            hi = None
        if hi is not None:
            sc.split(chunk, hi)
