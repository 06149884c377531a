"""`wireproxy --upstream mongodb://mongos:27017 --listen 127.0.0.1:27018`

Configuration comes from (later wins): defaults, a TOML file (`--config`, table [wireproxy]),
WIREPROXY_* environment variables, then command-line flags. SIGTERM/SIGINT stop accepting,
give in-flight requests `shutdown_grace_s`, then close.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import signal
from typing import Any

from wireproxy.config import ProxyConfig, parse_value
from wireproxy.extras import add_version_flag
from wireproxy.redact import redact_uri

LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
_METAVARS = {"int": "N", "float": "SECONDS", "str": "TEXT"}


def _flag_value(kind: str, flag: str, raw: str) -> Any:
    try:
        return parse_value(kind, raw, flag)
    except ValueError as exc:  # argparse prints an ArgumentTypeError's message after the flag
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{flag} ")) from None


def _add_setting_flag(parser: argparse.ArgumentParser, f: dataclasses.Field[Any]) -> None:
    """The flag of one setting of ProxyConfig: --reader-processes sets reader_processes."""
    kind, flag = str(f.type), "--" + f.name.replace("_", "-")
    if kind == "bool":
        parser.add_argument(
            flag,
            action=argparse.BooleanOptionalAction,
            default=None,
            help=f"{f.metadata['help']} (default: {'on' if f.default else 'off'})",
        )
    else:
        parser.add_argument(
            flag,
            metavar=_METAVARS[kind],
            help=f"{f.metadata['help']} (default: {f.default!r})",
            type=functools.partial(_flag_value, kind, flag),
        )


def _configured(args: argparse.Namespace) -> ProxyConfig:
    """The settings of the file, then the environment, then the flags given (later wins);
    OSError or ValueError for a bad setting, a missing or malformed file."""
    config = ProxyConfig.from_toml(args.config) if args.config else ProxyConfig()
    config = ProxyConfig.from_env(base=config)
    changes: dict[str, Any] = {
        f.name: v
        for f in dataclasses.fields(ProxyConfig)
        if (v := getattr(args, f.name)) is not None
    }
    if args.listen:
        host, _, port = args.listen.rpartition(":")
        changes.update(
            listen_host=host or "127.0.0.1",
            listen_port=parse_value("int", port, "--listen's port"),
        )
    return dataclasses.replace(config, **changes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="wireproxy", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_version_flag(parser)
    parser.add_argument("--config", help="TOML file with a [wireproxy] table")
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default="INFO")
    parser.add_argument("--listen", metavar="HOST:PORT", help="listen_host and listen_port in one")
    for f in dataclasses.fields(ProxyConfig):
        _add_setting_flag(parser, f)
    args = parser.parse_args(argv)
    # Before the settings are checked and the engine loads: numba's cache choice is logged then.
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    try:
        config = _configured(args)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    # The server and its compiled kernels load only now: `--help` and `--version` need neither.
    import trio

    from buckets._columnar.allocator import keep_large_allocations, tune_gc_for_throughput
    from buckets._columnar.batch_splice import warm_up
    from wireproxy.app import serve_proxy

    tune_gc_for_throughput()
    keep_large_allocations()

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            proxy = await nursery.start(serve_proxy, config)
            # The batch splice's compiled kernels, loaded (or compiled, on a cold cache) in a
            # thread while the proxy already serves: ready before the first stream needs them. A
            # shutdown does not wait for it.
            nursery.start_soon(
                functools.partial(trio.to_thread.run_sync, warm_up, abandon_on_cancel=True)
            )
            logging.getLogger("wireproxy").info(
                "listening on %s:%d, upstream %s",
                config.listen_host,
                proxy.port,
                redact_uri(config.upstream),
            )
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    await proxy.server.shutdown()
                    with trio.move_on_after(config.shutdown_grace_s + 1):
                        while proxy.server.open_connections > 0:
                            await trio.sleep(0.1)
                    nursery.cancel_scope.cancel()
                    return

    trio.run(run)


if __name__ == "__main__":
    main()
