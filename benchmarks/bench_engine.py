"""Catch-up of an N-event backlog over 4 shards: proxy (4 bucket consumers) vs raw oplog reads vs
simcluster's native mongos change stream, side by side in one run.

    .venv/bin/python -m benchmarks.bench_engine [--events 1000000] [--buckets 4]

The cluster, the proxy (`python -m wireproxy`, with its readerProcesses workers) and the
consumers (this process) are separate processes; the proxy's CPU time, workers included, gives
"events per proxy CPU-second". The proxy is measured with each --reader-processes value. Goals:
proxy/raw >= 0.7, proxy/native >= 3, >= 80k events per proxy CPU-second. Each run
also reports the cluster process's CPU time and how busy the machine's cores were (`busy`: the
three processes' CPU over wall time times cores): a mode near 100% is bound by the cores, one
near 1/cores by a single process (the native stream: mongos's merge in the cluster's one loop).
A proxy mode also reports `main process busy`, its main process's CPU over wall time: near 100%,
that process's CPU is the bound (a machine `busy` near 1/cores then only says the others idle).

Each proxy mode reports the proxy's CPU per event (main process and workers), the figure to
compare versions by on a shared machine. `pymongo rp=N` drains the same buckets with pymongo
workers (one thread and client per bucket, replies as RawBSONDocument, each event's `_id` and
operationType read, as bucketspark's read_bucket does): its `consumers` figure, this process's
CPU per event, is what an application's consumer pays for each event. --bucket-by documentKey
deals every namespace over all the buckets (results named ..._by_documentKey).

The raw read asks each getMore for as many entries as the proxy's readers do (BATCH_ENTRIES: the
same reads, without the processing, exhaust as theirs are); `raw 16MiB` lets each reply fill up,
as a getMore does unasked. simcluster serves its large replies at about half the rate per entry
(it builds each one afresh), so that read is the slower one; proxy/raw is taken against the
faster of the two.

`relay` (benchmarks.relay, its own process) reads the shards as the raw read does and forwards
each reply unchanged to a consumer connection per shard, asked for nothing: a proxy's second hop
with no event made, the floor under any proxy on this machine. relay/raw is what that hop alone
costs; the relay's CPU per event is what receiving and sending the bytes costs a process.

The same cluster-wide watch() as the native mode, pointed at a proxy that accelerates change
streams (one proxy process per --watch-reader-processes value), gives what an unchanged consumer
gains: one cursor, so one merge and one consumer, where the proxy modes deal into 4 buckets.

With --baseline-tree DIR (a checkout of another commit, `git worktree add DIR COMMIT`) that
version's proxy runs too, taking turns with this one on the same cluster, the two swapping
places every other round (the one measured second in a round sees the cluster spend more CPU in
some runs, whichever it is; use an even --repeat): two versions compared in one run, where two
runs on this machine differ by more than most changes gain. With
--baseline-tree . and --baseline-flags (e.g. "--splice-threads 1"), two settings of one version
are compared the same way; --proxy-flags adds flags to this version's proxy, --proxy-env and
--baseline-env environment variables to one of the two (e.g. GLIBC_TUNABLES).

--proxy-core keeps the proxies (their reader processes and the relay too) on the last core and
the cluster and the consumers on the others, in every mode, the raw read's included: the proxy
then takes no CPU from the cluster, as on a host of its own, which tells the proxy's own bound
from the machine's (on two cores, the cluster and the consumers share one).

Each proxy first streams the backlog --warmup times (1) unmeasured, its figures printed and kept
apart in the JSON (`warmup`): a fresh proxy's first stream starts its reader processes (about a
second of imports each) and grows its heap to its working size (some 200k page faults), which
made its first run 2 to 3 times slower than the next ones. That is the cost of a proxy's first
minutes, not of its catch-up; a long-running proxy pays it once.

With --repeat R every mode runs R times, the modes taking turns (raw, relay, proxy..., raw 16MiB,
native, then again), and each figure is the median of its R runs: this machine's speed drifts
by a fifth within minutes, and taking turns spreads that drift over every mode alike. The JSON
keeps every run's figures (`runs`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psutil
import pymongo
import trio
from bson import Int64, Timestamp
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

from benchmarks.common import add_out_option, write_results
from benchmarks.relay import oplog_replies
from benchmarks.workloads import WORKLOADS, write_workload
from buckets._columnar.allocator import keep_large_allocations, unfilled_bytearray
from buckets._columnar.oplog_batch import SLACK, batch_in_place
from buckets.oplog_tail import BATCH_ENTRIES
from mongoformats import wire
from simcluster.launcher import spawn_cluster, stop_process
from wireproxy.upstream import UpstreamClosed, UpstreamConnection, open_upstream, parse_hosts

# A mode: its name, what it runs, the proxy process whose CPU it uses (None: no proxy).
_Mode = tuple[str, Callable[[], Awaitable[Any]], "ProxyProcess | None"]


def _ts(key: int) -> Timestamp:
    return Timestamp(key >> 32, key & 0xFFFFFFFF)


async def raw_read(shard_uris: list[str], start: Timestamp, batch_size: int | None) -> int:
    """Every shard's oplog from `start`, read with find/getMore and no processing at all
    (relay.oplog_replies: each getMore asks for `batch_size` entries, None as many as 16 MiB of
    reply holds, and allows exhaust, as the proxy's readers' does); each reply's entries are
    counted where they lie, as `_count` counts every mode's."""
    total = 0

    async def one(uri: str) -> None:
        nonlocal total
        async for data, at in oplog_replies(uri, start, batch_size, SLACK):
            total += len(batch_in_place(data, at)[1])

    async with trio.open_nursery() as nursery:
        for uri in shard_uris:
            nursery.start_soon(one, uri)
    return total


