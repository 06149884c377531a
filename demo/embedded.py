"""Source and target simclusters plus the proxy, running on a background trio thread.

Used by the demo, the Spark tests and the benchmarks: Spark's own Python workers reach the proxy
over loopback, exactly as they would reach a proxy in front of a real cluster.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import trio

from simcluster import SimCluster, open_cluster
from wireproxy.app import RunningProxy, serve_proxy
from wireproxy.config import ProxyConfig


@dataclass
class Environment:
    source: SimCluster
    target: SimCluster | None
    proxy: RunningProxy

    @property
    def proxy_uri(self) -> str:
        return f"mongodb://127.0.0.1:{self.proxy.port}/"


@contextmanager
def embedded_environment(
    *, shards: int = 3, with_target: bool = True, version: str = "7.0", proxy_port: int = 0
) -> Iterator[Environment]:
    ready: list[Environment] = []
    failed: list[BaseException] = []
    started = threading.Event()
    stop = threading.Event()

    async def main() -> None:
        async with open_cluster(shards=shards, version=version) as source:
            target_cm = open_cluster(shards=shards, version=version) if with_target else None
            target = await target_cm.__aenter__() if target_cm else None
            try:
                async with trio.open_nursery() as nursery:
                    proxy = await nursery.start(
                        serve_proxy, ProxyConfig(upstream=source.uri, listen_port=proxy_port)
                    )
                    ready.append(Environment(source, target, proxy))
                    started.set()
                    while not stop.is_set():
                        await trio.sleep(0.05)
                    nursery.cancel_scope.cancel()
            finally:
                if target_cm:
                    await target_cm.__aexit__(None, None, None)

    def runner() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # reported to the caller's thread below
            failed.append(exc)
            started.set()

    thread = threading.Thread(target=runner, name="embedded-trio", daemon=True)
    thread.start()
    started.wait(60)
    if failed or not ready:
        raise RuntimeError("the embedded clusters did not start") from (
            failed[0] if failed else None
        )
    try:
        yield ready[0]
    finally:
        stop.set()
        thread.join(30)
