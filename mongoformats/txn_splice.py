"""The writes inside a transaction's applyOps, spliced as bytes: the events of its inserts,
updates and deletes, made as `splice_crud` makes a plain write's.

Why: the general transform decodes each op of the transaction and encodes its event again, at
several times the cost of a plain write's splice. An op of an applyOps entry is a plain write's
entry without the stamp (ts, t, v, wall) and session fields, and its event is that write's event
at the commit's time with two differences: the resume token's txnOpIndex is the op's index
among the transaction's operations, and the transaction's txnNumber and lsid lead the event,
before `_id` (mongodb-formats.md C.11, as event_writer.EventWriter.finish writes them). So the
op is given the commit entry's stamp, spliced by `splice_crud`, and those two parts are
written in. What `splice_crud` does not take (DDL, noops, views, migrations' writes, rare
shapes) it leaves to the caller's general transform, op by op.

The applyOps entry itself is read from its bytes too (`read_apply_ops`): its ops, whether they
wait for a later commit, the transaction's key and prevOpTime, the stamp. Decoding its top level
costs about as much as splicing one op.

Sources (facts only): mongodb/mongo src/mongo/db/pipeline/change_stream_event_transform.cpp
and resume_token.cpp, as summarized in shared/reference/mongodb-formats.md A.5, C.6 and C.11.
"""

from __future__ import annotations

import functools
import re
import struct
from binascii import hexlify
from typing import NamedTuple

from bson import Timestamp

from mongoformats.bson_bytes import _I32, _TS, array_items, elements
from mongoformats.keystring import KeyStringBuilder
from mongoformats.oplog_splice import _ID_HEAD, _TOKEN_HEAD, Spliced, splice_crud

__all__ = [
    "ApplyOps",
    "TxnKey",
    "TxnStamp",
    "read_apply_ops",
    "server_stamp",
    "splice_txn_op",
    "txn_entry",
    "txn_event",
    "txn_stamp",
]

# What an applyOps entry gives each of its ops' events: (the elements an op is given to be a
# plain write's entry: ts, t, v, wall; the elements that lead each event: txnNumber, lsid).
TxnStamp = tuple[bytes, bytes]
# (lsid id bytes, txnNumber): the key of a transaction's buffers.
TxnKey = tuple[bytes, int]
# A BSON element as `elements` gives it: (type, value start, value end).
_Element = tuple[int, int, int]

# An entry's t and v, which no event shows: written so that the op has the whole stamp of a
# plain write's entry, the shape splice_crud reads at fixed offsets.
_TERM_AND_VERSION = b"\x12t\x00" + bytes(8) + b"\x12v\x00" + bytes(8)
_INT_TYPES = (0x10, 0x12)  # a txnNumber of int32 or int64 is written back as it is
# Where a token's version, tokenType, txnOpIndex and fromInvalidate start in its KeyString:
# after the type byte and the 8 bytes of the cluster time.
_HEAD_AT = 9
# Where they end: where the token's resume fields start.
_TOKEN_AT = _HEAD_AT + len(_TOKEN_HEAD)
# Where an event's token hex starts: after its length (4) and _id's and _data's headers (20).
_HEX_AT = 4 + _ID_HEAD.size
# An index of int32 range has the type bits of index 0, which splice_crud wrote.
_MAX_INDEX = 2**31 - 1


def txn_stamp(entry: bytes, in_txn: bool) -> TxnStamp | None:
    """The stamp an applyOps entry gives its ops (see TxnStamp), the transaction's fields only
    if `in_txn`; None if one of them is not of the type the general transform writes back as it
    is (the general transform then makes every event of the entry)."""
    return _stamp(entry, elements(entry), in_txn)


def _stamp(entry: bytes, f: dict[bytes, _Element], in_txn: bool) -> TxnStamp | None:
    """txn_stamp of the entry of elements `f`."""
    ts, wall = f.get(b"ts"), f.get(b"wall")
    if ts is None or ts[0] != 0x11 or (wall is not None and wall[0] != 0x09):
        return None
    stamp = b"\x11ts\x00" + entry[ts[1] : ts[2]] + _TERM_AND_VERSION
    if wall is not None:
        stamp += b"\x09wall\x00" + entry[wall[1] : wall[2]]
    if not in_txn:
        return stamp, b""
    number, lsid = f.get(b"txnNumber"), f.get(b"lsid")
    if number is None or lsid is None or number[0] not in _INT_TYPES or lsid[0] != 0x03:
        return None
    head = b"".join(
        (
            bytes((number[0],)),
            b"txnNumber\x00",
            entry[number[1] : number[2]],
            b"\x03lsid\x00",
            entry[lsid[1] : lsid[2]],
        )
    )
    return stamp, head


