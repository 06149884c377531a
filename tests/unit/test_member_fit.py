"""Which replica-set member open_member keeps, from the member's hello reply (no sockets):
the role asked for, else for a secondary read the primary (secondaryPreferred), else none;
members in other states (recovering, rollback, arbiters) are passed over."""

from __future__ import annotations

import pytest

from wireproxy.members import _Fit, _member_fit


class _Member:
    """Answers hello with `reply`, as a member's UpstreamConnection would."""

    def __init__(self, reply: dict[str, object]) -> None:
        self.reply = reply

    async def command(
        self, db: str, cmd: dict[str, object], *, timeout_s: float
    ) -> dict[str, object]:
        assert (db, cmd) == ("admin", {"hello": 1})
        return self.reply


PRIMARY = {"isWritablePrimary": True, "secondary": False}
SECONDARY = {"isWritablePrimary": False, "secondary": True}
OTHER = {"isWritablePrimary": False, "secondary": False}  # e.g. RECOVERING or ROLLBACK


@pytest.mark.parametrize(
    ("reply", "secondary", "fit"),
    [
        (PRIMARY, False, _Fit.WANTED),
        (SECONDARY, False, _Fit.NONE),
        (OTHER, False, _Fit.NONE),
        (SECONDARY, True, _Fit.WANTED),
        (PRIMARY, True, _Fit.FALLBACK),
        (OTHER, True, _Fit.NONE),
    ],
)
async def test_a_member_fits_by_its_role(reply, secondary, fit, autojump_clock):
    assert await _member_fit(_Member(reply), secondary, 1.0) is fit  # type: ignore[arg-type]
