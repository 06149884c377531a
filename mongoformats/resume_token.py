"""Change-stream resume tokens: `{_data: <hex KeyString>, _typeBits?: BinData(0)}`.

Invariant: for tokens of one stream, comparing `_data` strings (or `sort_key` bytes) orders them
exactly as the server orders events: clusterTime, version, tokenType (high-water marks before
events at equal time), txnOpIndex, fromInvalidate, uuid, eventIdentifier, fragmentNum.

Source (facts only): mongodb/mongo src/mongo/db/pipeline/resume_token.{h,cpp}; the layout, the
error codes and two public examples are in shared/reference/mongodb-formats.md section A.
"""

from __future__ import annotations

import binascii
import struct
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from bson import Binary, Timestamp

from mongoformats.errors import MongoError
from mongoformats.keystring import KeyStringBuilder
from mongoformats.keystring_reader import KeyStringReader

__all__ = [
    "ResumeTokenData",
    "HIGH_WATER_MARK",
    "EVENT_TOKEN",
    "encode_token",
    "decode_token",
    "high_water_mark",
    "token_sort_key",
    "token_text",
    "fragment_of",
    "whole_event_token",
]

HIGH_WATER_MARK = 0
EVENT_TOKEN = 128
DEFAULT_VERSION = 2  # 6.1+ (so 7.0 and 8.0) emit v2 tokens by default


@dataclass(frozen=True, slots=True)
class ResumeTokenData:
    cluster_time: Timestamp
    version: int = DEFAULT_VERSION
    token_type: int = EVENT_TOKEN
    txn_op_index: int = 0
    from_invalidate: bool = False
    uuid: uuidlib.UUID | None = None
    # v0/v1 classic events: the documentKey; v2 and expanded events: {operationType, documentKey |
    # operationDescription}. Values keep their BSON types (Int64, float) because the type bits do.
    event_identifier: Mapping[str, Any] | None = None
    fragment_num: int | None = None


def _bad(code: int | str, msg: str) -> MongoError:
    return MongoError(code, msg)


_HEAD_CACHE: dict[tuple[int, int, int, bool], bytes] = {}
_IDENT_CACHE: dict[str, bytes] = {}


def _event_token_fast(data: ResumeTokenData) -> dict[str, Any] | None:
    """The common v2 event token {operationType, documentKey}, spliced from cached byte runs.

    Produces exactly the bytes of the generic path (tests compare both); returns None for any
    other shape so the generic encoder handles it.
    """
    ident = _common_identifier(data)
    if ident is None:
        return None
    key = KeyStringBuilder()
    # The type bits of version, tokenType, txnOpIndex (2 each) and operationType (1), all zero.
    key.append_zero_type_bits(7)
    key.append(ident["documentKey"])
    ts = data.cluster_time
    parts = [b"\x82", ts.time.to_bytes(4, "big"), ts.inc.to_bytes(4, "big"), _head_bytes(data)]
    parts.append(b"\x5a\x10\x04" + data.uuid.bytes if data.uuid is not None else b"\x14")
    parts += [b"\x46\x3coperationType\x00", _op_type_bytes(ident["operationType"])]
    parts += [b"\x46documentKey\x00", key.data, b"\x00\x04"]
    return _token_document(b"".join(parts), key.type_bits)


def _common_identifier(data: ResumeTokenData) -> Mapping[str, Any] | None:
    """The identifier of a v2 event token, not a fragment's, identified by {operationType,
    documentKey: {...}}; None for any other token."""
    if data.version != 2 or data.fragment_num is not None:
        return None
    ident = data.event_identifier
    if type(ident) is not dict or list(ident) != ["operationType", "documentKey"]:
        return None
    return ident if type(ident["documentKey"]) is dict else None


def _head_bytes(data: ResumeTokenData) -> bytes:
    """The KeyString of version, tokenType, txnOpIndex and fromInvalidate, cached (bounded)."""
    head_key = (data.version, data.token_type, data.txn_op_index, data.from_invalidate)
    head = _HEAD_CACHE.get(head_key)
    if head is None:
        ks = KeyStringBuilder()
        for v in head_key:
            ks.append(v)
        head = _HEAD_CACHE.setdefault(head_key, ks.data) if len(_HEAD_CACHE) < 4096 else ks.data
    return head


