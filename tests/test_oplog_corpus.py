"""The real-oplog corpus (tests/conformance/oplog_entries/*.json) through the engine's event path.

Each file holds cases: oplog entries shaped as a MongoDB 7.0/8.0 mongod writes them, the stream's
options and the events a real server emits for them, each with the server source it comes from
(the files are written by tests/conformance/oplog_entries/build.py). This is what the engine meets
on a real cluster and simcluster never writes, so it is checked here against the server's
behaviour, not against simcluster.

Every case runs on every path a real batch of entries can take in the engine:

- `entry`: one entry at a time through `OplogTransformer.transform` (the byte splice
  `oplog_splice.splice_crud` first, the general transform for the rest);
- `general`: one entry at a time through `transform_decoded` alone;
- `reader`: buckets/reader.py's `OplogTail` reading the entries from a find reply, as one batch
  (`batch_splice.splice_entries` one by one below BATCH_MIN entries, then `_deliver`);
- `reader-per-entry`: the same, each entry in a getMore batch of its own (transactions split over
  batches);
- `reader-in-run`: the entries between runs of 100 plain inserts into another collection, in one
  batch of over BATCH_MIN entries: the batch splice's compiled path (`splice_block`, EventBlocks).

A case whose transaction began before the read (`history`) is read back by prevOpTime, as the
reader does; a case with `resumeAfter` starts the reader at that token (its time, and the events
up to it skipped). Events are compared field by field (order and BSON types included), then,
where the case gives the token, byte for byte. A case known to differ from the server is a
strict xfail naming the fidelity audit's item (shared/reference/fidelity-audit-2026-11-26.md).

Run: `PYTHONPATH=$PWD .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_oplog_corpus.py`
"""

from __future__ import annotations

import binascii
import pathlib
from typing import Any

import bson
import pytest
import trio
from bson import Binary, Int64, ObjectId, Timestamp, json_util
from bson.raw_bson import RawBSONDocument

from buckets._columnar.batch_splice import BATCH_MIN
from buckets._columnar.event_block import EventBlock
from buckets.reader import OplogTail
from mongoformats.change_events import OplogTransformer, prev_op_ts
from mongoformats.resume_token import decode_token
from wireproxy.upstream import MemberConnector

CORPUS = pathlib.Path(__file__).resolve().parent / "conformance" / "oplog_entries"
PATHS = ("entry", "general", "reader", "reader-per-entry", "reader-in-run")
RUN = 100  # filler inserts on each side of the case's entries in `reader-in-run`
FILLER_NS, FILLER_UI = "shop.filler", Binary(bytes(range(16)), 4)


def _load() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(CORPUS.glob("*.json")):
        data = json_util.loads(path.read_text(), json_options=json_util.CANONICAL_JSON_OPTIONS)
        out += [(path.stem, case) for case in data["cases"]]
    return out


CASES = _load()


def _params() -> list[Any]:
    params = []
    for stem, case in CASES:
        for path in PATHS:
            marks = []
            if reason := case.get("diverges"):
                marks.append(pytest.mark.xfail(strict=True, reason=reason))
            params.append(pytest.param(case, path, id=f"{stem}/{case['name']}/{path}", marks=marks))
    return params


def _encode(doc: dict[str, Any]) -> bytes:
    """`doc` in its own field order: bson.encode writes a top-level _id first, and the server's
    events have `to`, txnNumber and lsid before it. A nested document keeps its order."""
    wrapped = bson.encode({"d": doc})
    return wrapped[7:-1]  # int32 length, 0x03 "d\0", the document, the closing 0


def _transformer(options: dict[str, Any]) -> OplogTransformer:
    # As buckets/stream.py makes each shard reader's: showExpandedEvents and showSystemEvents
    # come from the stream's options; token version 2 (7.0/8.0); native DDL entries, not the
    # proxy's notes.
    return OplogTransformer(
        show_expanded_events=bool(options.get("showExpandedEvents")),
        show_system_events=bool(options.get("showSystemEvents")),
        token_version=2,
        ddl_notes=False,
    )


# -- the paths ---------------------------------------------------------------------------------


