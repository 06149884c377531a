"""The transactions a batch holds whole, spliced by the batch splice (buckets/_columnar/
txn_batch.py), give exactly the events the general transform gives them (OplogTransformer's
transform_decoded, itself pinned to the server by the fidelity tests and to splice_txn_op by
test_txn_splice): same resume tokens (txnOpIndex), same fields in the same order (txnNumber and
lsid before `_id`), same applied-at times, whatever the batch's cuts, where the read starts
(a commit then reads its chain back), or which ops the splice must leave to the transformer.

The oplog shapes are those of mongodb-formats.md C.6 (simcluster/transactions.py writes them):
test_txn_splice's generators.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any
from unittest import mock

import bson
import numpy as np
import pytest
from bson import Binary, Int64, ObjectId, Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

import buckets._columnar.batch_splice as batch_splice
import buckets._columnar.txn_batch as txn_batch
import mongoformats.txn_splice as txn_splice
from buckets._columnar.batch_splice import BATCH_MIN, splice_block, splice_entries
from buckets._columnar.event_block import EventBlock
from buckets._columnar.items import as_fields
from buckets._columnar.oplog_batch import SLACK, OplogBatch
from buckets._columnar.txn_events import HeadTable, TxnRows, joined, txn_block
from buckets._columnar.txn_read import R_OK, op_entries, read_rows
from mongoformats.bson_bytes import timestamp_of
from mongoformats.change_events import OplogTransformer
from mongoformats.resume_token import decode_token
from mongoformats.txn_splice import txn_entry, txn_event
from tests.unit.test_oplog_splice import crud_entries, write_body
from tests.unit.test_txn_splice import (
    _NULL_TS,
    _UIS,
    _entry,
    _shaped_entries,
    adopt_chain_back_from,
    transactions,
)

_SECONDS = 1_700_000_000


def _insert(inc: int, _id: Any, ns: str = "app.orders") -> bytes:
    """A plain insert outside any transaction, at increment `inc`."""
    return bson.encode(
        {
            "op": "i",
            "ns": ns,
            "ui": _UIS[0],
            "o": {"_id": _id, "n": inc},
            "o2": {"_id": _id},
            "ts": Timestamp(_SECONDS, inc),
            "t": Int64(1),
            "v": Int64(2),
            "wall": bson.datetime_ms.DatetimeMS(inc),
        }
    )


# Ops the splice leaves to the general transform, each for its own reason: an update of `$v` 1
# (a modifier document), an op with a field a plain write's entry does not have, an op without
# ui, a view's definition, a migration's write.
_ODD_OPS = [
    {"op": "u", "ns": "app.orders", "ui": _UIS[0], "o": {"$set": {"a": 1}}, "o2": {"_id": 1}},
    {
        "op": "u",
        "ns": "app.orders",
        "ui": _UIS[0],
        "o": {"_id": 2, "a": 1},
        "o2": {"_id": 2},
        "b": True,
    },
    {"op": "i", "ns": "app.orders", "o": {"_id": 3}, "o2": {"_id": 3}},
    {"op": "i", "ns": "app.system.views", "ui": _UIS[1], "o": {"_id": "app.v", "viewOn": "c"}},
    {"op": "d", "ns": "app.orders", "ui": _UIS[0], "o": {"_id": 4}, "fromMigrate": True},
]


@st.composite
def _oplogs(draw: st.DrawFn) -> list[bytes]:
    """Transactions (one entry, a partialTxn chain, a prepare and its commit; sessions of every
    kind), their entries interleaved now and then (each transaction's in order), plain inserts
    between them now and then, an op the splice leaves to the transformer put into one of them
    now and then."""
    txns: list[list[bytes]] = []
    for k in range(draw(st.integers(1, 4))):
        entries = draw(transactions(20 * k))
        if draw(st.integers(0, 3)) == 0:
            odd = bson.encode(draw(st.sampled_from(_ODD_OPS)))
            at = draw(st.integers(0, len(entries) - 1))
            entries[at] = _with_op(entries[at], odd)
        entries += [_insert(20 * k + 15 + j, j) for j in range(draw(st.integers(0, 2)))]
        txns.append(entries)
    order = [k for k, entries in enumerate(txns) for _ in entries]
    if draw(st.booleans()):
        order = draw(st.permutations(order))
    return [txns[k].pop(0) for k in order]


def _with_op(entry: bytes, op: bytes) -> bytes:
    """An applyOps entry with `op` added to its ops (another entry is left as it is)."""
    doc = bson.decode(entry)
    if "applyOps" in doc["o"]:
        doc["o"]["applyOps"].append(bson.decode(op))
    return bson.encode(doc)


def _general(oplog: list[bytes], start: int, expanded: bool) -> list[Any]:
    """The events of a read from the entry at `start`, each entry made by the transformer."""
    return _read([[entry] for entry in oplog[start:]], oplog, expanded)


def _batched(
    oplog: list[bytes],
    start: int,
    cuts: list[int],
    expanded: bool,
    applied: bool = True,
    block_min: int = BATCH_MIN,
) -> list[Any]:
    """The events of a read from the entry at `start` in batches cut at `cuts`, each made by
    splice_entries (`applied`; a batch of `block_min` entries or more spliced as a backlog's,
    in a block) and what it leaves by the transformer (as buckets/oplog_tail.py does)."""
    bounds = sorted({start, *(c for c in cuts if start < c < len(oplog)), len(oplog)})
    batches = []
    with mock.patch.object(batch_splice, "BATCH_MIN", block_min):
        for a, b in zip(bounds, bounds[1:], strict=False):
            items = splice_entries(OplogBatch.of(oplog[a:b]), True, expanded, applied)
            batches.append([items] if type(items) is EventBlock else items)
    return _read(batches, oplog, expanded)


def _read(batches: list[list[Any]], oplog: list[bytes], expanded: bool) -> list[Any]:
    """The events of the batches' items, as tuples: bytes transformed (a commit's chain read
    back first, by prevOpTime), blocks' fields, spliced fields as they are; an error the
    transform raised, as its type, and nothing after it: a stream fails at an entry it cannot
    transform (oplog_tail.py: IncompleteTransactionHistory for a chain whose start is gone), so
    what a transformer would make of the entries after it is never seen."""
    by_ts = {timestamp_of(entry): entry for entry in oplog}
    tr = OplogTransformer(show_expanded_events=expanded)
    out: list[Any] = []
    for items in batches:
        for item in items:
            if type(item) is EventBlock:
                out += item.fields()
            elif type(item) is not bytes:
                out += [item] if item else []
            else:
                out += _transformed(tr, item, by_ts)
                if out and isinstance(out[-1], type):
                    return out
    return [*out, tr.pending_transactions()]


def _transformed(tr: OplogTransformer, entry: bytes, by_ts: dict[Timestamp, bytes]) -> list[Any]:
    try:
        adopt_chain_back_from(tr, tr.missing_chain(entry), by_ts)
        return [tuple(ev) for ev in tr.transform_decoded(entry)]
    except (KeyError, TypeError) as e:
        return [type(e)]


@settings(max_examples=300, deadline=None)
@given(
    _oplogs(),
    st.booleans(),
    st.integers(0, 3),
    st.lists(st.integers(1, 20), max_size=3),
)
def test_transactions_spliced_in_batches_equal_the_general_transform(
    oplog: list[bytes], expanded: bool, start: int, cuts: list[int]
) -> None:
    """Random transactions in batches cut anywhere (a chain split across two batches, a commit
    without its prepare), read from the start or from inside one, with and without expanded
    events: every transaction gives the events the general transform gives, in oplog order."""
    start = min(start, len(oplog) - 1)
    with mock.patch.object(txn_batch, "TXN_OPS_MIN", 0):
        assert _batched(oplog, start, cuts, expanded) == _general(oplog, start, expanded)


def _inserted_after(laid: Any, txns: Any, commits: list[int]) -> Any:
    """The block and places of the room path's plain counterpart: the batch's block written
    whole, the transactions' rows rewritten alone (txn_block), put in at their commits as a
    merge puts a block into another (EventBlock.inserted)."""
    places = np.asarray(commits, np.intp)
    rewritten, done = txn_block(txns.block, txns.heads.rows(), txns.indexes.tolist())
    assert all(done)
    cuts = np.searchsorted(laid.taken, places).tolist()
    whole = batch_splice._block(laid).inserted(rewritten, cuts)
    return whole, np.sort(np.concatenate([laid.taken, places]))


_room = batch_splice._with_transactions


def _items(batch: OplogBatch, expanded: bool, applied: bool) -> list[Any]:
    """splice_entries' items, a block as its events' fields, keys and kinds."""
    items = splice_entries(batch, True, expanded, applied)
    return [
        (item.fields(), item.keys.tolist(), [item.kind_table[k] for k in item.kinds])
        if type(item) is EventBlock
        else item
        for item in (items if type(items) is list else [items])
    ]


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 60),
    st.lists(st.integers(0, 60), min_size=1, max_size=5),
    st.booleans(),
    st.booleans(),
)
def test_transactions_written_into_the_blocks_room_equal_the_block_with_theirs_inserted(
    inserts: int, places: list[int], expanded: bool, applied: bool
) -> None:
    """A batch's transactions' events written into the room its block leaves for them
    (block_events.assemble, txn_events.put_in) make the batch's block with the transactions'
    rows rewritten alone (txn_block) inserted at their commits: the same events, keys and
    kinds, byte for byte; transactions before, between and after the batch's plain writes,
    next to each other or not."""
    oplog = [_insert(i, ObjectId(i.to_bytes(12, "big"))) for i in range(1, inserts + 1)]
    for k, at in enumerate(sorted(places, reverse=True)):
        oplog[at:at] = _server_transactions(1000 + 10 * k)
    batch = OplogBatch.of(oplog)
    with (
        mock.patch.object(batch_splice, "_with_transactions", wraps=_room) as room,
        mock.patch.object(batch_splice, "BATCH_MIN", 1),
        mock.patch.object(txn_batch, "TXN_OPS_MIN", 0),
    ):
        got = _items(batch, expanded, applied)
        # (no plain write: no block to leave room in; with expanded events the one-entry
        # transaction's sub-diff is update_description's, and with `applied` the prepared one's
        # events are fields: no transaction is the block's)
        assert room.called == (inserts > 0 and not (expanded and applied))
        with mock.patch.object(batch_splice, "_with_transactions", _inserted_after):
            want = _items(batch, expanded, applied)
    assert got == want


def _server_transactions(base: int) -> list[bytes]:
    """A prepared transaction and one of one entry, as a sharded cluster's shard logs a
    transaction spread over shards and one on a single shard, of the ops applications write:
    inserts of nested documents, `$v: 2` updates, a replacement and a delete, with ObjectId,
    string, UUID and compound `_id`s."""
    lsid = {"id": Binary(uuid.UUID(int=base + 1).bytes, 4), "uid": Binary(bytes(32), 0)}
    session = {"lsid": lsid, "txnNumber": Int64(base)}
    keys: list[Any] = [ObjectId(), "order-17", Binary(uuid.UUID(int=base).bytes, 4), {"a": 1}]
    ops = [
        {
            "op": "i",
            "ns": "app.orders",
            "ui": _UIS[0],
            "o": {"_id": k, "customer": {"name": "x", "tags": ["a", "b"]}},
            "o2": {"_id": k},
        }
        for k in keys
    ]
    ops += [
        {
            "op": "u",
            "ns": "app.users",
            "ui": _UIS[1],
            "o": {"$v": 2, "diff": {"u": {"status": "paid"}, "sitems": {"a": True, "u0": 1}}},
            "o2": {"_id": keys[0]},
        },
        {
            "op": "u",
            "ns": "app.users",
            "ui": _UIS[1],
            "o": {"_id": "u", "n": 2},
            "o2": {"_id": "u"},
        },
        {"op": "d", "ns": "app.orders", "ui": _UIS[0], "o": {"_id": keys[2]}},
    ]
    first = Timestamp(_SECONDS, base + 1)
    commit = {"commitTransaction": 1, "commitTimestamp": Timestamp(_SECONDS, base + 2)}
    return [
        _entry(session, {"applyOps": ops[:4], "prepare": True}, base + 1, True, _NULL_TS),
        _entry(session, commit, base + 3, True, first),
        _entry(
            {**session, "txnNumber": Int64(base + 1)},
            {"applyOps": ops[4:]},
            base + 4,
            True,
            _NULL_TS,
        ),
    ]


def test_an_applications_transactions_take_the_batch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backlog's batch of plain writes and the transactions an application writes (prepared on
    a shard of several, or committed in one entry): every transaction's entries leave the batch
    as their events, read in the compiled loop, every op spliced by the block (none one by one,
    none by the transformer), each event led by txnNumber and lsid, its txnOpIndex in its
    token."""
    oplog = [_insert(i, ObjectId()) for i in range(1, BATCH_MIN + 1)]
    for k in range(4):
        oplog[20 * k : 20 * k] = _server_transactions(1000 + 10 * k)

    def one_by_one(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("an op of a transaction was spliced one by one")

    monkeypatch.setattr(txn_batch, "splice_crud", one_by_one)
    monkeypatch.setattr(txn_batch, "read_apply_ops", one_by_one)  # all read in the compiled loop
    items = splice_entries(OplogBatch.of(oplog), True, False)
    assert isinstance(items, list)
    assert not [item for item in items if type(item) is bytes]
    txn_events = [
        ev for ev in as_fields(items) if ev and next(iter(bson.decode(ev[5]))) == "txnNumber"
    ]
    assert len(txn_events) == 4 * 7
    for ev in txn_events:
        assert list(bson.decode(ev[5]))[:3] == ["txnNumber", "lsid", "_id"]
    indexes = [decode_token(bson.decode(ev[5])["_id"]).txn_op_index for ev in txn_events]
    assert indexes == [0, 1, 2, 3, 0, 1, 2] * 4
    monkeypatch.undo()
    assert _read([items], oplog, False) == _general(oplog, 0, False)


def test_few_ops_are_left_to_the_transformer() -> None:
    """A batch whose whole transactions have fewer than TXN_OPS_MIN ops keeps their entries:
    the transformer splices so few at less cost."""
    oplog = [_insert(i, ObjectId()) for i in range(1, 10)] + _server_transactions(100)[2:]
    items = splice_entries(OplogBatch.of(oplog), True, False)
    assert isinstance(items, list) and items[-1] == oplog[-1]


@settings(max_examples=300, deadline=None)
@given(_shaped_entries(), st.data())
def test_the_compiled_read_equals_read_apply_ops(shaped: tuple[bytes, bool], data: Any) -> None:
    """A transaction's entry of the server's shape is read in the compiled loop as
    read_apply_ops reads it (ops, key, times, stamp); an odd one, or one with a byte changed
    anywhere, is read so or left to read_apply_ops, never read otherwise. The loop takes what
    read_apply_ops reads at fixed offsets, and a chain's last entry (`count` after its ops)."""
    entry, _ = shaped
    if data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(entry) - 1))
        entry = entry[:at] + bytes([data.draw(st.integers(0, 255))]) + entry[at + 1 :]
    walked = txn_splice.read_apply_ops(entry)
    expected = [(1, _walked_read(walked))] if walked is not None else []
    assert _compiled_reads(txn_batch._reads([b"", entry])) == expected
    rows, _ = read_rows(entry + bytes(SLACK), np.zeros(1, np.int64), np.array([len(entry)]))
    assert bool(rows[0, R_OK]) == (_read_at_fixed_offsets(entry) or _last_of_chain(entry))


