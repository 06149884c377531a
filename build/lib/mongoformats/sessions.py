"""Logical sessions: which sessions a killSessions or killAllSessions command names.

One rule for everything a session owns: simcluster's cursors and transactions, and the proxy's
bucket cursors. The server applies it to its session catalog (KillAllSessionsByPattern); here it
is a test of (session id, user) that each owner applies to what it holds.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

__all__ = ["UNKNOWN_USER", "SessionsNamed", "session_id", "sessions_named"]

# The user of something that keeps none (a transaction in simcluster): only an id or an empty list names it.
UNKNOWN_USER = object()
SessionsNamed = Callable[[bytes | None, Any], bool]  # (session id or None, user or UNKNOWN_USER) -> named?


def session_id(value: Any) -> bytes:
    """A session id (UUID, decoded as Binary subtype 4 or uuid.UUID) as its 16 bytes."""
    return value.bytes if isinstance(value, uuid.UUID) else bytes(value)


def sessions_named(cmd: dict[str, Any], caller: str | None, *, access_control: bool) -> SessionsNamed:
    """Which sessions a killSessions [{id}] or killAllSessions [{user, db}] names, as a test of
    (session id, user). An empty list names every session, except that under access control
    killSessions names the caller's own. Of something with UNKNOWN_USER, only an id in the list,
    or an empty list that names every session, can tell."""
    name = next(iter(cmd))
    specs = cmd[name] if isinstance(cmd[name], list) else []
    if name.lower() == "killsessions":
        ids = {session_id(spec["id"]) for spec in specs}

        def named(lsid: bytes | None, user: Any) -> bool:
            if ids and lsid not in ids:
                return False
            return not access_control or (bool(ids) if user is UNKNOWN_USER else user == caller)
        return named
    users = {spec.get("user") for spec in specs}
    return lambda lsid, user: not users or (user is not UNKNOWN_USER and user in users)
