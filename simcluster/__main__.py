"""`simcluster --shards 3 --members 3 --port 27017`: run a simulated sharded cluster and print its addresses."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import ssl

import trio

from simcluster.cluster import open_cluster


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="simcluster", description=__doc__)
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--members", type=int, default=1, help="members per shard replica set")
    parser.add_argument("--replication-lag-s", type=float, default=0.0, help="how far secondaries trail")
    parser.add_argument("--election-timeout-s", type=float, default=10.0, help="electionTimeoutMillis / 1000")
    parser.add_argument("--spare-shards", type=int, default=0,
                        help="empty replica sets started beside the cluster, for addShard")
    parser.add_argument("--tls-cert-file", default="",
                        help="PEM with certificate and key: every process then requires TLS (requireTLS)")
    parser.add_argument("--user", action="append", default=[], metavar="NAME:PASSWORD",
                        help="require SCRAM-SHA-256 authentication and add this admin user (repeatable)")
    parser.add_argument("--role", action="append", default=[], metavar="NAME:ROLE@DB",
                        help="give user NAME this built-in role (read, readWrite, dbAdmin, readAnyDatabase, "
                             "readWriteAnyDatabase, clusterAdmin, root) instead of root (repeatable)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=27017, help="mongos port; shards use the next ones (0 = any)")
    parser.add_argument("--version", choices=["5.0", "6.0", "7.0", "8.0"], default="7.0")
    parser.add_argument("--oplog-mb", type=int, default=1024)
    parser.add_argument("--periodic-noop-s", type=float, default=10.0, help="periodicNoopIntervalSecs")
    parser.add_argument("--prefill", type=int, default=0, help="insert this many documents before serving")
    parser.add_argument("--json", action="store_true", help="print the addresses as one JSON line")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)

    async def run() -> None:
        async with open_cluster(shards=args.shards, members=args.members, host=args.host, port=args.port,
                                version=args.version, oplog_bytes=args.oplog_mb << 20,
                                periodic_noop_s=args.periodic_noop_s, replication_lag_s=args.replication_lag_s,
                                election_timeout_s=args.election_timeout_s,
                                spare_shards=args.spare_shards, tls=_server_tls(args.tls_cert_file),
                                users=dict(u.split(":", 1) for u in args.user) or None,
                                roles=_roles(args.role)) as cluster:
            if args.prefill:
                from simcluster.launcher import prefill

                prefill(cluster, args.prefill)
            if args.json:
                info = {"mongos": cluster.uri, "shards": {s: cluster.shard_uri(s) for s in cluster.shards},
                        "start": [cluster.shards[s].oplog.first_key() for s in sorted(cluster.shards)]}
                print(json.dumps(info), flush=True)
            else:
                print(cluster.describe(), flush=True)
            await trio.sleep_forever()

    with contextlib.suppress(KeyboardInterrupt):
        trio.run(run)


def _roles(specs: list[str]) -> dict[str, list[tuple[str, str]]]:
    """--role NAME:ROLE@DB flags -> {name: [(role, db)]}."""
    from mongoformats.privileges import BUILTIN_ROLES

    roles: dict[str, list[tuple[str, str]]] = {}
    for spec in specs:
        name, _, grant = spec.partition(":")
        role, _, db = grant.partition("@")
        if role not in BUILTIN_ROLES:
            raise SystemExit(f"--role {spec}: unknown role {role!r} (one of {', '.join(BUILTIN_ROLES)})")
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
