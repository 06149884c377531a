"""wireproxy with unmodified pymongo (sync and async) against simcluster, over real sockets."""

from __future__ import annotations

import asyncio
import functools
import socket
import struct
import time

import bson
import pytest
import trio
from pymongo import AsyncMongoClient, CursorType, InsertOne, UpdateOne

from mongoformats import wire
from simcluster import open_cluster
from tests.conftest import client, free_port, proxy_uri, scrape, sync
from tests.integration.test_simcluster import exhaust_batches
from wireproxy.app import serve_proxy
from wireproxy.config import ProxyConfig
from wireproxy.server import ProxyServer


def test_wireproxy_command_reports_a_bad_setting_as_a_usage_error():
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-m", "wireproxy", "--reader-processes", "65"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "reader_processes must be between 0 and 64, not 65" in run.stderr
    assert "Traceback" not in run.stderr
    run = subprocess.run(
        [sys.executable, "-m", "wireproxy", "--listen-port", "abc"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        run.returncode == 2
        and "argument --listen-port: must be an integer, not 'abc'" in run.stderr
    )
    run = subprocess.run(
        [sys.executable, "-m", "wireproxy", "--help"], capture_output=True, text=True, timeout=60
    )
    # Every setting is a flag (made from ProxyConfig's fields).
    assert all(
        f"--{name.replace('_', '-')}" in run.stdout for name in ProxyConfig.__dataclass_fields__
    )


async def test_pymongo_crud_cursors_bulk_and_sessions(proxy):
    def work():
        c = client(proxy_uri(proxy), compressors="zlib")
        hello = c.admin.command("hello")
        assert hello["msg"] == "isdbgrid" and hello["maxWireVersion"] == 21
        coll = c.t.c
        coll.insert_many([{"_id": i, "g": i % 3} for i in range(2500)])
        assert len(list(coll.find({}, batch_size=100))) == 2500  # getMore passes through
        res = coll.bulk_write([InsertOne({"_id": -1}), UpdateOne({"_id": 1}, {"$set": {"x": 1}})])
        assert res.inserted_count == 1 and res.modified_count == 1
        with c.start_session() as s:
            coll.update_one({"_id": 2}, {"$set": {"y": 2}}, session=s)
            assert coll.find_one({"_id": 2}, session=s)["y"] == 2
        assert [
            d["_id"]
            for d in coll.aggregate(
                [{"$group": {"_id": "$g", "n": {"$sum": 1}}}, {"$sort": {"_id": 1}}]
            )
        ] == [None, 0, 1, 2]
        cur = coll.find({}, batch_size=10)
        next(cur)
        cur.close()  # killCursors passes through
        # A transaction across shards (hashed keys spread the documents), committed and aborted.
        c.admin.command("shardCollection", "t.h", key={"_id": "hashed"})
        with c.start_session() as s:
            s.with_transaction(
                lambda s: c.t.h.insert_many([{"_id": i} for i in range(20)], session=s)
            )
        with c.start_session() as s:
            s.start_transaction()
            c.t.h.insert_one({"_id": "gone"}, session=s)
            s.abort_transaction()
        assert c.t.h.count_documents({}) == 20

    await sync(work)


async def test_async_pymongo(proxy):
    # pymongo's async API runs on asyncio: give it its own loop on a worker thread.
    async def work():
        c = AsyncMongoClient(proxy_uri(proxy), serverSelectionTimeoutMS=5000)
        try:
            await c.a.b.insert_one({"_id": 1})
            async with c.start_session() as s, await s.start_transaction():
                await c.a.b.insert_one({"_id": 2}, session=s)
            await c.a.b.delete_one({"_id": 2})
            return await c.a.b.find_one({"_id": 1})
        finally:
            await c.close()

    assert await sync(asyncio.run, work()) == {"_id": 1}


async def test_an_exhaust_cursor_streams_through_the_proxy_from_a_mongos_that_streams():
    """Against an 8.0 mongos (exhaust getMore since 7.1): the proxy relays each streamed reply as
    it comes, moreToCome kept and each answering the last; pymongo's exhaust cursor reads
    through."""
    async with open_cluster(shards=2, version="8.0") as cluster, trio.open_nursery() as nursery:
        server = await nursery.start(serve_proxy, ProxyConfig(upstream=cluster.uri, listen_port=0))

        def work() -> list[int]:
            c = client(proxy_uri(server))
            try:
                c.ks.c.insert_many([{"i": i} for i in range(10)])
                return [
                    d["i"]
                    for d in c.ks.c.find(cursor_type=CursorType.EXHAUST, batch_size=3).sort("i")
                ]
            finally:
                c.close()  # while the proxy still answers its endSessions

        assert await sync(work) == list(range(10))
        assert await exhaust_batches("127.0.0.1", server.port) == (
            [[2, 3, 4], [5, 6, 7], [8, 9]],
            True,
        )
        nursery.cancel_scope.cancel()


async def test_legacy_op_query_handshake(proxy):
    def work():
        with socket.create_connection(("127.0.0.1", proxy.port)) as s:
            s.sendall(
                wire.encode_op_query(1, "admin.$cmd", bson.encode({"isMaster": 1, "helloOk": True}))
            )
            s.settimeout(5)
            framer = wire.MessageFramer()
            while (msg := framer.next_message()) is wire.NEED_DATA:
                framer.receive_data(s.recv(65536))
            assert isinstance(msg, wire.OpReply) and msg.response_to == 1
            reply = bson.decode(msg.documents[0])
            assert (
                reply["ismaster"] is True
                and reply["msg"] == "isdbgrid"
                and reply["helloOk"] is True
            )

    await sync(work)


async def test_bad_frames_close_only_their_connection(proxy):
    def work():
        good = client(proxy_uri(proxy))
        good.t.c.insert_one({"_id": 1})
        for junk in (
            struct.pack("<iiii", 12, 1, 0, 2013),
            struct.pack("<iiii", 60_000_000, 1, 0, 2013),
            struct.pack("<iiiiIB", 26, 1, 0, 2013, 0, 9) + b"\x00" * 5,
        ):
            with socket.create_connection(("127.0.0.1", proxy.port)) as s:
                s.sendall(junk)
                s.settimeout(5)
                assert s.recv(100) == b""
        assert good.t.c.find_one({"_id": 1}) == {"_id": 1}
        assert proxy.server.metrics.protocol_errors._value.get() == 3

    await sync(work)


async def test_upstream_failure_is_a_network_error_not_a_hang(cluster):
    async with trio.open_nursery() as nursery:
        server = ProxyServer(ProxyConfig(upstream=cluster.uri, listen_port=0))
        await nursery.start(server.serve)

        def work():
            c = client(proxy_uri(server), retryWrites=False, retryReads=False)
            c.t.c.insert_one({"_id": 1})
            trio.from_thread.run_sync(
                cluster.mongos.stop
            )  # trio state is touched on its own thread
            from pymongo.errors import AutoReconnect

            with pytest.raises(AutoReconnect):
                c.t.c.find_one({"_id": 1})

        await sync(work)
        nursery.cancel_scope.cancel()


async def test_metrics_endpoint(cluster):
    async with trio.open_nursery() as nursery:
        port = free_port()
        server = ProxyServer(ProxyConfig(upstream=cluster.uri, listen_port=0, metrics_port=port))
        await nursery.start(server.serve)

        def work():
            client(proxy_uri(server)).t.c.insert_one({"_id": 1})
            text = "\n".join(scrape(port))
            assert "pcs_commands_total" in text and 'command="insert"' in text

        await sync(work)
        nursery.cancel_scope.cancel()


async def test_metrics_follow_prometheus_naming(cluster):
    """One prefix (pcs_) besides the process's own process_* figures, counters named *_total, no
    _created series: the names users type in PromQL are the names on the page."""
    async with trio.open_nursery() as nursery:
        port = free_port()
        config = ProxyConfig(upstream=cluster.uri, listen_port=0, metrics_port=port)
        server = await nursery.start(serve_proxy, config)

        def work():
            c = client(proxy_uri(server))
            c.admin.command({"parallelChangeStream": 1, "nBuckets": 2, "name": "naming"})
            c.t.c.insert_one({"_id": 1})
            return scrape(port)

        page = await sync(work)
        nursery.cancel_scope.cancel()
    lines = page[page.index("") + 1 :]  # the body, after the HTTP headers
    types = dict(line.split()[2:4] for line in lines if line.startswith("# TYPE "))
    samples = {line.split("{")[0].split()[0] for line in lines if line and not line.startswith("#")}
    assert {
        "pcs_commands_total",
        "pcs_shard_entries_total",
        "pcs_bucket_depth",
        "process_resident_memory_bytes",
    } <= samples
    assert all(name.startswith(("pcs_", "process_")) for name in samples), samples
    assert not [name for name in samples if name.endswith("_created")]
    assert all(name.endswith("_total") for name, kind in types.items() if kind == "counter"), types


async def test_client_tls_with_standard_connection_string_options(cluster, tmp_path):
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, ca_file = tmp_path / "proxy.pem", tmp_path / "ca.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    ca.cert_pem.write_to_path(str(ca_file))
    async with trio.open_nursery() as nursery:
        server = ProxyServer(
            ProxyConfig(upstream=cluster.uri, listen_port=0, tls_cert_file=str(cert_file))
        )
        await nursery.start(server.serve)

        def work():
            uri = f"mongodb://127.0.0.1:{server.port}/?tls=true&tlsCAFile={ca_file}"
            c = client(uri)
            c.t.c.insert_one({"_id": "tls"})
            assert c.t.c.find_one({"_id": "tls"}) == {"_id": "tls"}
            # Without trusting the CA, the handshake fails: verification is really on.
            from pymongo.errors import ServerSelectionTimeoutError

            untrusting = client(
                f"mongodb://127.0.0.1:{server.port}/?tls=true", serverSelectionTimeoutMS=1000
            )
            with pytest.raises(ServerSelectionTimeoutError):
                untrusting.admin.command("ping")

        await sync(work)
        nursery.cancel_scope.cancel()


async def test_retryable_write_survives_a_dropped_connection(proxy):
    def work():
        c = client(proxy_uri(proxy))
        c.t.r.insert_one({"_id": 0})
        # mongos drops the connection on the next insert; the driver retries once, through the
        # proxy.
        c.admin.command(
            {
                "configureFailPoint": "failCommand",
                "mode": {"times": 1},
                "data": {"failCommands": ["insert"], "closeConnection": True},
            }
        )
        c.t.r.insert_one({"_id": 1})
        assert c.t.r.count_documents({}) == 2

    await sync(work)


async def test_sigterm_finishes_in_flight_requests_then_exits(cluster):
    """`wireproxy` as users run it: SIGTERM stops accepting, lets the request in flight finish,
    exits 0."""
    import signal
    import subprocess
    import sys

    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wireproxy",
            "--upstream",
            cluster.uri,
            "--listen",
            f"127.0.0.1:{port}",
            "--shutdown-grace-s",
            "5",
        ],
        stderr=subprocess.DEVNULL,
    )
    try:

        def work():
            c = client(
                f"mongodb://127.0.0.1:{port}/", retryReads=False, serverSelectionTimeoutMS=2000
            )
            c.t.c.insert_many([{"_id": i} for i in range(10)])
            # mongos holds the next find for 1.5 s: SIGTERM arrives while it is in flight.
            c.admin.command(
                "configureFailPoint",
                "failCommand",
                mode={"times": 1},
                data={"failCommands": ["find"], "blockConnection": True, "blockTimeMS": 1500},
            )
            import threading

            threading.Timer(0.4, proc.send_signal, (signal.SIGTERM,)).start()
            started = time.monotonic()
            assert len(list(c.t.c.find())) == 10  # the in-flight request completed
            assert time.monotonic() - started >= 1.4
            c.close()
            assert proc.wait(10) == 0
            with pytest.raises(OSError):  # no longer accepting
                socket.create_connection(("127.0.0.1", port), timeout=1).close()

        await sync(work)
    finally:
        proc.kill()
        proc.wait()


