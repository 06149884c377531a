"""The transactions a batch holds whole, linked in one compiled loop when their entries are all
of the server's shape (buckets/_columnar/txn_chains.py): the same chains, in the same order,
with the same columns, as txn_batch.whole_chains reads them entry by entry; and a batch's events
are the general transform's whichever way its chains were read (a batch with an entry of
another shape reads them all one by one).

The chains' rules are the server's (mongodb-formats.md C.6): a partialTxn or prepare entry's
prevOpTime links it to the one before in its session's transaction (lsid, txnNumber), the first
has a null one; src/mongo/db/pipeline/document_source_change_stream_unwind_transaction.cpp
unwinds a transaction's ops at its commit.
"""

from __future__ import annotations

import uuid
from typing import Any
from unittest import mock

import bson
import numpy as np
from bson import Binary, Int64, ObjectId, Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

import buckets._columnar.txn_batch as txn_batch
from buckets._columnar.txn_batch import _columns_of, whole_chains
from buckets._columnar.txn_chains import Chains, command_items, server_chains
from buckets._columnar.txn_events import HeadTable
from tests.unit.test_txn_batch import _batched, _general, _insert, _server_transactions
from tests.unit.test_txn_block import _without_applied
from tests.unit.test_txn_splice import _NULL_TS, _entry, _ops

_SECONDS = 1_700_000_000


@st.composite
def _server_transaction(draw: st.DrawFn, base: int) -> list[bytes]:
    """One transaction's entries in the server's shape (one applyOps, a partialTxn chain ending
    in one with `count`, or a prepare and its commit), its session one of a few (two
    transactions may share one: the later is then the transformer's), now and then a link
    broken (a prevOpTime that is not the entry before's)."""
    lsid = {"id": Binary(uuid.UUID(int=draw(st.integers(1, 3))).bytes, 4)}
    lsid["uid"] = Binary(bytes(32), 0)
    session = {"lsid": lsid, "txnNumber": Int64(draw(st.integers(0, 2)))}
    ops = draw(st.lists(_ops(), min_size=1, max_size=5))
    shape = draw(st.sampled_from(["one", "chain", "prepared"]))
    first = Timestamp(_SECONDS, base + 1)
    if shape == "one":
        return [_entry(session, {"applyOps": ops}, base + 1, True, _NULL_TS)]
    broken = draw(st.integers(0, 5)) == 0
    if shape == "prepared":
        commit = {"commitTransaction": 1, "commitTimestamp": Timestamp(_SECONDS, base + 2)}
        prepare = _entry(session, {"applyOps": ops, "prepare": True}, base + 1, True, _NULL_TS)
        linked = Timestamp(_SECONDS, base + 9) if broken else first
        return [prepare, _entry(session, commit, base + 3, True, linked)]
    entries, prev = [], _NULL_TS
    for k, op in enumerate(ops, start=base + 1):
        last = k == base + len(ops)
        o = {"applyOps": [op], **({"count": Int64(len(ops))} if last else {"partialTxn": True})}
        entries.append(_entry(session, o, k, True, Timestamp(_SECONDS, 99) if broken else prev))
        prev = Timestamp(_SECONDS, k)
    return entries


@st.composite
def _server_oplogs(draw: st.DrawFn) -> list[bytes]:
    """A few such transactions, their entries interleaved now and then, plain inserts between
    them, read from the start or from inside (a chain that began before the batch)."""
    count = draw(st.integers(1, 5))
    txns = [draw(_server_transaction(20 * k)) for k in range(count)]
    order = [k for k, entries in enumerate(txns) for _ in entries]
    if draw(st.booleans()):
        order = draw(st.permutations(order))
    oplog = []
    for n, k in enumerate(order):
        oplog += [_insert(1000 + 10 * n + j, ObjectId()) for j in range(draw(st.integers(0, 2)))]
        oplog.append(txns[k].pop(0))
    return oplog[draw(st.integers(0, min(2, len(oplog) - 1))) :]


def _columns(chains: Chains) -> list[Any]:
    """The chains' columns, comparable (the heads as each commit's bytes)."""
    return [
        c.rows()
        if isinstance(c, HeadTable)
        else np.asarray(c).tolist()
        if isinstance(c, np.ndarray)
        else c
        for c in chains
    ]


@settings(max_examples=300, deadline=None)
@given(_server_oplogs())
def test_the_compiled_chains_are_whole_chains(oplog: list[bytes]) -> None:
    """Entries all of the server's shape are linked in the compiled loop, into the chains (each
    entry's item, ops, ts; each commit's stamp and head) whole_chains reads one by one."""
    at = command_items(oplog)
    fast = server_chains(oplog, at)
    assert fast is not None
    assert _columns(fast) == _columns(_columns_of(*whole_chains(oplog)))


@settings(max_examples=200, deadline=None)
@given(
    _server_oplogs(),
    st.booleans(),
    st.booleans(),
    st.lists(st.integers(1, 30), max_size=2),
)
def test_batches_of_compiled_chains_equal_the_general_transform(
    oplog: list[bytes], expanded: bool, applied: bool, cuts: list[int]
) -> None:
    """Their events, from batches cut anywhere, are the general transform's."""
    with mock.patch.object(txn_batch, "TXN_OPS_MIN", 0):
        got = _batched(oplog, 0, cuts, expanded, applied, block_min=1)
    want = _general(oplog, 0, expanded)
    assert (got if applied else _without_applied(got)) == (
        want if applied else _without_applied(want)
    )


