"""The engine's way to a shard member: the proxy's own login (SCRAM-SHA-256), the search for a
member of the wanted role (primary, or secondaryPreferred), and the TLS settings, held by
`MemberConnector`, which the engine calls to open each connection.
"""

from __future__ import annotations

import enum
import functools
import ssl
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, NamedTuple

from bson import Binary

from mongoformats.errors import MongoError
from mongoformats.scram import MECHANISM, ScramClient
from wireproxy.host_health import HostHealth
from wireproxy.upstream import (
    CONNECT_TIMEOUT_S,
    UpstreamClosed,
    UpstreamConnection,
    open_upstream,
)

__all__ = [
    "Credentials",
    "MemberConnector",
    "authenticate",
    "logged_in",
    "open_member",
    "upstream_ssl_context",
]


class Credentials(NamedTuple):
    """The proxy's own login on the upstream (from the `--upstream` URI), for the engine's
    connections."""

    user: str
    password: str
    source: str = "admin"

    def __repr__(self) -> str:  # reprs end up in logs and tracebacks: never the password
        return f"Credentials(user={self.user!r}, password='***', source={self.source!r})"


async def authenticate(conn: UpstreamConnection, credentials: Credentials) -> None:
    """SCRAM-SHA-256 over saslStart/saslContinue; AuthenticationFailed (18) if refused."""
    client = ScramClient(credentials.user, credentials.password)
    reply = await conn.command(
        credentials.source,
        {
            "saslStart": 1,
            "mechanism": MECHANISM,
            "payload": Binary(client.first(), 0),
            "options": {"skipEmptyExchange": True},
        },
    )
    final = client.final(bytes(reply["payload"]))
    reply = await conn.command(
        credentials.source,
        {"saslContinue": 1, "conversationId": reply["conversationId"], "payload": Binary(final, 0)},
    )
    client.verify(bytes(reply["payload"]))
    while not reply.get("done"):
        reply = await conn.command(
            credentials.source,
            {
                "saslContinue": 1,
                "conversationId": reply["conversationId"],
                "payload": Binary(b"", 0),
            },
        )


async def open_member(
    hosts: list[tuple[str, int]],
    *,
    secondary: bool,
    ssl_context: ssl.SSLContext | None = None,
    reply_timeout_s: float | None = None,
    health: HostHealth | None = None,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
) -> UpstreamConnection:
    """Connect to one member of a replica set: its primary, or (secondary=True) a secondary if one
    is reachable, else the primary (secondaryPreferred). Members that are down, recovering or in
    rollback (neither primary nor secondary), or that do not answer hello within the connect
    timeout (a hung process), are passed over; with `health`, members seen failing are tried
    last."""
    fallback: UpstreamConnection | None = None
    errors: list[str] = []
    connect = functools.partial(
        open_upstream,
        ssl_context=ssl_context,
        reply_timeout_s=reply_timeout_s,
        health=health,
        connect_timeout_s=connect_timeout_s,
    )
    try:
        for host, port in _ordered(hosts, health):
            tried = await _try_member(connect(host, port), secondary, connect_timeout_s, errors)
            if tried is None:
                continue
            fit, conn = tried
            if fit is _Fit.WANTED:
                return conn
            if fit is _Fit.FALLBACK and fallback is None:
                fallback = conn
            else:  # passed over: no socket is left open
                await conn.aclose()
        if fallback is not None:
            conn, fallback = fallback, None
            return conn
    finally:
        if fallback is not None:  # a better member answered, or the search was cancelled
            await fallback.aclose()
    raise _none_found(hosts, secondary, errors)


def _ordered(hosts: list[tuple[str, int]], health: HostHealth | None) -> list[tuple[str, int]]:
    """`hosts` in the order to try them: members seen failing last, with `health`."""
    return health.order(hosts) if health is not None else hosts


def _none_found(hosts: list[tuple[str, int]], secondary: bool, errors: list[str]) -> UpstreamClosed:
    names = ",".join(f"{h}:{p}" for h, p in hosts)
    wanted = "readable" if secondary else "primary"
    return UpstreamClosed(f"no {wanted} member among {names}: {'; '.join(errors)}")


