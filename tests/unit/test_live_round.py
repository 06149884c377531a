"""A live tail's per-round shortcuts read the same values as the general code they stand in for:
an element found by a walk that stops at it (`first_element`, for an oplog entry's ts and a
reply's ok), the last entry's ts read in place (reply_splice `last_ts`), and a reader's
`starved` without adding up the memory pool when its own set-aside room covers the batch."""

from __future__ import annotations

import bson
from bson import Int64, Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from buckets._columnar.oplog_batch import OplogBatch, batch_in_place, reply_batch
from buckets._columnar.reply_splice import last_ts
from buckets.budget import ByteBudget
from buckets.memory_limit import MemoryPool
from buckets.oplog_tail import OplogTail
from buckets.reader import ShardReader
from mongoformats.change_events import OplogTransformer
from mongoformats.oplog_splice import elements, first_element, timestamp_of
from wireproxy.members import MemberConnector

_names = st.sampled_from(["ts", "t", "ok", "o", "wall", "x", "tsx"])
_values = st.one_of(
    st.integers(-(1 << 40), 1 << 40),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False),
    st.builds(Timestamp, st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 32) - 1)),
    st.dictionaries(st.sampled_from(["ts", "a"]), st.integers(-9, 9), max_size=2),
    st.lists(st.integers(-9, 9), max_size=3),
)
_timestamps = st.builds(Timestamp, st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 32) - 1))


@settings(max_examples=300)
@given(st.dictionaries(_names, _values, max_size=6), _names, st.binary(max_size=5))
def test_first_element_is_the_element_the_whole_walk_finds(doc, name, before):  # noqa: ANN001
    """Read in place at an offset, as in a received reply (names are unique in a document)."""
    raw = bson.encode(doc)
    buf = bytearray(before + raw)
    assert first_element(buf, name.encode(), len(before)) == elements(buf, len(before)).get(
        name.encode()
    )


@settings(max_examples=100, deadline=None)  # (the first run may compile the walk)
@given(st.lists(st.tuples(_timestamps, st.text(max_size=20)), min_size=1, max_size=5))
def test_the_last_entry_s_ts_is_read_in_place(entries):  # noqa: ANN001
    """As oplog entries come (ts after o), in a batch of their own bytes and in a reply's."""
    docs = [
        bson.encode({"op": "i", "ns": "db.c", "o": {"_id": s}, "ts": ts, "t": Int64(1)})
        for ts, s in entries
    ]
    batch = OplogBatch.of(docs)
    assert last_ts(batch) == timestamp_of(batch.entry(-1)) == entries[-1][0]
    reply = bson.encode({"cursor": {"nextBatch": [bson.decode(d) for d in docs], "id": 0}})
    _, in_reply = reply_batch(reply)
    assert last_ts(in_reply) == entries[-1][0]
    _, at_offset = batch_in_place(b"\0" * 3 + reply + bytes(300), 3)
    assert last_ts(at_offset) == entries[-1][0]


def _reader(budget: ByteBudget) -> ShardReader:
    tail = OplogTail(
        "shard0",
        [("member", 27018)],
        start=Timestamp(0, 0),
        skip_key=b"",
        transformer=OplogTransformer(token_version=2),
        connect_member=MemberConnector(),  # unused: nothing is read
    )
    return ShardReader(tail, budget=budget)


@settings(max_examples=300)
@given(
    limit=st.integers(1, 1000),
    used=st.integers(0, 1000),
    floor=st.integers(0, 600),
    held=st.integers(0, 600),
    in_hand=st.integers(0, 300),
    others=st.integers(0, 1000),
    pool_limit=st.integers(0, 3000),
    wants=st.integers(0, 1200),
    closed=st.booleans(),
    pooled=st.booleans(),
)
def test_starved_is_the_budget_and_pool_rule(  # noqa: PLR0913
    limit,
    used,
    floor,
    held,
    in_hand,
    others,
    pool_limit,
    wants,
    closed,
    pooled,  # noqa: ANN001
):
    pool = MemoryPool(pool_limit)
    account = pool.account(floor, reader=True, in_hand=in_hand) if pooled else None
    if account is not None:
        account.take(held)
        pool.account(0, reader=False).take(others)
        if closed:
            account.close()
    budget = ByteBudget(limit, account)
    budget.used = used
    reader = _reader(budget)
    reader._wants = wants
    assert reader.starved == (not budget.fits(wants) or budget.blocked_by_pool(wants))
