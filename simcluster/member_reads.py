"""A shard member's reads: find (also on its oplog and its pre-images), count, distinct,
aggregate, and the catalog listings and statistics.
"""

from __future__ import annotations

import datetime
from typing import Any

import bson
from bson import Binary, Int64, Timestamp

from mongoformats.errors import MongoError
from simcluster import query as q
from simcluster.aggregate import run_pipeline
from simcluster.cursors import Cursor, RawBatch
from simcluster.member_core import MemberCore
from simcluster.oplog import ts_key
from simcluster.server import DECODE, Request

OPLOG_NS = "local.oplog.rs"


PREIMAGES_NS = "config.system.preimages"


def _ts_bounds(cond: Any) -> tuple[int, int | None]:
    """(the key an oplog scan starts after, the last key it may return or None) of a `ts`
    condition: a timestamp, or `$gt`/`$gte` and `$lt`/`$lte`."""
    if isinstance(cond, Timestamp):
        return ts_key(cond) - 1, ts_key(cond)
    if not isinstance(cond, dict):
        return 0, None
    position, upper = 0, None
    if "$gte" in cond:
        position = ts_key(cond["$gte"]) - 1
    elif "$gt" in cond:
        position = ts_key(cond["$gt"])
    if "$lte" in cond:
        upper = ts_key(cond["$lte"])
    elif "$lt" in cond:
        upper = ts_key(cond["$lt"]) - 1
    return position, upper


def _preimage_keys(ids: Any) -> list[tuple[bytes, int, int]] | None:
    """The image keys a pre-images filter's `_id` names ({$in: [...]} or one _id document), or
    None when it names none (a scan of them all)."""
    if not isinstance(ids, dict):
        return None
    wanted = ids.get("$in", [ids])
    return [
        (bytes(i["nsUUID"]), ts_key(i["ts"]), int(i.get("applyOpsIndex", 0)))
        for i in wanted
        if isinstance(i, dict) and "nsUUID" in i
    ]


def _preimage_doc(uuid_bytes: bytes, key: int, index: int, image: Any) -> dict[str, Any]:
    ts = Timestamp(key >> 32, key & 0xFFFFFFFF)
    return {
        "_id": {"nsUUID": Binary(uuid_bytes, 4), "ts": ts, "applyOpsIndex": Int64(index)},
        "operationTime": datetime.datetime.fromtimestamp(ts.time, datetime.UTC),
        "preImage": image,
    }


