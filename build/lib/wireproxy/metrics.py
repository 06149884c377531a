"""Prometheus metrics of one proxy instance (its own registry: no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.connections = Gauge("wireproxy_client_connections", "Open client connections", registry=self.registry)
        self.commands = Counter("wireproxy_commands_total", "Commands received", ["command", "route"],
                                registry=self.registry)
        self.errors = Counter("wireproxy_errors_total", "Error replies sent", ["code"], registry=self.registry)
        self.upstream_latency = Histogram("wireproxy_upstream_seconds", "Upstream round trip",
                                          registry=self.registry)
        self.upstream_up = Gauge("wireproxy_upstream_up", "1 while the upstream host (a mongos) answers the "
                                 "proxy's hello checks", ["address"], registry=self.registry)
        self.protocol_errors = Counter("wireproxy_protocol_errors_total", "Connections closed for bad frames",
                                       registry=self.registry)
