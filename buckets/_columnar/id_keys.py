"""The sort keys of a batch's block: what each event's resume token KeyString is made of, for
the documentKeys the block takes (`{_id: ObjectId}`, `{_id: string}`, `{_id: binary of 16
bytes}`: batch_layout's _ID_OID, _ID_STRING, _ID_UUID), as splice_crud's `_token_key` and sort
key make them; batch_splice's `_assemble` writes them from these tables.

A token's KeyString is 0x82, the ts (seconds, then increment, big-endian), the token's fixed head,
the collection's UUID (19 bytes: 0x5a, its length, subtype 4, the 16 bytes), the operation and
the documentKey's object head (`_KEY_ID_AT` bytes in all, the same for every event), then the
`_id`: its type byte, name and type byte again (`_ID_HEADS`), its value and the ends of the
objects and of the key. A string's value is its bytes with each 0x00 written 0x00 0xFF, then
0x00 (keystring.py `_escape`), so string keys vary in length.

Why one width per block with zero padding: a block's keys are rows of a numpy array (the merge
compares and stacks rows), and a key shorter than the block's widest is padded with zero bytes.
The padding keeps the keys' order: every key ends with 0x04 (the KeyString's end), so its padded
row is still the key followed by zeros, and no key is a proper prefix of another (each value in
it is self-delimiting: fixed sizes, a size byte, or a terminator that an escaped string never
holds), so two keys differ at a byte inside both, where padding plays no part. Readers strip the
padding (trailing zeros) to get a key back.
"""

from __future__ import annotations

import numpy as np

from buckets._columnar.batch_layout import _ID_OID, _ID_STRING, _ID_UUID
from mongoformats.oplog_splice import _OP_IDENT, _TOKEN_HEAD

_KEY_TS = 1  # where a key's ts is
_OBJECT = b"\x46"  # the documentKey's object head, the last byte of a kind's key template
# "insert", "delete" and "update" have as many letters: their keys share one layout.
assert len({len(_OP_IDENT[op]) for op in ("insert", "delete", "update")}) == 1
_KEY_ID_AT = _KEY_TS + 8 + len(_TOKEN_HEAD) + 19 + len(_OP_IDENT["insert"]) + len(_OBJECT)

# By the documentKey's kind (batch_layout's _R_OK: 1 ObjectId, 2 string, 3 UUID; 0 is none):
# the `_id`'s KeyString head (type byte, name, type byte, a binary's size), where its value's
# bytes start in the documentKey's BSON, how many bytes of the BSON follow them (the string's
# terminator and the document's end), and whether its zero bytes are escaped. After the value,
# the key has as many zero bytes as the BSON has after it (a string's terminator, the ends of
# the documentKey's object and of the token's), then its end, 0x04.
_HEADS = {
    _ID_OID: b"\x64_id\x00\x64",
    _ID_STRING: b"\x3c_id\x00\x3c",
    _ID_UUID: b"\x5a_id\x00\x5a\x10",
}
_HEAD_ROOM = 8
_ID_HEADS = np.zeros(4 * _HEAD_ROOM, np.uint8)
_ID_HEAD_BYTES = np.zeros(4, np.int64)
for _kind, _head in _HEADS.items():
    _ID_HEADS[_kind * _HEAD_ROOM : _kind * _HEAD_ROOM + len(_head)] = np.frombuffer(_head, np.uint8)
    _ID_HEAD_BYTES[_kind] = len(_head)
_ID_VALUE_AT = np.array([0, 9, 13, 13], np.int64)  # {len, type, "_id\0", value...}
_ID_AFTER = np.array([0, 1, 2, 1], np.int64)
_ID_ESCAPED = np.array([0, 0, 1, 0], np.int64)
_ID_END = 0x04


def key_template(op: str, uuid_ks: bytes) -> bytes:
    """A kind's sort key up to its `_id`, with zeros where each event's ts goes."""
    key = b"".join((b"\x82", bytes(8), _TOKEN_HEAD, uuid_ks, _OP_IDENT[op], _OBJECT))
    assert len(key) == _KEY_ID_AT
    return key
