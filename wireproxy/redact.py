"""Secrets kept out of everything the proxy shows (logs, reprs of its settings, status, errors):
the one place that knows what in a connection string is secret."""

from __future__ import annotations

import re

__all__ = ["REDACTED", "redact_uri"]

REDACTED = "***"

# Connection-string options whose values are secrets (AWS session tokens travel in
# authMechanismProperties; the key file passwords unlock client certificates).
_SECRET_OPTIONS = (
    "authMechanismProperties",
    "tlsCertificateKeyFilePassword",
    "sslPEMKeyPassword",
    "sslClientCertificateKeyPassword",
)
_SECRET_OPTION = re.compile(r"(?i)([?&;](?:" + "|".join(_SECRET_OPTIONS) + r")=)[^&;]*")


def redact_uri(uri: str) -> str:
    """`uri` with its password and secret options replaced by REDACTED; the user name and hosts
    stay (they say which login and which cluster, and are no secret).

    A valid URI has no unescaped '/', '?' or '@' in its user information, so it ends at the last
    '@' before the host list. A malformed one (as an error may quote) may have any of them: then
    everything up to its last '@' is taken for user information, hiding too much rather than a
    password.
    """
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return REDACTED if "@" in uri else uri
    rest = _without_password(rest)
    return f"{scheme}{sep}{_SECRET_OPTION.sub(lambda m: m.group(1) + REDACTED, rest)}"


def _user_info_end(rest: str) -> int:
    """Where the user information of `rest` (a URI after its scheme) ends: its last '@' before
    the host list, else its last '@' at all (a malformed URI); -1 for none."""
    authority_end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    at = rest.rfind("@", 0, authority_end)
    return at if at >= 0 else rest.rfind("@")


def _without_password(rest: str) -> str:
    """`rest` (a URI after its scheme) with its password, or user information that is no user
    name, replaced by REDACTED."""
    at = _user_info_end(rest)
    if at < 0:
        return rest
    user, has_password, _ = rest[:at].partition(":")
    if has_password:
        return f"{user}:{REDACTED}{rest[at:]}"
    if "/" in user or "?" in user:
        return f"{REDACTED}{rest[at:]}"  # not a user name: a malformed URI's leftovers
    return rest
