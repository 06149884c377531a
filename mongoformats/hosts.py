"""A server's address as MongoDB writes it (hello's `hosts`, a shard's `host`, a connection's
peer): `host:port`, an IPv6 host in brackets."""

from __future__ import annotations

__all__ = ["host_address"]


def host_address(host: str, port: int) -> str:
    """`host:port`, an IPv6 address in brackets: how servers and drivers write a member's
    address."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
