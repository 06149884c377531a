"""Limits on code shape, measured with radon: no function above cyclomatic complexity 15, no
module over 600 lines, every module at maintainability index A or B, and the packages' average
complexity at most MAX_AVERAGE_COMPLEXITY. Radon's ranks are its own (mi_rank: A above 19, B from
10, C below).
"""

from __future__ import annotations

import functools
from pathlib import Path

from radon.complexity import average_complexity, cc_visit
from radon.metrics import mi_rank, mi_visit
from radon.visitors import Function

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("mongoformats", "simcluster", "wireproxy", "buckets", "bucketspark", "demo")

MAX_COMPLEXITY = 15
MAX_LINES = 600
# Over every block radon rates (functions, methods and classes) in the packages.
MAX_AVERAGE_COMPLEXITY = 3.2
GOOD_MI_RANKS = ("A", "B")


@functools.cache
def _sources() -> dict[str, str]:
    return {
        path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def _functions(source: str) -> list[Function]:
    """Functions and methods (radon's blocks without the classes themselves)."""
    return [block for block in cc_visit(source) if isinstance(block, Function)]


def _qualified(block: Function) -> str:
    return f"{block.classname}.{block.name}" if block.classname else block.name


def test_no_function_above_max_complexity() -> None:
    found = {
        f"{path}:{_qualified(block)}"
        for path, source in _sources().items()
        for block in _functions(source)
        if block.complexity > MAX_COMPLEXITY
    }
    assert not found, f"functions above complexity {MAX_COMPLEXITY}: {sorted(found)}"


def test_no_module_over_max_lines() -> None:
    found = {path for path, source in _sources().items() if len(source.splitlines()) > MAX_LINES}
    assert not found, f"modules over {MAX_LINES} lines: {sorted(found)}"


def test_every_module_maintainable() -> None:
    found = {
        path
        for path, source in _sources().items()
        if mi_rank(mi_visit(source, multi=True)) not in GOOD_MI_RANKS
    }
    assert not found, f"modules below maintainability B: {sorted(found)}"


def test_average_complexity_is_within_its_limit() -> None:
    """The average over every block radon rates (functions, methods and classes); run with -s
    to see it."""
    blocks = [block for source in _sources().values() for block in cc_visit(source)]
    average = average_complexity(blocks)
    print(f"\naverage cyclomatic complexity: {average:.2f} over {len(blocks)} blocks")
    assert average <= MAX_AVERAGE_COMPLEXITY, f"average complexity {average:.2f}"
