"""The cluster time the proxy gossips in the replies it makes itself.

Every mongos reply carries `$clusterTime` (the newest cluster time it knows, signed) and
`operationTime`; drivers keep the newest they see and send it back, and causally consistent
sessions read after `operationTime` (the drivers' sessions and causal-consistency specs). Replies
the proxy makes itself (hello, an accelerated watch()'s aggregate and getMores) carry the newest
`$clusterTime` document received from mongos, on any client's connection or the engine's, as it
came: the proxy holds no signing key, so it never makes or alters one. Before mongos has sent
any, the fields are left out, as a server without signing keys leaves them out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import bson
from bson import Timestamp
from bson.raw_bson import RawBSONDocument

from mongoformats.codecs import RAW


def _after(a: Timestamp, b: Timestamp | None) -> bool:
    return b is None or (a.time, a.inc) > (b.time, b.inc)


class ClusterTimeGossip:
    """The newest `$clusterTime` document and `operationTime` seen in mongos's replies."""

    def __init__(self) -> None:
        self.cluster_time: RawBSONDocument | None = None
        self._time: Timestamp | None = None
        self.operation_time: Timestamp | None = None

    def observe(self, reply: Mapping[str, Any] | bytes) -> None:
        """Take a reply's `$clusterTime` and `operationTime` where they are newer than those held.
        A reply in bytes is read in place (only its top-level fields are walked)."""
        doc = RawBSONDocument(reply, RAW) if isinstance(reply, (bytes, bytearray)) else reply
        signed = doc.get("$clusterTime")
        if isinstance(signed, Mapping):
            self._observe_cluster_time(signed)
        op_time = doc.get("operationTime")
        if isinstance(op_time, Timestamp) and _after(op_time, self.operation_time):
            self.operation_time = op_time

    def _observe_cluster_time(self, signed: Mapping[str, Any]) -> None:
        """Take a reply's `$clusterTime` document if its time is newer than the one held."""
        at = signed.get("clusterTime")
        if isinstance(at, Timestamp) and _after(at, self._time):
            self.cluster_time = RawBSONDocument(_own_bytes(signed), RAW)
            self._time = at

    def stamp(self, reply: dict[str, Any]) -> dict[str, Any]:
        """`reply` with `$clusterTime` and `operationTime` after its own fields, as mongos puts
        them; a reply that has them already keeps its own."""
        if self.cluster_time is not None and "$clusterTime" not in reply:
            reply["$clusterTime"] = self.cluster_time
            if "operationTime" not in reply:
                reply["operationTime"] = self.operation_time or self._time
        return reply


def _own_bytes(signed: Mapping[str, Any]) -> bytes:
    """A copy of the `$clusterTime` document's bytes: the reply's buffer is not kept alive by
    it."""
    return bytes(signed.raw) if isinstance(signed, RawBSONDocument) else bson.encode(signed)
