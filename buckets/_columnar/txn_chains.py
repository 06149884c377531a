"""The transactions a batch's items hold whole (txn_batch.py), as columns: which entries make
up each, where its ops lie, its commit's stamp and head.

Why: read entry by entry in Python (a record per entry, a dict of the open chains by key), the
transactions' entries cost about as much as splicing their ops. When every transaction entry
of the items is of the server's shape (txn_read.py reads them all), the chains are linked in
one compiled loop over their rows (`_link`: what txn_batch.whole_chains does with its dicts)
and their columns gathered with numpy; otherwise txn_batch reads them one by one.
"""

from __future__ import annotations

from buckets._columnar.numba_cache import CACHE  # picks numba's cache dir before numba loads

# isort: split
from typing import Any, NamedTuple

import numba
import numpy as np
import numpy.typing as npt

from buckets._columnar.byte_kernels import U
from buckets._columnar.oplog_batch import OplogBatch, starts_of
from buckets._columnar.txn_events import HeadTable
from buckets._columnar.txn_read import (
    R_BUFFERED,
    R_NUMBER,
    R_OK,
    R_OPS,
    R_PREV,
    R_TAIL,
    R_TS,
    read_rows,
)
from mongoformats.txn_splice import read_apply_ops

__all__ = ["STAMP_TAIL", "Chains", "command_items", "server_chains"]

_Ints = npt.NDArray[np.int64]
_Words = npt.NDArray[np.uint64]
_Bytes = npt.NDArray[np.uint8]

# A server entry's stamp's tail: ts, t, v and wall (txn_splice.server_stamp).
STAMP_TAIL = 48
# Where a server entry's lsid id lies (txn_batch._server_read's key), and its head's two parts
# (txn_splice.server_stamp: txnNumber's element, then lsid's).
_LSID_ID, _ID_BYTES = 23, 16
_NUMBER, _NUMBER_END, _LSID, _LSID_END = 82, 101, 4, 82

_COMMAND_OP = b"\x02op\x00\x02\x00\x00\x00c\x00"  # the element op: "c"
_OP_AT = 101  # where it lies in a server's transaction entry (txn_read.py)
# Where a head's bytes lie in a server's entry, in the head's order.
_HEAD_BYTES = np.r_[np.arange(_NUMBER, _NUMBER_END), np.arange(_LSID, _LSID_END)]


class Chains(NamedTuple):
    """Transactions held whole, in the order of their commits: their entries' items (`items`,
    chain by chain, each chain's in order, `lengths` of them each); of each entry, its ops (rows
    `firsts[j]` to `firsts[j] + counts[j]` of `spans`, where each op starts and ends in `data`)
    and its ts (as a BSON timestamp's 8 bytes read as one little-endian word); of each chain,
    its commit's stamp's tail (at `tails[c]` in `data`, `tail_sizes[c]` bytes) and head
    (txnNumber and lsid, `heads[c]`)."""

    data: bytes | bytearray
    spans: _Ints
    items: list[int]
    lengths: _Ints
    firsts: _Ints
    counts: _Ints
    ts: _Words
    tails: _Ints
    tail_sizes: _Ints
    heads: HeadTable


def command_items(items: list[Any]) -> list[int]:
    """Which items are entries that may be a transaction's: those holding op "c" (looked for
    first where a server's transaction entry has it: a search of a whole entry costs a few
    times more)."""
    return [
        i
        for i, item in enumerate(items)
        if type(item) is bytes and (item.startswith(_COMMAND_OP, _OP_AT) or _COMMAND_OP in item)
    ]


