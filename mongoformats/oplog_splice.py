"""The hot path of the oplog -> change event transform: plain CRUD entries, spliced as bytes.

Why: inflating each entry (even lazily, with RawBSONDocument) and re-encoding the event is the
slowest way through Python, and caps what a core can transform. Nearly every entry of a busy
oplog is a single insert, update or delete, and its event is mostly the entry's own bytes in a
different order: `o` becomes fullDocument, `o2` documentKey, `ts` clusterTime, `wall` wallTime.
So this module walks the entry's top-level elements once, copies those value slices into the
event, and writes the resume token's KeyString straight from the documentKey's BSON bytes. Only
an update's diff is decoded (it must be rewritten as updateDescription).

Anything outside that common shape (transactions, DDL, noops, fromMigrate, exotic `_id` types,
v0/v1 tokens) returns None and the caller uses the general transform in change_events.py. Tests
check both paths give byte-identical events for the same entries. A reader's batches go through
batch_splice.py, which splices their plain inserts, updates and deletes all at once and the
rest here.
"""

from __future__ import annotations

import functools
import struct
from binascii import hexlify
from typing import Any

import bson

from mongoformats.bson_bytes import (
    _I32,
    SplicedDocument,
    _cstring_element,
    _string,
    array_items,
    array_of,
    byte_slices,
    cursor_batch,
    cursor_document,
    cursor_span,
    document_of,
    document_parts,
    elements,
    first_element,
    leading_id,
    splice_at_end,
    splice_before_ns,
    timestamp_of,
)
from mongoformats.bson_bytes import _value_end as _value_end  # hashed_key's import path
from mongoformats.codecs import PLAIN
from mongoformats.diff_splice import update_description
from mongoformats.keystring import KeyStringBuilder, encode_type_bits, preshifted_key
from mongoformats.update_diff import update_description_from_diff

# The byte-level helpers are bson_bytes's and the diff's reading diff_splice's; they are
# re-exported here, where the other packages import them from.
__all__ = [
    "TOKEN_TIMESTAMP",
    "Layout",
    "Spliced",
    "SplicedDocument",
    "array_items",
    "array_of",
    "byte_slices",
    "cursor_batch",
    "cursor_document",
    "cursor_span",
    "document_of",
    "document_parts",
    "not_crud",
    "elements",
    "first_element",
    "leading_id",
    "splice_at_end",
    "splice_before_ns",
    "splice_crud",
    "splice_laid_out",
    "timestamp_of",
    "update_description",
]

# An event's `_id` up to the hex of its token: the element's header, the document's length, then
# the `_data` string's header and length.
_ID_HEAD = struct.Struct("<5si7si")
TOKEN_TIMESTAMP = struct.Struct(">II")  # a token's timestamp: seconds, then increment, big-endian


# -- KeyString of a documentKey, straight from its BSON bytes -----------------------------------
# The ctype bytes are those of keystring.py (CType in the server's key_string.cpp): 0x1E the
# numeric family, 0x29 zero, 0x3C string, 0x46 object, 0x64 ObjectId.


def _ks_integer(little_endian: bytes, bits: list[int]) -> bytes | None:
    """KeyString body of an int32 (4 bytes) or int64 (8 bytes) value, its type bits appended to
    `bits`; None for an int64 at the edge of the range, which the general encoder keys."""
    value = int.from_bytes(little_endian, "little", signed=True)
    if len(little_endian) == 8 and abs(value) >= 2**63 - 1:
        return None
    bits += (0, 0) if len(little_endian) == 4 else (0, 1)
    return preshifted_key(abs(value) << 1, value < 0) if value else b"\x29"


