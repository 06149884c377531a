"""EventBlocks (a backlog's events as columns) behave as the EventFields tuples they stand for:
merged, sliced, sent between processes and returned in a reply, they give the same events in the
same order and the same reply bytes."""

from __future__ import annotations

import bisect
import itertools
import pickle
import random
import uuid
import weakref
from typing import Any

import bson
import numpy as np
from bson import Binary, Int64, ObjectId, Timestamp
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from buckets._columnar.batch_splice import BATCH_MIN, splice_block
from buckets._columnar.block_kernels import _digits_between
from buckets._columnar.event_block import EventBlock, _merge_runs
from buckets._columnar.items import as_runs, count_events
from buckets._columnar.oplog_batch import OplogBatch
from buckets._columnar.run import SLICE_MIN, ColumnarRun, merge_runs
from buckets._columnar.txn_events import HeadTable, TxnRows, joined, txn_block, txn_done
from buckets.event_run import PlainRun, fields_of
from buckets.merge import MergedQueue
from mongoformats.change_events import EVENT_SORT_KEY
from mongoformats.oplog_splice import array_of, cursor_document, splice_crud
from mongoformats.resume_token import (
    ResumeTokenData,
    encode_token_generic,
    high_water_mark,
    token_sort_key,
)

_UUIDS = [Binary(uuid.UUID(int=i).bytes, 4) for i in (1, 2, 3)]


def block_of_inserts(
    stamps: list[tuple[int, int]], collections: list[int], ids: list[Any] | None = None
) -> EventBlock:
    """The block of a batch of inserts at the given (seconds, increment) stamps, with the given
    `_id`s (ObjectIds if none are given), each event splice_crud's."""
    entries = []
    for j, ((secs, inc), c) in enumerate(zip(stamps, collections, strict=True)):
        _id = ObjectId() if ids is None else ids[j]
        entries.append(
            bson.encode(
                {
                    "op": "i",
                    "ns": f"db.c{c}",
                    "ui": _UUIDS[c],
                    "o": {"_id": _id, "c": c},
                    "o2": {"_id": _id},
                    "ts": Timestamp(secs, inc),
                    "t": Int64(1),
                    "v": Int64(2),
                    "wall": bson.datetime_ms.DatetimeMS(secs * 1000),
                }
            )
        )
    _, block, where = splice_block(OplogBatch.of(entries), expanded=False)
    assert block is not None and len(where) == len(entries)
    assert block.fields() == [splice_crud(raw, expanded=False) for raw in entries]
    return block


def _stamps(draw: st.DrawFn, n: int) -> list[tuple[int, int]]:
    increments = sorted(draw(st.lists(st.integers(1, 4 * n), min_size=n, max_size=n, unique=True)))
    return [(100, i) for i in increments]


# String `_id`s of few characters, so that keys are often prefixes of one another up to the
# string's end ("a", "a\x00", "a\x00\x01"), and long ones (a KeyString over 127 bytes), besides
# the ObjectId and UUID keys of other widths.
_ALPHABET = "\x00\x01a\xe9\u20ac"
_LENGTHS = (0, 1, 2, 3, 4, 6, 130, 200)


@st.composite
def _ids(draw: st.DrawFn, n: int, used: set[Any]) -> list[Any]:
    """n `_id`s of one kind drawn for a block (ObjectIds, strings, UUIDs, int32s, compound `_id`s
    of an int and a string, or a mix), none equal to one drawn before: two shards' events never
    share a key, so the merge is never the exact path's. Drawn from a Random of a drawn seed:
    hundreds of them would exceed hypothesis's data budget."""
    kinds = ["oid", "string", "uuid", "int", "compound"]
    kind = draw(st.sampled_from([*kinds, "mixed"]))
    rnd = random.Random(draw(st.integers(0, 2**32)))
    out: list[Any] = []
    for _ in range(n):
        _id = _one_id(rnd, kind if kind != "mixed" else rnd.choice(kinds))
        while repr(_id) in used:
            _id = _one_id(rnd, "string")
        used.add(repr(_id))
        out.append(_id)
    return out