class ApplyOps(NamedTuple):
    """An applyOps entry, or the commitTransaction of a prepared transaction (no ops, not
    buffered), as the transform reads it (change_events.OplogTransformer._apply_ops and
    _commit_prepared read the same from the decoded entry)."""

    ts: Timestamp
    ops: list[bytes]  # its ops' documents
    buffered: bool  # partialTxn or prepare: its ops wait for the transaction's commit
    # The key of the transaction's buffers; None for a commit of no transaction (batched writes:
    # no lsid, or multiOpType 1).
    key: TxnKey | None
    prev: Timestamp | None  # its prevOpTime's ts; None for a chain's first entry
    stamp: TxnStamp | None  # what its ops' events need (a commit's only)


class _Refused(Exception):
    """An entry the byte reading leaves to the general transform."""


def read_apply_ops(entry: bytes) -> ApplyOps | None:
    """An applyOps or commitTransaction entry read from its bytes; None for any other entry, and
    for one with a field of a type other than the server writes (the general transform reads or
    reports it)."""
    try:
        return _read(entry)
    except (_Refused, ValueError, IndexError, struct.error):
        return None


# The server's transaction entry, read at fixed offsets (`server_elements`): lsid {id: UUID,
# uid: 32-byte BinData} and txnNumber (int64) lead, then op "c" and ns; after `o`, ts, t, v, wall
# and prevOpTime {ts, t}, all of fixed size. Mongod writes its session fields and optime so
# (mongodb-formats.md C.1 and C.6; mongodb/mongo src/mongo/db/repl/oplog_entry.idl and
# src/mongo/db/session/logical_session_id.idl). Any other shape is walked.
_LSID_HEAD = b"H\x00\x00\x00\x05id\x00\x10\x00\x00\x00\x04"  # 72 bytes; id: 16 bytes, subtype 4
_UID_HEAD = b"\x05uid\x00 \x00\x00\x00\x00"  # uid: 32 bytes, subtype 0
_PREV_HEAD = b"\x1c\x00\x00\x00\x11ts\x00"  # prevOpTime of 28 bytes, led by ts
_PREV_T = b"\x12t\x00"  # then t, an int64, and the end byte
_ENTRY_HEAD = re.compile(
    b"\x03lsid\x00"
    + re.escape(_LSID_HEAD)
    + b".{16}"
    + re.escape(_UID_HEAD)
    + b".{32}\x00\x12txnNumber\x00.{8}\x02op\x00\x02\x00\x00\x00c\x00\x02ns\x00",
    re.S,
)
_ENTRY_TAIL = re.compile(
    b"\x11ts\x00.{8}\x12t\x00.{8}\x12v\x00.{8}\x09wall\x00.{8}\x03prevOpTime\x00"
    + re.escape(_PREV_HEAD)
    + b".{8}"
    + re.escape(_PREV_T)
    + b".{8}\x00",
    re.S,
)
_NS_AT = 115  # where the ns string's length is, after the head
_TAIL_SIZE = 89  # the tail's bytes, the entry's end byte included


def server_elements(entry: bytes) -> dict[bytes, _Element] | None:
    """`elements(entry)` of an entry of the server's transaction shape (see _ENTRY_HEAD), read
    at fixed offsets; None for any other shape (the caller walks it)."""
    shape = _server_shape(entry)
    return None if shape is None else _shaped_elements(*shape)


def _server_shape(entry: bytes) -> tuple[int, int] | None:
    """(where `o`'s value starts, where the tail does: ts, t, v, wall, prevOpTime) of an entry
    of the server's transaction shape, else None. Every element is where the walk finds it: each
    header is checked where the walk would read it."""
    size = _I32.unpack_from(entry)[0]
    tail = size - _TAIL_SIZE
    if not _ENTRY_HEAD.match(entry, 4) or not _ENTRY_TAIL.fullmatch(entry, tail, size - 1):
        return None
    ns_size = _I32.unpack_from(entry, _NS_AT)[0]
    o_at = _NS_AT + 4 + ns_size
    if ns_size < 1 or entry[o_at : o_at + 3] != b"\x03o\x00":
        return None
    o_size = _I32.unpack_from(entry, o_at + 3)[0]
    if o_size < 5 or o_at + 3 + o_size != tail:
        return None
    return o_at + 3, tail