def _ks_document_key(buf: bytes, start: int, bits: list[int]) -> bytes | None:
    """KeyString of the document at `start` as an object value; None for a value type we leave
    to the general encoder (anything but ObjectId, string, int32, int64, binary and documents of
    these)."""
    out = [b"\x46"]
    unpack, index, names = _I32.unpack_from, buf.index, byte_slices(buf)
    end = start + unpack(buf, start)[0] - 1
    p = start + 4
    seen: set[bytes] = set()
    while p < end:  # the elements, walked here: `elements` would build a dict of them first
        t = buf[p]
        q = index(0, p + 1)
        v = q + 1
        name = names[p + 1 : q]
        if name in seen:
            return None  # a name twice: the general encoder decides which value counts
        seen.add(name)
        if t == 0x07:
            p = v + 12
            out += (b"\x64", name, b"\x00\x64", buf[v:p])
        elif t == 0x02:
            p = v + 4 + unpack(buf, v)[0]
            out += (
                b"\x3c",
                name,
                b"\x00\x3c",
                buf[v + 4 : p - 1].replace(b"\x00", b"\x00\xff"),
                b"\x00",
            )
            bits.append(0)
        elif t == 0x10 or t == 0x12:
            p = v + (4 if t == 0x10 else 8)
            number = _ks_integer(buf[v:p], bits)
            if number is None:
                return None
            out += (b"\x1e", name, b"\x00", number)
        elif t == 0x05:  # binary (a UUID _id): its size (one byte below 255), subtype, bytes
            n = unpack(buf, v)[0]
            p = v + 5 + n
            size = bytes((n,)) if n < 0xFF else b"\xff" + n.to_bytes(4, "big", signed=True)
            out += (b"\x5a", name, b"\x00\x5a", size, buf[v + 4 : p])
        elif t == 0x03:  # a compound _id (or shard key part): an object within the object
            inner = _ks_document_key(buf, v, bits)
            if inner is None:
                return None
            p = v + unpack(buf, v)[0]
            out += (b"\x46", name, b"\x00", inner)
        else:
            return None
    out.append(b"\x00")
    return b"".join(out)


def _decoded_document_key(key: bytes) -> tuple[bytes, list[int]] | None:
    """(KeyString, the token's type bits) of a documentKey `_ks_document_key` leaves: UUIDs and
    other binary `_id`s, compound `_id`s, shard keys of other types. Decoded and keyed by the
    general encoder, as the general path keys it (`_identifier`, then `encode_token`): the rest of
    the event is still spliced, which costs a fraction of the general path's decode and re-encode
    of the whole entry."""
    ks = KeyStringBuilder()
    try:
        ks.append(bson.decode(key, PLAIN))
    except (ValueError, bson.errors.BSONError):
        return None  # the general path reports it
    return ks.data, _TS_TAIL_BITS + ks.bits


def _keystring(*values: Any) -> bytes:
    ks = KeyStringBuilder()
    for value in values:
        ks.append(value)
    return ks.data


# v2 event token after the timestamp: version 2, tokenType 128 (event), txnOpIndex 0,
# fromInvalidate false.
_TOKEN_HEAD = _keystring(2, 128, 0, False)
_OP_IDENT = {
    op: b"\x46\x3coperationType\x00\x3c" + op.encode() + b"\x00\x46documentKey\x00"
    for op in ("insert", "update", "replace", "delete")
}
_OP_ELEMENT = {
    op: _cstring_element(0x02, b"operationType", _string(op.encode()))
    for op in ("insert", "update", "replace", "delete")
}
_INTERNAL_DBS = frozenset({b"admin", b"config", b"local"})
_OID_KEY_HEAD = b"\x16\x00\x00\x00\x07_id\x00"
_UUID_KEY_HEAD = b"\x1f\x00\x00\x00\x05_id\x00\x10\x00\x00\x00"  # {_id: binary of 16 bytes}
_TS_TAIL_BITS = [
    0
] * 7  # type bits of version, tokenType, txnOpIndex (2 each) and operationType (1)
_STRING_ID_BITS = [0] * 8  # and a string _id's (1: a string, not a symbol)
# An update's o up to its diff's value: {$v: 2, diff: ...}, the diff its last element.
_V2_DIFF = b"\x10$v\x00\x02\x00\x00\x00\x03diff\x00"
_V2_DIFF_AT = 4 + len(_V2_DIFF)


# What splice_crud returns: a ChangeEvent's fields, as a plain tuple (it is sent faster, for
# readerProcesses, and the engine keeps events so, see change_events.EventFields): sort_key,
# type_bits, op_type, db, coll, raw, namespaces, shard, applied_at.
Spliced = tuple[bytes, bytes, str, str, str, bytes, tuple[str, ...], str, None]


