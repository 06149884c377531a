"""What the engine needs from the proxy that runs it, stated in the engine's own terms.

The engine never imports the proxy (`wireproxy`): it reads the shards over connections that a
connector gives it, and serves commands for clients it knows only through a client context. The
proxy's classes implement these protocols structurally (`UpstreamConnection`, `MemberConnector`,
`ClientSession`); its composition root (`wireproxy/app.py`) hands them to the engine.

A connection whose transport fails (closed, unreachable, no answer in time) raises
`mongoformats.errors.ConnectionLost` (or a subclass); a server's error answer is a MongoError.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from bson.raw_bson import RawBSONDocument

from mongoformats.errors import MongoError

# Makes the buffer a reply is received into, given its size (bytearray, or an uninitialised one).
Allocate = Callable[[int], bytearray]

__all__ = [
    "ClientContext",
    "Connection",
    "Connector",
    "ConnectUpstream",
    "Decline",
    "Handler",
    "HostRecord",
]


class Decline(Exception):  # noqa: N818 (a signal, not an error)
    """Raised by a command handler that leaves the request to mongos: the proxy forwards it
    unchanged, as if the engine had never seen it."""


class Connection(Protocol):
    """A connection to one server (mongos or a shard member), one command at a time."""

    @property
    def address(self) -> str:
        """The server's `host:port` (an IPv6 host in brackets: mongoformats.hosts.host_address)."""
        ...

    @property
    def streaming(self) -> bool:
        """An exhaust cursor's batches are still coming: take them with `more_in_place`."""
        ...

    async def command(
        self, db: str, cmd: dict[str, Any], *, check: bool = True, timeout_s: float = math.inf
    ) -> RawBSONDocument:
        """The reply to `cmd`; with `check`, an `{ok: 0}` reply raises MongoError."""
        ...

    def reply_arrived(self) -> bool:
        """Whether bytes of the next reply have arrived and are not taken yet (no wait)."""
        ...

    async def command_in_place(
        self,
        db: str,
        cmd: dict[str, Any],
        *,
        pad: int,
        exhaust: bool = False,
        allocate: Allocate = bytearray,
    ) -> tuple[bytes | bytearray, int]:
        """The reply to `cmd` left where it was received: (bytes holding the reply document
        followed by `pad` zero bytes, where the document starts, in a buffer `allocate` made);
        with `exhaust`, a getMore's later batches may come unasked (`streaming`)."""
        ...

    async def command_in_place_after(
        self,
        before: tuple[str, dict[str, Any]],
        vet: Callable[[RawBSONDocument], Awaitable[None]],
        db: str,
        cmd: dict[str, Any],
        *,
        pad: int,
        allocate: Allocate = bytearray,
    ) -> tuple[bytes | bytearray, int]:
        """`command_in_place` for `cmd`, sent in one round trip with the command `before` (a
        database, a command), which the server runs first; `before`'s reply (checked) is handed
        to `vet` before `cmd`'s is taken. A failure closes the connection."""
        ...

    async def more_in_place(
        self, *, pad: int, allocate: Allocate = bytearray
    ) -> tuple[bytes | bytearray, int]:
        """The next batch of an exhaust cursor, as `command_in_place` gives it."""
        ...

    async def aclose(self) -> None: ...


class HostRecord(Protocol):
    """The members a connector saw failing, which it tries last."""

    def failed(self, address: str, error: str) -> None: ...


class Connector(Protocol):
    """The way to a shard's members, logged in as the proxy. It must pickle (settings only): a
    reader process connects with the same settings as the proxy."""

    async def __call__(self, hosts: list[tuple[str, int]], *, secondary: bool) -> Connection:
        """A connection to one of `hosts`: a secondary if one answers and `secondary`, else the
        primary."""
        ...

    @property
    def health(self) -> HostRecord: ...


# A new connection to mongos, logged in as the proxy (the engine's own, not a client's).
ConnectUpstream = Callable[[], Awaitable[Connection]]


class ClientContext(Protocol):
    """The client connection a command came on."""

    @property
    def user(self) -> str | None:
        """Who mongos says is logged in on the client's connection ("user@db"); None: nobody."""
        ...

    async def privileges(self) -> list[dict[str, Any]]:
        """The logged-in user's privileges, as mongos reports them on the client's connection."""
        ...

    async def forward_command(self, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        """`cmd` run on the client's own connection to mongos; its reply, errors included."""
        ...

    async def fail_point_reply(
        self, name: str, db: str, cmd: dict[str, Any]
    ) -> dict[str, Any] | None:
        """mongos's answer to the command `name` if a failCommand fail point armed through the
        proxy fires for it (tests only); None otherwise."""
        ...

    async def fail_after_checkout(self) -> MongoError | None:
        """The failGetMoreAfterCursorCheckout fail point's error for a getMore, if armed."""
        ...


# A command the engine serves: (client, database, command) -> reply; Decline leaves it to mongos.
Handler = Callable[[ClientContext, str, dict[str, Any]], Awaitable[dict[str, Any]]]
