"""byte_kernels' readers by address (u8_at, i32_at, has_at, load_word) give what their array
twins (u8, i32, has, u64) give, at every position: inside the array, across its ends, outside it.
The layout and oplog walk kernels read through them; their bounds checks decide which entries
are laid out. And the writers by words (hex_at, big_endian) write what a byte at a time writes."""

from __future__ import annotations

import binascii

import numba
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from buckets._columnar.byte_kernels import (
    Bytes,
    as_bytes,
    big_endian,
    has,
    has_at,
    hex_at,
    hex_bytes_at,
    i32,
    i32_at,
    load_word,
    u8,
    u8_at,
    u64,
)


@numba.njit
def _by_address(d: Bytes, at: int, pattern: Bytes) -> tuple[int, int, bool]:
    where = (d.ctypes.data, len(d))
    return u8_at(where, at), i32_at(where, at), has_at(where, at, pattern)


@numba.njit
def _word(d: Bytes, at: int) -> np.uint64:
    return load_word(d.ctypes.data + at)


@settings(deadline=None)  # (the first example compiles the readers)
@given(
    data=st.binary(min_size=0, max_size=40),
    at=st.integers(-12, 52),
    pattern=st.binary(min_size=1, max_size=14),
)
def test_the_readers_by_address_give_what_the_array_readers_give(
    data: bytes, at: int, pattern: bytes
) -> None:
    d = as_bytes(data)
    # (a pattern taken from the data, some of the time, so that `has` is sometimes true)
    if data and at >= 0 and len(pattern) % 2:
        pattern = data[at : at + len(pattern)] or pattern
    p = as_bytes(pattern)
    assert _by_address(d, at, p) == (u8(d, at), i32(d, at), has(d, at, p))


@settings(deadline=None)
@given(data=st.binary(min_size=8, max_size=40), at=st.integers(0, 32))
def test_a_word_by_address_is_u64(data: bytes, at: int) -> None:
    d = as_bytes(data)
    at = min(at, len(data) - 8)
    assert _word(d, at) == u64(d, at)


@numba.njit
def _hexes(d: Bytes, n: int) -> tuple[Bytes, Bytes]:
    by_words, by_bytes = np.zeros(2 * n + 16, np.uint8), np.zeros(2 * n + 16, np.uint8)
    hex_at(by_words.ctypes.data + 8, d.ctypes.data, n)
    hex_bytes_at(by_bytes.ctypes.data + 8, d.ctypes.data, n)
    return by_words, by_bytes


@settings(deadline=None)
@given(data=st.binary(min_size=0, max_size=70))
def test_hex_by_words_is_hex_by_bytes_and_touches_nothing_else(data: bytes) -> None:
    by_words, by_bytes = _hexes(as_bytes(data), len(data))
    assert by_words.tobytes() == by_bytes.tobytes()
    assert by_words.tobytes() == bytes(8) + binascii.hexlify(data).upper() + bytes(8)


@numba.njit
def _swapped(d: Bytes) -> np.uint64:
    return big_endian(load_word(d.ctypes.data))


@given(data=st.binary(min_size=8, max_size=8))
def test_big_endian_reverses_a_words_bytes(data: bytes) -> None:
    assert int(_swapped(as_bytes(data))) == int.from_bytes(data, "big")
