"""The router's reads and writes: each statement goes to the shards its filter or document
targets; the rest scatter and gather."""

from __future__ import annotations

from typing import Any

from bson import Timestamp

from mongoformats.errors import MongoError
from simcluster import query as q
from simcluster.aggregate import find_projection, run_pipeline
from simcluster.cursors import Cursor
from simcluster.mongos_routing import RouterBase
from simcluster.native_stream import open_native_stream
from simcluster.node import ShardNode
from simcluster.replset import ReplicaSet
from simcluster.server import Request
from simcluster.updates import apply_update


class CrudRouting(RouterBase):
    """insert, update, delete, findAndModify, find, count, distinct and aggregate on a router."""

    async def _writable(self, ns: str) -> None:
        """Writes to a collection wait while a migration of it is in its critical section (the
        server's shards hold them, then mongos retries them at the new owner): a write in between
        would land on the donor after its documents were copied, and be lost at the commit."""
        self.config.check_write(ns)
        while (held := self._migrating.get(ns)) is not None:
            await held.wait()

    async def cmd_insert(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['insert']}"
        await self._writable(ns)
        if ns not in self.sharded:  # every document goes to the database's primary shard
            primary = self.primary_of(db)
            return q.run_inserts(ns, cmd, lambda doc: primary)
        return q.run_inserts(ns, cmd, lambda doc: self.shard_for_doc(ns, doc))

    async def cmd_update(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['update']}"
        await self._writable(ns)
        return q.run_updates(cmd, lambda i, spec: self._route_update(ns, cmd, i, spec))

    def _route_update(
        self, ns: str, cmd: dict[str, Any], i: int, spec: dict[str, Any]
    ) -> dict[str, Any]:
        """One update statement: targeted by shard key when the filter pins it, else broadcast."""
        shards = self.target(ns, spec.get("q", {}))
        result: dict[str, Any] = {"n": 0, "nModified": 0, "upserted": []}
        for shard in shards:
            sub = dict(spec, upsert=False) if len(shards) > 1 else spec
            r = shard.update_docs(ns, sub, shard._session_fields(cmd, i))
            result["n"] += r["n"]
            result["nModified"] += r["nModified"]
            result["upserted"] += r.get("upserted", [])
            if r["n"] and not spec.get("multi"):
                break
        if not result["n"] and spec.get("upsert") and len(shards) > 1:
            # A broadcast upsert that matched nothing inserts on the shard owning the new document.
            r = self._upsert_where_owned(ns, cmd, i, spec)
            result["n"] += r["n"]
            result["upserted"] += r.get("upserted", [])
        return result

    def _upsert_where_owned(
        self, ns: str, cmd: dict[str, Any], i: int, spec: dict[str, Any]
    ) -> dict[str, Any]:
        new = apply_update(
            {k: v for k, v in spec.get("q", {}).items() if not k.startswith("$")},
            spec["u"],
            is_insert=True,
        )
        shard = self.shard_for_doc(ns, new)
        return shard.update_docs(ns, spec, shard._session_fields(cmd, i))

    async def cmd_delete(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['delete']}"
        await self._writable(ns)
        n = 0
        for i, spec in enumerate(cmd.get("deletes", [])):
            limit = spec.get("limit", 0)
            for shard in self.target(ns, spec.get("q", {})):
                got = shard.delete_docs(ns, spec.get("q", {}), limit, shard._session_fields(cmd, i))
                n += got
                if got and limit:
                    break
        return {"n": n}

    async def cmd_find_and_modify(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        ns = f"{db}.{cmd['findAndModify']}"
        await self._writable(ns)
        shards = self.target(ns, cmd.get("query", {}))
        for shard in shards:
            if shard.select(ns, cmd.get("query", {}), limit=1):
                return await shard.cmd_find_and_modify(db, cmd, req)
        if cmd.get("upsert"):
            new = apply_update(
                {k: v for k, v in cmd.get("query", {}).items() if not k.startswith("$")},
                cmd.get("update", {}),
                is_insert=True,
            )
            return await self.shard_for_doc(ns, new).cmd_find_and_modify(db, cmd, req)
        return {"lastErrorObject": {"n": 0, "updatedExisting": False}, "value": None}

    async def cmd_find(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['find']}"
        docs = self.gather(ns, cmd.get("filter", {}))
        if cmd.get("sort"):
            docs = q.sort_docs(docs, cmd["sort"])
        docs = docs[cmd.get("skip", 0) :]
        if cmd.get("limit"):
            docs = docs[: abs(cmd["limit"])]
        docs = list(map(find_projection(cmd.get("projection")), docs))
        if cmd.get("singleBatch"):
            docs = docs[: cmd.get("batchSize", 101) or None]
        return {"cursor": await self.cursors.first_batch(Cursor(ns, docs), cmd.get("batchSize"))}

    async def cmd_count(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        docs = self.gather(f"{db}.{cmd['count']}", cmd.get("query") or {})
        docs = docs[cmd.get("skip", 0) :]
        return {"n": min(len(docs), cmd["limit"]) if cmd.get("limit") else len(docs)}

    async def cmd_distinct(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        return {
            "values": q.distinct_values(
                self.gather(f"{db}.{cmd['distinct']}", cmd.get("query") or {}), cmd["key"]
            )
        }

    async def cmd_aggregate(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        coll = cmd["aggregate"]
        pipeline = cmd.get("pipeline", [])
        if pipeline and "$changeStream" in pipeline[0]:
            return await self._open_change_stream(db, cmd)
        ns = f"{db}.{coll}" if isinstance(coll, str) else f"{db}.$cmd.aggregate"
        docs, pipeline = self._aggregate_input(db, coll, ns, pipeline)
        out = run_pipeline(docs, pipeline)
        return {
            "cursor": await self.cursors.first_batch(
                Cursor(ns, out), cmd.get("cursor", {}).get("batchSize")
            )
        }

    def _aggregate_input(
        self, db: str, coll: Any, ns: str, pipeline: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The documents a pipeline starts from, and the stages left to run on them: the
        $shardedDataDistribution stage's, or what the first $match targets."""
        if pipeline and "$shardedDataDistribution" in pipeline[0]:
            if db != "admin" or coll != 1:
                raise MongoError(
                    "InvalidNamespace",
                    "The $shardedDataDistribution stage can only be run on "
                    "the admin database with {aggregate: 1}",
                )
            return self.sharded_data_distribution(), pipeline[1:]
        first_match = pipeline[0].get("$match", {}) if pipeline else {}
        return (self.gather(ns, first_match) if isinstance(coll, str) else []), pipeline

    async def _open_change_stream(self, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        """A change stream over every shard, merged; a shard added later joins from its
        topologyTime."""

        def lookup(ns: str, key: dict[str, Any]) -> Any:
            found = self.gather(ns, key)
            return found[0] if found else None

        def topology() -> list[tuple[ReplicaSet[ShardNode], Timestamp]]:
            # In the order shards were added.
            return [(rs, self.topology_times[sid]) for sid, rs in self.replsets.items()]

        return await open_native_stream(
            self, db, cmd, list(self.replsets.values()), lookup, topology, self._is_view
        )

    def sharded_data_distribution(self) -> list[dict[str, Any]]:
        """$shardedDataDistribution (6.0.3+): per sharded collection, each shard holding it with its
        documents and their BSON bytes. A migration here deletes its range at once, and a failed
        one its copies on the recipient, so nothing stays orphaned; except (not counted here) the
        copies of a migration that failed while its recipient had no primary, which stay until the
        next migration of their range (see `migrate`)."""
        out = []
        for ns in sorted(self.sharded):
            shards = []
            for sid, shard in sorted(self.shards.items()):
                coll = shard.coll(ns)
                if coll is not None:
                    shards.append(
                        {
                            "shardName": sid,
                            "numOrphanedDocs": 0,
                            "numOwnedDocuments": len(coll.docs),
                            "ownedSizeBytes": coll.data_size(),
                            "orphanedSizeBytes": 0,
                        }
                    )
            out.append({"ns": ns, "shards": shards})
        return out