def _last_of_chain(entry: bytes) -> bool:
    """Whether the entry is of the server's shape, its `o` an applyOps array then an int64
    `count` (the last entry of a partialTxn chain)."""
    shape = txn_splice._server_shape(entry)
    if shape is None or txn_splice.read_apply_ops(entry) is None:
        return False
    o, tail = shape  # (where o's value starts, where its ts element does)
    count = tail - 1 - 15  # (o's end byte before the tail; count's element is 15 bytes)
    ops_end = o + 14 + struct.unpack_from("<i", entry, o + 14)[0]
    return (
        entry[o + 4 : o + 14] == b"\x04applyOps\x00"
        and ops_end == count
        and (entry[count : count + 7] == b"\x12count\x00")
    )


def _word(ts: Timestamp | None) -> int:
    return 0 if ts is None else ts.time << 32 | ts.inc


def _walked_read(read: txn_splice.ApplyOps) -> tuple[Any, ...]:
    """What read_apply_ops reads of an entry: key, times, ops, and, for a commit, its stamp's
    head and its ops as plain writes' entries (txn_entry)."""
    head, entries = (
        (read.stamp[1], [txn_entry(op, read.stamp[0]) for op in read.ops])
        if (read.stamp is not None)
        else (b"", None)
    )
    return (read.key, _word(read.ts), _word(read.prev), read.buffered, read.ops, head, entries)