def _one_id(rnd: random.Random, kind: str) -> Any:
    if kind == "oid":
        return ObjectId(rnd.randbytes(12))
    if kind == "uuid":
        return Binary(rnd.randbytes(16), 4)
    if kind == "int":
        return rnd.choice([rnd.randint(-300, 300), rnd.randint(-(2**31), 2**31 - 1)])
    text = "".join(rnd.choices(_ALPHABET, k=rnd.choice(_LENGTHS)))
    return {"store": rnd.randint(-3, 40), "sku": text} if kind == "compound" else text


@st.composite
def shard_blocks(draw: st.DrawFn) -> list[EventBlock]:
    """One to three shards' blocks, each of one `_id` kind or a mix (blocks of different key
    widths); equal times across shards happen (ties keep shard order)."""
    out: list[EventBlock] = []
    used: set[Any] = set()
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(BATCH_MIN, BATCH_MIN + 40))
        out.append(
            block_of_inserts(
                _stamps(draw, n),
                # (collections from a seeded Random: hypothesis's data budget goes to the stamps)
                random.Random(draw(st.integers(0, 2**32))).choices(range(3), k=n),
                draw(_ids(n, used)),
            )
        )
    return out


@settings(max_examples=25, deadline=None)
@given(shard_blocks(), st.data())
def test_merged_blocks_give_the_events_and_order_of_the_merged_tuples(
    blocks: list[EventBlock], data: st.DataObject
) -> None:
    as_blocks, as_tuples = MergedQueue([]), MergedQueue([])
    for i, block in enumerate(blocks):
        for queue, events in ((as_blocks, [block]), (as_tuples, block.fields())):
            queue.add_shard(str(i), b"")
            queue.extend(str(i), as_runs(events))
    # The marks move in steps: each release may cut a block in two.
    keys = sorted({k for b in blocks for k in map(EVENT_SORT_KEY, b.fields())})
    for cut in sorted(data.draw(st.lists(st.integers(0, len(keys) - 1), max_size=4))) + [
        len(keys) - 1
    ]:
        for i in range(len(blocks)):
            as_blocks.advance(str(i), keys[cut])
            as_tuples.advance(str(i), keys[cut])
        got, freed = as_blocks.pop_ready()
        want_runs, freed_tuples = as_tuples.pop_ready()
        want = fields_of(want_runs)
        if (
            len(got) == 1
        ):  # a merge's block (whose events are taken only as it is dealt) shares out its order
            probe = data.draw(st.sampled_from([*(f[0] for f in want), b"", b"\xff"]))
            assert got[0].bisect_right(probe) == sum(
                f[0] <= probe for f in want
            )  # probed unsorted, as sorted
            by_coll = {"c0": (0,), "c1": (0, 1), "c2": (1,)}
            merged = got[0].block
            shares = merged.shares([by_coll[coll] for _, _, coll, _, _ in merged.kind_table])
            assert {b: share.fields() for b, share in shares.items()} == {
                b: mine for b in (0, 1) if (mine := [f for f in want if b in by_coll[f[4]]])
            }
        assert fields_of(got) == want and freed == freed_tuples
        assert len(blocks) == 1 or len(got) <= 1  # several shards' blocks merge into one block
    assert len(as_blocks) == len(as_tuples) == 0


