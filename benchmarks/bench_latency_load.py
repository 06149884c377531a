"""Latency under load: write-to-bucket p50/p99 while the application-like mix is written live.

    .venv/bin/python -m benchmarks.bench_latency_load [--backlog 20000] [--seconds 10]
        [--max-seconds 5] [--writers 2] [--levels-of auto|catch-up]

Three steps, on one cluster (4 shards) and one proxy:

1. The proxy's maximum catch-up rate on the application-like mix (benchmarks/workloads.py
   `app`): a backlog of that mix is written, then read from its start through
   `parallelChangeStream` (4 buckets, one consumer per bucket).
2. The maximum write rate the cluster takes while the proxy tails it: --writers writer
   processes (benchmarks/load_writer.py) write the mix unpaced for --max-seconds while a stream
   opened just before reads it; and first with no stream open (`max_write_untailed`), what the
   cluster takes when it and the writers have the machine to themselves. The CPU each part
   (cluster, proxy, writers, consumers) spends per write while tailed bounds the rate the
   machine's cores could take (`cores_bound_rate`).
3. The mix written live, paced at 25%, 50% and 75% of the maximum catch-up rate, for --seconds
   each, by the same writers sharing one schedule, while a stream opened just before reads it.
   A level the cluster cannot take cannot be measured: when the maximum write rate is below the
   maximum catch-up rate, the levels are fractions of the maximum write rate instead (the JSON's
   `level_base`; `asked_levels` keeps the catch-up fractions). `--levels-of catch-up` asks for
   the catch-up fractions whatever the cluster takes, to see how close the writers get.

Each event's latency is the time it reached its bucket's consumer (`time.time()` here) less its
`wallTime` (the shard's `time.time()` when it applied the write, in milliseconds): both processes
read the machine's one clock. Each level reports the rate asked for and the rate the writers
reached together (`saturated` below 90% of it: the figures are then for the rate reached), and
the CPU the cluster, the proxy, the writers, the consumers and the whole machine (other load
included) used over the writing time, in cores: the cluster is one process, so near 1.0 it is
the bound; a machine figure near the core count says the cores are. `goal`: p99 <= 100 ms at
50% of the maximum catch-up rate, `met` only when that rate was asked for and reached.

Cluster, proxy, writers and this process (the consumers) are separate processes.
Writes JSON and a PNG to the output folder (benchmarks/common.py).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from datetime import UTC
from pathlib import Path
from typing import Any

import psutil
import trio

from benchmarks.bench_engine import ProxyProcess, proxy_stream
from benchmarks.common import add_out_option, pyplot, write_json
from benchmarks.load_writer import (
    GOAL_LEVEL,
    GOAL_P99_MS,
    Writers,
    cpu_per_write,
    goal_figures,
    level_figures,
    plan_levels,
)
from benchmarks.workloads import write_workload
from simcluster.launcher import ClusterProcess, spawn_cluster
from wireproxy.upstream import open_upstream, parse_hosts

LEVELS = (0.25, 0.5, 0.75)
BUCKETS = 4
CATCHUP_RUNS = 2  # reads of the backlog; the fastest gives the maximum catch-up rate
_DRAIN_S = 20.0  # how long the last writes' events may take to come


class CpuMeter:
    """The CPU the cluster, the proxy, this process (the consumers) and the whole machine use from
    its making on, in cores (CPU seconds a wall second)."""

    def __init__(self, cluster: psutil.Process, proxy: ProxyProcess) -> None:
        self.cluster = cluster
        self.proxy = proxy
        self.began = time.monotonic()
        self.cluster_s = sum(cluster.cpu_times()[:2])
        self.proxy_s = proxy.cpu_seconds()
        self.own_s = time.process_time()
        self.machine_s = _machine_busy_s()

    def cores(self) -> dict[str, float]:
        wall = time.monotonic() - self.began
        main, workers = self.proxy.cpu_used(self.proxy_s)
        return {
            "cluster_cpu": (sum(self.cluster.cpu_times()[:2]) - self.cluster_s) / wall,
            "proxy_cpu": main / wall,
            "proxy_workers_cpu": workers / wall,
            "consumers_cpu": (time.process_time() - self.own_s) / wall,
            # Every process's, other helpers' included: near the core count, the cores bound.
            "machine_cpu": (_machine_busy_s() - self.machine_s) / wall,
        }


def _machine_busy_s() -> float:
    """CPU seconds the machine's cores have been busy since boot."""
    times = psutil.cpu_times()._asdict()
    # Linux counts guest time within user time, as psutil's own cpu_percent does.
    idle = ("idle", "iowait", "guest", "guest_nice")
    return sum(v for k, v in times.items() if k not in idle)


