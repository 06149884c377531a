"""Coverage-guided fuzzing of the wire framer and the command parsing after it (the target of
tests/unit/test_wire_fuzz.py: tests/fuzz/wire_target.py), with atheris (libFuzzer). For long runs;
CI runs the hypothesis tests instead. Install atheris (`pip install atheris`), then:

    mkdir -p /tmp/wire-corpus
    PYTHONPATH=$PWD nice -n 19 .venv/bin/python tests/fuzz/atheris_wire.py -runs=1000000 \\
        -rss_limit_mb=2048 -print_final_stats=1 /tmp/wire-corpus

The corpus starts from the target's seeds (valid frames of every kind and hostile ones). An
input's first byte says how many cuts (0-3) split the stream into receives, the next two bytes
per cut where; the rest is the stream. A finding is any exception other than ProtocolError and
MongoError (the target lets those two end an input), an allocation past the target's bound
(checked on every input, as the hypothesis tests do), or libFuzzer's RSS limit; libFuzzer
writes the input as crash-<sha1> for tests/fuzz/wire_target.consume to replay.
"""

from __future__ import annotations

import os
import sys
import tracemalloc

import atheris

with atheris.instrument_imports(include=["mongoformats", "wireproxy", "simcluster", "tests.fuzz"]):
    from tests.fuzz.wire_target import LIMIT, SEEDS, consume

MEMORY_BOUND = 6 * LIMIT  # as tests/unit/test_wire_fuzz.py


def split(data: bytes) -> tuple[bytes, list[int]]:
    """(the stream, where it is cut) of a fuzz input (see the module docstring)."""
    if not data:
        return b"", []
    n = data[0] % 4
    head = data[1 : 1 + 2 * n]
    cuts = [int.from_bytes(head[i : i + 2], "little") for i in range(0, len(head) - 1, 2)]
    return data[1 + 2 * n :], cuts


def one_input(data: bytes) -> None:
    stream, cuts = split(data)
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    consume(stream, cuts)
    peak = tracemalloc.get_traced_memory()[1] - base
    if peak > MEMORY_BOUND + 4 * len(data):
        raise MemoryError(f"{peak} bytes held for an input of {len(data)}")


def write_seeds(corpus: str) -> None:
    for i, seed in enumerate(SEEDS):
        path = os.path.join(corpus, f"seed-{i:02d}")
        if not os.path.exists(path):
            with open(path, "wb") as fh:
                fh.write(b"\x00" + seed)  # no cuts


def main() -> None:
    corpora = [a for a in sys.argv[1:] if not a.startswith("-")]
    for corpus in corpora:
        write_seeds(corpus)
    tracemalloc.start()
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
