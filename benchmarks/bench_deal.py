"""In-process cost of what the proxy's main process does with events after the splice, per
stage, without sockets: the shards' blocks merged in cluster-time order (MergedQueue.pop_ready),
dealt into a stream's buckets (Dealer.deal), and each bucket's getMore replies cut, assembled
and gathered as the send would gather them (cut_reply, cursor_document, op_msg_parts, the
deferred batch's parts made into a reused buffer).

    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.bench_deal --workload updates

The splice's blocks of a fixed oplog corpus (a dict workload -> a list per shard of lists of
raw entry bytes, as benchmarks' corpus makers write it) are made once; each repeat then feeds
them to a fresh stream's merge, shard batch after shard batch, each batch's mark just above its
last event, releasing and dealing after every batch as the pump does with one batch waiting.
Reports ns per event of each stage (best of the repeats), and the parts and pieces the replies
were sent as.
"""

from __future__ import annotations

import argparse
import gc
import pickle
import time
from typing import Any

import trio

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

SEND_PART_BYTES = 512 << 10  # wireproxy.session's buffer for a reply's deferred batch


class _Hold:
    """Stands for a reader's budget hold: blocks that point into held blocks pin them."""


def shard_batches(path: str, workload: str, batch: int) -> list[tuple[str, list[Any]]]:
    """(shard, spliced items) of every batch, the shards' batches taking turns."""
    with open(path, "rb") as f:
        shards = pickle.load(f)[workload]
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
    parser.add_argument("--corpus", default="/work/wt/corpus.pkl")
    parser.add_argument("--workload", nargs="*", default=["updates", "app", "inserts"])
    parser.add_argument("--batch", type=int, default=4096, help="entries per shard batch")
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument("--limit", type=int, default=1 << 30, help="events per reply at most")
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args(argv)
    keep_large_allocations()  # as the proxy's process does (else each array faults in afresh)
    warm_up()
    for workload in args.workload:
        batches = shard_batches(args.corpus, workload, args.batch)
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
