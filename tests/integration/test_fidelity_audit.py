"""D11 of the fidelity audit (shared/reference/fidelity-audit-2026-11-26.md), which no other module
checks; tests/unit/test_fidelity_audit.py maps every item of the audit to its tests."""

from __future__ import annotations

import pytest

from tests.conftest import client, sync
from tests.integration.test_accelerate import accelerated


@pytest.mark.parametrize("via", ["direct", "accelerated"])
async def test_d11_full_document_before_change_is_the_last_field(via: str) -> None:
    """D11: the pre-image stage sets `fullDocumentBeforeChange`, a field the event does not have
    (DocumentSourceChangeStreamAddPreImage::doGetNext; the transform adds preImageId, which it
    removes), and a Document appends such a field: it comes after updateDescription, last.
    `fullDocument` keeps the slot the transform gives it, before `ns`."""
    async with accelerated(shards=1) as (cluster, server):

        def work() -> list[str]:
            direct = client(cluster.uri)
            direct.d11.create_collection("c", changeStreamPreAndPostImages={"enabled": True})
            start = direct.admin.command("ping")["operationTime"]
            direct.d11.c.insert_one({"_id": 1, "a": 0})
            direct.d11.c.update_one({"_id": 1}, {"$set": {"a": 1}})
            uri = cluster.uri if via == "direct" else f"mongodb://127.0.0.1:{server.port}/"
            with client(uri).d11.c.watch(
                [{"$match": {"operationType": "update"}}],
                start_at_operation_time=start,
                full_document="updateLookup",
                full_document_before_change="whenAvailable",
                max_await_time_ms=100,
            ) as stream:
                for _ in range(100):
                    event = stream.try_next()
                    if event is not None:
                        return list(event)
            return []

        fields = await sync(work)
    assert fields == [
        "_id",
        "operationType",
        "clusterTime",
        "wallTime",
        "fullDocument",
        "ns",
        "documentKey",
        "updateDescription",
        "fullDocumentBeforeChange",
    ]
