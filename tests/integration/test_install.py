"""The install a user gets: the base install is the proxy alone, and it runs as any user on a
read-only filesystem (as the Docker image does under `--user` and `--read-only`), numba's cache
in a writable place or off, never a crash.

No Docker daemon runs here, so the image's conditions are made by hand: a fresh virtualenv with
`pip install .` (no extras), made read-only, run as `nobody` with no HOME, and, where the test
may make a mount namespace, with /tmp and /var/tmp read-only too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pymongo
import pytest

from simcluster.launcher import spawn_cluster
from tests.unit.test_install import _blocked

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
# Only what the proxy needs at run time: none of these may come with the base install.
NOT_IN_BASE = {"pyspark", "pandas", "rich", "matplotlib", "psutil", "pytest"}


# -- where numba caches: a pure choice, checked without numba ------------------------------------


def test_the_kernels_load_with_the_cache_off_and_log_it(tmp_path):
    """numba's `cache=True` raised at import when no cache directory was writable."""
    blocked = _blocked(tmp_path)
    code = (
        "import logging; logging.basicConfig(level=logging.INFO)\n"
        "import tempfile; tempfile.tempdir = " + repr(str(blocked)) + "\n"
        "import buckets._columnar.batch_splice\n"
        "from buckets._columnar.numba_cache import CACHE; print(CACHE)\n"
    )
    env = {
        **os.environ,
        "NUMBA_CACHE_DIR": str(blocked),
        "HOME": str(blocked),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("XDG_CACHE_HOME", None)
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"
    assert run.stderr.count("numba cache off") == 1


def test_wireproxy_help_and_version_load_no_numba():
    code = (
        "import sys\nfrom wireproxy.__main__ import main\n"
        "for flag in ('--help', '--version'):\n"
        "    try:\n        main([flag])\n    except SystemExit as e:\n        assert e.code == 0\n"
        "print('numba' in sys.modules, 'trio' in sys.modules)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "False False"


# -- a fresh base install, read-only, as another user ---------------------------------------------


def _as_nobody_prefix() -> list[str]:
    """How to run a command as an unprivileged user with /tmp and /var/tmp read-only: as root,
    `nobody` via setpriv, in a mount namespace of its own when unshare may make one; as any other
    user, that user (already unprivileged)."""
    if os.getuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot switch to an unprivileged user")
    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    read_only = (
        "for d in /tmp /var/tmp; do mount --bind $d $d && mount -o remount,bind,ro $d || exit 97; "
        'done; exec "$@"'
    )
    unshare = ["unshare", "-m", "sh", "-c", read_only, "sh"]
    probe = subprocess.run([*unshare, "true"], capture_output=True, timeout=30)
    return [*unshare, *drop] if probe.returncode == 0 else drop


def _base_python(prefix: list[str]) -> str:
    """An interpreter of this Python version that the unprivileged user may run (this venv's base
    may live in root's home)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (
        getattr(sys, "_base_executable", ""),
        f"/usr/local/bin/{version}",
        f"/usr/bin/{version}",
    ):
        if candidate and os.path.exists(candidate):
            probe = subprocess.run(
                [*prefix, candidate, "-c", "pass"], capture_output=True, timeout=30, env=_bare_env()
            )
            if probe.returncode == 0:
                return candidate
    pytest.skip(f"no {version} that an unprivileged user may run")


def _bare_env() -> dict[str, str]:
    """No HOME, no XDG_CACHE_HOME, no NUMBA_CACHE_DIR: as a container run under an unknown UID."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


@pytest.fixture(scope="module")
def base_install() -> Iterator[tuple[Path, list[str]]]:
    """`pip install .` (no extras) into a fresh virtualenv, then made read-only; yields its bin
    folder and the prefix that runs a command as the unprivileged user."""
    prefix = _as_nobody_prefix()
    python = _base_python(prefix)
    top = Path(tempfile.mkdtemp(prefix="pcs-install-"))
    top.chmod(0o755)  # the unprivileged user must reach the venv
    try:
        # A copy of the sources: a build writes build/ and *.egg-info beside them.
        src = top / "src"
        src.mkdir()
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            shutil.copy(ROOT / name, src / name)
        for package in (
            "mongoformats",
            "simcluster",
            "wireproxy",
            "buckets",
            "bucketspark",
            "demo",
        ):
            shutil.copytree(
                ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__")
            )
        venv = top / "venv"
        subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        # pip from this environment installs into the new one; wheels come from pip's cache and
        # the configured index, as a user's `pip install .` would.
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(venv / "bin" / "python"),
                "install",
                "-q",
                str(src),
            ],
            check=True,
            timeout=900,
            capture_output=True,
        )
        for path in [venv, *venv.rglob("*")]:
            if not path.is_symlink():
                path.chmod(stat.S_IMODE(path.stat().st_mode) & ~0o222)
        yield venv / "bin", prefix
    finally:
        for path in [top, *top.rglob("*")]:
            if not path.is_symlink():
                with contextlib.suppress(OSError):
                    path.chmod(stat.S_IMODE(path.stat().st_mode) | 0o200)
        shutil.rmtree(top, ignore_errors=True)


