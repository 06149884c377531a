"""Where a batch's plain CRUD entries keep their parts: the layout kernels of batch_splice.

Each entry's elements are checked where they must start, in the order a server writes them (see
batch_splice's docstring for the shapes), and its parts' offsets go into one row per entry;
entries whose op, ns and ui bytes are equal (and that are both updates or both replacements) are
grouped into kinds.
"""

from __future__ import annotations

from buckets._columnar.numba_cache import CACHE  # picks numba's cache dir before numba loads

# isort: split
import numba
import numpy as np
import numpy.typing as npt

from buckets._columnar.byte_kernels import (
    NO_REFCOUNTS,
    Data,
    U,
    as_bytes,
    load_word,
    prefetch_line,
)
from buckets._columnar.byte_kernels import has_at as has
from buckets._columnar.byte_kernels import i32_at as i32
from buckets._columnar.byte_kernels import u8_at as u8
from buckets._columnar.id_keys import (
    _BITS,
    _COUNT_AT,
    _ID_OID,
    _ID_STRING,
    _ID_UUID,
    _ID_WALKED,
    _MASK_AT,
    _MAX_BITS,
    _OID_VALUE,
    _UUID_VALUE,
    walk_key_at,
)
from mongoformats.oplog_splice import _OP_HEAD, _UI_HEAD, _UUID_KEY_HEAD

_Ints = npt.NDArray[np.int64]
_Bytes = npt.NDArray[np.uint8]


# The layout reads some thirty bytes, lengths and patterns of each entry, most of them joined by
# `&`: through byte_kernels' readers by address (u8_at, i32_at, has_at), inlined.
_NS = b"\x02ns\x00"
_HEAD_BYTES = len(_OP_HEAD) + 2 + len(_NS)  # op's element (its one-letter value), ns's header
# The operationType of each op a row holds (_R_OP: _INSERT, _DELETE, _UPDATE, _REPLACE).
_OPS = ("insert", "delete", "update", "replace")
_LSID = b"\x03lsid\x00"
_TXN_NUMBER = b"\x12txnNumber\x00"
_O = b"\x03o\x00"
_O2 = b"\x03o2\x00"
# An update's o up to its diff's value: {$v: 2, diff: ...} (the diff is o's last element).
_V2_DIFF = b"\x10$v\x00\x02\x00\x00\x00\x03diff\x00"
# A 22-byte document of one ObjectId _id: the usual documentKey.
_OID_KEY = b"\x16\x00\x00\x00\x07_id\x00"
_OID_KEY_BYTES = 22
_STRING_ID = b"\x02_id\x00"  # {_id: string}: its element's head (the string's length follows)
_UUID_KEY_BYTES = len(_UUID_KEY_HEAD) + 18  # {_id: binary of 16 bytes}: subtype, bytes, the end
_STMT_ID = b"\x10stmtId\x00"
_PREV_OP_TIME = b"\x03prevOpTime\x00"
# ts, t, v and wall follow, each 8 bytes (its header's offset from ts's, the header).
_STAMPS = ((0, b"\x11ts\x00"), (12, b"\x12t\x00"), (23, b"\x12v\x00"), (34, b"\x09wall\x00"))
_TS_AT, _WALL_AT, _STAMP_BYTES = 4, 40, 48
# An entry's last bytes that `_layouts` asks for ahead: a usual documentKey, the stamps, a
# prevOpTime's and a stmtId's elements lie in them (the line of its last byte too).
_TAIL_BYTES = 192

_OP_CODE_AT = len(_OP_HEAD)  # in the head: the op's letter
# In an update's o: where its diff's value is.
_DIFF_AT = 4 + len(_V2_DIFF)
# A replacement's o: the new document, its first element `_id` (a type byte, then this name).
_P_ID_NAME = as_bytes(b"_id\x00")
_DOLLAR, _LETTER_V = ord("$"), ord("v")
# A diff's top-level sections the layout kernel reads: `u` (fields set) and `i` (fields added).
_LETTER_U, _LETTER_I = ord("u"), ord("i")

