"""Wire framing: every decoder on the whole input, one byte at a time, and with trailing bytes."""

import struct

import bson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mongoformats import wire
from mongoformats.errors import ProtocolError

BODY = bson.encode({"insert": "c", "$db": "test"})
DOCS = (bson.encode({"_id": 1}), bson.encode({"_id": 2, "x": "y"}))


def frames():
    yield wire.encode_op_msg(7, 0, BODY)
    yield wire.encode_op_msg(
        8, 3, BODY, flags=wire.FLAG_MORE_TO_COME, sequences=(("documents", DOCS),)
    )
    yield wire.encode_op_msg(9, 0, BODY, flags=wire.FLAG_CHECKSUM_PRESENT)
    yield wire.encode_op_query(10, "admin.$cmd", bson.encode({"isMaster": 1}))
    yield wire.encode_op_reply(11, 10, (bson.encode({"ismaster": True, "ok": 1.0}),))
    for comp in ("zlib", "snappy", "zstd", "noop"):
        yield wire.compress(wire.encode_op_msg(12, 0, BODY, sequences=(("documents", DOCS),)), comp)


def feed(chunks):
    framer = wire.MessageFramer()
    out = []
    for chunk in chunks:
        framer.receive_data(chunk)
        while (msg := framer.next_message()) is not wire.NEED_DATA:
            out.append(msg)
    return out, framer


@pytest.mark.parametrize("frame", list(frames()))
def test_whole_bytewise_and_trailing(frame):
    whole, _ = feed([frame])
    bytewise, _ = feed([frame[i : i + 1] for i in range(len(frame))])
    assert whole == bytewise and len(whole) == 1
    trailing, framer = feed([frame + b"\x10\x00"])
    assert trailing == whole
    assert framer.trailing_data == b"\x10\x00"


def test_op_msg_fields_round_trip():
    [msg], _ = feed(
        [
            wire.encode_op_msg(
                8, 3, BODY, flags=wire.FLAG_MORE_TO_COME, sequences=(("documents", DOCS),)
            )
        ]
    )
    assert isinstance(msg, wire.OpMsg)
    assert (msg.request_id, msg.response_to, msg.more_to_come, msg.body) == (8, 3, True, BODY)
    assert msg.sequences == (("documents", DOCS),)


def test_compressed_remembers_compressor():
    [msg], _ = feed([wire.compress(wire.encode_op_msg(1, 0, BODY), "zlib")])
    assert msg.compressor == "zlib" and msg.body == BODY


def test_op_query_and_reply_fields():
    [q], _ = feed([wire.encode_op_query(5, "admin.$cmd", BODY)])
    assert (
        isinstance(q, wire.OpQuery) and q.full_collection_name == "admin.$cmd" and q.query == BODY
    )
    [r], _ = feed([wire.encode_op_reply(6, 5, DOCS)])
    assert isinstance(r, wire.OpReply) and r.documents == DOCS and r.response_to == 5


@pytest.mark.parametrize("frame", list(frames()))
def test_a_frame_taken_whole_with_room_after_it_gives_the_body_in_place(frame):
    """next_frame(pad) gives each message's bytes and `pad` zero bytes, however it arrived; a plain
    OP_MSG's body is found where it lies, any other message is left to decode_message."""
    for pieces in ([frame + frame], [frame[i : i + 7] for i in range(0, len(frame), 7)] + [frame]):
        framer = wire.MessageFramer()
        for piece in pieces:
            framer.receive_data(piece)
        for pad in (0, 256):
            got = framer.next_frame(pad)
            assert got == frame + bytes(pad)
            span = wire.op_msg_body_span(got)
            msg = wire.decode_message(frame)
            plain = isinstance(msg, wire.OpMsg) and not msg.sequences and msg.compressor is None
            assert (span is not None) == plain
            if span is not None:
                assert got[span[0] : span[1]] == msg.body
        assert framer.next_frame() is wire.NEED_DATA


