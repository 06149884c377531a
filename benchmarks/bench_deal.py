"""In-process cost of what the proxy's main process does with events after the splice, per
stage, without sockets: the shards' blocks merged in cluster-time order (MergedQueue.pop_ready),
dealt into a stream's buckets (Dealer.deal), and each bucket's getMore replies cut, assembled
and gathered as the send would gather them (cut_reply, cursor_document, op_msg_parts, the
deferred batch's parts made into a reused buffer).

    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.bench_deal --workload updates

Each workload's oplogs are written once into a 4-shard simcluster and read back (`--corpus FILE`
keeps them as a pickle, a dict workload -> a list per shard of lists of raw entry bytes, read
from it when it exists: two trees then splice the same entries). The splice's blocks of those
entries are made once; each repeat then feeds
them to a fresh stream's merge, shard batch after shard batch, each batch's mark just above its
last event, releasing and dealing after every batch as the pump does with one batch waiting.
Reports ns per event of each stage (best of the repeats), and the parts and pieces the replies
were sent as.
"""

from __future__ import annotations

import argparse
import gc
import os
import pickle
import time
from typing import Any

import pymongo
import trio
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

from benchmarks.workloads import write_workload
from buckets._columnar.allocator import keep_large_allocations
from buckets._columnar.batch_splice import splice_entries, warm_up
from buckets._columnar.event_block import EventBlock
from buckets._columnar.items import as_runs, listed
from buckets._columnar.oplog_batch import OplogBatch
from buckets.bucket import Bucket
from buckets.deal import Dealer
from buckets.event_run import count_events
from buckets.merge import MergedQueue
from buckets.reply import EventSizer, cursor_document, cut_reply
from mongoformats import wire
from mongoformats.bson_bytes import document_parts
from simcluster.launcher import spawn_cluster

SEND_PART_BYTES = 512 << 10  # wireproxy.session's buffer for a reply's deferred batch


class _Hold:
    """Stands for a reader's budget hold: blocks that point into held blocks pin them."""


# Writes of each workload in the oplogs (the inserts' and updates' as simcluster prefills them).
_WRITES = {"inserts": 60_000, "updates": 60_000, "app": 40_000, "ycsb": 40_000}


def oplogs(workload: str) -> list[list[bytes]]:
    """Each shard's oplog entries after `workload`'s writes into a fresh 4-shard simcluster."""
    writes = _WRITES[workload]
    prefilled = workload in ("inserts", "updates")
    cluster = spawn_cluster(
        shards=4,
        prefill_events=writes if prefilled else 0,
        prefill_updates=0.75 if workload == "updates" else 0.0,
    )
    try:
        if not prefilled:
            write_workload(cluster.uri, workload, writes, seed=7)
        shards = []
        for uri in cluster.info["shards"].values():
            client: pymongo.MongoClient[RawBSONDocument] = pymongo.MongoClient(
                uri, directConnection=True
            )
            try:
                oplog = client.local.get_collection(
                    "oplog.rs", CodecOptions(document_class=RawBSONDocument)
                )
                shards.append([bytes(doc.raw) for doc in oplog.find({})])
            finally:
                client.close()
        return shards
    finally:
        cluster.close()


def corpus_oplogs(path: str | None, workload: str) -> list[list[bytes]]:
    """`workload`'s oplogs from the corpus at `path` (written there first if it has none)."""
    if path is None:
        return oplogs(workload)
    corpus: dict[str, list[list[bytes]]] = {}
    if os.path.exists(path):
        with open(path, "rb") as f:
            corpus = pickle.load(f)
    if workload not in corpus:
        corpus[workload] = oplogs(workload)
        with open(path, "wb") as f:
            pickle.dump(corpus, f)
    return corpus[workload]


def shard_batches(shards: list[list[bytes]], batch: int) -> list[tuple[str, list[Any]]]:
    """(shard, spliced items) of every batch of the shards' entries, the shards' batches taking
    turns."""
    per_shard = []
    for s, entries in enumerate(shards):
        batches = []
        for i in range(0, len(entries), batch):
            spliced = listed(splice_entries(OplogBatch.of(entries[i : i + batch])))
            # (The entries left to the general transform, a few, are left out.)
            items = [i for i in spliced if type(i) is EventBlock or (type(i) is tuple and i)]
            for item in items:
                if type(item) is EventBlock:
                    item.hold = _Hold()
            batches.append((f"shard{s}", items))
        per_shard.append(batches)
    out = []
    for turn in range(max(map(len, per_shard))):
        out += [b[turn] for b in per_shard if turn < len(b)]
    return out


