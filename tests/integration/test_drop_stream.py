"""`{dropParallelChangeStream: name}`: a stream closed by name, its cursors killed and its memory
back in the proxy's pool at once.

Codes as the server's: a getMore waiting on a killed cursor fails with CursorKilled (237) and a
later one with CursorNotFound (43), as after killCursors (tests/integration/test_engine.py checks
those against mongos's behaviour); a name no stream has is NamespaceNotFound (26), as `drop` of a
missing collection on servers before 7.0 and parallelChangeStreamStatus here; another user's stream
is Unauthorized (13), as every other use of it (buckets/engine.py's module docstring).
"""

from __future__ import annotations

import pytest
import trio
from pymongo.errors import OperationFailure

from simcluster import open_cluster
from tests.conftest import _close_all, client, poll_until, proxy_uri, sync
from tests.integration.test_auth import USERS, with_user
from wireproxy.app import serve_proxy
from wireproxy.config import ProxyConfig
from wireproxy.upstream import open_upstream

NS = "$cmd.parallelChangeStream"


def _counted(status: dict) -> int:
    """What the streams count against the memory limit (the shared reader processes aside)."""
    memory = status["memory"]
    return memory["reservedBytes"] - memory["readerProcessBytes"]


async def test_a_dropped_stream_kills_its_cursors_and_frees_its_memory(cluster, proxy):
    conn = await open_upstream("127.0.0.1", proxy.port)
    before = await conn.command("admin", {"parallelChangeStreamStatus": 1})
    opened = await conn.command(
        "admin", {"parallelChangeStream": 1, "nBuckets": 2, "name": "dropme"}
    )
    parked, other = (cur["id"] for cur in opened["cursors"])
    c = client(proxy_uri(proxy))
    await sync(c.d.c.insert_many, [{"_id": i, "pad": "x" * 500} for i in range(200)])
    stream = proxy.engine.streams["dropme"]
    await poll_until(lambda: stream.events_merged >= 200, 30)
    held = await conn.command("admin", {"parallelChangeStreamStatus": 1})
    assert _counted(held) > _counted(before)
    outcome: dict = {}

    async def get_more() -> None:
        waiter = await open_upstream("127.0.0.1", proxy.port)
        # Read to the end first, so that the next getMore waits for events.
        reply = await waiter.command("admin", {"getMore": parked, "collection": NS, "maxTimeMS": 0})
        reply = await waiter.command(
            "admin", {"getMore": parked, "collection": NS, "maxTimeMS": 30_000}, check=False
        )
        outcome.update(
            code=reply.get("code"), events=len(reply.get("cursor", {}).get("nextBatch", []))
        )
        await waiter.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(get_more)
        await poll_until(
            lambda: (
                proxy.engine.cursors[parked].busy and proxy.engine.cursors[parked].bucket.waiting
            ),
            10,
        )
        dropped = await conn.command("admin", {"dropParallelChangeStream": "dropme"})
    assert sorted(dropped["cursorsKilled"]) == sorted([parked, other])
    # (An idle bucket's getMore returns once its resume point moves, ~1 s: rarely, just before the
    # drop.)
    if outcome["code"] is not None:
        assert outcome["code"] == 237  # CursorKilled
    after = await conn.command("admin", {"parallelChangeStreamStatus": 1})
    assert _counted(after) == _counted(before), "its memory is back in the pool at once"
    assert "dropme" not in proxy.engine.streams

    def later() -> None:
        with pytest.raises(OperationFailure) as info:
            c.admin.command({"getMore": other, "collection": NS, "maxTimeMS": 0})
        assert info.value.code == 43  # CursorNotFound, as after killCursors
        for cmd in (
            {"dropParallelChangeStream": "dropme"},
            {"parallelChangeStreamStatus": 1, "name": "dropme"},
        ):
            with pytest.raises(OperationFailure) as info:
                c.admin.command(cmd)
            assert info.value.code == 26  # NamespaceNotFound
        with pytest.raises(OperationFailure) as info:
            c.admin.command({"dropParallelChangeStream": 1})
        assert info.value.code == 14  # TypeMismatch
        with pytest.raises(OperationFailure) as info:
            c.other.command({"dropParallelChangeStream": "x"})
        assert info.value.code == 13  # admin only, as parallelChangeStream
        # The name is free again.
        c.admin.command({"parallelChangeStream": 1, "nBuckets": 1, "name": "dropme"})
        c.admin.command({"dropParallelChangeStream": "dropme"})

    await sync(later)
    await conn.aclose()
    await sync(_close_all)


async def test_only_the_creator_drops_a_stream():
    async with open_cluster(shards=1, users=USERS) as cluster, trio.open_nursery() as nursery:
        proxy = await nursery.start(
            serve_proxy,
            ProxyConfig(upstream=with_user(cluster.uri, "cdc", "proxy-pw"), listen_port=0),
        )
        base = f"mongodb://127.0.0.1:{proxy.port}/"

        def work() -> None:
            alice = client(with_user(base, "alice", "alice-pw"))
            bob = client(with_user(base, "bob", "bob-pw"))
            alice.admin.command({"parallelChangeStream": 1, "nBuckets": 1, "name": "alices"})
            with pytest.raises(OperationFailure) as info:
                bob.admin.command({"dropParallelChangeStream": "alices"})
            assert info.value.code == 13
            assert "alices" in proxy.engine.streams
            alice.admin.command({"dropParallelChangeStream": "alices"})
            assert "alices" not in proxy.engine.streams

        await sync(work)
        await sync(_close_all)
        nursery.cancel_scope.cancel()
