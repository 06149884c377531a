"""The unit layer: pure code, no sockets, and trio (if at all) on trio.testing.MockClock."""

from __future__ import annotations

import pytest

from tests.layer_rules import check_unit_test, refuse_sockets


@pytest.fixture(autouse=True)
def _unit_layer_rules(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    check_unit_test(request)
    refuse_sockets(monkeypatch)