def _shaped_elements(o: int, tail: int) -> dict[bytes, _Element]:
    """The elements of an entry of the server's shape, its `o` at `o`, its tail at `tail`."""
    return {
        b"lsid": (0x03, 10, 82),
        b"txnNumber": (0x12, 93, 101),
        b"op": (0x02, 105, 111),
        b"ns": (0x02, _NS_AT, o - 3),
        b"o": (0x03, o, tail),
        b"ts": (0x11, tail + 4, tail + 12),
        b"t": (0x12, tail + 15, tail + 23),
        b"v": (0x12, tail + 26, tail + 34),
        b"wall": (0x09, tail + 40, tail + 48),
        b"prevOpTime": (0x03, tail + 60, tail + 88),
    }


def _read(entry: bytes) -> ApplyOps | None:
    shape = _server_shape(entry)
    if shape is not None and (read := _read_server(entry, *shape)) is not None:
        return read
    return _read_walked(entry, elements(entry) if shape is None else _shaped_elements(*shape))


def _read_walked(entry: bytes, f: dict[bytes, _Element]) -> ApplyOps | None:
    """`_read` of an entry of elements `f`, field by field."""
    command = _command(entry, f)
    ts = _typed(f, b"ts", 0x11)
    if command is None or ts is None:
        return None
    inc, secs = _TS.unpack_from(entry, ts[1])
    if b"applyOps" not in command:
        return _commit_of_prepared(entry, f, Timestamp(secs, inc))
    buffered = _flag(entry, command.get(b"partialTxn")) or _flag(entry, command.get(b"prepare"))
    lsid_id, number = _session(entry, f)
    if buffered:
        key: TxnKey | None = (lsid_id or b"", -1 if number is None else number)
    else:
        key = _commit_key(entry, f, lsid_id, number)
    stamp = None if buffered else _stamp(entry, f, key is not None)
    if not buffered and stamp is None:
        return None
    ops = array_items(entry, command[b"applyOps"][1])
    return ApplyOps(Timestamp(secs, inc), ops, buffered, key, _prev(entry, f), stamp)


# The `o` of a prepared transaction's commitTransaction as the server writes it: 53 bytes,
# commitTransaction 1 (an int32), then commitTimestamp.
_COMMIT_O = b"5\x00\x00\x00\x10commitTransaction\x00"
_COMMIT_TS = b"\x11commitTimestamp\x00"
# What may follow the applyOps array in an `o` read at fixed offsets, each with whether its
# ops wait for a later commit: nothing (a transaction of one entry), prepare or partialTxn true.
_AFTER_OPS = {b"": False, b"\x08prepare\x00\x01": True, b"\x08partialTxn\x00\x01": True}


def _read_server(entry: bytes, o: int, tail: int) -> ApplyOps | None:
    """`_read` of an entry of the server's shape (server_elements), its `o` at `o` and its ts
    element at `tail`, from the fixed offsets of its fields; None if its `o` is not one of the
    server's (the elements are read then)."""
    if entry[o + 4 : o + 14] == b"\x04applyOps\x00":
        ops_size = _I32.unpack_from(entry, o + 14)[0]
        ops_end = o + 14 + ops_size
        buffered = _AFTER_OPS.get(entry[ops_end : o + _I32.unpack_from(entry, o)[0] - 1])
        if buffered is None or ops_size < 5:
            return None
        ops = array_items(entry, o + 14)
    elif entry[o : o + 23] == _COMMIT_O and entry[o + 27 : o + 44] == _COMMIT_TS:
        buffered, ops = False, []
    else:
        return None
    # Server-shaped: lsid's id, txnNumber (int64), ts, wall and prevOpTime's ts where
    # server_elements found them.
    key = (entry[23:39], int.from_bytes(entry[93:101], "little", signed=True))
    stamp = None if buffered else server_stamp(entry, tail)
    inc, secs = _TS.unpack_from(entry, tail + 4)
    prev_inc, prev_secs = _TS.unpack_from(entry, tail + 68)
    prev = Timestamp(prev_secs, prev_inc) if prev_secs or prev_inc else None
    return ApplyOps(Timestamp(secs, inc), ops, buffered, key, prev, stamp)