@settings(max_examples=25, deadline=None)
@given(shard_blocks(), st.data())
def test_single_events_among_blocks_are_merged_in_place_and_the_blocks_stay_blocks(
    blocks: list[EventBlock], data: st.DataObject
) -> None:
    """A shard's events as a block, as tuples, or as a block's head then tuples (a batch with a
    transaction in it): the release is the tuples' merge, and blocks are not turned into tuples."""
    mixed, as_tuples = MergedQueue([]), MergedQueue([])
    shapes = [data.draw(st.sampled_from(["block", "tuples", "both"])) for _ in blocks]
    ks = [data.draw(st.integers(1, len(block) - 1)) for block in blocks]
    for i, (block, shape, k) in enumerate(zip(blocks, shapes, ks, strict=True)):
        items = {
            "block": [block],
            "tuples": block.fields(),
            "both": [block.sliced(0, k), *block.sliced(k).fields()],
        }
        for queue, events in ((mixed, items[shape]), (as_tuples, block.fields())):
            queue.add_shard(str(i), b"")
            queue.extend(str(i), as_runs(events))
    for queue in (mixed, as_tuples):
        for i in range(len(blocks)):
            queue.advance(str(i), b"\xff")
    got, _ = mixed.pop_ready()
    want = fields_of(as_tuples.pop_ready()[0])
    assert fields_of(got) == want
    # Each bucket's share of each block, with the single events between them, is its part of the
    # order.
    by_coll = {"c0": (0,), "c1": (0, 1), "c2": (1,)}
    dealt: dict[int, list[tuple[Any, ...]]] = {0: [], 1: []}
    for run in got:
        for b, share in run.shares(lambda namespaces: by_coll[namespaces[0][3:]]).items():
            dealt[b] += share.fields()
    assert dealt == {b: [f for f in want if b in by_coll[f[4]]] for b in (0, 1)}
    # (Each event's key holds its own _id: no two are equal, so the exact path is not taken.)
    # The blocks' events stay columns, and in a merge of several shards' the single events join
    # them (a shard's own runs are released as they are).
    in_blocks = {
        f[0]
        for block, shape, k in zip(blocks, shapes, ks, strict=True)
        for f in {"block": block, "tuples": block.sliced(0, 0), "both": block.sliced(0, k)}[
            shape
        ].fields()
    }
    columnar = [len(run) for run in got if isinstance(run, ColumnarRun)]
    if len(blocks) == 1:
        assert sum(columnar) == len(in_blocks)
    else:
        assert columnar == ([len(want)] if in_blocks else [])


@settings(max_examples=25, deadline=None)
@given(shard_blocks(), st.data())
def test_a_transactions_rows_alone_make_a_block_of_their_own_columns(
    blocks: list[EventBlock], data: st.DataObject
) -> None:
    """txn_events.joined gives what txn_block gives (events, keys, each event's kind), as
    columns of its own (holding no other block); txn_done tells txn_block's rows made so.
    (test_txn_batch pins the rows written into a block's room to EventBlock.inserted.)"""
    theirs = blocks[-1]
    heads = data.draw(st.lists(st.binary(max_size=40), min_size=len(theirs)))[: len(theirs)]
    indexes = data.draw(st.lists(st.integers(0, 300), min_size=len(theirs)))[: len(theirs)]
    rewritten, done = txn_block(theirs, heads, indexes)
    assert done == txn_done(theirs, np.array(indexes, np.int64)).tolist()
    assume(all(done))
    alone = joined(TxnRows(theirs, HeadTable.of(heads), np.array(indexes, np.int64)))
    assert alone.fields() == rewritten.fields()
    assert np.array_equal(alone.keys, rewritten.keys)
    assert [alone.kind_table[k] for k in alone.kinds] == [
        rewritten.kind_table[k] for k in rewritten.kinds
    ]
    assert not alone.pins


@given(shard_blocks(), st.data())
def test_single_events_a_block_cannot_hold_cut_the_merged_block(
    blocks: list[EventBlock], data: st.DataObject
) -> None:
    """Singles with a shard tag (a topology event's) stay tuples: the merged block is cut where
    each goes, and its parts shorter than SLICE_MIN between them go as tuples too."""
    tagged = [
        (*f[:7], "shard0", None)
        for f in data.draw(
            st.lists(
                st.sampled_from(blocks[-1].fields()),
                min_size=1,
                max_size=len(blocks[-1]) - 1,
                unique=True,
            )
        )
    ]
    singles = sorted(tagged, key=EVENT_SORT_KEY)
    keys = {f[0] for f in singles}
    rest = blocks[-1].take(
        np.array([i for i, f in enumerate(blocks[-1].fields()) if f[0] not in keys], np.int64)
    )
    runs = [*map(ColumnarRun, blocks[:-1]), ColumnarRun(rest), PlainRun(singles)]
    got = merge_runs(runs)
    want = sorted(fields_of(runs), key=EVENT_SORT_KEY)
    assert fields_of(got) == want
    assert all(len(run) >= SLICE_MIN for run in got if isinstance(run, ColumnarRun))
    parts = [len(list(g)) for b, g in itertools.groupby(f[7] == "" for f in want) if b]
    columnar = [len(run) for run in got if isinstance(run, ColumnarRun)]
    assert sum(columnar) == sum(n for n in parts if n >= SLICE_MIN)


