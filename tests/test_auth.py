"""Authentication end to end: simcluster requiring SCRAM-SHA-256, clients logging in through the
proxy (their conversation passes through to mongos), and the engine reading the shards with the
proxy's own credentials from its upstream URI. Cursors belong to the user who opened them."""

from __future__ import annotations

import pytest
import trio
from pymongo.errors import OperationFailure

from simcluster import open_cluster
from tests.conftest import _close_all, client, sync
from tests.test_engine import NS, drain, end_point
from wireproxy.app import serve_proxy
from wireproxy.config import ProxyConfig

USERS = {"alice": "alice-pw", "bob": "bob-pw", "cdc": "proxy-pw"}


def with_user(uri: str, user: str, password: str) -> str:
    return uri.replace("mongodb://", f"mongodb://{user}:{password}@", 1)


async def test_logins_pass_through_and_the_engine_uses_its_own():
    async with open_cluster(shards=2, users=USERS) as cluster, trio.open_nursery() as nursery:
        proxy = await nursery.start(serve_proxy, ProxyConfig(upstream=with_user(cluster.uri, "cdc", "proxy-pw"),
                                                             listen_port=0))
        wrong = await nursery.start(serve_proxy, ProxyConfig(upstream=with_user(cluster.uri, "cdc", "nope"),
                                                             listen_port=0))
        base = f"mongodb://127.0.0.1:{proxy.port}/"

        def work() -> None:
            anonymous = client(base)
            with pytest.raises(OperationFailure) as info:
                anonymous.t.c.find_one()  # mongos refuses it on the client's own connection
            assert info.value.code == 13
            with pytest.raises(OperationFailure) as info:
                anonymous.admin.command({"parallelChangeStream": 1, "nBuckets": 1})  # and so does the engine
            assert info.value.code == 13
            with pytest.raises(OperationFailure) as info:
                client(with_user(base, "alice", "wrong")).admin.command("ping")
            assert info.value.code == 18

            alice = client(with_user(base, "alice", "alice-pw"))
            status = alice.admin.command("connectionStatus")["authInfo"]["authenticatedUsers"]
            assert status == [{"user": "alice", "db": "admin"}]
            opened = alice.admin.command({"parallelChangeStream": 1, "nBuckets": 1, "name": "mine"})
            alice.t.c.insert_many([{"_id": i} for i in range(50)])
            events = drain(alice, opened["cursors"][0]["id"], end_point(alice))  # shards read as "cdc"
            assert [e["documentKey"]["_id"] for e in events] == list(range(50))

            bob = client(with_user(base, "bob", "bob-pw"))
            with pytest.raises(OperationFailure) as info:
                bob.admin.command({"getMore": opened["cursors"][0]["id"], "collection": NS})
            assert info.value.code == 13 and "authenticated user" in str(info.value)

            # The proxy's own login is refused: opening a stream says so, with the server's code.
            carol = client(with_user(f"mongodb://127.0.0.1:{wrong.port}/", "alice", "alice-pw"))
            with pytest.raises(OperationFailure) as info:
                carol.admin.command({"parallelChangeStream": 1, "nBuckets": 1})
            assert info.value.code == 18
        await sync(work)
        await sync(_close_all)
        nursery.cancel_scope.cancel()