@pytest.mark.parametrize("cut", [4, 5, 100, 7000])
def test_a_large_frame_is_handed_over_as_a_buffer_to_receive_the_rest_into(cut):
    """frame_buffer: once a large frame's length has come (whether its first piece held 4 bytes
    or more, over one piece or several), the framer hands what came over in a buffer of the
    frame's size plus pad; the caller receives the rest into it, and the framer goes on with the
    next frame."""
    frame = wire.encode_op_msg(3, 0, bson.encode({"pad": "x" * 10_000}))
    framer = wire.MessageFramer()
    assert framer.frame_buffer(256, 1000) is None  # nothing yet
    for piece in (frame[:2], frame[2 : cut // 2 + 2], frame[cut // 2 + 2 : cut]):
        if piece:  # (an empty piece is the end of the stream)
            framer.receive_data(piece)
    assert framer.frame_buffer(256, len(frame) + 1) is None  # smaller than asked: next_frame's
    buffer, filled, length = framer.frame_buffer(256, 1000)
    assert (filled, length, len(buffer), framer.buffered) == (cut, len(frame), len(frame) + 256, 0)
    buffer[filled:length] = frame[filled:]
    assert bytes(buffer) == frame + bytes(256) and wire.op_msg_body_span(
        buffer
    ) == wire.op_msg_body_span(frame)
    framer.receive_data(frame)
    assert (
        framer.frame_buffer(256, 1000) is None and framer.next_frame() == frame
    )  # all here: no buffer


@pytest.mark.parametrize(
    "name",
    [
        "bad checksum",
        "unknown required flag",
        "unknown section kind",
        "bson length past frame",
        "no kind-0 section",
    ],
)
def test_a_bad_op_msg_taken_in_place_raises_protocol_error(name):
    with pytest.raises(ProtocolError):
        wire.op_msg_body_span(BAD[name] + bytes(256))


def _mutate(frame: bytes, offset: int, value: bytes) -> bytes:
    return frame[:offset] + value + frame[offset + len(value) :]


BAD = {
    "length too small": struct.pack("<iiii", 16, 1, 0, 2013),
    "length too large": struct.pack("<iiii", 48_000_001, 1, 0, 2013),
    "unknown opcode": struct.pack("<iiii", 21, 1, 0, 9999) + b"\x00" * 5,
    "bad checksum": _mutate(
        wire.encode_op_msg(9, 0, BODY, flags=wire.FLAG_CHECKSUM_PRESENT), 24, b"\xff"
    ),
    "unknown required flag": _mutate(wire.encode_op_msg(1, 0, BODY), 16, struct.pack("<I", 1 << 4)),
    "unknown section kind": _mutate(wire.encode_op_msg(1, 0, BODY), 20, b"\x07"),
    "bson length past frame": _mutate(wire.encode_op_msg(1, 0, BODY), 21, struct.pack("<i", 9999)),
    "no kind-0 section": struct.pack("<iiiiI", 20, 1, 0, 2013, 0),
    "compressed garbage": struct.pack("<iiiiiiB", 30, 1, 0, 2012, 2013, 10, 2) + b"garbage!",
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_frames_raise_protocol_error(name):
    with pytest.raises(ProtocolError):
        feed([BAD[name]])


def test_eof_mid_message():
    frame = wire.encode_op_msg(1, 0, BODY)
    framer = wire.MessageFramer()
    framer.receive_data(frame[:10])
    assert framer.next_message() is wire.NEED_DATA
    framer.receive_data(b"")
    with pytest.raises(ProtocolError):
        framer.next_message()


@given(cuts=st.lists(st.integers(min_value=0, max_value=2_000), max_size=40))
def test_any_split_of_a_stream_gives_the_same_messages(cuts):
    """The framer cuts frames out of the chunks they arrive in: a frame in one chunk, a frame
    across many, several in one, a length split between two."""
    stream = b"".join(frames())
    expected, _ = feed([stream])
    at = sorted({min(c, len(stream)) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *at], [*at, len(stream)], strict=True) if b > a]
    got, framer = feed(chunks)
    assert got == expected and framer.trailing_data == b""
