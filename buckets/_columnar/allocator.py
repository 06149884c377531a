"""Process-wide memory settings for the processes that handle events as columns (the proxy's
and its reader processes), applied by their entry points: glibc's malloc, Arrow's memory pool and
the garbage collector. Figures: benchmarks/README.md, "Process-wide memory settings".

A block of thousands of events has arrays of up to a few MiB (its sort keys alone are 94 bytes an
event). glibc serves an allocation that large with a fresh mmap and unmaps it on free, so each new
array faults in page by page; kept in the heap, the memory is reused warm.

Arrow's arrays (a block's events, each bucket's share, a reply's joined batch) then go through the
same malloc: Arrow's default pool here, mimalloc, hands freed pages back to the system soon after,
so every merge's and reply's arrays faulted in afresh.

The heap then keeps up to TRIM_THRESHOLD bytes of freed memory for the next arrays instead of
returning it at once. The proxy's use swings by hundreds of MiB as consumers fall behind and
catch up (the buckets fill to their budgets and drain); with a smaller threshold each swing was
handed back and faulted in again. RSS never exceeds the process's high-water mark, which the
budgets bound; after a burst it may stay up to TRIM_THRESHOLD above what the buckets hold.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os

import pyarrow as pa

log = logging.getLogger(__name__)

# mallopt's parameter numbers (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
# Allocations below this come from the heap (32 MiB is the most glibc's own sliding threshold
# reaches); freed memory above the heap's top is returned past TRIM_THRESHOLD.
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 512 << 20


def keep_large_allocations() -> bool:
    """Have glibc's malloc keep large freed blocks for reuse, and Arrow allocate through it (see
    the module's docstring); a no-op, returning False, on another C library or where the
    MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ environment variables already say what the
    user wants. ARROW_DEFAULT_MEMORY_POOL, if set, keeps the pool it names."""
    if any(name in os.environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
        return False  # musl has no mallopt worth the name; macOS none at all
    # One arena: a worker thread (the splice's, buckets/oplog_tail.py) would otherwise get an
    # arena of its own, whose heaps glibc unmaps as they empty whatever TRIM_THRESHOLD says, so
    # its blocks faulted in afresh; the few large allocations a batch makes contend little.
    done = (
        bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
        and bool(libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
        and ("MALLOC_ARENA_MAX" in os.environ or bool(libc.mallopt(_M_ARENA_MAX, 1)))
    )
    if not done:
        log.warning("mallopt refused the malloc settings; large arrays are mapped afresh each time")
    elif "ARROW_DEFAULT_MEMORY_POOL" not in os.environ:
        pa.set_memory_pool(pa.system_memory_pool())
    return done


def unfilled_bytearray(size: int) -> bytearray:
    """A bytearray of `size` bytes left as malloc gave them, for a receive to fill. Why not
    `bytearray(size)`: that zeroes every byte, and a receive buffer is written over at once;
    for a reply of megabytes the zeroing pass cost more than the receive itself. CPython's own
    PyByteArray_FromStringAndSize leaves the bytes unset when given no source."""
    return _BYTEARRAY_OF_SIZE(None, size)


_BYTEARRAY_OF_SIZE = ctypes.pythonapi.PyByteArray_FromStringAndSize
_BYTEARRAY_OF_SIZE.restype = ctypes.py_object
_BYTEARRAY_OF_SIZE.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)


def tune_gc_for_throughput() -> None:
    """Process-wide garbage-collector settings for a proxy process (called by the entry point).

    The engine holds up to its buffer budgets in small, acyclic event objects; with the default
    thresholds the cyclic collector keeps rescanning them. Freezing what exists at start-up and
    collecting young objects less often raises a catch-up's throughput (benchmarks/README.md).
    Memory stays bounded by the byte budgets either way.

    Full collections still come, after ten of the older-generation ones (some minutes of
    full-speed reading): closed streams and connections leave small reference cycles (tasks,
    cancel scopes) that only a full collection frees. Buffered events cost them little: the
    engine keeps them as plain tuples, which the collector stops tracking.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 10)
