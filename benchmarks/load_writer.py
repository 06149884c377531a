"""Writers of the application-like mix at a paced rate, in processes of their own, and the
arithmetic of load levels, for bench_latency_load.

A rate is split over several writer processes, each with its own pymongo client, its own
database (the mix's generated `_id`s are unique within one generator, not across seeds) and a
share of the rate. They follow one schedule: the parent gives every writer the same start time
(`time.time()`, the clock every process of the machine reads), and writer `i` of `n` writing
`rate` writes a second in all sends its write `j` at `(j * n + i) / rate` seconds after it, so
the writers' writes together come evenly spaced at `rate`. Each writer sends what is due every
few milliseconds as one bulk write per collection (its transactions as they come), and stops
at the deadline even when behind: the rate it reached is what it wrote over the time it had.

The writes are generated before the start (benchmarks/workloads.py `_app_ops`): generating
them costs about as much CPU as pymongo's sending them, and it is the benchmark's cost, not the
application's.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pymongo

from benchmarks.workloads import _app_ops

TICK_S = 0.005  # a writer on schedule sends what is due this often
# Writes of one collection a bulk write sends at most: applications send small ones, and
# simcluster stamps one wallTime for a whole command, so a large bulk would add its own apply
# time to every latency.
CHUNK = 50
COLLECTIONS = ("orders", "users", "sessions", "stock")  # the app mix's (workloads.py)
# Writes a writer generates ahead per second of its run at most: more than one pymongo client
# sends through simcluster (a writer that runs out generates the rest as it goes).
_AHEAD_PER_S = 8_000
# Issue 50's goal: p99 <= 100 ms at 50% of the maximum catch-up rate.
GOAL_LEVEL, GOAL_P99_MS = "50%", 100.0
_START_DELAY_S = 0.2  # from the parent's go to the shared start: every writer is waiting by then


def writes_due(elapsed: float, rate: float, writer: int = 0, writers: int = 1) -> int:
    """How many of writer `writer`'s writes are due `elapsed` seconds after the start, when
    `writers` writers write `rate` writes a second together (infinite: all of them)."""
    if math.isinf(rate):
        return 1 << 62
    if elapsed < 0:
        return 0
    # Its write j is due at (j * writers + writer) / rate: j <= (elapsed * rate - writer) / n.
    return max(0, math.floor((elapsed * rate - writer) / writers) + 1)


@dataclass(frozen=True)
class LevelPlan:
    """The rates a run's load levels ask for.

    The levels are fractions of the proxy's maximum catch-up rate when the cluster can take
    writes that fast; else fractions of the maximum write rate the cluster took while the proxy
    tailed it, since no level above that can be reached (`asked` keeps the catch-up rates)."""

    base: str  # "catch-up" or "write": which maximum the levels are fractions of
    base_rate: float
    targets: dict[str, float]  # level name ("25%") -> writes (= events) a second
    asked: dict[str, float]  # level name -> that fraction of the maximum catch-up rate


def plan_levels(
    levels: tuple[float, ...], max_catchup: float, max_write: float | None
) -> LevelPlan:
    """The target rate of each level (`max_write`: None when not measured)."""
    asked = {_name(q): q * max_catchup for q in levels}
    if max_write is None or max_catchup <= max_write:
        return LevelPlan("catch-up", max_catchup, asked, asked)
    return LevelPlan("write", max_write, {_name(q): q * max_write for q in levels}, asked)


def _name(level: float) -> str:
    return f"{level:.0%}"


def ops_ahead(rate: float, seconds: float, writers: int) -> int:
    """Writes one writer generates before the start: its share of the run with a margin, at
    most what it could send unpaced (past that, it generates the rest as it goes)."""
    per_s = min(rate / writers, _AHEAD_PER_S)
    return math.ceil(per_s * seconds * 1.1) + 100


@dataclass
class WriterResult:
    written: int  # writes (= change events) sent and acknowledged
    seconds: float  # from the shared start to its last acknowledgement
    behind: int  # writes due by then but not sent
    cpu_s: float  # the writer process's CPU time while writing


def write_paced(
    client: Any, db: str, ops: Iterator[Any], schedule: tuple[float, float, int, int, float]
) -> WriterResult:
    """Write `ops` into `db` on `schedule` (start time, rate, writer, writers, seconds)."""
    start, rate, writer, writers, seconds = schedule
    time.sleep(max(0.0, start - time.time()))
    cpu = time.process_time()
    done = 0
    pending: dict[str, list[Any]] = {}
    while (elapsed := time.time() - start) < seconds:
        owed = writes_due(elapsed, rate, writer, writers) - done
        if owed <= 0:
            time.sleep(TICK_S)
            continue
        done += _send(client[db], ops, min(owed, CHUNK), pending)
    took = time.time() - start
    behind = max(0, writes_due(took, rate, writer, writers) - done)
    return WriterResult(done, took, 0 if math.isinf(rate) else behind, time.process_time() - cpu)


def _send(database: Any, ops: Iterator[Any], count: int, pending: dict[str, list[Any]]) -> int:
    """Send the next `count` or so writes (a transaction whole); returns how many were sent."""
    sent = 0
    for name, op in itertools.islice(ops, count):
        if name == "txn":
            _flush(database, pending)
            with database.client.start_session() as session, session.start_transaction():
                for coll, write in op:
                    database[coll].bulk_write([write], session=session)
            sent += len(op)
            continue
        pending.setdefault(name, []).append(op)
        sent += 1
    _flush(database, pending)
    return sent


def _flush(database: Any, pending: dict[str, list[Any]]) -> None:
    for name, writes in pending.items():
        if writes:
            database[name].bulk_write(writes, ordered=True)
    pending.clear()


def _writer_main(uri: str, db: str, plan: tuple[float, float, int, int, int], pipe: Any) -> None:
    """A writer process: connect, shard its collections, generate its writes, say it is ready,
    then write from the start time the parent sends."""
    rate, seconds, writer, writers, seed = plan
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(uri)
    try:
        client.admin.command("enableSharding", db)
        for coll in COLLECTIONS:
            client.admin.command("shardCollection", f"{db}.{coll}", key={"_id": "hashed"})
        ops = _app_ops(seed, 1 << 40)
        ahead = list(itertools.islice(ops, ops_ahead(rate, seconds, writers)))
        pipe.send("ready")
        start = pipe.recv()
        schedule = (start, rate, writer, writers, seconds)
        pipe.send(write_paced(client, db, itertools.chain(ahead, ops), schedule))
    finally:
        client.close()


class Writers:
    """`writers` writer processes writing the app mix at `rate` writes a second together
    (math.inf: as fast as the cluster takes them) for `seconds`, into databases `<prefix>w<i>`."""

    def __init__(
        self, uri: str, prefix: str, rate: float, seconds: float, *, writers: int, seed: int
    ) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.pipes = []
        self.processes = []
        for i in range(writers):
            ours, theirs = spawn.Pipe()
            plan = (rate, seconds, i, writers, seed * 1000 + i)
            process = spawn.Process(target=_writer_main, args=(uri, f"{prefix}w{i}", plan, theirs))
            process.start()
            theirs.close()  # so that a writer's death reads as EOFError here, not as a wait
            self.pipes.append(ours)
            self.processes.append(process)

    def wait_ready(self) -> None:
        for pipe in self.pipes:
            if pipe.recv() != "ready":
                raise RuntimeError("a writer process failed to start")

    def go(self) -> float:
        """Start every writer at one time, a moment from now; returns that time (time.time())."""
        start = time.time() + _START_DELAY_S
        for pipe in self.pipes:
            pipe.send(start)
        return start

    def results(self) -> list[WriterResult]:
        """Each writer's result once it is done (the processes then exit)."""
        out = [pipe.recv() for pipe in self.pipes]
        for process in self.processes:
            process.join()
        return out

    def close(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join()


def level_figures(rate: float, results: list[WriterResult], latencies_ms: list[float]) -> dict:
    """One load level's figures: the rate asked for (None: unpaced) and the rate the writers
    reached together, side by side; the writers' CPU per write; the latency percentiles."""
    written = sum(r.written for r in results)
    took = max((r.seconds for r in results), default=0.0)
    cpu_s = sum(r.cpu_s for r in results)
    reached = _ratio(written, took) or 0.0
    target = None if math.isinf(rate) else rate
    figures: dict[str, Any] = {
        "target_rate": target,
        "reached_rate": reached,
        "reached_share": target and _ratio(reached, target),
        "written": written,
        "behind": sum(r.behind for r in results),
        # Below 90% of the rate asked for (always, unpaced): the figures are for the rate reached.
        "saturated": target is None or reached < 0.9 * target,
        "writers": len(results),
        "writer_cpu_us_per_write": 1e6 * cpu_s / max(1, written),
        "writers_cpu": _ratio(cpu_s, took) or 0.0,
        "events": len(latencies_ms),
    }
    return {**figures, **percentiles(latencies_ms)}


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def percentiles(values: list[float]) -> dict[str, float]:
    """p50, p90, p99 (nearest rank), max and mean of `values`; nothing when there are none."""
    if not values:
        return {}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "p50_ms": pick(0.5),
        "p90_ms": pick(0.9),
        "p99_ms": pick(0.99),
        "max_ms": ordered[-1],
        "mean_ms": sum(ordered) / len(ordered),
    }


def cpu_per_write(level: dict[str, Any]) -> dict[str, float]:
    """Each part's CPU time per write (microseconds) at a level: its cores over the writes a
    second reached. Their sum bounds the rate all the machine's cores could take."""
    rate = max(level["reached_rate"], 1e-9)
    parts = {
        "cluster": level["cluster_cpu"],
        "proxy": level["proxy_cpu"] + level["proxy_workers_cpu"],
        "writers": level["writers_cpu"],
        "consumers": level["consumers_cpu"],
    }
    return {k: 1e6 * v / rate for k, v in parts.items()}


def goal_figures(level: dict[str, Any], base: str) -> dict[str, Any]:
    """The issue's goal at its level: `met` only at the rate it asks for (50% of the maximum
    catch-up rate, reached); `p99_within` says whether the level run met the latency bound."""
    p99 = level.get("p99_ms")
    within = p99 is not None and p99 <= GOAL_P99_MS
    return {
        "level": f"{GOAL_LEVEL} of the maximum {base} rate",
        "p99_ms": p99,
        "p99_within": within,
        "met": within and base == "catch-up" and not level.get("saturated", True),
    }