@given(shard_blocks(), st.data())
def test_single_events_a_block_holds_merge_into_one_block(
    blocks: list[EventBlock], data: st.DataObject
) -> None:
    """Singles with no shard tag go into the merged block as a run of their own: one block in
    token order, the same events as one stable sort of all the tuples."""
    fields = blocks[-1].fields()
    picked = data.draw(
        st.lists(st.integers(0, len(fields) - 1), min_size=1, max_size=len(fields), unique=True)
    )
    singles = sorted((fields[i] for i in picked), key=EVENT_SORT_KEY)
    rest = blocks[-1].take(np.array(sorted(set(range(len(fields))) - set(picked)), np.int64))
    runs = [*map(ColumnarRun, blocks[:-1]), ColumnarRun(rest), PlainRun(singles)]
    got = merge_runs(runs)
    assert fields_of(got) == sorted(fields_of(runs), key=EVENT_SORT_KEY)
    assert [type(run) for run in got] == [ColumnarRun]


def test_a_single_event_whose_key_a_blocks_event_shares_keeps_shard_order() -> None:
    """Equal keys across shards (the same events on two shards, as no cluster writes them) take
    the exact path: shard order decides, as one stable sort of tuples does."""
    block = block_of_inserts([(7, i) for i in range(1, 201)], [i % 3 for i in range(200)])
    fields = block.fields()
    for first, second in (([block], fields), (fields, [block])):
        queue = MergedQueue(["a", "b"])
        queue.extend("a", as_runs(first))
        queue.extend("b", as_runs(second))
        queue.advance("a", b"\xff")
        queue.advance("b", b"\xff")
        got, _ = queue.pop_ready()
        assert fields_of(got) == [f for pair in zip(fields, fields, strict=True) for f in pair]


def test_a_block_slices_bisects_and_crosses_processes_as_its_tuples() -> None:
    block = block_of_inserts([(7, i) for i in range(1, 301)], [i % 3 for i in range(300)])
    fields = block.fields()
    assert len(block) == count_events([block]) == 300 and block.nbytes == sum(
        len(f[5]) for f in fields
    )
    assert (
        block.sliced(10, 20).fields()
        == fields[10:20]
        == pickle.loads(pickle.dumps(block.sliced(10, 20))).fields()
    )
    assert block.take([5, 1]).fields() == [fields[5], fields[1]]  # type: ignore[arg-type]
    assert (
        [block.key(i) for i in (0, 299)]
        == [block.first_key, block.last_key]
        == [fields[0][0], fields[-1][0]]
    )
    # A high-water mark's key is shorter than an event's: compared as Python compares bytes.
    assert block.bisect_right(token_sort_key(high_water_mark(Timestamp(7, 150)))) == 149
    assert block.bisect_right(fields[41][0]) == 42 and block.bisect_right(b"") == 0
    assert block.sliced(100).bisect_right(fields[150][0]) == 51


def test_a_block_shares_out_its_events_by_their_kinds_routes_and_never_an_empty_share() -> None:
    block = block_of_inserts([(7, i) for i in range(1, 31)], [i % 3 for i in range(30)])
    route_of = {"c0": (0,), "c1": (1, 2), "c2": (2,)}  # as a rename from c1 would go to two buckets

    def shares(b: EventBlock) -> dict[int, EventBlock]:
        return b.shares([route_of[coll] for _, _, coll, _, _ in b.kind_table])

    fields = block.fields()
    assert {b: share.fields() for b, share in shares(block).items()} == {
        b: [f for i, f in enumerate(fields) if b in route_of[f"c{i % 3}"]] for b in (0, 1, 2)
    }
    # Cut down to one db.c0 event, the block still names the other kinds: buckets 1 and 2 get
    # nothing (an empty block would have no first key for the bucket to check).
    assert list(shares(block.sliced(3, 4))) == [0]


