"""A simcluster and an accelerating proxy on a background trio thread, shared by the conformance
cases of one MongoDB version (starting a cluster per case would cost more than the cases)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import trio

from simcluster import open_cluster
from wireproxy.app import serve_proxy
from wireproxy.config import ProxyConfig


@dataclass(frozen=True)
class Endpoints:
    version: str
    mongos_uri: str
    proxy_uri: str


@contextmanager
def running(version: str, *, shards: int = 2) -> Iterator[Endpoints]:
    """Serve a `shards`-shard cluster of `version` and a proxy with change stream acceleration on
    until the block ends. Idle shards write their noop every 0.2 s, so native cluster-wide streams
    move on quickly."""
    ready: list[Endpoints] = []
    failed: list[BaseException] = []
    started, stop = threading.Event(), threading.Event()

    async def serve() -> None:
        async with (
            open_cluster(shards=shards, version=version, periodic_noop_s=0.2) as cluster,
            trio.open_nursery() as nursery,
        ):
            config = ProxyConfig(
                upstream=cluster.uri, listen_port=0, accelerate_change_streams=True
            )
            proxy = await nursery.start(serve_proxy, config)
            ready.append(Endpoints(version, cluster.uri, f"mongodb://127.0.0.1:{proxy.port}/"))
            started.set()
            while not stop.is_set():
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()

    def run() -> None:
        try:
            trio.run(serve)
        except BaseException as exc:  # reported on the caller's thread
            failed.append(exc)
            started.set()

    thread = threading.Thread(target=run, name=f"conformance-{version}", daemon=True)
    thread.start()
    started.wait(60)
    if failed or not ready:
        raise RuntimeError(f"the {version} cluster did not start") from (
            failed[0] if failed else None
        )
    try:
        yield ready[0]
    finally:
        stop.set()
        thread.join(30)
