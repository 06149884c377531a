"""The engine's transform against simcluster's independent reference on every shard's oplog of a
randomized workload written through a real cluster (tests/unit/test_reference_fidelity.py has the
audit's items entry by entry)."""

from __future__ import annotations

import random

import bson
import pytest

from mongoformats.change_events import OplogTransformer
from simcluster import open_cluster
from simcluster.reference_events import ReferenceTransformer, encode_event
from tests.conftest import client, sync
from tests.integration.test_randomized_watch import _workload


@pytest.mark.parametrize(
    "expanded,version,migration",
    [(False, 2, False), (True, 1, False), (False, 1, True), (True, 2, True)],
)
async def test_engine_transform_equals_the_reference_on_a_random_workload(
    expanded, version, migration
):
    """Every shard's oplog of the randomized workload (tests/integration/test_randomized_watch.py:
    CRUD with nested and array diffs, transactions across shards, migrations, DDL, views) through
    the engine's transform and simcluster's reference, with the stream options the randomized
    watch test does not use (classic events, v1 tokens as 6.0 writes them, migration events): the
    same events, byte for byte."""
    async with open_cluster(shards=3) as cluster:
        await sync(lambda: _workload(client(cluster.uri), random.Random(11), 250))
        for replset in cluster.replsets.values():
            oplog = replset.primary.oplog
            entries = oplog.read_after(0, 1 << 30)
            # From the start, and from later entries: a read that begins inside a transaction's
            # chain reads its earlier entries back by prevOpTime (each implementation its own way).
            for first in range(0, len(entries), 23):
                engine = OplogTransformer(
                    show_expanded_events=expanded,
                    show_migration_events=migration,
                    token_version=version,
                )
                reference = ReferenceTransformer(
                    db="admin",
                    coll=None,
                    cluster=True,
                    expanded=expanded,
                    migration=migration,
                    system_events=False,
                    version=version,
                    resumed_from=None,
                    chain=oplog.chain_through,
                )
                got, want = [], []
                for raw in entries[first:]:
                    if (gap := engine.missing_chain(raw)) is not None:
                        engine.adopt_chain(oplog.chain_through(gap))
                    got += [bson.decode(ev.raw) for ev in engine.transform(raw)]
                    want += [bson.decode(encode_event(ev.doc)) for ev in reference.events(raw)]
                assert first or len(want) > 50
                for g, w in zip(got, want, strict=False):  # the first difference, then the counts
                    assert bson.encode(g) == bson.encode(w), (first, g, w)
                assert len(got) == len(want)