def test_a_read_ends_at_a_chain_whose_start_is_gone() -> None:
    """A chain whose first link is not in the oplog fails the read at its commit (the tail's
    IncompleteTransactionHistory), as one batch or cut before a later transaction of the same
    session and txnNumber: the events before the failure are the same either way (what the
    transformer would make of the entries after it is never read)."""
    lsid = {"id": Binary(uuid.UUID(int=1).bytes, 4), "uid": Binary(bytes(32), 0)}
    op = {"op": "i", "ns": "app.orders", "ui": Binary(bytes(16), 4), "o": {"_id": "a"}}
    gone = Timestamp(_SECONDS, 99)

    def entry(number: int, inc: int, prev: Timestamp, **o: Any) -> bytes:
        session = {"lsid": lsid, "txnNumber": Int64(number)}
        return _entry(session, {"applyOps": [op], **o}, inc, True, prev)

    oplog = [
        entry(0, 1, _NULL_TS),
        entry(1, 2, gone, partialTxn=True),
        entry(1, 3, gone, count=Int64(2)),
        entry(1, 4, _NULL_TS),
    ]
    want = _without_applied(_general(oplog, 0, False))
    assert want[-1] is KeyError and len(want) == 2
    with mock.patch.object(txn_batch, "TXN_OPS_MIN", 0):
        for cuts in ([], [3], [2], [1, 3]):
            assert _without_applied(_batched(oplog, 0, cuts, False, False, block_min=1)) == want


def test_a_commit_takes_the_chain_its_prevoptime_names_not_its_sessions() -> None:
    """A prepared transaction, then a transaction of one entry with the same session and
    txnNumber, then a commit: the one-entry transaction's events are its own op's (its null
    prevOpTime starts and ends its chain), and the commit takes the prepare's op only if its
    prevOpTime names the prepare; naming an entry not in the oplog, it fails the read. The
    server reads a commit's transaction back by prevOpTime
    (document_source_change_stream_unwind_transaction.cpp, TransactionHistoryIterator)."""
    lsid = {"id": Binary(uuid.UUID(int=1).bytes, 4), "uid": Binary(bytes(32), 0)}
    session = {"lsid": lsid, "txnNumber": Int64(2)}

    def insert(_id: str) -> list[dict[str, Any]]:
        return [{"op": "i", "ns": "app.orders", "ui": Binary(bytes(16), 4), "o": {"_id": _id}}]

    commit = {"commitTransaction": 1, "commitTimestamp": Timestamp(_SECONDS, 22)}
    for named, ids in ((Timestamp(_SECONDS, 21), ["b", "a"]), (Timestamp(_SECONDS, 29), ["b"])):
        oplog = [
            _entry(session, {"applyOps": insert("a"), "prepare": True}, 21, True, _NULL_TS),
            _entry(session, {"applyOps": insert("b")}, 1, True, _NULL_TS),
            _entry(session, commit, 23, True, named),
        ]
        want = _without_applied(_general(oplog, 0, False))
        events = [w for w in want if type(w) is tuple]
        assert [bson.decode(e[5])["documentKey"]["_id"] for e in events] == ids
        assert want[len(ids)] == (0 if len(ids) == 2 else KeyError)
        with mock.patch.object(txn_batch, "TXN_OPS_MIN", 0):
            for cuts in ([], [1], [2], [1, 2]):
                got = _batched(oplog, 0, cuts, False, False, block_min=1)
                assert _without_applied(got) == want


def _backlog(odd: bytes | None) -> list[bytes]:
    """Plain inserts, an application's transactions (txn_batch's test's), and `odd` among
    them."""
    oplog = [_insert(i, ObjectId()) for i in range(1, 200)]
    for k in range(4):
        oplog[30 * k : 30 * k] = _server_transactions(1000 + 10 * k)
    return oplog if odd is None else oplog[:50] + [odd] + oplog[50:]


def _create(inc: int) -> bytes:
    """A create command's entry (DDL: a command entry of no transaction)."""
    o = {"create": "c", "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}}
    stamp = {"ts": Timestamp(_SECONDS, inc), "t": Int64(1), "v": Int64(2)}
    return bson.encode({"op": "c", "ns": "app.$cmd", "ui": Binary(bytes(16), 4), "o": o, **stamp})


def test_a_batch_of_server_transactions_and_ddl_takes_the_compiled_chains() -> None:
    """A command entry of no transaction (DDL) beside them does not keep the batch's
    transactions from the compiled loop; the events are the general transform's."""
    oplog = _backlog(_create(2000))
    with mock.patch.object(txn_batch, "whole_chains", side_effect=AssertionError):
        got = _batched(oplog, 0, [], False, False)
    assert _without_applied(got) == _without_applied(_general(oplog, 0, False))


def test_a_batch_with_a_transaction_of_another_shape_reads_them_one_by_one() -> None:
    """A transaction entry the compiled read does not take (batched writes without a session,
    one without wall) sends the batch's transactions to whole_chains, all of them: the events
    are the general transform's either way."""
    op = {"op": "i", "ns": "app.orders", "ui": Binary(bytes(16), 4), "o": {"_id": 1}}
    session = {"lsid": {"id": Binary(bytes(16), 4)}, "txnNumber": Int64(5)}
    for odd in (
        _entry({}, {"applyOps": [op] * 3}, 2000, True, _NULL_TS),
        _entry(session, {"applyOps": [op] * 3}, 2000, False, _NULL_TS),
    ):
        oplog = _backlog(odd)
        assert server_chains(oplog, command_items(oplog)) is None
        got = _batched(oplog, 0, [], False, False)
        assert _without_applied(got) == _without_applied(_general(oplog, 0, False))
