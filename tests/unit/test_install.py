"""Where numba's cache goes: NUMBA_CACHE_DIR when writable, else the user's cache, else the
temporary directory, else off, never a directory others may write
(tests/integration/test_install.py runs the installs)."""

from __future__ import annotations

import os
import stat
import sys
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


def test_the_kernels_cache_is_one_directory_per_content_of_the_code_they_are_made_of(tmp_path):
    """numba checks only a kernel's own source file for staleness, while a kernel compiles in the
    functions and constants it takes from other modules: a changed callee must not be served the
    kernel compiled against the old one."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "kernel.py").write_text("from b.callee import f\n")
    (tmp_path / "b" / "callee.py").write_text("def f(): return 1\n")
    folders = (tmp_path / "a", tmp_path / "b")
    first = numba_cache.source_tag(folders)
    assert first == numba_cache.source_tag(folders) and first.startswith("kernels-")
    (tmp_path / "b" / "callee.py").write_text("def f(): return 2\n")
    assert numba_cache.source_tag(folders) != first


def test_configure_tags_the_directory_once_and_hands_it_to_child_processes(tmp_path, monkeypatch):
    config = sys.modules.get("numba.core.config")
    if config is not None:  # configure() tells a loaded numba: put it back afterwards
        monkeypatch.setattr(config, "CACHE_DIR", config.CACHE_DIR)
    environ = {"NUMBA_CACHE_DIR": str(tmp_path / "n")}
    assert numba_cache.configure(environ)
    tagged = Path(environ["NUMBA_CACHE_DIR"])
    assert tagged.parent == tmp_path / "n" and tagged.name == numba_cache.source_tag()
    assert tagged.is_dir()
    child = dict(environ)
    assert numba_cache.configure(child) and child["NUMBA_CACHE_DIR"] == str(tagged)


def test_kernels_of_other_code_versions_are_pruned_when_old(tmp_path):
    old, recent, other = tmp_path / "kernels-old", tmp_path / "kernels-new", tmp_path / "mine"
    for folder in (old, recent, other):
        folder.mkdir()
        (folder / "index").write_text("x")
    os.utime(old, (0, 0))
    os.utime(other, (0, 0))
    numba_cache.prune(tmp_path, before=1000.0)
    assert not old.exists() and recent.exists() and other.exists()