def server_chains(items: list[Any], at: list[int]) -> Chains | None:
    """The transactions the items hold whole (their command entries `at`), if every entry
    read_apply_ops reads is of the server's shape; None if not (txn_batch reads them then)."""
    entries = [items[i] for i in at]
    batch = OplogBatch.of(entries)
    rows, spans = read_rows(batch.data, batch.starts, batch.lengths)
    ok = rows[:, R_OK] != 0
    if not ok.all():
        # Entries the loop does not read: none may be a transaction's (DDL, for one).
        if any(read_apply_ops(entries[j]) is not None for j in np.flatnonzero(~ok).tolist()):
            return None
        rows = rows[ok]
    starts = batch.starts[ok]
    words = rows.view(np.uint64)
    members, lengths = _link(
        _keys(batch.data, starts, rows[:, R_NUMBER]),
        words[:, R_TS],
        words[:, R_PREV],
        rows[:, R_BUFFERED],
    )
    commits = members[starts_of(lengths) + lengths - 1]
    data = batch.data
    # The commits' heads gathered at once, a table of rows of one size (where slicing each
    # head's two parts out of the data costs some half a microsecond a commit).
    size = len(_HEAD_BYTES)
    gathered = np.frombuffer(data, np.uint8)[starts[commits][:, None] + _HEAD_BYTES].ravel()
    head_at = np.arange(0, size * (len(commits) + 1), size)
    heads = HeadTable(gathered, head_at[:-1], head_at[1:])
    firsts = rows[members, R_OPS]
    return Chains(
        data,
        spans,
        np.asarray(at)[np.flatnonzero(ok)[members]].tolist(),
        lengths,
        firsts,
        rows[members, R_OPS + 1] - firsts,
        words[members, R_TS],
        starts[commits] + rows[commits, R_TAIL],
        np.full(len(commits), STAMP_TAIL, np.int64),
        heads,
    )


@numba.njit(cache=CACHE, nogil=True)
def _link(key: _Ints, ts: _Words, prevs: _Words, buffered: _Ints) -> tuple[_Ints, _Ints]:
    """The entries (rows of txn_read) of each transaction held whole, in the order of their
    commits (each's in order, back to back), and how many each has: as
    txn_batch.whole_chains links them. An entry continues its key's (lsid id, txnNumber) open
    chain if its prevOpTime is that chain's last ts, or starts one if its prevOpTime is null;
    else its key's entries are all left (to the transformer). A buffered entry (partialTxn,
    prepare) leaves its chain open, another commits it. `key`: each entry's key, as a
    number below the count of entries."""
    n = len(key)
    last = np.full(n, -1, np.int64)  # of each key: its open chain's last entry
    link = np.full(n, -1, np.int64)  # of each entry: the one before it in its chain
    general = np.zeros(n, np.bool_)  # of each key: its entries are left
    commits = np.empty(n, np.int64)
    whole = 0
    for i in range(U(n)):
        k = key[i]
        before = last[k]
        last[k] = -1
        prev = prevs[i]
        if (prev != ts[before]) if before >= 0 else (prev != 0):
            general[k] = True
        elif general[k]:
            pass
        elif buffered[i]:
            last[k], link[i] = i, before
        else:
            link[i] = before
            commits[whole] = i
            whole += 1
    lengths = np.zeros(whole, np.int64)
    for c in range(U(whole)):
        j = commits[c]
        while j >= 0:
            lengths[c] += 1
            j = link[j]
    members = np.empty(lengths.sum(), np.int64)
    end = 0
    for c in range(U(whole)):
        end += lengths[c]
        j, at = commits[c], end
        while j >= 0:
            at -= 1
            members[at] = j
            j = link[j]
    return members, lengths


def _keys(data: bytes | bytearray, starts: _Ints, numbers: _Ints) -> _Ints:
    """Each entry's key (lsid id, txnNumber) as a number, the same for the same key."""
    at = starts[:, None] + np.arange(_LSID_ID, _LSID_ID + _ID_BYTES)
    rows = np.concatenate(
        [np.frombuffer(data, np.uint8)[at], numbers.astype("<i8").view(np.uint8).reshape(-1, 8)],
        axis=1,
    )
    _, key = np.unique(rows.view(f"V{_ID_BYTES + 8}").ravel(), return_inverse=True)
    return key.astype(np.int64).ravel()