def server_stamp(entry: bytes, tail: int) -> TxnStamp:
    """The stamp of an entry of the server's shape (server_elements) whose ts element is at
    `tail`: ts, t, v and wall; txnNumber and lsid."""
    return (
        entry[tail : tail + 12] + _TERM_AND_VERSION + entry[tail + 34 : tail + 48],
        entry[82:101] + entry[4:82],
    )


def _command(entry: bytes, f: dict[bytes, _Element]) -> dict[bytes, _Element] | None:
    """The elements of the entry's `o` if it is an applyOps (`op: "c"`, `o` led by the array
    applyOps) or the commitTransaction of a prepared transaction, else None."""
    op, o = _typed(f, b"op", 0x02), _typed(f, b"o", 0x03)
    if op is None or o is None or entry[op[1] : op[2]] != b"\x02\x00\x00\x00c\x00":
        return None
    command = elements(entry, o[1])
    first = next(iter(command.items()), None)
    if first is None:
        return None
    name, (t, _, _) = first
    return command if (name, t == 4) in _COMMANDS else None


# The commands read here, each with whether its first element is an array.
_COMMANDS = frozenset({(b"applyOps", True), (b"commitTransaction", False)})


def _commit_of_prepared(entry: bytes, f: dict[bytes, _Element], ts: Timestamp) -> ApplyOps:
    """A prepared transaction's commitTransaction: no ops of its own, it commits those its
    prepare entry left buffered (under its lsid and txnNumber, whatever its multiOpType)."""
    lsid_id, number = _session(entry, f)
    stamp = _stamp(entry, f, True)
    if lsid_id is None or number is None or stamp is None:
        raise _Refused  # the general transform reports a commit without its transaction
    return ApplyOps(ts, [], False, (lsid_id, number), _prev(entry, f), stamp)


def _typed(f: dict[bytes, _Element], name: bytes, t: int) -> _Element | None:
    """The element `name` if it is of type `t`; None if absent; refused if of another type."""
    found = f.get(name)
    if found is not None and found[0] != t:
        raise _Refused
    return found


def _flag(entry: bytes, found: _Element | None) -> bool:
    """A boolean flag (partialTxn, prepare): false if absent."""
    if found is None:
        return False
    if found[0] != 0x08:
        raise _Refused  # another type's truth: the general transform's to judge
    return entry[found[1]] != 0


def _integer(entry: bytes, found: _Element | None) -> int | None:
    """An int32 or int64 value (txnNumber, multiOpType), or None if absent."""
    if found is None:
        return None
    if found[0] not in _INT_TYPES:
        raise _Refused
    return int.from_bytes(entry[found[1] : found[2]], "little", signed=True)


def _session(entry: bytes, f: dict[bytes, _Element]) -> tuple[bytes | None, int | None]:
    """(the lsid's id, as the bytes of its binary value, or None without lsid; txnNumber)."""
    lsid = _typed(f, b"lsid", 0x03)
    number = _integer(entry, f.get(b"txnNumber"))
    if lsid is None:
        return None, number
    at = lsid[1]
    if entry[at : at + 13] == _LSID_HEAD and entry[at + 29 : at + 39] == _UID_HEAD:
        return entry[at + 13 : at + 29], number  # the server's lsid: {id, uid}
    found = _typed(elements(entry, lsid[1]), b"id", 0x05)
    if found is None or entry[found[1] + 4] == 2:
        raise _Refused  # no id, or of the old binary subtype, whose bytes hold their own length
    return entry[found[1] + 5 : found[2]], number


def _commit_key(
    entry: bytes, f: dict[bytes, _Element], lsid_id: bytes | None, number: int | None
) -> TxnKey | None:
    """A commit's transaction key: None for batched writes (no lsid, or multiOpType 1)."""
    if lsid_id is None or _integer(entry, f.get(b"multiOpType")) == 1:
        return None
    if number is None:
        raise _Refused  # a transaction without txnNumber: the general transform reports it
    return lsid_id, number