def _one_by_one(case: dict[str, Any], decoded_only: bool) -> list[tuple[bytes, bytes, bytes]]:
    """Each entry through the transformer, with a chain that began before the read adopted first
    (what OplogTail._deliver does with missing_chain / adopt_chain)."""
    transformer = _transformer(case["options"])
    history = {h["ts"]: _encode(h) for h in case.get("history", [])}
    out = []
    for doc in case["entries"]:
        raw = _encode(doc)
        if (gap := transformer.missing_chain(raw)) is not None:
            chain: list[bytes] = []
            at: Timestamp | None = gap
            while at is not None:
                chain.append(history[at])
                at = prev_op_ts(history[at])
            transformer.adopt_chain(chain[::-1])
        events = transformer.transform_decoded(raw) if decoded_only else transformer.transform(raw)
        out += [(ev.sort_key, ev.type_bits, ev.raw) for ev in events]
    return out


class _Oplog:
    """A member's side of the reader's connection: answers the tail's find and getMores with the
    given batches (the last with cursor id 0, which ends the tail), and a find by ts from the
    history (a transaction's earlier entries)."""

    streaming = False
    address = "member:27018"

    def __init__(self, batches: list[list[bytes]], history: dict[Timestamp, bytes]) -> None:
        self.batches = batches
        self.history = history

    @staticmethod
    def _reply(key: str, docs: list[bytes], cursor_id: int) -> bytes:
        # The entries go in as they are (RawBSONDocument): their bytes, never re-encoded.
        return bson.encode(
            {
                "cursor": {
                    key: [RawBSONDocument(d) for d in docs],
                    "id": Int64(cursor_id),
                    "ns": "local.oplog.rs",
                },
                "ok": 1.0,
            }
        )

    async def command_in_place(
        self,
        db: str,
        cmd: dict[str, Any],
        *,
        pad: int,
        exhaust: bool = False,
        allocate: Any = bytearray,
    ) -> tuple[bytes, int]:
        assert db == "local" and ("find" in cmd or "getMore" in cmd)
        batch = self.batches.pop(0)
        reply = self._reply(
            "firstBatch" if "find" in cmd else "nextBatch", batch, 7 if self.batches else 0
        )
        return reply + bytes(pad), 0

    async def command(self, db: str, cmd: dict[str, Any]) -> RawBSONDocument:
        at = cmd["filter"]["ts"]
        found = [self.history[at]] if at in self.history else []
        return RawBSONDocument(self._reply("firstBatch", found, 0))


class _Collect:
    """The tail's output: the events it delivers, as (sort key, type bits, event bytes)."""

    def __init__(self) -> None:
        self.events: list[tuple[bytes, bytes, bytes]] = []

    async def deliver(
        self, events: list[Any], nbytes: int, entries: int, last_ts: Timestamp
    ) -> None:
        for item in events:
            rows = item.fields() if isinstance(item, EventBlock) else [item]
            self.events += [(row[0], row[1], row[5]) for row in rows]

    async def idle(self) -> None:
        pass

    async def parked(self, waiting: bool) -> None:
        pass


def _filler(n: int, secs: int) -> bytes:
    oid = ObjectId(f"{secs:08x}{n:016x}")
    return bson.encode(
        {
            "op": "i",
            "ns": FILLER_NS,
            "ui": FILLER_UI,
            "o": {"_id": oid, "n": n},
            "o2": {"_id": oid},
            "ts": Timestamp(secs, n + 1),
            "t": Int64(3),
            "v": Int64(2),
            "wall": bson.datetime_ms.DatetimeMS(secs * 1000 + n),
        }
    )


