"""DDL that change streams of servers before 6.0 never show, recorded by the proxy as oplog noops.

Servers from 6.0 on emit create, createIndexes, dropIndexes, modify and shardCollection events
(showExpandedEvents) from their own oplog entries; older ones have no such events. So when the
upstream is older, the proxy watches those commands pass through and, once one succeeds, writes an
`appendOplogNote` on each shard that holds the collection, describing it (`ddl_note`). The readers
then turn the notes into events in their place in the order (OplogTransformer(ddl_notes=True)),
and ignore the native entries of those kinds, so the two sources never double up. A view's
create and drop (kept in system.views, so invisible to change streams) are recorded the same way.

`plan_notes` is pure: what to write where, from the command and what the shards held before and
after it. The engine does the I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from bson import Int64

__all__ = ["DDL_COMMANDS", "EXPANDED_EVENTS_WIRE_VERSION", "Note", "plan_notes", "target_namespace"]

# maxWireVersion of MongoDB 6.0, the first release with expanded change stream events.
EXPANDED_EVENTS_WIRE_VERSION = 17

DDL_COMMANDS = ("create", "createIndexes", "dropIndexes", "collMod", "drop", "shardCollection")

# listCollections info of one collection, by shard id.
Holders = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Note:
    op_type: str
    ns: str
    shards: tuple[str, ...]
    ui: Any = None
    operation_description: dict[str, Any] | None = None
    state_before_change: dict[str, Any] | None = None


def target_namespace(db: str, cmd: Mapping[str, Any]) -> str:
    name = next(iter(cmd))
    if name == "shardCollection":
        return str(cmd[name])
    return f"{db}.{cmd[name]}"


def _ui(info: Mapping[str, Any] | None) -> Any:
    return (info or {}).get("info", {}).get("uuid")


def plan_notes(
    cmd: Mapping[str, Any],
    ns: str,
    before: Holders,
    after: Holders,
    index_specs: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Note]:
    """The notes for a DDL command that succeeded. `index_specs` are the indexes before a
    dropIndexes."""
    planner = _PLANNERS.get(next(iter(cmd)))
    return planner(cmd, ns, before, after, index_specs or {}) if planner is not None else []


Specs = Mapping[str, Mapping[str, Any]]


def _holders(after: Holders) -> tuple[tuple[str, ...], Any]:
    """The shards holding the collection after the command, and its uuid there."""
    holders = tuple(sorted(after))
    return holders, _ui(after[holders[0]]) if holders else None


def _create(
    cmd: Mapping[str, Any], ns: str, before: Holders, after: Holders, _: Specs
) -> list[Note]:
    new = tuple(sorted(set(after) - set(before)))
    info = after[new[0]] if new else None
    if "viewOn" in cmd:
        desc = {"viewOn": cmd["viewOn"], "pipeline": list(cmd.get("pipeline", []))}
    else:
        desc = {k: v for k, v in cmd.items() if k not in _GENERIC_FIELDS and k != "create"}
        desc["idIndex"] = {"v": 2, "key": {"_id": 1}, "name": "_id_"}
    return [Note("create", ns, new, _ui(info), desc)] if new else []


def _create_indexes(
    cmd: Mapping[str, Any], ns: str, before: Holders, after: Holders, _: Specs
) -> list[Note]:
    holders, ui = _holders(after)
    return [
        Note("createIndexes", ns, holders, ui, {"indexes": [{"v": 2, **spec}]})
        for spec in cmd.get("indexes", [])
    ]


def _drop_indexes(
    cmd: Mapping[str, Any], ns: str, before: Holders, after: Holders, specs: Specs
) -> list[Note]:
    wanted = cmd["index"]
    if wanted == "*":
        dropped = [s for n, s in specs.items() if n != "_id_"]
    elif isinstance(wanted, str):
        dropped = [specs.get(wanted, {"name": wanted})]
    else:
        dropped = [s for s in specs.values() if dict(s.get("key", {})) == dict(wanted)]
    holders, ui = _holders(after)
    return [Note("dropIndexes", ns, holders, ui, {"indexes": [dict(spec)]}) for spec in dropped]


def _coll_mod(
    cmd: Mapping[str, Any], ns: str, before: Holders, after: Holders, _: Specs
) -> list[Note]:
    changes = {k: v for k, v in cmd.items() if k not in _GENERIC_FIELDS and k != "collMod"}
    if not changes:
        return []
    old = next(iter(before.values()), {})
    holders, ui = _holders(after)
    return [
        Note(
            "modify", ns, holders, ui, changes, {"collectionOptions": dict(old.get("options", {}))}
        )
    ]


def _drop(cmd: Mapping[str, Any], ns: str, before: Holders, after: Holders, _: Specs) -> list[Note]:
    views = tuple(sorted(s for s, info in before.items() if info.get("type") == "view"))
    return [Note("drop", ns, views)] if views else []


def _shard_collection(
    cmd: Mapping[str, Any], ns: str, before: Holders, after: Holders, _: Specs
) -> list[Note]:
    targets = tuple(sorted(before)) or tuple(sorted(after))
    desc = {
        "shardKey": dict(cmd.get("key", {})),
        "unique": bool(cmd.get("unique", False)),
        "numInitialChunks": Int64(cmd.get("numInitialChunks", 0)),
        "presplitHashedZones": bool(cmd.get("presplitHashedZones", False)),
    }
    notes = []
    if not before and targets:  # sharding a new collection creates it first, as 6.0+ shows
        notes.append(
            Note(
                "create",
                ns,
                targets[:1],
                _ui(after.get(targets[0])),
                {"idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}},
            )
        )
    notes.append(
        Note(
            "shardCollection",
            ns,
            targets[:1],
            _ui(after.get(targets[0])) if targets else None,
            desc,
        )
    )
    return notes


# The notes of each DDL command, from the command and the shards' collections before and after.
_PLANNERS: dict[str, Callable[[Mapping[str, Any], str, Holders, Holders, Specs], list[Note]]] = {
    "create": _create,
    "createIndexes": _create_indexes,
    "dropIndexes": _drop_indexes,
    "collMod": _coll_mod,
    "drop": _drop,
    "shardCollection": _shard_collection,
}


# Fields drivers add to every command; never part of what a DDL event describes.
_GENERIC_FIELDS = frozenset(
    {
        "lsid",
        "$clusterTime",
        "$readPreference",
        "txnNumber",
        "autocommit",
        "apiVersion",
        "apiStrict",
        "apiDeprecationErrors",
        "comment",
        "$db",
        "readConcern",
        "writeConcern",
        "maxTimeMS",
    }
)
