"""Proxy configuration: one frozen value built once (CLI, environment, TOML) and passed down.

Every setting is one field here, with its default and help; the command line (`wireproxy
--help`), the WIREPROXY_* variables and the TOML table are all made from these fields, so a
setting cannot exist in one and be missing from another. A value of the wrong type or out of
range is refused when the config is built (ValueError naming the setting), not met later as a
traceback from deep inside the server.
"""

from __future__ import annotations

import difflib
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields, replace
from typing import Any

from mongoformats import wire
from wireproxy.redact import redact_uri

# The engine's bound (buckets.commands.MAX_READER_PROCESSES, which a test checks this matches): the
# proxy's configuration is read before, and without, the engine.
MAX_READER_PROCESSES = 64


def _setting(default: Any, help: str, low: float | None = None, high: float | None = None) -> Any:
    return field(default=default, metadata={"help": help, "range": (low, high)})


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    upstream: str = _setting(
        "mongodb://127.0.0.1:27017",
        "the cluster's mongos, as a connection string (its credentials are the engine's own "
        "login; tls=true and the tlsCAFile / tlsAllowInvalidCertificates options apply)",
    )
    listen_host: str = _setting("127.0.0.1", "address to listen on")
    listen_port: int = _setting(27018, "port to listen on (0: any free port)", 0, 65535)
    metrics_port: int = _setting(0, "serve Prometheus /metrics on this port (0: off)", 0, 65535)
    max_connections: int = _setting(
        10_000, "client connections served at once; more are closed as they come", 1
    )
    idle_timeout_s: float = _setting(0.0, "close client connections idle this long (0: never)", 0)
    # The three limits below bound what a client can make the proxy hold with messages it
    # starts and never finishes (each up to maxMessageSizeBytes, 48 MB, otherwise).
    frame_timeout_s: float = _setting(
        30.0,
        "close a client connection whose message has begun to arrive and is not whole "
        "this long after (0: never)",
        0,
    )
    unauthenticated_max_message_bytes: int = _setting(
        1 << 20,
        "the largest message a client that has not logged in may send, when the "
        "upstream URI carries credentials (the cluster then requires authentication, "
        "and such a client can only say hello and log in); a larger one closes the "
        "connection",
        1024,
        wire.MAX_MESSAGE_SIZE,
    )
    unauthenticated_buffer_bytes: int = _setting(
        256 << 20,
        "what the incomplete messages of all clients that have not logged in may "
        "hold at once (every client, when the cluster runs without authentication); "
        "a client whose message would take it past this is closed (0: no limit)",
        0,
    )
    shutdown_grace_s: float = _setting(10.0, "on SIGTERM, how long in-flight requests get", 0)
    accelerate_change_streams: bool = _setting(
        False,
        "serve drivers' watch() ($changeStream aggregates) from "
        "the engine instead of passing them to mongos",
    )
    reader_processes: int = _setting(
        0,
        "worker processes turning oplog batches into events, and applying an "
        "accelerated watch()'s stages (0: in the proxy)",
        0,
        MAX_READER_PROCESSES,
    )
    splice_threads: int = _setting(
        0,
        "worker threads that splice large oplog batches into events beside the event loop, "
        "for streams read in the proxy's process (0: on the loop; more than the cores "
        "beside the loop's one only contend)",
        0,
        MAX_READER_PROCESSES,
    )
    stream_idle_teardown_s: float = _setting(
        300.0,
        "close a parallel change stream that has had no cursor, and no status call, this long",
        0,
    )
    reader_idle_s: float = _setting(
        300.0,
        "stop a reader process that has read nothing this long (started "
        "again when a stream needs it)",
        0,
    )
    cursor_timeout_s: float = _setting(
        600.0,
        "kill engine cursors no getMore used this long, as "
        "cursorTimeoutMillis does (cursors opened in a session: 1800, "
        "the session timeout)",
        0,
    )
    upstream_timeout_s: float = _setting(
        30.0,
        "the engine gives up on a shard member or mongos that has not "
        "answered a command this long past its maxTimeMS (a hung or cut-off "
        "host; as a driver's socketTimeoutMS) and reads on from another "
        "member, and kills a reader process that answers nothing this long "
        "(0: wait forever)",
        0,
    )
    memory_limit_bytes: int = _setting(
        0,
        "bound on what all streams' buffers hold and the "
        "reader processes; streams that do not fit are "
        "refused (ExceededMemoryLimit) (0: half the "
        "machine's or cgroup's memory)",
        0,
    )
    tls_cert_file: str = _setting(
        "", "client-side TLS: the proxy's certificate and key (PEM); empty: plain TCP"
    )
    tls_ca_file: str = _setting(
        "", "with tls_cert_file: require client certificates signed by this CA"
    )
    upstream_tls: bool = _setting(
        False, "TLS to mongos and the shards (as tls=true in the upstream URI)"
    )
    upstream_tls_ca_file: str = _setting(
        "", "CA to verify the upstream's certificates (as tlsCAFile)"
    )
    upstream_tls_allow_invalid: bool = _setting(
        False, "accept any upstream certificate (as tlsAllowInvalidCertificates)"
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            value = _checked_value(f, getattr(self, f.name))
            object.__setattr__(self, f.name, value)
        if not self.listen_host:
            raise ValueError("listen_host must not be empty")
        if self.tls_ca_file and not self.tls_cert_file:
            raise ValueError(
                "tls_ca_file needs tls_cert_file: client certificates are asked for over TLS"
            )
        check_upstream_uri(self.upstream)

    def __repr__(self) -> str:
        # The upstream URI holds the proxy's password: shown redacted wherever a config is.
        shown = ", ".join(
            f"{f.name}={redact_uri(self.upstream)!r}"
            if f.name == "upstream"
            else f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
        )
        return f"ProxyConfig({shown})"

    @classmethod
    def from_env(
        cls, environ: dict[str, str] | None = None, base: ProxyConfig | None = None
    ) -> ProxyConfig:
        env = os.environ if environ is None else environ
        _refuse_unknown_variables(env, {f"WIREPROXY_{f.name.upper()}" for f in fields(cls)})
        changes: dict[str, Any] = {}
        for f in fields(cls):
            name = f"WIREPROXY_{f.name.upper()}"
            raw = env.get(name)
            if raw is not None:
                changes[f.name] = parse_value(str(f.type), raw, name)
        return replace(base or cls(), **changes)

    @classmethod
    def from_toml(cls, path: str) -> ProxyConfig:
        with open(path, "rb") as fh:
            document = tomllib.load(fh)
        data = _wireproxy_table(document, path)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown wireproxy settings in {path}: {sorted(unknown)}")
        try:
            return cls(**data)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None


# Whether a value is of a setting's kind: bool is an int to Python, and an int is a fine float;
# nothing else converts.
_OF_KIND = {
    "bool": lambda value: type(value) is bool,
    "int": lambda value: type(value) is int,
    "str": lambda value: type(value) is str,
    "float": lambda value: type(value) in (int, float),
}


def _checked_value(f: Field[Any], value: Any) -> Any:
    """`value` as the setting `f` holds it (an int given for a float becomes one); ValueError if
    it is not of the setting's kind, or outside its range."""
    kind = str(f.type)
    if not _OF_KIND[kind](value):
        raise ValueError(f"{f.name} must be {_KINDS[kind]}, not {value!r}")
    if kind == "float" and not math.isfinite(value):
        raise ValueError(f"{f.name} must be a finite number, not {value!r}")
    _check_range(f, value)
    return float(value) if kind == "float" else value


def _check_range(f: Field[Any], value: float) -> None:
    """ValueError if `value` is outside the range of the setting `f`."""
    low, high = f.metadata["range"]
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ValueError(f"{f.name} must be {span}, not {value!r}")


def _wireproxy_table(document: dict[str, Any], path: str) -> dict[str, Any]:
    """The file's [wireproxy] table; ValueError for a file without one or with anything beside it,
    which would otherwise be ignored without a word (settings at the top level, a misspelt
    table)."""
    others = sorted(set(document) - {"wireproxy"})
    if others:
        raise ValueError(f"{path}: unknown tables or keys outside [wireproxy]: {others}")
    table = document.get("wireproxy")
    if not isinstance(table, dict):
        raise ValueError(f"{path}: no [wireproxy] table (the settings go in one)")
    return table


def _refuse_unknown_variables(env: Mapping[str, str], known: set[str]) -> None:
    """ValueError naming WIREPROXY_* variables that are no setting: a misspelt one would otherwise
    leave its setting at the default without a word."""
    unknown = sorted(name for name in env if name.startswith("WIREPROXY_") and name not in known)
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, known, 1)
            hints.append(f"{name} (did you mean {close[0]}?)" if close else name)
        raise ValueError(f"unknown environment variables: {', '.join(hints)}")


_KINDS = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string"}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_value(kind: str, raw: str, name: str) -> Any:
    """A setting's value from text (an environment variable, a flag); ValueError naming `name`.

    Why strict booleans: `WIREPROXY_ACCELERATE_CHANGE_STREAMS=ture` read as false would turn a
    feature off without a word.
    """
    text = raw.strip()
    try:
        if kind == "bool":
            if text.lower() not in _TRUE + _FALSE:
                raise ValueError
            return text.lower() in _TRUE
        return {"int": int, "float": float, "str": str}[kind](text if kind != "str" else raw)
    except ValueError:
        raise ValueError(f"{name} must be {_KINDS[kind]}, not {raw!r}") from None


def check_upstream_uri(uri: str) -> None:
    """ValueError unless the proxy can use `uri` (see UpstreamTarget: pymongo's parser, then the
    proxy's own limits). A mongodb+srv:// URI is checked when the proxy starts, where its DNS
    records are looked up: building a config does no network I/O."""
    if not uri.startswith("mongodb+srv://"):
        # Imported here: `wireproxy --help` loads no engine.
        from wireproxy.upstream_target import UpstreamTarget

        UpstreamTarget.from_uri(uri)
