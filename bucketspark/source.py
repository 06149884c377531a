"""`spark.readStream.format("parallelchangestream")`: one Spark partition per bucket.

Options: uri (the proxy), nBuckets, bucketBy ("namespace", the default, or "documentKey": one
collection spread over every bucket, each document's events in one bucket in order, DDL in every
bucket; buckets/bucketing.py), name, pipeline (JSON list of $match stages, and a final
$changeStreamSplitLargeEvent: an event over 16 MiB then arrives in fragments, joined back into one
row, where without it the read fails with BSONObjectTooLarge), fullDocument ("default",
"updateLookup", "whenAvailable", "required"), fullDocumentBeforeChange, startAtOperationTime
("<seconds>,<increment>", "Timestamp(<s>, <i>)" or ISO-8601), showExpandedEvents (default true),
maxEventsPerTrigger, jsonColumn (add the event as relaxed extended JSON), batchSize, and the
engine's shardBufferBytes, bucketBufferBytes, readerProcesses, maxAwaitTimeMS (used when the proxy
creates the stream); a batch read also takes startTokens (JSON list, one per bucket) and endToken.
Any other option name, or a value of the wrong kind, is refused (`Options`). The MongoDB Spark
connector's names are accepted too where they mean the same (connection.uri, database and collection
as filters, aggregation.pipeline, change.stream.*): see bucketspark/options.py.

Offsets are JSON `{"nBuckets": N, "bucketBy": ..., "name": ..., "tokens": [<_data of bucket 0>,
...]}`. A micro-batch reads, in bucket i, the events with tokens in (start_i, end_i]; the end is
planned by the proxy from its merge frontier, so the set is fixed when planned and a retried task
returns the same rows. A query's first plan waits up to FIRST_PLAN_WAIT_S for that frontier to
pass the start (a stream just opened has not been read yet), so that the micro-batch in which
Spark starts its workers holds events. The proxy keeps no durable state: after a proxy restart
the stream is reopened from the checkpointed tokens. A query may be restarted on its checkpoint
with another nBuckets (more or fewer tasks), or another bucketBy, the same way: a micro-batch
ends every bucket at one token, from which any bucket count and either mode resumes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from bson.raw_bson import RawBSONDocument
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from bucketspark.client import (
    StreamSpec,
    client_for,
    open_stream,
    plan_end,
    read_bucket,
    settle_worker_heap,
)
from bucketspark.options import Options, stream_spec
from bucketspark.rows import SCHEMA, arrow_batches, arrow_schema, event_row


@dataclass(frozen=True)
class BucketPartition(InputPartition):
    bucket: int
    start: str
    end: str
    spec: StreamSpec
    with_json: bool
    batch_size: int
    full_document_only: bool = False


# How long a restarted query waits for the proxy to release its stream's old bucket count (the
# proxy's CURSOR_IN_USE_S, 10 s, with room to spare).
REOPEN_WAIT_S = 30.0

# How long the query's first micro-batch waits for the proxy's first events (`_first_end`), and
# how often it asks.
FIRST_PLAN_WAIT_S = 2.0
FIRST_PLAN_POLL_S = 0.05


def _start_args(options: Options) -> dict[str, Any]:
    at = options.get("startAtOperationTime")
    return {} if at is None else {"startAtOperationTime": at}


def _read(partition: BucketPartition) -> Iterator[Any]:
    """One bucket's events in (start, end], as Arrow record batches of rows."""
    settle_worker_heap()
    client = client_for(partition.spec.uri)
    try:
        events = read_bucket(
            client,
            partition.spec,
            partition.bucket,
            partition.start,
            partition.end,
            batch_size=partition.batch_size,
        )
        if partition.full_document_only:  # the connector's publish.full.document.only
            rows = (
                event_row(partition.bucket, ev, with_json=partition.with_json, payload=doc)
                for ev in events
                if isinstance(doc := ev.get("fullDocument"), RawBSONDocument)
            )
        else:
            rows = (event_row(partition.bucket, ev, with_json=partition.with_json) for ev in events)
        yield from arrow_batches(rows, arrow_schema())
    finally:
        client.close()


class ParallelChangeStreamDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "parallelchangestream"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return _BatchReader(Options(self.options))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _StreamReader(Options(self.options))