def _compiled_reads(reads: Any) -> list[tuple[int, tuple[Any, ...]]]:
    """txn_batch's reads as _walked_read gives them, the entries made by op_entries."""
    out = []
    for i, read in reads.reads:
        ops = [bytes(reads.data[a:b]) for a, b in reads.spans[read.ops].tolist()]
        entries = None
        if read.tail >= 0:
            columns = (read.ops.start, len(read.ops), read.tail, read.tail_size)
            made = op_entries(reads.data, reads.spans, *(np.array([c], np.int64) for c in columns))
            entries = OplogBatch(*made).entries()
        out.append((i, (read.key, read.ts, read.prev, read.buffered, ops, read.head, entries)))
    return out


def _read_at_fixed_offsets(entry: bytes) -> bool:
    """Whether read_apply_ops reads the entry at fixed offsets (not by walking it)."""
    shape = txn_splice._server_shape(entry)
    try:
        return shape is not None and txn_splice._read_server(entry, *shape) is not None
    except (ValueError, IndexError, struct.error):
        return False


# The documentKeys the block keys (id_keys.py), of every width: ObjectIds, UUIDs, strings,
# int32s and int64s, compound `_id`s and shard keys beside `_id`.
_BLOCK_IDS = st.one_of(
    st.builds(lambda b: ObjectId(b), st.binary(min_size=12, max_size=12)),
    st.uuids().map(lambda u: Binary(u.bytes, 4)),
    st.text(max_size=30),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**40), 2**40).map(Int64),
    st.fixed_dictionaries({"a": st.integers(0, 9), "b": st.text(max_size=4)}),
)