async def _count(
    conn: UpstreamConnection, db: str, cmd: dict[str, Any], *, exhaust: bool = False
) -> tuple[int, int]:
    """(cursor id, documents in its batch) of a find, aggregate or getMore: what every mode's
    consumer does with a reply, raw, native and proxy alike. The consumers share the machine's
    cores with the proxy and the cluster, so they only find the documents in the reply where it
    lies (as a reader finds oplog entries), making no object for each: slicing each out (~0.3 us)
    or decoding it (~1 us) would charge the consumers' work to whatever they read from. With
    `exhaust`, a getMore whose batches are still streaming takes the next one, asking nothing."""
    if conn.streaming:
        data, at = await conn.more_in_place(pad=SLACK, allocate=unfilled_bytearray)
    else:
        data, at = await conn.command_in_place(
            db, cmd, pad=SLACK, exhaust=exhaust, allocate=unfilled_bytearray
        )
    cursor_id, batch = batch_in_place(data, at)
    return cursor_id, len(batch)


async def watch_stream(
    uri: str,
    start: Timestamp,
    want: int,
    stages: list[dict[str, Any]] | None = None,
    **options: Any,
) -> int:
    """A cluster-wide change stream (what a driver's `client.watch()` sends) through `uri`, mongos
    or the accelerating proxy, drained with raw getMores; `options` go to $changeStream."""
    host, port = parse_hosts(uri)[0]
    conn = await open_upstream(host, port)
    spec = {"allChangesForCluster": True, "startAtOperationTime": start, **options}
    cursor_id, got = await _count(
        conn,
        "admin",
        {"aggregate": 1, "pipeline": [{"$changeStream": spec}, *(stages or [])], "cursor": {}},
    )
    while got < want:
        cursor_id, more = await _count(
            conn,
            "admin",
            {"getMore": Int64(cursor_id), "collection": "$cmd.aggregate", "maxTimeMS": 1000},
        )
        got += more
    # As a driver's close() does: otherwise the stream stays open (and reading) until its cursor
    # times out, beside the runs that follow.
    await conn.command(
        "admin", {"killCursors": "$cmd.aggregate", "cursors": [Int64(cursor_id)]}, check=False
    )
    await conn.aclose()
    return got


