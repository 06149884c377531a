"""The proxy's watch over its mongoses: one that hangs is passed over, and its clients are cut
so that their drivers retry on another (wireproxy/upstream_monitor.py).

A mongos that hangs keeps its sockets open and answers nothing: a SIGSTOPped process, or a
partition that drops packets. The tests put a relay between the proxy and simcluster's mongos and
cut it (the relay holds what it gets, both ways, until healed), so "the first mongos" of the
proxy's upstream URI hangs while the second, the same mongos reached directly, answers.
"""

from __future__ import annotations

import time

import trio

from simcluster import open_cluster
from tests.conftest import _close_all, client, free_port, poll_until, proxy_uri, scrape, sync
from wireproxy.app import serve_proxy
from wireproxy.config import ProxyConfig

FAST_CHECKS = (
    "heartbeatFrequencyMS=500&connectTimeoutMS=1000"  # a hung mongos is seen within ~1.5 s
)


class Relay:
    """A TCP path to a server that can be cut as a partition cuts it: connections stay open, and
    nothing passes either way until it is healed."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._open = trio.Event()
        self._open.set()

    def cut(self) -> None:
        if self._open.is_set():
            self._open = trio.Event()

    def heal(self) -> None:
        self._open.set()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._relay, listeners)

    async def _relay(self, near: trio.SocketStream) -> None:
        far = await trio.open_tcp_stream("127.0.0.1", self.target_port)
        async with near, far, trio.open_nursery() as nursery:
            nursery.start_soon(self._pipe, near, far, nursery.cancel_scope)
            nursery.start_soon(self._pipe, far, near, nursery.cancel_scope)

    async def _pipe(
        self, src: trio.SocketStream, dst: trio.SocketStream, both: trio.CancelScope
    ) -> None:
        try:
            while data := await src.receive_some(1 << 16):
                await self._open.wait()
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        both.cancel()  # one side closed: close the other


def _up(metrics_port: int, address: str) -> float | None:
    for line in scrape(metrics_port):
        if line.startswith(f'pcs_upstream_up{{address="{address}"}}'):
            return float(line.split()[-1])
    return None


async def test_a_client_on_a_mongos_that_hangs_is_cut_and_its_retries_go_to_another():
    async with open_cluster(shards=1) as cluster, trio.open_nursery() as nursery:
        relay = Relay(cluster.mongos.port)
        await nursery.start(relay.serve)
        hung = f"127.0.0.1:{relay.port}"
        metrics_port = free_port()
        proxy = await nursery.start(
            serve_proxy,
            ProxyConfig(
                upstream=f"mongodb://{hung},{cluster.mongos.address}/?{FAST_CHECKS}",
                listen_port=0,
                metrics_port=metrics_port,
            ),
        )
        c = client(proxy_uri(proxy))
        await sync(c.um.t.insert_one, {"_id": 1})

        def pinned_to() -> set[str]:
            return {
                s.upstream.address
                for s in proxy.server.sessions
                if s.upstream is not None and not s.upstream.closed
            }

        assert pinned_to() == {hung}, "the first mongos of the URI, while it answers"
        relay.cut()
        # A read and a write in flight on the hung mongos: each is cut once the monitor sees it
        # hang, and pymongo's retry goes through a new connection to the mongos that answers.
        began = time.monotonic()
        async with trio.open_nursery() as ops:
            ops.start_soon(sync, c.um.t.find_one, {"_id": 1})
            ops.start_soon(sync, c.um.t.insert_one, {"_id": 2})
        assert time.monotonic() - began < 10, "well before TCP would give up"
        assert await sync(c.um.t.count_documents, {}) == 2, "the retried write landed once"
        assert pinned_to() == {cluster.mongos.address}
        assert await sync(_up, metrics_port, hung) == 0.0
        assert await sync(_up, metrics_port, cluster.mongos.address) == 1.0
        # Healed, it answers the monitor again, and is back in line (after the other, until new
        # connections are made: the pinned ones stay where they are).
        relay.heal()
        with trio.fail_after(10):
            while (
                await sync(_up, metrics_port, hung) != 1.0
            ):  # /metrics is served by this trio loop
                await trio.sleep(0.2)
        await sync(_close_all)
        nursery.cancel_scope.cancel()


async def test_the_proxy_listens_only_once_a_mongos_answers():
    """A proxy started while its mongos hangs waits for it, saying so, instead of answering
    drivers' hellos with wire versions it does not know; it starts as soon as one answers."""
    async with open_cluster(shards=1) as cluster, trio.open_nursery() as nursery:
        relay = Relay(cluster.mongos.port)
        await nursery.start(relay.serve)
        relay.cut()
        started: list = []

        async def start_proxy() -> None:
            started.append(
                await nursery.start(
                    serve_proxy,
                    ProxyConfig(
                        upstream=f"mongodb://127.0.0.1:{relay.port}/?{FAST_CHECKS}", listen_port=0
                    ),
                )
            )

        nursery.start_soon(start_proxy)
        await trio.sleep(2.5)
        assert not started, "no mongos has answered"
        relay.heal()
        await poll_until(lambda: started, 5)
        hello = await sync(client(proxy_uri(started[0])).admin.command, "hello")
        assert hello["maxWireVersion"] == cluster.mongos.max_wire_version
        await sync(_close_all)
        nursery.cancel_scope.cancel()


async def test_behind_a_replica_set_clients_write_to_its_primary_and_follow_a_new_one():
    """A replica set upstream (no mongos), its primary listed last: clients are pinned to the
    primary, and when it steps down they are cut, and their retried writes go to the new one."""
    async with (
        open_cluster(shards=1, members=3, election_timeout_s=0.3) as cluster,
        trio.open_nursery() as nursery,
    ):
        rs = cluster.replsets["shard0"]
        listed = sorted(rs.members, key=lambda m: m.is_primary)
        proxy = await nursery.start(
            serve_proxy,
            ProxyConfig(
                upstream=f"mongodb://{','.join(m.address for m in listed)}/?{FAST_CHECKS}",
                listen_port=0,
            ),
        )
        c = client(proxy_uri(proxy))
        await sync(c.rs.t.insert_one, {"_id": 1})
        old = rs.primary
        assert {s.upstream.address for s in proxy.server.sessions if s.upstream is not None} == {
            old.address
        }
        await rs.step_down(old, 60, 10, False)
        await poll_until(
            lambda: (
                rs.primary is not None and proxy.server.monitor.writable.get(rs.primary.address)
            ),
            10,
        )
        await poll_until(lambda: not proxy.server.monitor.writable[old.address], 10)
        await sync(
            c.rs.t.insert_one, {"_id": 2}
        )  # its pinned connection was cut: retried on a new one
        assert await sync(c.rs.t.count_documents, {}) == 2
        assert {
            s.upstream.address
            for s in proxy.server.sessions
            if s.upstream is not None and not s.upstream.closed
        } == {rs.primary.address}
        await sync(_close_all)
        nursery.cancel_scope.cancel()