def test_a_reply_from_blocks_is_the_reply_from_their_events_bytes() -> None:
    block = block_of_inserts([(7, i) for i in range(1, 201)], [i % 3 for i in range(200)])
    raws = [f[5] for f in block.fields()]
    assert bytes(block.array_body(0)) == array_of(raws)[4:-1]
    # Mixed with single events, and keyed on from where each part starts.
    mixed = [block.sliced(0, 50), raws[50], block.sliced(51, 200)]
    for items in ([block], mixed):
        assert (
            cursor_document(
                5, "admin.$cmd", "nextBatch", items, {"postBatchResumeToken": {"_data": "00"}}
            ).raw
            == cursor_document(
                5, "admin.$cmd", "nextBatch", raws, {"postBatchResumeToken": {"_data": "00"}}
            ).raw
        )


def test_a_blocks_elements_are_keyed_from_any_index_across_digit_counts() -> None:
    """Keys written digit by digit: from 0, across 9/10, 99/100, 999/1000, and a large start."""
    block = block_of_inserts([(7, i) for i in range(1, 31)], [0] * 30)
    raws = [f[5] for f in block.fields()]
    for first in (0, 5, 95, 990, 99_999, 123_456_789):
        expected = b"".join(b"\x03%d\x00%s" % (first + i, raw) for i, raw in enumerate(raws))
        assert bytes(block.array_body(first)) == expected
    assert bytes(block.sliced(0, 0).array_body(3)) == b""


def test_the_digits_of_a_range_of_keys_are_counted_by_digit_width() -> None:
    """A reply's size counts its keys' digits a width at a time (_digits_between)."""
    for lo, hi in [(0, 0), (0, 1), (0, 10), (5, 11), (9, 10_001), (95, 1005), (99_990, 100_011)]:
        assert _digits_between(lo, hi) == sum(len(str(i)) for i in range(lo, hi))
    big = 10**18 - 3
    assert _digits_between(big, big + 6) == sum(len(str(i)) for i in range(big, big + 6))


def test_a_reply_batch_is_gathered_a_part_at_a_time_into_any_buffer() -> None:
    """A reply's batch is made as it is sent, into the sender's buffer (KeyedEvents.pieces): the
    parts join to the whole batch whatever the buffer's size, one too small for an event making
    that event a part of its own."""
    a = block_of_inserts([(7, i) for i in range(1, 300, 2)], [i % 3 for i in range(150)])
    b = block_of_inserts([(7, i) for i in range(2, 301, 2)], [(i + 1) % 3 for i in range(150)])
    share = EventBlock.merge([a, b]).sliced(10, 290)
    for first in (0, 95):
        body = share.array_body(first)
        whole = bytes(body.materialize())
        assert len(body) == len(whole) and whole == bytes(share.own().array_body(first))
        elements = [size + len(str(first + i)) + 2 for i, size in enumerate(share.sizes)]
        for size in (1, 50, 200, 1000, 10_000, len(whole)):
            parts = [bytes(p) for p in body.pieces(bytearray(size))]  # as the session sends
            assert b"".join(parts) == whole
            # Each part fills the buffer as far as whole elements go; one element too large for
            # it is a part of its own.
            assert all(len(p) <= size or len(p) in elements for p in parts)
            assert len(parts) <= len(elements)


