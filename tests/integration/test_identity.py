"""Who the client is, and what that lets it do: the proxy's identity comes from mongos only,
streams and cursors belong to their users, privileges follow the server's built-in roles, and
gossiped cluster time is signed. Real sockets, unmodified pymongo, simcluster with auth on;
commands a driver would never send (forged `$clusterTime`, interleaved SASL conversations) go
over a raw socket or through pymongo's generic `command`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import bson
import pytest
import trio
from bson import Binary, Int64, Timestamp
from pymongo.errors import OperationFailure

from mongoformats import wire
from mongoformats.scram import MECHANISM, ScramClient
from mongoformats.sessions import user_digest
from simcluster import SimCluster, open_cluster
from tests.conftest import _close_all, client, sync
from tests.integration.test_engine import NS
from wireproxy.app import RunningProxy, serve_proxy
from wireproxy.config import ProxyConfig

PASSWORDS = {
    "alice": "alice-pw",
    "bob": "bob-pw",
    "carol": "carol-pw",
    "monitor": "monitor-pw",
    "ops": "ops-pw",
    "cdc": "proxy-pw",
}
# alice and cdc: root (simcluster's default); the others built-in roles only.
ROLES = {
    "bob": [("read", "shop")],
    "carol": [("readAnyDatabase", "admin")],
    "monitor": [("clusterMonitor", "admin"), ("readAnyDatabase", "admin")],
    "ops": [("hostManager", "admin"), ("readAnyDatabase", "admin")],
}


def with_user(uri: str, user: str) -> str:
    return uri.replace("mongodb://", f"mongodb://{user}:{PASSWORDS[user]}@", 1)


@asynccontextmanager
async def secured() -> AsyncIterator[tuple[SimCluster, RunningProxy]]:
    """A cluster requiring authentication and a proxy logging in as `cdc`."""
    async with (
        open_cluster(shards=2, users=PASSWORDS, roles=ROLES) as cluster,
        trio.open_nursery() as nursery,
    ):
        proxy = await nursery.start(
            serve_proxy, ProxyConfig(upstream=with_user(cluster.uri, "cdc"), listen_port=0)
        )
        yield cluster, proxy
        await sync(_close_all)
        nursery.cancel_scope.cancel()


def through(proxy: RunningProxy, user: str | None = None, **kwargs: Any) -> Any:
    base = f"mongodb://127.0.0.1:{proxy.port}/"
    return client(with_user(base, user) if user else base, **kwargs)


def code_of(fn: Any, *args: Any, **kwargs: Any) -> int:
    with pytest.raises(OperationFailure) as info:
        fn(*args, **kwargs)
    return int(info.value.code)  # type: ignore[arg-type]


async def test_identity_comes_from_mongos_not_from_the_login_messages():
    """bob (read on one database) starts his SCRAM conversation, opens a second one naming alice,
    then completes his own: mongos has bob logged in, and so must the proxy, although the last
    login message named alice. An empty saslContinue after a saslStart naming alice logs nobody
    in. Neither may read or kill alice's cursors. After logout, and after a failed
    re-authentication, the proxy again knows exactly what mongos says."""
    async with secured() as (cluster, proxy):

        def work() -> None:
            alice = through(proxy, "alice")
            opened = alice.admin.command({"parallelChangeStream": 1, "nBuckets": 1, "name": "hers"})
            hers = opened["cursors"][0]["id"]

            # One connection (maxPoolSize 1), so every command below shares its upstream login.
            mallory = through(proxy, maxPoolSize=1)
            bob = ScramClient("bob", PASSWORDS["bob"])
            his = mallory.admin.command(
                {
                    "saslStart": 1,
                    "mechanism": MECHANISM,
                    "payload": Binary(bob.first(), 0),
                    "options": {"skipEmptyExchange": True},
                }
            )
            mallory.admin.command(
                {
                    "saslStart": 1,
                    "mechanism": MECHANISM,
                    "payload": Binary(b"n,,n=alice,r=abcdefghijklmnop", 0),
                }
            )
            done = mallory.admin.command(
                {
                    "saslContinue": 1,
                    "conversationId": his["conversationId"],
                    "payload": Binary(bob.final(bytes(his["payload"])), 0),
                }
            )
            assert done["done"]
            who = mallory.admin.command("connectionStatus")["authInfo"]["authenticatedUsers"]
            assert who == [{"user": "bob", "db": "admin"}]
            # The proxy's idea of each connection's user: alice's one connection, and bob.
            assert sorted(s.user for s in proxy.server.sessions if s.user) == [
                "alice@admin",
                "bob@admin",
            ]
            assert code_of(mallory.admin.command, {"getMore": hers, "collection": NS}) == 13
            assert code_of(mallory.admin.command, {"killCursors": NS, "cursors": [hers]}) == 13
            assert mallory.admin.command({"parallelChangeStreamStatus": 1})["streams"] == []
            alice.admin.command({"getMore": hers, "collection": NS, "maxTimeMS": 10})  # hers, alive

            # A failed re-authentication leaves bob logged in (as mongos says); logout, nobody.
            failed = ScramClient("alice", "wrong")
            step = mallory.admin.command(
                {"saslStart": 1, "mechanism": MECHANISM, "payload": Binary(failed.first(), 0)}
            )
            assert (
                code_of(
                    mallory.admin.command,
                    {
                        "saslContinue": 1,
                        "conversationId": step["conversationId"],
                        "payload": Binary(failed.final(bytes(step["payload"])), 0),
                    },
                )
                == 18
            )
            assert code_of(mallory.admin.command, {"getMore": hers, "collection": NS}) == 13
            mallory.admin.command("logout")
            assert code_of(mallory.admin.command, {"parallelChangeStreamStatus": 1}) == 13

            eve = through(proxy, maxPoolSize=1)
            start = eve.admin.command(
                {
                    "saslStart": 1,
                    "mechanism": MECHANISM,
                    "payload": Binary(b"n,,n=alice,r=abcdefghijklmnop", 0),
                }
            )
            assert (
                code_of(
                    eve.admin.command,
                    {
                        "saslContinue": 1,
                        "conversationId": start["conversationId"],
                        "payload": Binary(b"", 0),
                    },
                )
                == 18
            )
            assert code_of(eve.admin.command, {"getMore": hers, "collection": NS}) == 13
            assert code_of(eve.admin.command, {"parallelChangeStreamStatus": 1}) == 13

        await sync(work)


async def test_named_streams_belong_to_their_creator():
    """carol may open parallel change streams, but not join, attach to, reopen with another
    nBuckets, or ask about alice's; the status lists each user's own streams and cursors, all of
    them for a user holding `inprog` (clusterMonitor)."""
    async with secured() as (cluster, proxy):

        def work() -> None:
            alice, carol, monitor = (
                through(proxy, "alice"),
                through(proxy, "carol"),
                through(proxy, "monitor"),
            )
            opened = alice.admin.command({"parallelChangeStream": 1, "nBuckets": 2, "name": "hers"})
            for attempt in (
                {"parallelChangeStream": 1, "nBuckets": 2, "name": "hers"},
                {"parallelChangeStream": 1, "nBuckets": 3, "name": "hers"},
                {"parallelChangeStream": 1, "name": "hers", "bucket": 0},
                {"parallelChangeStreamStatus": 1, "name": "hers"},
            ):
                assert code_of(carol.admin.command, attempt) == 13, attempt
            carol.admin.command({"parallelChangeStream": 1, "nBuckets": 1, "name": "mine"})
            listed = carol.admin.command({"parallelChangeStreamStatus": 1})
            assert [s["name"] for s in listed["streams"]] == ["mine"] and listed["cursors"] == 1
            listed = alice.admin.command({"parallelChangeStreamStatus": 1})  # root holds inprog too
            assert [s["name"] for s in listed["streams"]] == ["hers", "mine"] and listed[
                "cursors"
            ] == 3
            listed = monitor.admin.command({"parallelChangeStreamStatus": 1})
            assert [s["name"] for s in listed["streams"]] == ["hers", "mine"] and listed[
                "cursors"
            ] == 3
            for cursor in opened["cursors"]:  # still hers, still open
                alice.admin.command({"getMore": cursor["id"], "collection": NS, "maxTimeMS": 10})

        await sync(work)


async def test_kill_cursors_checks_the_user_not_the_session():
    """As mongos: a cursor's own user kills it from another session (a driver's session pool
    hands out another one) or from none; another user may not, unless it holds killAnyCursor
    (hostManager)."""
    async with secured() as (cluster, proxy):

        def work() -> None:
            alice, carol, ops = (
                through(proxy, "alice"),
                through(proxy, "carol"),
                through(proxy, "ops"),
            )
            with alice.start_session() as s1, alice.start_session() as s2:  # both open: two lsids
                ids = [
                    c["id"]
                    for c in alice.admin.command(
                        {"parallelChangeStream": 1, "nBuckets": 3}, session=s1
                    )["cursors"]
                ]
                assert alice.admin.command({"killCursors": NS, "cursors": [ids[0]]}, session=s2)[
                    "cursorsKilled"
                ] == [ids[0]]
            assert code_of(carol.admin.command, {"killCursors": NS, "cursors": [ids[1]]}) == 13
            assert ops.admin.command({"killCursors": NS, "cursors": [ids[1]]})["cursorsKilled"] == [
                ids[1]
            ]
            assert alice.admin.command({"killCursors": NS, "cursors": [ids[2]]})[
                "cursorsKilled"
            ] == [ids[2]]

        await sync(work)


async def test_admin_commands_need_the_built_in_roles_privileges():
    """Against mongos directly and through the proxy: killAllSessions and
    killAllSessionsByPattern need killAnySession (hostManager); a read role may not run them, nor
    read or change server parameters and logs. killSessions with another user's session id kills
    it only for a holder of killAnySession (kill_sessions_command.cpp, makeLogicalSessionIds)."""
    async with secured() as (cluster, proxy):

        def work() -> None:
            direct_bob = client(with_user(cluster.uri, "bob"))
            for bob in (direct_bob, through(proxy, "bob")):
                for cmd in (
                    {"killAllSessions": []},
                    {"killAllSessions": [{"user": "alice", "db": "admin"}]},
                    {"killAllSessionsByPattern": []},
                    {"getParameter": "*"},
                    {"setParameter": 1, "cursorTimeoutMillis": 1000},
                    {"getCmdLineOpts": 1},
                    {"hostInfo": 1},
                    {"getLog": "global"},
                    {"balancerStop": 1},
                    {"balancerStatus": 1},
                    {"moveChunk": "shop.orders", "find": {"_id": 0}, "to": "shard1"},
                ):
                    assert code_of(bob.admin.command, cmd) == 13, cmd
            monitor = client(with_user(cluster.uri, "monitor"))
            monitor.admin.command("getParameter", "*")
            monitor.admin.command("balancerStatus")  # clusterMonitor reads config
            assert (
                code_of(monitor.admin.command, {"setParameter": 1, "cursorTimeoutMillis": 1000})
                == 13
            )
            through(proxy, "ops").admin.command({"killAllSessions": []})

            alice = client(with_user(cluster.uri, "alice"))
            alice.shop.orders.insert_many([{"_id": i} for i in range(10)])
            with alice.start_session() as session:
                cursor = alice.shop.orders.find(batch_size=2, session=session)
                next(cursor)
                lsid = session.session_id
                direct_bob.admin.command(
                    {"killSessions": [lsid]}
                )  # only bob's own session of that id
                next(cursor), next(cursor)  # a getMore: alive
                client(with_user(cluster.uri, "ops")).admin.command({"killSessions": [lsid]})
                with pytest.raises(OperationFailure):
                    list(cursor)
            with alice.start_session() as session:
                cursor = alice.shop.orders.find(batch_size=2, session=session)
                next(cursor)
                pattern = {
                    "lsid": {"id": session.session_id["id"], "uid": user_digest("alice@admin")}
                }
                client(with_user(cluster.uri, "ops")).admin.command(
                    {"killAllSessionsByPattern": [pattern]}
                )
                with pytest.raises(OperationFailure):
                    list(cursor)

        await sync(work)


# -- $clusterTime ----------------------------------------------------------------------------------


class RawConnection:
    """One socket speaking OP_MSG, for commands no driver sends (forged cluster times)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.framer = wire.MessageFramer()
        self.ids = 0

    def command(self, doc: dict[str, Any]) -> dict[str, Any]:
        self.ids += 1
        self.sock.sendall(wire.encode_op_msg(self.ids, 0, bson.encode({**doc, "$db": "admin"})))
        while (msg := self.framer.next_message()) is wire.NEED_DATA:
            data = self.sock.recv(1 << 16)
            assert data, "connection closed"
            self.framer.receive_data(data)
        assert isinstance(msg, wire.OpMsg)
        return bson.decode(msg.body)

    def login(self, user: str) -> None:
        scram = ScramClient(user, PASSWORDS[user])
        first = self.command(
            {
                "saslStart": 1,
                "mechanism": MECHANISM,
                "payload": Binary(scram.first(), 0),
                "options": {"skipEmptyExchange": True},
            }
        )
        done = self.command(
            {
                "saslContinue": 1,
                "conversationId": first["conversationId"],
                "payload": Binary(scram.final(bytes(first["payload"])), 0),
            }
        )
        assert done["ok"] and done["done"], done

    def close(self) -> None:
        self.sock.close()