@st.composite
def plain_writes(draw: st.DrawFn) -> dict[str, Any]:
    """A plain write of the shapes the block takes (batch_splice.py's docstring), or now and
    then one it leaves (crud_entries': other namespaces, documentKeys and field orders)."""
    if draw(st.integers(0, 4)) == 0:
        return draw(crud_entries())
    op = draw(st.sampled_from(["i", "u", "r", "d"]))
    _id = draw(_BLOCK_IDS)
    key = {"sk": draw(_BLOCK_IDS), "_id": _id} if draw(st.booleans()) else {"_id": _id}
    c = draw(st.integers(0, 1))
    entry = {"op": "u" if op == "r" else op, "ns": f"app.c{c}", "ui": _UIS[c]}
    entry.update(write_body(draw, op, key))
    seconds, inc = draw(st.integers(1, 2**32 - 1)), draw(st.integers(0, 2**32 - 1))
    return {
        **entry,
        "ts": Timestamp(seconds, inc),
        "t": Int64(1),
        "v": Int64(2),
        "wall": bson.datetime_ms.DatetimeMS(seconds * 1000),
    }


_HEADS = [
    b"",
    bson.encode({"txnNumber": Int64(7), "lsid": {"id": _UIS[0]}})[4:-1],
    bson.encode({"txnNumber": 3, "lsid": {"id": _UIS[1], "uid": Binary(bytes(32), 0)}})[4:-1],
]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(plain_writes(), min_size=1, max_size=12),
    st.data(),
    st.booleans(),
)
def test_the_compiled_rewrite_equals_txn_event(
    entries: list[dict[str, Any]], data: Any, expanded: bool
) -> None:
    """The block's events made their transactions' in the compiled loop equal txn_event's of
    each (its head, its txnOpIndex: 0, of one or more KeyString bytes, past 127 and 255)."""
    raws = [bson.encode(entry) for entry in entries]
    _, block, taken = splice_block(OplogBatch.of(raws), expanded=expanded)
    if block is None:
        return
    heads = [data.draw(st.sampled_from(_HEADS)) for _ in taken]
    indexes = [data.draw(st.sampled_from([0, 0, 1, 2, 127, 128, 255, 256, 3000])) for _ in taken]
    expected = [
        txn_event(fields, head, index)
        for fields, head, index in zip(block.fields(), heads, indexes, strict=True)
    ]
    rewritten, done = txn_block(block, heads, indexes)
    made = [
        (*fields[:-1], None) if ok else None
        for fields, ok in zip(rewritten.fields(), done, strict=True)
    ]
    assert made == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(plain_writes(), min_size=1, max_size=12),
    st.lists(plain_writes(), min_size=1, max_size=12),
    st.data(),
    st.booleans(),
)
def test_rows_written_into_a_blocks_room_equal_the_block_with_them_inserted(
    mine: list[dict[str, Any]], theirs: list[dict[str, Any]], data: Any, expanded: bool
) -> None:
    """The room path (batch_splice._with_transactions: the block written with room for another
    block's rows, which txn_events.put_in writes made their transactions') gives the block with
    those rows rewritten alone (txn_block) inserted (EventBlock.inserted): the same events,
    keys (whichever block's are wider) and kinds, byte for byte, in columns of its own; any
    heads and txnOpIndexes (of one to three KeyString bytes), anywhere among the block's
    events. Alone, the rows make txn_block's block (txn_events.joined)."""
    batch = OplogBatch.of([bson.encode(entry) for entry in mine])
    _, laid, _ = batch_splice._laid_out(batch, expanded)
    _, block, taken = splice_block(
        OplogBatch.of([bson.encode(e) for e in theirs]), expanded=expanded
    )
    if laid is None or block is None:
        return
    heads = [data.draw(st.sampled_from(_HEADS)) for _ in taken]
    indexes = [data.draw(st.sampled_from([0, 1, 2, 127, 128, 255, 256, 3000])) for _ in taken]
    rewritten, done = txn_block(block, heads, indexes)
    if not all(done):
        return
    cuts = sorted(
        data.draw(
            st.lists(st.integers(0, len(laid.taken)), min_size=len(taken), max_size=len(taken))
        )
    )
    # (a commit's place in the batch: before the taken entry its cut names, or past the last)
    commits = [int(laid.taken[c]) if c < len(laid.taken) else len(batch) for c in cuts]
    rows = TxnRows(block, HeadTable.of(heads), np.array(indexes, np.int64))
    got, places = batch_splice._with_transactions(laid, rows, commits)
    want = batch_splice._block(laid).inserted(rewritten, cuts)
    for made, expected in ((got, want), (joined(rows), rewritten)):
        assert made.fields() == expected.fields()
        assert np.array_equal(made.keys, expected.keys)
        assert [made.kind_table[k] for k in made.kinds] == [
            expected.kind_table[k] for k in expected.kinds
        ]
        assert made.hold is None and not made.pins
    assert len(set(got.kind_table)) == len(got.kind_table)
    assert places.tolist() == sorted([*laid.taken.tolist(), *commits])


