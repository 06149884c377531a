"""Compiled loops over BSON bytes (numba): the building blocks of the oplog walk and the batch
splice, which read every entry of a backlog.

Why compiled loops: reading an entry's elements one by one in Python, or for a whole batch with
numpy array operations (each operation a pass over the batch, and a few dozen of them), costs
far more than a loop compiled by numba, which reads an entry's elements where they lie and
writes its event in one pass (benchmarks/README.md). The loops stay Python source (one
definition, read and tested as such); numba compiles them on first use and caches the machine
code (buckets/_columnar/numba_cache.py says where), so a process compiles them once,
not at every start.

The loops index arrays with unsigned integers (np.uintp) only: numba checks a signed index for a
negative one (Python's from-the-end) on every access, which keeps a copy loop from compiling to
vector moves. Positions are computed as signed integers and checked to lie in the array before
they index it. Arrays are read-only where they can be:
numba then knows a read and a write cannot alias.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from buckets._columnar.numba_cache import CACHE  # picks numba's cache dir before numba loads

# isort: split
import numba
import numpy as np
import numpy.typing as npt
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = [
    "NO_REFCOUNTS",
    "Data",
    "U",
    "as_bytes",
    "big_endian",
    "byte_table",
    "copy",
    "copy_from",
    "prefetch",
    "prefetch_line",
    "has",
    "has_at",
    "hex_at",
    "hex_bytes_at",
    "hex_word_at",
    "i32",
    "i32_at",
    "load_byte",
    "load_word",
    "move",
    "put_i32",
    "store_byte",
    "store_i32",
    "store_word",
    "u8",
    "u8_at",
    "u64",
]

U = np.uintp
# For a kernel that allocates nothing (its arrays given to it): compiled without numba's
# reference counting (its CPU target option `_nrt`, numba/core/cpu.py; not in numba's stubs),
# whose atomic count of every array at every call and view costs several times a small step's
# work. A numba without that option compiles them with it: slower, the same bytes.
NO_REFCOUNTS: dict[str, Any] = (
    {"_nrt": False} if hasattr(numba.core.cpu.CPUTargetOptions, "_nrt") else {}
)
Bytes = npt.NDArray[np.uint8]
Index = int | np.integer[Any]  # a position: Python's or numpy's integer (U, in a kernel)

_HEX = np.frombuffer(b"0123456789ABCDEF", np.uint8)


def as_bytes(data: bytes | bytearray | memoryview) -> Bytes:
    """`data` as a read-only array of bytes: one array type for every kernel, whatever `data` is
    (each type is compiled on its own), and no aliasing with the arrays they write."""
    d = np.frombuffer(data, np.uint8)
    d.flags.writeable = False
    return d


def byte_table(parts: Sequence[bytes]) -> tuple[Bytes, npt.NDArray[np.int64]]:
    """Byte strings back to back, and where each starts (one more: where the last ends): how
    kernels take a table of templates or values, part k at at[k]:at[k + 1]."""
    at = np.zeros(len(parts) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, parts), np.int64, len(parts)), out=at[1:])
    return as_bytes(b"".join(parts)), at


@numba.njit(cache=CACHE)
def u8(d: Bytes, at: Index) -> int:
    """The byte at `at`, or -1 outside `d`."""
    return int(d[U(at)]) if 0 <= at < len(d) else -1


@numba.njit(cache=CACHE)
def has(d: Bytes, at: Index, pattern: Bytes) -> bool:
    """Whether `pattern` lies at `at` in `d`."""
    if at < 0 or at + len(pattern) > len(d):
        return False
    to = U(at)
    for j in range(U(len(pattern))):  # noqa: SIM110 (numba compiles a loop, not all() of a generator)
        if d[to + j] != pattern[j]:
            return False
    return True


@numba.njit(cache=CACHE)
def i32(d: Bytes, at: Index) -> int:
    """The little-endian int32 at `at`; -1 outside `d` (callers want a length of 2 or more)."""
    if at < 0 or at + 4 > len(d):
        return -1
    u = U(at)
    v = (
        np.int64(d[u])
        | (np.int64(d[u + 1]) << 8)
        | (np.int64(d[u + 2]) << 16)
        | (np.int64(d[u + 3]) << 24)
    )
    return int(v - (1 << 32) if v >= 1 << 31 else v)


@numba.njit(cache=CACHE)
def put_i32(dst: Bytes, at: Index, value: Index) -> None:
    """Write `value` as a little-endian int32 at `at`, which must lie in `dst`."""
    u = U(at)
    for j in range(U(4)):
        dst[u + j] = (value >> (8 * j)) & 255


@numba.njit(cache=CACHE)
def u64(d: Bytes, at: Index) -> np.uint64:
    """The little-endian word at `at`, which must lie in `d`."""
    u, v = U(at), np.uint64(0)
    for j in range(U(8)):
        v |= np.uint64(d[u + j]) << np.uint64(8 * j)
    return v


@numba.njit(cache=CACHE)
def copy(dst: Bytes, at: Index, src: Bytes, start: Index, n: Index) -> None:
    """dst[at:at + n] = src[start:start + n]. (A loop: numba's slice assignment costs more for
    the short copies made here.)"""
    to, start_at = U(at), U(start)
    for j in range(U(n)):
        dst[to + j] = src[start_at + j]


@intrinsic
def _memcpy(typingctx: Any, dst: Any, src: Any, n: Any) -> Any:
    """memcpy(dst, src, n) on addresses given as integers (LLVM's memcpy)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        to, start, size = args
        pointer = ir.IntType(8).as_pointer()
        cgutils.raw_memcpy(
            builder, builder.inttoptr(to, pointer), builder.inttoptr(start, pointer), size, 1
        )
        return context.get_dummy_value()

    return types.void(types.uintp, types.uintp, types.intp), codegen


@intrinsic
def _load_byte(typingctx: Any, address: Any) -> Any:
    """The byte at memory `address` (an integer), unchecked: for readers inlined into a kernel
    that take an array's address and length as integers. numba's inlining of a function that
    takes the array itself counts a reference to it at each call, which costs more than the
    read."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        pointer = builder.inttoptr(args[0], ir.IntType(8).as_pointer())
        return builder.zext(builder.load(pointer), ir.IntType(64))

    return types.int64(types.uintp), codegen


@intrinsic
def _load_word(typingctx: Any, address: Any) -> Any:
    """The little-endian 8-byte word at memory `address` (an integer), unaligned, unchecked."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        kind = ir.IntType(64)
        load = builder.load(builder.inttoptr(args[0], kind.as_pointer()))
        load.align = 1
        return load

    return types.uint64(types.uintp), codegen


def _storer(width: int) -> Any:
    """An intrinsic that stores the low `width` bits of a value at memory `address`, unaligned
    and unchecked (little-endian, as the machines numba targets here are)."""

    @intrinsic
    def store(typingctx: Any, address: Any, value: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            kind = ir.IntType(width)
            pointer = builder.inttoptr(args[0], kind.as_pointer())
            builder.store(builder.trunc(args[1], kind), pointer).align = 1
            return context.get_dummy_value()

        return types.void(types.uintp, types.int64), codegen

    return store


# The unchecked loads, stores and copies by address, for kernels that take an array's address
# once (array.ctypes.data) and keep the array alive: inlined where they are used (a cached
# function's call, or numba's inlining of a function that takes the array, costs more than the
# access). Typed here as Python sees them; numba types the intrinsics itself.
@intrinsic
def _store_word(typingctx: Any, address: Any, value: Any) -> Any:
    """Store the 8-byte word `value` (an unsigned integer) at memory `address`, unaligned and
    unchecked, little-endian."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        kind = ir.IntType(64)
        builder.store(args[1], builder.inttoptr(args[0], kind.as_pointer())).align = 1
        return context.get_dummy_value()

    return types.void(types.uintp, types.uint64), codegen


load_byte: Callable[[Index], int] = _load_byte  # type: ignore[assignment]
load_word: Callable[[Index], np.uint64] = _load_word  # type: ignore[assignment]
store_byte: Callable[[Index, Index], None] = _storer(8)
store_i32: Callable[[Index, Index], None] = _storer(32)
store_word: Callable[[Index, np.uint64], None] = _store_word  # type: ignore[assignment]
move: Callable[[Index, Index, Index], None] = _memcpy  # type: ignore[assignment]


# Readers by address: an array's address and length as integers (`Data`), inlined where they
# are used. As calls to the cached functions above (which LLVM does not inline across cached
# functions), each read costs as much as a few checks, and as functions inlined by numba that
# take the array, more (each call counts a reference to it); so kernels that read many fields
# per item take (array.ctypes.data, len(array)) once and read through these, a bounds check
# and a load each. Each gives what the reader of its name without `_at` gives.
Data = tuple[int, int]  # an array's address, its length


@numba.njit(inline="always")
def u8_at(d: Data, at: Index) -> int:
    """`u8` of the array at d[0], d[1] bytes long."""
    return load_byte(U(d[0] + at)) if 0 <= at < d[1] else -1


@numba.njit(inline="always")
def i32_at(d: Data, at: Index) -> int:
    """`i32` of the array at d[0], d[1] bytes long."""
    if at < 0 or at + 4 > d[1]:
        return -1
    u = U(d[0] + at)
    v = load_byte(u) | (load_byte(u + 1) << 8) | (load_byte(u + 2) << 16) | (load_byte(u + 3) << 24)
    return v - (1 << 32) if v >= 1 << 31 else v


@numba.njit(inline="always")
def has_at(d: Data, at: Index, pattern: Bytes) -> bool:
    """`has` of the array at d[0], d[1] bytes long (all of `pattern` is compared)."""
    if at < 0 or at + len(pattern) > d[1]:
        return False
    same, u = True, U(d[0] + at)
    for j in range(U(len(pattern))):
        same &= load_byte(u + j) == pattern[j]
    return same


@numba.njit(inline="always")
def hex_bytes_at(to: Index, source: Index, n: Index) -> None:
    """The upper-case hex digits of the n bytes at memory `source`, written at memory `to`, a
    byte at a time (what `hex_at` writes)."""
    for j in range(U(n)):
        byte = load_byte(U(source) + j)
        store_byte(U(to) + 2 * j, _HEX[U(byte >> 4)])
        store_byte(U(to) + 2 * j + 1, _HEX[U(byte & 15)])


# `_hex_word`'s masks: bytes to 16-bit lanes, their nibbles, and each nibble's digit.
_LANES_16, _LANES_8 = np.uint64(0x0000FFFF0000FFFF), np.uint64(0x00FF00FF00FF00FF)
_NIBBLES, _ONES = np.uint64(0x000F000F000F000F), np.uint64(0x0101010101010101)
_PAST_NINE, _ZEROS = np.uint64(0x7676767676767676), np.uint64(0x3030303030303030)


@numba.njit
def _hex_word(x: np.uint64) -> np.uint64:
    """The hex digits of the four bytes in x's low half (the first in its lowest byte), as the
    eight bytes of a little-endian word: each byte spread to a 16-bit lane, its high nibble in
    the lane's low byte, then each nibble made its digit (a nibble of 10 or more, plus 0x76,
    sets its byte's high bit: 7 more, from '9' + 1 to 'A'). Not inlined by numba (LLVM inlines
    it all the same): numba's inlining of each of its uses cost the block's kernel compile
    time, for no speed."""
    x &= np.uint64(0xFFFFFFFF)
    x = (x | (x << np.uint64(16))) & _LANES_16
    x = (x | (x << np.uint64(8))) & _LANES_8
    x = ((x >> np.uint64(4)) & _NIBBLES) | ((x & _NIBBLES) << np.uint64(8))
    letters = ((x + _PAST_NINE) >> np.uint64(7)) & _ONES
    return x + _ZEROS + letters * np.uint64(7)


@numba.njit(inline="always")
def hex_at(to: Index, source: Index, n: Index) -> None:
    """The upper-case hex digits of the n bytes at memory `source`, written at memory `to`:
    eight bytes' at a time, as two words (a token's hex is written for every event); the last
    eight bytes' overlap the ones before (written again, the same); fewer than eight bytes in
    all, a byte at a time (`hex_bytes_at`)."""
    if n < 8:
        hex_bytes_at(to, source, n)
        return
    for j in range(U(0), U(n - 7), U(8)):
        hex_word_at(U(to) + 2 * j, load_word(U(source) + j))
    hex_word_at(U(to) + 2 * U(n - 8), load_word(U(source) + U(n - 8)))


@numba.njit(inline="always")
def hex_word_at(to: Index, x: np.uint64) -> None:
    """The hex digits of the eight bytes of the word x (its lowest byte first) at memory `to`."""
    store_word(U(to), _hex_word(x))
    store_word(U(to) + U(8), _hex_word(x >> np.uint64(32)))


@numba.njit(inline="always")
def big_endian(x: np.uint64) -> np.uint64:
    """The word x's bytes in the other order (LLVM makes one instruction of it)."""
    x = ((x & _LANES_8) << np.uint64(8)) | ((x >> np.uint64(8)) & _LANES_8)
    x = ((x & _LANES_16) << np.uint64(16)) | ((x >> np.uint64(16)) & _LANES_16)
    return (x << np.uint64(32)) | (x >> np.uint64(32))


