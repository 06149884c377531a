"""Where numba keeps the compiled kernels: a writable directory, or no cache at all; never a crash.

numba's `cache=True` looks for a writable cache directory when a kernel is defined, at import, and
raises when it finds none (a container run under another UID, a read-only root filesystem, no
writable home). The directory is chosen here, once per process, before the kernels' modules
define anything: NUMBA_CACHE_DIR when set and writable, else the user's cache directory, else one
in the temporary directory, else caching is off (the kernels are then compiled at each start).
The kernels' modules pass `CACHE` as their `cache=` argument.

numba tells a cached kernel stale only by its own source file's time stamp, but a kernel holds
what it calls from other modules and the constants it reads from them, compiled in. So the
directory is one per content of the modules kernels are made of (`source_tag`): a changed callee
or constant gets kernels of its own, never one compiled against the old code.

A cache directory holds code that numba loads and runs, so a shared temporary directory is used
only through a folder of this user's own that nobody else may write to.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pwd
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Mapping, MutableMapping
from pathlib import Path

log = logging.getLogger(__name__)

SUBDIR = ("parallelchangestream", "numba")
# The packages whose code and constants the kernels compile in.
_KERNEL_SOURCES = (Path(__file__).parent, Path(__file__).parents[2] / "mongoformats")
# Kernels of other code versions untouched this long are removed when a new version makes its own.
STALE_S = 7 * 24 * 3600


def source_tag(folders: tuple[Path, ...] = _KERNEL_SOURCES) -> str:
    """A folder name for the current content of the modules in `folders`."""
    digest = hashlib.sha256()
    for path in sorted(p for folder in folders for p in folder.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return "kernels-" + digest.hexdigest()[:16]


def candidates(environ: Mapping[str, str]) -> list[tuple[str, Path]]:
    """(what, directory) in order of preference."""
    found: list[tuple[str, Path]] = []
    if environ.get("NUMBA_CACHE_DIR"):
        found.append(("NUMBA_CACHE_DIR", Path(environ["NUMBA_CACHE_DIR"])))
    home = _user_cache_home(environ)
    if home is not None:
        found.append(("the user cache directory", home.joinpath(*SUBDIR)))
    try:
        temp = Path(tempfile.gettempdir())
    except OSError:  # FileNotFoundError: no usable temporary directory at all
        pass
    else:
        found.append(("the temporary directory", temp / f"{'-'.join(SUBDIR)}-{os.getuid()}"))
    return found


def _user_cache_home(environ: Mapping[str, str]) -> Path | None:
    """$XDG_CACHE_HOME, else ~/.cache (as the XDG base directory specification says); the home
    from $HOME, else from the password database (None when neither gives one)."""
    xdg = environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg)
    home = environ.get("HOME", "")
    if not home:
        try:
            home = pwd.getpwuid(os.getuid()).pw_dir
        except KeyError:  # a UID without an entry, as a container run with --user 12345 has
            return None
    return Path(home) / ".cache" if os.path.isabs(home) else None


def usable(path: Path, *, private: bool) -> bool:
    """True when numba can write in `path` (made if missing), as numba itself checks; `private`:
    also owned by this user and writable by no one else."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if private:
            st = path.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
                return False
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def choose(environ: Mapping[str, str]) -> tuple[Path | None, str]:
    """The cache directory (None: caching off) and one line saying which and why."""
    skipped: list[str] = []
    for what, path in candidates(environ):
        if usable(path, private=what == "the temporary directory"):
            return path, f"numba cache in {path} ({what}){_skipped(skipped)}"
        skipped.append(f"{what} {path}")
    return (
        None,
        f"numba cache off: no writable directory, kernels compile at each start{_skipped(skipped)}",
    )


def prune(root: Path, before: float) -> None:
    """Remove the kernels of other code versions in `root` last written before `before` (a
    time.time()); what cannot be removed stays."""
    for old in root.glob("kernels-*"):
        try:
            if old.stat().st_mtime < before:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:  # removed meanwhile by another process
            continue


def _skipped(skipped: list[str]) -> str:
    return f"; not writable: {', '.join(skipped)}" if skipped else ""


def configure(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Choose the directory, tell numba (the environment, read by numba at import and by child
    processes; numba's config, if numba is already imported) and log it. True: caching on."""
    path, line = choose(environ)
    if path is None:
        log.warning(line)
        return False
    tag = source_tag()
    if path.name != tag:  # (a child process is handed the tagged directory: not tagged twice)
        if not (path / tag).exists():
            prune(path, time.time() - STALE_S)
        path = path / tag
        if not usable(path, private=False):
            log.warning("numba cache off: %s is not writable", path)
            return False
    environ["NUMBA_CACHE_DIR"] = str(path)
    config = sys.modules.get("numba.core.config")
    if config is not None:
        config.CACHE_DIR = str(path)  # type: ignore[attr-defined]
    log.info("%s, kernels of this code in %s", line, path.name)
    return True


CACHE = configure()
