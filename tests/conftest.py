"""Fixtures: a real simcluster and a real proxy on loopback, started inside each test's trio loop.

pymongo is synchronous, so tests run client code with `await sync(fn)` on a worker thread while
the servers keep running on the trio thread. Each such call has a deadline.
"""

from __future__ import annotations

import functools
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import pymongo
import pytest
import trio

from simcluster import SimCluster, open_cluster
from wireproxy.app import RunningProxy, serve_proxy
from wireproxy.config import ProxyConfig
from wireproxy.server import ProxyServer

T = TypeVar("T")


async def sync(fn: Callable[..., T], *args: Any, timeout: float = 90, **kwargs: Any) -> T:
    """Run blocking client code (pymongo) off the trio thread, with a deadline (no test may hang
    CI)."""
    with trio.fail_after(timeout):
        return await trio.to_thread.run_sync(
            functools.partial(fn, *args, **kwargs), abandon_on_cancel=True
        )


async def poll_until(cond: Callable[[], Any], timeout: float, interval: float = 0.01) -> None:
    """Wait, in the test's trio loop, until `cond` holds; fail after `timeout` seconds. For state
    the engine or simcluster changes with no event a test can wait on (a getMore parked, events
    dealt, members caught up)."""
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(interval)


_OPEN_CLIENTS: list[pymongo.MongoClient[Any]] = []


def client(uri: str, **kwargs: Any) -> pymongo.MongoClient[Any]:
    """A pymongo client that is closed when the test ends."""
    kwargs.setdefault("serverSelectionTimeoutMS", 5000)
    c: pymongo.MongoClient[Any] = pymongo.MongoClient(uri, **kwargs)
    _OPEN_CLIENTS.append(c)
    return c


def _close_all() -> None:
    while _OPEN_CLIENTS:
        _OPEN_CLIENTS.pop().close()


@pytest.fixture(autouse=True)
def _close_clients() -> Any:
    # Fallback for tests without the cluster fixture. Closing blocks on the servers answering
    # endSessions, so the trio fixtures below close clients from a worker thread first.
    yield
    _close_all()


@pytest.fixture
async def cluster() -> AsyncIterator[SimCluster]:
    async with open_cluster(shards=3) as c:
        yield c
        await sync(_close_all)  # while the servers still run, so close() is not left waiting


@pytest.fixture
async def proxy(cluster: SimCluster) -> AsyncIterator[RunningProxy]:
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_proxy, ProxyConfig(upstream=cluster.uri, listen_port=0))
        yield server
        # Close clients while the proxy still answers: MongoClient.close() sends endSessions and
        # would otherwise wait out its server selection timeout.
        await sync(_close_all)
        nursery.cancel_scope.cancel()


def proxy_uri(server: ProxyServer | RunningProxy) -> str:
    return f"mongodb://127.0.0.1:{server.port}/"


def free_port() -> int:
    """A loopback port nothing listens on now (for a proxy's /metrics)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int) -> list[str]:
    """The lines of the proxy's /metrics page on `port`, read over a real HTTP request."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data.decode().splitlines()


def wait_until(cond: Any, timeout: float = 120, interval: float = 0.3) -> None:
    """Poll `cond` every `interval` until it holds or the deadline passes: Spark's progress, a
    proxy's buffers and a target's state are outside the test's thread, with no event to wait on."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(interval)