async def test_max_connections_and_idle_timeout(cluster):
    """Past max_connections a client is refused (closed at once); an idle client is closed after
    idle_timeout_s; the clients within the limits keep working."""
    async with trio.open_nursery() as nursery:
        server = ProxyServer(
            ProxyConfig(upstream=cluster.uri, listen_port=0, max_connections=2, idle_timeout_s=0.5)
        )
        await nursery.start(server.serve)
        hello = wire.encode_op_msg(1, 0, bson.encode({"hello": 1, "$db": "admin"}))

        async def ask(stream: trio.SocketStream) -> bool:
            await stream.send_all(hello)
            framer = wire.MessageFramer()
            while (msg := framer.next_message()) is wire.NEED_DATA:
                data = await stream.receive_some(1 << 16)
                if not data:
                    return False
                framer.receive_data(data)
            return bson.decode(msg.body)["ok"] == 1.0

        first = await trio.open_tcp_stream("127.0.0.1", server.port)
        second = await trio.open_tcp_stream("127.0.0.1", server.port)
        assert await ask(first) and await ask(second)
        third = await trio.open_tcp_stream("127.0.0.1", server.port)
        with trio.fail_after(5):
            assert await third.receive_some(10) == b""  # refused: closed without a reply
        with trio.fail_after(5):  # idle past the timeout: the proxy closes both
            assert await first.receive_some(10) == b""
            assert await second.receive_some(10) == b""
        fresh = await trio.open_tcp_stream("127.0.0.1", server.port)  # room again
        assert await ask(fresh)
        for s in (first, second, third, fresh):
            await s.aclose()
        nursery.cancel_scope.cancel()


