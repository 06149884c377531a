"""An upstream connection's replies taken in place (`command_in_place`), against a server on a real
socket that answers each request with a frame the test chose: every shape a server may answer in
gives the reply `command` gives, with room after it. An exhaust cursor's stream of replies, against
simcluster."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import bson
import pytest
import trio
from bson import Int64

from buckets._columnar.oplog_batch import SLACK, batch_in_place, reply_batch
from mongoformats import wire
from mongoformats.errors import MongoError
from simcluster import open_cluster
from tests.conftest import client, sync
from wireproxy.upstream import UpstreamClosed, open_upstream

REPLY = bson.encode(
    {
        "cursor": {
            "nextBatch": [{"i": i, "s": "x" * i} for i in range(300)],
            "id": Int64(9),
            "ns": "local.oplog.rs",
        },
        "ok": 1.0,
    }
)
ERROR = bson.encode(
    {"ok": 0.0, "errmsg": "cursor id 9 not found", "code": 43, "codeName": "CursorNotFound"}
)


async def _answering(answer: Callable[[int], bytes], test: Callable[[Any], Any]) -> None:
    """Run `test` on a connection to a server that answers request id r with answer(r)."""

    async def serve(stream: trio.SocketStream) -> None:
        framer = wire.MessageFramer()
        while data := await stream.receive_some(1 << 16):
            framer.receive_data(data)
            while (msg := framer.next_message()) is not wire.NEED_DATA:
                await stream.send_all(answer(msg.request_id))  # type: ignore[union-attr]

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(
            functools.partial(trio.serve_tcp, serve, 0, host="127.0.0.1")
        )
        conn = await open_upstream("127.0.0.1", listener.socket.getsockname()[1])
        try:
            await test(conn)
        finally:
            await conn.aclose()
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("shape", ["plain", "checksum", "zlib", "sequence"])
def test_a_reply_in_any_shape_is_taken_in_place_with_room_after_it(shape: str) -> None:
    def answer(rid: int) -> bytes:
        flags = wire.FLAG_CHECKSUM_PRESENT if shape == "checksum" else 0
        sequences = (("more", (bson.encode({"x": 1}),)),) if shape == "sequence" else ()
        frame = wire.encode_op_msg(50 + rid, rid, REPLY, flags=flags, sequences=sequences)
        return wire.compress(frame, "zlib") if shape == "zlib" else frame

    async def test(conn: Any) -> None:
        for _ in range(3):  # answers back to back on one connection stay in step
            data, at = await conn.command_in_place(
                "local", {"getMore": Int64(9), "collection": "oplog.rs"}, pad=SLACK
            )
            assert data[at : at + len(REPLY)] == REPLY
            assert data.endswith(
                bytes(SLACK)
            )  # after the reply (and a checksum, if the message has one)
            cursor_id, batch = batch_in_place(data, at)
            assert (cursor_id, batch.entries()) == (9, reply_batch(REPLY)[1].entries())
            assert (await conn.command("local", {"ping": 1})).raw == REPLY

    trio.run(_answering, answer, test)


def test_an_error_reply_taken_in_place_raises_its_code() -> None:
    async def test(conn: Any) -> None:
        with pytest.raises(MongoError) as caught:
            await conn.command_in_place(
                "local", {"getMore": Int64(9), "collection": "oplog.rs"}, pad=SLACK
            )
        assert caught.value.code == 43
        assert (await conn.command("admin", {"ping": 1}, check=False))[
            "code"
        ] == 43  # still in step

    trio.run(_answering, lambda rid: wire.encode_op_msg(1, rid, ERROR), test)


def test_an_answer_to_another_request_closes_the_connection() -> None:
    async def test(conn: Any) -> None:
        with pytest.raises(UpstreamClosed, match="out of turn"):
            await conn.command_in_place("local", {"find": "oplog.rs"}, pad=SLACK)
        assert conn.closed

    trio.run(_answering, lambda rid: wire.encode_op_msg(1, rid + 1, REPLY), test)


async def test_an_exhaust_cursor_is_read_by_batch_and_its_connection_runs_nothing_else() -> None:
    """Against simcluster's mongod: `command_in_place(exhaust=True)` starts the stream, each
    `more_in_place` takes the next batch while `streaming`; the last batch (the cursor done) ends
    it, and the connection runs commands again."""
    async with open_cluster(shards=1) as cluster:
        await sync(lambda: client(cluster.uri).ks.c.insert_many([{"i": i} for i in range(7)]))
        node = cluster.mongos.primary_of("ks")
        conn = await open_upstream(node.host, node.port)
        try:
            data, at = await conn.command_in_place(
                "ks", {"find": "c", "batchSize": 0}, pad=SLACK, exhaust=True
            )
            cursor_id, _ = batch_in_place(data, at)
            assert not conn.streaming  # a find is answered once, exhaustAllowed or not
            data, at = await conn.command_in_place(
                "ks",
                {"getMore": Int64(cursor_id), "collection": "c", "batchSize": 3},
                pad=SLACK,
                exhaust=True,
            )
            sizes = [len(batch_in_place(data, at)[1])]
            with pytest.raises(RuntimeError, match="exhaust"):
                await conn.command("admin", {"ping": 1})
            while conn.streaming:
                data, at = await conn.more_in_place(pad=SLACK)
                sizes.append(len(batch_in_place(data, at)[1]))
            assert sizes == [3, 3, 1] and batch_in_place(data, at)[0] == 0
            with pytest.raises(RuntimeError, match="no exhaust"):
                await conn.more_in_place(pad=SLACK)
            assert (await conn.command("admin", {"ping": 1}))["ok"] == 1
        finally:
            await conn.aclose()


def test_a_large_reply_over_tcp_wakes_its_reader_per_megabyte_not_per_segment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over TCP (where the socket's receive low-water mark holds back its wake-ups), a reply of
    4 MiB written 64 KiB at a time is read in a few reads of its own, not one per write; it
    arrives whole, and the connection's next reply is seen from its first byte."""
    body = bson.encode({"cursor": {"nextBatch": [{"s": "x" * 4000}] * 1000}, "ok": 1.0})
    reads: list[int] = []
    readv = os.readv

    def counted(fd: int, buffers: Any) -> int:
        n = readv(fd, buffers)
        reads.append(n)
        return n

    monkeypatch.setattr(os, "readv", counted)

    async def serve(stream: trio.SocketStream) -> None:
        framer = wire.MessageFramer()
        while data := await stream.receive_some(1 << 16):
            framer.receive_data(data)
            while (msg := framer.next_message()) is not wire.NEED_DATA:
                frame = wire.encode_op_msg(1, msg.request_id, body)  # type: ignore[union-attr]
                for at in range(0, len(frame), 1 << 16):
                    await stream.send_all(frame[at : at + (1 << 16)])
                    await trio.sleep(0.001)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            [listener] = await nursery.start(
                functools.partial(trio.serve_tcp, serve, 0, host="127.0.0.1")
            )
            conn = await open_upstream("127.0.0.1", listener.socket.getsockname()[1])
            for _ in range(2):
                reads.clear()
                data, at = await conn.command_in_place("local", {"getMore": Int64(9)}, pad=SLACK)
                assert data[at : at + len(body)] == body
                assert sum(reads) > 3 << 20
                assert len(reads) <= 16  # 64 writes of 64 KiB
            assert not conn.reply_arrived()
            await conn.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)
