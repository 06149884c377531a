"""`wireproxy --upstream mongodb://mongos:27017 --listen 127.0.0.1:27018`

Configuration comes from (later wins): defaults, a TOML file (`--config`, table [wireproxy]),
WIREPROXY_* environment variables, then command-line flags. SIGTERM/SIGINT stop accepting,
give in-flight requests `shutdown_grace_s`, then close.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
from typing import Any

import trio

from wireproxy.app import serve_proxy, tune_gc_for_throughput
from wireproxy.config import ProxyConfig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="wireproxy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="TOML file with a [wireproxy] table")
    parser.add_argument("--upstream", help="mongos connection string")
    parser.add_argument("--listen", help="host:port to listen on")
    parser.add_argument("--metrics-port", type=int)
    parser.add_argument("--accelerate-change-streams", action="store_true", default=None)
    parser.add_argument("--reader-processes", type=int,
                        help="worker processes turning oplog batches into events, and applying an accelerated "
                             "watch()'s stages (default 0: in the proxy)")
    parser.add_argument("--shutdown-grace-s", type=float, help="on SIGTERM, how long in-flight requests get")
    parser.add_argument("--stream-idle-teardown-s", type=float,
                        help="close a parallel change stream that has had no cursor this long (default 300)")
    parser.add_argument("--cursor-timeout-s", type=float,
                        help="kill engine cursors unused this long, as cursorTimeoutMillis does (default 600; "
                             "cursors opened in a session: 1800, the session timeout)")
    parser.add_argument("--memory-limit-bytes", type=int,
                        help="refuse new streams (ExceededMemoryLimit) when their buffer budgets would not fit "
                             "beside the open streams' (default 0: half the machine's or cgroup's memory)")
    args = parser.parse_args(argv)
    config = ProxyConfig.from_toml(args.config) if args.config else ProxyConfig()
    config = ProxyConfig.from_env(base=config)
    changes: dict[str, Any] = {}
    if args.upstream:
        changes["upstream"] = args.upstream
    if args.listen:
        host, _, port = args.listen.rpartition(":")
        changes.update(listen_host=host or "127.0.0.1", listen_port=int(port))
    if args.accelerate_change_streams:
        changes["accelerate_change_streams"] = True
    # Flags named after their ProxyConfig field: those given override the file and environment.
    for field in ("metrics_port", "reader_processes", "shutdown_grace_s", "stream_idle_teardown_s",
                  "cursor_timeout_s", "memory_limit_bytes"):
        if (value := getattr(args, field)) is not None:
            changes[field] = value
    config = dataclasses.replace(config, **changes)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    tune_gc_for_throughput()

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve_proxy, config)
            logging.getLogger("wireproxy").info("listening on %s:%d, upstream %s", config.listen_host,
                                                server.port, config.upstream)
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    await server.shutdown()
                    with trio.move_on_after(config.shutdown_grace_s + 1):
                        while server.metrics.connections._value.get() > 0:
                            await trio.sleep(0.1)
                    nursery.cancel_scope.cancel()
                    return

    trio.run(run)


if __name__ == "__main__":
    main()