def _prev(entry: bytes, f: dict[bytes, _Element]) -> Timestamp | None:
    """prevOpTime's ts, None if absent or null (a chain's first entry)."""
    prev = _typed(f, b"prevOpTime", 0x03)
    if prev is None:
        return None
    at = prev[1]
    if entry[at : at + 8] == _PREV_HEAD and entry[at + 16 : at + 19] == _PREV_T:
        inc, secs = _TS.unpack_from(entry, at + 8)  # the server's {ts, t}
    else:
        ts = _typed(elements(entry, at), b"ts", 0x11)
        if ts is None:
            raise _Refused
        inc, secs = _TS.unpack_from(entry, ts[1])
    return Timestamp(secs, inc) if secs or inc else None


def splice_txn_op(
    op: bytes, stamp: TxnStamp, index: int, *, expanded: bool
) -> Spliced | tuple[()] | None:
    """The event of the op at `index` among its transaction's operations (every op counts,
    also those that make no event), in an entry of `stamp`: splice_crud's fields, () for an op
    with no event (an internal namespace), None for the general transform."""
    tail, head = stamp
    if index > _MAX_INDEX:
        return None
    made = splice_crud(txn_entry(op, tail), expanded=expanded)
    return txn_event(made, head, index) if made else made


def txn_entry(op: bytes, tail: bytes) -> bytes:
    """The op as a plain write's entry, given the stamp `tail` (TxnStamp's first part): what
    splice_crud (or the batch splice) reads to make its event before `txn_event`."""
    return b"".join((_I32.pack(len(op) + len(tail)), op[4:-1], tail, b"\x00"))


def txn_event(made: Spliced, head: bytes, index: int) -> Spliced | None:
    """The event splice_crud `made` of an op's `txn_entry` as its transaction's: `head`
    (TxnStamp's second part) leading its elements, txnOpIndex `index` in its token; None for
    the general transform (an index past int32's range, a token of another head)."""
    if index > _MAX_INDEX:
        return None
    if not (head or index):
        return made
    sort_key, type_bits, op_type, db, coll, raw, namespaces, shard, _ = made
    if not index:
        event = b"".join((_I32.pack(len(raw) + len(head)), head, raw[4:]))
        return sort_key, type_bits, op_type, db, coll, event, namespaces, shard, None
    if sort_key[_HEAD_AT:_TOKEN_AT] != _TOKEN_HEAD:
        return None
    token_head, hex_head = _token_head(index)
    event = _indexed(raw, head, len(sort_key), hex_head)
    sort_key = b"".join((sort_key[:_HEAD_AT], token_head, sort_key[_TOKEN_AT:]))
    return sort_key, type_bits, op_type, db, coll, event, namespaces, shard, None


def _indexed(raw: bytes, head: bytes, key_size: int, hex_head: bytes) -> bytes:
    """The event `raw` (of a token of `key_size` bytes, txnOpIndex 0), `head` leading its
    elements and its token's hex with `hex_head` in place of index 0's: the `_id` element's
    header, then the hex (hexlify works byte by byte: only the head's digits change), then the
    rest as it is (the hex's end byte, `_typeBits`, the other fields)."""
    growth = len(hex_head) - 2 * len(_TOKEN_HEAD)
    id_size = _I32.unpack_from(raw, 9)[0] + growth
    header = _ID_HEAD.pack(b"\x03_id\x00", id_size, b"\x02_data\x00", 2 * key_size + growth + 1)
    return b"".join(
        (
            _I32.pack(len(raw) + len(head) + growth),
            head,
            header,
            raw[_HEX_AT : _HEX_AT + 2 * _HEAD_AT],
            hex_head,
            raw[_HEX_AT + 2 * _TOKEN_AT :],
        )
    )


@functools.lru_cache(maxsize=1 << 10)
def _token_head(index: int) -> tuple[bytes, bytes]:
    """A v2 event token's KeyString after its cluster time: version 2, tokenType 128 (event),
    txnOpIndex `index`, fromInvalidate false; with its hex digits as the event's `_data` has
    them. Memoized: transactions' indexes are small."""
    ks = KeyStringBuilder()
    for value in (2, 128, index, False):
        ks.append(value)
    return ks.data, hexlify(ks.data).upper()
