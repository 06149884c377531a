"""The Node.js driver and mongosh, unmodified, through the proxy and directly against simcluster.

The packages come from the npm registry; `make test` installs them into .node/ (see Makefile).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import trio

from tests.conftest import proxy_uri
from wireproxy.app import serve_proxy
from wireproxy.config import ProxyConfig

ROOT = Path(__file__).resolve().parents[2]
NODE_MODULES = ROOT / ".node" / "node_modules"
MONGOSH = NODE_MODULES / ".bin" / "mongosh"

pytestmark = [
    pytest.mark.node,
    pytest.mark.skipif(
        not shutil.which("node") or not (NODE_MODULES / "mongodb").exists(),
        reason="node or the npm packages are missing: run `make test`, which installs them",
    ),
]


async def _run(*argv: str) -> str:
    with trio.fail_after(120):
        result = await trio.run_process(
            list(argv),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={
                "NODE_PATH": str(NODE_MODULES),
                "PATH": "/usr/bin:/bin:/usr/local/bin",
                "HOME": str(ROOT / ".node"),
            },
        )
    out = result.stdout.decode()
    assert result.returncode == 0, f"{argv[0]} failed:\n{out}\n{result.stderr.decode()}"
    return out


async def test_node_driver_through_the_proxy(proxy):
    out = await _run("node", str(ROOT / "tests" / "node" / "driver.js"), proxy_uri(proxy))
    assert json.loads(out.strip().splitlines()[-1])["ok"] is True


async def test_node_driver_watch_through_the_accelerated_proxy(cluster):
    """The same script with change stream acceleration on: its collection and cluster watch()
    are served by the engine, unmodified Node driver and all."""
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            serve_proxy,
            ProxyConfig(upstream=cluster.uri, listen_port=0, accelerate_change_streams=True),
        )
        out = await _run("node", str(ROOT / "tests" / "node" / "driver.js"), proxy_uri(server))
        assert json.loads(out.strip().splitlines()[-1])["ok"] is True
        assert (
            server.engine.watches["accelerated"] >= 2
            and server.engine.watches["passedThrough"] == 0
        )
        nursery.cancel_scope.cancel()


@pytest.mark.skipif(not MONGOSH.exists(), reason="mongosh is not installed")
async def test_mongosh_through_the_proxy_and_directly(cluster, proxy):
    script = (
        "db.getSiblingDB('sh').c.insertMany([{_id: 1}, {_id: 2}]);"
        "const r = db.adminCommand({parallelChangeStream: 1, nBuckets: 3, name: 'sh'});"
        "print(JSON.stringify({n: db.getSiblingDB('sh').c.countDocuments({}),"
        " buckets: r.cursors.length}))"
    )
    for uri in (proxy_uri(proxy), cluster.uri, cluster.shard_uri("shard0")):
        if uri != proxy_uri(proxy):
            script = (
                "print(JSON.stringify({n: db.getSiblingDB('sh2').c.insertOne({a: 1})"
                ".acknowledged ? 1 : 0}))"
            )
        out = await _run(str(MONGOSH), uri, "--quiet", "--norc", "--eval", script)
        line = [ln for ln in out.splitlines() if ln.startswith("{")][-1]
        assert json.loads(line)["n"] >= 1


@pytest.mark.skipif(not MONGOSH.exists(), reason="mongosh is not installed")
@pytest.mark.parametrize("accelerate", [False, True])
async def test_mongosh_script_through_the_proxy(cluster, accelerate):
    """CRUD, bulkWrite, getMore, killCursors, a multi-shard transaction, retryable writes and
    watch() on a collection and on the cluster, from mongosh unmodified (the watches served by
    the engine when acceleration is on)."""
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            serve_proxy,
            ProxyConfig(upstream=cluster.uri, listen_port=0, accelerate_change_streams=accelerate),
        )
        out = await _run(
            str(MONGOSH),
            proxy_uri(server),
            "--quiet",
            "--norc",
            "--file",
            str(ROOT / "tests" / "node" / "shell.js"),
        )
        result = json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
        assert result == {"ok": True, "n": 251, "buckets": 2}
        assert (server.engine.watches["accelerated"] > 0) == accelerate
        nursery.cancel_scope.cancel()


async def test_node_driver_and_mongosh_directly_against_a_shard_replica_set():
    """Issue 3: unmodified clients against a shard's three-member replica set, not through
    mongos."""
    from simcluster import open_cluster

    async with open_cluster(shards=1, members=3) as cluster:
        uri = cluster.shard_uri("shard0")
        out = await _run("node", str(ROOT / "tests" / "node" / "replset.js"), uri)
        result = json.loads(out.strip().splitlines()[-1])
        assert result["ok"] is True and result["count"] == 100 and result["members"] == 3
        # 100 inserts, an update, a delete and the transaction's insert into the watched collection.
        assert result["events"] == 103 and result["kinds"] == ["delete", "insert", "update"]
        if MONGOSH.exists():
            script = (
                "const s = db.getMongo().startSession();"
                "s.withTransaction(() => { s.getDatabase('shdb').c.insertOne({_id: 1}); });"
                "db.getSiblingDB('shdb').c.createIndex({a: 1});"
                "print(JSON.stringify({n: db.getSiblingDB('shdb').c.countDocuments({}),"
                " ix: db.getSiblingDB('shdb').c.getIndexes().length, set: db.hello().setName}))"
            )
            out = await _run(str(MONGOSH), uri, "--quiet", "--norc", "--eval", script)
            line = [ln for ln in out.splitlines() if ln.startswith("{")][-1]
            assert json.loads(line) == {"n": 1, "ix": 2, "set": "shard0"}


@pytest.mark.skipif(not MONGOSH.exists(), reason="mongosh is not installed")
async def test_mongosh_sharding_helpers_through_the_proxy(cluster, proxy):
    """sh.status(), sh.getBalancerState() and the balancer helpers read the config database;
    through the proxy (pass-through) they see the simulator's catalog as they would a server's."""
    out = await _run(
        str(MONGOSH),
        proxy_uri(proxy),
        "--quiet",
        "--norc",
        "--file",
        str(ROOT / "tests" / "node" / "sharding.js"),
    )
    got = json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
    home = cluster.mongos.sharded["shst.c"].chunks[0].shard
    other = next(sid for sid in sorted(cluster.replsets) if sid != home)
    assert (got["stopped"], got["started"], got["shards"]) == (False, True, len(cluster.replsets))
    assert got["balancer"]["Currently enabled"] == "yes"
    assert got["balancer"]["Migration Results for the last 24 hours"] == {"1": "Success"}
    assert got["chunks"] == [[True, home], [True, other]]
    assert sorted(map(tuple, (m.values() for m in got["chunkMetadata"]))) == sorted(
        [(home, 1), (other, 1)]
    )
    assert dict(got["distribution"])[home] == dict(got["distribution"])[other] == 10
