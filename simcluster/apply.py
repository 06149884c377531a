"""Oplog application: how a secondary turns the primary's oplog entries into the same data.

A secondary copies each entry's bytes into its own oplog (same `ts`, same bytes, so a reader
cannot tell which member it tails) and applies it here to its own collections, logging nothing.
Shapes are the ones `simcluster.node` and `simcluster.transactions` write (mongodb-formats.md C):
CRUD (`$v: 2` diffs or replacements), DDL commands on `<db>.$cmd`, views as `system.views`
writes, and transactions as applyOps (partialTxn chains and prepared transactions held until
their commit entry, as the server's applier holds them).
"""

from __future__ import annotations

import itertools
import uuid as uuidlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from simcluster.catalog import modified_index_spec
from simcluster.storage import Collection, id_key

__all__ = ["Applier", "apply_diff"]


def apply_diff(doc: Mapping[str, Any], diff: Mapping[str, Any]) -> dict[str, Any]:
    """Apply an object diff `{d, u, i, s<field>}` (document_diff_serialization.h) to a copy of
    `doc`.

    `u` rewrites a field where it stands, `i` appends it at the end, `d` removes it: the field
    order the primary's update produced.
    """
    out = dict(doc)
    for key, value in diff.items():
        apply = _SECTIONS.get(key)
        if apply is not None:
            apply(out, value)
        elif key.startswith("s"):
            out[key[1:]] = _apply_sub(out.get(key[1:]), value)
    return out


def _delete_fields(out: dict[str, object], names: Iterable[str]) -> None:
    for name in names:
        out.pop(name, None)


def _insert_fields(out: dict[str, object], fields: Mapping[str, object]) -> None:
    for name, v in fields.items():
        out.pop(name, None)
        out[name] = v


# How each section of an object diff changes the document (its sub-diffs `s<field>` aside).
_SECTIONS: dict[str, Callable[[dict[str, Any], Any], None]] = {
    "d": _delete_fields,
    "u": dict.update,
    "i": _insert_fields,
}


def _apply_sub(current: Any, diff: Mapping[str, Any]) -> Any:
    if not diff.get("a"):
        return apply_diff(current if isinstance(current, Mapping) else {}, diff)
    return _apply_array_diff(list(current) if isinstance(current, list) else [], diff)


def _apply_array_diff(arr: list[Any], diff: Mapping[str, Any]) -> list[Any]:
    """An array diff `{a: true, l: <new length>, u<i>|s<i>: ...}` applied to `arr` in place."""
    if "l" in diff:
        del arr[int(diff["l"]) :]
    for key, value in diff.items():
        if key not in ("a", "l"):
            _set_element(arr, key, value)
    return arr


def _set_element(arr: list[Any], key: str, value: Any) -> None:
    """`u<i>` sets element i, `s<i>` applies a sub-diff to it; nulls pad the array up to i."""
    idx = int(key[1:])
    arr.extend([None] * (idx + 1 - len(arr)))
    arr[idx] = value if key[0] == "u" else _apply_sub(arr[idx], value)


MAX_IMAGES = 200_000


