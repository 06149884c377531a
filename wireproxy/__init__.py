"""wireproxy: a transparent MongoDB wire-protocol proxy in front of mongos, with commands of its
own.

The names below are imported on first use (PEP 562): `wireproxy --help` and `--version` then load
neither the server nor numba's compiled kernels.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wireproxy.config import ProxyConfig
    from wireproxy.router import CommandTable, Route, classify
    from wireproxy.server import ProxyServer

_HOMES = {
    "ProxyConfig": "wireproxy.config",
    "CommandTable": "wireproxy.router",
    "Route": "wireproxy.router",
    "classify": "wireproxy.router",
    "ProxyServer": "wireproxy.server",
}

__all__ = ["ProxyConfig", "CommandTable", "Route", "classify", "ProxyServer"]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'wireproxy' has no attribute {name!r}")
