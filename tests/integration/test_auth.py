"""Authentication end to end: simcluster requiring SCRAM-SHA-256, clients logging in through the
proxy (their conversation passes through to mongos), and the engine reading the shards with the
proxy's own credentials from its upstream URI. Cursors belong to the user who opened them."""

from __future__ import annotations

import pytest
import trio
from pymongo.errors import OperationFailure

from simcluster import open_cluster
from tests.conftest import _close_all, client, sync
from tests.integration.test_engine import NS, drain, end_point
from wireproxy.app import serve_proxy
from wireproxy.config import ProxyConfig

USERS = {"alice": "alice-pw", "bob": "bob-pw", "cdc": "proxy-pw"}


def with_user(uri: str, user: str, password: str) -> str:
    return uri.replace("mongodb://", f"mongodb://{user}:{password}@", 1)


async def test_logins_pass_through_and_the_engine_uses_its_own():
    async with open_cluster(shards=2, users=USERS) as cluster, trio.open_nursery() as nursery:
        proxy = await nursery.start(
            serve_proxy,
            ProxyConfig(upstream=with_user(cluster.uri, "cdc", "proxy-pw"), listen_port=0),
        )
        wrong = await nursery.start(
            serve_proxy, ProxyConfig(upstream=with_user(cluster.uri, "cdc", "nope"), listen_port=0)
        )
        base = f"mongodb://127.0.0.1:{proxy.port}/"

        def work() -> None:
            anonymous = client(base)
            with pytest.raises(OperationFailure) as info:
                anonymous.t.c.find_one()  # mongos refuses it on the client's own connection
            assert info.value.code == 13
            with pytest.raises(OperationFailure) as info:
                anonymous.admin.command(
                    {"parallelChangeStream": 1, "nBuckets": 1}
                )  # and so does the engine
            assert info.value.code == 13
            with pytest.raises(OperationFailure) as info:
                client(with_user(base, "alice", "wrong")).admin.command("ping")
            assert info.value.code == 18

            alice = client(with_user(base, "alice", "alice-pw"))
            status = alice.admin.command("connectionStatus")["authInfo"]["authenticatedUsers"]
            assert status == [{"user": "alice", "db": "admin"}]
            # Read in a reader process, which logs in as the engine too.
            opened = alice.admin.command(
                {"parallelChangeStream": 1, "nBuckets": 1, "name": "mine", "readerProcesses": 1}
            )
            alice.t.c.insert_many([{"_id": i} for i in range(50)])
            events = drain(
                alice, opened["cursors"][0]["id"], end_point(alice)
            )  # shards read as "cdc"
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


async def test_users_get_only_the_change_streams_their_roles_allow():
    """A user with `read` on one database: mongos (simcluster) lets it watch that database and
    nothing wider, and so does the proxy, which asks the client's own connection for its
    privileges; the engine itself reads the shards as the proxy's user, which may read all."""
    roles = {"reader": [("read", "shop")]}
    async with (
        open_cluster(shards=2, users=USERS | {"reader": "reader-pw"}, roles=roles) as cluster,
        trio.open_nursery() as nursery,
    ):
        proxy = await nursery.start(
            serve_proxy,
            ProxyConfig(
                upstream=with_user(cluster.uri, "cdc", "proxy-pw"),
                listen_port=0,
                accelerate_change_streams=True,
            ),
        )
        base = f"mongodb://127.0.0.1:{proxy.port}/"

        def work() -> None:
            direct = client(with_user(cluster.uri, "reader", "reader-pw"))
            privileges = direct.admin.command("connectionStatus", showPrivileges=True)["authInfo"]
            assert privileges["authenticatedUserRoles"] == [{"role": "read", "db": "shop"}]
            assert [p["resource"] for p in privileges["authenticatedUserPrivileges"]] == [
                {"db": "shop", "collection": ""}
            ]
            with pytest.raises(OperationFailure) as info:
                direct.shop.orders.insert_one({"_id": 0})  # read only
            assert info.value.code == 13
            with pytest.raises(OperationFailure) as info:
                direct.other.c.find_one()
            assert info.value.code == 13

            reader = client(with_user(base, "reader", "reader-pw"))
            with pytest.raises(OperationFailure) as info:
                reader.admin.command(
                    {"parallelChangeStream": 1, "nBuckets": 1}
                )  # reads every database
            assert info.value.code == 13
            for scope in (
                lambda c: c.watch(),
                lambda c: c.other.watch(),
                lambda c: c.other.c.watch(),
            ):
                with pytest.raises(OperationFailure) as native, scope(direct):
                    pass
                with pytest.raises(OperationFailure) as proxied, scope(reader):
                    pass
                assert proxied.value.code == native.value.code == 13
                assert proxied.value.details["errmsg"] == native.value.details["errmsg"]

            alice = client(with_user(base, "alice", "alice-pw"))  # root
            with reader.shop.watch() as db_stream, reader.shop.orders.watch() as coll_stream:
                alice.shop.orders.insert_many([{"_id": i} for i in range(5)])
                alice.other.c.insert_one({"_id": "not for the reader"})
                alice.shop.orders.insert_one({"_id": "end"})
                for stream in (db_stream, coll_stream):
                    ids = []
                    while not ids or ids[-1] != "end":
                        ev = stream.try_next()
                        if ev is not None:
                            ids.append(ev["documentKey"]["_id"])
                    assert ids == [0, 1, 2, 3, 4, "end"]
                served = alice.admin.command({"parallelChangeStreamStatus": 1})["cursors"]
                assert served == 2, "the engine serves the reader's streams"

        await sync(work)
        await sync(_close_all)
        nursery.cancel_scope.cancel()
