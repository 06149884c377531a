"""The transactions a batch holds whole kept as columns: splice_entries gives one EventBlock for
a batch of plain writes and such transactions (each transaction's events at its commit's place,
in token order), and the events of any batch, blocks' and items', are the general transform's
(OplogTransformer's), byte for byte, in order. A block keeps no applied-at time: with
`applied` (a stream that reads pre-images) a transaction whose events have one (a prepared or
multi-entry transaction's) stays fields, equal to the transformer's applied-at times too.

Also: an entry whose op is a command's or a noop's is never walked by splice_crud (which
refuses it), and `not_crud` never says so of an entry splice_crud takes.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import bson
import pytest
from bson import Int64, ObjectId, Timestamp
from bson.datetime_ms import DatetimeMS
from hypothesis import given, settings
from hypothesis import strategies as st

import buckets._columnar.batch_splice as batch_splice
import buckets._columnar.txn_batch as txn_batch
from buckets._columnar.batch_splice import BATCH_MIN, splice_entries
from buckets._columnar.event_block import EventBlock
from buckets._columnar.items import as_fields
from buckets._columnar.oplog_batch import OplogBatch
from mongoformats.oplog_splice import not_crud, splice_crud
from tests.unit.test_oplog_splice import crud_entries
from tests.unit.test_txn_batch import (
    _ODD_OPS,
    _batched,
    _general,
    _insert,
    _oplogs,
    _read,
    _server_transactions,
    _with_op,
)
from tests.unit.test_txn_splice import _UIS


def _listed(items: Any) -> list[Any]:
    return [items] if type(items) is EventBlock else items


def _without_applied(events: list[Any]) -> list[Any]:
    """Events less their applied-at times (a block keeps none)."""
    return [ev[:-1] if type(ev) is tuple and len(ev) == 9 else ev for ev in events]


def _padded(oplog: list[bytes], draw: Any) -> list[bytes]:
    """Plain inserts put between the entries now and then (the block's own events)."""
    out = []
    for k, entry in enumerate(oplog):
        out += [_insert(10_000 + 10 * k + j, ObjectId()) for j in range(draw(st.integers(0, 2)))]
        out.append(entry)
    return out


@settings(max_examples=300, deadline=None)
@given(
    _oplogs(),
    st.data(),
    st.booleans(),
    st.booleans(),
    st.integers(0, 3),
    st.lists(st.integers(1, 30), max_size=3),
)
def test_transactions_in_the_block_equal_the_general_transform(
    oplog: list[bytes], data: Any, expanded: bool, applied: bool, start: int, cuts: list[int]
) -> None:
    """Random transactions (one entry, partialTxn chains, prepared; now and then one with an op
    the splice leaves, which falls back) interleaved with plain inserts, in batches cut anywhere,
    read from the start or from inside one, expanded events on and off, applied-at times kept
    or not: the events are the general transform's, in order (with their applied-at times when
    kept: a block's events have none, so none that should have one is in a block)."""
    oplog = _padded(oplog, data.draw)
    start = min(start, len(oplog) - 1)
    with mock.patch.object(txn_batch, "TXN_OPS_MIN", 0):
        got = _batched(oplog, start, cuts, expanded, applied, block_min=1)
    want = _general(oplog, start, expanded)
    if applied:
        assert got == want
    else:
        assert _without_applied(got) == _without_applied(want)


def _backlog(count: int, gap: int = 20) -> list[bytes]:
    """A backlog's batch: plain inserts with the transactions an application writes (prepared,
    and of one entry) after every `gap` of them, in the order of their times."""
    oplog = []
    for k in range(count):
        oplog += [_insert(100 * k + j, ObjectId()) for j in range(1, gap + 1)]
        oplog += _server_transactions(100 * k + 50)
    rest = max(BATCH_MIN - gap * count, 1)
    return oplog + [_insert(100 * count + j, ObjectId()) for j in range(1, rest + 1)]


@pytest.mark.parametrize("expanded", [False, True])
def test_a_batch_of_plain_writes_and_transactions_is_one_block(expanded: bool) -> None:
    """Without applied-at times, a batch of plain writes and whole transactions is one block,
    its events those of the general transform (in order, each transaction's at its commit).
    With expanded events, the block splice leaves an update of an array's diff (its
    description is splice_crud's): its transaction's events are fields, the rest blocks."""
    oplog = _backlog(4)
    items = splice_entries(OplogBatch.of(oplog), True, expanded, False)
    if not expanded:
        assert type(items) is EventBlock
        assert len(items) == len(oplog) - 4 * 3 + 4 * 7
        keys = items.key_list()
        assert keys == sorted(keys)
    else:
        assert isinstance(items, list)
        assert not [item for item in items if type(item) is bytes]
    got = _read([_listed(items)], oplog, expanded)
    assert _without_applied(got) == _without_applied(_general(oplog, 0, expanded))


def test_with_applied_times_a_prepared_transaction_stays_fields() -> None:
    """With applied-at times kept, a prepared transaction's events are fields (with the times
    the transformer gives them), a transaction of one entry's may be in a block."""
    oplog = _backlog(4)
    items = splice_entries(OplogBatch.of(oplog), True, False, True)
    assert isinstance(items, list)
    singles = [item for item in items if type(item) is tuple and item and item[-1] is not None]
    assert len(singles) == 4 * 4
    assert all(next(iter(bson.decode(ev[5]))) == "txnNumber" for ev in singles)
    # (the block's runs between the prepared transactions are short: made fields, too)
    blocks = [item for item in items if type(item) is EventBlock]
    held = [ev for ev in as_fields(blocks) if next(iter(bson.decode(ev[5]))) == "txnNumber"]
    assert held
    assert _read([items], oplog, False) == _general(oplog, 0, False)


def test_a_chain_that_falls_back_leaves_the_rest_in_the_block() -> None:
    """A transaction with an op the splice leaves goes to the transformer whole (its entries'
    bytes); the other transactions' events and the plain writes stay in blocks around it."""
    oplog = _backlog(4, gap=40)
    prepare = 2 * 40 + 3  # the second prepared transaction's
    oplog[prepare] = _with_op(oplog[prepare], bson.encode(_ODD_OPS[0]))
    items = splice_entries(OplogBatch.of(oplog), True, False, False)
    assert isinstance(items, list)
    assert [item for item in items if type(item) is bytes] == oplog[prepare : prepare + 2]
    assert all(type(item) in (EventBlock, bytes) for item in items)
    got = _read([items], oplog, False)
    assert _without_applied(got) == _without_applied(_general(oplog, 0, False))


@settings(max_examples=300, deadline=None)
@given(st.one_of(crud_entries().map(bson.encode), _oplogs().map(lambda o: o[0])))
def test_not_crud_only_of_entries_splice_crud_refuses(entry: bytes) -> None:
    """`not_crud` says so only of entries splice_crud refuses."""
    if not_crud(entry):
        assert splice_crud(entry, expanded=False) is None


def test_not_crud_of_the_servers_command_and_noop_entries() -> None:
    """`not_crud` says so of the server's transaction entries (applyOps, commitTransaction), a
    DDL command's and a noop's."""
    stamp = {"ts": Timestamp(1, 1), "t": Int64(1), "v": Int64(2), "wall": DatetimeMS(0)}
    others = [
        {"op": "n", "ns": "", "o": {"msg": "periodic noop"}, **stamp},
        {"op": "c", "ns": "app.$cmd", "ui": _UIS[0], "o": {"create": "orders"}, **stamp},
    ]
    for entry in _server_transactions(10) + [bson.encode(doc) for doc in others]:
        assert not_crud(entry)


def test_command_entries_are_not_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch's transaction entries, DDL and noops go to their paths without splice_crud."""

    def walked(entry: bytes, *, expanded: bool) -> Any:
        assert not not_crud(entry)
        return splice_crud(entry, expanded=expanded)

    monkeypatch.setattr(batch_splice, "splice_crud", walked)
    oplog = _backlog(2)
    items = splice_entries(OplogBatch.of(oplog), True, False, True)
    assert _read([_listed(items)], oplog, False) == _general(oplog, 0, False)
