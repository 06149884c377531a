"""`simcluster --shards 3 --members 3 --port 27017`: run a simulated sharded cluster and print its
addresses.

Its mongos listens on --port (27017, as mongos does) and the shard members on the ports from
--shard-port (28017 by default, clear of the proxy's default 27018), so that `simcluster` and
`wireproxy --upstream mongodb://127.0.0.1:27017` both run with their default ports.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import gc
import importlib.metadata
import json
import logging
import math
import os
import ssl
import sys
from collections.abc import Callable, Sequence

import trio

from simcluster.cluster import open_cluster

DEFAULT_PORT = 27017
# Shard members from --port + 1000: away from 27018, where the proxy listens.
SHARD_PORT_OFFSET = 1000
MONGODB_VERSIONS = ["5.0", "6.0", "7.0", "8.0"]
FREEZE_EVERY_S = 1.0  # see _freeze_what_lives
# mallopt's parameter numbers (malloc.h) and the values _keep_large_replies_in_the_heap sets.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # the most glibc's own sliding threshold reaches
TRIM_THRESHOLD = 512 << 20
LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
# The distribution simcluster ships in; its metadata holds the one version of every command.
DISTRIBUTION = "parallelchangestream"


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    argv = sys.argv[1:] if argv is None else argv
    args = _parse(parser, argv)
    shard_port = _shard_port(args.port, args.shard_port)
    logging.basicConfig(level=args.log_level)
    _keep_large_replies_in_the_heap()

    async def run() -> None:
        async with open_cluster(
            shards=args.shards,
            members=args.members,
            host=args.host,
            port=args.port,
            shard_port=shard_port,
            version=args.mongodb_version,
            oplog_bytes=args.oplog_mb << 20,
            periodic_noop_s=args.periodic_noop_s,
            replication_lag_s=args.replication_lag_s,
            election_timeout_s=args.election_timeout_s,
            spare_shards=args.spare_shards,
            tls=_server_tls(args.tls_cert_file),
            users=dict(u.split(":", 1) for u in args.user) or None,
            roles=_roles(args.role),
        ) as cluster:
            if args.prefill:
                from simcluster.launcher import prefill

                prefill(cluster, args.prefill, updates=args.prefill_updates)
            if args.json:
                info = {
                    "mongos": cluster.uri,
                    "shards": {s: cluster.shard_uri(s) for s in cluster.shards},
                    "start": [cluster.shards[s].oplog.first_key() for s in sorted(cluster.shards)],
                }
                print(json.dumps(info), flush=True)
            else:
                print(cluster.describe(), flush=True)
            await _freeze_what_lives(FREEZE_EVERY_S)

    with contextlib.suppress(KeyboardInterrupt):
        trio.run(run)


async def _freeze_what_lives(every_s: float) -> None:
    """Every `every_s`, move what the process holds out of the cyclic collector's sight.

    Each member keeps its documents as nested dicts and lists: millions of small containers for
    a backlog of a few hundred thousand documents, which a full collection walks (hundreds of
    milliseconds, the whole cluster stopped, at points that depend on allocation counts). A
    server has no such pauses, and a stand-in for one must not charge them at random to whatever
    reads from it or waits for its writes. Frozen objects are still freed when nothing refers to
    them; only reference cycles among them stay (documents hold none; a closed connection may
    leave a few small ones). Collections then walk what the last interval made.
    """
    while True:
        await trio.sleep(every_s)
        gc.freeze()


def _keep_large_replies_in_the_heap() -> bool:
    """Have glibc's malloc keep freed replies' memory for the next ones; False where it cannot
    (another C library) or where MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ already say.

    A getMore's reply is one joined bytes object of up to 16 MiB. glibc trims the heap's top
    once more than twice its sliding mmap threshold is free there, which a few shards' replies
    freed together exceed, so the next replies faulted their pages in afresh: the kernel zeroing
    pages took a large and varying share of the cluster's time. A server keeps such memory (its
    allocator caches it), and a stand-in for one must not charge page faults to whatever reads
    from it. The process may then hold up to TRIM_THRESHOLD of freed memory after a burst.
    (ctypes rather than the proxy's own setting, buckets/_columnar/allocator.py: simcluster
    imports nothing of the proxy's.)
    """
    if any(name in os.environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "gnu_get_libc_version"):
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="simcluster", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {_package_version()}",
        help="print the package's version and exit",
    )
    parser.add_argument("--shards", type=_at_least(int, 0), default=3)
    parser.add_argument(
        "--members",
        type=_at_least(int, 1, 50),
        default=1,
        help="members per shard replica set (a replica set has at most 50)",
    )
    parser.add_argument(
        "--replication-lag-s",
        type=_at_least(float, 0),
        default=0.0,
        help="how far secondaries trail",
    )
    parser.add_argument(
        "--election-timeout-s",
        type=_at_least(float, 0.001),
        default=10.0,
        help="electionTimeoutMillis / 1000",
    )
    parser.add_argument(
        "--spare-shards",
        type=_at_least(int, 0),
        default=0,
        help="empty replica sets started beside the cluster, for addShard",
    )
    parser.add_argument(
        "--tls-cert-file",
        default="",
        help="PEM with certificate and key: every process then requires TLS (requireTLS)",
    )
    parser.add_argument(
        "--user",
        action="append",
        default=[],
        metavar="NAME:PASSWORD",
        help="require SCRAM-SHA-256 authentication and add this admin user (repeatable)",
    )
    parser.add_argument(
        "--role",
        action="append",
        default=[],
        metavar="NAME:ROLE@DB",
        help="give user NAME this built-in role (read, readWrite, dbAdmin, readAnyDatabase, "
        "readWriteAnyDatabase, dbAdminAnyDatabase, clusterMonitor, hostManager, "
        "clusterManager, clusterAdmin, root) instead of root (repeatable)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--port",
        type=_at_least(int, 0, 65535),
        default=DEFAULT_PORT,
        help="mongos port (0 = any free port, for mongos and shards)",
    )
    parser.add_argument(
        "--shard-port",
        type=_at_least(int, 0, 65535),
        default=None,
        help=f"first port of the shard members, one each in turn "
        f"(default: --port + {SHARD_PORT_OFFSET}; 0 = any free ports)",
    )
    parser.add_argument(
        "--mongodb-version",
        choices=MONGODB_VERSIONS,
        default="7.0",
        help="the MongoDB version to emulate (default: 7.0)",
    )
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default="INFO")
    parser.add_argument("--oplog-mb", type=_at_least(int, 1), default=1024)
    parser.add_argument(
        "--periodic-noop-s",
        type=_at_least(float, 0.001),
        default=10.0,
        help="periodicNoopIntervalSecs",
    )
    parser.add_argument(
        "--prefill",
        type=_at_least(int, 0),
        default=0,
        help="write this many documents before serving",
    )
    parser.add_argument(
        "--prefill-updates",
        type=_at_least(float, 0.0, 0.99),
        default=0.0,
        help="the share of the prefill's writes that update documents it inserted",
    )
    parser.add_argument("--json", action="store_true", help="print the addresses as one JSON line")
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """The arguments, refused with a usage error where they cannot work together."""
    if (old := _old_version_value(argv)) is not None:
        parser.error(
            f"--version {old}: use --mongodb-version {old} to emulate MongoDB {old} "
            f"(--version prints the package's version)"
        )
    args = parser.parse_args(argv)
    shard_port = _shard_port(args.port, args.shard_port)
    shard_processes = (args.shards + args.spare_shards) * args.members
    if shard_port and shard_port + shard_processes - 1 > 65535:
        parser.error(
            f"--port {args.port}: the cluster's {1 + shard_processes} processes take the "
            f"ports from it (mongos {args.port}, shard members from {shard_port}), past 65535"
        )
    if bad := [u for u in args.user if ":" not in u]:
        parser.error(f"--user {bad[0]}: expected NAME:PASSWORD")
    return args


def _package_version() -> str:
    """The installed distribution's version, read here rather than through the proxy's command
    helpers: simcluster imports nothing of the proxy."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"


def _old_version_value(argv: Sequence[str]) -> str | None:
    """VALUE of `--version VALUE` or `--version=VALUE`: the MongoDB version flag's former spelling,
    which would print the package's version and run nothing; refused with a hint instead."""
    for i, arg in enumerate(argv):
        if arg == "--":
            return None
        if arg.startswith("--version="):
            return arg.partition("=")[2]
        if arg == "--version" and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    return None


def _shard_port(port: int, shard_port: int | None) -> int:
    """The shard members' first port: --shard-port, else --port + SHARD_PORT_OFFSET (any free
    ports when mongos takes any)."""
    if shard_port is not None:
        return shard_port
    return port + SHARD_PORT_OFFSET if port else 0


def _at_least(
    kind: type[int] | type[float], low: float, high: float | None = None
) -> Callable[[str], float]:
    """An argparse type: a number of `kind` in [low, high]; argparse prints the message after the
    flag."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be {'an integer' if kind is int else 'a number'}, not {text!r}"
            ) from None
        if not (low <= value <= (high if high is not None else math.inf)):  # NaN fails too
            span = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {span}, not {text}")
        return value

    return parse


def _roles(specs: list[str]) -> dict[str, list[tuple[str, str]]]:
    """--role NAME:ROLE@DB flags -> {name: [(role, db)]}."""
    from mongoformats.privileges import BUILTIN_ROLES

    roles: dict[str, list[tuple[str, str]]] = {}
    for spec in specs:
        name, _, grant = spec.partition(":")
        role, _, db = grant.partition("@")
        if role not in BUILTIN_ROLES:
            raise SystemExit(
                f"--role {spec}: unknown role {role!r} (one of {', '.join(BUILTIN_ROLES)})"
            )
        roles.setdefault(name, []).append((role, db or "admin"))
    return roles


def _server_tls(cert_file: str) -> ssl.SSLContext | None:
    if not cert_file:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert_file)
    return ctx


if __name__ == "__main__":
    main()
