"""The commands as a user meets them: `--version` everywhere, `--log-level`, a missing extra named
with exit code 2, strict configuration files and variables, and default ports that let the
quickstart's `simcluster` and `wireproxy` run side by side."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pymongo
import pytest

from simcluster.launcher import spawn_cluster
from wireproxy.config import ProxyConfig

ROOT = Path(__file__).resolve().parents[2]
VERSION = importlib.metadata.version("parallelchangestream")
COMMANDS = {
    "wireproxy": "wireproxy",
    "simcluster": "simcluster",
    "pcs-demo": "demo.demo",
    "pcs-replicate": "bucketspark.replicate",
}


def _run(
    args: list[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    code: str | None = None,
) -> subprocess.CompletedProcess[str]:
    base = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=base, timeout=timeout)


@pytest.mark.parametrize("prog", COMMANDS)
def test_every_command_prints_the_package_version(prog):
    run = _run([COMMANDS[prog], "--version"])
    assert run.returncode == 0 and run.stdout.strip() == f"{prog} {VERSION}", run.stderr


@pytest.mark.parametrize("spelling", [["--version", "6.0"], ["--version=6.0"]])
def test_simcluster_refuses_the_old_mongodb_version_spelling_with_a_hint(spelling):
    run = _run(["simcluster", *spelling])
    assert (
        run.returncode == 2
        and "use --mongodb-version 6.0" in run.stderr
        and "Traceback" not in run.stderr
    )


def test_simcluster_emulates_the_mongodb_version_it_is_given():
    """spawn_cluster runs `simcluster --mongodb-version`."""
    cluster = spawn_cluster(shards=1, version="6.0")
    try:
        with pymongo.MongoClient(cluster.uri) as c:
            assert c.server_info()["version"].startswith("6.0")
    finally:
        cluster.close()


def _log_until_upstream_is_down(args: list[str]) -> str:
    """wireproxy's log up to its first "upstream ... is down" warning (its upstream refuses
    connections), after which it is stopped: by then the engine has loaded."""
    lines: list[str] = []
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wireproxy",
            "--upstream",
            "mongodb://127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
            *args,
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ) as proc:
        watchdog = threading.Timer(60, proc.kill)
        watchdog.start()
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append(line)
                if " is down: " in line:
                    break
        finally:
            watchdog.cancel()
            proc.kill()
    return "".join(lines)


def test_log_level_is_a_flag_of_wireproxy_and_simcluster():
    # The engine's numba cache line is logged at INFO when the engine loads, before the proxy
    # looks for its upstream: shown by default, not at WARNING.
    default = _log_until_upstream_is_down([])
    quiet = _log_until_upstream_is_down(["--log-level", "warning"])
    assert "INFO buckets._columnar.numba_cache numba cache" in default
    assert " is down: " in quiet and "numba cache" not in quiet
    for prog in ("wireproxy", "simcluster"):
        run = _run([prog, "--log-level", "loud"])
        assert run.returncode == 2 and "argument --log-level: invalid choice: 'LOUD'" in run.stderr


# -- a command whose extra is missing -------------------------------------------------------------


# A command run with some modules missing: sys.modules[name] = None makes importing them fail.
_MISSING = textwrap.dedent("""
    import runpy, sys
    for name in sys.argv[1].split(","):
        sys.modules[name] = None
    sys.argv = [sys.argv[2], *sys.argv[3:]]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
""")


@pytest.mark.parametrize(
    ("missing", "module", "args", "extra"),
    [
        ("rich", "demo.demo", [], "sim,spark"),
        ("pyspark", "demo.demo", [], "sim,spark"),
        (
            "pyspark",
            "bucketspark.replicate",
            ["--proxy", "mongodb://p", "--target", "mongodb://t", "--checkpoint", "c"],
            "spark",
        ),
    ],
)
def test_a_command_without_its_extra_says_which_to_install(missing, module, args, extra):
    run = _run([missing, module, *args], code=_MISSING)
    assert run.returncode == 2, run.stderr
    assert (
        f"pip install 'parallelchangestream[{extra}]'" in run.stderr
        and "Traceback" not in run.stderr
    )
    # --help and --version still work without the extra.
    assert _run([missing, module, "--help"], code=_MISSING).returncode == 0


# -- strict configuration -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("listen_port = 1\n", "unknown tables or keys outside [wireproxy]: ['listen_port']"),
        (
            "[wireproxi]\nlisten_port = 1\n",
            "unknown tables or keys outside [wireproxy]: ['wireproxi']",
        ),
        (
            "[wireproxy]\nlisten_port = 1\n[metrics]\nport = 2\n",
            "unknown tables or keys outside [wireproxy]: ['metrics']",
        ),
        ("", "no [wireproxy] table"),
        ("[wireproxy]\nlisten_prot = 1\n", "unknown wireproxy settings"),
    ],
)
def test_a_config_file_without_the_table_or_with_unknown_names_is_refused(tmp_path, toml, message):
    path = tmp_path / "proxy.toml"
    path.write_text(toml)
    with pytest.raises(ValueError) as err:
        ProxyConfig.from_toml(str(path))
    assert message in str(err.value)
    run = _run(["wireproxy", "--config", str(path)])
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr


def test_an_unknown_wireproxy_variable_is_refused_by_name():
    with pytest.raises(ValueError) as err:
        ProxyConfig.from_env(
            {"WIREPROXY_LISTEN_PROT": "1", "WIREPROXY_LISTEN_PORT": "2", "OTHER": "x"}
        )
    assert "WIREPROXY_LISTEN_PROT (did you mean WIREPROXY_LISTEN_PORT?)" in str(err.value)
    run = _run(["wireproxy"], env={"WIREPROXY_UPSTREM": "mongodb://h"})
    assert run.returncode == 2 and "unknown environment variables: WIREPROXY_UPSTREM" in run.stderr


# -- the quickstart's default ports ---------------------------------------------------------------

_SIDE_BY_SIDE = textwrap.dedent("""
    import subprocess, sys
    import pymongo
    py = sys.executable
    cluster = subprocess.Popen([py, "-m", "simcluster"], stdout=subprocess.PIPE, text=True)
    proxy = None
    try:
        assert cluster.stdout.readline().startswith("mongos   mongodb://127.0.0.1:27017/")
        proxy = subprocess.Popen([py, "-m", "wireproxy", "--upstream", "mongodb://127.0.0.1:27017"],
                                 stderr=subprocess.PIPE, text=True)
        for line in proxy.stderr:
            if "listening on" in line:
                break
        else:
            raise SystemExit("the proxy exited")
        with pymongo.MongoClient("mongodb://127.0.0.1:27018/", serverSelectionTimeoutMS=30000) as c:
            print(c.admin.command("ping")["ok"], c.admin.command("hello")["msg"])
    finally:
        for p in (proxy, cluster):
            if p is not None:
                p.terminate()
                p.wait(30)
""")


def _own_network() -> list[str]:
    """A network namespace of its own (root with unshare): the fixed ports 27017 and 27018 there
    collide with nothing else running on this machine."""
    if os.getuid() == 0 and shutil.which("unshare") and shutil.which("ip"):
        prefix = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]
        if subprocess.run([*prefix, "true"], capture_output=True, timeout=30).returncode == 0:
            return prefix
    for port in (27017, 27018, 28017, 28018, 28019):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                pytest.skip(f"port {port} is in use and no network namespace can be made")
    return []


def test_simcluster_and_wireproxy_run_side_by_side_with_default_ports():
    run = subprocess.run(
        [*_own_network(), sys.executable, "-c", _SIDE_BY_SIDE],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1.0", "isdbgrid"]
