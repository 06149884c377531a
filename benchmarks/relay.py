"""A relay that forwards each shard's oplog replies unchanged: the floor of any change-stream
proxy on one machine.

    .venv/bin/python -m benchmarks.relay --upstream SHARD_URI,SHARD_URI,... --listen HOST:PORT

A consumer connects, sends one line, `<shard index> <start>` (the oplog time to read from, as
its 64-bit integer), and receives that shard's oplog from `start` to its end as the shard's own
reply messages, byte for byte, then the end of the stream. The relay reads them as the raw read
and the proxy's readers do (find, then exhaust getMores of BATCH_ENTRIES entries, with the
proxy's upstream connection) and sends each one on as it came, with no request to wait for.

Any proxy receives every byte a shard sends and sends its events on to the consumers, over the
machine's loopback, on the cores the cluster and the consumers share; it does at least this
relay's work. bench_engine measures the relay beside the raw read and the proxy: what it loses
against the raw read is the cost of the second hop alone, before any event is made.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import AsyncIterator

import trio
from bson import Int64, Timestamp

from buckets._columnar.allocator import keep_large_allocations, unfilled_bytearray
from buckets.oplog_tail import BATCH_ENTRIES
from mongoformats.bson_bytes import cursor_span
from wireproxy.upstream import open_upstream, parse_hosts

REQUEST_BYTES = 64  # the longest request line a consumer sends


async def oplog_replies(
    uri: str, start: Timestamp, batch_size: int | None, pad: int
) -> AsyncIterator[tuple[bytes | bytearray, int]]:
    """Every reply of the shard's oplog from `start` to its end, as UpstreamConnection's
    `command_in_place` gives them (`pad` bytes past each): a find, then getMores of `batch_size`
    entries (None: as many as 16 MiB of reply holds) that allow exhaust, as the proxy's readers'
    do, so the member streams the batches unasked. The raw read and the relay read this way."""
    host, port = parse_hosts(uri)[0]
    conn = await open_upstream(host, port)
    more_of = {"collection": "oplog.rs", **({"batchSize": batch_size} if batch_size else {})}
    try:
        frame, at = await conn.command_in_place(
            "local",
            {"find": "oplog.rs", "filter": {"ts": {"$gte": start}}},
            pad=pad,
            allocate=unfilled_bytearray,
        )
        while True:
            yield frame, at
            cursor_id = cursor_span(frame, at)[0]
            if not cursor_id:
                return
            if conn.streaming:
                frame, at = await conn.more_in_place(pad=pad, allocate=unfilled_bytearray)
            else:
                frame, at = await conn.command_in_place(
                    "local",
                    {"getMore": Int64(cursor_id), **more_of},
                    pad=pad,
                    exhaust=True,
                    allocate=unfilled_bytearray,
                )
    finally:
        await conn.aclose()


async def relay_shard(shard_uris: list[str], consumer: trio.SocketStream) -> None:
    """Serve one consumer: read its request line, relay the shard's oplog, close."""
    async with consumer:
        request = b""
        while not request.endswith(b"\n"):
            got = await consumer.receive_some(REQUEST_BYTES)
            if not got:  # a probe that only connects (ProxyProcess.wait_ready)
                return
            request += got
            if len(request) > REQUEST_BYTES:
                raise ValueError("request line too long")
        index, start = (int(part) for part in request.split())
        since = Timestamp(start >> 32, start & 0xFFFFFFFF)
        async for frame, _ in oplog_replies(shard_uris[index], since, BATCH_ENTRIES, 0):
            await consumer.send_all(frame)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="the shards' URIs, comma-separated")
    parser.add_argument("--listen", required=True, help="HOST:PORT")
    args = parser.parse_args()
    # Each reply is received into a buffer of its own, as the proxy's readers receive theirs:
    # kept in the heap as the proxy keeps them, not mapped afresh (a page fault every 4 KB).
    keep_large_allocations()
    host, port = args.listen.rsplit(":", 1)
    handler = functools.partial(relay_shard, args.upstream.split(","))
    trio.run(functools.partial(trio.serve_tcp, handler, int(port), host=host))


if __name__ == "__main__":
    main()