def _send(pieces: list[Any], scratch: bytearray, counts: dict[str, int]) -> int:
    """Goes through a reply's pieces as scatter_send does (a deferred piece made part by part
    into `scratch`), writing nothing: the bytes it would send."""
    total = 0
    for piece in pieces:
        if isinstance(piece, wire.DeferredPiece):
            counts["deferred"] += 1
            for part in piece.pieces(scratch):
                counts["parts"] += 1
                total += len(memoryview(part).cast("B"))
        else:
            counts["small"] += 1
            total += len(piece)
    return total


async def one_pass(
    batches: list[tuple[str, list[Any]]], n_buckets: int, limit: int
) -> tuple[dict[str, float], dict[str, int]]:
    buckets = {b: Bucket(b, 1 << 40, b"", {}) for b in range(n_buckets)}
    dealer = Dealer(buckets, n_buckets, scope=None, match=None, bucket_by="namespace")
    merge = MergedQueue(sorted({s for s, _ in batches}))
    sizer = EventSizer(merged=True)
    scratch = bytearray(SEND_PART_BYTES)
    times = {"merge": 0.0, "deal": 0.0, "cut": 0.0, "gather": 0.0}
    counts = {"events": 0, "releases": 0, "replies": 0, "deferred": 0, "parts": 0, "small": 0}
    counts["bytes"] = 0
    positions = dict.fromkeys(buckets, 0)
    for shard, items in batches:
        t0 = time.perf_counter()
        runs = as_runs(items)
        merge.extend(shard, runs)
        merge.advance(shard, runs[-1].last_key + b"\xff")
        ready, _ = merge.pop_ready()
        t1 = time.perf_counter()
        await dealer.deal(ready)
        t2 = time.perf_counter()
        times["merge"] += t1 - t0
        times["deal"] += t2 - t1
        counts["events"] += count_events(ready)
        counts["releases"] += 1
        del ready, runs
    # The consumers read after the backlog is dealt (a backlog's replies are full).
    for b, bucket in buckets.items():
        while positions[b] < bucket.end:
            t0 = time.perf_counter()
            taken = cut_reply(bucket.items_from(positions[b]), limit, sizer)
            doc: dict[str, Any] = {
                "cursor": cursor_document(7, "db.coll", "nextBatch", taken, {"_data": "00"}),
                "ok": 1.0,
            }
            pieces = wire.op_msg_parts(1, 1, document_parts(doc))
            t1 = time.perf_counter()
            counts["bytes"] += _send(pieces, scratch, counts)
            t2 = time.perf_counter()
            positions[b] += count_events(taken)
            counts["replies"] += 1
            times["cut"] += t1 - t0
            times["gather"] += t2 - t1
            del taken, doc, pieces
    return times, counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--corpus",
        help="a pickle of the workloads' oplogs: read from it, written to it when it lacks one",
    )
    parser.add_argument(
        "--workload", nargs="*", choices=sorted(_WRITES), default=["updates", "app", "inserts"]
    )
    parser.add_argument("--batch", type=int, default=4096, help="entries per shard batch")
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument("--limit", type=int, default=1 << 30, help="events per reply at most")
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args(argv)
    keep_large_allocations()  # as the proxy's process does (else each array faults in afresh)
    warm_up()
    for workload in args.workload:
        batches = shard_batches(corpus_oplogs(args.corpus, workload), args.batch)
        best: dict[str, float] = {}
        counts: dict[str, int] = {}
        for _ in range(args.repeat):
            gc.collect()
            gc.disable()  # (a collection falls in some stage at random)
            try:
                times, counts = trio.run(one_pass, batches, args.buckets, args.limit)
            finally:
                gc.enable()
            for k, v in times.items():
                best[k] = min(best.get(k, v), v)
        n = counts["events"]
        stages = " ".join(f"{k} {v / n * 1e9:.1f}" for k, v in best.items())
        print(
            f"{workload}: {n} events, ns/event: {stages} total {sum(best.values()) / n * 1e9:.1f}"
            f" | releases {counts['releases']} replies {counts['replies']}"
            f" deferred {counts['deferred']} parts {counts['parts']} small {counts['small']}"
            f" MB {counts['bytes'] / 1e6:.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