class _ReaderOptions:
    """What both readers take from the options, and the partition each bucket becomes."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.spec = stream_spec(options)
        self.with_json = options.get("jsonColumn", False)
        self.batch_size = options.get("batchSize", 1000)
        self.full_document_only = options.get("change.stream.publish.full.document.only", False)

    def partition(self, bucket: int, start: str, end: str) -> BucketPartition:
        return BucketPartition(
            bucket, start, end, self.spec, self.with_json, self.batch_size, self.full_document_only
        )

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, BucketPartition)
        return _read(partition)


class _StreamReader(_ReaderOptions, DataSourceStreamReader):
    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self.max_events = options.get("maxEventsPerTrigger")
        self._client: Any = None
        self._planned = False  # whether latestOffset has planned a micro-batch yet

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = client_for(self.spec.uri)
        return self._client

    def initialOffset(self) -> dict[str, Any]:
        tokens = open_stream(self.client, self.spec, **_start_args(self.options))
        return self._offset(tokens)

    def _offset(self, tokens: list[str]) -> dict[str, Any]:
        return {
            "nBuckets": self.spec.n_buckets,
            "bucketBy": self.spec.bucket_by,
            "name": self.spec.name,
            "tokens": tokens,
        }

    def _same_buckets(self, offset: dict[str, Any]) -> bool:
        """`offset` was written with this query's nBuckets and bucketBy (offsets without bucketBy
        are by namespace)."""
        return (
            offset.get("nBuckets") == self.spec.n_buckets
            and offset.get("bucketBy", "namespace") == self.spec.bucket_by
        )

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_events) if self.max_events else ReadAllAvailable()

    def _tokens(self, offset: dict[str, Any]) -> list[str]:
        """The offset's token for each of this query's buckets.

        An offset written with another nBuckets (the query was restarted with more or fewer tasks)
        carries over if its buckets all stand at one token: every micro-batch ends all buckets at
        its one planned end, so a checkpoint's offsets normally do. That token then starts every
        new bucket (the proxy accepts it whatever the bucket count; see the engine's open command).
        """
        tokens = list(offset.get("tokens", ()))
        if self._same_buckets(offset) and len(tokens) == self.spec.n_buckets:
            return tokens
        if len(set(tokens)) != 1:
            raise ValueError(
                "parallelchangestream: the checkpoint was written with "
                f"nBuckets={offset.get('nBuckets')} and its buckets stand at different tokens; it "
                f"was dealt by {offset.get('bucketBy', 'namespace')} and the query asks for "
                f"nBuckets={self.spec.n_buckets} by {self.spec.bucket_by}, which can only start "
                "from one common token (restart once with the old nBuckets and bucketBy, or start "
                "a new checkpoint)"
            )
        return tokens[:1] * self.spec.n_buckets

    def _reopen(self, tokens: list[str]) -> None:
        """Open the stream from `tokens`, or reopen it with this query's nBuckets.

        The proxy refuses to reopen a stream whose cursors are still read, with
        ConflictingOperationInProgress: after a restart those are the cursors of the previous run's
        cancelled tasks, which the proxy deems abandoned once unused for 10 s. Retried that long.
        """
        from pymongo.errors import OperationFailure

        deadline = time.monotonic() + REOPEN_WAIT_S
        while True:
            try:
                open_stream(self.client, self.spec, resumeAfter=[{"_data": t} for t in tokens])
                return
            except OperationFailure as exc:
                if exc.code != 117 or time.monotonic() > deadline:
                    raise
            time.sleep(1)

    def _start_tokens(self, start: dict[str, Any]) -> list[str]:
        """`_tokens` of a batch's start; if it was written with another nBuckets, the proxy's
        stream of this name still has the old count, and is reopened with this query's first."""
        tokens = self._tokens(start)
        if not self._same_buckets(start):
            self._reopen(tokens)
        return tokens

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        after = self._start_tokens(start)
        max_events = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = self._plan(after, max_events)
        if not self._planned:
            end = self._first_end(after, max_events, end)
        self._planned = True
        tokens = [max(t, end) for t in after]
        return self._offset(tokens)

    def _plan(self, after: list[str], max_events: int | None) -> str:
        """The proxy's end for a micro-batch after `after`."""
        from pymongo.errors import OperationFailure

        try:
            return plan_end(self.client, self.spec, after, max_events)
        except OperationFailure as exc:
            if exc.code != 26:  # NamespaceNotFound: the proxy restarted; reopen from the checkpoint
                raise
            self._reopen(after)
            return plan_end(self.client, self.spec, after, max_events)

    def _first_end(self, after: list[str], max_events: int | None, end: str) -> str:
        """The end of the query's first micro-batch: `end`, or, while it is not past the start
        (the proxy has only just opened the stream, and its shard readers have not yet reported
        their first reads), the proxy's next end, for up to FIRST_PLAN_WAIT_S.

        Spark pays its start-up (the Python workers of the read and the sink, the plan's code
        generation) in the query's first micro-batch whatever it holds; planned at once, that
        batch is empty, and the events wait for the next. Waiting briefly here, as a change
        stream's first getMore awaits events, lets the start-up work on them instead."""
        deadline = time.monotonic() + FIRST_PLAN_WAIT_S
        while end <= min(after) and time.monotonic() < deadline:
            time.sleep(FIRST_PLAN_POLL_S)
            end = self._plan(after, max_events)
        return end

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        # A batch planned before a restart with another nBuckets (run again at the restart, with
        # no latestOffset first) is re-read with the new count: at common start and end tokens, its
        # buckets together hold the same events, dealt anew.
        starts = self._start_tokens(start)
        return [
            self.partition(i, s, e)
            for i, (s, e) in enumerate(zip(starts, self._tokens(end), strict=True))
        ]

    def commit(self, end: dict[str, Any]) -> None:
        # Nothing to release: the proxy's buckets drop delivered events under memory pressure, and
        # anything older is re-read from the oplogs on demand.
        return None

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()


class _BatchReader(_ReaderOptions, DataSourceReader):
    """A bounded read: events from startAtOperationTime (or start tokens) up to now (or
    endToken)."""

    def partitions(self) -> Sequence[InputPartition]:
        client = client_for(self.spec.uri)
        try:
            if self.options.get("startTokens"):
                starts = self.options.get("startTokens")
                open_stream(client, self.spec, resumeAfter=[{"_data": t} for t in starts])
            else:
                starts = open_stream(client, self.spec, **_start_args(self.options))
            end = self.options.get("endToken")
            if not end:
                from bson import Timestamp

                from mongoformats.resume_token import high_water_mark

                # "Up to now" includes events at exactly the current cluster time; a high-water mark
                # sorts before events at its own time, so the end is the mark of the next tick.
                now = client.admin.command("ping")["operationTime"]
                end = high_water_mark(Timestamp(now.time, now.inc + 1))["_data"]
        finally:
            client.close()
        return [self.partition(i, s, end) for i, s in enumerate(starts)]
