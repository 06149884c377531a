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

from collections.abc import Callable
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
_Privilege = tuple[tuple[str, ...], dict[str, Any]]  # (actions, resource)

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


def _aggregate(db: str, target: Any, cmd: dict[str, Any]) -> list[_Privilege]:
    first = _first_stage(cmd.get("pipeline") or [])
    coll = target if isinstance(target, str) else None
    if "$changeStream" not in first:
        return [(("find",), {"db": db, "collection": coll or ""})]
    spec = first["$changeStream"] if isinstance(first["$changeStream"], dict) else {}
    if spec.get("allChangesForCluster"):
        return [(("find", "changeStream"), change_stream_resource(None, None))]
    return [(("find", "changeStream"), change_stream_resource(db, coll))]


def _first_stage(pipeline: list[object]) -> dict[str, object]:
    """An aggregate's first stage, {} when it has none (or a malformed one)."""
    return pipeline[0] if pipeline and isinstance(pipeline[0], dict) else {}


def _on_full_namespace(key: str, db: str, target: Any) -> list[_Privilege]:
    ns_db, _, coll = target.partition(".") if isinstance(target, str) else ("", "", "")
    return [(_ON_FULL_NAMESPACE[key], {"db": ns_db, "collection": coll})]


def _on_namespace(key: str, db: str, target: Any) -> list[_Privilege]:
    return [
        (_ON_NAMESPACE[key], {"db": db, "collection": target if isinstance(target, str) else ""})
    ]


def _on_database(key: str, db: str, target: Any) -> list[_Privilege]:
    if key == "enablesharding" and isinstance(target, str):
        db = target
    return [(_ON_DATABASE[key], {"db": db, "collection": ""})]


def _rename(key: str, db: str, target: Any) -> list[_Privilege]:
    if not isinstance(target, str):
        return []
    return [(("renameCollectionSameDB",), {"db": target.partition(".")[0], "collection": ""})]


# The privileges of each kind of command, by the table its name is in (first match wins).
_BY_TABLE: tuple[tuple[Any, Callable[[str, str, Any], list[_Privilege]]], ...] = (
    (_ON_FIXED_NAMESPACE, lambda key, db, target: [(_ON_FIXED_NAMESPACE[key], _CONFIG_SETTINGS)]),
    (_ON_FULL_NAMESPACE, _on_full_namespace),
    (_ON_NAMESPACE, _on_namespace),
    (_ON_DATABASE, _on_database),
    (_ON_CLUSTER, lambda key, db, target: [(_ON_CLUSTER[key], _CLUSTER)]),
    ({"renamecollection"}, _rename),
)


def required_privileges(name: str, db: str, cmd: dict[str, Any]) -> list[_Privilege]:
    """[(actions, resource)] that `cmd` needs; [] for a command any logged-in user may run."""
    key = name.lower()
    target = cmd.get(name)
    if key == "aggregate":
        return _aggregate(db, target, cmd)
    for table, privileges in _BY_TABLE:
        if key in table:
            return privileges(key, db, target)
    return []
