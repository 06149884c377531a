"""The component layer: the engine against fake ports, sessions over memory streams; trio on the
real clock is allowed, the network is not."""

from __future__ import annotations

import pytest

from tests.layer_rules import refuse_sockets


@pytest.fixture(autouse=True)
def _component_layer_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_sockets(monkeypatch)
