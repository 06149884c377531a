"""wireproxy's pure parts: routing by command name and the settings from the environment and a
TOML file (tests/integration/test_proxy.py runs the proxy with pymongo against simcluster)."""

from __future__ import annotations

import pytest

from wireproxy.config import ProxyConfig
from wireproxy.router import CommandTable, Route, classify


def test_routing_is_a_pure_function():
    table = CommandTable()

    async def mine(session, db, cmd):
        return {}

    table.register("parallelChangeStream", mine)
    table.owned_cursors = {7}
    table.get_more = mine
    assert classify({"hello": 1}, table, accelerate=False)[0] is Route.HELLO
    assert classify({"isMaster": 1}, table, accelerate=False)[0] is Route.HELLO
    assert classify({"parallelChangeStream": 1}, table, accelerate=False) == (Route.LOCAL, mine)
    assert classify({"getMore": 7, "collection": "x"}, table, accelerate=False)[0] is Route.LOCAL
    assert (
        classify({"getMore": 8, "collection": "x"}, table, accelerate=False)[0] is Route.PASSTHROUGH
    )
    assert classify({"find": "c"}, table, accelerate=True)[0] is Route.PASSTHROUGH


def test_config_from_env_and_toml(tmp_path):
    cfg = ProxyConfig.from_env(
        {
            "WIREPROXY_LISTEN_PORT": "1234",
            "WIREPROXY_ACCELERATE_CHANGE_STREAMS": "true",
            "WIREPROXY_CURSOR_TIMEOUT_S": "60",
        }
    )
    assert (
        cfg.listen_port == 1234
        and cfg.accelerate_change_streams is True
        and cfg.cursor_timeout_s == 60.0
    )
    path = tmp_path / "p.toml"
    path.write_text(
        '[wireproxy]\nupstream = "mongodb://m:1"\nmax_connections = 5\nshutdown_grace_s = 3\n'
    )
    cfg = ProxyConfig.from_toml(str(path))
    assert (
        cfg.max_connections == 5
        and cfg.shutdown_grace_s == 3.0
        and type(cfg.shutdown_grace_s) is float
    )
    path.write_text("[wireproxy]\nbogus = 1\n")
    with pytest.raises(ValueError, match="unknown wireproxy settings"):
        ProxyConfig.from_toml(str(path))


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            {"WIREPROXY_ACCELERATE_CHANGE_STREAMS": "ture"},
            "WIREPROXY_ACCELERATE_CHANGE_STREAMS must be true or false",
        ),
        ({"WIREPROXY_LISTEN_PORT": "80a"}, "WIREPROXY_LISTEN_PORT must be an integer, not '80a'"),
        ({"WIREPROXY_LISTEN_PORT": "70000"}, "listen_port must be between 0 and 65535, not 70000"),
        ({"WIREPROXY_READER_PROCESSES": "-1"}, "reader_processes must be between 0 and 64"),
        ({"WIREPROXY_MAX_CONNECTIONS": "0"}, "max_connections must be at least 1"),
        ({"WIREPROXY_IDLE_TIMEOUT_S": "nan"}, "idle_timeout_s must be a finite number, not nan"),
        ({"WIREPROXY_TLS_CA_FILE": "ca.pem"}, "tls_ca_file needs tls_cert_file"),
        ({"WIREPROXY_UPSTREAM": "mongos:27017"}, "upstream: Invalid URI scheme"),
        (
            {"WIREPROXY_UPSTREAM": "mongodb://u:secret@h/?tls=maybe"},
            "upstream: The value of tls must be 'true' or",
        ),
        (
            {"WIREPROXY_UPSTREAM": "mongodb://h/?readPreferense=secondary"},
            "upstream: Unknown option",
        ),
        (
            {"WIREPROXY_UPSTREAM": "mongodb://u:p@h/?authMechanism=PLAIN"},
            "authMechanism PLAIN is not supported",
        ),
        ('listen_port = "27018"', "listen_port must be an integer, not '27018'"),
        ("accelerate_change_streams = 1", "accelerate_change_streams must be true or false, not 1"),
    ],
)
def test_a_bad_setting_is_refused_by_name(tmp_path, source, message):
    """A wrong type, a value out of range or an upstream URI a driver would refuse fails the config
    with the setting's name, never later inside the server; nor is a mistyped boolean read as
    off."""
    with pytest.raises(ValueError) as err:
        if isinstance(source, dict):
            ProxyConfig.from_env(source)
        else:
            path = tmp_path / "p.toml"
            path.write_text(f"[wireproxy]\n{source}\n")
            ProxyConfig.from_toml(str(path))
    assert message in str(err.value)
    assert "secret" not in str(err.value)  # an upstream URI's password is never echoed
