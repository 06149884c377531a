"""jstests/change_streams/ddl_coll_mod_event.js (requires_fcv_60): `modify` events of collMod on
index options and on validation options, with `stateBeforeChange`, on a database stream and on a
collection stream. The collection is unsharded, so each collMod gives one event."""

from bson import Int64

from tests.conformance.model import DB, Case, uuid_of

SOURCE = "jstests/change_streams/ddl_coll_mod_event.js"
NS = {"db": DB, "coll": "c"}
EXPANDED = {"showExpandedEvents": True}
SETUP = (("command", {"create": "c"}), ("insert", "c", {"a": 1, "b": 1, "c": 1}))
UUID = uuid_of("c")
SCHEMA = {
    "$jsonSchema": {
        "bsonType": "object",
        "properties": {
            "a": {"bsonType": "number"},
            "b": {"bsonType": "number"},
            "c": {"bsonType": "number"},
        },
    }
}


def _modify(description: dict, before: dict) -> dict:
    return {
        "operationType": "modify",
        "ns": NS,
        "operationDescription": description,
        "stateBeforeChange": before,
    }


def _index(watch: str, field: str, options: dict) -> Case:
    name = f"{field}_1"
    hidden = bool(options.get("hidden"))
    ops: list = [
        ("command", {"collMod": "c", "index": {"name": name, "hidden": not hidden}}),
        ("command", {"collMod": "c", "index": {"name": name, "hidden": hidden}}),
    ]
    expect = [
        _modify(
            {"index": {"name": name, "hidden": not hidden}},
            {"collectionOptions": {"uuid": UUID}, "indexOptions": {"hidden": hidden}},
        ),
        _modify(
            {"index": {"name": name, "hidden": hidden}},
            {"collectionOptions": {"uuid": UUID}, "indexOptions": {"hidden": not hidden}},
        ),
    ]
    if "expireAfterSeconds" in options:
        ops.append(
            (
                "command",
                {"collMod": "c", "index": {"name": name, "expireAfterSeconds": Int64(100000)}},
            )
        )
        expect.append(
            _modify(
                {"index": {"name": name, "expireAfterSeconds": Int64(100000)}},
                {"collectionOptions": {"uuid": UUID}, "indexOptions": options},
            )
        )
    label = "-".join(options) or "plain"
    return Case(
        f"collmod-index-{label}-{watch}",
        SOURCE,
        watch,
        options=EXPANDED,
        setup=(
            *SETUP,
            (
                "command",
                {"createIndexes": "c", "indexes": [{"key": {field: 1}, "name": name, **options}]},
            ),
        ),
        ops=tuple(ops),
        expect=tuple(expect),
    )


def _validator(watch: str) -> Case:
    state = {
        "uuid": UUID,
        "validator": SCHEMA,
        "validationLevel": "strict",
        "validationAction": "error",
    }
    return Case(
        f"collmod-validator-{watch}",
        SOURCE,
        watch,
        options=EXPANDED,
        setup=SETUP,
        ops=(
            ("command", {"collMod": "c", "validator": SCHEMA}),
            ("command", {"collMod": "c", "validationLevel": "off"}),
            ("command", {"collMod": "c", "validationAction": "warn"}),
        ),
        expect=(
            _modify({"validator": SCHEMA}, {"collectionOptions": {"uuid": UUID}}),
            _modify({"validationLevel": "off"}, {"collectionOptions": state}),
            _modify(
                {"validationAction": "warn"},
                {"collectionOptions": {**state, "validationLevel": "off"}},
            ),
        ),
    )


CASES = [
    *[
        _index(watch, field, options)
        for watch in ("database", "collection")
        for field, options in (
            ("a", {}),
            ("b", {"hidden": True}),
            ("c", {"expireAfterSeconds": Int64(100000)}),
        )
    ],
    *[_validator(watch) for watch in ("database", "collection")],
]
