"""Bucket assignment is pinned; the MergedQueue releases events in token order under the mark
rule."""

import pytest
from bson import Timestamp
from hypothesis import given
from hypothesis import strategies as st

from buckets.bucketing import bucket_of, buckets_for_event
from buckets.event_run import PlainRun, fields_of
from buckets.merge import MergedQueue
from mongoformats.change_events import ChangeEvent
from mongoformats.resume_token import ResumeTokenData, encode_token, high_water_mark, token_sort_key


def test_bucket_of_is_pinned_crc32():
    # Values of zlib.crc32: any client in any language can compute them.
    assert [bucket_of(ns, 8) for ns in ("shop.orders", "crm.customers", "logs.events")] == [
        714211571 % 8,
        984767914 % 8,
        1992238296 % 8,
    ]
    assert bucket_of("a.b", 1) == 0


def _event(ts, idx=0, ns=("db.c",)):
    tok = encode_token(
        ResumeTokenData(
            Timestamp(ts, 1),
            txn_op_index=idx,
            event_identifier={"operationType": "insert", "documentKey": {"_id": ts}},
        )
    )
    return ChangeEvent.for_token(tok, "insert", "db", "c", b"x" * 10, ns)


def _mark(ts):
    return token_sort_key(high_water_mark(Timestamp(ts, 2)))


def test_cross_namespace_events_reach_every_affected_bucket():
    rename = _event(5, ns=("db.a", "db.b"))
    assert set(buckets_for_event(rename, 16)) == {bucket_of("db.a", 16), bucket_of("db.b", 16)}
    drop_db = _event(6, ns=())
    assert buckets_for_event(drop_db, 4) == (0, 1, 2, 3)


def test_event_waits_for_every_shard_mark():
    q = MergedQueue(["s0", "s1"])
    q.extend("s0", [PlainRun([_event(10)])])
    q.advance("s0", _mark(10))
    assert q.pop_ready() == ([], {}) and q.blocking_shards() == ["s1"]
    q.advance("s1", _mark(9))
    assert q.pop_ready() == ([], {})
    q.advance("s1", _mark(10))
    assert len(q.pop_ready()[0]) == 1 and len(q) == 0


@given(
    st.lists(st.lists(st.integers(1, 10_000), max_size=30), min_size=1, max_size=5), st.randoms()
)
def test_merge_outputs_every_event_in_token_order(streams, rnd):
    shards = [f"s{i}" for i in range(len(streams))]
    # Distinct timestamps across shards, sorted per shard: one cluster clock, one oplog per shard.
    used: set[int] = set()
    per_shard = []
    for s in streams:
        ts = sorted({t for t in s if t not in used})
        used.update(ts)
        per_shard.append(ts)
    q = MergedQueue(shards)
    cursors = [0] * len(shards)
    out = []
    while any(c < len(p) for c, p in zip(cursors, per_shard, strict=True)):
        i = rnd.randrange(len(shards))
        if cursors[i] < len(per_shard[i]):
            batch = per_shard[i][
                cursors[i] : cursors[i] + rnd.randint(1, 4)
            ]  # one read of a shard's oplog
            cursors[i] += len(batch)
            q.extend(shards[i], [PlainRun([_event(ts) for ts in batch])])
            q.advance(shards[i], _mark(batch[-1]))
        out += [e.sort_key for e in fields_of(q.pop_ready()[0])]
    for s in shards:
        q.advance(s, _mark(20_000))
    out += [e.sort_key for e in fields_of(q.pop_ready()[0])]
    assert out == sorted(out) and len(out) == sum(len(p) for p in per_shard)


def test_a_batch_below_its_shards_mark_is_refused():
    q = MergedQueue(["s0"])
    q.extend("s0", [PlainRun([_event(3), _event(4)])])
    with pytest.raises(ValueError):
        q.extend("s0", [PlainRun([_event(4)])])
    q.advance("s0", _mark(10))
    runs, freed = q.pop_ready()
    events = fields_of(runs)
    assert [e.sort_key for e in events] == [_event(3).sort_key, _event(4).sort_key]
    assert freed == {"s0": sum(len(e.raw) for e in events)}


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["extend", "advance", "pop"]), st.integers(0, 2), st.integers(1, 8)
        ),
        max_size=40,
    )
)
def test_blocking_shards_and_frontier_follow_every_change_of_the_queue(ops):
    """The queue keeps its blocking shards and frontier between changes: after any sequence of
    batches, marks and releases they are those computed afresh."""
    shards = ["s0", "s1", "s2"]
    q = MergedQueue(shards)
    last = dict.fromkeys(shards, 0)  # each shard's last ts pushed or promised
    for op, s, step in ops:
        shard = shards[s]
        if op == "extend":
            last[shard] += step
            q.extend(shard, [PlainRun([_event(last[shard])])])
        elif op == "advance":
            last[shard] += step
            q.advance(shard, _mark(last[shard]))
        else:
            q.pop_ready()
        assert q.blocking_shards() == q._find_blocking()
        assert q.frontier() == min(q.mark_of(s) for s in shards)
