"""The engine's settings (the proxy fills them from its own configuration)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    shard_buffer_bytes: int = 1 << 30
    bucket_buffer_bytes: int = 64 << 20
    idle_teardown_s: float = 300.0  # a stream with no cursors for this long is torn down
    max_await_ms: int = 1000
    reader_await_ms: int = 200
    reader_processes: int = 0  # default for streams that do not pass readerProcesses
    # Worker threads that walk and splice large oplog batches beside the event loop, for every
    # stream read in the proxy's process (0: on the loop). The kernels release the GIL; the
    # loop is one core, so more threads than the other cores only contend (cores - 1 at most).
    # Off by default: on two cores shared with the cluster and the consumers, the threads
    # raised no backlog's rate and cost CPU per event (bench_engine, threads on against off).
    splice_threads: int = 0
    # A reader process that has read nothing this long is stopped. Its own setting, not the
    # stream teardown's: a process costs a second of CPU to start (imports), a stream nothing.
    reader_idle_s: float = 300.0
    # A reader process that answers nothing for this long (stopped, its loop stuck) is killed,
    # failing its streams as a death does (None: never); the proxy's upstream_timeout_s.
    hang_timeout_s: float | None = 30.0
    # A cursor no getMore has used for this long is killed, as the server's cursorTimeoutMillis
    # (10 min) kills idle cursors; one opened in a session lives as long as its session would on
    # the server (logicalSessionTimeoutMinutes, 30 min), counted from the cursor's last use.
    # Otherwise the cursor of a consumer that vanished (a crashed app's watch(), a killed Spark
    # task) kept its stream reading every shard, and its buffers full, for the proxy's lifetime.
    cursor_timeout_s: float = 600.0
    session_cursor_timeout_s: float = 1800.0
    # Cursors of sessions a client ended (endSessions) are killed at the next session refresh,
    # as the server's logical session cache does every logicalSessionRefreshMillis (5 min).
    session_refresh_s: float = 300.0
    # What every stream's budgets hold, and every reader process, is counted under this
    # (buckets/memory_limit.py); 0: half of the machine's (or the cgroup's) memory.
    memory_limit_bytes: int = 0
    # An accelerated watch() has one consumer, which cannot drain faster than a few batches of
    # read-ahead give it; its shards' budgets are this.
    watch_shard_buffer_bytes: int = 64 << 20