# Byte patterns the kernels look for, as arrays (numba takes a global array as a constant).
_P_LSID, _P_TXN_NUMBER, _P_OP_HEAD, _P_NS, _P_UI_HEAD = map(
    as_bytes, (_LSID, _TXN_NUMBER, _OP_HEAD, _NS, _UI_HEAD)
)
_P_O, _P_O2, _P_V2_DIFF, _P_OID_KEY = map(as_bytes, (_O, _O2, _V2_DIFF, _OID_KEY))
_P_STMT_ID, _P_PREV_OP_TIME = map(as_bytes, (_STMT_ID, _PREV_OP_TIME))
_P_UUID_KEY, _P_STRING_ID = as_bytes(_UUID_KEY_HEAD), as_bytes(_STRING_ID)
_P_TS, _P_T, _P_V, _P_WALL = (as_bytes(h) for _, h in _STAMPS)
_TS_OFFSET, _T_OFFSET, _V_OFFSET, _WALL_OFFSET = (offset for offset, _ in _STAMPS)
_TXN_NUMBER_BYTES = len(_TXN_NUMBER)
_O2_BYTES = len(_O2)
_NS_BYTES = len(_NS)
_UI_ELEMENT_BYTES = len(_UI_HEAD) + 16
_STMT_ID_BYTES = len(_STMT_ID)
_PREV_OP_TIME_BYTES = len(_PREV_OP_TIME)

# The layout kernel's columns: one row per entry.
# _R_SIMPLE: an update whose updatedFields the block copies from its diff (see `_layout`), then
# _R_FIELDS: where the elements it copies are, as [start, end) twice (u's, then i's).
# _R_OK: the block takes the entry (its documentKey's kind, _ID_OID, _ID_UUID or _ID_WALKED, see
# id_keys.py; 0 for none); _R_LAID: it has the block's layout, whatever its documentKey (which
# ends at _R_KEY_END), so splice_crud's layout need not be read again. The block takes the
# documentKeys whose KeyStrings id_keys.py writes; other keys (int64s, other types) are spliced
# one by one from the layout. _R_ID_AT, _R_ID_BYTES: where the bytes that follow the kind's key
# template in the event's key are (an ObjectId's or UUID's in the entry, a walked key's
# elements in `_layouts`' `ids`), and how many.
(
    _R_OK,
    _R_OP,
    _R_P,
    _R_HEAD_END,
    _R_O_START,
    _R_O_END,
    _R_KEY,
    _R_STAMPS,
    _R_SIMPLE,
    _R_LAID,
    _R_KEY_END,
    _R_ID_AT,
    _R_ID_BYTES,
    _R_FIELDS,
) = range(14)
_ROW_WIDTH = _R_FIELDS + 4
_INSERT, _DELETE, _UPDATE, _REPLACE = 0, 1, 2, 3


# The op of an entry by its op letter's byte (u8's, plus one: -1, outside the entry, is at 0);
# `_layout` tells a "u" that replaces its document from an update.
_OP_OF_LETTER = np.full(257, -1, np.int64)
_OP_OF_LETTER[[ord("i") + 1, ord("d") + 1, ord("u") + 1]] = _INSERT, _DELETE, _UPDATE


@numba.njit(inline="always")
def _update_op(data: _Bytes, d: Data, o_start: int, o_end: int) -> int:
    """_UPDATE if an update's o (in [o_start, o_end), inside the entry) is {$v: 2, diff}, the
    diff ending where o does; else _REPLACE if it is a replacement's: a document led by its
    `_id` that holds the bytes `$v\0` nowhere (so no `$v` field), as splice_crud's `_diff_at`
    tells it without walking o; else -1 (splice_crud's to judge).

    Inlined into `_layout` (a call between compiled functions costs as much as its checks), a
    function of its own to keep `_layout`'s complexity down. The replacement's scan is a loop
    over `data`'s bytes (indexed by unsigned integers, in `data`: o lies in the entry) with no
    early exit, whose three comparisons per place are or'ed into one flag as booleans: LLVM
    compiles that loop to vector compares of a few dozen places a step, where words of eight
    places, as shifts and masks, took several times as long. o's first 4 KB are asked for a
    cache line at a time first: a backlog's entries are read from memory, not the cache, and
    the lines' fetches then overlap (the CPU's own prefetcher ramps up after several misses,
    most of a document of a few KB, and follows a longer one's rest)."""
    diff = o_start + _DIFF_AT
    diff_length = i32(d, diff)
    if (
        (5 <= diff_length <= o_end - diff - 1)
        & (diff + diff_length + 1 == o_end)
        & (u8(d, o_end - 1) == 0)
        & has(d, o_start + 4, _P_V2_DIFF)
    ):
        return _UPDATE
    for line in range(U(d[0] + o_start), U(d[0] + min(o_end, o_start + 4096)), U(64)):
        prefetch_line(line)
    dollar_v = False
    for j in range(U(o_start), U(o_end - 2)):  # (a place's last byte is o's, at o_end - 1)
        dollar_v |= (data[j] == _DOLLAR) & (data[j + U(1)] == _LETTER_V) & (data[j + U(2)] == 0)
    replaced = (not dollar_v) & (u8(d, o_start + 4) >= 1) & has(d, o_start + 5, _P_ID_NAME)
    return _REPLACE if replaced else -1