def test_a_share_of_a_merge_is_keyed_from_where_its_events_lie() -> None:
    """A bucket's share points into the merged blocks (nothing copied at the deal); its reply
    gathers and keys the events in one pass and gives the bytes of the events themselves."""
    a = block_of_inserts([(7, i) for i in range(1, 300, 2)], [i % 3 for i in range(150)])
    b = block_of_inserts([(7, i) for i in range(2, 301, 2)], [(i + 1) % 3 for i in range(150)])
    merged = EventBlock.merge([a, b])
    shares = merged.shares(
        [(0,) if coll == "c0" else (1,) for _, _, coll, _, _ in merged.kind_table]
    )
    fields = merged.fields()
    for bucket, share in shares.items():
        raws = [f[5] for f in fields if (f[4] == "c0") == (bucket == 0)]
        assert share.nbytes == sum(map(len, raws)) and list(share.sizes) == list(map(len, raws))
        for first in (0, 7, 995):
            part = share.sliced(3, 200)
            expected = b"".join(
                b"\x03%d\x00%s" % (first + i, raw) for i, raw in enumerate(raws[3:200])
            )
            assert bytes(part.array_body(first)) == expected
        assert [f[5] for f in share.fields()] == raws


def test_a_blocks_hold_lives_as_long_as_some_block_points_into_it() -> None:
    class Hold:
        pass

    holds = [Hold(), Hold()]
    alive = [weakref.ref(h) for h in holds]
    a = block_of_inserts([(7, i) for i in range(1, 300, 2)], [i % 2 for i in range(150)])
    b = block_of_inserts([(7, i) for i in range(2, 301, 2)], [i % 2 for i in range(150)])
    a.hold, b.hold = holds
    del holds
    merged = EventBlock.merge([a.sliced(0, 100), b])
    shares = merged.shares([(k,) for k in range(len(merged.kind_table))])
    del a, b, merged
    assert all(r() is not None for r in alive) and all(s.pins for s in shares.values())
    tail = shares[1].sliced(50)  # a slice of a share holds the merge's blocks too
    owned = shares[0].own()
    expected = [f[5] for f in owned.fields()]
    del shares
    assert all(r() is not None for r in alive) and not owned.pins
    del tail
    assert all(r() is None for r in alive)  # a copy of its own holds nothing
    assert [f[5] for f in owned.fields()] == expected
    # A shard's block dealt whole to one bucket (its own columns, held): copied out as well.
    whole = block_of_inserts([(8, i) for i in range(1, 200)], [0] * 199)
    whole.hold = Hold()
    alive = [weakref.ref(whole.hold)]
    part = whole.sliced(20)
    expected = [f[5] for f in part.fields()]
    del whole
    owned = part.own()
    assert alive[0]() is not None
    del part
    assert alive[0]() is None and not owned.pins and [f[5] for f in owned.fields()] == expected


@settings(max_examples=200, deadline=None)
@given(
    st.integers(8, 21),
    st.lists(st.lists(st.binary(min_size=21, max_size=21), max_size=40), min_size=1, max_size=6),
    st.sampled_from([b"\x00", b"\x00\x01", b"\x00\xff"]),
)
def test_the_merge_of_sorted_runs_is_a_stable_sort_of_their_keys(
    width: int, runs: list[list[bytes]], alphabet: bytes
) -> None:
    """`_merge_runs` against numpy's stable sort of the same keys as byte strings: keys of few
    byte values, so heads (the first 8 bytes, the next 8, short of them or not) and whole keys
    are often equal across runs, and runs may be empty."""
    rows = [
        sorted(bytes(alphabet[b % len(alphabet)] for b in key[:width]) for key in run)
        for run in runs
    ]
    keys = np.frombuffer(b"".join(b"".join(run) for run in rows), np.uint8).reshape(-1, width)
    bounds = np.cumsum([0] + [len(run) for run in rows]).astype(np.int64)
    expected = np.argsort(keys.view(f"S{width}").ravel(), kind="stable")
    assert _merge_runs(keys, bounds).tolist() == expected.tolist()


def test_a_merge_of_many_batches_from_a_few_shards_is_in_token_order() -> None:
    """Each shard's consecutive batches make one sorted run; the runs interleave."""
    shards = [
        [
            block_of_inserts(
                [(7, i) for i in range(s + 1 + 4 * 50 * b, s + 1 + 4 * 50 * (b + 1), 4)],
                [i % 3 for i in range(50)],
            )
            for b in range(3)
        ]
        for s in range(4)
    ]
    blocks = [block for shard in shards for block in shard]
    merged = EventBlock.merge(blocks)
    keys = [f[0] for f in merged.fields()]
    assert keys == sorted(keys) and len(keys) == 600
    assert sorted(f[5] for f in merged.fields()) == sorted(f[5] for b in blocks for f in b.fields())


