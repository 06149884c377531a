"""Routing: a pure function from a decoded command to what the proxy does with it.

- HELLO: answered by the proxy itself, as a mongos.
- LOCAL: a command of the proxy's own (the engine registers `parallelChangeStream`, ...), or a
  getMore/killCursors on a cursor the proxy owns, or a `$changeStream` aggregate when change
  stream acceleration is on.
- PASSTHROUGH: everything else goes to the upstream unchanged.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Container, Mapping
from dataclasses import dataclass, field
from typing import Any


class PassThrough(Exception):  # noqa: N818 (a signal, not an error)
    """Raised by a local handler that declines a request: the session forwards it to the
    upstream."""


class Route(enum.Enum):
    HELLO = "hello"
    LOCAL = "local"
    PASSTHROUGH = "passthrough"


HELLO_NAMES = frozenset({"hello", "ismaster"})

# handler(session, db, command) -> reply document
LocalHandler = Callable[[Any, str, dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass
class CommandTable:
    """Commands the proxy serves itself. The composition root (wireproxy/app.py) fills it with
    the engine's; the router only reads it."""

    commands: dict[str, LocalHandler] = field(default_factory=dict)
    # Cursor ids the proxy owns: their getMore/killCursors are local, all others pass through.
    owned_cursors: Container[int] = field(default_factory=set)
    change_stream_handler: LocalHandler | None = None
    get_more: LocalHandler | None = None
    kill_cursors: LocalHandler | None = None

    def register(self, name: str, handler: LocalHandler) -> None:
        self.commands[name.lower()] = handler


def _cursor_id(value: object) -> int | None:
    """A cursor id (an integer), else None: a command with a malformed id passes through, and
    mongos answers it with its own error."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def classify(
    cmd: Mapping[str, Any], table: CommandTable, *, accelerate: bool
) -> tuple[Route, LocalHandler | None]:
    name = next(iter(cmd), "").lower()
    if name in HELLO_NAMES:
        return Route.HELLO, None
    handler = (
        table.commands.get(name)
        or _owned_cursor_handler(name, cmd, table)
        or _change_stream_handler(name, cmd, table, accelerate)
    )
    if handler is None:
        return Route.PASSTHROUGH, None
    return Route.LOCAL, handler


def _owned_cursor_handler(
    name: str, cmd: Mapping[str, Any], table: CommandTable
) -> LocalHandler | None:
    """The local handler of a getMore on a cursor the proxy owns, or of a killCursors naming one."""
    if name == "getmore":
        return _owned_get_more(cmd, table)
    if name == "killcursors":
        return _owned_kill_cursors(cmd, table)
    return None


def _owned_get_more(cmd: Mapping[str, Any], table: CommandTable) -> LocalHandler | None:
    """The local getMore handler, if `cmd` continues a cursor the proxy owns."""
    if table.get_more and _cursor_id(cmd["getMore"]) in table.owned_cursors:
        return table.get_more
    return None


def _owned_kill_cursors(cmd: Mapping[str, Any], table: CommandTable) -> LocalHandler | None:
    """The local killCursors handler, if `cmd` names a cursor the proxy owns."""
    cursors = cmd.get("cursors")
    if not table.kill_cursors or not isinstance(cursors, list):
        return None
    if any(_cursor_id(c) in table.owned_cursors for c in cursors):
        return table.kill_cursors
    return None


def _change_stream_handler(
    name: str, cmd: Mapping[str, Any], table: CommandTable, accelerate: bool
) -> LocalHandler | None:
    """The local handler of a `$changeStream` aggregate, when acceleration is on."""
    if name != "aggregate" or not accelerate or not table.change_stream_handler:
        return None
    return table.change_stream_handler if _opens_change_stream(cmd) else None


def _opens_change_stream(cmd: Mapping[str, Any]) -> bool:
    """Whether the aggregate `cmd`'s pipeline begins with a `$changeStream` stage."""
    pipeline = cmd.get("pipeline") or []
    return bool(pipeline) and isinstance(pipeline[0], Mapping) and "$changeStream" in pipeline[0]