def forged(ts: Timestamp, digest: bytes = bytes(20), key_id: int = 0) -> dict[str, Any]:
    return {"clusterTime": ts, "signature": {"hash": Binary(digest, 0), "keyId": Int64(key_id)}}


async def test_gossiped_cluster_time_must_be_signed_when_auth_is_on():
    """jstests/auth/advance_cluster_time.js and
    jstests/sharding/advance_cluster_time_action_type.js: an unauthenticated client's unsigned
    (dummy-signed) time is ignored; a signature that does not match is TimeProofMismatch (204), an
    unknown key KeyNotFound (211), also for a logged-in user sending the dummy one. Signed times
    from the cluster's own replies go back unchanged, through the proxy too, which passes
    signatures through and makes none."""
    async with secured() as (cluster, proxy):
        far = Timestamp(int(time.mktime((2096, 1, 1, 0, 0, 0, 0, 0, 0))), 1)

        def work() -> None:
            for port in (cluster.mongos.port, proxy.port):
                anonymous = RawConnection(port)
                reply = anonymous.command({"ping": 1, "$clusterTime": forged(far)})
                assert reply["ok"] == 1 and cluster.clock.now().time < far.time
                key = cluster.mongos.time_key
                assert key is not None
                ahead = Timestamp(reply["$clusterTime"]["clusterTime"].time + 100, 0)
                reply = anonymous.command(
                    {"ping": 1, "$clusterTime": forged(ahead, os.urandom(20), key.key_id)}
                )
                assert reply["code"] == 204 and reply["codeName"] == "TimeProofMismatch"
                reply = anonymous.command(
                    {"ping": 1, "$clusterTime": forged(ahead, os.urandom(20), 12345)}
                )
                assert reply["code"] == 211
                anonymous.login("alice")
                assert anonymous.command({"ping": 1, "$clusterTime": forged(ahead)})["code"] == 211
                signed = anonymous.command({"ping": 1})["$clusterTime"]
                assert bytes(signed["signature"]["hash"]) == key.proof(signed["clusterTime"])
                assert signed["signature"]["keyId"] == key.key_id
                assert anonymous.command({"ping": 1, "$clusterTime": signed})["ok"] == 1
                # endSessions is one the proxy handles and forwards itself: the same checks.
                assert anonymous.command({"endSessions": [], "$clusterTime": signed})["ok"] == 1
                bad = forged(ahead, os.urandom(20), key.key_id)
                assert anonymous.command({"endSessions": [], "$clusterTime": bad})["code"] == 204
                anonymous.close()
            # pymongo gossips the signed times it receives: through the proxy they check out.
            alice = through(proxy, "alice")
            for i in range(3):
                alice.shop.orders.insert_one({"_id": i})
            assert alice.shop.orders.count_documents({}) == 3

        await sync(work)


