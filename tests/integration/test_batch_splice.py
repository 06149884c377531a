"""The batch splice takes every insert and delete a real workload writes through simcluster,
retryable writes included (tests/unit/test_batch_splice.py pins it to splice_crud byte for byte)."""

from __future__ import annotations

import bson

from simcluster import SimCluster
from tests.conftest import client, sync
from tests.unit.test_batch_splice import _same_as_one_by_one


async def test_a_real_workloads_inserts_and_deletes_are_all_taken(cluster: SimCluster) -> None:
    """Drivers' writes are retryable (lsid, txnNumber, stmtId, prevOpTime): taken too."""

    def work() -> None:
        c = client(cluster.uri)
        c.admin.command("enableSharding", "bs")
        c.admin.command("shardCollection", "bs.h", key={"_id": "hashed"})
        c.bs.h.insert_many([{"x": i} for i in range(200)])
        for i in range(20):
            c.bs.h.insert_one({"y": i})
        c.bs.plain.insert_many([{"x": i} for i in range(50)], ordered=False)
        c.bs.h.update_many({}, {"$inc": {"x": 1}})
        c.bs.h.delete_many({"x": {"$lt": 50}})
        c.bs.plain.delete_one({"x": 3})

    await sync(work)
    taken = 0
    for shard in cluster.shards.values():
        raws = shard.oplog.read_after(0, 1 << 30)
        plain = [
            raw
            for raw in raws
            if bson.decode(raw)["op"] in "id" and bson.decode(raw)["ns"].startswith("bs.")
        ]
        for expanded in (False, True):
            batch, _ = _same_as_one_by_one(raws, expanded)
            assert sum(1 for item in batch if item) >= len(plain)
        taken += len(plain)
    assert taken >= 270 + 50 + 1
