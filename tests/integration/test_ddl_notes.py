"""The DDL-noop path: DDL a pre-6.0 change stream cannot show still arrives, in order, once each.

Against simcluster in 5.0 mode (v1 tokens, no expanded events natively) the proxy records the
seven DDL kinds as appendOplogNote noops and the buckets turn them into events; against 8.0 the
native entries are used and the proxy writes no notes, so nothing doubles up.
"""

from __future__ import annotations

from typing import Any

import bson
import pytest
import trio
from pymongo.errors import OperationFailure

from mongoformats.change_events import PCS_NOTE_KEY
from mongoformats.resume_token import decode_token
from simcluster import open_cluster
from tests.conftest import _close_all, client, proxy_uri, sync
from tests.integration.test_engine import drain, end_point
from wireproxy.app import serve_proxy
from wireproxy.config import ProxyConfig

# The seven kinds; sharding a new collection also creates it, so a create precedes shardCollection.
EXPECTED = [
    "create",
    "createIndexes",
    "modify",
    "dropIndexes",
    "create",
    "drop",
    "create",
    "shardCollection",
]


def ddl_workload(c: Any) -> None:
    """The seven kinds, each through the proxy, on collections with one holder so each is one
    event."""
    c.d.create_collection("plain", validationLevel="off")
    c.d.plain.insert_one({"_id": 1, "a": 1})
    c.d.plain.create_index("a")
    c.d.command({"collMod": "plain", "validationLevel": "moderate"})
    c.d.plain.drop_index("a_1")
    c.d.command({"create": "v", "viewOn": "plain", "pipeline": [{"$match": {"a": 1}}]})
    c.d.drop_collection("v")
    c.admin.command("enableSharding", "d")
    c.admin.command("shardCollection", "d.sharded", key={"k": 1})
    c.d.plain.insert_one({"_id": 2})


@pytest.mark.parametrize("version", ["5.0", "8.0"])
async def test_ddl_kinds_arrive_once_each_in_order(version: str) -> None:
    async with open_cluster(shards=2, version=version) as cluster, trio.open_nursery() as nursery:
        proxy = await nursery.start(serve_proxy, ProxyConfig(upstream=cluster.uri, listen_port=0))

        def work() -> None:
            c = client(proxy_uri(proxy))
            opened = c.admin.command(
                {"parallelChangeStream": 1, "nBuckets": 2, "showExpandedEvents": True}
            )
            ddl_workload(c)
            end = end_point(c)
            events = sorted(
                (e for cur in opened["cursors"] for e in drain(c, cur["id"], end)),
                key=lambda e: bytes.fromhex(e["_id"]["_data"]),
            )
            on_d = [e for e in events if e["ns"]["db"] == "d"]
            kinds = [e["operationType"] for e in on_d if e["operationType"] not in ("insert",)]
            # 7.0+ oplogs: sharding a new collection also logs its shard key index's createIndexes
            # (D14a); the 5.0 path's notes come from the client's commands, which name no index.
            expected = (
                EXPECTED
                if version == "5.0"
                else [*EXPECTED[:-1], "createIndexes", "shardCollection"]
            )
            assert kinds == expected, kinds
            assert [e["operationType"] for e in on_d][:3] == [
                "create",
                "insert",
                "createIndexes",
            ]  # in place
            index = next(e for e in on_d if e["operationType"] == "createIndexes")
            assert dict(index["operationDescription"]["indexes"][0]["key"]) == {"a": 1}
            modify = next(e for e in on_d if e["operationType"] == "modify")
            assert dict(modify["operationDescription"]) == {"validationLevel": "moderate"}
            notes = sum(
                1
                for node in cluster.shards.values()
                for raw in node.oplog.read_after(0, 1 << 30)
                if PCS_NOTE_KEY in bson.decode(raw).get("o", {})
            )
            assert notes == (8 if version == "5.0" else 0)  # 8.0: the native entries, and no notes
            assert all(
                decode_token(e["_id"]).version == 2 for e in events
            )  # the proxy speaks 7.0/8.0 tokens

        try:
            await sync(work)
        finally:
            await sync(_close_all)
            nursery.cancel_scope.cancel()


async def test_a_5_0_native_stream_has_v1_tokens_and_no_expanded_events() -> None:
    async with open_cluster(shards=1, version="5.0") as cluster:

        def work() -> None:
            c = client(cluster.uri)
            with pytest.raises(OperationFailure) as info:
                c.d.c.watch(show_expanded_events=True).try_next()
            assert info.value.code == 40415
            with c.d.c.watch() as stream:
                c.d.c.insert_one({"_id": 1})
                event = stream.next()
            assert decode_token(event["_id"]).version == 1
            _close_all()

        await sync(work)