# What the start of a CRUD entry, its op, ns and ui, makes of its event (see `_head`): (op code,
# the namespace's parts, the ui element's value or None, the KeyString of the UUID for the token).
_Head = tuple[bytes, "_NamespaceParts", "bytes | None", bytes]
# Where an entry's values lie: (its head, o value, o2 value or None, offset of the ts value, wall
# value or None); a value is its (start, end) offsets in the entry. None: the general path.
_Range = tuple[int, int]
Layout = tuple[_Head | tuple[()], _Range, "_Range | None", int, "_Range | None"]

_OP_HEAD = b"\x02op\x00\x02\x00\x00\x00"
_UI_HEAD = b"\x05ui\x00\x10\x00\x00\x00\x04"
_UI_BYTES = len(_UI_HEAD) + 16  # the ui element: header, then the UUID's 16 bytes
_STAMP_BYTES = 48  # the ts, t, v and wall elements, in that order, as every entry has them
# Their element headers, read with one unpack (a third faster than four slice compares).
_STAMP_NAMES = struct.Struct("<4s8x3s8x3s8x6s")
_STAMP_HEADERS = (b"\x11ts\x00", b"\x12t\x00", b"\x12v\x00", b"\x09wall\x00")
_CRUD_CODES = (b"i", b"u", b"d")


def _head(code: bytes, ns: bytes, ui: bytes | None) -> _Head | tuple[()] | None:
    """What an entry's op code, ns and ui value (int32 16, subtype 4, the UUID) make of its event:
    a _Head, () for a namespace with no events, None for the general path."""
    if code not in _CRUD_CODES or ns.endswith(b".system.views"):
        return None  # view DDL: the general path makes create/drop events of these
    names = _namespace(ns)
    if not names:
        return ()
    return code, names, ui, b"\x5a\x10\x04" + ui[5:] if ui is not None else b"\x14"


@functools.lru_cache(maxsize=1 << 12)
def _fixed_head(head: bytes) -> tuple[_Head | tuple[()] | None, int]:
    """(_head, its length) of the bytes an entry has from its `op` element on, up to where a ui
    element would end: `{op, ns, ui?, ...`; (None, 0) if they do not start so.

    Memoized: the op, ns and ui of a busy oplog's entries repeat (a few codes times the
    collections written), and one lookup of these bytes costs a fraction of reading them. Its
    value is a function of these bytes alone, whatever
    follows in the entry. An entry without ui puts part of its `o` into the key, and so misses,
    bounded by the cache's size; servers since 3.6 give every CRUD entry a ui.
    """
    if (
        head[:8] != _OP_HEAD
        or head[9:10] != b"\x00"
        or head[10:14] != b"\x02ns\x00"
        or len(head) < 18
    ):
        return None, 0
    q = 18 + _I32.unpack_from(head, 14)[0]  # past the ns string
    if q <= 18 or head[q - 1 : q] != b"\x00":
        return None, 0
    ui = head[q + 4 : q + _UI_BYTES] if head[q : q + 9] == _UI_HEAD else None
    return _head(head[8:9], head[18 : q - 1], ui), q + _UI_BYTES if ui is not None else q


def _fixed_layout(raw: bytes) -> Layout | None:
    """The layout of an entry shaped as a server writes a plain CRUD op, in the order of its
    OplogEntryBase IDL: `{lsid?, txnNumber?, op, ns, ui?, o, o2?, stmtId?, ts, t, v, wall,
    prevOpTime?}` (the session fields are a retryable write's); None for any other shape.

    Why: walking the entry element by element (`elements`) is half the cost of a splice. Here
    each expected element is checked where it must start, so the common entry costs a few slice
    compares (and its op, ns and ui one lookup, `_fixed_head`); the walk stays for everything
    else. Every element boundary is still derived from the BSON lengths, so an entry only matches
    if it really is exactly this sequence.
    """
    p = _op_at(raw)
    if p is None or raw[p : p + 8] != _OP_HEAD or len(raw) < p + 18:
        return None
    # The op element is 10 bytes, then the ns string's element header and length 8.
    head, n = _fixed_head(raw[p : p + 18 + _UI_BYTES + _I32.unpack_from(raw, p + 14)[0]])
    if head is None:
        return None
    p += n
    if raw[p : p + 3] != b"\x03o\x00":
        return None
    o = (p + 3, p + 3 + _I32.unpack_from(raw, p + 3)[0])
    p = o[1]
    o2 = None
    if raw[p : p + 4] == b"\x03o2\x00":
        o2 = (p + 4, p + 4 + _I32.unpack_from(raw, p + 4)[0])
        p = o2[1]
    if raw[p : p + 8] == b"\x10stmtId\x00":
        p += 12
    end = p + _STAMP_BYTES
    n = len(raw) - 1  # where the document's terminator must be
    if end > n or _STAMP_NAMES.unpack_from(raw, p) != _STAMP_HEADERS or raw[n]:
        return None
    if end != n and (
        raw[end : end + 12] != b"\x03prevOpTime\x00"
        or end + 12 + _I32.unpack_from(raw, end + 12)[0] != n
    ):
        return None
    return head, o, o2, p + 4, (p + 40, p + 48)