class Applier:
    """Applies decoded oplog entries to one member's databases (`dbs`: db -> name -> Collection)."""

    def __init__(self, dbs: dict[str, dict[str, Collection]]) -> None:
        self.dbs = dbs
        # Transactions whose ops arrived (partialTxn chain, or prepared) but not yet their commit:
        # each op with (its entry's ts, its index there), where its images are recorded.
        self.pending: dict[tuple[bytes, int], list[tuple[Mapping[str, Any], tuple[Any, int]]]] = {}
        # Of those, the prepared ones: key -> (lsid, prepare ts). A member that becomes primary
        # takes them over as prepared transactions, so the coordinator can still commit them.
        self.prepared: dict[tuple[bytes, int], tuple[Mapping[str, Any], Any]] = {}
        # Retryable writes done, per session: lsid id -> (txnNumber, stmtIds). The server keeps
        # this in config.transactions and rebuilds it from the oplog's session fields, so a new
        # primary answers a retried statement it already has instead of applying it twice.
        self.statements: dict[bytes, tuple[int, set[int]]] = {}
        # Pre- and post-images of writes to collections with changeStreamPreAndPostImages enabled
        # (the server's config.system.preimages), by (collection UUID bytes, oplog ts key, index in
        # the applyOps entry, 0 outside transactions): (before, after).
        self.images: dict[tuple[bytes, int, int], tuple[Any, Any]] = {}

    def record_images(
        self, coll: Collection, ts: Any, before: Any, after: Any, index: int = 0
    ) -> None:
        """Keep a write's images if its collection had pre- and post-images enabled at the time."""
        if (coll.options.get("changeStreamPreAndPostImages") or {}).get("enabled"):
            self.images[(coll.uuid.bytes, (ts.time << 32) | ts.inc, index)] = (before, after)
            if len(self.images) > MAX_IMAGES:
                # The server expires pre-images with the oplog; the simulator keeps the newest ones.
                for key in list(itertools.islice(self.images, len(self.images) // 2)):
                    del self.images[key]

    def statements_of(self, lsid: bytes, txn_number: int) -> set[int]:
        """The statements done for this session's retryable write `txn_number` (a newer one
        replaces an older one's)."""
        known = self.statements.get(lsid)
        if known is None or known[0] != txn_number:
            known = self.statements[lsid] = (txn_number, set())
        return known[1]

    def record_statement(self, entry: Mapping[str, Any]) -> None:
        if "stmtId" not in entry or "lsid" not in entry:
            return
        self.statements_of(bytes(entry["lsid"]["id"]), int(entry["txnNumber"])).add(
            int(entry["stmtId"])
        )

    def already_done(self, session: Mapping[str, Any]) -> bool:
        """Was this retryable-write statement (its session fields: lsid, txnNumber, stmtId) done
        already, e.g. before a failover the driver retried across?"""
        if "stmtId" not in session:
            return False
        known = self.statements.get(bytes(session["lsid"]["id"]))
        return (
            known is not None
            and known[0] == int(session["txnNumber"])
            and int(session["stmtId"]) in known[1]
        )

    def apply(self, entry: Mapping[str, Any], *, at: tuple[Any, int] | None = None) -> None:
        """Apply one entry; `at` is (ts, index) of an op inside a transaction's applyOps entry,
        which is where its images are recorded."""
        self.record_statement(entry)
        op = entry["op"]
        if op == "n":
            return
        if op == "c":
            self._command(entry)
        elif entry["ns"].endswith(".system.views"):
            self._view(entry)
        elif (write := _WRITES.get(op)) is not None:
            write(self, entry, _images_at(entry, at))

    def _insert(self, entry: Mapping[str, Any], at: tuple[Any, int] | None) -> None:
        self._coll(entry["ns"], entry.get("ui")).put(dict(entry["o"]))

    def _update(self, entry: Mapping[str, Any], at: tuple[Any, int] | None) -> None:
        coll = self._coll(entry["ns"], entry.get("ui"))
        old = coll.docs.get(id_key(entry["o2"]["_id"]))
        o = entry["o"]
        new = apply_diff(old or {}, o["diff"]) if o.get("$v") == 2 else dict(o)
        coll.put(new, old)
        if old is not None and at is not None:
            self.record_images(coll, at[0], old, new, at[1])

    def _delete(self, entry: Mapping[str, Any], at: tuple[Any, int] | None) -> None:
        coll = self._coll(entry["ns"], entry.get("ui"))
        found = coll.docs.get(id_key(entry["o"]["_id"]))
        if found is None:
            return
        coll.remove(found)
        if at is not None:
            self.record_images(coll, at[0], found, None, at[1])

    # -- helpers -----------------------------------------------------------------------------------

    def _coll(self, ns: str, ui: Any, options: Mapping[str, Any] | None = None) -> Collection:
        db, _, name = ns.partition(".")
        colls = self.dbs.setdefault(db, {})
        coll = colls.get(name)
        if coll is None:
            coll = Collection(name, options=dict(options or {}))
            if ui is not None:
                coll.uuid = uuidlib.UUID(bytes=bytes(ui))
            colls[name] = coll
        return coll

    def _view(self, entry: Mapping[str, Any]) -> None:
        """A write to system.views: an insert makes a view, a replacement modifies it (collMod), a
        delete drops it; the system.views collection keeps the documents."""
        db = entry["ns"].split(".", 1)[0]
        views = self._coll(entry["ns"], entry.get("ui"))
        view_ns: str = entry["o"]["_id"]
        name = view_ns.split(".", 1)[1]
        if entry["op"] in ("i", "u"):
            doc = dict(entry["o"])
            views.put(doc)
            self._put_view(db, view_ns, entry.get("ui"), self._view_options(db, doc))
        elif entry["op"] == "d":
            views.discard(id_key(view_ns))
            self.dbs.get(db, {}).pop(name, None)

    def _view_options(self, db: str, doc: Mapping[str, Any]) -> dict[str, Any]:
        """A view's options from its system.views document; a time-series collection's view
        also carries its buckets' timeseries options."""
        options = {k: v for k, v in doc.items() if k != "_id"}
        buckets = self.dbs.get(db, {}).get(options["viewOn"])
        if options["viewOn"].startswith("system.buckets.") and buckets is not None:
            options["timeseries"] = buckets.options.get("timeseries")
        return options

    def _put_view(self, db: str, view_ns: str, ui: object, options: dict[str, object]) -> None:
        """Make the view, or modify the one there (collMod)."""
        view = self.dbs.get(db, {}).get(view_ns.split(".", 1)[1])
        if view is None:
            self._coll(view_ns, ui, options)
        else:
            view.options.update(options)

    def _command(self, entry: Mapping[str, Any]) -> None:
        name, arg = next(iter(entry["o"].items()))
        apply = _COMMANDS.get(name)
        if apply is not None:
            apply(self, entry, entry["ns"].split(".", 1)[0], arg)

    def _create(self, entry: Mapping[str, Any], db: str, arg: Any) -> None:
        options = {k: v for k, v in entry["o"].items() if k not in ("create", "idIndex")}
        self._coll(f"{db}.{arg}", entry.get("ui"), options)

    def _drop(self, entry: Mapping[str, Any], db: str, arg: Any) -> None:
        self.dbs.get(db, {}).pop(arg, None)

    def _drop_database(self, entry: Mapping[str, Any], db: str, arg: Any) -> None:
        self.dbs.pop(db, None)

    def _rename(self, entry: Mapping[str, Any], db: str, arg: Any) -> None:
        sdb, _, sname = arg.partition(".")
        ddb, _, dname = entry["o"]["to"].partition(".")
        coll = self.dbs.get(sdb, {}).pop(sname, None)
        if coll is not None:
            coll.name = dname
            self.dbs.setdefault(ddb, {})[dname] = coll

    def _create_indexes(self, entry: Mapping[str, Any], db: str, arg: Any) -> None:
        spec = {k: v for k, v in entry["o"].items() if k != "createIndexes"}
        self._coll(f"{db}.{arg}", entry.get("ui")).add_index(spec, f"{db}.{arg}")

    def _commit_index_build(self, entry: Mapping[str, Any], db: str, arg: Any) -> None:
        """startIndexBuild changes nothing until the commit."""
        coll = self._coll(f"{db}.{arg}", entry.get("ui"))
        for spec in entry["o"]["indexes"]:
            coll.add_index(dict(spec), f"{db}.{arg}")

    def _drop_indexes(self, entry: Mapping[str, Any], db: str, arg: Any) -> None:
        coll = self.dbs.get(db, {}).get(arg)
        if coll is not None:
            coll.indexes.pop(entry["o"]["index"], None)

    def _coll_mod_entry(self, entry: Mapping[str, Any], db: str, arg: Any) -> None:
        self._coll_mod(self._coll(f"{db}.{arg}", entry.get("ui")), entry["o"])

    def _apply_ops_entry(self, entry: Mapping[str, Any], db: str, arg: Any) -> None:
        self._apply_ops(entry)

    def _commit_transaction(self, entry: Mapping[str, Any], db: str, arg: Any) -> None:
        self.prepared.pop(_txn(entry), None)
        for op, at in self.pending.pop(_txn(entry), []):
            self.apply(op, at=at)

    def _abort_transaction(self, entry: Mapping[str, Any], db: str, arg: Any) -> None:
        self.prepared.pop(_txn(entry), None)
        self.pending.pop(_txn(entry), None)

    def _coll_mod(self, coll: Collection, o: Mapping[str, Any]) -> None:
        changes = {k: v for k, v in o.items() if k != "collMod"}
        coll.options.update({k: v for k, v in changes.items() if k != "index"})
        index = changes.get("index")
        if index:
            _modify_index(coll, index)

    def _apply_ops(self, entry: Mapping[str, Any]) -> None:
        o = entry["o"]
        ops = list(o["applyOps"])
        if "lsid" not in entry:  # a plain applyOps command: apply now
            for i, op in enumerate(ops):
                self.apply(op, at=(entry["ts"], i))
            return
        key = _txn(entry)
        self.pending.setdefault(key, []).extend((op, (entry["ts"], i)) for i, op in enumerate(ops))
        if o.get("prepare"):
            self.prepared[key] = (entry["lsid"], entry["ts"])
        elif not o.get("partialTxn"):
            self._apply_transaction(key)

    def _apply_transaction(self, key: tuple[bytes, int]) -> None:
        """The last link of a chain (or a one-entry commit): the whole transaction applies now,
        each op's images kept under its own entry's ts and its index there, as the server keys
        pre-images (applyOpsTs, applyOpsIndex)."""
        for op, at in self.pending.pop(key):
            self.apply(op, at=at)


# How each command entry applies: (applier, entry, its database, the command's argument).
_COMMANDS: dict[str, Callable[[Applier, Mapping[str, Any], str, Any], None]] = {
    "create": Applier._create,
    "drop": Applier._drop,
    "dropDatabase": Applier._drop_database,
    "renameCollection": Applier._rename,
    "createIndexes": Applier._create_indexes,
    "commitIndexBuild": Applier._commit_index_build,
    "dropIndexes": Applier._drop_indexes,
    "collMod": Applier._coll_mod_entry,
    "applyOps": Applier._apply_ops_entry,
    "commitTransaction": Applier._commit_transaction,
    "abortTransaction": Applier._abort_transaction,
}


# How each CRUD entry applies: (applier, entry, where its images are recorded).
_WRITES: dict[str, Callable[[Applier, Mapping[str, Any], tuple[Any, int] | None], None]] = {
    "i": Applier._insert,
    "u": Applier._update,
    "d": Applier._delete,
}


def _images_at(
    entry: Mapping[str, object], at: tuple[object, int] | None
) -> tuple[object, int] | None:
    """Where a write's images are recorded: `at` inside a transaction, else (its ts, 0)."""
    if at is not None:
        return at
    return (entry["ts"], 0) if "ts" in entry else None


def _modify_index(coll: Collection, index: Mapping[str, Any]) -> None:
    """collMod's `index`: the index it names (by name or key pattern) takes the changes."""
    for ix in coll.indexes.values():
        if ix.name == index.get("name") or ix.key == index.get("keyPattern"):
            ix.spec = modified_index_spec(ix.spec, dict(index))


def take_prepared(
    applier: Applier,
) -> list[tuple[tuple[bytes, int], Mapping[str, Any], Any, list[Any]]]:
    """Hand the prepared, uncommitted transactions over (a member stepping up): (key, lsid,
    prepare ts, ops)."""
    out = [
        (key, lsid, ts, [op for op, _ in applier.pending.pop(key, [])])
        for key, (lsid, ts) in applier.prepared.items()
    ]
    applier.prepared.clear()
    return out


def _txn(entry: Mapping[str, Any]) -> tuple[bytes, int]:
    return bytes(entry["lsid"]["id"]), int(entry["txnNumber"])
