"""The proxy-wide memory limit: streams are admitted only while their byte budgets fit under it.

Every stream's memory is bounded by its budgets (`shardBufferBytes` per shard, `bucketBufferBytes`
per bucket), but nothing bounded how many streams there are: each abandoned `watch()`, each Spark
job opening its own stream, added its budgets, and a stalled consumer lets them fill. So a new
stream reserves the most its buffers may hold, and is refused (ExceededMemoryLimit, 146) when the
reservations of the open streams leave too little. Reserving the budgets, rather than counting
the bytes held now, keeps one stream's backlog from ever stalling another: a stream admitted can
always fill its own buffers.
"""

from __future__ import annotations

import os

from mongoformats.errors import MongoError

# cgroup v2, then v1: the limit a container runtime set, when it is below the machine's memory.
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def available_memory_bytes() -> int:
    """The machine's memory, or the proxy's cgroup limit if lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in _CGROUP_LIMITS:
        try:
            with open(path) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def default_memory_limit() -> int:
    """Half of the memory available: budgets count event bytes, and the Python objects holding
    them, the proxy's connections and its reader processes' copies in flight come on top."""
    return available_memory_bytes() // 2


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def check_fits(need: int, reserved: int, limit: int, *, streams: int, shards: int, shard_bytes: int,
               buckets: int, bucket_bytes: int) -> None:
    """ExceededMemoryLimit unless a stream needing `need` bytes fits beside `reserved` under `limit`,
    with what the client can change to make it fit."""
    if reserved + need <= limit:
        return
    raise MongoError("ExceededMemoryLimit",
                     f"a parallel change stream needs {_mib(need)} of buffers ({shards} shards x {_mib(shard_bytes)} "
                     f"shardBufferBytes + {buckets} buckets x {_mib(bucket_bytes)} bucketBufferBytes), but "
                     f"{_mib(reserved)} of the proxy's {_mib(limit)} memory limit is reserved by {streams} open "
                     "streams; pass smaller shardBufferBytes/bucketBufferBytes, close streams you no longer read "
                     "(killCursors: a stream left without cursors makes room at once), or start the proxy with a "
                     "higher --memory-limit-bytes")