# The BSON types a CRUD entry's fields must have, and those of its optional fields.
_WALKED_TYPES = {
    b"op": 0x02,
    b"ns": 0x02,
    b"o": 0x03,
    b"ts": 0x11,
}
_WALKED_OPTIONAL_TYPES = {b"o2": 0x03, b"wall": 0x09}


def _walked_layout(raw: bytes) -> Layout | None:
    """The layout of a CRUD entry of any field order (sessions, extra fields); None if it is not
    one the splice handles (not i/u/d, a migration's write, a UUID that is not 16 bytes, a field
    missing or of another type: the general path reports what is wrong)."""
    f = elements(raw)
    if not _typed_as_crud(raw, f):
        return None
    op, ns, o, ts = f[b"op"], f[b"ns"], f[b"o"], f[b"ts"]
    ui, o2, wall = f.get(b"ui"), f.get(b"o2"), f.get(b"wall")
    head = _head(raw[op[1] + 4 : op[2] - 1], raw[ns[1] + 4 : ns[2] - 1], ui and raw[ui[1] : ui[2]])
    if head is None:
        return None
    return head, o[1:], o2 and o2[1:], ts[1], wall and wall[1:]


def _typed_as_crud(raw: bytes, f: dict[bytes, tuple[int, int, int]]) -> bool:
    """Whether an entry's elements `f` have a CRUD entry's fields and types, a ui (if any) of a
    16-byte UUID, and no fromMigrate."""
    if b"fromMigrate" in f:
        return False
    for name, t in _WALKED_TYPES.items():
        if name not in f or f[name][0] != t:
            return False
    for name, t in _WALKED_OPTIONAL_TYPES.items():
        if name in f and f[name][0] != t:
            return False
    ui = f.get(b"ui")
    return ui is None or (
        ui[0] == 0x05 and _I32.unpack_from(raw, ui[1])[0] == 16 and raw[ui[1] + 4] == 4
    )


def not_crud(raw: bytes) -> bool:
    """Whether `splice_crud` surely refuses the entry without walking it: its op element, where
    a server writes it (first, or after a session's lsid and txnNumber, as `_fixed_layout`
    reads it), is a command's, a noop's or any but a CRUD op's. (An entry of another field
    order is walked: its op may be anywhere.)"""
    p = _op_at(raw)
    return (
        p is not None
        and raw[p : p + 8] == _OP_HEAD
        and raw[p + 9 : p + 10] == b"\x00"
        and raw[p + 8 : p + 9] not in _CRUD_CODES
    )


def _op_at(raw: bytes) -> int | None:
    """Where a server writes an entry's op element: first, or after a retryable write's lsid
    and txnNumber; None for an entry led by an lsid that txnNumber does not follow."""
    if raw[4:10] != b"\x03lsid\x00":
        return 4
    if len(raw) < 14:
        return None
    p = 10 + _I32.unpack_from(raw, 10)[0]
    return p + 19 if raw[p : p + 11] == b"\x12txnNumber\x00" else None


def splice_crud(raw: bytes, *, expanded: bool) -> Spliced | tuple[()] | None:
    """The event for a plain insert/update/replace/delete entry, or None to use the general path.

    Returns the fields of a ChangeEvent in its order (`Spliced`), or () when the entry makes no
    event (an internal namespace).
    """
    layout = _fixed_layout(raw) or _walked_layout(raw)
    if layout is None:
        return None
    return splice_laid_out(raw, layout, expanded=expanded)


