"""The hostile frames themselves: a string stating 0x7fffffff bytes at the top level or nested, as
the proxy's parser reports it (tests/integration/test_hostile_frames.py sends them end to end)."""

from __future__ import annotations

import struct

import bson
import pytest

from mongoformats import wire


def bad_string_frame(nested: bool) -> bytes:
    """A 46-byte OP_MSG whose body holds a string stating 0x7fffffff bytes: at the top level, or
    (`nested`) one level down, where a lazily parsed RawBSONDocument does not look."""
    if nested:
        inner = _string_doc(b"b", b"abcdefg")
        body = struct.pack("<i", 5 + 3 + len(inner)) + b"\x03a\x00" + inner + b"\x00"
    else:
        body = _string_doc(b"a", b"hello world!")
    return wire.HEADER.pack(wire.HEADER.size + 5 + len(body), 1, 0, wire.OP_MSG) + bytes(5) + body


def _string_doc(key: bytes, text: bytes) -> bytes:
    """{key: text} whose string states 0x7fffffff bytes."""
    element = b"\x02" + key + b"\x00" + struct.pack("<i", 0x7FFFFFFF) + text + b"\x00"
    return struct.pack("<i", 5 + len(element)) + element + b"\x00"


def test_the_bad_string_frames_are_as_reported():
    assert len(bad_string_frame(nested=False)) == 46
    for nested in (False, True):
        frame = bad_string_frame(nested)
        # The frame is sound, its BSON not.
        assert isinstance(wire.decode_message(frame), wire.OpMsg)
        with pytest.raises(bson.errors.InvalidBSON):
            bson.decode(wire.decode_message(frame).body)
