"""Where numba's cache goes: NUMBA_CACHE_DIR when writable, else the user's cache, else the
temporary directory, else off, never a directory others may write
(tests/integration/test_install.py runs the installs)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from buckets._columnar import numba_cache


def _blocked(tmp_path: Path) -> Path:
    """A path no one can make a directory at, even root: its parent is a regular file."""
    (tmp_path / "file").write_text("")
    return tmp_path / "file" / "dir"


def test_numba_cache_dir_is_numba_cache_dir_when_set_and_writable(tmp_path):
    path, line = numba_cache.choose({"NUMBA_CACHE_DIR": str(tmp_path / "n"), "HOME": str(tmp_path)})
    assert path == tmp_path / "n" and "NUMBA_CACHE_DIR" in line and (tmp_path / "n").is_dir()


def test_numba_cache_falls_back_to_the_user_cache_then_the_temporary_directory(
    tmp_path, monkeypatch
):
    blocked = str(_blocked(tmp_path))
    path, line = numba_cache.choose(
        {"NUMBA_CACHE_DIR": blocked, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    )
    assert path == tmp_path / "xdg" / "parallelchangestream" / "numba"
    assert f"not writable: NUMBA_CACHE_DIR {blocked}" in line
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "t"))
    (tmp_path / "t").mkdir()
    path, line = numba_cache.choose({"NUMBA_CACHE_DIR": blocked, "HOME": blocked})
    assert path is not None and path.parent == tmp_path / "t" and "the temporary directory" in line
    assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_numba_cache_is_off_when_nothing_is_writable(tmp_path, monkeypatch):
    blocked = _blocked(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(blocked))
    path, line = numba_cache.choose({"NUMBA_CACHE_DIR": str(blocked), "HOME": str(blocked)})
    assert path is None and line.startswith("numba cache off")


def test_a_temporary_cache_dir_others_may_write_is_not_used(tmp_path, monkeypatch):
    """numba loads and runs what its cache holds: a folder in a shared /tmp that another user made,
    or that others may write, would let them run code in the proxy."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    shared = tmp_path / f"parallelchangestream-numba-{os.getuid()}"
    shared.mkdir()
    shared.chmod(0o777)
    path, _ = numba_cache.choose({"HOME": str(_blocked(tmp_path))})
    assert path is None