def _op_type_bytes(op: str) -> bytes:
    """The KeyString of an operationType, cached (there are a few dozen)."""
    op_bytes = _IDENT_CACHE.get(op)
    if op_bytes is None:
        ks = KeyStringBuilder()
        ks.append(op)
        op_bytes = _IDENT_CACHE.setdefault(op, ks.data)
    return op_bytes


def _token_document(key: bytes, type_bits: bytes) -> dict[str, Any]:
    """{_data: the KeyString in upper-case hex, _typeBits when it needs any}."""
    token: dict[str, Any] = {"_data": key.hex().upper()}
    if type_bits:
        token["_typeBits"] = Binary(type_bits, 0)
    return token


def encode_token(data: ResumeTokenData) -> dict[str, Any]:
    """The resume token document the server emits for `data`."""
    fast = _event_token_fast(data)
    return fast if fast is not None else encode_token_generic(data)


def encode_token_generic(data: ResumeTokenData) -> dict[str, Any]:
    """encode_token without the fast path: the reference the fast path is tested against."""
    if data.version not in (0, 1, 2):
        raise _bad(50795, f"Invalid resume token version: {data.version}")
    if data.fragment_num is not None and data.version < 2:
        raise _bad(7182504, "fragmentNum requires a version 2 resume token")
    ks = KeyStringBuilder()
    for value in _token_values(data):
        ks.append(value)
    ks.append_end()
    return _token_document(ks.data, ks.type_bits)


def _token_values(data: ResumeTokenData) -> list[Any]:
    """The values a token's KeyString holds, in order, for its version."""
    v1 = data.version >= 1
    values: list[Any] = [data.cluster_time, data.version]
    values += [data.token_type] if v1 else []
    values.append(data.txn_op_index)
    values += [data.from_invalidate] if v1 else []
    values += _uuid_values(data)
    optional = (data.event_identifier, data.fragment_num)
    return values + [value for value in optional if value is not None]


def _uuid_values(data: ResumeTokenData) -> list[object]:
    """The token's UUID as its KeyString holds it: v2 writes a missing one as an explicit null."""
    if data.uuid is not None:
        return [Binary(data.uuid.bytes, 4)]
    return [None] if data.version >= 2 else []


def decode_token(token: Mapping[str, Any]) -> ResumeTokenData:
    """Parse a resume token document, raising the server's error codes for malformed ones."""
    raw = token.get("_data")
    if not isinstance(raw, str):
        raise _bad(40647, "resume token _data must be a string")
    bits = _type_bits(token)
    try:
        data = binascii.unhexlify(raw)
    except (binascii.Error, ValueError) as exc:
        raise _bad("FailedToParse", "resume token string was not a valid hex string") from exc
    try:
        return _decode(KeyStringReader(data, bytes(bits)))
    except (ValueError, IndexError, TypeError, struct.error) as exc:
        raise _bad("InvalidResumeToken", f"invalid resume token: {exc}") from exc


def _type_bits(token: Mapping[str, object]) -> bytes | Binary:
    """The token's `_typeBits`; error 40648 if it is not BinData subtype 0."""
    bits = token.get("_typeBits", b"")
    if isinstance(bits, Binary) and bits.subtype != 0 or not isinstance(bits, (bytes, Binary)):
        raise _bad(40648, "resume token _typeBits must be BinData subtype 0")
    return bits


def _decode(r: KeyStringReader) -> ResumeTokenData:
    ts = r.read()
    if not isinstance(ts, Timestamp):
        raise ValueError("clusterTime is not a Timestamp")
    version = _read_version(r)
    token_type = _read_token_type(r) if version >= 1 else EVENT_TOKEN
    txn_op_index = _read_txn_op_index(r)
    from_invalidate = _read_from_invalidate(r) if version >= 1 else False
    uuid, event_identifier, fragment_num = _read_tail(r, version)
    r.finish()
    return ResumeTokenData(
        ts, version, token_type, txn_op_index, from_invalidate, uuid, event_identifier, fragment_num
    )


