"""Logical sessions: which sessions a killSessions or killAllSessions command names.

One rule for everything a session owns: simcluster's cursors and transactions, and the proxy's
bucket cursors. The server applies it to its session catalog (KillAllSessionsByPattern); here it
is a test of (session id, user) that each owner applies to what it holds.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from typing import Any

__all__ = [
    "UNKNOWN_USER",
    "SessionsNamed",
    "session_id",
    "sessions_named",
    "user_digest",
    "user_identity",
]

# The user of something that keeps none (a transaction in simcluster): only an id or an empty
# list names it.
UNKNOWN_USER = object()
# (session id or None, user or UNKNOWN_USER) -> named?
SessionsNamed = Callable[[bytes | None, Any], bool]


def session_id(value: Any) -> bytes:
    """A session id (UUID, decoded as Binary subtype 4 or uuid.UUID) as its 16 bytes."""
    return value.bytes if isinstance(value, uuid.UUID) else bytes(value)


def user_identity(user: Any, db: Any) -> str:
    """A user as the server names it ("user@db", its UserName form): how owners record users."""
    return f"{user}@{db}"


def sessions_named(
    cmd: dict[str, Any], caller: str | None, *, access_control: bool, kill_any: bool = False
) -> SessionsNamed:
    """Which sessions a killSessions [{id}] or killAllSessions [{user, db}] names, as a test of
    (session id, user); users are user_identity strings, `caller` too.

    As the server decides (kill_sessions_command.cpp, makeLogicalSessionIds with killAnySession):
    an empty killSessions names the caller's own sessions under access control (every session
    without); listed ids name those sessions of any user for a caller holding killAnySession
    (`kill_any`), and only the caller's own otherwise. killAllSessions [{user, db}] names those
    users' sessions, an empty list every session; it needs killAnySession, which the server
    checks before it runs. Of something with UNKNOWN_USER, only an id in the list, or an empty
    list that names every session, can tell."""
    name = next(iter(cmd))
    specs = cmd[name] if isinstance(cmd[name], list) else []
    if name.lower() == "killsessions":
        return _by_ids(specs, caller, access_control=access_control, kill_any=kill_any)
    if name.lower() == "killallsessionsbypattern":
        return _by_patterns([spec for spec in specs if isinstance(spec, dict)])
    return _by_users(specs)


def _by_ids(
    specs: list[Any], caller: str | None, *, access_control: bool, kill_any: bool
) -> SessionsNamed:
    """killSessions [{id}]: see `sessions_named`."""
    ids = {session_id(spec["id"]) for spec in specs}
    own_only = access_control and not (ids and kill_any)

    def named(lsid: bytes | None, user: Any) -> bool:
        if ids and lsid not in ids:
            return False
        return not own_only or (bool(ids) if user is UNKNOWN_USER else user == caller)

    return named


def _by_users(specs: list[Any]) -> SessionsNamed:
    """killAllSessions [{user, db}]: those users' sessions, every session for an empty list."""
    users = {
        user_identity(spec.get("user"), spec.get("db")) for spec in specs if isinstance(spec, dict)
    }
    return lambda lsid, user: not users or (user is not UNKNOWN_USER and user in users)


def user_digest(identity: str) -> bytes:
    """A session's `uid`: SHA-256 of the user's "user@db" (of "" for no user)."""
    return hashlib.sha256(identity.encode()).digest()


def _by_patterns(patterns: list[dict[str, Any]]) -> SessionsNamed:
    """killAllSessionsByPattern: a session named by any pattern, every session by an empty list.
    A pattern gives an lsid ({id, uid}), a uid, or users [{user, db}]; `roles` patterns are not
    modelled (they name no session here)."""
    ids: set[bytes | None] = set()
    uids: set[bytes] = set()
    users: set[str] = set()
    for pattern in patterns:
        _take_pattern(pattern, ids, uids, users)

    def named(lsid: bytes | None, user: Any) -> bool:
        if not patterns or lsid in ids:
            return True
        return (
            user is not UNKNOWN_USER
            and user is not None
            and (user in users or user_digest(user) in uids)
        )

    return named


def _take_pattern(
    pattern: dict[str, Any], ids: set[bytes | None], uids: set[bytes], users: set[str]
) -> None:
    """Add what one killAllSessionsByPattern pattern names: its lsid's id, its uid, its users."""
    if isinstance(pattern.get("lsid"), dict) and "id" in pattern["lsid"]:
        ids.add(session_id(pattern["lsid"]["id"]))
    if "uid" in pattern:
        uids.add(bytes(pattern["uid"]))
    users.update(
        user_identity(u.get("user"), u.get("db"))
        for u in pattern.get("users") or ()
        if isinstance(u, dict)
    )
