"""The conformance corpus: cases taken from the server's own jstests (tests/conformance/cases/),
each played on simcluster, through the accelerated proxy and through parallelChangeStream
buckets, on every MongoDB version the case applies to. A case's expected events are what its
jstest asserts, never what this project's code produces."""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conformance import cases as case_modules
from tests.conformance.environment import Endpoints, running
from tests.conformance.model import Case, comparable, resolve, substitute
from tests.conformance.runner import play


def _cases() -> list[Case]:
    found: list[Case] = []
    for info in pkgutil.iter_modules(case_modules.__path__):
        module = importlib.import_module(f"{case_modules.__name__}.{info.name}")
        found += module.CASES
    names = [c.name for c in found]
    assert len(names) == len(set(names)), "conformance case names must be unique"
    return found


CASES = _cases()


def _marks(case: Case, path: str) -> list[pytest.MarkDecorator]:
    if path in case.diverges:
        return [pytest.mark.xfail(strict=True, reason=case.diverges[path])]
    return []


PARAMS = [
    pytest.param(case, path, version, id=f"{version}-{path}-{case.name}", marks=_marks(case, path))
    for case in CASES
    for version in case.versions
    for path in case.paths
]


class _Clusters:
    """One cluster and proxy per MongoDB version, started when a case first needs it."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self._stack = stack
        self._running: dict[str, Endpoints] = {}

    def __getitem__(self, version: str) -> Endpoints:
        if version not in self._running:
            self._running[version] = self._stack.enter_context(running(version))
        return self._running[version]


@pytest.fixture(scope="session")
def clusters() -> Iterator[_Clusters]:
    with contextlib.ExitStack() as stack:
        yield _Clusters(stack)


def _in_order_of(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`expected` reordered so that each event stands where `got` has an event matching it, as the
    jstests' unordered comparison matches each event against any expected one; events that match
    none keep their order after the matched ones."""
    remaining = list(expected)
    ordered = []
    for event in got:
        match = next((e for e in remaining if comparable(event, e) == e), None)
        if match is not None:
            remaining.remove(match)
            ordered.append(match)
    return ordered + remaining


@pytest.mark.parametrize(("case", "path", "version"), PARAMS)
def test_conformance(case: Case, path: str, version: str, clusters: _Clusters) -> None:
    db, got, uuids = play(case, path, clusters[version])
    if case.error is not None:
        assert got == case.error, f"{case.source}: expected error {case.error}, got {got}"
        return
    assert isinstance(got, list), f"{case.source}: opening the stream failed with {got}"
    expected = [resolve(substitute(e, db), uuids) for e in case.expect]
    if case.prefix:
        got = got[: len(expected)]
    if case.unordered:
        expected = _in_order_of(got, expected)
    actual = [comparable(a, e) for a, e in zip(got, expected, strict=False)]
    assert len(got) == len(expected) and actual == expected, (
        f"{case.source}\nexpected: {expected}\nactual:   {[comparable(a, {}) for a in got]}"
    )