def _read_tail(
    r: KeyStringReader, version: int
) -> tuple[uuidlib.UUID | None, Mapping[str, object] | None, int | None]:
    """The token's optional last fields, those present: the collection's UUID, the event's
    identifier, and (version 2) its fragment number; error 40646 for anything after them."""
    uuid = _read_uuid(r) if not r.at_end() else None
    event_identifier = _read_event_identifier(r) if not r.at_end() else None
    fragment_num = r.read() if not r.at_end() and version >= 2 else None
    if not r.at_end():
        raise _bad(40646, "invalid oversized resume token")
    return uuid, event_identifier, fragment_num


def _read_version(r: KeyStringReader) -> int:
    version = r.read()
    if type(version) is not int or version not in (0, 1, 2):
        raise _bad(50795, f"Invalid resume token version: {version!r}")
    return version


def _read_token_type(r: KeyStringReader) -> int:
    token_type = r.read()
    if token_type not in (HIGH_WATER_MARK, EVENT_TOKEN):
        raise _bad(51057, f"Unknown tokenType {token_type!r}")
    return token_type


def _read_txn_op_index(r: KeyStringReader) -> int:
    txn_op_index = r.read()
    if type(txn_op_index) is not int:
        raise _bad(50855, "txnOpIndex must be an Int32")
    if txn_op_index < 0:
        raise _bad(50794, "txnOpIndex must be non-negative")
    return txn_op_index


def _read_from_invalidate(r: KeyStringReader) -> bool:
    from_invalidate = r.read()
    if not isinstance(from_invalidate, bool):
        raise ValueError("fromInvalidate is not a bool")
    return from_invalidate


def _read_uuid(r: KeyStringReader) -> uuidlib.UUID | None:
    u = r.read()
    if isinstance(u, Binary) and u.subtype == 4:
        return uuidlib.UUID(bytes=bytes(u))
    if u is not None:
        raise ValueError("uuid is not BinData subtype 4")
    return None


def _read_event_identifier(r: KeyStringReader) -> dict[str, Any]:
    event_identifier = r.read()
    if not isinstance(event_identifier, dict):
        raise ValueError("eventIdentifier is not an object")
    return event_identifier


def high_water_mark(cluster_time: Timestamp, version: int = DEFAULT_VERSION) -> dict[str, Any]:
    """The high-water-mark token a stream reports for "nothing before `cluster_time` is left"."""
    return encode_token(ResumeTokenData(cluster_time, version, HIGH_WATER_MARK))


def whole_event_token(data: ResumeTokenData) -> dict[str, Any]:
    """The token of the event a fragment's token (decoded) was cut from: the same token without
    fragmentNum, which sorts before every fragment's."""
    return encode_token(replace(data, fragment_num=None))


def fragment_of(token: Mapping[str, Any] | ResumeTokenData) -> tuple[bytes, int] | None:
    """For the token of a split event's fragment (or its decoded data): the key of the whole
    event's token (whole_event_token) and the fragment's number. None for any other token."""
    data = token if isinstance(token, ResumeTokenData) else decode_token(token)
    if data.fragment_num is None:
        return None
    return token_sort_key(whole_event_token(data)), data.fragment_num


def token_text(token: Mapping[str, Any], *, spaced: bool = False) -> str:
    """A token as the server prints it in an error message: BSONObj's toString pads its braces
    (`{ _data: "..." }`, BSONObjectTooLarge), a pipeline Document's does not (`{_data: "..."}`,
    "resume token was not found")."""
    shown = f'_data: "{token["_data"]}"'
    if "_typeBits" in token:
        bits = bytes(token["_typeBits"])
        shown += f", _typeBits: BinData({token['_typeBits'].subtype}, {bits.hex().upper()})"
    return f"{{ {shown} }}" if spaced else f"{{{shown}}}"


def token_sort_key(token: Mapping[str, Any]) -> bytes:
    """Bytes that order tokens as the server does (the `_data` KeyString; `_typeBits` never
    counts)."""
    return binascii.unhexlify(token["_data"])


def token_from_key(key: bytes, type_bits: bytes = b"") -> dict[str, Any]:
    """The token whose sort key is `key` (the inverse of token_sort_key), with its `_typeBits`."""
    token: dict[str, Any] = {"_data": binascii.hexlify(key).upper().decode()}
    if type_bits:
        token["_typeBits"] = Binary(type_bits, 0)
    return token
