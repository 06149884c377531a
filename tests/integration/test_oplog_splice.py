"""The fast oplog splice against the general transform on the oplog a real workload writes through
simcluster (tests/unit/test_oplog_splice.py pins it entry by entry)."""

from __future__ import annotations

from bson import Int64
from bson.raw_bson import RawBSONDocument

from mongoformats.change_events import RAW, OplogTransformer
from mongoformats.oplog_splice import splice_crud
from simcluster import SimCluster
from tests.conftest import client, sync


async def test_a_real_workload_oplog_splices_like_the_general_path(cluster: SimCluster) -> None:
    def work() -> None:
        c = client(cluster.uri)
        c.admin.command("enableSharding", "sp")
        c.admin.command("shardCollection", "sp.h", key={"_id": "hashed"})
        for i in range(40):
            c.sp.h.insert_one({"_id": i, "s": str(i)})
        c.sp.h.insert_many([{"_id": f"k{i}", "n": Int64(i)} for i in range(20)])
        c.sp.h.update_many({}, {"$inc": {"n": 1}, "$push": {"arr": {"$each": [1, 2]}}})
        c.sp.h.update_one({"_id": 3}, {"$unset": {"s": ""}, "$set": {"a.b": [1, {"c": 2}]}})
        c.sp.h.replace_one({"_id": 4}, {"z": 1})
        c.sp.h.delete_many({"_id": {"$lt": 10}})
        c.sp.plain.insert_one({"x": 1})
        c.sp.plain.create_index("x")
        c.sp.plain.drop()

    await sync(work)
    checked = spliced = 0
    for shard in cluster.shards.values():
        for expanded in (False, True):
            fast, slow = (
                OplogTransformer(show_expanded_events=expanded),
                OplogTransformer(show_expanded_events=expanded),
            )
            for raw in shard.oplog.read_after(0, 1 << 30):
                assert fast.transform(raw) == slow.transform_decoded(RawBSONDocument(raw, RAW))
                checked += 1
                spliced += bool(splice_crud(raw, expanded=expanded))
    assert checked > 200 and spliced > 150
