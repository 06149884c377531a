"""buckets: the parallel change stream engine (shard readers, MergedQueue, buckets, resume)."""

from buckets.bucketing import bucket_of, buckets_for_event
from buckets.commands import MAX_READER_PROCESSES
from buckets.config import EngineConfig
from buckets.engine import Engine, EngineCommands
from buckets.engine_base import CURSOR_NS
from buckets.merge import MergedQueue

__all__ = [
    "bucket_of",
    "buckets_for_event",
    "Engine",
    "EngineCommands",
    "EngineConfig",
    "MergedQueue",
    "CURSOR_NS",
    "MAX_READER_PROCESSES",
]
