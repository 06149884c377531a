"""Hostile frames end to end: each closes its own connection only, while another pymongo client
keeps working, through the proxy and against simcluster directly.

- A string of length 0x7fffffff in a 46-byte OP_MSG: a server fails the connection on a message
  whose BSON does not parse (service_entry_point_common.cpp: parse errors of the
  ConnectionFatalMessageParseError category end the session).
- Decompression bombs: OP_COMPRESSED inflates into the declared uncompressedSize at most
  (message_compressor_manager.cpp, decompressMessage).
- Partial frames (the proxy's own limits, see wireproxy.config): a message that has begun must be
  whole within frame_timeout_s; before login, messages are small and what incomplete ones hold
  in all is bounded.
"""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import AsyncIterator, Callable

import bson
import pytest
import trio

from mongoformats import wire
from simcluster import SimCluster, open_cluster
from tests.conftest import _close_all, client, poll_until, proxy_uri, sync
from tests.fuzz.wire_target import SEEDS, mutate
from tests.integration.test_auth import with_user
from tests.unit.test_hostile_frames import bad_string_frame
from tests.unit.test_wire_bounds import INNER, bomb
from wireproxy.app import RunningProxy, serve_proxy
from wireproxy.config import ProxyConfig


async def closed_by_peer(stream: trio.SocketStream, timeout: float = 20) -> None:
    """Wait until the peer closes `stream` (EOF, or a reset when it left our bytes unread)."""
    with trio.fail_after(timeout):
        try:
            while await stream.receive_some(1 << 16):
                pass
        except trio.BrokenResourceError:
            pass


async def send_and_expect_close(port: int, data: bytes) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        try:
            await stream.send_all(data)
        except trio.BrokenResourceError:
            return  # closed while we were still sending
        await closed_by_peer(stream)
    finally:
        await stream.aclose()


def round_trip(uri: str, n: int) -> Callable[[], None]:
    """A pymongo client's work through `uri`: a write and a read of it."""

    def work() -> None:
        c = client(uri)
        c.t.hostile.insert_one({"_id": n})
        assert c.t.hostile.find_one({"_id": n}) == {"_id": n}

    return work


@pytest.fixture
async def cluster_and_proxy(cluster: SimCluster) -> AsyncIterator[tuple[SimCluster, RunningProxy]]:
    async with trio.open_nursery() as nursery:
        config = ProxyConfig(upstream=cluster.uri, listen_port=0, frame_timeout_s=1.0)
        server = await nursery.start(serve_proxy, config)
        yield cluster, server
        await sync(_close_all)  # while the proxy answers endSessions
        nursery.cancel_scope.cancel()


async def test_a_bad_bson_string_closes_only_its_connection(cluster_and_proxy):
    """The 46-byte frame, sent to mongos, to a shard and through the proxy (top-level: the proxy
    closes; nested: it passes through and mongos closes, and the proxy closes its client):
    each time that connection ends, and clients of mongos, the shard and the proxy go on."""
    cluster, proxy = cluster_and_proxy
    shard = cluster.replsets["shard0"].members[0]
    targets = [
        (cluster.mongos.port, cluster.uri),
        (shard.port, f"mongodb://{shard.address}/?directConnection=true"),
        (proxy.port, proxy_uri(proxy)),
    ]
    for n, (port, uri) in enumerate(targets):
        for nested in (False, True):
            await send_and_expect_close(port, bad_string_frame(nested))
            await sync(round_trip(uri, 10 * n + nested))
    await sync(round_trip(proxy_uri(proxy), 99))


async def test_a_decompression_bomb_closes_only_its_connection_uninflated(cluster_and_proxy):
    """zstd (its frame stating 64 MiB) and snappy payloads of a few KB / MB, claiming a few dozen
    bytes: the connection closes, and nothing near their inflated size is ever allocated."""
    cluster, proxy = cluster_and_proxy
    bombs = [bomb("zstd"), bomb("snappy")]
    for port, uri in [(cluster.mongos.port, cluster.uri), (proxy.port, proxy_uri(proxy))]:
        for i, frame in enumerate(bombs):
            tracemalloc.start()
            try:
                await send_and_expect_close(port, frame)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert peak < 3 * len(frame) + (8 << 20)  # the frame, its payload, and the servers' own
            await sync(round_trip(uri, 10 * port + i))
    assert len(INNER) < 100


async def test_a_stalled_partial_frame_is_closed_after_frame_timeout(cluster_and_proxy):
    """Most of a 40 MB message, then nothing: the proxy closes that connection once
    frame_timeout_s (1 s here) has passed since it began; a client meanwhile works."""
    _, proxy = cluster_and_proxy
    stream = await trio.open_tcp_stream("127.0.0.1", proxy.port)
    head = wire.HEADER.pack(40_000_000, 1, 0, wire.OP_MSG)
    await stream.send_all(head + bytes(1 << 20))
    await sync(round_trip(proxy_uri(proxy), 1))
    await closed_by_peer(stream)
    await stream.aclose()
    await sync(round_trip(proxy_uri(proxy), 2))


