"""Bounded work per frame: compressed messages inflate to their declared size and no further,
and a frame larger than the framer's (lowered) limit is refused before it is buffered.

The server decompresses into a buffer of the declared uncompressedSize, refuses a declared size
past maxMessageSizeBytes and fails the message when the result is not exactly that size
(src/mongo/transport/message_compressor_manager.cpp, decompressMessage).
"""

from __future__ import annotations

import struct
import tracemalloc
import zlib

import bson
import cramjam
import pytest
import zstandard

from mongoformats import wire
from mongoformats.errors import ProtocolError

BODY = bson.encode({"ping": 1, "$db": "admin"})
INNER = wire.encode_op_msg(1, 0, BODY)[wire.HEADER.size :]  # what a compressed OP_MSG wraps
# Inflates to more than any message may hold; compresses to a few hundred KB at most.
BOMB_BYTES = 64 << 20


def compressed_frame(
    compressor: str, payload: bytes, declared: int, original: int = wire.OP_MSG
) -> bytes:
    """An OP_COMPRESSED frame holding `payload` as is, claiming `declared` uncompressed bytes."""
    body = struct.pack("<iiB", original, declared, wire.COMPRESSOR_IDS[compressor]) + payload
    return wire.HEADER.pack(wire.HEADER.size + len(body), 1, 0, wire.OP_COMPRESSED) + body


def packed(compressor: str, data: bytes) -> bytes:
    if compressor == "zlib":
        return zlib.compress(data)
    if compressor == "snappy":
        return bytes(cramjam.snappy.compress_raw(data))
    if compressor == "zstd":  # the frame states its content size (zstd's one-shot default)
        return zstandard.ZstdCompressor().compress(data)
    if compressor == "zstd-unsized":
        return zstandard.ZstdCompressor(write_content_size=False).compress(data)
    raise AssertionError(compressor)


def bomb(compressor: str, declared: int = len(INNER)) -> bytes:
    """A small frame whose payload inflates to BOMB_BYTES, claiming `declared` bytes."""
    return honest_or(compressor, INNER + bytes(BOMB_BYTES), declared)


def honest_or(compressor: str, data: bytes, declared: int | None = None) -> bytes:
    """`data` compressed into a frame claiming `declared` uncompressed bytes (None: the truth)."""
    size = len(data) if declared is None else declared
    return compressed_frame(compressor.removesuffix("-unsized"), packed(compressor, data), size)


def peak_while(fn) -> int:
    """The peak of Python-tracked allocations (bytes objects included) while fn() runs."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


COMPRESSORS = ["zlib", "snappy", "zstd", "zstd-unsized"]


@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_a_payload_inflating_past_its_declared_size_is_refused_without_inflating_it(compressor):
    """A payload of a few KB inflating to 64 MiB, its header claiming a few bytes: the frame is
    refused, and what was allocated meanwhile stays near the declared size."""
    frame = bomb(compressor)
    assert len(frame) < 4 << 20  # snappy compresses 21:1 at best

    def decode():
        with pytest.raises(ProtocolError):
            wire.decode_message(frame)

    assert peak_while(decode) < 2 * len(frame) + (1 << 20)  # the payload cut from its frame


@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_a_declared_size_past_the_message_limit_is_refused(compressor):
    frame = bomb(compressor, declared=wire.MAX_MESSAGE_SIZE)  # header + size > maxMessageSizeBytes
    with pytest.raises(ProtocolError, match="out of range"):
        wire.decode_message(frame)
    with pytest.raises(ProtocolError, match="out of range"):  # negative: a size_t past any limit
        wire.decode_message(compressed_frame("zlib", zlib.compress(INNER), -1))


@pytest.mark.parametrize("compressor", COMPRESSORS)
@pytest.mark.parametrize("delta", [-1, 1])
def test_a_payload_that_is_not_exactly_its_declared_size_is_refused(compressor, delta):
    frame = honest_or(compressor, INNER, len(INNER) + delta)
    with pytest.raises(ProtocolError):
        wire.decode_message(frame)


@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_an_honest_compressed_message_decodes(compressor):
    frame = honest_or(compressor, INNER)
    msg = wire.decode_message(frame)
    assert isinstance(msg, wire.OpMsg) and msg.body == BODY


def test_two_zstd_frames_make_one_payload():
    """A zstd payload may be several frames back to back (the library reads across them)."""
    half = len(INNER) // 2
    payload = packed("zstd", INNER[:half]) + packed("zstd", INNER[half:])
    assert wire.decode_message(compressed_frame("zstd", payload, len(INNER))).body == BODY


def test_a_zstd_frame_asking_for_a_window_larger_than_any_message_is_refused():
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=30, write_content_size=0)
    streamed = zstandard.ZstdCompressor(compression_params=params).compressobj()  # size unknown
    payload = streamed.compress(INNER) + streamed.flush()
    assert zstandard.get_frame_parameters(payload).window_size == 1 << 30
    with pytest.raises(ProtocolError):
        wire.decode_message(compressed_frame("zstd", payload, len(INNER)))


def test_a_lowered_max_size_refuses_a_frame_from_its_header_alone():
    """A caller lowers `max_size` (the proxy, before a client has logged in): a frame stating more
    is refused from its first 4 bytes, before its body is buffered; one within the limit, and a
    compressed one declaring more inside it, are judged against the same limit."""
    framer = wire.MessageFramer()
    framer.max_size = 1024
    framer.receive_data(struct.pack("<i", 2048))
    with pytest.raises(ProtocolError, match="out of range"):
        framer.next_message()
    framer = wire.MessageFramer()
    framer.max_size = 1024
    framer.receive_data(honest_or("zlib", INNER + bytes(2000)))
    with pytest.raises(ProtocolError, match="out of range"):
        framer.next_message()
    framer = wire.MessageFramer()
    framer.max_size = 1024
    framer.receive_data(wire.encode_op_msg(1, 0, BODY))
    assert isinstance(framer.next_message(), wire.OpMsg)