@numba.njit(inline="always")
def _simple_diff(d: Data, diff: int, o_end: int, expanded: bool, rows: _Ints, i: int) -> bool:
    """Whether an update's diff (at `diff`, ending where its o does, at `o_end`) is one of the
    usual ones, which the block copies unless the stream is `expanded`: top-level `u` and `i`
    documents alone, in either order, each once (a $set of existing or new fields, an $inc of
    missing ones). updatedFields is then u's elements, then i's (diff_splice's `_top_level`),
    copied from where this puts their ranges in row i of `rows` (whatever it says). A second
    section is there unless the first ends where the diff's terminating zero is.

    Inlined into `_layout` for updates only, a function of its own so that its checks can be
    joined by `and` (`_layout`'s complexity leaves it none): each check then guards the reads
    after it, and the compiled code costs a fraction of the same checks joined by `&`."""
    first = diff + 4
    first_length = i32(d, first + 3)
    second = first + 3 + first_length
    second_length = i32(d, second + 3)
    two = second != o_end - 2
    letter = u8(d, first + 1)
    ends = second + (3 + second_length) * two
    # Each section's elements, u's range first: arithmetic, not branches (one range is empty
    # for a diff of one section).
    swap = 2 * (letter == _LETTER_I)
    rows[i, _R_FIELDS + swap], rows[i, _R_FIELDS + swap + 1] = first + 7, second - 1
    rows[i, _R_FIELDS + 2 - swap] = (second + 7) * two
    rows[i, _R_FIELDS + 3 - swap] = (ends - 1) * two
    return (
        (not expanded)
        and u8(d, first) == 3
        and ((letter == _LETTER_U) | (letter == _LETTER_I))
        and u8(d, first + 2) == 0
        and first_length >= 5
        and second <= o_end - 2
        and u8(d, second - 1) == 0
        and (
            (not two)
            or (
                u8(d, second) == 3
                and letter + u8(d, second + 1) == _LETTER_U + _LETTER_I
                and u8(d, second + 2) == 0
                and second_length >= 5
                and u8(d, ends - 1) == 0
            )
        )
        and ends == o_end - 2
        and u8(d, o_end - 2) == 0
    )


