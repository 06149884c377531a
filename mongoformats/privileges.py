"""MongoDB privileges: built-in roles, their privileges, and whether privileges allow an action.

A privilege is `{resource, actions}` as `connectionStatus {showPrivileges: true}` reports it. A
resource is one of:

    {db: "x", collection: "c"}   the collection x.c
    {db: "x", collection: ""}    every non-system collection of database x
    {db: "", collection: "c"}    collection c in every database
    {db: "", collection: ""}     every non-system collection of every database
    {cluster: true}              cluster-wide operations
    {anyResource: true}          everything, system collections included

Change streams need `find` and `changeStream` on what they watch: the collection, the database
(`{db: x, collection: ""}`) or, for the whole cluster, `{db: "", collection: ""}`.

Sources (facts only): the server's built-in roles, src/mongo/db/auth/builtin_roles.yml (each
role's privileges and the roles it includes); the manual's privilege actions and resource
documents pages; DOCS-11617 (the privileges of database and cluster change streams). Only the
roles the proxy's users are expected to hold are modelled, each with the actions of the server's
list that this project's code paths check; a role's system-collection privileges are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "BUILTIN_ROLES",
    "READ_ACTIONS",
    "WRITE_ACTIONS",
    "allows",
    "change_stream_resource",
    "privileges_of_roles",
]

READ_ACTIONS = (
    "changeStream",
    "collStats",
    "dbHash",
    "dbStats",
    "find",
    "killCursors",
    "listCollections",
    "listIndexes",
)
WRITE_ACTIONS = (
    "convertToCapped",
    "createCollection",
    "createIndex",
    "dropCollection",
    "dropIndex",
    "insert",
    "remove",
    "renameCollectionSameDB",
    "update",
)
_DB_ADMIN_ACTIONS = (
    "collMod",
    "collStats",
    "convertToCapped",
    "createCollection",
    "createIndex",
    "dbStats",
    "dropCollection",
    "dropDatabase",
    "dropIndex",
    "enableProfiler",
    "listCollections",
    "listIndexes",
    "reIndex",
    "renameCollectionSameDB",
    "validate",
)
_MONITOR_CLUSTER_ACTIONS = (
    "connPoolStats",
    "getCmdLineOpts",
    "getDefaultRWConcern",
    "getLog",
    "getParameter",
    "getShardMap",
    "hostInfo",
    "inprog",
    "listDatabases",
    "listSessions",
    "listShards",
    "netstat",
    "replSetGetConfig",
    "replSetGetStatus",
    "serverStatus",
    "shardingState",
    "top",
)
_MONITOR_DB_ACTIONS = (
    "collStats",
    "dbStats",
    "getDatabaseVersion",
    "getShardVersion",
    "indexStats",
)
_HOST_CLUSTER_ACTIONS = (
    "applicationMessage",
    "connPoolSync",
    "dropConnections",
    "flushRouterConfig",
    "fsync",
    "invalidateUserCache",
    "killAnyCursor",
    "killAnySession",
    "killop",
    "logRotate",
    "replSetResizeOplog",
    "resync",
    "setParameter",
    "shutdown",
    "touch",
    "unlock",
)
_MANAGER_CLUSTER_ACTIONS = (
    "addShard",
    "appendOplogNote",
    "applicationMessage",
    "cleanupOrphaned",
    "flushRouterConfig",
    "getClusterParameter",
    "getDefaultRWConcern",
    "listSessions",
    "listShards",
    "removeShard",
    "replSetConfigure",
    "replSetGetConfig",
    "replSetGetStatus",
    "replSetStateChange",
    "resync",
    "setClusterParameter",
    "setDefaultRWConcern",
    "setFeatureCompatibilityVersion",
)
_MANAGER_DB_ACTIONS = (
    "analyzeShardKey",
    "clearJumboFlag",
    "configureQueryAnalyzer",
    "enableSharding",
    "moveChunk",
    "moveCollection",
    "refineCollectionShardKey",
    "reshardCollection",
    "splitChunk",
    "splitVector",
)

_ANY = {"db": "", "collection": ""}  # the server's any_normal: every non-system collection
_CLUSTER = {"cluster": True}

# role -> [(resource with "{db}" for the role's own database, actions)], the role's own privileges
BUILTIN_ROLES: dict[str, list[tuple[dict[str, Any], tuple[str, ...]]]] = {
    "read": [({"db": "{db}", "collection": ""}, READ_ACTIONS)],
    "readWrite": [({"db": "{db}", "collection": ""}, READ_ACTIONS + WRITE_ACTIONS)],
    "dbAdmin": [({"db": "{db}", "collection": ""}, _DB_ADMIN_ACTIONS)],
    "readAnyDatabase": [(_ANY, READ_ACTIONS), (_CLUSTER, ("listDatabases",))],
    "readWriteAnyDatabase": [(_ANY, READ_ACTIONS + WRITE_ACTIONS)],
    "dbAdminAnyDatabase": [(_ANY, _DB_ADMIN_ACTIONS), (_CLUSTER, ("listDatabases",))],
    "clusterMonitor": [(_CLUSTER, _MONITOR_CLUSTER_ACTIONS), (_ANY, _MONITOR_DB_ACTIONS)],
    "hostManager": [(_CLUSTER, _HOST_CLUSTER_ACTIONS), (_ANY, ("killCursors",))],
    "clusterManager": [(_CLUSTER, _MANAGER_CLUSTER_ACTIONS), (_ANY, _MANAGER_DB_ACTIONS)],
    "clusterAdmin": [(_ANY, ("dropDatabase",))],
    "root": [],
}
# role -> the roles it includes, (role, db) with "{db}" for its own database (builtin_roles.yml's
# `roles`)
_INCLUDES: dict[str, tuple[tuple[str, str], ...]] = {
    "readWriteAnyDatabase": (("readAnyDatabase", "{db}"),),
    "clusterMonitor": (("read", "config"), ("read", "local")),
    "clusterManager": (("read", "config"),),
    "clusterAdmin": (
        ("clusterMonitor", "{db}"),
        ("hostManager", "{db}"),
        ("clusterManager", "{db}"),
    ),
    "root": (
        ("readWriteAnyDatabase", "{db}"),
        ("dbAdminAnyDatabase", "{db}"),
        ("clusterAdmin", "{db}"),
    ),
}


def _with_included(roles: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
    """`roles` and every role they include, transitively."""
    out: set[tuple[str, str]] = set()
    todo = list(roles)
    while todo:
        role, db = todo.pop()
        if (role, db) not in out:
            out.add((role, db))
            todo.extend(
                (inner, db if inner_db == "{db}" else inner_db)
                for inner, inner_db in _INCLUDES.get(role, ())
            )
    return out


def privileges_of_roles(roles: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    """The privileges of (role, db) pairs and the roles they include, one entry per resource,
    as connectionStatus lists them."""
    by_resource: dict[tuple[tuple[str, Any], ...], set[str]] = {}
    for role, db in sorted(_with_included(roles)):
        for template, actions in BUILTIN_ROLES[role]:
            resource = {k: (db if v == "{db}" else v) for k, v in template.items()}
            by_resource.setdefault(tuple(resource.items()), set()).update(actions)
    return [
        {"resource": dict(resource), "actions": sorted(actions)}
        for resource, actions in by_resource.items()
    ]


def change_stream_resource(db: str | None, coll: str | None) -> dict[str, Any]:
    """What a change stream on a collection, a database (coll None) or the cluster (db None)
    reads."""
    return {"db": db or "", "collection": coll or ""}


def _covers(have: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    if have.get("anyResource"):
        return True
    if want.get("cluster") or have.get("cluster"):
        return bool(have.get("cluster")) and bool(want.get("cluster"))
    return _namespace_covers(have, want)


def _namespace_covers(have: Mapping[str, str], want: Mapping[str, str]) -> bool:
    """Whether a db/collection resource covers the wanted one; a system.* collection is never
    covered by a wildcard collection."""
    want_db, want_coll = want.get("db", ""), want.get("collection", "")
    have_db, have_coll = have.get("db", ""), have.get("collection", "")
    if want_coll.startswith("system."):
        return have_db in ("", want_db) and have_coll == want_coll
    return _name_covers(have_db, want_db) and _name_covers(have_coll, want_coll)


def _name_covers(have: str, want: str) -> bool:
    """Whether a resource's db (or collection) name covers the wanted one: an empty name in what
    is wanted means "all of them", which only a wildcard (an empty name) covers."""
    return have == "" or (want != "" and have == want)


def allows(
    privileges: Iterable[Mapping[str, Any]], actions: Iterable[str], resource: Mapping[str, Any]
) -> bool:
    """True when, for every action, some privilege grants it on a resource covering `resource`."""
    privileges = list(privileges)
    return all(_granted(privileges, action, resource) for action in actions)


def _granted(privileges: list[Mapping[str, Any]], action: str, resource: Mapping[str, Any]) -> bool:
    """Whether some privilege grants `action` on a resource covering `resource`."""
    granted = (p for p in privileges if action in p["actions"] or "anyAction" in p["actions"])
    return any(_covers(p["resource"], resource) for p in granted)
