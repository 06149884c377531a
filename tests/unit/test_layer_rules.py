"""The fast layers' rules (tests/layer_rules.py) catch what they promise to catch."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from tests.layer_rules import SocketInFastLayer, check_unit_test, forbidden_imports


def test_connecting_or_binding_a_socket_fails_a_unit_test() -> None:
    with socket.socket() as s, pytest.raises(SocketInFastLayer):
        s.bind(("127.0.0.1", 0))
    with socket.socket() as s, pytest.raises(SocketInFastLayer):
        s.connect(("127.0.0.1", 9))
    with socket.socket() as s, pytest.raises(SocketInFastLayer):
        s.connect_ex(("127.0.0.1", 9))


def test_a_socket_pair_stays_allowed() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"x")
        assert right.recv(1) == b"x"


async def test_a_trio_socket_cannot_connect_either(autojump_clock: trio.testing.MockClock) -> None:
    with trio.socket.socket() as s, pytest.raises(SocketInFastLayer):
        await s.connect(("127.0.0.1", 9))


@pytest.mark.parametrize(
    "source,found",
    [
        ("from simcluster import open_cluster\n", ("simcluster",)),
        ("import simcluster.server\n", ("simcluster.server",)),
        ("def f():\n    from pyspark.sql import SparkSession\n", ("pyspark.sql",)),
        ("from simcluster import server\n", ("simcluster", "simcluster.server")),
        ("from tests.conftest import client, sync\n", ("tests.conftest",)),
        ("from simcluster.cluster_time import gossip_in\nimport bson\n", ()),
    ],
)
def test_the_imports_a_unit_module_may_not_make_are_found(
    tmp_path: Path, source: str, found: tuple[str, ...]
) -> None:
    path = tmp_path / "test_x.py"
    path.write_text(source)
    assert forbidden_imports(path) == found


def _request(path: Path, function: Any) -> Any:
    return SimpleNamespace(path=path, function=function)


def test_a_module_that_imports_a_server_fails_its_tests(tmp_path: Path) -> None:
    path = tmp_path / "test_y.py"
    path.write_text("from simcluster import open_cluster\n")
    with pytest.raises(pytest.fail.Exception, match="imports simcluster"):
        check_unit_test(_request(path, lambda: None))


def test_a_trio_test_on_the_real_clock_fails(tmp_path: Path) -> None:
    path = tmp_path / "test_z.py"
    path.write_text("import trio\n")

    async def on_real_clock() -> None:
        pass

    async def on_mock_clock(autojump_clock: trio.testing.MockClock) -> None:
        pass

    with pytest.raises(pytest.fail.Exception, match="real clock"):
        check_unit_test(_request(path, on_real_clock))
    check_unit_test(_request(path, on_mock_clock))
