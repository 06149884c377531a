"""Catch-up of an N-event backlog into 4 bucket consumers, once with every consumer reading and
once with one of them stalled for --stall-s seconds, side by side in one run.

    .venv/bin/python -m benchmarks.bench_stall [--events 1000000] [--stall-s 30]

A stalled consumer's bucket fills and falls behind instead of stopping the merge
(buckets/catch_up.py); once its consumer reads again it catches up from a replay of the oplogs.
Reported: the other three buckets' rate (their events over the time until the last of them had
all of its events) in both runs and its ratio (goal: stalled / unstalled >= 0.9), and whether
the stalled bucket caught up with its full count (its count in the unstalled run), with one
more getMore returning nothing. The backlog is dealt by documentKey, so the 4 buckets get about
a quarter each; the bucket buffer is small (--bucket-buffer-bytes) so that a stall fills it
within the run at any --events.
"""

from __future__ import annotations

import argparse
import hashlib
import struct
import time
from typing import Any

import trio

from benchmarks.bench_engine import ProxyProcess, _ts
from benchmarks.common import add_out_option, write_results
from buckets._columnar.allocator import keep_large_allocations, unfilled_bytearray
from buckets._columnar.oplog_batch import SLACK, batch_in_place
from simcluster.launcher import spawn_cluster
from wireproxy.upstream import open_upstream

NS = "$cmd.parallelChangeStream"
# An event's first element is its resume token {_data: "<hex>"}: 4 bytes of event length, type
# and "_id", the token's length, type and "_data", then the string's length and the string.
_TOKEN_AT = 4 + 1 + 4 + 4 + 1 + 6


class Sequence:
    """What one bucket's consumer read, event by event, checked as it comes: each token above the
    one before (order kept, nothing twice), and a digest of the whole sequence to compare with
    another run's. Only the token's bytes are sliced out of the reply, so the check costs each
    consumer about the same in both runs."""

    def __init__(self) -> None:
        self.count = 0
        self.last = b""
        self.out_of_order = 0
        self.digest = hashlib.blake2b(digest_size=16)

    def add(self, data: bytes | bytearray, starts: Any) -> None:
        for start in starts.tolist():
            at = start + _TOKEN_AT
            (n,) = struct.unpack_from("<i", data, at)
            token = bytes(data[at + 4 : at + 3 + n])
            if token <= self.last:
                self.out_of_order += 1
            self.last = token
            self.digest.update(token)
        self.count += len(starts)


async def _read(conn: Any, cmd: dict[str, Any], seq: Sequence) -> int:
    """One getMore; its events go into `seq`; how many there were."""
    data, at = await conn.command_in_place("admin", cmd, pad=SLACK, allocate=unfilled_bytearray)
    _, batch = batch_in_place(data, at)
    seq.add(batch.data, batch.starts)
    return len(batch.starts)


