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

Sources (facts only): mongodb/mongo src/mongo/db/pipeline/change_stream_event_transform.cpp
and resume_token.cpp, as summarized in shared/reference/mongodb-formats.md A.5, C.6 and C.11.
"""

from __future__ import annotations

import functools
from binascii import hexlify

from mongoformats.bson_bytes import _I32, elements
from mongoformats.keystring import KeyStringBuilder
from mongoformats.oplog_splice import _ID_HEAD, _TOKEN_HEAD, Spliced, splice_crud

__all__ = ["TxnStamp", "splice_txn_op", "txn_stamp"]

# What an applyOps entry gives each of its ops' events: (the elements an op is given to be a
# plain write's entry: ts, t, v, wall; the elements that lead each event: txnNumber, lsid).
TxnStamp = tuple[bytes, bytes]

# An entry's t and v, which no event shows: written so that the op has the whole stamp of a
# plain write's entry, the shape splice_crud reads at fixed offsets.
_TERM_AND_VERSION = b"\x12t\x00" + bytes(8) + b"\x12v\x00" + bytes(8)
_INT_TYPES = (0x10, 0x12)  # a txnNumber of int32 or int64 is written back as it is
# Where a token's version, tokenType, txnOpIndex and fromInvalidate start in its KeyString:
# after the type byte and the 8 bytes of the cluster time.
_HEAD_AT = 9
# Where an event's token hex starts: after its length (4) and _id's and _data's headers (20).
_HEX_AT = 4 + _ID_HEAD.size
_MAX_INDEX = (
    2**31 - 1
)  # an index of int32 range has the type bits of index 0, which splice_crud wrote


def txn_stamp(entry: bytes, in_txn: bool) -> TxnStamp | None:
    """The stamp an applyOps entry gives its ops (see TxnStamp), the transaction's fields only
    if `in_txn`; None if one of them is not of the type the general transform writes back as it
    is (the general transform then makes every event of the entry)."""
    f = elements(entry)
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


def splice_txn_op(
    op: bytes, stamp: TxnStamp, index: int, *, expanded: bool
) -> Spliced | tuple[()] | None:
    """The event of the op at `index` among its transaction's operations (every op counts,
    also those that make no event), in an entry of `stamp`: splice_crud's fields, () for an op
    with no event (an internal namespace), None for the general transform."""
    tail, head = stamp
    if index > _MAX_INDEX:
        return None
    written = b"".join((_I32.pack(len(op) + len(tail)), op[4:-1], tail, b"\x00"))
    made = splice_crud(written, expanded=expanded)
    if not made or not (head or index):
        return made
    sort_key, type_bits, op_type, db, coll, raw, namespaces, shard, _ = made
    body = raw[4:]  # its elements and the end byte
    if index:
        token_at = _HEAD_AT + len(_TOKEN_HEAD)
        if sort_key[_HEAD_AT:token_at] != _TOKEN_HEAD:
            return None
        indexed = b"".join((sort_key[:_HEAD_AT], _token_head(index), sort_key[token_at:]))
        body = _id_rewritten(raw, 2 * len(sort_key), indexed)
        sort_key = indexed
    event = b"".join((_I32.pack(4 + len(head) + len(body)), head, body))
    return sort_key, type_bits, op_type, db, coll, event, namespaces, shard, None


def _id_rewritten(raw: bytes, hex_size: int, sort_key: bytes) -> bytes:
    """The elements (and end byte) of the event `raw`, its token's hex (`hex_size` digits) that
    of `sort_key` instead: the `_id` element's header, then the new hex, then the rest as it is
    (the hex's end byte, `_typeBits`, the other fields)."""
    hex_data = hexlify(sort_key).upper()
    id_size = _I32.unpack_from(raw, 9)[0] + len(hex_data) - hex_size
    header = _ID_HEAD.pack(b"\x03_id\x00", id_size, b"\x02_data\x00", len(hex_data) + 1)
    return b"".join((header, hex_data, raw[_HEX_AT + hex_size :]))


@functools.lru_cache(maxsize=1 << 10)
def _token_head(index: int) -> bytes:
    """A v2 event token's KeyString after its cluster time: version 2, tokenType 128 (event),
    txnOpIndex `index`, fromInvalidate false. Memoized: transactions' indexes are small."""
    ks = KeyStringBuilder()
    for value in (2, 128, index, False):
        ks.append(value)
    return ks.data
