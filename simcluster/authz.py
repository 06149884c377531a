"""Which privileges a command needs, as a server with security.authorization checks them.

Coarse on purpose: each command maps to the actions and the resource its server command checks
(a read needs `find` on its namespace, a change stream `find` + `changeStream` on what it
watches, sharding and replication commands their cluster actions; the built-in roles holding
them are mongoformats.privileges'). Commands not listed need only a login: getMore and
killCursors check the cursor's owner instead; killSessions kills the caller's own sessions
unless it holds killAnySession (mongoformats.sessions); listDatabases filters by privilege on a
real server, and simcluster returns every database; configureFailPoint is a test command.
"""

from __future__ import annotations

from typing import Any

from mongoformats.privileges import change_stream_resource

__all__ = ["required_privileges"]

_CLUSTER = {"cluster": True}

_ON_NAMESPACE = {
    "find": ("find",),
    "count": ("find",),
    "distinct": ("find",),
    "listindexes": ("listIndexes",),
    "insert": ("insert",),
    "update": ("update",),
    "delete": ("remove",),
    "findandmodify": ("find", "update"),
    "create": ("createCollection",),
    "drop": ("dropCollection",),
    "createindexes": ("createIndex",),
    "dropindexes": ("dropIndex",),
    "collmod": ("collMod",),
    "collstats": ("collStats",),
}
# Commands naming their collection by its full namespace ("db.coll"), on that namespace.
_ON_FULL_NAMESPACE = {
    "shardcollection": ("enableSharding",),
    "movechunk": ("moveChunk",),
    "moverange": ("moveChunk",),
    "split": ("splitChunk",),
    "reshardcollection": ("reshardCollection",),
    "refinecollectionshardkey": ("refineCollectionShardKey",),
}
# Commands acting on one fixed namespace: the balancer's switch is config.settings
# (cluster_control_balancer_cmd.cpp: update to start or stop it, find for its status).
_ON_FIXED_NAMESPACE = {
    "balancerstart": ("update",),
    "balancerstop": ("update",),
    "balancerstatus": ("find",),
}
_CONFIG_SETTINGS = {"db": "config", "collection": "settings"}
_ON_DATABASE = {
    "listcollections": ("listCollections",),
    "dropdatabase": ("dropDatabase",),
    "enablesharding": ("enableSharding",),
    "dbstats": ("dbStats",),
}
_ON_CLUSTER = {
    "addshard": ("addShard",),
    "listshards": ("listShards",),
    "appendoplognote": ("appendOplogNote",),
    "replsetstepdown": ("replSetStateChange",),
    "replsetgetstatus": ("replSetGetStatus",),
    "serverstatus": ("serverStatus",),
    "shutdown": ("shutdown",),
    "setfeaturecompatibilityversion": ("setFeatureCompatibilityVersion",),
    # kill_all_sessions_command.cpp, kill_all_sessions_by_pattern_command.cpp: killAnySession,
    # which hostManager (so clusterAdmin and root) holds and no read or write role does.
    "killallsessions": ("killAnySession",),
    "killallsessionsbypattern": ("killAnySession",),
    "getparameter": ("getParameter",),
    "setparameter": ("setParameter",),
    "getcmdlineopts": ("getCmdLineOpts",),
    "hostinfo": ("hostInfo",),
    "getlog": ("getLog",),
    "getshardmap": ("getShardMap",),
}


def required_privileges(
    name: str, db: str, cmd: dict[str, Any]
) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """[(actions, resource)] that `cmd` needs; [] for a command any logged-in user may run."""
    key = name.lower()
    target = cmd.get(name)
    if key == "aggregate":
        pipeline = cmd.get("pipeline") or []
        first = pipeline[0] if pipeline and isinstance(pipeline[0], dict) else {}
        coll = target if isinstance(target, str) else None
        if "$changeStream" in first:
            spec = first["$changeStream"] if isinstance(first["$changeStream"], dict) else {}
            if spec.get("allChangesForCluster"):
                return [(("find", "changeStream"), change_stream_resource(None, None))]
            return [(("find", "changeStream"), change_stream_resource(db, coll))]
        return [(("find",), {"db": db, "collection": coll or ""})]
    if key in _ON_FIXED_NAMESPACE:
        return [(_ON_FIXED_NAMESPACE[key], _CONFIG_SETTINGS)]
    if key in _ON_FULL_NAMESPACE:
        ns_db, _, coll = target.partition(".") if isinstance(target, str) else ("", "", "")
        return [(_ON_FULL_NAMESPACE[key], {"db": ns_db, "collection": coll})]
    if key in _ON_NAMESPACE:
        return [
            (
                _ON_NAMESPACE[key],
                {"db": db, "collection": target if isinstance(target, str) else ""},
            )
        ]
    if key in _ON_DATABASE:
        if key == "enablesharding" and isinstance(target, str):
            db = target
        return [(_ON_DATABASE[key], {"db": db, "collection": ""})]
    if key in _ON_CLUSTER:
        return [(_ON_CLUSTER[key], _CLUSTER)]
    if key == "renamecollection" and isinstance(target, str):
        source_db = target.partition(".")[0]
        return [(("renameCollectionSameDB",), {"db": source_db, "collection": ""})]
    return []
