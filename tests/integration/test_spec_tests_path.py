"""Where the drivers' spec tests come from: PCS_SPEC_TESTS. Without their files the conformance
suite is skipped with one reason naming the variable, and in CI (CI=true) it fails, never
vanishing without a word (an empty parametrization is only a skip)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE = "tests/integration/test_spec_change_streams.py"


def _pytest(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("PCS_SPEC_TESTS", "CI")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfs", "-p", "no:cacheprovider", SUITE, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**base, "PYTHONPATH": str(ROOT), **env},
    )


@pytest.mark.parametrize("value", [None, "no/such/folder"])
def test_without_the_files_the_suite_is_skipped_with_one_reason(value):
    run = _pytest({} if value is None else {"PCS_SPEC_TESTS": value})
    assert run.returncode == 5, run.stdout  # pytest's "no tests ran": this file alone holds none
    assert "1 skipped" in run.stdout and "passed" not in run.stdout
    assert run.stdout.count("SKIPPED [1]") == 1 and "PCS_SPEC_TESTS" in run.stdout


def test_in_ci_missing_files_fail_the_suite():
    run = _pytest({"CI": "true"})
    assert run.returncode == 1
    assert (
        "FAILED tests/integration/test_spec_change_streams.py::test_spec_tests_are_present"
        in run.stdout
    )
    assert "PCS_SPEC_TESTS is not set" in run.stdout


def test_with_the_variable_the_whole_suite_is_collected(tmp_path):
    """A folder holding change-streams/*.json: each test of each file, three ways."""
    folder = tmp_path / "change-streams"
    folder.mkdir()
    (folder / "one.json").write_text('{"tests": [{"description": "a"}, {"description": "b"}]}')
    run = _pytest({"PCS_SPEC_TESTS": str(tmp_path), "CI": "true"}, "--collect-only")
    assert run.returncode == 0, run.stdout
    assert "7 tests collected" in run.stdout  # 2 tests x 3 ways, and the presence check