@pytest.mark.parametrize("count", [1, 129, 300])
def test_a_transaction_of_many_ops_equals_the_general_transform(count: int) -> None:
    """A transaction of hundreds of ops (txnOpIndex KeyStrings of one, two and three bytes), in
    one entry and prepared, spliced in a batch."""
    lsid = {"id": Binary(uuid.UUID(int=5).bytes, 4), "uid": Binary(bytes(32), 0)}
    session = {"lsid": lsid, "txnNumber": Int64(2)}
    ops = [
        {"op": "i", "ns": "a.b", "ui": _UIS[0], "o": {"_id": k, "x": "y"}, "o2": {"_id": k}}
        for k in range(count)
    ]
    commit = {"commitTransaction": 1, "commitTimestamp": Timestamp(_SECONDS, 2)}
    oplog = [
        _entry(session, {"applyOps": ops}, 1, True, _NULL_TS),
        _entry(
            {**session, "txnNumber": Int64(3)},
            {"applyOps": ops, "prepare": True},
            2,
            True,
            _NULL_TS,
        ),
        _entry({**session, "txnNumber": Int64(3)}, commit, 3, True, Timestamp(_SECONDS, 2)),
    ]
    with mock.patch.object(txn_batch, "TXN_OPS_MIN", 0):
        items = splice_entries(OplogBatch.of(oplog), True, False)
    assert not [item for item in items if type(item) is bytes]
    assert _read([items], oplog, False) == _general(oplog, 0, False)