class Live:
    """What a live run needs besides its rate: the cluster, the proxy, the writers' count."""

    def __init__(self, cluster: ClusterProcess, proxy: ProxyProcess, writers: int) -> None:
        self.cluster = cluster
        self.cluster_ps = psutil.Process(cluster.process.pid)
        self.proxy = proxy
        self.writers = writers
        self.runs = 0

    async def latency(
        self, rate: float, seconds: float, seed: int, *, tail: bool = True
    ) -> dict[str, Any]:
        """Write the mix at `rate` writes a second (math.inf: unpaced) for `seconds` while
        4 buckets are read (with `tail`; else with no stream open); the level's figures."""
        self.runs += 1
        writers = await trio.to_thread.run_sync(
            lambda: Writers(
                self.cluster.uri,
                f"load{self.runs}",
                rate,
                seconds,
                writers=self.writers,
                seed=seed,
            )
        )
        try:
            await trio.to_thread.run_sync(writers.wait_ready)
            return await (self._measure(writers, rate) if tail else self._untailed(writers, rate))
        finally:
            writers.close()

    async def _measure(self, writers: Writers, rate: float) -> dict[str, Any]:
        latencies: list[float] = []
        ctl = await open_upstream("127.0.0.1", self.proxy.port)
        opened = await ctl.command(
            "admin",
            {"parallelChangeStream": 1, "nBuckets": BUCKETS, "name": f"load-{time.monotonic_ns()}"},
        )
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for cur in opened["cursors"]:
                nursery.start_soon(self._consume, cur["id"], latencies, stop)
            meter = await self._started(writers)
            results = await trio.to_thread.run_sync(writers.results)
            cpu = meter.cores()
            written = sum(r.written for r in results)
            with trio.move_on_after(_DRAIN_S):
                while len(latencies) < written:
                    await trio.sleep(0.05)
            stop.set()
        cursors = [c["id"] for c in opened["cursors"]]
        await ctl.command("admin", {"killCursors": "$cmd.parallelChangeStream", "cursors": cursors})
        await ctl.aclose()
        return {**level_figures(rate, results, [x * 1000 for x in latencies]), **cpu}

    async def _started(self, writers: Writers) -> CpuMeter:
        """Start the writers; a CPU meter from the moment they start writing."""
        await trio.sleep(max(0.0, writers.go() - time.time()))
        return CpuMeter(self.cluster_ps, self.proxy)

    async def _untailed(self, writers: Writers, rate: float) -> dict[str, Any]:
        meter = await self._started(writers)
        results = await trio.to_thread.run_sync(writers.results)
        return {**level_figures(rate, results, []), **meter.cores()}

    async def _consume(self, cursor_id: Any, latencies: list[float], stop: trio.Event) -> None:
        conn = await open_upstream("127.0.0.1", self.proxy.port)
        more = {"getMore": cursor_id, "collection": "$cmd.parallelChangeStream", "maxTimeMS": 100}
        while not stop.is_set():
            reply = await conn.command("admin", more)
            now = time.time()
            for event in reply["cursor"]["nextBatch"]:
                wall = event.get("wallTime")
                if wall is not None:
                    latencies.append(now - wall.replace(tzinfo=UTC).timestamp())
        await conn.aclose()


