"""simcluster's parts that need no server: the oplog's stamp spliced as bytes, and chunk lookup by
shard key (tests/integration/test_simcluster.py runs simcluster against pymongo)."""

from __future__ import annotations

import uuid

import bson
import pytest
from bson import Int64, MaxKey, MinKey
from hypothesis import given
from hypothesis import strategies as st

from mongoformats.bson_order import sort_key
from simcluster.chunks import Chunk, ShardedCollection


def test_oplog_stamp_spliced_as_bytes_equals_encoding_the_stamped_entry():

    from simcluster.oplog import ClusterClock, Oplog

    oplog = Oplog(ClusterClock(), term=7)
    fields = {
        "op": "i",
        "ns": "a.b",
        "ui": bson.Binary(b"\x01" * 16, 4),
        "o": {"_id": 1, "x": [1, 2]},
        "o2": {"_id": 1},
    }
    ts, raw = oplog.append(fields)
    wall = bson.decode(raw)["wall"]
    assert raw == bson.encode({**fields, "ts": ts, "t": Int64(7), "v": Int64(2), "wall": wall})


_KEY_VALUES = st.one_of(
    st.integers(-50, 50),
    st.floats(-50, 50, allow_nan=False),
    st.text(max_size=3),
    st.none(),
    st.booleans(),
)


@given(
    bounds=st.lists(_KEY_VALUES, max_size=12),
    points=st.lists(_KEY_VALUES, max_size=12),
    splits=st.lists(st.tuples(st.integers(0, 20), _KEY_VALUES), max_size=4),
)
def test_chunk_at_finds_the_chunk_whose_range_holds_the_point(bounds, points, splits):
    """The binary search agrees with the definition (min <= point < max), over mixed BSON types,
    before and after splits."""
    cuts = sorted({sort_key(b): b for b in bounds}.items())
    edges = [MinKey(), *(b for _, b in cuts), MaxKey()]
    sc = ShardedCollection(
        "d.c",
        {"k": 1},
        uuid.uuid4(),
        chunks=[Chunk(edges[i], edges[i + 1], f"s{i % 3}") for i in range(len(edges) - 1)],
    )
    for index, point in splits:
        chunk = sc.chunks[index % len(sc.chunks)]
        inside = chunk.holds(point) and (
            isinstance(chunk.min, MinKey) or sort_key(point) != sort_key(chunk.min)
        )
        if inside:  # a split cuts strictly inside a chunk
            sc.split(chunk, point)
    for point in [*points, *bounds, MinKey(), MaxKey()]:
        assert sc.chunk_at(point) is next((c for c in sc.chunks if c.holds(point)), sc.chunks[-1])


async def test_the_cluster_process_freezes_what_it_holds_every_interval(autojump_clock):
    """A full collection would walk every member's documents, stopping the whole cluster: the
    process moves what lives out of the collector's sight on a timer (simcluster/__main__.py)."""
    import gc

    import trio

    from simcluster.__main__ import _freeze_what_lives

    gc.unfreeze()
    kept = [{"doc": [i]} for i in range(100)]
    try:
        with trio.move_on_after(2.5):
            await _freeze_what_lives(1.0)
        assert gc.get_freeze_count() >= len(kept)
    finally:
        gc.unfreeze()


_REPLIES_AGAIN = """
import resource, sys
from simcluster.__main__ import _keep_large_replies_in_the_heap
print(_keep_large_replies_in_the_heap())
def replies():  # a few shards' replies of 16 MiB, built and freed together
    parts = [b"x" * 4096] * 4096
    return [b"".join(parts) for _ in range(4)]
replies()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    replies()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_the_cluster_process_builds_its_next_replies_in_memory_it_already_has():
    """Replies freed together are kept in the heap, not unmapped to fault in afresh (20 fresh
    replies of 16 MiB would be 80k page faults); the user's own MALLOC_* settings win."""
    import os
    import subprocess
    import sys

    def run(**env: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", _REPLIES_AGAIN],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.split()

    set_here, faults = run()
    if set_here == "False":
        pytest.skip("glibc's mallopt is not there to set")
    assert int(faults) < 1000
    assert run(MALLOC_TRIM_THRESHOLD_=str(128 << 10))[0] == "False"


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["put", "remove", "discard", "size"]),
            st.integers(0, 5),
            st.text(max_size=30),
        ),
        max_size=40,
    )
)
def test_a_collections_data_size_follows_its_writes(ops):
    """collStats' `size` and the balancer's figure: the BSON bytes of what the collection holds,
    however its documents came and went."""
    from simcluster.storage import Collection, id_key

    coll = Collection("c")
    for op, _id, pad in ops:
        doc = coll.docs.get(id_key(_id))
        if op == "put":
            coll.put({"_id": _id, "pad": pad}, doc)
        elif op == "remove" and doc is not None:
            coll.remove(doc)
        elif op == "discard":
            coll.discard(id_key(_id))
        elif op == "size":
            coll.data_size()
    assert coll.data_size() == sum(len(bson.encode(d)) for d in coll.docs.values())


def test_a_collections_data_size_encodes_only_what_was_written_since_it_was_last_taken(
    monkeypatch,
):
    """The balancer takes it every round: a large collection is not encoded again each time."""
    import simcluster.storage
    from simcluster.storage import Collection, id_key

    coll = Collection("c")
    for i in range(100):
        coll.put({"_id": i, "pad": "x" * i})
    first = coll.data_size()
    encoded: list[object] = []
    real = bson.encode

    def counted(doc: object, *args: object, **kwargs: object) -> bytes:
        encoded.append(doc)
        return real(doc, *args, **kwargs)

    monkeypatch.setattr(simcluster.storage.bson, "encode", counted)
    assert coll.data_size() == first and encoded == []
    coll.put({"_id": 5, "pad": ""}, coll.docs[id_key(5)])
    assert coll.data_size() == first - len("xxxxx")
    assert encoded == [{"_id": 5, "pad": ""}]