def test_interleaved_transactions_each_give_their_events_once() -> None:
    """Two shards' worth of prepared transactions whose entries interleave (a prepare, another's
    prepare, the first's commit, the other's commit), as a shard logs concurrent transactions:
    each transaction's events come once, at its commit."""
    first, second = _server_transactions(100), _server_transactions(200)
    oplog = [first[0], second[0], first[1], second[2], second[1], first[2]]
    with mock.patch.object(txn_batch, "TXN_OPS_MIN", 0):
        items = splice_entries(OplogBatch.of(oplog), True, False)
    assert not [item for item in items if type(item) is bytes]
    assert _read([items], oplog, False) == _general(oplog, 0, False)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 4),
            st.one_of(
                st.none(),
                st.integers(0, 5),
                st.lists(st.tuples(st.integers(0, 9)), max_size=3),
            ),
        ),
        max_size=12,
    ),
    st.randoms(use_true_random=False),
)
def test_chains_are_placed_as_one_by_one(
    shapes: list[tuple[int, list[Any] | int | None]], rng: Any
) -> None:
    """_placed_items (columns) places interleaved chains' entries and events as placing them
    chain by chain did: each entry of a placed chain replaced by none of its events, its commit
    by its fields, or by as many of the block's rows (its index once for each)."""
    lengths = [n for n, _ in shapes]
    # Chains interleave: their entries are any distinct items, each chain's in order.
    slots = rng.sample(range(3 * sum(lengths) + 1), sum(lengths))
    items, at = [], 0
    for n in lengths:
        items += sorted(slots[at : at + n])
        at += n
    counts = [-1 if e is None else e if isinstance(e, int) else 0 for _, e in shapes]
    fields = {c: e for c, (_, e) in enumerate(shapes) if isinstance(e, list)}
    made = txn_batch._Made(np.array(counts, np.int64), fields, None)
    chains = mock.Mock(items=items, lengths=np.array(lengths, np.int64))
    replaced: dict[int, list[Any]] = {}
    commits: list[int] = []
    at = 0
    for n, events in shapes:
        chain = items[at : at + n]
        at += n
        if events is None:
            continue
        replaced |= {i: [] for i in chain}
        if isinstance(events, int):
            commits += [chain[-1]] * events
        else:
            replaced[chain[-1]] = events
    got, got_commits = txn_batch._placed_items(chains, made)
    assert (got, got_commits.tolist()) == (replaced, commits)