async def test_a_member_connection_cancelled_mid_handshake_leaves_no_socket_open():
    """The engine's connections to shard members (reader tails, notes, lookups) are cancelled
    when a stream closes; one cancelled while `hello` is still unanswered is closed, not left to
    the garbage collector (found by the randomized watch test: a note's connection leaked)."""
    import gc
    import warnings

    from wireproxy.members import open_member

    accepted: list[trio.SocketStream] = []

    async def silent(stream: trio.SocketStream) -> None:  # accepts, never answers
        accepted.append(stream)
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, silent, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with trio.move_on_after(0.3):
                await open_member([("127.0.0.1", port)], secondary=False)
            gc.collect()
        assert accepted and not [w for w in caught if issubclass(w.category, ResourceWarning)]
        nursery.cancel_scope.cancel()


async def test_a_member_that_hangs_is_tried_last_by_every_later_connection(cluster):
    """A member that accepts connections and answers nothing (a stopped process) costs the connect
    timeout once; the engine's connector (readers, notes, commands on primaries) then tries it
    after the others until it answers again."""
    from wireproxy.members import MemberConnector

    accepted: list[trio.SocketStream] = []

    async def silent(stream: trio.SocketStream) -> None:
        accepted.append(stream)
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, silent, 0, host="127.0.0.1")
        )
        hung = ("127.0.0.1", listeners[0].socket.getsockname()[1])
        member = cluster.shards["shard0"]
        hosts = [hung, (member.host, member.port)]
        connect = MemberConnector(connect_timeout_s=0.5)
        for _ in range(3):
            conn = await connect(hosts, secondary=False)
            assert conn.address == member.address
            await conn.aclose()
        assert len(accepted) == 1, "tried once, then passed over"
        failure = connect.health.failure(f"{hung[0]}:{hung[1]}")
        assert failure is not None and "did not answer hello within 0.5 s" in failure.error
        nursery.cancel_scope.cancel()