async def test_without_auth_any_cluster_time_is_taken():
    """Without authorization every client may advance the clock (vector_clock.cpp: no validator
    checks), and replies carry the dummy signature."""
    async with open_cluster(shards=1) as cluster:

        def work() -> None:
            conn = RawConnection(cluster.mongos.port)
            now = conn.command({"ping": 1})["$clusterTime"]
            assert now["signature"] == {"hash": bytes(20), "keyId": 0}
            ahead = Timestamp(now["clusterTime"].time + 50, 0)
            assert conn.command({"ping": 1, "$clusterTime": forged(ahead)})["ok"] == 1
            assert cluster.clock.now().time >= ahead.time
            conn.close()

        await sync(work)


# -- credentials in what the proxy shows -----------------------------------------------------------


async def test_the_startup_log_shows_no_password():
    """`python -m wireproxy` logs its upstream at start: user and hosts, never the password."""
    async with open_cluster(shards=1, users=PASSWORDS) as cluster:
        uri = with_user(cluster.uri, "cdc")

        def run() -> str:
            with subprocess.Popen(
                [sys.executable, "-m", "wireproxy", "--upstream", uri, "--listen", "127.0.0.1:0"],
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": os.getcwd()},
            ) as proc:
                try:
                    assert proc.stderr is not None
                    for line in proc.stderr:
                        if "listening on" in line:
                            return line
                    raise AssertionError("the proxy exited before listening")
                finally:
                    proc.terminate()

        line = await sync(run, timeout=120)
        assert PASSWORDS["cdc"] not in line and "cdc:***@" in line
