"""Which upstream hosts failed lately, so that new connections try the others first.

A host list is tried in order (the mongoses of the upstream URI, the members of a shard). One that
hangs (a stopped process, a partition that drops packets) accepts TCP connections and then costs a
connect or reply timeout each time it is tried, while one that is down costs only a refused
connection. So a host seen failing is tried after the hosts that have not failed, the most
recently failed last, until it answers again: a driver's server selection passes over a server
its monitor marked Unknown in the same way.

One record per proxy (and per reader process, which connects on its own): never module state.
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple

from mongoformats.hosts import host_address

__all__ = ["HostFailure", "HostHealth", "host_address"]


class HostFailure(NamedTuple):
    error: str
    order: float  # time.monotonic() of the failure, for ordering


class HostHealth:
    def __init__(self) -> None:
        self._failed: dict[str, HostFailure] = {}

    def failed(self, address: str, error: str) -> None:
        self._failed[address] = HostFailure(error, time.monotonic())

    def answered(self, address: str) -> None:
        self._failed.pop(address, None)

    def failure(self, address: str) -> HostFailure | None:
        """The host's last failure, if it has not answered since."""
        return self._failed.get(address)

    def order(self, hosts: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """`hosts`, those that have not failed first (in their own order), then the failed ones,
        the longest-failed first."""

        def last_failed(host: tuple[str, int]) -> float:
            failure = self._failed.get(host_address(*host))
            return -math.inf if failure is None else failure.order

        return sorted(hosts, key=last_failed)
