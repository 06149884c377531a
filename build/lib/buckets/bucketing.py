"""Which bucket an event goes to. This is a public contract; clients may compute it themselves.

    bucket_of(ns, n) = zlib.crc32(ns.encode("utf-8")) % n        with ns = "<db>.<collection>"

CRC-32 (the zlib/PNG/Ethernet polynomial) is pinned so that the proxy, every Spark executor and
any client in any language agree; Python's builtin hash() is salted per process and never used.

Events that belong to one collection go to that collection's bucket, so each namespace keeps its
order inside one bucket. Events that span namespaces go, with the same token, to every bucket
they affect: a rename to the buckets of its source and its target; dropDatabase (which has no
collection) to every bucket, since any bucket may hold a collection of that database.
"""

from __future__ import annotations

import zlib

from mongoformats.change_events import EV_NAMESPACES, EventFields

__all__ = ["bucket_of", "buckets_for_event", "MAX_BUCKETS"]

MAX_BUCKETS = 1024


def bucket_of(ns: str, n: int) -> int:
    return zlib.crc32(ns.encode("utf-8")) % n


def buckets_for_event(event: EventFields, n: int) -> tuple[int, ...]:
    namespaces = event[EV_NAMESPACES]
    if len(namespaces) == 1:  # the common case: one collection
        return (zlib.crc32(namespaces[0].encode("utf-8")) % n,)
    if not namespaces:  # database-level events
        return tuple(range(n))
    return tuple(sorted({bucket_of(ns, n) for ns in namespaces}))
