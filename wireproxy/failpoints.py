"""The upstream's test fail points, honoured on the commands the proxy answers itself.

Drivers' test suites (and users' own resume tests) arm `failCommand` and
`failGetMoreAfterCursorCheckout` on mongos with `configureFailPoint` (test commands enabled).
The proxy forwards those commands unchanged, so every command it passes through meets them on
mongos. A getMore, killCursors or `$changeStream` aggregate the engine answers never reaches
mongos, so the proxy remembers which of these fail points mongos accepted and:

- failCommand: lets mongos decide, so its counts, skips and filters stay mongos's own. Before
  such a local command it sends mongos a probe of the same name that changes nothing: a getMore
  or killCursors of a cursor id that does not exist, or the aggregate itself (its cursor is
  killed at once). If mongos answers anything but the probe's ordinary answer, the fail point
  fired, and that answer (error code, labels, a delay, a closed connection) is the command's.
- failGetMoreAfterCursorCheckout fires only once a real cursor is checked out, which no probe
  can reach. The proxy fires it on its own cursors and re-arms mongos with the count that is left,
  so the two never fire more often together than mongos alone would.

Probes are sent only while such a fail point is armed, which a production cluster never is.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any

import bson
from bson import Int64

from mongoformats.errors import MongoError
from wireproxy.upstream import UpstreamConnection

FAIL_COMMAND = "failCommand"
AFTER_CHECKOUT = "failGetMoreAfterCursorCheckout"
_FOLLOWED = (FAIL_COMMAND, AFTER_CHECKOUT)
GetUpstream = Callable[[], Awaitable[UpstreamConnection]]  # the client's pinned mongos connection


class UpstreamFailPoints:
    """The fail points mongos accepted through this proxy (one instance per proxy)."""

    def __init__(self) -> None:
        self._armed: dict[str, dict[str, Any]] = {}  # name -> {"mode": ..., "data": {...}}
        self._rng = random.Random()

    def observe(self, cmd: dict[str, Any], ok: bool) -> None:
        """A `configureFailPoint` passed through (decoded); follow it if mongos accepted it."""
        name = cmd.get("configureFailPoint")
        if name not in _FOLLOWED or not ok:
            return
        mode = cmd.get("mode", "off")
        if mode == "off":
            self._armed.pop(name, None)
        else:
            self._armed[name] = {
                "mode": dict(mode) if isinstance(mode, dict) else mode,
                "data": dict(cmd.get("data") or {}),
            }

    def _spend(self, name: str) -> None:
        """One firing of `name` seen: a {times: n} fail point is off after its n-th."""
        fp = self._armed[name]
        mode = fp["mode"]
        if isinstance(mode, dict) and "times" in mode:
            mode["times"] = int(mode["times"]) - 1
            if mode["times"] <= 0:
                del self._armed[name]

    async def probe(
        self, upstream: GetUpstream, name: str, db: str, cmd: dict[str, Any]
    ) -> dict[str, Any] | None:
        """mongos's answer if its failCommand fires for the local command `name`, else None.
        `upstream` is called only then: a session need not open a mongos connection for this."""
        fp = self._armed.get(FAIL_COMMAND)
        if fp is None or name not in fp["data"].get("failCommands", ()):
            return None
        up = await upstream()
        fake = Int64(self._rng.getrandbits(62) | 1)
        trial = _TRIALS.get(name)
        if trial is None:
            return None
        reply, missed = await trial(up, db, cmd, fake)
        if missed:
            return None
        self._spend(FAIL_COMMAND)
        return {k: v for k, v in reply.items() if k not in ("$clusterTime", "operationTime")}

    async def after_checkout(self, upstream: GetUpstream) -> MongoError | None:
        """The error of failGetMoreAfterCursorCheckout if it fires on a getMore of the proxy's own
        cursor; mongos is then re-armed with what is left of its count."""
        fp = self._armed.get(AFTER_CHECKOUT)
        if fp is None:
            return None
        mode = fp["mode"]
        fires = _fires(mode)
        data = fp["data"]
        if fires:
            self._spend(AFTER_CHECKOUT)
        if isinstance(mode, dict):  # a count moved: mongos's copy follows it
            await self._rearm_after_checkout(upstream, data)
        return _after_checkout_error(data) if fires else None

    async def _rearm_after_checkout(self, upstream: GetUpstream, data: dict[str, Any]) -> None:
        """Arm mongos's failGetMoreAfterCursorCheckout with what is left of the proxy's."""
        left = self._armed.get(AFTER_CHECKOUT)
        await (await upstream()).command(
            "admin",
            {
                "configureFailPoint": AFTER_CHECKOUT,
                "mode": "off" if left is None else left["mode"],
                "data": data,
            },
            check=False,
        )


def _after_checkout_error(data: dict[str, Any]) -> MongoError:
    """The error failGetMoreAfterCursorCheckout fails a getMore with, given its `data`."""
    return MongoError(
        int(data.get("errorCode", 1)),
        f"Failing command via '{AFTER_CHECKOUT}' failpoint",
        labels=tuple(data.get("errorLabels", ())),
    )


def _fires(mode: str | dict[str, Any]) -> bool:
    """Whether a fail point in `mode` fires this time: alwaysOn, {times: n} while n > 0, or
    {skip: n} once n are skipped (a skipped time counts down `mode`'s skip)."""
    if isinstance(mode, dict) and int(mode.get("skip", 0)) > 0:
        mode["skip"] = int(mode["skip"]) - 1
        return False
    return mode == "alwaysOn" or (isinstance(mode, dict) and int(mode.get("times", 1)) > 0)


# How the proxy learns whether mongos's failCommand fires for a command it runs itself: it sends
# mongos a harmless command of the same name (on a cursor id no cursor has), whose answer is
# mongos's own when the fail point fired. Each returns mongos's reply and whether it missed.
Trial = Callable[
    [UpstreamConnection, str, dict[str, Any], Int64], Awaitable[tuple[dict[str, Any], bool]]
]


async def _run(up: UpstreamConnection, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
    return bson.decode((await up.command(db, cmd, check=False)).raw)


async def _try_get_more(
    up: UpstreamConnection, db: str, cmd: dict[str, Any], fake: Int64
) -> tuple[dict[str, Any], bool]:
    """A getMore on no cursor: CursorNotFound (43) naming it when the fail point missed."""
    reply = await _run(up, db, {"getMore": fake, "collection": cmd.get("collection")})
    missed = reply.get("code") == 43 and str(int(fake)) in str(reply.get("errmsg", ""))
    return reply, missed


async def _try_kill_cursors(
    up: UpstreamConnection, db: str, cmd: dict[str, Any], fake: Int64
) -> tuple[dict[str, Any], bool]:
    """A killCursors of no cursor: ok when the fail point missed."""
    reply = await _run(up, db, {"killCursors": cmd.get("killCursors"), "cursors": [fake]})
    return reply, bool(reply.get("ok"))


async def _try_aggregate(
    up: UpstreamConnection, db: str, cmd: dict[str, Any], fake: Int64
) -> tuple[dict[str, Any], bool]:
    """The aggregate itself, outside the client's session: ok when the fail point missed, and
    the cursor it opened is killed."""
    sent = {k: v for k, v in cmd.items() if k not in ("lsid", "$clusterTime", "txnNumber")}
    reply = await _run(up, db, sent)
    missed = bool(reply.get("ok"))
    cursor = reply.get("cursor") or {}
    if missed and cursor.get("id"):
        coll = str(cursor.get("ns", "")).partition(".")[2]
        await up.command(db, {"killCursors": coll, "cursors": [cursor["id"]]}, check=False)
    return reply, missed


_TRIALS: dict[str, Trial] = {
    "getMore": _try_get_more,
    "killCursors": _try_kill_cursors,
    "aggregate": _try_aggregate,
}
