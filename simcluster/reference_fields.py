"""The fields of the change events a reference stream makes of CRUD and DDL oplog entries:
which event type each entry makes and its description, as the server's change stream
transforms read them (change_stream_event_transform.cpp)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simcluster.reference_diff import describe_update

__all__ = ["EXPANDED_DDL", "crud_fields", "ddl_description", "view_fields"]


def crud_fields(op: dict[str, Any], expanded: bool) -> tuple[str, Any, Any, Any] | None:
    """(operationType, fullDocument, documentKey, updateDescription) of a CRUD entry (None
    where an event has no such field), or None for an entry that is not one."""
    o = op["o"]
    if op["op"] == "i":
        return "insert", o, op["o2"] if "o2" in op else {"_id": o["_id"]}, None
    if op["op"] == "d":
        return "delete", None, o, None
    if op["op"] != "u":
        return None
    if o.get("$v") != 2 and "_id" in o:  # a whole new document
        return "replace", o, op["o2"], None
    # A $v:2 diff (or a $v:1 modifier document).
    return "update", None, op["o2"], describe_update(o, expanded=expanded)


# The DDL entries only expanded streams show, by the event type each makes.
EXPANDED_DDL = {
    "create": "create",
    "createIndexes": "createIndexes",
    "commitIndexBuild": "createIndexes",
    "dropIndexes": "dropIndexes",
    "collMod": "modify",
}


def ddl_description(
    entry: dict[str, Any], name: str
) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
    """(operationDescription, stateBeforeChange or None) of an expanded DDL event, or None for
    a view's create (a view's definition is shown from its system.views document)."""
    rest = {k: v for k, v in entry["o"].items() if k != name}
    return _DESCRIBE.get(name, _coll_mod)(entry, rest)


_Described = tuple[dict[str, Any], dict[str, Any] | None] | None


def _create(entry: dict[str, Any], rest: dict[str, Any]) -> _Described:
    return None if "viewOn" in rest else (rest, None)


def _coll_mod(entry: dict[str, Any], rest: dict[str, Any]) -> _Described:
    o2 = entry.get("o2") or {}
    # Document{{collectionOptions, o2.collectionOptions_old}, {indexOptions, ...}}: a field
    # missing from o2 is left out.
    state_before = {
        field: o2[f"{field}_old"]
        for field in ("collectionOptions", "indexOptions")
        if f"{field}_old" in o2
    }
    return rest, state_before


_DESCRIBE: dict[str, Callable[[dict[str, Any], dict[str, Any]], _Described]] = {
    "create": _create,
    "createIndexes": lambda entry, rest: ({"indexes": [rest]}, None),
    "commitIndexBuild": lambda entry, rest: ({"indexes": rest["indexes"]}, None),
    "dropIndexes": lambda entry, rest: ({"indexes": [entry["o2"]]}, None),
}


_VIEW_EVENTS = {"i": "create", "u": "modify", "d": "drop"}


def view_fields(op: dict[str, Any]) -> tuple[str, str, dict[str, Any] | None] | None:
    """(operationType, the view's namespace, operationDescription or None) of a write to
    system.views, or None when it makes no event."""
    op_type = _VIEW_EVENTS.get(op["op"])
    if op_type is None:
        return None
    o = op["o"]
    name = o.get("_id") if op["op"] != "u" else op.get("o2", {}).get("_id", o.get("_id"))
    if not isinstance(name, str):
        return None
    if op_type == "modify" and "$v" in o:
        return None  # a $v:2 delta of a view document: no whole definition to show
    desc = {k: v for k, v in o.items() if k != "_id"} if op_type != "drop" else None
    return op_type, name, desc
