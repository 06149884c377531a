"""wireproxy: a transparent MongoDB wire-protocol proxy in front of mongos, with commands of its own."""

from wireproxy.config import ProxyConfig
from wireproxy.router import CommandTable, Route, classify
from wireproxy.server import ProxyServer

__all__ = ["ProxyConfig", "CommandTable", "Route", "classify", "ProxyServer"]
