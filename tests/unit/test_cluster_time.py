"""wireproxy/cluster_time.py: the newest `$clusterTime` mongos sent, kept as it came, and what the
proxy's own replies carry (no sockets)."""

from __future__ import annotations

import bson
from bson import Binary, Int64, Timestamp
from bson.raw_bson import RawBSONDocument

from wireproxy.cluster_time import ClusterTimeGossip


def _signed(secs: int, key: int) -> dict[str, object]:
    return {
        "clusterTime": Timestamp(secs, 1),
        "signature": {"hash": Binary(bytes([key]) * 20), "keyId": Int64(key)},
    }


def _reply(secs: int, key: int, **more: object) -> bytes:
    return bson.encode(
        {"ok": 1.0, "$clusterTime": _signed(secs, key), "operationTime": Timestamp(secs, 1), **more}
    )


def test_nothing_seen_leaves_the_reply_as_it_is():
    assert ClusterTimeGossip().stamp({"ok": 1.0}) == {"ok": 1.0}


def test_the_newest_cluster_time_is_kept_byte_for_byte():
    gossip = ClusterTimeGossip()
    gossip.observe(_reply(10, 1))
    gossip.observe(RawBSONDocument(_reply(12, 2)))
    gossip.observe(_reply(11, 3))  # older: not taken
    reply = gossip.stamp({"cursor": {}, "ok": 1.0})
    assert list(reply) == ["cursor", "ok", "$clusterTime", "operationTime"]
    assert bytes(reply["$clusterTime"].raw) == bson.encode(_signed(12, 2))
    assert reply["operationTime"] == Timestamp(12, 1)


def test_a_reply_with_its_own_cluster_time_keeps_it():
    gossip = ClusterTimeGossip()
    gossip.observe(_reply(12, 2))
    own = {"ok": 0.0, "$clusterTime": _signed(5, 9), "operationTime": Timestamp(5, 1)}
    assert gossip.stamp(dict(own)) == own


def test_replies_without_the_fields_change_nothing():
    gossip = ClusterTimeGossip()
    gossip.observe(bson.encode({"ok": 1.0}))
    gossip.observe({"ok": 1.0, "$clusterTime": "not a document"})
    assert gossip.stamp({"ok": 1.0}) == {"ok": 1.0}
