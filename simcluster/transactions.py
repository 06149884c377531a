"""Multi-document transactions on a shard: buffered oplog ops, commit as applyOps, two-phase commit.

What the oplog shows (shared/reference/mongodb-formats.md C.6):
- an unprepared commit is one `{op: "c", ns: "admin.$cmd", o: {applyOps: [...]}, lsid, txnNumber,
  prevOpTime}` entry (a large one is a chain of `partialTxn: true` entries, each linked to the
  previous by prevOpTime, ending in one with `count`);
- a prepared (cross-shard) transaction writes `applyOps` with `prepare: true`, then, once the
  coordinator picked a commitTimestamp no earlier than any participant's prepare, a separate
  `{commitTransaction: 1, commitTimestamp}` entry on each participant, each at its own later ts.

Simplification, kept deliberately: a transaction's writes are applied to the collections at once
(so the transaction reads its own writes) and undone on abort; other sessions may see them before
commit. No change stream can tell, since events come only from the committed oplog entries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bson import Int64, Timestamp

from mongoformats.errors import MongoError
from mongoformats.sessions import UNKNOWN_USER, SessionsNamed
from simcluster.oplog import Oplog

__all__ = ["Transaction", "TransactionTable", "TxnKey", "no_such_transaction", "txn_key"]

TxnKey = tuple[bytes, int]

# Ops per applyOps entry before a transaction is written as a partialTxn chain. The server splits
# by size (16 MB per entry); a count keeps the simulator's entries small and the chain testable.
MAX_OPS_PER_ENTRY = 500


def txn_key(cmd: dict[str, Any]) -> TxnKey:
    return bytes(cmd["lsid"]["id"]), int(cmd["txnNumber"])


def no_such_transaction(key: TxnKey) -> MongoError:
    return MongoError(
        "NoSuchTransaction",
        f"Transaction with txnNumber {key[1]} has been aborted or was never started",
    ).with_labels("TransientTransactionError")


@dataclass
class Transaction:
    lsid: dict[str, Any]
    txn_number: int
    ops: list[dict[str, Any]] = field(default_factory=list)
    undo: list[Callable[[], None]] = field(default_factory=list)
    images: list[Any] = field(default_factory=list)  # per op: (collection, before, after) or None
    state: str = "open"  # open -> prepared -> committed | aborted
    prepare_ts: Timestamp | None = None
    # When it started (time.monotonic()): it expires transactionLifetimeLimitSeconds later,
    # unless prepared.
    started: float = field(default_factory=time.monotonic)
    # A prepared transaction this member took over at step-up: its ops are in the oplog but not
    # applied here yet (a secondary applies them at commit); commit applies them with this.
    apply_on_commit: Callable[..., None] | None = None

    def record(self, op: dict[str, Any], undo: Callable[[], None], images: Any = None) -> None:
        """Hold a write until commit; `images` (collection, before, after) if it may keep them."""
        if self.state != "open":
            raise MongoError(
                "PreparedTransactionInProgress", "cannot write to a prepared transaction"
            )
        self.ops.append(op)
        self.undo.append(undo)
        self.images.append(images)

    def session_fields(self) -> dict[str, Any]:
        return {"lsid": self.lsid, "txnNumber": Int64(self.txn_number)}


class TransactionTable:
    """The transactions of one shard primary, by (lsid id, txnNumber)."""

    def __init__(self, oplog: Oplog, record_images: Callable[..., None] | None = None) -> None:
        self.oplog = oplog
        self.txns: dict[TxnKey, Transaction] = {}
        # Applier.record_images: a commit keeps its writes' images at (entry ts, index in the
        # entry), the ids the server gives pre-images of transaction writes.
        self.record_images = record_images

    def get_or_start(self, cmd: dict[str, Any], lsid: dict[str, Any]) -> Transaction:
        key = txn_key(cmd)
        txn = self.txns.get(key)
        if txn is None or (cmd.get("startTransaction") and txn.state == "aborted"):
            self._supersede(key)
            txn = self.txns[key] = Transaction(lsid, key[1])
        if txn.state in ("committed", "aborted"):
            raise no_such_transaction(key)
        return txn

    def _supersede(self, key: TxnKey) -> None:
        """A newer txnNumber on the session supersedes (and aborts) older open ones."""
        for old_key, old in list(self.txns.items()):
            if old_key[0] == key[0] and old_key[1] < key[1]:
                if old.state == "open":
                    self._undo(old)
                del self.txns[old_key]

    def open(self, key: TxnKey) -> Transaction | None:
        txn = self.txns.get(key)
        return txn if txn is not None and txn.state in ("open", "prepared") else None

    def commit(self, key: TxnKey) -> None:
        """Commit a transaction this shard alone took part in: its ops as one applyOps (or a
        chain)."""
        txn = self.txns.get(key)
        if txn is None:
            raise no_such_transaction(key)
        if txn.state == "committed":
            return  # a retried commit
        if txn.state != "open":
            raise no_such_transaction(key)
        if txn.ops:
            entry_ts = self._log_chain(txn)
            self._record_images(
                txn, lambda i: (entry_ts[i // MAX_OPS_PER_ENTRY], i % MAX_OPS_PER_ENTRY)
            )
        txn.state = "committed"

    def _log_chain(self, txn: Transaction) -> list[Timestamp]:
        """The transaction's ops as one applyOps entry, or a chain of them linked by prevOpTime;
        the ts of each entry."""
        chunks = [
            txn.ops[i : i + MAX_OPS_PER_ENTRY] for i in range(0, len(txn.ops), MAX_OPS_PER_ENTRY)
        ]
        prev = {"ts": Timestamp(0, 0), "t": Int64(-1)}
        entry_ts = []
        for i, chunk in enumerate(chunks):
            ts, _ = self.oplog.append(
                {
                    "op": "c",
                    "ns": "admin.$cmd",
                    "o": _chain_link(chunk, i, len(chunks), len(txn.ops)),
                    **txn.session_fields(),
                    "prevOpTime": prev,
                }
            )
            entry_ts.append(ts)
            prev = {"ts": ts, "t": Int64(self.oplog.term)}
        return entry_ts

    def prepare(self, key: TxnKey) -> Timestamp:
        """Phase one of a cross-shard commit: log the ops as a prepared applyOps; returns its ts."""
        txn = self.txns.get(key)
        if txn is None or txn.state not in ("open", "prepared"):
            raise no_such_transaction(key)
        if txn.state == "open":
            ts, _ = self.oplog.append(
                {
                    "op": "c",
                    "ns": "admin.$cmd",
                    "o": {"applyOps": txn.ops, "prepare": True},
                    **txn.session_fields(),
                    "prevOpTime": {"ts": Timestamp(0, 0), "t": Int64(-1)},
                }
            )
            txn.state, txn.prepare_ts = "prepared", ts
        assert txn.prepare_ts is not None
        return txn.prepare_ts

    def restore_prepared(
        self,
        key: TxnKey,
        lsid: dict[str, Any],
        prepare_ts: Timestamp,
        ops: list[Any],
        apply: Callable[..., None],
    ) -> None:
        """A transaction prepared under an earlier primary, known from the oplog: still prepared
        here."""
        self.txns[key] = Transaction(
            lsid,
            key[1],
            ops=list(ops),
            state="prepared",
            prepare_ts=prepare_ts,
            apply_on_commit=apply,
        )

    def commit_prepared(self, key: TxnKey, commit_ts: Timestamp) -> None:
        txn = self.txns[key]
        if txn.state == "committed":
            return
        assert txn.prepare_ts is not None
        prepare_ts = txn.prepare_ts
        if txn.apply_on_commit is not None:  # taken over at step-up: applied (and imaged) only now
            for index, op in enumerate(txn.ops):
                txn.apply_on_commit(op, at=(prepare_ts, index))
            txn.apply_on_commit = None
        # All its ops are in the one prepare entry: their images are kept under its ts.
        self._record_images(txn, lambda i: (prepare_ts, i))
        self.oplog.append(
            {
                "op": "c",
                "ns": "admin.$cmd",
                "o": {"commitTransaction": 1, "commitTimestamp": commit_ts},
                **txn.session_fields(),
                "prevOpTime": {"ts": txn.prepare_ts, "t": Int64(self.oplog.term)},
            }
        )
        txn.state = "committed"

    def _record_images(
        self, txn: Transaction, where: Callable[[int], tuple[Timestamp, int]]
    ) -> None:
        """Keep the images of a committed transaction's writes where the server keys them: the
        ts of the applyOps entry holding the write and its index there (`where(op index)`)."""
        if self.record_images is None:
            return
        for i, images in enumerate(txn.images):
            if images is not None:
                ts, index = where(i)
                self.record_images(images[0], ts, images[1], images[2], index)

    def kill_sessions(self, named: SessionsNamed) -> None:
        """killSessions / killAllSessions (see sessions_named): the named sessions' unprepared
        transactions end. They keep no user (UNKNOWN_USER)."""
        self.abort_unprepared(lambda key, txn: named(key[0], UNKNOWN_USER))

    def abort_unprepared(self, which: Callable[[TxnKey, Transaction], bool]) -> int:
        """Abort the open, unprepared transactions `which` picks, as killSessions and the expiry
        of transactionLifetimeLimitSeconds do (a prepared one must wait for its coordinator's
        decision); returns how many. Their next statement fails with NoSuchTransaction."""
        picked = [key for key, txn in self.txns.items() if txn.state == "open" and which(key, txn)]
        for key in picked:
            self.abort(key)
        return len(picked)

    def abort(self, key: TxnKey) -> None:
        txn = self.txns.get(key)
        if txn is None or txn.state == "committed":
            raise no_such_transaction(key)
        if txn.state == "prepared":
            self.oplog.append(
                {
                    "op": "c",
                    "ns": "admin.$cmd",
                    "o": {"abortTransaction": 1},
                    **txn.session_fields(),
                    "prevOpTime": {"ts": txn.prepare_ts, "t": Int64(self.oplog.term)},
                }
            )
        if txn.state in ("open", "prepared"):
            self._undo(
                txn
            )  # a taken-over transaction has nothing to undo: its ops were never applied
        txn.state = "aborted"

    @staticmethod
    def _undo(txn: Transaction) -> None:
        for undo in reversed(txn.undo):
            undo()
        txn.undo.clear()
        txn.ops.clear()
        txn.images.clear()


def _chain_link(chunk: list[Any], i: int, links: int, total_ops: int) -> dict[str, Any]:
    """The `o` of link i of a chain: partialTxn but for the last, which of a chain of several
    gives the count of ops."""
    o: dict[str, Any] = {"applyOps": chunk}
    if i < links - 1:
        o["partialTxn"] = True
    elif links > 1:
        o["count"] = Int64(total_ops)
    return o