async def test_a_client_trickling_a_frame_is_closed_after_frame_timeout_too(cluster_and_proxy):
    """A byte every 0.2 s never leaves the connection idle, yet its message is not whole in time."""
    _, proxy = cluster_and_proxy
    frame = wire.encode_op_msg(1, 0, bson.encode({"ping": 1, "$db": "admin"}))
    stream = await trio.open_tcp_stream("127.0.0.1", proxy.port)
    with trio.fail_after(20):
        with pytest.raises(trio.BrokenResourceError):
            for byte in frame[:-1] * 100:
                await stream.send_all(bytes([byte]))
                await trio.sleep(0.2)
    await stream.aclose()
    await sync(round_trip(proxy_uri(proxy), 3))


USERS = {"alice": "alice-pw", "cdc": "proxy-pw"}


async def test_before_login_a_large_message_closes_the_connection_and_after_it_is_served():
    """With a cluster requiring authentication (the proxy's upstream URI logs in), a client that
    has not logged in may send messages up to unauthenticated_max_message_bytes: a 2 MB one is
    refused from its header; a logged-in client's 2 MB insert goes through."""
    async with open_cluster(shards=1, users=USERS) as cluster, trio.open_nursery() as nursery:
        config = ProxyConfig(upstream=with_user(cluster.uri, "cdc", "proxy-pw"), listen_port=0)
        proxy = await nursery.start(serve_proxy, config)
        stream = await trio.open_tcp_stream("127.0.0.1", proxy.port)
        await stream.send_all(wire.HEADER.pack(2_000_000, 1, 0, wire.OP_MSG))
        await closed_by_peer(stream, timeout=10)  # well before frame_timeout_s (30 s)
        await stream.aclose()

        def work() -> None:
            alice = client(with_user(proxy_uri(proxy), "alice", "alice-pw"))
            alice.t.big.insert_one({"_id": 1, "pad": "x" * 2_000_000})
            assert len(alice.t.big.find_one({"_id": 1})["pad"]) == 2_000_000

        await sync(work)
        await sync(_close_all)  # while the servers answer endSessions
        nursery.cancel_scope.cancel()


async def test_incomplete_messages_of_clients_not_logged_in_share_one_budget(cluster):
    """unauthenticated_buffer_bytes 4 MiB: one stalled client holds 3 MiB of a message; a second
    whose message would take the total past 4 MiB is closed, the first is not; once the first
    leaves, the budget is free again. A pymongo client works throughout."""
    async with trio.open_nursery() as nursery:
        config = ProxyConfig(
            upstream=cluster.uri, listen_port=0, unauthenticated_buffer_bytes=4 << 20
        )
        proxy: RunningProxy = await nursery.start(serve_proxy, config)
        head = wire.HEADER.pack(10_000_000, 1, 0, wire.OP_MSG)
        first = await trio.open_tcp_stream("127.0.0.1", proxy.port)
        await first.send_all(head + bytes((3 << 20) - len(head)))
        await poll_until(lambda: proxy.server.frame_budget.total == 3 << 20, 20)
        await send_and_expect_close(proxy.port, head + bytes(2 << 20))
        assert proxy.server.frame_budget.total == 3 << 20  # the first still holds its part
        await sync(round_trip(proxy_uri(proxy), 4))
        await first.aclose()
        await poll_until(lambda: proxy.server.frame_budget.total == 0, 20)
        await sync(round_trip(proxy_uri(proxy), 5))
        await sync(_close_all)
        nursery.cancel_scope.cancel()


async def test_mutated_frames_never_take_down_simcluster_or_the_proxy(cluster_and_proxy):
    """300 frames of every kind with bytes flipped, lengths lying and cuts (the fuzz target's
    seeds and mutations, tests/fuzz/wire_target.py), each on a connection of its own that then
    ends its side: every one is answered or closed, and mongos and the proxy serve on."""
    cluster, proxy = cluster_and_proxy
    rng = random.Random(46)
    for port, uri in [(cluster.mongos.port, cluster.uri), (proxy.port, proxy_uri(proxy))]:
        for _ in range(150):
            seed = rng.choice(SEEDS[:-2])  # the large bombs have their own test
            edits = [
                (rng.randrange(4), rng.randrange(1 << 16), rng.randrange(1 << 16))
                for _ in range(rng.randint(1, 4))
            ]
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            try:
                await stream.send_all(mutate(seed, edits))
                await stream.send_eof()
                await closed_by_peer(stream)
            except trio.BrokenResourceError:
                pass  # closed while we were still sending
            finally:
                await stream.aclose()
        await sync(round_trip(uri, port))