@numba.njit(cache=CACHE, **NO_REFCOUNTS)
def _layout(data: _Bytes, start: int, length: int, expanded: bool, rows: _Ints, i: int) -> None:
    """Fill row i of `rows` with where an entry's parts are if it has the layout of a plain
    insert, update, replacement or delete (_R_LAID 1; _R_OK the kind of its documentKey if the
    block takes it; _R_OP its op), checking each element where it must start, as
    splice_crud's fixed layout does; every boundary comes from the entry's own lengths, so it is
    laid out only if it is exactly that sequence.

    One compiled function (its parts inlined), not one per part: a call between compiled
    functions costs about as much as the checks it would hold, and this runs once per oplog
    entry; it writes `rows` in place, where a view of the row would cost a reference count, and
    it is compiled without reference counts (byte_kernels.NO_REFCOUNTS: it allocates nothing).
    Each part's checks are joined by `&`, which reads them all: every read (u8, i32, has) is
    bounds-checked, so an offset taken from a failed check only fails the others."""
    d = (data.ctypes.data, len(data))
    end = start + length - 1  # where its terminating zero must be
    if (length < 5 + _HEAD_BYTES + 4) | (u8(d, end) != 0):
        return
    p = start + 4
    if has(d, p, _P_LSID):  # a retryable write's lsid and txnNumber lead (OplogEntryBase's order)
        lsid = i32(d, start + 10)
        p = start + 10 + lsid
        if not ((5 <= lsid <= length - 40) & has(d, p, _P_TXN_NUMBER)):
            return
        p += _TXN_NUMBER_BYTES + 8
    # op (one letter), ns, ui, then o's header.
    op = _OP_OF_LETTER[u8(d, p + _OP_CODE_AT) + 1]
    ns = i32(d, p + _HEAD_BYTES)
    head_end = p + _HEAD_BYTES + 4 + ns + _UI_ELEMENT_BYTES
    o_start = head_end + 3
    o_length = i32(d, o_start)
    o_end = o_start + o_length
    if not (
        has(d, p, _P_OP_HEAD)
        & (u8(d, p + _OP_CODE_AT + 1) == 0)
        & (op >= 0)
        & has(d, p + _HEAD_BYTES - _NS_BYTES, _P_NS)
        & (2 <= ns <= end - p)
        & has(d, head_end - _UI_ELEMENT_BYTES, _P_UI_HEAD)
        & has(d, head_end, _P_O)
        & (5 <= o_length <= end - o_start)
    ):
        return
    simple = False
    if op == _UPDATE:  # or a replacement: o is not {$v: 2, diff}
        op = _update_op(data, d, o_start, o_end)
        if op == _UPDATE:
            simple = _simple_diff(d, o_start + _DIFF_AT, o_end, expanded, rows, i)
    if op < 0:
        return
    # The documentKey: a delete's o; an insert's, an update's and a replacement's o2 (an
    # insert's and a replacement's o is its document). ts, t, v and wall follow it, after a
    # stmtId if there is one.
    delete = op == _DELETE
    key = o_start if delete else o_end + _O2_BYTES
    key_length = i32(d, key)
    key_end = key + key_length
    stamps = key_end + has(d, key_end, _P_STMT_ID) * (_STMT_ID_BYTES + 4)
    if not (
        (delete | has(d, o_end, _P_O2))
        & (5 <= key_length <= end - key)
        & (u8(d, key_end - 1) == 0)
        & has(d, stamps + _TS_OFFSET, _P_TS)
        & has(d, stamps + _T_OFFSET, _P_T)
        & has(d, stamps + _V_OFFSET, _P_V)
        & has(d, stamps + _WALL_OFFSET, _P_WALL)
    ):
        return
    # prevOpTime, if there is one, fills the rest of the entry exactly.
    after = stamps + _STAMP_BYTES
    prev_length = i32(d, after + _PREV_OP_TIME_BYTES)
    if (after != end) & (
        not (
            has(d, after, _P_PREV_OP_TIME)
            & (prev_length >= 5)
            & (after + _PREV_OP_TIME_BYTES + prev_length == end)
        )
    ):
        return
    # Which documentKey it is, checked as splice_crud's `_token_key` checks it: an ObjectId, a
    # UUID or a string `_id` (the value's bytes are the key's own); any other is walked by
    # `_layouts`.
    # (`and`: a pattern is compared only where the length says it may lie)
    oid = key_length == _OID_KEY_BYTES and has(d, key, _P_OID_KEY)
    uuid = key_length == _UUID_KEY_BYTES and has(d, key, _P_UUID_KEY)
    # A string `_id` of no zero byte: its KeyString is its bytes and terminator, where they lie.
    string, n = False, 0
    if not (oid | uuid):
        n = i32(d, key + 9)
        string = (
            has(d, key + 4, _P_STRING_ID)
            & (n >= 1)
            & (13 + n == key_length - 1)
            & (u8(d, key_end - 2) == 0)
        )
        for j in range(U(key + 13), U(key + 12 + n * string)):
            string &= data[j] != 0
    rows[i, _R_OK] = oid * _ID_OID + uuid * _ID_UUID + string * _ID_STRING
    rows[i, _R_ID_AT] = key + _OID_VALUE[0] + (uuid | string) * (_UUID_VALUE[0] - _OID_VALUE[0])
    rows[i, _R_ID_BYTES] = (
        _OID_VALUE[1] + uuid * (_UUID_VALUE[1] - _OID_VALUE[1]) + string * (n - _OID_VALUE[1])
    )
    rows[i, _R_OP], rows[i, _R_P], rows[i, _R_HEAD_END] = op, p, head_end
    rows[i, _R_O_START], rows[i, _R_O_END] = o_start, o_end
    rows[i, _R_KEY], rows[i, _R_STAMPS], rows[i, _R_SIMPLE] = key, stamps, simple
    rows[i, _R_LAID], rows[i, _R_KEY_END] = 1, key_end


@numba.njit(cache=CACHE, **NO_REFCOUNTS)
def _walk(d: _Bytes, rows: _Ints, i: int, ids: _Bytes, used: int, stack: _Ints) -> int:
    """Walk the documentKey of a laid-out entry the layout did not key (see `_layout`)
    into ids[used:] (id_keys.walk_key_at, inlined): its row gets its kind (with its type bits,
    see id_keys.py) and where its KeyString elements are, if walk_key takes it. Where they end."""
    end = walk_key_at((d.ctypes.data, len(d)), rows[i, _R_KEY], ids, used, stack)
    count, bits = stack[_BITS], stack[_BITS + 1]
    typed = (bits != 0) * ((count << _COUNT_AT) | (bits << _MASK_AT))
    rows[i, _R_OK] = (_ID_WALKED | typed) * ((end >= 0) & ((bits == 0) | (count <= _MAX_BITS)))
    rows[i, _R_ID_AT], rows[i, _R_ID_BYTES] = used, end - used
    return max(used, end)


