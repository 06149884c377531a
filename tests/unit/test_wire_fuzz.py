"""Fuzzing the wire framer and the command parsing after it (target: tests/fuzz/wire_target.py):
arbitrary bytes, and valid frames of every kind with bytes flipped, lengths and sizes lying,
frames cut short or padded, compressed frames claiming the wrong size, BSON strings stating the
wrong length, each stream cut into arbitrary pieces. Every outcome is a message, a ProtocolError
(the connection closes) or a MongoError (an error reply), and nothing allocates much more than
the framer's size limit.

CI runs a short pass (WIRE_FUZZ_EXAMPLES, default 300 per test: a few seconds). A long run:

    WIRE_FUZZ_EXAMPLES=500000 nice -n 19 .venv/bin/python -m pytest -q -p no:cacheprovider \\
        tests/unit/test_wire_fuzz.py

or, coverage-guided (atheris, libFuzzer's mutations from the same seeds), see
tests/fuzz/atheris_wire.py.
"""

from __future__ import annotations

import os
import struct
import tracemalloc

import bson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mongoformats import wire
from tests.fuzz.wire_target import INTERESTING_INT32, LIMIT, SEEDS, consume, mutate

EXAMPLES = int(os.environ.get("WIRE_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# What one input may make the framer and the parsers hold at once: a frame of LIMIT bytes, the
# message it inflates to (LIMIT at most), their copies while a body is cut out, and slack.
MEMORY_BOUND = 6 * LIMIT

cuts = st.lists(st.integers(0, 4096), max_size=8)
edits = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 1 << 16), st.integers(0, 1 << 16)),
    min_size=1,
    max_size=6,
)


def consume_bounded(data: bytes, pieces: list[int]) -> None:
    """consume(), its allocations' peak checked (tracemalloc counts bytes objects and the
    decompressors' output, which all go through Python's allocator)."""
    tracemalloc.start()
    try:
        consume(data, pieces)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_BOUND + 4 * len(data), f"{peak} bytes held for an input of {len(data)}"


@FUZZ
@given(data=st.binary(max_size=2048), pieces=cuts)
def test_arbitrary_bytes(data, pieces):
    consume_bounded(data, pieces)


@FUZZ
@given(
    header=st.tuples(
        st.sampled_from(INTERESTING_INT32 + [64, 100]),
        st.integers(-2, 2),
        st.sampled_from([wire.OP_MSG, wire.OP_QUERY, wire.OP_REPLY, wire.OP_COMPRESSED, 0]),
    ),
    rest=st.binary(max_size=512),
    pieces=cuts,
)
def test_arbitrary_bytes_behind_a_plausible_header(header, rest, pieces):
    length, request_id, op_code = header
    consume_bounded(wire.HEADER.pack(length, request_id, 0, op_code) + rest, pieces)


@FUZZ
@given(seed=st.sampled_from(SEEDS), edits=edits, pieces=cuts)
def test_mutated_valid_frames(seed, edits, pieces):
    consume_bounded(mutate(seed, edits), pieces)


@FUZZ
@given(seeds=st.lists(st.sampled_from(SEEDS), min_size=2, max_size=4), edits=edits, pieces=cuts)
def test_mutated_streams_of_frames(seeds, edits, pieces):
    consume_bounded(mutate(b"".join(seeds), edits), pieces)


@FUZZ
@given(
    compressor=st.sampled_from(["zlib", "snappy", "zstd", "noop"]),
    fill=st.one_of(st.integers(0, 2 * LIMIT), st.sampled_from([LIMIT - 64, 8 * LIMIT, 16 * LIMIT])),
    declared=st.one_of(
        st.integers(-8, 64), st.integers(LIMIT - 64, LIMIT + 64), st.integers(-(2**31), 2**31 - 1)
    ),
    pieces=cuts,
)
def test_compressed_frames_with_lying_sizes(compressor, fill, declared, pieces):
    """A compressed OP_MSG whose body inflates to up to 16 MiB (16x the limit) claims any size."""
    inner = wire.encode_op_msg(1, 0, bson.encode({"ping": 1, "pad": bytes(fill)}))
    frame = wire.compress(inner, compressor)
    if len(frame) > LIMIT:  # uncompressible (noop): not a bomb, just too large
        frame = frame[:LIMIT]
    consume_bounded(frame[:20] + struct.pack("<i", declared) + frame[24:], pieces)


@FUZZ
@given(
    length=st.one_of(st.sampled_from(INTERESTING_INT32), st.integers(-(2**31), 2**31 - 1)),
    where=st.sampled_from(["top", "nested", "sequence", "query"]),
    pieces=cuts,
)
def test_bson_strings_stating_the_wrong_length(length, where, pieces):
    bad = struct.pack("<i", 25) + b"\x02a\x00" + struct.pack("<i", length) + b"hello world!\x00\x00"
    if where == "top":
        frame = wire.HEADER.pack(21 + len(bad), 1, 0, wire.OP_MSG) + bytes(5) + bad
    elif where == "nested":
        body = struct.pack("<i", 8 + len(bad)) + b"\x03x\x00" + bad + b"\x00"
        frame = wire.HEADER.pack(21 + len(body), 1, 0, wire.OP_MSG) + bytes(5) + body
    elif where == "sequence":
        frame = wire.encode_op_msg(
            1, 0, bson.encode({"insert": "c", "$db": "t"}), sequences=(("documents", (bad,)),)
        )
    else:
        frame = wire.encode_op_query(1, "admin.$cmd", bad)
    consume_bounded(frame, pieces)