def _python_in(bin_dir: Path, prefix: list[str], code: str) -> str:
    """`code`'s output, run by the install's python (isolated: not the source tree's metadata)."""
    return subprocess.run(
        [*prefix, str(bin_dir / "python"), "-I", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=_bare_env(),
        cwd="/",
    ).stdout


@pytest.mark.slow
def test_the_base_install_is_the_proxy_alone(base_install):
    bin_dir, prefix = base_install
    code = (
        "import importlib.metadata as m; "
        "print(' '.join(sorted(d.metadata['Name'].lower() for d in m.distributions())))"
    )
    names = set(_python_in(bin_dir, prefix, code).split())
    assert "parallelchangestream" in names and {"numba", "pyarrow", "trio", "pymongo"} <= names
    assert not names & NOT_IN_BASE
    code = (
        "import importlib.metadata as m; d = m.distribution('parallelchangestream'); "
        "print('License-Expression: Apache-2.0' in d.read_text('METADATA'), "
        "any(f.name == 'LICENSE' for f in d.files))"
    )
    license_ = _python_in(bin_dir, prefix, code).split()
    assert license_ == ["True", "True"]


@pytest.mark.slow
def test_wireproxy_help_and_version_run_read_only_as_another_user(base_install):
    bin_dir, prefix = base_install
    run = subprocess.run(
        [*prefix, str(bin_dir / "wireproxy"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_bare_env(),
        cwd="/",
    )
    assert run.returncode == 0 and run.stdout.startswith("usage: wireproxy"), run.stderr
    run = subprocess.run(
        [*prefix, str(bin_dir / "wireproxy"), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_bare_env(),
        cwd="/",
    )
    assert run.returncode == 0 and run.stdout.strip() == "wireproxy 0.1.0", run.stderr
    # Commands of the extras say which one to install.
    run = subprocess.run(
        [*prefix, str(bin_dir / "pcs-demo")],
        capture_output=True,
        text=True,
        timeout=60,
        env=_bare_env(),
        cwd="/",
    )
    assert run.returncode == 2 and "pip install 'parallelchangestream[sim,spark]'" in run.stderr, (
        run.stderr
    )


@pytest.mark.slow
def test_a_stream_through_the_read_only_install_as_another_user(base_install):
    """The proxy from the read-only install, run as another user with no home, in front of a
    simcluster: a parallel change stream opens and delivers an insert."""
    bin_dir, prefix = base_install
    cluster = spawn_cluster(shards=2)
    proxy = subprocess.Popen(
        [*prefix, str(bin_dir / "wireproxy"), "--upstream", cluster.uri, "--listen-port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env=_bare_env(),
        cwd="/",
    )
    try:
        assert proxy.stderr is not None
        log: list[str] = []
        while not any("listening on" in line for line in log):
            line = proxy.stderr.readline()
            assert line, f"the proxy exited: {''.join(log)}"
            log.append(line)
        cache_lines = [line for line in log if "numba cache" in line]
        assert len(cache_lines) == 1, log
        if "unshare" in prefix:  # /tmp read-only too: nowhere to cache, and still no crash
            assert "numba cache off" in cache_lines[0], cache_lines
        port = int(log[-1].split("listening on ")[1].split(",")[0].rpartition(":")[2])
        c: pymongo.MongoClient[dict[str, object]] = pymongo.MongoClient(
            f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=30_000
        )
        try:
            start = c.admin.command("ping")["operationTime"]
            opened = c.admin.command(
                {"parallelChangeStream": 1, "nBuckets": 1, "startAtOperationTime": start}
            )
            cursor = opened["cursors"][0]
            c.app.items.insert_one({"_id": 1})
            events: list[dict[str, object]] = []
            deadline = time.monotonic() + 180  # with the cache off, the kernels compile now
            while not events and time.monotonic() < deadline:
                reply = c.admin.command(
                    {
                        "getMore": cursor["id"],
                        "collection": "$cmd.parallelChangeStream",
                        "maxTimeMS": 500,
                    }
                )
                events += reply["cursor"]["nextBatch"]
            assert [e["operationType"] for e in events] == ["insert"]
        finally:
            c.close()
    finally:
        with proxy:  # closes its pipe
            proxy.terminate()
            proxy.wait(30)
        cluster.close()
