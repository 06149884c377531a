"""What the fast layers may not do, checked while their tests run (docs/testing.md, "Layers").

tests/unit and tests/component run in a minute because they touch no network and start no
cluster, proxy or Spark: a test there that connects or binds a socket fails at that call, and a
unit test module that imports a cluster's servers or Spark fails every test in it. Socket pairs
(an in-process stand-in for a pipe) stay allowed; trio's memory streams need no socket at all.
"""

from __future__ import annotations

import ast
import functools
import inspect
import socket
from pathlib import Path
from typing import Any, NoReturn

import pytest

# Modules that start or reach real servers: simcluster's package root re-exports open_cluster.
UNIT_FORBIDDEN_IMPORTS = (
    "simcluster",
    "simcluster.cluster",
    "simcluster.launcher",
    "simcluster.server",
    "pyspark",
    "tests.conftest",
)

# Fixtures of pytest-trio that run a test on trio.testing.MockClock instead of the real clock.
MOCK_CLOCKS = ("autojump_clock", "mock_clock")


class SocketInFastLayer(AssertionError):
    """A unit or component test reached for the network."""


def _refuse(self: socket.socket, *args: Any, **kwargs: Any) -> NoReturn:
    raise SocketInFastLayer(
        f"a unit or component test may not connect or bind a socket ({self!r}, {args!r}); "
        "use trio.testing memory streams, or move the test to tests/integration"
    )


def refuse_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any connect or bind for the rest of the test (pymongo, trio and http all go through
    these three methods of the standard library's socket class)."""
    for name in ("connect", "connect_ex", "bind"):
        monkeypatch.setattr(socket.socket, name, _refuse)


@functools.cache
def forbidden_imports(path: Path) -> tuple[str, ...]:
    """The modules of UNIT_FORBIDDEN_IMPORTS that the test module at `path` imports, at any
    level (a function-level import counts too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if _forbidden(a.name))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if _forbidden(node.module):
                found.add(node.module)
            # `from simcluster import server` imports the submodule
            found.update(
                f"{node.module}.{a.name}"
                for a in node.names
                if f"{node.module}.{a.name}" in UNIT_FORBIDDEN_IMPORTS
            )
    return tuple(sorted(found))


def _forbidden(module: str) -> bool:
    return module in UNIT_FORBIDDEN_IMPORTS or module.startswith("pyspark.")


def check_unit_test(request: pytest.FixtureRequest) -> None:
    """Fail a unit test whose module imports servers or Spark, or that runs in trio on the real
    clock: the unit layer's trio tests take pytest-trio's `autojump_clock` (or `mock_clock`)."""
    if imported := forbidden_imports(Path(request.path)):
        pytest.fail(
            f"{request.path.name} imports {', '.join(imported)}: "
            "a unit test module starts no servers; move the test to tests/integration"
        )
    function = request.function
    if inspect.iscoroutinefunction(function):
        params = inspect.signature(function).parameters
        if not any(clock in params for clock in MOCK_CLOCKS):
            pytest.fail(
                f"{function.__name__} runs in trio on the real clock: take the autojump_clock "
                "fixture (trio.testing.MockClock), or move the test to tests/component"
            )