class ReadCommands(MemberCore):
    """The read commands of a member."""

    def _preimage_docs(self, filt: dict[str, Any]) -> list[dict[str, Any]]:
        """config.system.preimages as the server keeps it: {_id: {nsUUID, ts, applyOpsIndex},
        operationTime, preImage}; an `_id: {$in: [...]}` or `_id: {...}` filter is looked up
        directly."""
        keys = _preimage_keys(filt.get("_id"))
        out = []
        for image_key in list(self.applier.images) if keys is None else keys:
            images = self.applier.images.get(image_key)
            if images is not None and images[0] is not None:
                out.append(_preimage_doc(*image_key, images[0]))
        return out

    async def cmd_find(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['find']}"
        if ns == OPLOG_NS:
            return await self._find_oplog(cmd)
        if ns == PREIMAGES_NS:
            return await self._find_preimages(ns, cmd)
        docs = self.select(
            ns,
            cmd.get("filter", {}),
            sort=cmd.get("sort"),
            skip=cmd.get("skip", 0),
            limit=cmd.get("limit", 0),
            projection=cmd.get("projection"),
        )
        if cmd.get("singleBatch"):
            docs = docs[: cmd.get("batchSize", 101) or None]
        return {"cursor": await self.cursors.first_batch(Cursor(ns, docs), cmd.get("batchSize"))}

    async def _find_preimages(self, ns: str, cmd: dict[str, Any]) -> dict[str, Any]:
        """A find on config.system.preimages: the recorded images as the server stores them."""
        filt = cmd.get("filter") or {}
        docs = [d for d in self._preimage_docs(filt) if q.matches(d, filt)]
        return {"cursor": await self.cursors.first_batch(Cursor(ns, docs), cmd.get("batchSize"))}

    async def _find_oplog(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """A (tailable, awaitData) find on local.oplog.rs; its `ts` condition (`$gt`, `$gte`, `$lt`,
        `$lte` or a timestamp) bounds the scan, as the server bounds an oplog scan by record id."""
        filt = cmd.get("filter", {})
        cond = filt.get("ts", {})
        oplog = self.oplog
        position, upper = _ts_bounds(cond)
        # A scan that starts before the oldest entry starts at the oldest entry; only a cursor whose
        # position is truncated away later dies with CappedPositionLost.
        position = max(position, oplog.truncated_before)
        rest = {k: v for k, v in filt.items() if k != "ts"}
        tailable = bool(cmd.get("tailable"))
        remaining = cmd.get("limit") or 0
        # Oplog entries are as visible as the writes they record (SERVER-23186): a majority read
        # sees nothing past the commit point, so nothing it returns can be rolled back.
        majority = (cmd.get("readConcern") or {}).get("level") == "majority"

        async def fetch(limit: int, deadline: float) -> list[Any]:
            nonlocal position
            if oplog.truncated_before and position < oplog.truncated_before:
                raise MongoError(
                    "CappedPositionLost",
                    "CollectionScan died due to position in capped collection being deleted",
                )
            nonlocal remaining
            while True:
                upto = self.commit_key() if majority else None
                if upper is not None:
                    upto = upper if upto is None else min(upto, upper)
                raws = oplog.read_after(
                    position, min(limit, remaining) if remaining else limit, upto=upto
                )
                if cmd.get("limit"):
                    if not remaining:
                        return []
                    remaining -= len(raws)
                if raws:
                    position = oplog.entry_key(raws[-1])
                    if rest:
                        return [
                            bson.decode(r, DECODE)
                            for r in raws
                            if q.matches(bson.decode(r, DECODE), rest)
                        ]
                    return RawBatch(raws)
                if not tailable:
                    return []
                waited = self.wait_commit_beyond if majority else oplog.wait_beyond
                if not await waited(position, deadline):
                    return []

        # A non-tailable scan ends (cursor id 0) once it has returned everything there is, its
        # `limit`, or its first batch if that is all it asked for (singleBatch), as on a server:
        # no cursor is left open, to time out.
        def done() -> bool:
            return (
                bool(cmd.get("singleBatch"))
                or (bool(cmd.get("limit")) and not remaining)
                or position >= min(oplog.last_key(), upper or 1 << 64)
            )

        cursor = Cursor(
            OPLOG_NS,
            fetch=fetch,
            tailable=tailable,
            await_data=bool(cmd.get("awaitData")),
            done=None if tailable else done,
        )
        return {"cursor": await self.cursors.first_batch(cursor, cmd.get("batchSize"))}

    async def cmd_count(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        return {
            "n": len(
                self.select(
                    f"{db}.{cmd['count']}",
                    cmd.get("query") or {},
                    skip=cmd.get("skip", 0),
                    limit=cmd.get("limit", 0),
                )
            )
        }

    async def cmd_distinct(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        return {
            "values": q.distinct_values(
                self.select(f"{db}.{cmd['distinct']}", cmd.get("query") or {}), cmd["key"]
            )
        }

    async def cmd_aggregate(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        coll = cmd["aggregate"]
        ns = f"{db}.{coll}" if isinstance(coll, str) else f"{db}.$cmd.aggregate"
        pipeline = cmd.get("pipeline", [])
        if pipeline and "$changeStream" in pipeline[0]:
            from simcluster.native_stream import open_native_stream

            def lookup(ns: str, key: dict[str, Any]) -> Any:
                found = self.select(ns, key, limit=1)
                return found[0] if found else None

            def is_view(ns: str) -> bool:
                coll = self.dbs.get(db, {}).get(ns.partition(".")[2])
                return coll is not None and "viewOn" in coll.options

            return await open_native_stream(self, db, cmd, [self], lookup, is_view=is_view)
        docs = self.select(ns, {}) if isinstance(coll, str) else []
        out = run_pipeline(docs, pipeline)
        return {
            "cursor": await self.cursors.first_batch(
                Cursor(ns, out), cmd.get("cursor", {}).get("batchSize")
            )
        }

    async def cmd_list_databases(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        dbs = [
            {"name": n, "sizeOnDisk": Int64(4096), "empty": not colls}
            for n, colls in sorted(self.dbs.items())
        ]
        if cmd.get("nameOnly"):
            dbs = [{"name": d["name"]} for d in dbs]
        return {"databases": dbs, "totalSize": Int64(4096 * len(dbs))}

    def collection_infos(self, db: str) -> list[dict[str, Any]]:
        out = []
        for name, coll in sorted(self.dbs.get(db, {}).items()):
            is_view = "viewOn" in coll.options
            # A time-series collection lists as its own type, writable (list_collections.cpp).
            kind = (
                ("timeseries" if "timeseries" in coll.options else "view")
                if is_view
                else "collection"
            )
            options = (
                {"timeseries": coll.options["timeseries"]}
                if kind == "timeseries"
                else dict(coll.options)
            )
            info: dict[str, Any] = {
                "name": name,
                "type": kind,
                "options": options,
                "info": {"readOnly": kind == "view"},
            }
            if not is_view:
                info["info"]["uuid"] = coll.ui
                info["idIndex"] = {"v": 2, "key": {"_id": 1}, "name": "_id_"}
            out.append(info)
        return out

    async def cmd_list_collections(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        infos = [i for i in self.collection_infos(db) if q.matches(i, cmd.get("filter") or {})]
        if cmd.get("nameOnly"):
            infos = [{"name": i["name"], "type": i["type"]} for i in infos]
        return {
            "cursor": await self.cursors.first_batch(
                Cursor(f"{db}.$cmd.listCollections", infos), cmd.get("cursor", {}).get("batchSize")
            )
        }

    async def cmd_list_indexes(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['listIndexes']}"
        coll = self.coll(ns)
        if coll is None:
            raise MongoError("NamespaceNotFound", f"ns does not exist: {ns}")
        specs = [dict(ix.spec) for ix in coll.indexes.values()]
        return {"cursor": await self.cursors.first_batch(Cursor(ns, specs), None)}

    async def cmd_db_stats(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        colls = self.dbs.get(db, {})
        return {
            "db": db,
            "collections": len(colls),
            "objects": sum(len(c.docs) for c in colls.values()),
        }

    async def cmd_coll_stats(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        coll = self.coll(f"{db}.{cmd['collStats']}")
        return {"ns": f"{db}.{cmd['collStats']}", "count": len(coll.docs) if coll else 0}
