"""Run a simcluster in its own process (its own core), for benchmarks; and prefill it fast."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bson import ObjectId


def prefill(
    cluster: Any, events: int, *, updates: float = 0.0, namespaces: int = 8, doc_bytes: int = 100
) -> None:
    """Write `events` writes spread over `namespaces` hashed-sharded collections, in-process: the
    first (1 - `updates`) of them inserts, the rest updates of those documents in turn (a `$set`
    and an `$inc`, logged as `$v: 2` diffs), as an update-heavy workload's oplog holds.

    Bypasses the wire (the backlog is the benchmark's input, not what it measures), but goes through
    the same storage and oplog code as a client's insert and update.
    """
    mongos = cluster.mongos
    pad = "x" * doc_bytes
    names = [f"bench{i % 4}.c{i}" for i in range(namespaces)]
    for ns in names:
        db = ns.split(".")[0]
        mongos.primary_of(db)
    inserts = events - int(events * updates)
    written: list[tuple[str, dict[str, Any]]] = []
    for i in range(inserts):
        ns = names[i % namespaces]
        doc = {"_id": ObjectId(), "i": i, "pad": pad}
        mongos.shard_for_doc(ns, doc).insert_one(ns, doc, {})
        written.append((ns, doc))
    for i in range(events - inserts):
        ns, doc = written[i % inserts]
        change = {
            "q": {"_id": doc["_id"]},
            "u": {"$set": {"i": inserts + i, "state": f"s{i % 7}"}, "$inc": {"n": 1}},
        }
        mongos.shard_for_doc(ns, doc).update_docs(ns, change, {})


@dataclass
class ClusterProcess:
    process: subprocess.Popen[str]
    info: dict[str, Any]

    @property
    def uri(self) -> str:
        return str(self.info["mongos"])

    def close(self) -> None:
        stop_process(self.process)
        if self.process.stdout is not None:
            self.process.stdout.close()


def stop_process(process: subprocess.Popen[Any]) -> None:
    """SIGTERM, up to 10 s to exit, then SIGKILL."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()


def spawn_cluster(
    *,
    shards: int = 4,
    prefill_events: int = 0,
    prefill_updates: float = 0.0,
    version: str = "7.0",
    periodic_noop_s: float = 10.0,
    members: int = 1,
    flags: Sequence[str] = (),
) -> ClusterProcess:
    """Start `python -m simcluster --json` in a subprocess; returns once it printed its addresses.
    `flags` are more of its command-line options."""
    cmd = [
        sys.executable,
        "-m",
        "simcluster",
        "--shards",
        str(shards),
        "--port",
        "0",
        "--json",
        "--prefill",
        str(prefill_events),
        "--prefill-updates",
        str(prefill_updates),
        "--mongodb-version",
        version,
        "--periodic-noop-s",
        str(periodic_noop_s),
        "--members",
        str(members),
        *flags,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise RuntimeError("simcluster subprocess exited before it was ready")
    return ClusterProcess(proc, json.loads(line))