def _placement() -> tuple[set[int], set[int]]:
    """--proxy-core's cores: (the cluster's and the consumers', the proxies')."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--proxy-core needs at least two cores")
    return set(cores[:-1]), {cores[-1]}


class ProxyProcess:
    """`python -m wireproxy` in its own process, so its CPU time (workers included) is its own."""

    def __init__(
        self,
        upstream: str,
        *flags: str,
        tree: str | None = None,
        module: str = "wireproxy",
        environ: dict[str, str] | None = None,
        cores: set[int] | None = None,
    ) -> None:
        """`tree`: run the proxy of another checkout (its own code first on the path), to
        measure two versions side by side; `module`: another server with the same options
        (benchmarks.relay); `environ`: variables set for it alone (GLIBC_TUNABLES, ...);
        `cores`: the only cores it (and each process and thread it starts) runs on."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.uri = f"mongodb://127.0.0.1:{self.port}/"
        env = {**os.environ, **({"PYTHONPATH": tree} if tree else {}), **(environ or {})}
        # Its log goes to a file, shown at close() if it holds an error (a failed stream's
        # traceback).
        self.log = tempfile.NamedTemporaryFile("w+", prefix="wireproxy-", suffix=".log")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                module,
                "--upstream",
                upstream,
                "--listen",
                f"127.0.0.1:{self.port}",
                *flags,
            ],
            stderr=self.log,
            cwd=tree,
            env=env,
        )
        if cores is not None:
            # Set as it starts, before it has started any thread or process: they inherit it.
            os.sched_setaffinity(self.process.pid, cores)
        self.ps = psutil.Process(self.process.pid)

    async def wait_ready(self) -> None:
        with trio.fail_after(30):
            while True:
                try:
                    conn = await open_upstream("127.0.0.1", self.port)
                    await conn.aclose()
                    return
                except UpstreamClosed:
                    await trio.sleep(0.1)

    def cpu_seconds(self) -> tuple[float, dict[int, float]]:
        """User + system CPU of the proxy's main process, and of each live worker process by pid."""
        workers = {}
        for child in self.ps.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                workers[child.pid] = sum(child.cpu_times()[:2])
        return sum(self.ps.cpu_times()[:2]), workers

    def cpu_used(self, since: tuple[float, dict[int, float]]) -> tuple[float, float]:
        """(main process, workers) CPU seconds used since `since` (a `cpu_seconds()` reading)."""
        main, workers = self.cpu_seconds()
        return main - since[0], sum(cpu - since[1].get(pid, 0.0) for pid, cpu in workers.items())

    def close(self) -> None:
        stop_process(self.process)
        self.log.seek(0)
        text = self.log.read()
        if " ERROR " in text:  # from the first error's line on
            first = text.rfind("\n", 0, text.index(" ERROR ")) + 1
            print(f"the proxy on port {self.port} logged errors:\n{text[first : first + 4000]}")
        self.log.close()


async def proxy_stream(
    proxy: ProxyProcess,
    start: Timestamp,
    want: int,
    buckets: int,
    reader_processes: int,
    bucket_by: str = "namespace",
) -> tuple[int, dict[str, Any]]:
    """Open a stream on the proxy and drain its N buckets, one consumer connection per bucket."""
    # A fresh name each time: re-attaching to an earlier stream would serve its retained events
    # from memory (when the same readerProcesses value is measured twice).
    name = f"bench-rp{reader_processes}-{time.monotonic_ns()}"
    ctl = await open_upstream("127.0.0.1", proxy.port)
    opened = await ctl.command(
        "admin",
        {
            "parallelChangeStream": 1,
            "nBuckets": buckets,
            "name": name,
            "startAtOperationTime": start,
            "readerProcesses": reader_processes,
            "bucketBy": bucket_by,
        },
    )
    total = 0

    async def consume(cursor_id: Any, consumers: trio.Nursery) -> None:
        nonlocal total
        conn = await open_upstream("127.0.0.1", proxy.port)
        try:
            while True:
                # Raw bytes all the way: the consumer counts events without decoding them.
                more = {
                    "getMore": cursor_id,
                    "collection": "$cmd.parallelChangeStream",
                    "maxTimeMS": 200,
                }
                _, got = await _count(conn, "admin", more)
                total += got  # not `total += await ...`: that reads total before the await
                if total >= want:
                    # Every event has come: the other consumers' getMores are waiting out their
                    # maxTimeMS on buckets with nothing left, which is no part of the catch-up
                    # (up to 200 ms of a run of ~1.3 s when they were let finish).
                    consumers.cancel_scope.cancel()
        finally:
            await conn.aclose()

    # Session-less cursors belong to the user, so each consumer drains its bucket on its own
    # connection.
    async with trio.open_nursery() as consumers:
        for cur in opened["cursors"]:
            consumers.start_soon(consume, cur["id"], consumers)
    status = await ctl.command("admin", {"parallelChangeStreamStatus": 1, "name": name})
    await ctl.command(
        "admin",
        {
            "killCursors": "$cmd.parallelChangeStream",
            "cursors": [c["id"] for c in opened["cursors"]],
        },
    )
    await ctl.aclose()
    return total, {"noops": sum(s["noops"] for s in status["streams"][0]["shards"])}