def splice_laid_out(raw: bytes, layout: Layout, *, expanded: bool) -> Spliced | tuple[()] | None:
    """`splice_crud` of an entry whose layout is already known: where the batch splice's compiled
    walk found it (an entry whose documentKey the block does not take)."""
    head, o, o2, t0, wall = layout
    if not head:
        return ()
    code, names, ui, uuid_ks = head
    parts = _OP_PARTS[code](raw, o, o2, expanded)
    if parts is None:
        return None
    op_type, key, full, desc = parts
    keyed = _token_key(key)
    if keyed is None:
        return None
    ks_key, bits = keyed
    # A token's timestamp is the entry's ts reversed: BSON has the increment, then the seconds,
    # little-endian; the KeyString the seconds, then the increment, big-endian.
    ts = raw[t0 : t0 + 8]
    sort_key = b"".join(
        (b"\x82", ts[::-1], _TOKEN_HEAD, uuid_ks, _OP_IDENT[op_type], ks_key, b"\x00\x04")
    )
    type_bits = encode_type_bits(bits) if bits else b""
    body = b"".join(
        _event_parts(
            sort_key,
            type_bits,
            op_type,
            ts,
            ui if expanded else None,
            wall and raw[wall[0] : wall[1]],
            full,
            names[0],
            key,
            desc,
        )
    )
    _, db, coll, namespaces = names
    return sort_key, type_bits, op_type, db, coll, document_of(body), namespaces, "", None


# An event's parts from an entry's o and o2: (operationType, documentKey, fullDocument or None,
# updateDescription or None); None for the general path.
_OpParts = tuple[str, bytes, "bytes | None", "bytes | None"]


def _insert_parts(raw: bytes, o: _Range, o2: _Range | None, expanded: bool) -> _OpParts | None:
    """An insert's: o is the document, o2 (a sharded collection's) its documentKey, else the
    documentKey is the document's `_id`."""
    if o2 is not None:
        key = raw[o2[0] : o2[1]]
    else:
        ident = elements(raw, o[0]).get(b"_id")
        if ident is None:
            return None
        key = document_of(_cstring_element(ident[0], b"_id", raw[ident[1] : ident[2]]))
    return "insert", key, raw[o[0] : o[1]], None


def _delete_parts(raw: bytes, o: _Range, o2: _Range | None, expanded: bool) -> _OpParts | None:
    """A delete's: o is the documentKey (with the shard key's fields in a sharded collection)."""
    return "delete", raw[o[0] : o[1]], None, None


def _update_parts(raw: bytes, o: _Range, o2: _Range | None, expanded: bool) -> _OpParts | None:
    """An update's or a replace's: o2 is the documentKey, o the diff or the new document."""
    if o2 is None:
        return None
    key = raw[o2[0] : o2[1]]
    diff_at = _diff_at(raw, o)
    if diff_at is None:
        return None
    if diff_at < 0:
        return "replace", key, raw[o[0] : o[1]], None
    desc = update_description(raw, diff_at, expanded=expanded)
    if desc is None:
        end = diff_at + _I32.unpack_from(raw, diff_at)[0]
        desc = bson.encode(
            update_description_from_diff(
                bson.decode(raw[diff_at:end], PLAIN), disambiguate=expanded
            )
        )
    return "update", key, None, desc


def _diff_at(raw: bytes, o: _Range) -> int | None:
    """Where an update's `$v: 2` diff starts in raw; -1 for a replacement document; None for
    anything else (an older $v, a malformed o: the general path reports it)."""
    o0, o1 = o
    diff_at = o0 + _V2_DIFF_AT
    # The usual o, `{$v: 2, diff}` as a server writes it, is read where its parts must lie.
    if (
        raw[o0 + 4 : diff_at] == _V2_DIFF
        and diff_at + 5 <= o1 - 1
        and diff_at + _I32.unpack_from(raw, diff_at)[0] == o1 - 1
        and not raw[o1 - 1]
    ):
        return diff_at
    # A replacement leads with its _id (the server puts it first); a document that does not hold
    # the bytes `$v` anywhere has no `$v` field: neither needs the walk.
    if raw[o0 + 4] and raw[o0 + 5 : o0 + 9] == b"_id\x00" and raw.find(b"$v\x00", o0, o1) < 0:
        return -1
    o_fields = elements(raw, o0)
    if b"_id" in o_fields and b"$v" not in o_fields:
        return -1
    version, found = o_fields.get(b"$v"), o_fields.get(b"diff")
    if version is None or found is None or raw[version[1] : version[2]] != b"\x02\x00\x00\x00":
        return None
    return found[1] if found[0] == 0x03 else None  # a diff is a document, else the general path


