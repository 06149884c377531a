"""The engine's figures on the proxy's `/metrics`: what `parallelChangeStreamStatus` reports, read
at scrape time (a collector, not gauges kept up to date on the hot path)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from buckets.engine import Engine


# A scrape reads this many streams' status between two checkpoints of the loop.
_STREAMS_PER_CHECKPOINT = 8


class _Families:
    """The metric families of one scrape, filled stream by stream."""

    def __init__(self) -> None:
        shard_labels, bucket_labels, stream_labels = (
            ["stream", "shard"],
            ["stream", "bucket"],
            ["stream"],
        )
        self.shard: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "last_ts": GaugeMetricFamily(
                "pcs_shard_read_position_seconds",
                "Cluster time (seconds) of the newest oplog entry read",
                labels=shard_labels,
            ),
            "lag": GaugeMetricFamily(
                "pcs_shard_lag_seconds",
                "Wall-clock seconds since that entry was written "
                "(an idle shard shows up to its noop interval)",
                labels=shard_labels,
            ),
            "buffer": GaugeMetricFamily(
                "pcs_shard_buffer_bytes", "Bytes read but not yet merged", labels=shard_labels
            ),
            "entries": CounterMetricFamily(
                "pcs_shard_entries", "Oplog entries read", labels=shard_labels
            ),
            "events": CounterMetricFamily(
                "pcs_shard_events", "Change events made", labels=shard_labels
            ),
            "noops": CounterMetricFamily(
                "pcs_shard_noops", "Notes written to move an idle shard on", labels=shard_labels
            ),
            "reconnects": CounterMetricFamily(
                "pcs_shard_reconnects",
                "Reader reconnections (member failures)",
                labels=shard_labels,
            ),
            "connected": GaugeMetricFamily(
                "pcs_shard_connected",
                "1 while the reader reads from a member; 0 "
                "while it has lost it or reaches none (the stream waits on this shard)",
                labels=shard_labels,
            ),
        }
        self.bucket: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "depth": GaugeMetricFamily(
                "pcs_bucket_depth", "Events no live cursor has read yet", labels=bucket_labels
            ),
            "bytes": GaugeMetricFamily(
                "pcs_bucket_bytes", "Bytes held (pending and retained)", labels=bucket_labels
            ),
            "delivered": CounterMetricFamily(
                "pcs_bucket_delivered", "Events returned to consumers", labels=bucket_labels
            ),
            "cursors": GaugeMetricFamily(
                "pcs_bucket_cursors", "Open cursors", labels=bucket_labels
            ),
            "behind": GaugeMetricFamily(
                "pcs_bucket_behind_seconds",
                "Cluster time from where the bucket's slowest consumer is complete to the merge",
                labels=bucket_labels,
            ),
            "dropped": CounterMetricFamily(
                "pcs_bucket_dropped",
                "Events a fallen-behind bucket dropped, re-read from the oplogs by its consumer",
                labels=bucket_labels,
            ),
        }
        self.merged = CounterMetricFamily(
            "pcs_stream_events_merged", "Events through the merge", labels=stream_labels
        )
        self.queue = GaugeMetricFamily(
            "pcs_stream_merge_queue_events", "Events waiting in the merge", labels=stream_labels
        )
        self.replays = CounterMetricFamily(
            "pcs_stream_replays",
            "Bucket attaches served by re-reading the oplogs",
            labels=stream_labels,
        )

    def add_stream(self, name: str, status: dict[str, Any]) -> None:
        self.merged.add_metric([name], status["eventsMerged"])
        self.queue.add_metric([name], status["mergeQueue"])
        self.replays.add_metric([name], status["replays"])
        for s in status["shards"]:
            labels = [name, s["shard"]]
            self.shard["last_ts"].add_metric(labels, s["lastTs"].time)
            if s["lagSeconds"] is not None:  # None until the reader read something
                self.shard["lag"].add_metric(labels, s["lagSeconds"])
            self.shard["buffer"].add_metric(labels, s["bufferBytes"])
            self.shard["connected"].add_metric(labels, int(s["connected"]))
            for key, field in (
                ("entries", "entriesRead"),
                ("events", "events"),
                ("noops", "noops"),
                ("reconnects", "reconnects"),
            ):
                self.shard[key].add_metric(labels, s[field])
        for b in status["buckets"]:
            labels = [name, str(b["bucket"])]
            for key, field in (
                ("depth", "depth"),
                ("bytes", "bytes"),
                ("delivered", "delivered"),
                ("cursors", "cursors"),
                ("behind", "behindSeconds"),
                ("dropped", "droppedTotal"),
            ):
                self.bucket[key].add_metric(labels, b[field])

    def done(self, engine: Engine) -> Iterator[Metric]:
        yield from self.shard.values()
        yield from self.bucket.values()
        watches = CounterMetricFamily(
            "pcs_watches",
            "Change stream aggregates (watch()) the engine served or forwarded to the upstream",
            labels=["outcome"],
        )
        for outcome, count in engine.watches.items():
            watches.add_metric([outcome], count)
        tails = GaugeMetricFamily(
            "pcs_reader_process_tails",
            "Shards (of all streams) a shared reader process "
            "reads; absent until a stream asks for reader processes",
            labels=["process"],
        )
        alive = GaugeMetricFamily(
            "pcs_reader_process_alive", "1 while the reader process runs", labels=["process"]
        )
        timed_out = CounterMetricFamily(
            "pcs_cursors_timed_out",
            "Idle cursors the engine killed (unused for the cursor timeout)",
            value=engine.cursors_timed_out,
        )
        rebucketed = CounterMetricFamily(
            "pcs_streams_rebucketed",
            "Named streams reopened with another nBuckets",
            value=engine.rebucketed,
        )
        memory = engine.memory_status()
        gauge, counter = GaugeMetricFamily, CounterMetricFamily
        limit = gauge(
            "pcs_memory_limit_bytes",
            "What the streams' buffers hold and the reader processes are counted under",
            value=memory["limitBytes"],
        )
        reserved = gauge(
            "pcs_memory_reserved_bytes",
            "What counts against the limit: each buffer "
            "budget's floor, or what it holds if more, and the reader processes",
            value=memory["reservedBytes"],
        )
        held = gauge(
            "pcs_memory_held_bytes",
            "Bytes the streams' buffer budgets hold",
            value=memory["heldBytes"],
        )
        floor = gauge(
            "pcs_memory_floor_bytes",
            "The floors the open streams were admitted by",
            value=memory["floorBytes"],
        )
        processes = gauge(
            "pcs_memory_reader_process_bytes",
            "What the running reader processes count against the limit",
            value=memory["readerProcessBytes"],
        )
        waits = counter(
            "pcs_memory_waits",
            "Takes of buffer bytes that waited for room under the memory limit",
            value=memory["memoryWaits"],
        )
        refused = counter(
            "pcs_streams_refused_for_memory",
            "Streams refused (watch(): passed through) because they did not fit the memory limit",
            value=memory["streamsRefused"],
        )
        for proc in engine.reader_processes():
            tails.add_metric([str(proc["index"])], proc["tails"])
            alive.add_metric([str(proc["index"])], int(proc["alive"]))
        yield from (
            self.merged,
            self.queue,
            self.replays,
            watches,
            tails,
            alive,
            timed_out,
            rebucketed,
        )
        yield from (limit, reserved, held, floor, processes, waits, refused)


class EngineCollector(Collector):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        families = _Families()
        for name, stream in sorted(self.engine.all_streams().items()):
            families.add_stream(name, stream.status())
        yield from families.done(self.engine)

    async def snapshot(self) -> list[Metric]:
        """The same families, read on the engine's trio loop (the only thread that changes its
        state) with a checkpoint every few streams, so that a scrape of many streams never holds
        the loop for long; what it returns is plain data, rendered off the loop."""
        families = _Families()
        for i, (name, stream) in enumerate(sorted(self.engine.all_streams().items())):
            if i % _STREAMS_PER_CHECKPOINT == _STREAMS_PER_CHECKPOINT - 1:
                await trio.sleep(0)
            families.add_stream(name, stream.status())
        return list(families.done(self.engine))