async def max_catchup_rate(live: Live, backlog: int, seed: int) -> tuple[list[float], int]:
    """The proxy's catch-up rates (events/s) on a backlog of `backlog` writes of the mix, read
    CATCHUP_RUNS times, and the backlog's events. The first read also pays for the fresh proxy's
    start (its first stream's setup and heap growth), which a long-running proxy pays once."""
    host, port = parse_hosts(live.cluster.uri)[0]
    conn = await open_upstream(host, port)
    start = (await conn.command("admin", {"ping": 1}))["operationTime"]
    await conn.aclose()
    events = await trio.to_thread.run_sync(
        lambda: write_workload(live.cluster.uri, "app", backlog, seed=seed, db="backlog")
    )
    rates = []
    for _ in range(CATCHUP_RUNS):
        began = time.perf_counter()
        got, _ = await proxy_stream(live.proxy, start, events, BUCKETS, 0)
        rates.append(got / (time.perf_counter() - began))
    return rates, events


def _line(name: str, r: dict[str, Any]) -> str:
    target = "unpaced" if r["target_rate"] is None else f"{r['target_rate']:,.0f}"
    latency = (
        f"{r['events']:>7,}/{r['written']:,} events  p50 {r['p50_ms']:6.1f} ms  "
        f"p99 {r['p99_ms']:7.1f} ms  max {r['max_ms']:7.1f} ms  "
        if "p50_ms" in r
        else f"{r['written']:,} writes, not read  "
    )
    return (
        f"{name:>9}: {r['reached_rate']:7,.0f} of {target:>7} writes/s  {latency}"
        f"CPU (cores): cluster {r['cluster_cpu']:.2f} proxy {r['proxy_cpu']:.2f} "
        f"writers {r['writers_cpu']:.2f} consumers {r['consumers_cpu']:.2f} "
        f"machine {r['machine_cpu']:.2f}"
    )


async def run(args: argparse.Namespace, live: Live, results: dict[str, Any]) -> None:
    await live.proxy.wait_ready()
    catchups, got = await max_catchup_rate(live, args.backlog, args.seed)
    max_catchup = max(catchups)
    results.update(max_catchup_rate=max_catchup, catchup_rates=catchups, backlog_events=got)
    print(
        f"maximum catch-up rate: {max_catchup:,.0f} events/s ({got:,} events; runs: "
        + ", ".join(f"{r:,.0f}" for r in catchups)
        + ")",
        flush=True,
    )
    await trio.sleep(3)  # the catch-up stream's teardown
    alone = results["max_write_untailed"] = await live.latency(
        math.inf, args.max_seconds, args.seed, tail=False
    )
    print(_line("no stream", alone), flush=True)
    top = results["max_write"] = await live.latency(math.inf, args.max_seconds, args.seed)
    print(_line("max write", top), flush=True)
    cost = results["cpu_us_per_write"] = cpu_per_write(top)
    bound = results["cores_bound_rate"] = (os.cpu_count() or 1) * 1e6 / sum(cost.values())
    print(
        "CPU per write (us): "
        + ", ".join(f"{k} {v:.0f}" for k, v in cost.items())
        + f"; all {os.cpu_count()} cores would take at most {bound:,.0f} writes/s",
        flush=True,
    )
    plan = plan_levels(
        LEVELS, max_catchup, None if args.levels_of == "catch-up" else top["reached_rate"]
    )
    results.update(
        max_write_rate=top["reached_rate"],
        level_base=plan.base,
        asked_levels={
            k: {"rate": v, "of_max_write": v / top["reached_rate"]} for k, v in plan.asked.items()
        },
    )
    print(
        f"levels: fractions of the maximum {plan.base} rate ({plan.base_rate:,.0f}/s); asked: "
        + ", ".join(f"{k} {v:,.0f}/s" for k, v in plan.asked.items()),
        flush=True,
    )
    levels: dict[str, Any] = results.setdefault("levels", {})
    for i, (name, rate) in enumerate(plan.targets.items()):
        await trio.sleep(3)  # the previous stream's teardown
        r = levels[name] = await live.latency(rate, args.seconds, args.seed + 1 + i)
        r.update(of_max_catchup=rate / max_catchup, of_max_write=rate / top["reached_rate"])
        print(_line(name, r), flush=True)
    goal = results["goal"] = goal_figures(levels.get(GOAL_LEVEL, {}), plan.base)
    print(f"goal (p99 <= {GOAL_P99_MS:.0f} ms at {GOAL_LEVEL}): {goal}", flush=True)


