"""OP_COMPRESSED's payloads: the compressors' ids and bounded decompression (wire.py frames them).

Spec: https://www.mongodb.com/docs/manual/reference/mongodb-wire-protocol/ (OP_COMPRESSED and
its compressor ids); the server's bound on inflation: message_compressor_manager.cpp.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Final

from mongoformats.errors import ProtocolError

__all__ = ["COMPRESSOR_IDS", "COMPRESSOR_NAMES", "compressed", "decompress"]

COMPRESSOR_IDS: Final = {"noop": 0, "snappy": 1, "zlib": 2, "zstd": 3}
COMPRESSOR_NAMES: Final = {v: k for k, v in COMPRESSOR_IDS.items()}


def compressed(inner: bytes, compressor: str, *, level: int = -1) -> bytes:
    """`inner` compressed with `compressor` ("zlib", "snappy", "zstd", "noop")."""
    if compressor == "zlib":
        packed = zlib.compress(inner, level)
    elif compressor == "snappy":
        import cramjam

        packed = bytes(cramjam.snappy.compress_raw(inner))
    elif compressor == "zstd":
        import zstandard

        packed = zstandard.ZstdCompressor().compress(inner)
    elif compressor == "noop":
        packed = inner
    else:
        raise ValueError(f"unknown compressor {compressor!r}")
    return packed


def decompress(compressor_id: int, payload: bytes, size: int) -> bytes:
    """The `size` bytes `payload` inflates to. Nothing larger is ever made: the caller has
    checked `size` against the message size limit, and each compressor is stopped one byte past
    it (a payload that inflates further is refused, whatever its own headers claim), as the
    server decompresses into a buffer of the declared size (message_compressor_manager.cpp)."""
    name = COMPRESSOR_NAMES.get(compressor_id)
    inflate = _DECOMPRESSORS.get(name) if name is not None else None
    if inflate is None:
        raise ProtocolError(f"unknown compressor id {compressor_id}")
    try:
        out = inflate(payload, size)
    except ProtocolError:
        raise
    except Exception as exc:  # each library raises its own error type for corrupt input
        raise ProtocolError(f"cannot decompress {name} payload: {exc}") from exc
    if len(out) != size:
        raise ProtocolError(f"OP_COMPRESSED uncompressedSize {size} does not match {len(out)}")
    return out


def _zlib_decompress(payload: bytes, size: int) -> bytes:
    d = zlib.decompressobj()
    out = d.decompress(payload, size + 1)
    if not d.eof:  # truncated, or more than `size` bytes in it
        raise ProtocolError(f"zlib payload does not end within uncompressedSize {size}")
    return out


def _noop_decompress(payload: bytes, size: int) -> bytes:
    return payload


def _snappy_decompress(payload: bytes, size: int) -> bytes:
    """Raw snappy starts with its uncompressed length (a varint) and its decoder allocates that
    much: the length is compared with `size` before anything is inflated."""
    import cramjam

    stated = cramjam.snappy.decompress_raw_len(payload)
    if stated != size:
        raise ProtocolError(f"snappy payload states {stated} bytes, uncompressedSize {size}")
    return bytes(cramjam.snappy.decompress_raw(payload))


# A zstd frame names the window its decoder must keep; none larger than a whole message is
# needed (a compressor's window never exceeds its input), so a larger one is refused rather
# than allocated.
_ZSTD_MAX_WINDOW: Final = 1 << 26


def _zstd_decompress(payload: bytes, size: int) -> bytes:
    """Streamed, read to one byte past `size` at most. Why not `ZstdDecompressor.decompress`
    with max_output_size: a frame that states its content size is inflated to that size,
    whatever max_output_size says."""
    import zstandard

    reader = zstandard.ZstdDecompressor(max_window_size=_ZSTD_MAX_WINDOW).stream_reader(
        payload, read_across_frames=True
    )
    pieces: list[bytes] = []
    left = size + 1
    while left > 0 and (piece := reader.read(left)):
        pieces.append(piece)
        left -= len(piece)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


# Each compressor's inflation of a payload into at most `size` bytes (see `decompress`).
_DECOMPRESSORS: dict[str, Callable[[bytes, int], bytes]] = {
    "noop": _noop_decompress,
    "zlib": _zlib_decompress,
    "snappy": _snappy_decompress,
    "zstd": _zstd_decompress,
}
