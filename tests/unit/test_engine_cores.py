"""The engine's control plane, in pieces that need no sockets: where a stream and its cursors
start (buckets/streams.py, buckets/engine_open.py), the typed options of an open command
(buckets/commands.py), a stream's memory admission, and the shard-list watcher's retries
(buckets/topology.py) against a fake mongos under trio's autojump clock."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from bson import Timestamp

from buckets.commands import read_open
from buckets.config import EngineConfig
from buckets.cursor import start_point
from buckets.cursors import CursorRegistry
from buckets.engine_open import _start_tokens
from buckets.memory_limit import DEAL_HEADROOM_BYTES, READER_PROCESS_BYTES, stream_floor
from buckets.stream import StreamOptions
from buckets.streams import StreamSet, _start_and_floors
from buckets.topology import Topology, TopologyWatcher
from mongoformats.errors import ConnectionLost, MongoError
from mongoformats.resume_token import high_water_mark, token_sort_key

NOW = Timestamp(100, 5)


def _token(secs: int, inc: int = 1) -> dict[str, Any]:
    return high_water_mark(Timestamp(secs, inc))


def test_a_new_stream_without_a_start_point_starts_after_the_newest_write():
    start, floors = _start_and_floors({}, 3, NOW)
    assert start == Timestamp(100, 6)
    assert floors == [token_sort_key(high_water_mark(Timestamp(100, 6)))] * 3


def test_a_new_stream_starts_at_its_operation_time_or_token():
    at = Timestamp(50, 1)
    start, floors = _start_and_floors({"startAtOperationTime": at}, 2, NOW)
    assert (start, floors) == (at, [token_sort_key(high_water_mark(at))] * 2)
    token = _token(60)
    start, floors = _start_and_floors({"startAfter": token}, 2, NOW)
    assert (start, floors) == (start_point(token)[0], [start_point(token)[1]] * 2)


def test_bucket_tokens_start_the_stream_at_the_oldest_and_floor_each_bucket_at_its_own():
    tokens = [_token(70), _token(40), _token(55)]
    start, floors = _start_and_floors({"resumeAfter": tokens}, 3, NOW)
    assert start == start_point(tokens[1])[0]
    assert floors == [token_sort_key(t) for t in tokens]


def test_a_start_time_that_is_no_timestamp_is_a_type_mismatch():
    with pytest.raises(MongoError) as info:
        _start_and_floors({"startAtOperationTime": 5}, 1, NOW)
    assert info.value.code_name == "TypeMismatch"


def test_each_bucket_resumes_from_its_token_the_common_token_or_the_operation_time():
    one, other = _token(10), _token(11)
    assert _start_tokens({"resumeAfter": [one, other]}, 2) == [one, other]
    assert _start_tokens({"startAfter": one}, 3) == [one] * 3
    at = Timestamp(12, 1)
    assert _start_tokens({"startAtOperationTime": at}, 2) == [high_water_mark(at)] * 2
    assert _start_tokens({}, 2) == [None, None]


@pytest.mark.parametrize(
    ("field", "value", "code_name"),
    [
        ("fullDocument", 1, "TypeMismatch"),
        ("showExpandedEvents", 1, "TypeMismatch"),
        ("showSystemEvents", "yes", "TypeMismatch"),
        ("bucketBy", 1, "TypeMismatch"),
        ("bucketBy", "shard", "BadValue"),
        ("startAtOperationTime", 5, "TypeMismatch"),
        ("nBuckets", 0, "BadValue"),
        ("readerProcesses", 65, "BadValue"),
    ],
)
def test_each_typed_open_option_fails_with_the_parsers_code(field, value, code_name):
    with pytest.raises(MongoError) as info:
        read_open({"parallelChangeStream": 1, "nBuckets": 2, field: value})
    assert info.value.code_name == code_name


def test_open_options_are_checked_in_order_and_the_first_bad_one_is_named():
    """The checks run in a fixed order (the settings, the counts, the typed fields, bucketBy's
    value, the start time): a command with several bad fields names the same one each time."""
    cmd = {
        "parallelChangeStream": 1,
        "nBuckets": 2,
        "startAtOperationTime": 5,
        "bucketBy": "shard",
        "showSystemEvents": 1,
    }
    with pytest.raises(MongoError) as info:
        read_open(cmd)
    assert "showSystemEvents" in info.value.errmsg
    del cmd["showSystemEvents"]
    with pytest.raises(MongoError) as info:
        read_open(cmd)
    assert info.value.code_name == "BadValue" and "bucketBy" in info.value.errmsg


class _FlakyMongos:
    """listShards over one connection: fails with each of `errors` first, then lists two shards
    (shard1 joined at 15)."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors = errors
        self.closed = 0

    async def command(self, db: str, cmd: dict[str, Any], **_: Any) -> dict[str, Any]:
        assert db == "admin" and "listShards" in cmd
        if self.errors:
            raise self.errors.pop(0)
        return {
            "shards": [
                {"_id": "shard0", "host": "rs0/a:1"},
                {"_id": "shard1", "host": "rs1/b:2", "topologyTime": Timestamp(15, 1)},
            ],
            "operationTime": Timestamp(20, 1),
        }

    async def aclose(self) -> None:
        self.closed += 1