@intrinsic
def _prefetch(typingctx: Any, address: Any) -> Any:
    """Ask the CPU to bring the cache line at `address` in (llvm.prefetch: read, keep, data)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        pointer = ir.IntType(8).as_pointer()
        fn = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(
                ir.VoidType(), [pointer, ir.IntType(32), ir.IntType(32), ir.IntType(32)]
            ),
            "llvm.prefetch.p0i8",
        )
        builder.call(
            fn,
            [
                builder.inttoptr(args[0], pointer),
                ir.Constant(ir.IntType(32), 0),
                ir.Constant(ir.IntType(32), 3),
                ir.Constant(ir.IntType(32), 1),
            ],
        )
        return context.get_dummy_value()

    return types.void(types.uintp), codegen


prefetch_line: Callable[[Index], None] = _prefetch  # type: ignore[assignment]  # (inlined)


@numba.njit(cache=CACHE)
def prefetch(address: Index, n: Index) -> None:
    """Bring the n bytes at memory `address` towards the cache, a line (64 bytes) at a time."""
    for line in range(U(0), U(n), U(64)):
        _prefetch(U(address) + line)  # type: ignore[call-arg]


@numba.njit(cache=CACHE)
def copy_from(dst: Bytes, at: Index, address: Index, n: Index) -> None:
    """dst[at:at + n] = the n bytes at memory `address`, which must lie in dst: a gather from
    many buffers by their addresses, where a list of the buffers costs tens of nanoseconds an
    item to read in a compiled loop. The caller keeps the buffer at `address` alive."""
    _memcpy(U(dst.ctypes.data + at), U(address), n)  # type: ignore[call-arg]  # numba supplies typingctx