def plot(out: Path, results: dict[str, Any]) -> None:
    """latency_load.png: p50/p99 by the rate reached; each level's target and reached rates."""
    if (plt := pyplot()) is None:
        return
    levels = results.get("levels", {})
    fig, (lat, rates) = plt.subplots(1, 2, figsize=(11.0, 3.8))
    for q in ("p50", "p99"):
        points = [(k, v["reached_rate"], v[f"{q}_ms"]) for k, v in levels.items() if f"{q}_ms" in v]
        lat.plot([x for _, x, _ in points], [y for _, _, y in points], marker="o", label=q)
        for name, x, y in points:
            lat.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    lat.set_xlabel("writes (= events) a second reached")
    lat.set_ylabel("write-to-bucket latency (ms)")
    lat.set_ylim(bottom=0)
    lat.legend()
    lat.set_title("latency by load")
    names = list(levels)
    xs = range(len(names))
    rates.bar(
        [x - 0.2 for x in xs], [v["target_rate"] for v in levels.values()], 0.4, label="target"
    )
    rates.bar(
        [x + 0.2 for x in xs], [v["reached_rate"] for v in levels.values()], 0.4, label="reached"
    )
    if "max_write_rate" in results:
        rates.axhline(results["max_write_rate"], color="grey", ls="--", label="max write rate")
    if "max_write_untailed" in results:
        untailed = results["max_write_untailed"]["reached_rate"]
        rates.axhline(untailed, color="grey", ls=":", label="max write rate, no stream")
    rates.set_xticks(list(xs), [f"{n} of max {results.get('level_base', '')}" for n in names])
    rates.set_ylabel("writes a second")
    rates.legend()
    rates.set_title(f"max catch-up {results.get('max_catchup_rate', 0):,.0f} events/s")
    fig.suptitle("application-like mix written live, 4 shards")
    fig.tight_layout()
    fig.savefig(out / "latency_load.png", dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--backlog",
        type=int,
        default=20_000,
        help="writes of the backlog the maximum is measured on",
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="writing time per load level")
    parser.add_argument(
        "--max-seconds", type=float, default=5.0, help="writing time of the maximum write rate"
    )
    parser.add_argument("--writers", type=int, default=2, help="writer processes")
    parser.add_argument(
        "--levels-of",
        choices=("auto", "catch-up"),
        default="auto",
        help="catch-up: the levels are fractions of the maximum catch-up rate even when the "
        "cluster cannot take writes that fast (auto: of the lower of the two maxima)",
    )
    parser.add_argument("--seed", type=int, default=1)
    add_out_option(parser)
    args = parser.parse_args(argv)
    cluster = spawn_cluster(shards=4, periodic_noop_s=10.0)
    proxy = ProxyProcess(cluster.uri, "--stream-idle-teardown-s", "1")
    results: dict[str, Any] = {}
    try:
        trio.run(run, args, Live(cluster, proxy, args.writers), results)
    finally:
        proxy.close()
        cluster.close()
    settings = {k: getattr(args, k) for k in ("seconds", "max_seconds", "writers", "levels_of")}
    figures = {**settings, "backlog": args.backlog, "seed": args.seed, **results}
    path = write_json(args.out, "latency_load", figures)
    plot(args.out, results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