def _read(case: dict[str, Any], path: str) -> list[tuple[bytes, bytes, bytes]]:
    entries = [_encode(doc) for doc in case["entries"]]
    history = {h["ts"]: _encode(h) for h in case.get("history", [])}
    if path == "reader":
        batches = [entries]
    elif path == "reader-per-entry":
        batches = [[e] for e in entries]
    else:
        secs = case["entries"][0]["ts"].time
        batches = [
            [
                *(_filler(i, secs - 1) for i in range(RUN)),
                *entries,
                *(_filler(i, secs + 1) for i in range(RUN)),
            ]
        ]
        assert len(batches[0]) >= BATCH_MIN
    resumed = case.get("resumeAfter")
    tail = OplogTail(
        "shard0",
        [("member", 27018)],
        # A resumed stream reads from the token's clusterTime and skips the events up to it.
        start=decode_token(resumed).cluster_time if resumed else Timestamp(0, 0),
        skip_key=_resume_key(case),
        transformer=_transformer(case["options"]),
        connect_member=MemberConnector(),  # unused: _tail reads the connection it is given
    )
    out: Any = _Collect()  # the TailOutput
    conn: Any = _Oplog(batches, history)  # stands in for the UpstreamConnection to a member
    trio.run(tail._tail, conn, out)
    if path != "reader-in-run":
        return out.events
    mine = [ev for ev in out.events if bson.decode(ev[2])["ns"].get("coll") != "filler"]
    # Those before a resume point are skipped with the events up to it.
    fillers = RUN if resumed else 2 * RUN
    assert len(out.events) - len(mine) == fillers, "the filler inserts' events"
    return mine


def _resume_key(case: dict[str, Any]) -> bytes:
    """The sort key of the case's resumeAfter token (b"": from the start)."""
    token = case.get("resumeAfter")
    return binascii.unhexlify(token["_data"]) if token else b""


def _run(case: dict[str, Any], path: str) -> list[tuple[bytes, bytes, bytes]]:
    if path in ("entry", "general"):
        skip = _resume_key(case)  # what the reader does with the transform's events (skip_key)
        return [ev for ev in _one_by_one(case, decoded_only=path == "general") if ev[0] > skip]
    return _read(case, path)


# -- the comparison ----------------------------------------------------------------------------


def _summary(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(e.get("operationType"), e.get("ns"), e.get("clusterTime")) for e in events]


def _compare(actual: list[tuple[bytes, bytes, bytes]], case: dict[str, Any]) -> None:
    expect = case["expect"]
    got = [bson.decode(raw) for _, _, raw in actual]
    assert _summary(got) == _summary(expect), "the events differ in kind, namespace or time"
    with_token = case.get("tokens", True)
    for i, (doc, want) in enumerate(zip(got, expect, strict=True)):
        shown = [k for k in want if with_token or k != "_id"]
        assert [k for k in doc if with_token or k != "_id"] == shown, (
            f"event {i}: fields or their order"
        )
        for k in shown:
            assert _encode({k: doc[k]}) == _encode({k: want[k]}), (
                f"event {i}: {k} (value or BSON type)"
            )
        if with_token:
            sort_key, type_bits, raw = actual[i]
            token = want["_id"]
            assert sort_key == binascii.unhexlify(token["_data"]), (
                f"event {i}: the token's KeyString"
            )
            assert type_bits == bytes(token.get("_typeBits", b"")), (
                f"event {i}: the token's type bits"
            )
            assert raw == _encode(want), f"event {i}: the event's bytes"


@pytest.mark.parametrize(("case", "path"), _params())
def test_oplog_corpus(case: dict[str, Any], path: str) -> None:
    _compare(_run(case, path), case)


def test_corpus_covers_every_kind_the_issue_lists() -> None:
    """Issue 45 item 3's kinds, each present in the corpus."""
    names = " ".join(case["name"] for _, case in CASES)
    for kind in (
        "insert-",
        "update-",
        "delete-",
        "replace",
        "applyOps-with-lsid",
        "without-lsid",
        "multiOpType",
        "partialTxn",
        "prepare-then-commitTransaction",
        "abortTransaction",
        "create-capped",
        "create-collation",
        "create-clustered",
        "createIndexes",
        "startIndexBuild",
        "commitIndexBuild",
        "abortIndexBuild",
        "dropIndexes",
        "collMod",
        "hide-index",
        "view-create",
        "view-modify",
        "view-drop",
        "buckets",
        "timeseries",
        "shardCollection",
        "reshardCollection",
        "refineCollectionShardKey",
        "migrateLastChunkFromShard",
        "fromMigrate",
        "dropDatabase",
        "renameCollection",
        "array-",
        "nested-object",
    ):
        assert kind in names, kind