async def _stream(
    proxy: ProxyProcess,
    start: Any,
    args: argparse.Namespace,
    targets: list[int] | None,
    stalled: int | None,
) -> dict[str, Any]:
    """Open a 4-bucket stream at `start` and drain it, one consumer connection per bucket.
    Without `targets` (the unstalled run) the buckets are drained until --events have come in
    all, giving each bucket's count; with them, each consumer reads its bucket's count, and
    consumer `stalled` reads one batch, then waits --stall-s seconds (a consumer that never came
    would hold the merge for the first read's grace first, buckets/catch_up.py)."""
    name = f"stall-{stalled}-{time.monotonic_ns()}"
    ctl = await open_upstream("127.0.0.1", proxy.port)
    opened = await ctl.command(
        "admin",
        {
            "parallelChangeStream": 1,
            "nBuckets": args.buckets,
            "name": name,
            "startAtOperationTime": start,
            "bucketBy": "documentKey",
            "bucketBufferBytes": args.bucket_buffer_bytes,
        },
    )
    counts = [0] * args.buckets
    seqs = [Sequence() for _ in range(args.buckets)]
    done_at: list[float | None] = [None] * args.buckets
    extra = [0] * args.buckets
    began = time.perf_counter()
    peak: dict[str, Any] = {
        "heldBytes": 0,
        "fellBehind": 0,
        "fellBehindPerBucket": [0] * args.buckets,
    }

    async def consume(b: int, cursor_id: Any, consumers: trio.Nursery) -> None:
        conn = await open_upstream("127.0.0.1", proxy.port)
        more = {"getMore": cursor_id, "collection": NS, "maxTimeMS": 200}
        try:
            if b == stalled:  # it starts reading as the others do, then stops for --stall-s
                counts[b] = await _read(conn, more, seqs[b])
                await trio.sleep(args.stall_s)
            while targets is None or counts[b] < targets[b]:
                counts[b] += await _read(conn, more, seqs[b])
                if targets is None and sum(counts) >= args.events:
                    consumers.cancel_scope.cancel()
            done_at[b] = time.perf_counter() - began
            # Nothing more may come: a duplicate would show here.
            extra[b] = await _read(conn, {**more, "maxTimeMS": 500}, seqs[b])
        finally:
            await conn.aclose()

    async def watch_status() -> None:
        while True:
            status = (await ctl.command("admin", {"parallelChangeStreamStatus": 1, "name": name}))[
                "streams"
            ][0]
            peak["heldBytes"] = max(peak["heldBytes"], status["memory"]["heldBytes"])
            peak["fellBehind"] = max(
                peak["fellBehind"], sum(b["fellBehind"] for b in status["buckets"])
            )
            peak["fellBehindPerBucket"] = [
                max(was, b["fellBehind"])
                for was, b in zip(peak["fellBehindPerBucket"], status["buckets"], strict=True)
            ]
            await trio.sleep(0.5)

    async with trio.open_nursery() as outer:
        outer.start_soon(watch_status)
        async with trio.open_nursery() as consumers:
            for cur in opened["cursors"]:
                consumers.start_soon(consume, cur["bucket"], cur["id"], consumers)
        outer.cancel_scope.cancel()
    wall = time.perf_counter() - began
    await ctl.command("admin", {"dropParallelChangeStream": name})
    await ctl.aclose()
    others = [
        b
        for b in range(args.buckets)
        if b != (stalled if stalled is not None else args.buckets - 1)
    ]
    others_s = max(done_at[b] or wall for b in others)
    return {
        "counts": counts,
        "seconds": wall,
        "doneAt": done_at,
        "extraEvents": extra,
        "outOfOrder": [q.out_of_order for q in seqs],
        "digests": [q.digest.hexdigest() for q in seqs],
        "others_events_per_s": sum(counts[b] for b in others) / others_s,
        "others_seconds": others_s,
        "peakHeldBytes": peak["heldBytes"],
        "fellBehind": peak["fellBehind"],
        "fellBehindPerBucket": peak["fellBehindPerBucket"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument(
        "--stall-s", type=float, default=30.0, help="how long the stalled consumer waits"
    )
    parser.add_argument("--bucket-buffer-bytes", type=int, default=4 << 20)
    parser.add_argument(
        "--warmup", type=int, default=1, help="unmeasured runs first, without a stall"
    )
    add_out_option(parser)
    args = parser.parse_args(argv)
    keep_large_allocations()
    print(
        f"prefilling {args.events:,} inserts over 4 shards in a cluster subprocess ...", flush=True
    )
    cluster = spawn_cluster(shards=4, prefill_events=args.events, periodic_noop_s=0.5)
    proxy = ProxyProcess(cluster.uri, "--stream-idle-teardown-s", "1")
    stalled = args.buckets - 1
    try:
        start = _ts(min(cluster.info["start"]))

        async def run() -> dict[str, dict[str, Any]]:
            await proxy.wait_ready()
            for _ in range(
                args.warmup
            ):  # a fresh proxy's first stream pays its start-up (bench_engine)
                await _stream(proxy, start, args, None, None)
            base = await _stream(proxy, start, args, None, None)
            stall = await _stream(proxy, start, args, base["counts"], stalled)
            return {"no stall": base, "stall": stall}

        results = trio.run(run)
    finally:
        proxy.close()
        cluster.close()
    base, stall = results["no stall"], results["stall"]
    ratio = stall["others_events_per_s"] / base["others_events_per_s"]
    # Event by event: each bucket read the same sequence of tokens in both runs (the digests),
    # each in token order with none twice, the unstalled run read the backlog exactly, and no
    # bucket had more after it.
    same = [a == b for a, b in zip(base["digests"], stall["digests"], strict=True)]
    ordered = not any(base["outOfOrder"]) and not any(stall["outOfOrder"])
    caught_up = same[stalled] and ordered and not any(stall["extraEvents"])
    every_bucket_exact = (
        all(same)
        and ordered
        and sum(base["counts"]) == args.events
        and not any(stall["extraEvents"])
    )
    for label, r in results.items():
        print(
            f"{label:>9}: other buckets {r['others_events_per_s']:>10,.0f} events/s "
            f"({r['others_seconds']:.2f} s), counts {r['counts']}, "
            f"fell behind {r['fellBehind']}x {r['fellBehindPerBucket']}, "
            f"peak held {r['peakHeldBytes'] / 2**20:.1f} MiB"
        )
    print(f"other buckets' rate, stall / no stall: {ratio:.2f} (goal >= 0.90)")
    print(
        f"stalled bucket {stalled}: {stall['counts'][stalled]:,} of "
        f"{base['counts'][stalled]:,} events, caught up {stall['doneAt'][stalled]:.1f} s after "
        f"the start; the same events as unstalled, in order, none twice: {caught_up}"
    )
    print(f"every bucket read the same events as unstalled, in order, once: {every_bucket_exact}")
    figures = {
        "events": args.events,
        "buckets": args.buckets,
        "stall_s": args.stall_s,
        "bucket_buffer_bytes": args.bucket_buffer_bytes,
        "results": results,
        "others_rate_ratio": ratio,
        "stalled_caught_up": caught_up,
        "every_bucket_exact": every_bucket_exact,
    }
    path = write_results(
        args.out,
        "stall_isolation",
        figures,
        {f"others, {k}": v["others_events_per_s"] for k, v in results.items()},
        ylabel="events/s (the 3 buckets not stalled)",
        title=f"{args.events:,} events, 4 buckets, one consumer stalled {args.stall_s:g} s",
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
