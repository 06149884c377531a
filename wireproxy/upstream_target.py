"""Where the proxy's upstream is: the `upstream` connection string, read as a driver reads it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pymongo.errors import ConfigurationError
from pymongo.uri_parser import parse_uri

from mongoformats.scram import MECHANISM
from wireproxy.members import Credentials, MemberConnector
from wireproxy.upstream import CONNECT_TIMEOUT_S

__all__ = ["UpstreamTarget"]


@dataclass(frozen=True)
class UpstreamTarget:
    """The mongos to connect to, and how: the `upstream` connection string read by pymongo's own
    parser, so a URI a driver refuses is refused here with the driver's message, and its options
    mean what they mean to a driver. The proxy's upstream_tls* settings add to the URI's tls ones.

    A mongodb+srv:// name is looked up in DNS (SRV and TXT records, as drivers do) when this is
    made: once, when the proxy starts.
    """

    hosts: list[tuple[str, int]]
    member: MemberConnector  # TLS and login; the engine's connections to shard members use the same
    heartbeat_s: float = 10.0  # how often each mongos is checked (heartbeatFrequencyMS)

    @classmethod
    def from_uri(
        cls,
        uri: str,
        *,
        tls: bool = False,
        tls_ca_file: str = "",
        tls_allow_invalid: bool = False,
        reply_timeout_s: float | None = None,
    ) -> UpstreamTarget:
        try:
            parsed = parse_uri(uri)
        except (ConfigurationError, ValueError) as exc:
            # Not the URI itself: it may hold a password.
            raise ValueError(f"upstream: {exc}") from None
        options = parsed["options"]
        insecure = bool(options.get("tlsInsecure") or options.get("tlsAllowInvalidCertificates"))
        # pymongo's parser gives these in seconds; a connectTimeoutMS of 0 means no limit, as to
        # a driver.
        connect_timeout_s = options.get("connectTimeoutMS", CONNECT_TIMEOUT_S) or math.inf
        return cls(
            parsed["nodelist"],
            MemberConnector(
                tls=tls or bool(options.get("tls")),
                tls_ca_file=tls_ca_file or options.get("tlsCAFile", ""),
                tls_allow_invalid=tls_allow_invalid or insecure,
                credentials=_credentials(parsed),
                reply_timeout_s=reply_timeout_s,
                connect_timeout_s=connect_timeout_s,
            ),
            heartbeat_s=options.get("heartbeatFrequencyMS", 10.0),
        )


def _credentials(parsed: dict[str, Any]) -> Credentials | None:
    """The login a URI parsed by pymongo names, if any; ValueError for a mechanism other than
    the one the proxy logs in with."""
    options = parsed["options"]
    mechanism = options.get("authMechanism", MECHANISM)
    if mechanism != MECHANISM:
        raise ValueError(
            f"upstream: authMechanism {mechanism} is not supported; the proxy "
            f"logs in with {MECHANISM}"
        )
    if not parsed["username"]:
        return None
    # As drivers do: authSource, else the URI's database, else admin.
    source = options.get("authSource") or parsed["database"] or "admin"
    return Credentials(parsed["username"], parsed["password"] or "", source)
