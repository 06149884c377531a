"""The commands' parts that run in-process: a missing extra named with exit code 2, and where
pcs-demo writes (tests/integration/test_commands.py runs the installed commands)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from wireproxy.extras import require_extra


def test_require_extra_names_the_extra_and_exits_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pyspark", None)  # as if not installed
    with pytest.raises(SystemExit) as exit_:
        require_extra("pcs-replicate", "spark", ["pyspark"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "pcs-replicate: needs the [spark] extra (module 'pyspark' is not installed)" in err
    assert "pip install 'parallelchangestream[spark]'" in err


def test_pcs_demo_writes_under_the_current_directory_or_out(tmp_path, monkeypatch):
    """Never into the installed package (site-packages)."""
    import demo.demo as demo

    seen: list[Path] = []
    monkeypatch.setattr(demo, "run_demo", lambda ops, buckets, timeout, out: seen.append(out) or 0)
    monkeypatch.chdir(tmp_path)
    for argv in ([], ["--out", str(tmp_path / "elsewhere")]):
        with pytest.raises(SystemExit) as exit_:
            demo.main(argv)
        assert exit_.value.code == 0
    assert [p.resolve() for p in seen] == [tmp_path / demo.DEFAULT_OUT, tmp_path / "elsewhere"]
