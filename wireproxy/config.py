"""Proxy configuration: one frozen value built once (CLI, environment, TOML) and passed down."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    upstream: str = "mongodb://127.0.0.1:27017"   # mongos seed list (WIREPROXY_UPSTREAM)
    listen_host: str = "127.0.0.1"                # WIREPROXY_LISTEN_HOST
    listen_port: int = 27018                      # WIREPROXY_LISTEN_PORT
    metrics_port: int = 0                         # /metrics on this port; 0 = off (WIREPROXY_METRICS_PORT)
    max_connections: int = 10_000                 # accepted client connections at once
    idle_timeout_s: float = 0.0                   # close client connections idle this long; 0 = never
    shutdown_grace_s: float = 10.0                # in-flight requests get this long on SIGTERM
    accelerate_change_streams: bool = False       # serve $changeStream aggregates from the engine
    reader_processes: int = 0                     # processes that read and transform the oplogs; 0 = in-process
    stream_idle_teardown_s: float = 300.0         # a parallel change stream with no cursor this long is closed
    cursor_timeout_s: float = 600.0               # engine cursors unused this long are killed (session ones: 1800)
    memory_limit_bytes: int = 0                   # streams' buffer budgets fit under this; 0 = half the memory
    tls_cert_file: str = ""                       # client-side TLS: server certificate+key (PEM)
    tls_ca_file: str = ""                         # verify client certificates against this CA
    upstream_tls: bool = False
    upstream_tls_ca_file: str = ""
    upstream_tls_allow_invalid: bool = False

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, base: ProxyConfig | None = None) -> ProxyConfig:
        env = os.environ if environ is None else environ
        changes: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f"WIREPROXY_{f.name.upper()}")
            if raw is not None:
                changes[f.name] = _coerce(f.type, raw)
        return replace(base or cls(), **changes)

    @classmethod
    def from_toml(cls, path: str) -> ProxyConfig:
        with open(path, "rb") as fh:
            data = tomllib.load(fh).get("wireproxy", {})
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown wireproxy settings in {path}: {sorted(unknown)}")
        return cls(**data)


def _coerce(kind: Any, raw: str) -> Any:
    kind = str(kind)
    if kind == "bool":
        return raw.lower() in ("1", "true", "yes", "on")
    if kind == "int":
        return int(raw)
    if kind == "float":
        return float(raw)
    return raw