def _watcher(mongos: _FlakyMongos, connects: list[int]) -> TopologyWatcher:
    async def connect() -> Any:
        connects.append(1)
        return mongos

    return TopologyWatcher(
        connect,
        Topology({"shard0": [("a", 1)]}, {}, Timestamp(10, 1)),
        holds_back=lambda: 0.0,  # events wait on the shard list: read it at every chance
    )


async def test_a_retriable_list_shards_failure_reconnects_and_reads_again(
    autojump_clock: Any,
) -> None:
    mongos = _FlakyMongos([ConnectionLost("gone"), MongoError("HostUnreachable", "down")])
    connects: list[int] = []
    watcher = _watcher(mongos, connects)
    marks: list[Timestamp] = []
    added: list[tuple[str, list[tuple[str, int]], Timestamp]] = []

    async def advance(as_of: Timestamp) -> None:
        marks.append(as_of)

    with trio.move_on_after(5):
        await watcher.run(advance, lambda *shard: added.append(shard))
    assert len(connects) == 3 and mongos.closed == 3  # two lost, and the last one at the end
    assert marks and set(marks) == {Timestamp(20, 1)}
    assert added == [("shard1", [("b", 2)], Timestamp(15, 1))]  # once, however many reads
    assert watcher.status()["shardsAdded"] == ["shard1"]


async def test_a_list_shards_error_no_retry_cures_fails_the_watcher(autojump_clock: Any) -> None:
    mongos = _FlakyMongos([MongoError("Unauthorized", "not allowed")])
    watcher = _watcher(mongos, [])

    async def advance(as_of: Timestamp) -> None:
        raise AssertionError("no shard list was read")

    with pytest.raises(MongoError) as info:
        await watcher.run(advance, lambda *_: None)
    assert info.value.code_name == "Unauthorized"
    assert "reading the shard list (listShards) failed: not allowed" in info.value.errmsg
    assert mongos.closed == 1


class _Pool:
    """Stands in for the reader processes: `running` of them started already."""

    def __init__(self, running: int) -> None:
        self.running = running

    def missing(self, count: int) -> int:
        return max(0, count - self.running)


def _stream_set(limit: int, running: int) -> StreamSet:
    streams = StreamSet(
        None,  # type: ignore[arg-type]  # admission connects to nothing
        None,  # type: ignore[arg-type]
        EngineConfig(memory_limit_bytes=limit),
        CursorRegistry(600.0, 1800.0),
    )
    streams.reader_pool = _Pool(running)  # type: ignore[assignment]
    return streams


def test_admission_counts_only_the_reader_processes_a_stream_would_start():
    """Synchronous, no loop: a stream is admitted by its floor and the reader processes not yet
    running (buckets/memory_limit.py); a refusal is ExceededMemoryLimit and counted."""
    room = stream_floor(3, 2) + DEAL_HEADROOM_BYTES + READER_PROCESS_BYTES
    streams = _stream_set(room, running=1)
    assert streams._admit(StreamOptions(n_buckets=2, reader_processes=2), 3, 2) == 1
    assert streams._admit(StreamOptions(n_buckets=2, reader_processes=1), 3, 2) == 0
    with pytest.raises(MongoError) as info:
        streams._admit(StreamOptions(n_buckets=2, reader_processes=3), 3, 2)
    assert info.value.code_name == "ExceededMemoryLimit"
    assert streams.refused_for_memory == 1
    assert streams.memory.counted == 0  # admission sets nothing aside: the stream's accounts do
