"""The proxy's own answer to hello (and the legacy isMaster), as a mongos gives it: the fields
only the upstream can answer are asked by the session on its pinned connection."""

from __future__ import annotations

import datetime
from typing import Any

import trio
from bson import Int64, ObjectId

from mongoformats import wire
from mongoformats.errors import MongoError

# What a driver may ask in hello that only the upstream can answer (authentication).
UPSTREAM_HELLO_FIELDS = ("saslSupportedMechs", "speculativeAuthenticate")
# What a hello the proxy passes upstream leaves out: the fields the proxy answers itself.
LOCAL_HELLO_FIELDS = frozenset({"compression", "topologyVersion", "maxAwaitTimeMS", "$db"})
# The compressors the proxy speaks (mongoformats.wire).
_COMPRESSORS = ("zlib", "snappy", "zstd")


async def await_topology_change(cmd: dict[str, Any], process_id: ObjectId) -> None:
    """A streaming hello (topologyVersion with maxAwaitTimeMS) waits up to maxAwaitTimeMS for a
    change of the topology the client knows; the proxy's never changes while it runs."""
    if ("topologyVersion" in cmd) != ("maxAwaitTimeMS" in cmd):
        raise MongoError(
            51760 if "topologyVersion" in cmd else 51758,
            "topologyVersion and maxAwaitTimeMS must be given together",
        )
    tv = cmd.get("topologyVersion")
    if tv is not None and tv.get("processId") == process_id:
        await trio.sleep(int(cmd["maxAwaitTimeMS"]) / 1000)


def hello_reply(
    cmd: dict[str, Any], process_id: ObjectId, wire_versions: tuple[int, int], conn_id: int
) -> dict[str, Any]:
    """The proxy's own answer to hello (or the legacy isMaster): a mongos's, without the fields
    only the upstream can give."""
    legacy = next(iter(cmd)).lower() == "ismaster"
    reply: dict[str, Any] = {}
    if cmd.get("helloOk"):
        reply["helloOk"] = True
    reply["ismaster" if legacy else "isWritablePrimary"] = True
    reply.update(
        {
            "msg": "isdbgrid",
            "topologyVersion": {"processId": process_id, "counter": Int64(0)},
            "maxBsonObjectSize": 16 * 1024 * 1024,
            "maxMessageSizeBytes": wire.MAX_MESSAGE_SIZE,
            "maxWriteBatchSize": 100_000,
            "localTime": datetime.datetime.now(datetime.UTC),
            "logicalSessionTimeoutMinutes": 30,
            "connectionId": conn_id,
            "minWireVersion": wire_versions[0],
            "maxWireVersion": wire_versions[1],
        }
    )
    chosen = [c for c in cmd.get("compression", ()) if c in _COMPRESSORS]
    if chosen:
        reply["compression"] = chosen
    return reply
