"""Shard tails for tests that hand the tail its member themselves (`tail._tail(member, out)`),
and a TailOutput that takes the reports a test does not look at."""

from __future__ import annotations

from typing import Any

from bson import Timestamp

from buckets.oplog_tail import OplogTail
from mongoformats.change_events import OplogTransformer

START = Timestamp(1_800_000_000, 0)


def handed_tail(
    *,
    start: Timestamp = START,
    skip_key: bytes = b"",
    transformer: OplogTransformer | None = None,
    **options: Any,
) -> OplogTail:
    """Shard "shard0"'s tail from `start`; it never connects on its own."""

    async def connect(hosts: Any, *, secondary: bool) -> Any:
        raise AssertionError("the tail is handed its member")

    return OplogTail(
        "shard0",
        [("member", 27018)],
        start=start,
        skip_key=skip_key,
        transformer=transformer or OplogTransformer(),
        connect_member=connect,  # type: ignore[arg-type]
        **options,
    )


class QuietOutput:
    """A TailOutput (buckets/oplog_tail.py) that drops every report; tests override the ones
    they look at."""

    async def deliver(self, events: list[Any], nbytes: int, entries: int, last_ts: Any) -> None: ...
    async def checked(self) -> None: ...
    async def parked(self, waiting: bool) -> None: ...
    async def idle(self) -> None: ...
    async def connected(self, host: str, reconnects: int) -> None: ...
    async def lost(self, error: str, reconnects: int) -> None: ...