async def _try_member(
    connecting: Awaitable[UpstreamConnection],
    secondary: bool,
    timeout_s: float,
    errors: list[str],
) -> tuple[_Fit, UpstreamConnection] | None:
    """How a member fits open_member's search, with the connection `connecting` makes to it;
    None when it could not be reached or asked, the error appended to `errors`. A connection
    that fails, or is cancelled, mid-handshake is closed."""
    try:
        conn = await connecting
    except UpstreamClosed as exc:
        errors.append(str(exc))
        return None
    try:
        return await _member_fit(conn, secondary, timeout_s), conn
    except (UpstreamClosed, MongoError) as exc:
        errors.append(str(exc))
        await conn.aclose()
        return None
    except BaseException:
        await conn.aclose()
        raise


class _Fit(enum.Enum):
    """How a member answers open_member's search: the role asked for, the primary standing in
    for a secondary (secondaryPreferred), or neither."""

    WANTED = "wanted"
    FALLBACK = "fallback"
    NONE = "none"


async def _member_fit(conn: UpstreamConnection, secondary: bool, timeout_s: float) -> _Fit:
    """Asks the member behind `conn` its role (hello, within `timeout_s`)."""
    hello = await conn.command("admin", {"hello": 1}, timeout_s=timeout_s)
    is_primary = bool(hello.get("isWritablePrimary"))
    if (secondary and hello.get("secondary")) or (not secondary and is_primary):
        return _Fit.WANTED
    return _Fit.FALLBACK if secondary and is_primary else _Fit.NONE


async def logged_in(
    conn: UpstreamConnection, credentials: Credentials | None
) -> UpstreamConnection:
    """`conn`, authenticated with `credentials` if any (closed if that fails)."""
    if credentials is not None:
        try:
            await authenticate(conn, credentials)
        except BaseException:  # a refused login, a dead socket or a cancellation: no socket leaks
            await conn.aclose()
            raise
    return conn


def upstream_ssl_context(
    tls: bool, ca_file: str = "", allow_invalid: bool = False
) -> ssl.SSLContext | None:
    """The client-side TLS context for upstream connections (None: plain TCP)."""
    if not tls:
        return None
    ctx = ssl.create_default_context(cafile=ca_file or None)
    if allow_invalid:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


@dataclass(frozen=True)
class MemberConnector:
    """The engine's way to a shard member: TLS settings and the proxy's own login.

    Settings only, so it pickles: a reader process (readerProcesses) connects with the same
    settings as the proxy process. The TLS context is built once per process, on first use.
    """

    tls: bool = False
    tls_ca_file: str = ""
    tls_allow_invalid: bool = False
    credentials: Credentials | None = None
    reply_timeout_s: float | None = None  # see UpstreamConnection.command
    connect_timeout_s: float = CONNECT_TIMEOUT_S  # to connect, and for the member's hello

    async def __call__(
        self, hosts: list[tuple[str, int]], *, secondary: bool
    ) -> UpstreamConnection:
        conn = await open_member(
            hosts,
            secondary=secondary,
            ssl_context=self.ssl_context(),
            reply_timeout_s=self.reply_timeout_s,
            health=self.health,
            connect_timeout_s=self.connect_timeout_s,
        )
        return await logged_in(conn, self.credentials)

    def ssl_context(self) -> ssl.SSLContext | None:
        cached: ssl.SSLContext | None = self.__dict__.get("_ctx")
        if cached is None and self.tls:
            cached = upstream_ssl_context(self.tls, self.tls_ca_file, self.tls_allow_invalid)
            object.__setattr__(self, "_ctx", cached)
        return cached

    @property
    def health(self) -> HostHealth:
        """The members this connector saw failing: every reader, note and command of the engine
        that connects through it passes them over first."""
        record: HostHealth | None = self.__dict__.get("_health")
        if record is None:
            record = HostHealth()
            object.__setattr__(self, "_health", record)
        return record

    def __getstate__(self) -> dict[str, Any]:
        # An SSLContext does not pickle, and a reader process keeps its own record of failed
        # members.
        return {k: v for k, v in self.__dict__.items() if k not in ("_ctx", "_health")}
