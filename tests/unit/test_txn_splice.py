"""A transaction's plain writes spliced from bytes (txn_splice) give exactly the general
transform's events: same resume tokens (txnOpIndex), same fields in the same order (txnNumber
and lsid before `_id`), same applied_at, for single entries, partialTxn chains, prepared
transactions and batched writes.

The general transform is the one pinned to the server by the fidelity tests
(test_reference_fidelity, test_fidelity_audit); these tests pin the splice to it byte for byte.
The oplog shapes are those of mongodb-formats.md C.6 (simcluster/transactions.py writes them).
"""

from __future__ import annotations

import uuid
from typing import Any

import bson
import pytest
from bson import Binary, Int64, ObjectId, Timestamp
from bson.datetime_ms import DatetimeMS
from hypothesis import given, settings
from hypothesis import strategies as st

import mongoformats.change_events as change_events
import mongoformats.txn_splice as txn_splice
from mongoformats.bson_bytes import array_items, elements, timestamp_of
from mongoformats.change_events import OplogTransformer, prev_op_ts
from mongoformats.resume_token import decode_token
from mongoformats.txn_splice import read_apply_ops, splice_txn_op, txn_stamp
from tests.unit.test_oplog_splice import ids, write_body

_UIS = [Binary(uuid.UUID(int=i + 1).bytes, 4) for i in range(3)]
_NULL_TS = Timestamp(0, 0)
_NULL_OPTIME = {"ts": _NULL_TS, "t": Int64(-1)}
# The usual _id kinds (string, ObjectId, UUID) most of the time, any kind the splice takes or
# leaves to the general encoder now and then.
_keys = st.one_of(
    st.text(max_size=12),
    st.builds(ObjectId),
    st.uuids().map(lambda u: Binary(u.bytes, 4)),
    ids,
)


