"""Oplog replies walked and spliced in several threads at once, and on the calling thread beside
them, give byte for byte what one thread gives, in the order each reply was read:
buckets/oplog_tail.py splices a large reply in a worker thread (the compiled kernels release
the GIL) while the event loop's thread splices small ones, so nothing the walk, the splice, its
transactions, the blocks or their caches touch may be shared between two splices."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import bson
from bson import Int64
from bson.raw_bson import RawBSONDocument
from hypothesis import given, settings
from hypothesis import strategies as st

from buckets._columnar.batch_splice import BATCH_MIN
from buckets._columnar.event_block import EventBlock
from buckets._columnar.items import listed
from buckets._columnar.oplog_batch import SLACK
from buckets._columnar.reply_splice import splice_reply
from tests.unit.test_batch_splice import writes
from tests.unit.test_txn_batch import _oplogs, _server_transactions

THREADS = 4


def _reply(entries: list[bytes]) -> bytearray:
    """A getMore reply holding `entries`, padded as a received one is (UpstreamConnection)."""
    batch = [RawBSONDocument(e) for e in entries]
    reply = {"cursor": {"nextBatch": batch, "id": Int64(5), "ns": "local.oplog.rs"}, "ok": 1.0}
    return bytearray(bson.encode(reply) + bytes(SLACK))


def _digest(reply: bytearray, expanded: bool, applied: bool) -> Any:
    """What `splice_reply` makes of the reply, as comparable values: each item's type and events (a
    block's sort keys, bytes and kinds), the cursor id, the entry count and the last ts."""
    cursor_id, spliced = splice_reply(reply, 0, True, expanded, applied)
    assert spliced is not None
    items, entries, last_ts = spliced
    shown = [
        ("block", item.fields(), item.keys.tobytes(), item.kinds.tobytes())
        if type(item) is EventBlock
        else (type(item).__name__, item)
        for item in listed(items)
    ]
    return cursor_id, entries, last_ts, shown


def _replies(plain: list[dict[str, Any]], transactions: list[bytes]) -> list[bytearray]:
    """Replies of a backlog's size and shapes: the plain writes repeated past BATCH_MIN (a
    block), the app mix's transactions (a prepared one and one of one entry, nested documents,
    `$v: 2` updates, compound `_id`s) and the random ones among them, and a small reply."""
    raws = [bson.encode(e) for e in plain]
    backlog = raws * (BATCH_MIN // len(raws) + 1)
    app = _server_transactions(1000)
    return [
        _reply(backlog),
        _reply(backlog[: len(backlog) // 2] + transactions + app + backlog[len(backlog) // 2 :]),
        _reply(app + backlog + transactions),
        _reply(raws[:3] + transactions),
    ]


@settings(max_examples=12, deadline=None)
@given(st.lists(writes(), min_size=8, max_size=40), _oplogs(), st.booleans(), st.booleans())
def test_splices_in_threads_at_once_equal_one_thread(
    plain: list[dict[str, Any]], transactions: list[bytes], expanded: bool, applied: bool
) -> None:
    """Every reply spliced on this thread, one after the other, then all of them several times
    over by THREADS threads at once and by this thread meanwhile: each splice gives the first's
    events, byte for byte."""
    replies = _replies(plain, transactions)
    alone = [_digest(r, expanded, applied) for r in replies]
    start = threading.Barrier(THREADS + 1)

    def splice_all(k: int) -> list[Any]:
        start.wait()
        # each thread in another order, so different replies are spliced at the same time
        order = replies[k % len(replies) :] + replies[: k % len(replies)]
        return [_digest(r, expanded, applied) for r in order * 3]

    with ThreadPoolExecutor(THREADS) as pool:
        futures = [pool.submit(splice_all, k) for k in range(THREADS)]
        start.wait()
        beside = [_digest(r, expanded, applied) for r in replies * 3]
        results = [f.result() for f in futures]
    assert beside == alone * 3
    for k, result in enumerate(results):
        shift = k % len(replies)
        assert result == (alone[shift:] + alone[:shift]) * 3
