"""The drivers' change-streams conformance suite (unified format) against simcluster, and through
the proxy (pass-through). Tests that cannot apply are skipped with the reason (README lists them).

The suite's files (mongodb/specifications, source/change-streams/tests/unified and
source/unified-test-format) are not in this repository: PCS_SPEC_TESTS names the folder holding
`change-streams/` (`make test` sets it to ../shared/spec-tests when that exists). Without them
the module is skipped with one reason naming the variable; in CI (CI=true) that fails instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from simcluster import open_cluster
from tests.conftest import sync
from tests.unified.runner import UnifiedTest, requirements_met
from wireproxy.app import serve_proxy
from wireproxy.config import ProxyConfig

SPEC_ENV = "PCS_SPEC_TESTS"


def spec_dir(environ: dict[str, str] | os._Environ[str]) -> tuple[Path, str | None]:
    """The change-streams folder, and why it cannot be used (None: it can)."""
    root = environ.get(SPEC_ENV, "")
    folder = Path(root).resolve() / "change-streams"
    if not root:
        return folder, (
            f"{SPEC_ENV} is not set: set it to the folder holding the drivers' spec "
            "tests (change-streams/*.json), e.g. ../shared/spec-tests"
        )
    if not any(folder.glob("*.json")):
        return folder, f"{SPEC_ENV}={root}: no spec tests in {folder} (change-streams/*.json)"
    return folder, None


SPEC_DIR, MISSING = spec_dir(os.environ)
if MISSING and os.environ.get("CI", "").lower() != "true":
    pytest.skip(MISSING, allow_module_level=True)

# Why some tests cannot run here; everything else must pass.
SKIPS = {
    "change-streams-nsType.json": "nsType is a MongoDB 8.1 feature; simcluster reports 7.0",
    "The watch helper must not throw a custom exception when executed against a single server "
    "topology, but instead depend on a server error": (
        "needs a standalone server; simcluster runs replica sets and mongos"
    ),
}


def test_spec_tests_are_present() -> None:
    """In CI the conformance suite must run: missing files fail it rather than skip its tests."""
    if MISSING:
        pytest.fail(MISSING)


def _cases() -> list[Any]:
    out: list[Any] = []
    if MISSING:
        return out
    for path in sorted(SPEC_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        for test in data["tests"]:
            marks = []
            reason = SKIPS.get(path.name) or SKIPS.get(test["description"])
            if reason:
                marks.append(pytest.mark.skip(reason=reason))
            out.append(
                pytest.param(
                    path.name,
                    test["description"],
                    id=f"{path.stem}:{test['description'][:70]}",
                    marks=marks,
                )
            )
    return out


def _load(filename: str, description: str) -> tuple[dict[str, Any], dict[str, Any]]:
    data = json.loads((SPEC_DIR / filename).read_text())
    return data, next(t for t in data["tests"] if t["description"] == description)


@pytest.mark.parametrize("via", ["direct", "proxy", "accelerated"])
@pytest.mark.parametrize("filename,description", _cases())
async def test_change_streams_spec(filename: str, description: str, via: str) -> None:
    data, test = _load(filename, description)
    # Accelerated: on the sharded cluster where a test allows it (the engine merges its shards),
    # else on the replica set (one shard to the engine).
    topologies = ["sharded", "replicaset"] if via == "accelerated" else ["replicaset", "sharded"]
    runnable = [
        t
        for t in topologies
        if requirements_met(data.get("runOnRequirements"), t)
        and requirements_met(test.get("runOnRequirements"), t)
    ]
    if not runnable:
        pytest.skip(
            "runOnRequirements exclude MongoDB 7.0 on a replica set and on a sharded cluster"
        )
    topology = runnable[0]
    async with open_cluster(
        shards=2 if topology == "sharded" else 1, periodic_noop_s=0.2
    ) as cluster:
        uri = cluster.uri if topology == "sharded" else cluster.shard_uri("shard0")
        async with trio.open_nursery() as nursery:
            if via in ("proxy", "accelerated"):
                upstream = (
                    cluster.uri
                    if topology == "sharded"
                    else f"mongodb://{cluster.shards['shard0'].address}/"
                )
                server = await nursery.start(
                    serve_proxy,
                    ProxyConfig(
                        upstream=upstream,
                        listen_port=0,
                        accelerate_change_streams=via == "accelerated",
                    ),
                )
                uri = f"mongodb://127.0.0.1:{server.port}/"
            await sync(UnifiedTest(uri, data, test).run, timeout=60)
            if via == "accelerated" and _opens_a_stream(test):
                # The streams were the engine's, not mongos's passed through.
                assert server.engine.watches["accelerated"] > 0, server.engine.watches
            nursery.cancel_scope.cancel()


def _opens_a_stream(test: dict[str, Any]) -> bool:
    """The test opens a change stream that the server accepts (not one it must refuse)."""
    return any(
        op["name"] == "createChangeStream" and "expectError" not in op for op in test["operations"]
    )