@settings(max_examples=30, deadline=None)
@given(shard_blocks(), st.data())
def test_bisecting_sorted_keys_cuts_where_pythons_bisect_does(
    blocks: list[EventBlock], data: st.DataObject
) -> None:
    """bisect_keys (one compiled loop for many keys, in a block's order or a merge's) cuts each
    key where bisect.bisect_right over the events' keys as bytes does: keys shorter and longer
    than an event's (a high-water mark's, a string _id's), a key's prefix, equal keys."""
    merged = EventBlock.merge(blocks) if len(blocks) > 1 else blocks[0]
    keys = [f[0] for f in merged.fields()]
    near = st.sampled_from(keys).flatmap(
        lambda k: st.sampled_from(
            [
                k,
                k[:-1],
                k[:9],
                k + b"\x00",
                k[:-1] + bytes([(k[-1] + 1) % 256]),
                k[:-1] + b"\x00\xff",
            ]
        )
    )
    probes = sorted(data.draw(st.lists(st.one_of(near, st.binary(max_size=40)), max_size=12)))
    lo = data.draw(st.integers(0, len(blocks[0])))
    for block in (merged, blocks[0]):
        rows = [f[0] for f in block.fields()]
        cuts, exact = block.bisect_keys(probes, lo)
        want: list[int] = []
        for probe in probes:
            want.append(bisect.bisect_right(rows, probe, max([lo, *want[-1:]])))
        assert cuts == want
        assert exact == any(c and rows[c - 1] == p for c, p in zip(cuts, probes, strict=True))
        assert [block.bisect_right(p, lo) for p in probes] == [
            bisect.bisect_right(rows, p, lo) for p in probes
        ]


_token_ids = st.one_of(
    st.binary(min_size=12, max_size=12).map(ObjectId),
    st.text(alphabet=_ALPHABET, max_size=6),
    st.text(min_size=120, max_size=140),
    st.uuids().map(lambda u: Binary(u.bytes, 4)),
    st.integers(-(2**31), 2**31 - 1),
    st.fixed_dictionaries(
        {"store": st.integers(-(2**31), 2**31 - 1), "sku": st.text(alphabet=_ALPHABET, max_size=6)}
    ),
    st.fixed_dictionaries({"a": st.fixed_dictionaries({"b": st.integers(-3, 3)})}),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 3), st.sampled_from(["insert", "update"]), _token_ids),
        min_size=2,
        max_size=6,
    ),
)
def test_keys_padded_with_zeros_order_as_the_keys_do(
    events: list[tuple[int, str, Any]],
) -> None:
    """A block's key rows are its tokens' KeyStrings padded with zero bytes (id_keys.py): that
    keeps their order because each ends with a non-zero byte and none is a proper prefix of
    another. Checked on tokens the general encoder makes (keystring.py), for the `_id`s the
    block takes: ObjectIds, strings (with NULs, empty, non-ASCII, long), UUIDs, int32s and
    compound `_id`s."""
    keys = [
        bytes.fromhex(
            encode_token_generic(
                ResumeTokenData(
                    Timestamp(100, inc),
                    uuid=uuid.UUID(int=1),
                    event_identifier={"operationType": op, "documentKey": {"_id": _id}},
                )
            )["_data"]
        )
        for inc, op, _id in events
    ]
    width = max(map(len, keys))
    padded = [k.ljust(width, b"\0") for k in keys]
    for a, padded_a in zip(keys, padded, strict=True):
        assert a[-1] != 0 and padded_a.rstrip(b"\0") == a
        for b, padded_b in zip(keys, padded, strict=True):
            assert a == b or not b.startswith(a)
            assert (a < b) == (padded_a < padded_b) and (a == b) == (padded_a == padded_b)