async def relay_stream(relay: ProxyProcess, shards: int, start: Timestamp) -> int:
    """Every shard's oplog through benchmarks.relay, one consumer connection per shard, each
    reply counted as the other modes' consumers count theirs (`_count`)."""
    total = 0
    since = (start.time << 32) | start.inc

    async def one(index: int) -> None:
        nonlocal total
        async with await trio.open_tcp_stream("127.0.0.1", relay.port) as stream:
            await stream.send_all(f"{index} {since}\n".encode())
            sock = stream.socket
            header = bytearray(4)
            while await _fill(sock, memoryview(header)):
                length = int.from_bytes(header, "little")
                frame = unfilled_bytearray(length + SLACK)
                frame[:4] = header
                frame[length:] = bytes(SLACK)
                if not await _fill(sock, memoryview(frame)[4:length]):
                    raise EOFError("the relay closed the stream within a reply")
                span = wire.op_msg_body_span(frame)
                assert span is not None, "the relay sends the shards' own plain OP_MSG replies"
                total += len(batch_in_place(frame, span[0])[1])

    async with trio.open_nursery() as nursery:
        for index in range(shards):
            nursery.start_soon(one, index)
    return total


async def _fill(sock: trio.socket.SocketType, view: memoryview) -> bool:
    """`view` filled from `sock`; False if the stream ended before its first byte."""
    filled = 0
    while filled < len(view):
        n = await sock.recv_into(view[filled:])
        if not n:
            if filled:
                raise EOFError("the relay closed the stream within a reply")
            return False
        filled += n
    return True


_RAW_OPTS: CodecOptions[RawBSONDocument] = CodecOptions(document_class=RawBSONDocument)