_OP_PARTS = {b"i": _insert_parts, b"d": _delete_parts, b"u": _update_parts}


def _token_key(key: bytes) -> tuple[bytes, list[int] | None] | None:
    """(KeyString of the documentKey, the token's type bits or None for none) of a documentKey's
    BSON; the usual shapes are read where their parts lie, the rest walked or decoded."""
    if len(key) == 22 and key.startswith(_OID_KEY_HEAD):  # {_id: ObjectId}, the usual documentKey
        return b"\x46\x64_id\x00\x64" + key[9:21] + b"\x00", None
    if (
        key[4:9] == b"\x02_id\x00"
        and 13 + _I32.unpack_from(key, 9)[0] == len(key) - 1
        and key[-2:] == b"\x00\x00"
    ):
        # {_id: string}, the usual documentKey of string ids
        string = key[13:-2].replace(b"\x00", b"\x00\xff")
        return b"".join((b"\x46\x3c_id\x00\x3c", string, b"\x00\x00")), _STRING_ID_BITS
    if len(key) == 31 and key.startswith(_UUID_KEY_HEAD) and not key[-1]:
        # {_id: UUID}: binary of 16 bytes, keyed as its size byte, subtype and bytes
        return b"".join((b"\x46\x5a_id\x00\x5a\x10", key[13:30], b"\x00")), _TS_TAIL_BITS
    bits = list(_TS_TAIL_BITS)
    ks_key = _ks_document_key(key, 0, bits)
    if ks_key is None:
        return _decoded_document_key(key)
    return ks_key, bits


def _event_parts(
    sort_key: bytes,
    type_bits: bytes,
    op_type: str,
    ts: bytes,
    ui: bytes | None,
    wall: bytes | None,
    full: bytes | None,
    ns_element: bytes,
    key: bytes,
    desc: bytes | None,
) -> list[bytes]:
    """The event's elements in the server's order, as pieces to join once: _id (the token),
    operationType, clusterTime, collectionUUID (expanded events), wallTime, fullDocument, ns,
    documentKey, updateDescription."""
    hex_data = hexlify(sort_key).upper()
    n = len(hex_data)
    typed = (
        b"\x05_typeBits\x00" + _I32.pack(len(type_bits)) + b"\x00" + type_bits if type_bits else b""
    )
    parts = [
        _ID_HEAD.pack(b"\x03_id\x00", n + 17 + len(typed), b"\x02_data\x00", n + 1),
        hex_data,
        b"\x00",
        typed,
        b"\x00",
        _OP_ELEMENT[op_type],
        b"\x11clusterTime\x00",
        ts,
    ]
    if ui is not None:
        parts += (b"\x05collectionUUID\x00", ui)
    if wall is not None:
        parts += (b"\x09wallTime\x00", wall)
    if full is not None:
        parts += (b"\x03fullDocument\x00", full)
    parts += (ns_element, b"\x03documentKey\x00", key)
    if desc is not None:
        parts += (b"\x03updateDescription\x00", desc)
    return parts


_NamespaceParts = tuple[bytes, str, str, tuple[str]]


@functools.lru_cache(maxsize=1 << 14)
def _namespace(ns: bytes) -> _NamespaceParts | tuple[()]:
    """(the event's encoded `ns` element, db, coll, (ns,)), or () for a namespace with no events.

    Memoized (a pure function of `ns`): a stream sees few namespaces, and every entry would
    otherwise rebuild these.
    """
    db, _, coll = ns.partition(b".")
    parts: _NamespaceParts | tuple[()] = ()
    if db not in _INTERNAL_DBS and not coll.startswith(b"system."):
        element = b"\x03ns\x00" + document_of(
            b"\x02db\x00" + _string(db) + b"\x02coll\x00" + _string(coll)
        )
        parts = (element, db.decode(), coll.decode(), (ns.decode(),))
    return parts
