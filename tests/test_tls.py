"""TLS end to end: simcluster requiring TLS on mongos and every shard member, the proxy speaking
TLS both ways, and the engine's shard readers connecting to the members over TLS too."""

from __future__ import annotations

import ssl
from typing import Any

import pytest
import trio
from pymongo.errors import ServerSelectionTimeoutError

from simcluster import open_cluster
from tests.conftest import _close_all, client, sync
from tests.test_engine import drain, end_point
from wireproxy.app import serve_proxy
from wireproxy.config import ProxyConfig


@pytest.fixture
def certificates(tmp_path: Any) -> tuple[ssl.SSLContext, str, str]:
    """A server context for the cluster, a PEM (cert + key) for the proxy and the CA file."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    pem, ca_file = tmp_path / "server.pem", tmp_path / "ca.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(pem))
    ca.cert_pem.write_to_path(str(ca_file))
    return server_ctx, str(pem), str(ca_file)


@pytest.mark.parametrize("upstream_tls_in", ["settings", "uri"])
async def test_proxy_and_engine_over_tls_to_a_tls_cluster(certificates, upstream_tls_in):
    """Upstream TLS from the proxy's settings, or from the upstream URI's options as a driver reads
    them."""
    server_ctx, pem, ca_file = certificates
    async with (
        open_cluster(shards=2, members=2, tls=server_ctx) as cluster,
        trio.open_nursery() as nursery,
    ):
        if upstream_tls_in == "settings":
            config = ProxyConfig(
                upstream=cluster.uri,
                listen_port=0,
                tls_cert_file=pem,
                upstream_tls=True,
                upstream_tls_ca_file=ca_file,
            )
        else:
            config = ProxyConfig(
                upstream=f"{cluster.uri}?tls=true&tlsCAFile={ca_file}",
                listen_port=0,
                tls_cert_file=pem,
            )
        proxy = await nursery.start(serve_proxy, config)

        def work() -> None:
            tls = f"tls=true&tlsCAFile={ca_file}"
            # The cluster itself requires TLS, mongos and shard members alike.
            direct = client(f"{cluster.uri}?{tls}")
            direct.t.c.insert_one({"_id": "direct"})
            member = client(f"{cluster.shard_uri('shard0')}&{tls}")
            assert member.admin.command("hello")["setName"] == "shard0"
            plain = client(cluster.uri, serverSelectionTimeoutMS=1000)
            with pytest.raises(ServerSelectionTimeoutError):
                plain.admin.command("ping")

            c = client(f"mongodb://127.0.0.1:{proxy.port}/?{tls}")
            start = c.admin.command("ping")["operationTime"]
            c.admin.command("shardCollection", "t.h", key={"_id": "hashed"})
            c.t.h.insert_many([{"_id": i} for i in range(1000)])  # on both shards
            # Read in a reader process: the engine's TLS settings travel there (MemberConnector).
            # The backlog comes as blocks of events, whose reply a TLS stream takes whole
            # (wire.DeferredPiece.materialize), not a part at a time.
            opened = c.admin.command(
                {
                    "parallelChangeStream": 1,
                    "nBuckets": 1,
                    "readerProcesses": 1,
                    "startAtOperationTime": start,
                }
            )
            events = drain(c, opened["cursors"][0]["id"], end_point(c))
            assert sorted(
                e["documentKey"]["_id"]
                for e in events
                if e["operationType"] == "insert" and e["ns"]["coll"] == "h"
            ) == list(range(1000))
            status = c.admin.command({"parallelChangeStreamStatus": 1})["streams"][0]
            assert all(s["reconnects"] == 0 for s in status["shards"])  # read over TLS, not retried

        await sync(work)
        await sync(_close_all)
        nursery.cancel_scope.cancel()
