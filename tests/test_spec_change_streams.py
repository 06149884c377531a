"""The drivers' change-streams conformance suite (unified format) against simcluster, and through
the proxy (pass-through). Tests that cannot apply are skipped with the reason (README lists them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from simcluster import open_cluster
from tests.conftest import sync
from tests.unified.runner import UnifiedTest, requirements_met
from wireproxy.app import serve_proxy
from wireproxy.config import ProxyConfig

SPEC_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "spec-tests" / "change-streams"

# Why some tests cannot run here; everything else must pass.
SKIPS = {
    "change-streams-nsType.json": "nsType is a MongoDB 8.1 feature; simcluster reports 7.0",
    "The watch helper must not throw a custom exception when executed against a single server topology, but "
    "instead depend on a server error": "needs a standalone server; simcluster runs replica sets and mongos",
}


def _cases() -> list[Any]:
    out = []
    if not SPEC_DIR.exists():
        return out
    for path in sorted(SPEC_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        for test in data["tests"]:
            marks = []
            reason = SKIPS.get(path.name) or SKIPS.get(test["description"])
            if reason:
                marks.append(pytest.mark.skip(reason=reason))
            out.append(pytest.param(path.name, test["description"], id=f"{path.stem}:{test['description'][:70]}",
                                    marks=marks))
    return out


def _load(filename: str, description: str) -> tuple[dict[str, Any], dict[str, Any]]:
    data = json.loads((SPEC_DIR / filename).read_text())
    return data, next(t for t in data["tests"] if t["description"] == description)


@pytest.mark.parametrize("via", ["direct", "proxy"])
@pytest.mark.parametrize("filename,description", _cases())
async def test_change_streams_spec(filename: str, description: str, via: str) -> None:
    data, test = _load(filename, description)
    topologies = ["replicaset", "sharded"]
    runnable = [t for t in topologies if requirements_met(data.get("runOnRequirements"), t)
                and requirements_met(test.get("runOnRequirements"), t)]
    if not runnable:
        pytest.skip("runOnRequirements exclude MongoDB 7.0 on a replica set and on a sharded cluster")
    topology = runnable[0]
    async with open_cluster(shards=2 if topology == "sharded" else 1, periodic_noop_s=0.2) as cluster:
        uri = cluster.uri if topology == "sharded" else cluster.shard_uri("shard0")
        async with trio.open_nursery() as nursery:
            if via == "proxy":
                upstream = cluster.uri if topology == "sharded" else f"mongodb://{cluster.shards['shard0'].address}/"
                server = await nursery.start(serve_proxy, ProxyConfig(upstream=upstream, listen_port=0))
                uri = f"mongodb://127.0.0.1:{server.port}/"
                if topology == "replicaset" and "sharded" not in (data.get("runOnRequirements") or [{}])[0].get(
                        "topologies", ["sharded"]):
                    # The proxy presents itself as a mongos; the suite's replica-set-only tests still hold.
                    pass
            await sync(UnifiedTest(uri, data, test).run, timeout=60)
            nursery.cancel_scope.cancel()