@numba.njit(inline="always")
def _same(a: int, b: int, n: int) -> bool:
    """Whether the n bytes (8 or more) at memory `a` and `b` are the same: compared as words,
    the last one overlapping the one before it."""
    same = load_word(U(a + n - 8)) == load_word(U(b + n - 8))
    for j in range(0, n - 8, 8):
        same &= load_word(U(a + j)) == load_word(U(b + j))
    return same


@numba.njit(cache=CACHE, nogil=True)
def _layouts(
    d: _Bytes, starts: _Ints, lengths: _Ints, expanded: bool
) -> tuple[_Ints, _Ints, _Ints, _Bytes]:
    """Each entry's layout row (see _layout); which kind it is (an index, -1 for an entry not
    taken); the first entry of each kind; and the walked documentKeys' KeyString elements (see
    id_keys.py), back to back. A kind is the entry's bytes from op to ui, its op (an update's
    and a replacement's bytes are alike) and its documentKey's kind (a kind's templates hold its
    `_id`'s head): found by a fingerprint (the length, the
    word after the ns's length, the last two words: the UUID's) in an open-addressed table, then
    compared in full."""
    n = len(starts)
    rows = np.zeros((n, _ROW_WIDTH), np.int64)
    which = np.full(n, -1, np.int64)
    firsts = np.empty(n, np.int64)
    kinds = 0
    slots = 1
    while slots < 2 * n:
        slots *= 2
    table = np.full(slots, -1, np.int64)  # a kind's index, or -1
    mask = np.uint64(slots - 1)
    # Room for the walked keys: twice their length (see walk_key), which their entries hold.
    ids, used, stack = np.empty(2 * len(d), np.uint8), 0, np.empty(_BITS + 2, np.int64)
    base = np.int64(d.ctypes.data)  # (the heads the kinds compare lie in their laid-out entries)
    for i in range(U(n)):
        # The lines the layout reads of the entry eight ahead (its head's two; its last
        # _TAIL_BYTES', which hold its documentKey, stamps and prevOpTime, and an insert's o2
        # after its document), asked for now: entries of a kilobyte or more are far apart for the
        # CPU to guess them, and a backlog's batch of megabytes comes from memory (eight entries'
        # work is about its wait).
        ahead = min(i + U(8), U(n - 1))
        prefetch_line(U(base + starts[ahead]))
        prefetch_line(U(base + starts[ahead] + 64))
        last = base + starts[ahead] + lengths[ahead]
        for line in range(U(last - _TAIL_BYTES), U(last), U(64)):
            prefetch_line(line)
        prefetch_line(U(last - 1))
        _layout(d, starts[i], lengths[i], expanded, rows, i)
        if (rows[i, _R_LAID] != 0) & (
            rows[i, _R_OK] == 0
        ):  # another documentKey: walked, if it can be
            used = _walk(d, rows, i, ids, used, stack)
        if not rows[i, _R_OK]:
            continue
        p, stop, id_kind, op = rows[i, _R_P], rows[i, _R_HEAD_END], rows[i, _R_OK], rows[i, _R_OP]
        fingerprint = (
            (np.uint64(stop - p + (op << 28) + (id_kind << 32)) * np.uint64(0x9E3779B97F4A7C15))
            ^ load_word(U(base + p + _HEAD_BYTES + 4))
            ^ (load_word(U(base + stop - 16)) * np.uint64(0xC2B2AE3D27D4EB4F))
            ^ load_word(U(base + stop - 8))
        )
        slot = (fingerprint ^ (fingerprint >> np.uint64(29))) & mask
        while True:
            kind = table[slot]
            if kind < 0:
                table[slot] = kinds
                firsts[U(kinds)] = i
                which[i] = kinds
                kinds += 1
                break
            first = U(firsts[U(kind)])
            q = rows[first, _R_P]
            if (
                (rows[first, _R_OK] == id_kind)
                & (rows[first, _R_OP] == op)
                & (rows[first, _R_HEAD_END] - q == stop - p)
            ) and _same(base + p, base + q, stop - p):
                which[i] = kind
                break
            slot = (slot + np.uint64(1)) & mask
    return rows, which, firsts[:kinds], ids[: U(used)]