@st.composite
def _ops(draw: st.DrawFn) -> dict[str, Any]:
    """One op of an applyOps: an insert, a `$v: 2` update, a replace or a delete (mixed
    namespaces, one internal), now and then a command or a noop, which the general transform
    makes (and which still count in txnOpIndex)."""
    kind = draw(st.sampled_from(["i", "i", "u", "u", "r", "d", "create", "n"]))
    ns = draw(st.sampled_from(["app.orders", "app.users", "shop.stock", "config.x"]))
    ui = _UIS[draw(st.integers(0, len(_UIS) - 1))]
    _id = draw(_keys)
    key: dict[str, Any] = {"_id": _id}
    if draw(st.integers(0, 5)) == 0:
        key = {"sk": draw(_keys), "_id": _id}  # a sharded collection's documentKey
    if kind == "create":
        o = {"create": ns.split(".")[1], "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}}
        return {"op": "c", "ns": ns.split(".")[0] + ".$cmd", "ui": ui, "o": o}
    if kind == "n":
        return {"op": "n", "ns": "", "o": {"msg": "noop"}}
    return {"op": "u" if kind == "r" else kind, "ns": ns, "ui": ui, **write_body(draw, kind, key)}


@st.composite
def _session(draw: st.DrawFn) -> dict[str, Any]:
    """A transaction's session fields: lsid (with or without uid) and txnNumber (int64, or an
    int32 as an older driver may send), or none (batched writes), or multiOpType 1 (batched
    writes in a session, which carry no transaction), or an lsid without txnNumber."""
    lsid: dict[str, Any] = {"id": Binary(draw(st.uuids()).bytes, 4)}
    if draw(st.booleans()):
        lsid["uid"] = Binary(bytes(range(32)), 0)
    number = draw(st.one_of(st.integers(0, 2**40).map(Int64), st.integers(0, 2**31 - 1)))
    kind = draw(st.sampled_from(["txn", "txn", "txn", "none", "multi", "no txnNumber"]))
    return {
        "txn": {"lsid": lsid, "txnNumber": number},
        "none": {},
        "multi": {"lsid": lsid, "txnNumber": number, "multiOpType": 1},
        "no txnNumber": {"lsid": lsid},
    }[kind]


def _entry(
    session: dict[str, Any], o: dict[str, Any], inc: int, wall: bool, prev: Timestamp
) -> bytes:
    """An applyOps (or commitTransaction) entry in the server's field order: the session, the
    command, the stamp, prevOpTime (and multiOpType) last."""
    head = {k: v for k, v in session.items() if k != "multiOpType"}
    entry: dict[str, Any] = {**head, "op": "c", "ns": "admin.$cmd", "o": o}
    entry |= {"ts": Timestamp(1_700_000_000, inc), "t": Int64(1), "v": Int64(2)}
    if wall:
        entry["wall"] = DatetimeMS(1_700_000_000_000 + inc)
    if session:
        entry["prevOpTime"] = {"ts": prev, "t": Int64(1)} if prev.inc else _NULL_OPTIME
    if "multiOpType" in session:
        entry["multiOpType"] = session["multiOpType"]
    return bson.encode(entry)


@st.composite
def transactions(draw: st.DrawFn, base: int) -> list[bytes]:
    """The oplog entries of one transaction, at increments past `base`: one applyOps, a
    partialTxn chain ending in one with `count`, or a prepare then its commitTransaction."""
    session = draw(_session())
    ops = draw(st.lists(_ops(), min_size=1, max_size=7))
    shape = draw(st.sampled_from(["one", "one", "chain", "prepared"]))
    wall = draw(st.booleans())
    first = Timestamp(1_700_000_000, base + 1)
    if shape == "one":
        return [_entry(session, {"applyOps": ops}, base + 1, wall, _NULL_TS)]
    if shape == "prepared":
        prepare = _entry(session, {"applyOps": ops, "prepare": True}, base + 1, wall, _NULL_TS)
        commit = {"commitTransaction": 1, "commitTimestamp": Timestamp(1_700_000_000, base + 2)}
        return [prepare, _entry(session, commit, base + 3, wall, first)]
    cuts = sorted(draw(st.lists(st.integers(1, len(ops)), max_size=3)))
    parts = [ops[a:b] for a, b in zip([0, *cuts], [*cuts, len(ops)], strict=True)]
    entries, prev = [], _NULL_TS
    for i, part in enumerate(parts, start=base + 1):
        last = i == base + len(parts)
        o = {"applyOps": part, **({"count": len(ops)} if last else {"partialTxn": True})}
        entries.append(_entry(session, o, i, wall, prev))
        prev = Timestamp(1_700_000_000, i)
    return entries


@st.composite
def oplogs(draw: st.DrawFn) -> list[bytes]:
    """A few transactions one after the other."""
    count = draw(st.integers(1, 3))
    return [entry for k in range(count) for entry in draw(transactions(10 * k))]


def adopt_chain_back_from(
    tr: OplogTransformer, gap: Timestamp | None, by_ts: dict[Timestamp, bytes]
) -> None:
    """Give `tr` the chain a commit misses, from the entry at `gap` back by prevOpTime (as
    buckets/oplog_tail.py reads it back); KeyError if an entry of it is not in `by_ts`."""
    chain = []
    while gap is not None:
        chain.append(by_ts[gap])
        gap = prev_op_ts(by_ts[gap])
    if chain:
        tr.adopt_chain(chain[::-1])


def _outcome(tr: OplogTransformer, oplog: list[bytes], start: int) -> list[Any]:
    """What a read of `oplog` from the entry at `start` gives, entry by entry: the chain its
    commit misses (read back by prevOpTime, as buckets/oplog_tail.py does), then its events, or
    the error the transform raised for it."""
    by_ts = {timestamp_of(entry): entry for entry in oplog}
    out: list[Any] = []
    for entry in oplog[start:]:
        try:
            gap = tr.missing_chain(entry)
            out.append(gap)
            adopt_chain_back_from(tr, gap, by_ts)
            out.append(tr.transform_decoded(entry))
        except (KeyError, TypeError) as e:
            out.append(type(e))
    return out + [tr.pending_transactions()]


@settings(max_examples=300, deadline=None)
@given(oplogs(), st.booleans(), st.integers(0, 3))
def test_spliced_transactions_equal_the_general_transform(
    oplog: list[bytes], expanded: bool, start: int
) -> None:
    """Several transactions one after the other, read from the start or from inside one (a
    commit then reads its chain back), on a stream with and without expanded events."""
    spliced = OplogTransformer(show_expanded_events=expanded)
    general = OplogTransformer(show_expanded_events=expanded, splice_transactions=False)
    start = min(start, len(oplog) - 1)
    assert _outcome(spliced, oplog, start) == _outcome(general, oplog, start)


def test_the_plain_writes_of_a_transaction_are_spliced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inserts, updates and deletes with string, ObjectId and UUID ids in a transaction, in one
    entry, a chain or a prepared transaction, never reach the general transform; their events
    carry the transaction's fields first and the ops' indexes in their tokens."""
    lsid = {"id": Binary(uuid.uuid4().bytes, 4), "uid": Binary(bytes(32), 0)}
    session = {"lsid": lsid, "txnNumber": Int64(4)}
    ops = [
        {"op": "i", "ns": "a.b", "ui": _UIS[0], "o": {"_id": "k", "x": 1}, "o2": {"_id": "k"}},
        {
            "op": "u",
            "ns": "a.c",
            "ui": _UIS[1],
            "o": {"$v": 2, "diff": {"u": {"x": 2}, "sa": {"a": True, "u1": {"y": 1}}}},
            "o2": {"_id": ObjectId()},
        },
        {"op": "d", "ns": "a.b", "ui": _UIS[0], "o": {"_id": Binary(uuid.uuid4().bytes, 4)}},
    ]
    chain = [
        _entry(session, {"applyOps": ops[:1], "partialTxn": True}, 1, True, Timestamp(0, 0)),
        _entry(session, {"applyOps": ops[1:], "count": 3}, 2, True, Timestamp(1_700_000_000, 1)),
    ]
    one = _entry(session, {"applyOps": ops}, 3, True, Timestamp(0, 0))
    prepared = [
        _entry(session, {"applyOps": ops, "prepare": True}, 4, True, _NULL_TS),
        _entry(
            session,
            {"commitTransaction": 1, "commitTimestamp": Timestamp(1_700_000_000, 5)},
            6,
            True,
            Timestamp(1_700_000_000, 4),
        ),
    ]
    # Every entry is read from its bytes, the prepared transaction's commit too.
    assert all(read_apply_ops(entry) for entry in [*chain, one, *prepared])

    def general_transform(*args: Any) -> None:
        raise AssertionError("a plain write of a transaction took the general transform")

    monkeypatch.setattr(change_events, "crud_event", general_transform)
    tr = OplogTransformer()
    for entries in (chain, [one], prepared):
        events = [ev for entry in entries for ev in tr.transform_decoded(entry)]
        assert [ev.op_type for ev in events] == ["insert", "update", "delete"]
        assert [decode_token(ev.token).txn_op_index for ev in events] == [0, 1, 2]
        for ev in events:
            assert list(bson.decode(ev.raw))[:3] == ["txnNumber", "lsid", "_id"]


def test_a_stamp_of_types_the_general_transform_would_rewrite_is_refused() -> None:
    """The splice copies ts, wall, txnNumber and lsid as they are: an entry where one of them
    has another type (which the general transform decodes and writes its own way) is not
    spliced."""
    base = {"lsid": {"id": Binary(bytes(16), 4)}, "txnNumber": Int64(1), "op": "c"}
    stamp = {"ts": Timestamp(1, 1), "wall": DatetimeMS(5)}
    assert txn_stamp(bson.encode({**base, **stamp}), True) is not None
    for odd in ({"txnNumber": 1.0}, {"lsid": "s"}, {"wall": 5}, {"ts": Int64(1)}):
        assert txn_stamp(bson.encode({**base, **stamp, **odd}), True) is None
    assert txn_stamp(bson.encode({"op": "c", **stamp}), True) is None  # no transaction fields
    assert txn_stamp(bson.encode({"op": "c", **stamp}), False) is not None
    op = bson.encode({"op": "i", "ns": "a.b", "o": {"_id": 1}})
    assert splice_txn_op(op, (b"", b""), 2**31, expanded=False) is None  # past int32's type bits


@st.composite
def _shaped_entries(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A transaction's entry of the server's shape (lsid {id, uid}, int64 txnNumber, then ts, t,
    v, wall, prevOpTime {ts, t}), or of an odd one now and then: lsid's fields in another order
    or with another field, prevOpTime's likewise, an int32 txnNumber, no wall, a field more, an
    lsid id of another length or subtype. With whether it is of the server's shape."""
    lsid: dict[str, Any] = {"id": Binary(draw(st.uuids()).bytes, 4), "uid": Binary(bytes(32), 0)}
    prev: dict[str, Any] = {"ts": Timestamp(1_700_000_000, draw(st.integers(0, 9))), "t": Int64(1)}
    entry: dict[str, Any] = {"lsid": lsid, "txnNumber": Int64(draw(st.integers(0, 2**40)))}
    ops = [{"op": "i", "ns": "a.b", "o": {"_id": draw(_keys)}}]
    o = draw(
        st.sampled_from(
            [
                {"applyOps": ops},
                {"applyOps": ops, "prepare": True},
                {"applyOps": ops, "partialTxn": True},
                {"commitTransaction": 1, "commitTimestamp": Timestamp(1_700_000_000, 3)},
                {"applyOps": ops, "count": Int64(3)},
                {"applyOps": ops, "prepare": False},
                {"applyOps": []},
                {"commitTransaction": Int64(1), "commitTimestamp": Timestamp(1_700_000_000, 3)},
                {"commitTimestamp": Timestamp(1_700_000_000, 3), "commitTransaction": 1},
            ]
        )
    )
    entry |= {"op": "c", "ns": draw(st.sampled_from(["admin.$cmd", "a.$cmd", ""])), "o": o}
    entry |= {"ts": Timestamp(1_700_000_000, 9), "t": Int64(1), "v": Int64(2)}
    entry |= {"wall": DatetimeMS(1_700_000_000_000), "prevOpTime": prev}
    odd = draw(
        st.sampled_from(
            [None] * 6
            + ["lsid order", "lsid extra", "prev order", "prev extra", "int32 number"]
            + ["no wall", "field more", "short id", "subtype 3", "no uid", "uid size"]
        )
    )
    if odd == "lsid order":
        entry["lsid"] = {"uid": lsid["uid"], "id": lsid["id"]}
    elif odd == "lsid extra":
        entry["lsid"] = {**lsid, "txnUUID": Binary(bytes(16), 4)}
    elif odd == "prev order":
        entry["prevOpTime"] = {"t": prev["t"], "ts": Timestamp(1_700_000_000, 7)}
    elif odd == "prev extra":
        entry["prevOpTime"] = {**prev, "ts": Timestamp(1_700_000_000, 7)} | {"x": 1}
    elif odd == "int32 number":
        entry["txnNumber"] = 5
    elif odd == "no wall":
        del entry["wall"]
    elif odd == "field more":
        entry["multiOpType"] = 1
    elif odd == "short id":
        lsid["id"] = Binary(bytes(15), 4)
    elif odd == "subtype 3":
        lsid["id"] = Binary(bytes(16), 3)
    elif odd == "no uid":
        del lsid["uid"]
    elif odd == "uid size":
        lsid["uid"] = Binary(bytes(31), 0)
    return bson.encode(entry), odd is None


@settings(max_examples=300, deadline=None)
@given(_shaped_entries())
def test_fixed_offset_reads_equal_the_walk(shaped: tuple[bytes, bool]) -> None:
    """The reads of the server's shapes at fixed offsets (the entry's top level, its `o`, lsid,
    prevOpTime) give what walking the elements gives, and are taken for the server's shape
    only (any other falls back to the walk)."""
    entry, server_shaped = shaped
    top = txn_splice.server_elements(entry)
    assert top is None or top == elements(entry)
    fast = read_apply_ops(entry)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(txn_splice, "_server_shape", lambda entry: None)
        m.setattr(txn_splice, "_LSID_HEAD", b"-")
        m.setattr(txn_splice, "_PREV_HEAD", b"-")
        assert read_apply_ops(entry) == fast
    assert (top is not None) == server_shaped


@pytest.mark.parametrize("index", [1, 127, 128, 300, 70_000, 2**31 - 1])
def test_an_op_of_a_large_index_has_its_token_rewritten_whole(index: int) -> None:
    """An op's txnOpIndex of one or several KeyString bytes (the transactions the hypothesis
    tests draw are short) is in the event's sort key and in its `_id`'s hex alike, the `_id`'s
    lengths and the event's fitting the longer token."""
    lsid = {"id": Binary(bytes(16), 4), "uid": Binary(bytes(32), 0)}
    entry = bson.encode(
        {"lsid": lsid, "txnNumber": Int64(2), "op": "c", "ns": "admin.$cmd", "o": {}}
        | {"ts": Timestamp(1_700_000_000, 1), "t": Int64(1), "v": Int64(2)}
        | {"wall": DatetimeMS(1_700_000_000_000)}
    )
    stamp = txn_stamp(entry, True)
    assert stamp is not None
    op = bson.encode({"op": "i", "ns": "a.b", "ui": _UIS[0], "o": {"_id": "k", "x": 1}})
    made = splice_txn_op(op, stamp, index, expanded=False)
    assert made
    event = bson.decode(made[5])
    assert list(event)[:3] == ["txnNumber", "lsid", "_id"]
    assert event["_id"]["_data"] == made[0].hex().upper()
    assert decode_token(event["_id"]).txn_op_index == index


def test_an_array_whose_documents_do_not_lie_in_it_is_refused() -> None:
    """The ops of applyOps are read where they lie (bson_bytes.array_items), and as the compiled
    read (buckets/_columnar/txn_read.py) reads them: a document's length that runs past the
    array (here an element name cut short by a zero byte) is an error, never a slice of other
    bytes."""
    array = bson.encode({"0": {"a": 1}, "1": {"b": 2}})
    assert array_items(array) == [bson.encode({"a": 1}), bson.encode({"b": 2})]
    cut = array[:5] + b"\x00" + array[6:]  # the first element's name "0" made empty
    with pytest.raises(ValueError):
        array_items(cut)
