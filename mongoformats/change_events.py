"""Oplog entries -> the change events a MongoDB 7.0/8.0 server emits for them: the
transformer's dispatch and its transactions. The events themselves are written by crud_events
(writes) and ddl_events (commands, views, noops) with event_writer.

Strategy: the entry arrives as raw BSON. Plain writes are spliced as bytes (oplog_splice; a
transaction's, txn_splice); for the rest, only the top level is inflated (pymongo's C codec keeps
nested documents as `RawBSONDocument` slices), and the event is written back with the C encoder,
which copies those slices; only the few values a resume token needs (documentKey,
operationDescription) are decoded. Transactions are stateful (partialTxn chains, prepared
transactions committed by a later entry), so `OplogTransformer` keeps per-transaction buffers,
bounded by what one transaction can hold.

Sources (facts only): mongodb/mongo src/mongo/db/pipeline/change_stream_event_transform.cpp and
docs/change_stream_events.md, as summarized in shared/reference/mongodb-formats.md C.1-C.11
(field order C.11; tokens A.5).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bson import Timestamp
from bson.raw_bson import RawBSONDocument

from mongoformats.codecs import RAW
from mongoformats.crud_events import crud_event
from mongoformats.ddl_events import PCS_NOTE_KEY, command_event, ddl_note, noop_events
from mongoformats.event_writer import (
    INTERNAL_DBS,
    EventAt,
    EventWriter,
    Txn,
    is_internal_namespace,
)
from mongoformats.events import (
    EV_APPLIED_AT,
    EV_COLL,
    EV_DB,
    EV_NAMESPACES,
    EV_OP_TYPE,
    EV_RAW,
    EV_SHARD,
    EV_SORT_KEY,
    EV_TYPE_BITS,
    EVENT_BYTES,
    EVENT_SORT_KEY,
    ChangeEvent,
    EventFields,
    event_from_fields,
    event_token,
    events_from_fields,
    invalidate_event,
)
from mongoformats.oplog_splice import splice_crud
from mongoformats.txn_splice import (
    ApplyOps,
    TxnStamp,
    read_apply_ops,
    splice_txn_op,
    txn_stamp,
)

__all__ = [
    "EVENT_BYTES",
    "EVENT_SORT_KEY",
    "EV_APPLIED_AT",
    "EV_COLL",
    "EV_DB",
    "EV_NAMESPACES",
    "EV_OP_TYPE",
    "EV_RAW",
    "EV_SHARD",
    "EV_SORT_KEY",
    "EV_TYPE_BITS",
    "PCS_NOTE_KEY",
    "RAW",
    "ChangeEvent",
    "EventFields",
    "OplogTransformer",
    "ddl_note",
    "event_token",
    "events_from_fields",
    "invalidate_event",
    "is_internal_namespace",
    "prev_op_ts",
]

_COMMAND_OP = b"\x02op\x00\x02\x00\x00\x00c\x00"  # the element op: "c"
# With showSystemEvents, these commands are shown also when a migration wrote them
# (change_stream_filter_helpers.cpp buildNotFromMigrateFilter -> buildFromMigrateSystemOpFilter).
_SYSTEM_FROM_MIGRATE = frozenset({"create", "createIndexes"})

# An op of a transaction with where it was written: (op, its entry's ts, its index there). The
# op is decoded, or its bytes when the entry was read as bytes (txn_splice.read_apply_ops).
PendingOp = tuple[Mapping[str, Any] | bytes, Timestamp, int]


class OplogTransformer:
    """Turns one shard's oplog entries, in oplog order, into change events.

    Args:
        show_expanded_events: emit create/createIndexes/dropIndexes/modify/shardCollection and the
            expanded fields (collectionUUID, operationDescription, disambiguatedPaths).
        show_migration_events: keep `fromMigrate` writes (hidden by default, like the server).
        show_system_events: with show_expanded_events, emit `migrateLastChunkFromShard` when a
            migration leaves a shard without chunks of a collection (the server shows it only then).
        token_version: 2 for 6.1+ servers (7.0, 8.0); 1 to emulate 4.2-6.0.
        ddl_notes: take the expanded DDL events (create, createIndexes, dropIndexes, modify,
            shardCollection, and views) from our proxy's appendOplogNote records instead of the
            native oplog entries: for servers before 6.0, whose change streams have no expanded
            events. Exactly one of the two sources is used, so they never double up.
        view_events: show writes to system.views as view events. A single-collection stream never
            does (ChangeStreamEventTransformer::getBuilder takes the view transform only when
            `!_isSingleCollStream`, and its namespace regex never matches system.views).
        keep_version: (clusterTime, version) of the token a stream resumed from, when that token
            is of an older version: events up to that time keep its version, as
            ChangeStreamEventTransformation::makeResumeToken does (`(clusterTime >
            _resumeToken.clusterTime) ? changeStreamTokenVersion : _resumeToken.version`), so
            that the resumed event is found again.
        splice_transactions: make the events of transactions' plain writes from their bytes
            (txn_splice); off, the general transform makes them all (tests compare the two).
    """

    def __init__(
        self,
        *,
        show_expanded_events: bool = False,
        show_migration_events: bool = False,
        show_system_events: bool = False,
        token_version: int = 2,
        ddl_notes: bool = False,
        view_events: bool = True,
        keep_version: tuple[Timestamp, int] | None = None,
        splice_transactions: bool = True,
    ) -> None:
        self._splice_txns = splice_transactions
        # The last entry read as bytes and what it gave (read_apply_ops), held so that
        # `missing_chain` and then `transform_decoded` of one entry read it once.
        self._last_read: tuple[bytes, ApplyOps | None] = (b"", None)
        self._writer = EventWriter(
            show_expanded_events=show_expanded_events,
            show_migration_events=show_migration_events,
            show_system_events=show_system_events,
            token_version=token_version,
            ddl_notes=ddl_notes,
            view_events=view_events,
            keep_version=keep_version,
        )
        # The chains of partialTxn / prepare entries read, each under the ts of its last entry:
        # the entry after it in the transaction names that ts as its prevOpTime.
        self._chains: dict[Timestamp, _Chain] = {}

    @property
    def show_expanded_events(self) -> bool:
        return self._writer.show_expanded_events

    @property
    def token_version(self) -> int:
        return self._writer.token_version

    @property
    def keep_version(self) -> tuple[Timestamp, int] | None:
        return self._writer.keep_version

    def pending_transactions(self) -> int:
        return len(self._chains)

    def missing_chain(self, entry: bytes) -> Timestamp | None:
        """For a transaction's commit entry whose earlier entries (a partialTxn chain, a prepare)
        were before the read began: the ts of the last of them, where the reader walks the chain
        back by prevOpTime, as the server's change stream does when it meets a commit. Else None.

        A stream that starts or resumes inside a transaction's chain needs them: the events all
        carry the commit's time, and their txnOpIndex counts every operation of the chain. The
        reader gives the entries to `adopt_chain`, then transforms the commit as usual."""
        if _COMMAND_OP not in entry:  # a byte search: most entries are not commands
            return None
        if (read := self._read_apply_ops(entry)) is not None:
            if read.buffered or read.key is None:
                return None
            prev = read.prev
        else:
            doc = RawBSONDocument(entry, RAW)
            if not _commits(doc):
                return None
            prev = prev_op_ts(doc)
        # Each link back is a chain read (its gap the next), at most all of them: a cycle of
        # links, which only a forged oplog holds, ends the walk.
        for _ in range(len(self._chains) + 1):
            if prev is None or (chain := self._chains.get(prev)) is None:
                return prev
            prev = chain.gap
        return prev

    def adopt_chain(self, entries: list[bytes]) -> None:
        """The entries `missing_chain` asked for, oldest first: the chain that the entries read
        after them link back to."""
        ops: list[PendingOp] = []
        for entry in entries:
            doc = RawBSONDocument(entry, RAW)
            ops += [(op, doc["ts"], i) for i, op in enumerate(doc["o"]["applyOps"])]
        if entries:
            self._chains[doc["ts"]] = _Chain(ops, None)

    # -- public entry point ----------------------------------------------------------------------

    def transform(self, entry: bytes | RawBSONDocument) -> list[ChangeEvent]:
        """Events for one oplog entry (most entries give 0 or 1; a committed transaction gives
        many)."""
        if self.token_version == 2 and self.keep_version is None:
            raw = entry if isinstance(entry, bytes) else bytes(entry.raw)
            fast = splice_crud(raw, expanded=self.show_expanded_events)
            if fast is not None:
                return [event_from_fields(fast)] if fast else []
        return self.transform_decoded(entry)

    def transform_decoded(self, entry: bytes | RawBSONDocument) -> list[ChangeEvent]:
        """`transform` without the byte-splicing fast path of plain writes: handles every entry
        (tests compare the two).

        A transaction's applyOps entry (a commit, a partialTxn link of a chain, a prepare, or
        batched writes) and a prepared transaction's commitTransaction are read from their bytes
        when their fields have the server's types (read_apply_ops); the plain writes they commit
        are spliced (see `_unwind`). The decoded reading keeps the other commands (DDL,
        abortTransaction), entries of other field types, and every entry when the tokens are
        not v2 (`_splices`)."""
        if type(entry) is bytes and (read := self._read_apply_ops(entry)) is not None:
            return self._read_ops(entry, read)
        doc = entry if isinstance(entry, RawBSONDocument) else RawBSONDocument(entry, RAW)
        self._writer.reached(doc["ts"])
        op = doc["op"]
        if op == "n":
            return noop_events(self._writer, doc)
        if op == "c":
            return self._command(doc)
        if doc.get("fromMigrate") and not self._writer.show_migration_events:
            return []
        return _listed(crud_event(self._writer, doc, EventAt(doc["ts"], doc.get("wall"))))

    # -- commands (DDL, transactions) ------------------------------------------------------------

    def _command(self, doc: RawBSONDocument) -> list[ChangeEvent]:
        o = doc["o"]
        first = next(iter(o.keys()))
        if first == "applyOps":
            return self._apply_ops(doc, o)
        if first == "commitTransaction":
            return self._commit_prepared(doc)
        if first == "abortTransaction":
            self._chain_before(prev_op_ts(doc))
            return []
        db = doc["ns"].split(".", 1)[0]
        if self._hidden_migration(doc, first) or db in INTERNAL_DBS:
            return []
        at = EventAt(doc["ts"], doc.get("wall"))
        return _listed(command_event(self._writer, doc, first, o, db, at))

    def _hidden_migration(self, doc: RawBSONDocument, first: str) -> bool:
        """A command a migration wrote, which the stream does not show."""
        writer = self._writer
        return bool(doc.get("fromMigrate")) and not (
            writer.show_migration_events
            or (writer.show_system_events and first in _SYSTEM_FROM_MIGRATE)
        )

    # -- transactions ------------------------------------------------------------------------------

    def _apply_ops(self, doc: RawBSONDocument, o: RawBSONDocument) -> list[ChangeEvent]:
        ops: list[PendingOp] = [(op, doc["ts"], i) for i, op in enumerate(o["applyOps"])]
        if o.get("partialTxn") or o.get("prepare"):
            self._buffer(prev_op_ts(doc), doc["ts"], ops)
            return []
        # Batched writes (no lsid, or multiOpType 1) carry no transaction.
        in_txn = "lsid" in doc and doc.get("multiOpType") != 1
        if in_txn:
            ops = self._chain_before(prev_op_ts(doc)) + ops
        return self._unwind(ops, doc["ts"], doc, self._txn_stamp(doc, in_txn), in_txn)

    def _read_ops(self, entry: bytes, read: ApplyOps) -> list[ChangeEvent]:
        """`_apply_ops` (or `_commit_prepared`) of an entry read from its bytes."""
        ops: list[PendingOp] = [(op, read.ts, i) for i, op in enumerate(read.ops)]
        if read.buffered:
            self._buffer(read.prev, read.ts, ops)
            return []
        if read.key is not None:
            ops = self._chain_before(read.prev) + ops
        # The entry is decoded only if an op needs the general transform (`_op_event`).
        return self._unwind(ops, read.ts, entry, read.stamp, read.key is not None)

    def _read_apply_ops(self, entry: bytes) -> ApplyOps | None:
        """read_apply_ops of the entry, when its events may be spliced (`_splices`), else None:
        the general transform reads it."""
        if not self._splices():
            return None
        if entry is not self._last_read[0]:
            self._last_read = (entry, read_apply_ops(entry) if _COMMAND_OP in entry else None)
        return self._last_read[1]

    def _buffer(self, prev: Timestamp | None, ts: Timestamp, ops: list[PendingOp]) -> None:
        """Keep the ops of a partialTxn or prepare entry at `ts` for the transaction's commit: the
        chain it links to (prevOpTime `prev`) goes on, or one starts (after entries before the
        read, if `prev` is not null)."""
        chain = self._chains.pop(prev, None) if prev is not None else None
        if chain is None:
            chain = _Chain([], prev)
        chain.ops.extend(ops)
        self._chains[ts] = chain

    def _chain_before(self, prev: Timestamp | None) -> list[PendingOp]:
        """The ops of the chain a commit links to (its prevOpTime `prev`), read back link by link
        as the server reads a transaction's history from its commit
        (document_source_change_stream_unwind_transaction.cpp, TransactionHistoryIterator); no
        ops for a commit of one entry (a null `prev`). A chain not read stays for the entry
        that links to it: the same session and txnNumber do not make entries one transaction."""
        ops: list[PendingOp] = []
        while prev is not None and (chain := self._chains.pop(prev, None)) is not None:
            ops = chain.ops + ops
            prev = chain.gap
        return ops

    def _commit_prepared(self, doc: RawBSONDocument) -> list[ChangeEvent]:
        ops = self._chain_before(prev_op_ts(doc))
        return self._unwind(ops, doc["ts"], doc, self._txn_stamp(doc, True), True)

    def _unwind(
        self,
        ops: list[PendingOp],
        ts: Timestamp,
        doc: RawBSONDocument | bytes,
        stamp: TxnStamp | None,
        in_txn: bool,
    ) -> list[ChangeEvent]:
        """The events of a transaction's ops, at the time `ts` of `doc`, the entry that commits
        it (of a transaction if `in_txn`; its bytes if not decoded yet). txnOpIndex counts every
        operation of the transaction, including ones that make no event.

        With a stamp, plain inserts, updates and deletes are spliced from the op's bytes
        (txn_splice). The general transform makes the rest: commands (create and createIndexes
        in a transaction, with their operationDescription), view definitions, a migration's
        writes, noops, and what splice_crud leaves (an older $v, malformed ops); and all of them
        without a stamp (tokens of another version; an entry whose ts, wall, lsid or txnNumber
        have types the server does not write)."""
        expanded = self._writer.show_expanded_events
        out = []
        for index, (op, entry_ts, entry_index) in enumerate(ops):
            # Where the op was written, if not at (ts, index): a chain's or a prepare's. (`is`
            # first: the ops read from the entry's bytes share its ts.)
            here = entry_index == index and (entry_ts is ts or entry_ts == ts)
            at = None if here else (entry_ts, entry_index)
            made = None
            if stamp is not None and (raw := _op_bytes(op)) is not None:
                made = splice_txn_op(raw, stamp, index, expanded=expanded)
            if made:  # its fields, applied_at last
                out.append(event_from_fields(made if at is None else (*made[:-1], at)))
            elif made is None and (ev := self._op_event(op, doc, index, in_txn)) is not None:
                out.append(ev if at is None else ev._replace(applied_at=at))
        return out

    def _op_event(
        self,
        op: Mapping[str, Any] | bytes,
        doc: RawBSONDocument | bytes,
        index: int,
        in_txn: bool,
    ) -> ChangeEvent | None:
        """The general transform's event of the op at `index` of a transaction committed by
        `doc` (decoded here if given as bytes: most transactions' ops need no decoding)."""
        if isinstance(doc, bytes):
            doc = RawBSONDocument(doc, RAW)
        txn: Txn | None = (doc["lsid"], doc["txnNumber"]) if in_txn else None
        op_doc = RawBSONDocument(op, RAW) if isinstance(op, bytes) else op
        return crud_event(self._writer, op_doc, EventAt(doc["ts"], doc.get("wall"), index, txn))

    def _txn_stamp(self, doc: RawBSONDocument, in_txn: bool) -> TxnStamp | None:
        """What the splice of the ops committed by `doc` needs (txn_stamp), or None to make their
        events the general way."""
        return txn_stamp(bytes(doc.raw), in_txn) if self._splices() else None

    def _splices(self) -> bool:
        """Whether transactions' writes are spliced: with splice_transactions, for v2 tokens (the
        splice writes v2 only, as `transform`'s does; a stream resumed from an older token keeps
        its version up to that token's time)."""
        return self._splice_txns and self.token_version == 2 and self.keep_version is None


class _Chain:
    """A transaction's entries read so far (partialTxn or prepare), waiting for the entry that
    commits it: their ops, and `gap`, the ts of the entry its first one links back to when the
    chain began before the read did (None when it starts at its first)."""

    __slots__ = ("gap", "ops")

    def __init__(self, ops: list[PendingOp], gap: Timestamp | None) -> None:
        self.ops, self.gap = ops, gap


def _listed(event: ChangeEvent | None) -> list[ChangeEvent]:
    return [event] if event is not None else []


def _op_bytes(op: Mapping[str, Any] | bytes) -> bytes | None:
    """An op's BSON bytes, if it is a document (else the general transform reports it)."""
    if isinstance(op, bytes):
        return op
    return bytes(op.raw) if isinstance(op, RawBSONDocument) else None


def _commits(doc: RawBSONDocument) -> bool:
    """Whether the entry commits a transaction: an applyOps that ends a chain (not a partialTxn,
    a prepare or batched writes), or the commitTransaction of a prepared one."""
    if doc["op"] != "c" or "lsid" not in doc:
        return False
    o = doc["o"]
    first = next(iter(o.keys()))
    if first == "applyOps":
        return not (o.get("partialTxn") or o.get("prepare") or doc.get("multiOpType") == 1)
    return first == "commitTransaction"


def prev_op_ts(entry: bytes | RawBSONDocument) -> Timestamp | None:
    """The ts of the entry before this one in its transaction's chain (prevOpTime), or None for
    the chain's first entry (the null optime)."""
    doc = entry if isinstance(entry, RawBSONDocument) else RawBSONDocument(entry, RAW)
    prev = doc.get("prevOpTime")
    ts = prev["ts"] if prev is not None else None
    return ts if ts is not None and (ts.time or ts.inc) else None