async def pymongo_stream(
    proxy: ProxyProcess,
    start: Timestamp,
    want: int,
    buckets: int,
    reader_processes: int,
    bucket_by: str = "namespace",
) -> int:
    """Drain the proxy's N buckets as an application's workers do: a pymongo client per bucket
    (bucketspark's read_bucket), replies decoded as RawBSONDocument and each event's `_id` (its
    resume token, what a worker checkpoints) and operationType read. The workers are threads of
    this process, so this mode's `cpu_seconds_bench_process` is what consuming costs."""
    name = f"bench-pymongo-rp{reader_processes}-{time.monotonic_ns()}"
    total = 0
    lock = threading.Lock()

    def one(bucket: int) -> None:
        nonlocal total
        client: pymongo.MongoClient[Any] = pymongo.MongoClient(proxy.uri)
        try:
            admin = client.admin
            cursor = admin.command(
                {
                    "parallelChangeStream": 1,
                    "nBuckets": buckets,
                    "name": name,
                    "bucket": bucket,
                    "startAtOperationTime": start,
                    "readerProcesses": reader_processes,
                    "bucketBy": bucket_by,
                },
                codec_options=_RAW_OPTS,
            )["cursor"]
            cid, batch = cursor["id"], cursor["firstBatch"]
            while True:
                for ev in batch:
                    ev["_id"]
                    ev["operationType"]
                with lock:
                    total += len(batch)
                    if total >= want:
                        break
                batch = admin.command(
                    {"getMore": cid, "collection": "$cmd.parallelChangeStream", "maxTimeMS": 200},
                    codec_options=_RAW_OPTS,
                )["cursor"]["nextBatch"]
            admin.command({"killCursors": "$cmd.parallelChangeStream", "cursors": [cid]})
        finally:
            client.close()

    def run_all() -> None:
        workers = [threading.Thread(target=one, args=(b,)) for b in range(buckets)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    await trio.to_thread.run_sync(run_all)
    return total


def _taking_turns(modes: list[_Mode], rep: int) -> list[_Mode]:
    """The modes in the order round `rep` runs them: in every other round a proxy and its
    baseline swap places, since the one measured second sees the cluster spend more CPU in some
    runs, whichever it is; alternating spreads that over both."""
    if rep % 2 == 0:
        return modes
    out = list(modes)
    for i in range(len(out) - 1):
        if out[i][0].startswith("proxy rp=") and out[i + 1][0].startswith("baseline rp="):
            out[i], out[i + 1] = out[i + 1], out[i]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument(
        "--reader-processes",
        type=int,
        nargs="*",
        default=[0, 1, 2],
        help="readerProcesses values to measure the proxy with",
    )
    parser.add_argument(
        "--watch-reader-processes",
        type=int,
        nargs="*",
        default=[0, 2],
        help="reader processes of the accelerated watch() measured (one proxy process each)",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each mode, taking turns; medians reported"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="runs of each proxy mode before the measured ones, reported apart (see the docstring)",
    )
    parser.add_argument(
        "--baseline-tree",
        default=None,
        help="a checkout of another version (git worktree add DIR COMMIT): its proxy is measured "
        "too, as 'baseline rp=N' for each --reader-processes value, taking turns with this one",
    )
    parser.add_argument(
        "--proxy-flags",
        default="",
        help="extra `python -m wireproxy` flags for the measured proxy (one string, shell-split)",
    )
    parser.add_argument(
        "--baseline-flags",
        default="",
        help="extra `python -m wireproxy` flags for the --baseline-tree proxy",
    )
    parser.add_argument(
        "--proxy-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the measured proxy alone (repeatable)",
    )
    parser.add_argument(
        "--baseline-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the --baseline-tree proxy alone (repeatable)",
    )
    parser.add_argument(
        "--updates",
        type=float,
        default=0.0,
        help="the share of the backlog that updates documents (a $set and an $inc each; the "
        "rest inserts them); results go to engine_catchup_updates.* when above 0",
    )
    parser.add_argument(
        "--workload",
        choices=("inserts", *WORKLOADS),
        default="inserts",
        help="inserts: the prefilled insert (or --updates) backlog; app: an application-like mix "
        "written through pymongo; ycsb: YCSB workload A's writes (benchmarks/workloads.py); "
        "results go to engine_catchup_<workload>.*",
    )
    parser.add_argument(
        "--relay",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure benchmarks.relay, which forwards the shards' replies unchanged to a "
        "consumer per shard: the floor of any proxy's second hop",
    )
    parser.add_argument("--seed", type=int, default=1, help="the app and ycsb workloads' seed")
    parser.add_argument(
        "--bucket-by",
        choices=("namespace", "documentKey"),
        default="namespace",
        help="the streams' bucketBy: documentKey deals every namespace's events over all the "
        "buckets, so one hot collection does not leave the others idle; results get the suffix "
        "_by_documentKey",
    )
    parser.add_argument(
        "--pymongo-consumers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure the first --reader-processes value with pymongo workers reading the "
        "buckets (RawBSONDocument), whose CPU (this process's) is the consumers' own cost",
    )
    parser.add_argument(
        "--proxy-core",
        action="store_true",
        help="run every proxy process (and its reader processes, and the relay) on the last core "
        "and the cluster and the consumers on the others, in every mode: what the proxy reaches "
        "when it shares no core with the cluster, as on a host of its own (Linux); results get "
        "the suffix _proxy_core",
    )
    add_out_option(parser)
    args = parser.parse_args(argv)
    # With --proxy-core, the cores of this process (the consumers) and of every process it
    # starts but the proxies (the cluster, the workload's writers), and those of the proxies.
    consumer_cores, proxy_cores = _placement() if args.proxy_core else (None, None)
    if consumer_cores is not None:
        # Every thread of this process (numpy's, started at import, too); what it starts
        # inherits this.
        for thread in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(thread), consumer_cores)
    # The consumers (this process, every mode's) receive each reply into a buffer of its size:
    # a bucket's reply of up to 16 MiB was mapped afresh each time, ~30k page faults and ~0.08
    # CPU-s a million events, a tenth of what the proxy spends, on cores the proxy shares. The
    # proxy's own process keeps its large allocations the same way.
    keep_large_allocations()
    if args.workload != "inserts":
        kind = f"the {args.workload} workload"
    else:
        kind = f"{args.updates:.0%} updates" if args.updates else "inserts"
    print(
        f"prefilling {args.events:,} writes ({kind}) over 4 shards in a cluster subprocess ...",
        flush=True,
    )
    # Idle shards write their periodic noop every 0.5 s instead of a server's 10 s: the native
    # stream's last events wait for every shard's mark, and 10 s of that tail would be a fixed
    # cost in its rate, not throughput (the proxy writes its own notes and does not wait).
    if args.workload == "inserts":
        cluster = spawn_cluster(
            shards=4, prefill_events=args.events, prefill_updates=args.updates, periodic_noop_s=0.5
        )
        events = args.events
    else:
        cluster = spawn_cluster(shards=4, periodic_noop_s=0.5)
        events = write_workload(cluster.uri, args.workload, args.events, seed=args.seed)
    # What the writers left is kept to the end: frozen, no collection of this process (the
    # consumers') walks it again in the middle of a measured run.
    gc.collect()
    gc.freeze()
    # Streams are closed a second after their consumers leave (not the default 5 minutes), so the
    # runs that follow do not share the proxy with the retention of earlier ones.
    proxy = ProxyProcess(
        cluster.uri,
        "--stream-idle-teardown-s",
        "1",
        *shlex.split(args.proxy_flags),
        environ=dict(v.split("=", 1) for v in args.proxy_env),
        cores=proxy_cores,
    )
    baseline = (
        ProxyProcess(
            cluster.uri,
            "--stream-idle-teardown-s",
            "1",
            *shlex.split(args.baseline_flags),
            tree=args.baseline_tree,
            environ=dict(v.split("=", 1) for v in args.baseline_env),
            cores=proxy_cores,
        )
        if args.baseline_tree
        else None
    )
    # The unchanged consumer: a driver's cluster-wide watch() pointed at a proxy that accelerates
    # change streams. Its readerProcesses is the proxy's setting, so each value is its own proxy.
    watch_proxies = {
        rp: ProxyProcess(
            cluster.uri,
            "--accelerate-change-streams",
            "--reader-processes",
            str(rp),
            cores=proxy_cores,
        )
        for rp in args.watch_reader_processes
    }
    shard_uris = list(cluster.info["shards"].values())
    relay = (
        ProxyProcess(",".join(shard_uris), module="benchmarks.relay", cores=proxy_cores)
        if args.relay
        else None
    )
    every_proxy = [
        proxy,
        *watch_proxies.values(),
        *([baseline] if baseline else []),
        *([relay] if relay else []),
    ]
    try:
        start = _ts(min(cluster.info["start"]))
        results: dict[str, dict[str, Any]] = {}
        # (name, what it runs, the proxy process whose CPU it uses, or None)
        # The raw read comes right before the proxy's modes, the slower raw read and the native
        # stream (~20 s) after them: this machine's speed drifts within a minute, and the ratio
        # the goal is set on compares the raw read with the proxy's.
        modes: list[_Mode] = [("raw", lambda: raw_read(shard_uris, start, BATCH_ENTRIES), None)]
        if relay is not None:
            modes.append(("relay", lambda: relay_stream(relay, len(shard_uris), start), relay))
        for rp in args.reader_processes:
            modes.append(
                (
                    f"proxy rp={rp}",
                    functools.partial(
                        proxy_stream, proxy, start, events, args.buckets, rp, args.bucket_by
                    ),
                    proxy,
                )
            )
            if baseline is not None:
                modes.append(
                    (
                        f"baseline rp={rp}",
                        functools.partial(
                            proxy_stream, baseline, start, events, args.buckets, rp, args.bucket_by
                        ),
                        baseline,
                    )
                )
        if args.pymongo_consumers and args.reader_processes:
            rp = args.reader_processes[0]
            modes.append(
                (
                    f"pymongo rp={rp}",
                    functools.partial(
                        pymongo_stream, proxy, start, events, args.buckets, rp, args.bucket_by
                    ),
                    proxy,
                )
            )
        for rp, watch_proxy in watch_proxies.items():
            modes.append(
                (
                    f"watch() rp={rp}",
                    functools.partial(watch_stream, watch_proxy.uri, start, events),
                    watch_proxy,
                )
            )
        modes += [
            ("raw 16MiB", lambda: raw_read(shard_uris, start, None), None),
            ("native", lambda: watch_stream(cluster.uri, start, events), None),
        ]

        runs: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in modes}
        warmups: dict[str, list[dict[str, float]]] = {
            name: [] for name, _, used in modes if used is not None
        }

        async def run() -> None:
            for each in every_proxy:
                await each.wait_ready()
            for rep in range(args.warmup):
                for name, fn, used in modes:
                    if used is not None:
                        warmups[name].append(
                            await measure(name, fn, used, f"warm-up {rep + 1}/{args.warmup}")
                        )
            for rep in range(args.repeat):
                for name, fn, used in _taking_turns(modes, rep):
                    runs[name].append(await measure(name, fn, used, f"{rep + 1}/{args.repeat}"))

        cluster_ps = psutil.Process(cluster.process.pid)

        def cluster_cpu() -> float:
            return sum(cluster_ps.cpu_times()[:2])

        async def measure(
            name: str, fn: Callable[[], Awaitable[Any]], used: ProxyProcess | None, run_name: str
        ) -> dict[str, float]:
            wall, cpu, in_cluster = time.perf_counter(), time.process_time(), cluster_cpu()
            proxy_cpu = used.cpu_seconds() if used is not None else None
            out = await fn()
            count = out[0] if isinstance(out, tuple) else out
            wall, cpu, in_cluster = (
                time.perf_counter() - wall,
                time.process_time() - cpu,
                cluster_cpu() - in_cluster,
            )
            # Where the machine's CPU went: the cluster's process (every shard and mongos, one
            # trio loop), the consumers (this process) and the proxy's. `busy` near 1 means the
            # run was bound by the cores, not by any one process.
            # The consumers' CPU per event: this process reads every mode's replies (a pymongo
            # mode's workers decode them as an application's would).
            result = {
                "events": count,
                "seconds": wall,
                "events_per_s": count / wall,
                "cpu_seconds_bench_process": cpu,
                "cluster_cpu_seconds": in_cluster,
                "consumer_cpu_us_per_event": 1e6 * cpu / max(count, 1),
            }
            line = (
                f"{run_name} {name:14} {count:>10,} in {wall:6.1f}s  {count / wall:>10,.0f}/s"
                f"  cluster {in_cluster:4.1f} CPU-s"
                f"  consumers {1e6 * cpu / max(count, 1):5.2f} us/event"
            )
            total = 0.0
            if used is not None and proxy_cpu is not None:
                main_cpu, worker_cpu = used.cpu_used(proxy_cpu)
                total = main_cpu + worker_cpu
                # The main process merges, deals and serves every event whatever readerProcesses
                # is: events per main-process CPU-second is the most the proxy can reach with
                # enough cores for its workers. Its share of the wall time is how busy the one
                # core it runs on was (`busy` is over all the machine's cores): near 100%, the
                # main process's CPU is the bound; well below, it waits (on shards, consumers).
                result.update(
                    proxy_cpu_seconds=total,
                    main_process_cpu_seconds=main_cpu,
                    worker_cpu_seconds=worker_cpu,
                    events_per_proxy_cpu_second=count / total,
                    events_per_main_process_cpu_second=count / main_cpu,
                    proxy_cpu_us_per_event=1e6 * total / count,
                    main_process_busy=main_cpu / wall,
                )
                line += (
                    f"  proxy {1e6 * total / count:5.1f} us/event,"
                    f" {count / total:>8,.0f} events per proxy CPU-second"
                    f"  ({count / main_cpu:,.0f} per main-process CPU-second,"
                    f" main process busy {main_cpu / wall:.0%})"
                )
            result["busy"] = (cpu + in_cluster + total) / (wall * (os.cpu_count() or 1))
            print(f"{line}  busy {result['busy']:.0%}", flush=True)
            if used is not None:
                await trio.sleep(3)  # the stream's teardown is not charged to the next mode
            return result

        trio.run(run)
    finally:
        for each in every_proxy:
            each.close()
        cluster.close()
    # Each figure of each mode: its median over the runs.
    for name, measured in runs.items():
        results[name] = {k: statistics.median(r[k] for r in measured) for k in measured[0]}
        results[name]["runs"] = measured
        if warmups.get(name):
            results[name]["warmup"] = warmups[name]
    # The raw read the proxy is held to: the faster of the two (the readers' batch size, so far).
    raw_mode = max(("raw", "raw 16MiB"), key=lambda k: results[k]["events_per_s"])
    raw = results[raw_mode]
    native = results["native"]
    best = max(
        (k for k in results if k.startswith("proxy")), key=lambda k: results[k]["events_per_s"]
    )
    proxy_best = results[best]
    figures = {
        "events": events,
        "writes": args.events,
        "workload": args.workload,
        "seed": args.seed,
        "bucket_by": args.bucket_by,
        "updates": args.updates,
        "buckets": args.buckets,
        "cpus": os.cpu_count(),
        "repeat": args.repeat,
        "warmup": args.warmup,
        "modes": results,
        "best_proxy_mode": best,
        "raw_mode": raw_mode,
        "proxy_over_raw": proxy_best["events_per_s"] / raw["events_per_s"],
        # The same ratio taken within each repetition (the two modes measured a few seconds
        # apart), then its median: the machine's drift between repetitions moves it less.
        "proxy_over_raw_paired": statistics.median(
            p["events_per_s"] / r["events_per_s"]
            for p, r in zip(runs[best], runs[raw_mode], strict=True)
        ),
        "proxy_over_native": proxy_best["events_per_s"] / native["events_per_s"],
        "proxy_main_process_ceiling_over_native": max(
            results[k]["events_per_main_process_cpu_second"]
            for k in results
            if k.startswith("proxy")
        )
        / native["events_per_s"],
        "proxy_events_per_cpu_second": max(
            results[k]["events_per_proxy_cpu_second"] for k in results if k.startswith("proxy")
        ),
        "reader_processes_scaling": {
            k: results[k]["events_per_s"] for k in results if k.startswith("proxy")
        },
    }
    if "relay" in results:
        figures.update(
            relay_over_raw=results["relay"]["events_per_s"] / raw["events_per_s"],
            proxy_over_relay=proxy_best["events_per_s"] / results["relay"]["events_per_s"],
            relay_cpu_us_per_event=results["relay"]["proxy_cpu_us_per_event"],
        )
    watches = [k for k in results if k.startswith("watch()")]
    if watches:
        best_watch = max(watches, key=lambda k: results[k]["events_per_s"])
        figures.update(
            best_watch_mode=best_watch,
            watch_over_native=results[best_watch]["events_per_s"] / native["events_per_s"],
        )
    print(
        f"proxy/raw    {figures['proxy_over_raw']:.2f}   (goal >= 0.7; {best} over {raw_mode}; "
        f"{figures['proxy_over_raw_paired']:.2f} as the median of each repetition's ratio)"
    )
    if "relay" in results:
        print(
            f"relay/raw    {figures['relay_over_raw']:.2f}   (the shards' replies forwarded "
            f"unchanged, {figures['relay_cpu_us_per_event']:.2f} us of the relay's CPU an event:"
            f" a second hop's floor); proxy/relay {figures['proxy_over_relay']:.2f}"
        )
    print(f"proxy/native {figures['proxy_over_native']:.2f}   (goal >= 3)")
    print(
        "proxy main-process ceiling/native "
        f"{figures['proxy_main_process_ceiling_over_native']:.2f}"
        "   (the most readerProcesses can reach with a core per worker)"
    )
    print(
        f"proxy events per CPU-second {figures['proxy_events_per_cpu_second']:,.0f}"
        "   (goal >= 80,000)"
    )
    if watches:
        print(
            f"accelerated watch()/native {figures['watch_over_native']:.2f}"
            f"   ({figures['best_watch_mode']}: the same consumer, pointed at the proxy)"
        )
    figures["proxy_flags"] = args.proxy_flags
    figures["proxy_env"] = args.proxy_env
    if baseline is not None:
        figures["baseline_flags"] = args.baseline_flags
        figures["baseline_env"] = args.baseline_env
        figures["over_baseline"] = {
            f"rp={rp}": {
                f: results[f"proxy rp={rp}"][f] / results[f"baseline rp={rp}"][f]
                for f in ("events_per_s", "events_per_proxy_cpu_second")
            }
            for rp in args.reader_processes
        }
        for rp, ratio in figures["over_baseline"].items():
            print(
                f"proxy/baseline {rp}: {ratio['events_per_s']:.2f} events/s, "
                f"{ratio['events_per_proxy_cpu_second']:.2f} per proxy CPU-second"
                f" ({args.baseline_tree})"
            )
    if args.workload != "inserts":
        result_name = f"engine_catchup_{args.workload}"
    else:
        result_name = "engine_catchup_updates" if args.updates else "engine_catchup"
    if args.bucket_by != "namespace":
        result_name += f"_by_{args.bucket_by}"
    figures["proxy_core"] = args.proxy_core
    if args.proxy_core:
        result_name += "_proxy_core"
    pymongo_modes = [k for k in results if k.startswith("pymongo")]
    if pymongo_modes:
        figures["pymongo_consumer_cpu_us_per_event"] = results[pymongo_modes[0]][
            "consumer_cpu_us_per_event"
        ]
        print(
            "pymongo consumers' CPU "
            f"{figures['pymongo_consumer_cpu_us_per_event']:.2f} us per event"
            f" ({pymongo_modes[0]}: RawBSONDocument replies,"
            " each event's _id and operationType read)"
        )
    path = write_results(
        args.out,
        result_name,
        figures,
        {k: v["events_per_s"] for k, v in results.items()},
        ylabel="events/s",
        title=f"catch-up of {events:,} events ({kind}) over 4 shards",
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
