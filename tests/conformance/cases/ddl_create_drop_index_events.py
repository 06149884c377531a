"""jstests/change_streams/ddl_create_drop_index_events.js (requires_fcv_60): `createIndexes` and
`dropIndexes` events with showExpandedEvents, for indexes with various options, on a database
stream and on a collection stream, for an empty and for a non-empty collection.

An index built on an empty collection is logged as one createIndexes entry per index; on a
non-empty collection the build ends in one commitIndexBuild entry covering every index of the
command, hence one event."""

from tests.conformance.model import DB, Case

SOURCE = "jstests/change_streams/ddl_create_drop_index_events.js"
NS = {"db": DB, "coll": "c"}
EXPANDED = {"showExpandedEvents": True}
ROW = {"a": 1, "b": "j", "c": "k", "d": "l", "e": "m", "f": [55.5, 42.3]}
COLLATION = {
    "locale": "en_US",
    "caseLevel": False,
    "caseFirst": "off",
    "strength": 3,
    "numericOrdering": False,
    "alternate": "non-ignorable",
    "maxVariable": "punct",
    "normalization": False,
    "backwards": False,
    "version": "57.1",
}
# (name, index key, index options, key in the event, what dropIndexes names)
INDEXES: list[tuple[str, dict, dict, dict | None, str | None]] = [
    (
        "hidden-partial-ttl",
        {"a": 1},
        {
            "hidden": True,
            "partialFilterExpression": {"a": {"$gte": 0}},
            "expireAfterSeconds": 86400,
            "storageEngine": {"wiredTiger": {}},
        },
        None,
        None,
    ),
    ("collation-drop-star", {"e": 1}, {"collation": COLLATION}, None, "*"),
    (
        "wildcard",
        {"$**": 1},
        {"name": "wi", "wildcardProjection": {"a": True, "b": True, "_id": False}},
        None,
        None,
    ),
    (
        "text",
        {"e": "text"},
        {
            "name": "text",
            "weights": {"e": 1},
            "default_language": "english",
            "language_override": "language",
            "textIndexVersion": 3,
        },
        {"_fts": "text", "_ftsx": 1},
        None,
    ),
    ("2d", {"f": "2d"}, {"name": "2d", "min": -150.0, "max": 150.0, "bits": 26}, None, None),
    ("2dsphere", {"f": "2dsphere"}, {"name": "2dsphere", "2dsphereIndexVersion": 3}, None, None),
]
SPARSE_1 = {"v": 2, "key": {"b": 1, "c": -1}, "name": "b_1_c_-1", "sparse": True}
SPARSE_2 = {"v": 2, "key": {"d": "hashed"}, "name": "d_hashed", "sparse": True}


def _name(key: dict, options: dict) -> str:
    return options.get("name") or "_".join(f"{k}_{v}" for k, v in key.items())


def _setup(filled: bool) -> tuple:
    return (("command", {"create": "c"}), *((("insert", "c", ROW),) if filled else ()))


def _one(
    watch: str,
    filled: bool,
    name: str,
    key: dict,
    options: dict,
    event_key: dict | None,
    drop: str | None,
) -> Case:
    index = _name(key, options)
    description = {"indexes": [{"v": 2, "key": event_key or key, "name": index, **options}]}
    return Case(
        f"index-{name}-{watch}-{'filled' if filled else 'empty'}",
        SOURCE,
        watch,
        options=EXPANDED,
        setup=_setup(filled),
        ops=(
            (
                "command",
                {"createIndexes": "c", "indexes": [{"key": key, "name": index, **options}]},
            ),
            ("command", {"dropIndexes": "c", "index": [drop or index] if drop != "*" else "*"}),
        ),
        expect=(
            {"operationType": "createIndexes", "ns": NS, "operationDescription": description},
            {"operationType": "dropIndexes", "ns": NS, "operationDescription": description},
        ),
    )


def _pair(watch: str, filled: bool) -> Case:
    created: tuple[dict, ...]
    if filled:
        created = (
            {
                "operationType": "createIndexes",
                "ns": NS,
                "operationDescription": {"indexes": [SPARSE_1, SPARSE_2]},
            },
        )
    else:
        created = tuple(
            {"operationType": "createIndexes", "ns": NS, "operationDescription": {"indexes": [s]}}
            for s in (SPARSE_1, SPARSE_2)
        )
    dropped = tuple(
        {"operationType": "dropIndexes", "ns": NS, "operationDescription": {"indexes": [s]}}
        for s in (SPARSE_1, SPARSE_2)
    )
    return Case(
        f"index-two-sparse-{watch}-{'filled' if filled else 'empty'}",
        SOURCE,
        watch,
        options=EXPANDED,
        setup=_setup(filled),
        unordered=True,
        ops=(
            (
                "command",
                {
                    "createIndexes": "c",
                    "indexes": [
                        {"key": {"b": 1, "c": -1}, "name": "b_1_c_-1", "sparse": True},
                        {"key": {"d": "hashed"}, "name": "d_hashed", "sparse": True},
                    ],
                },
            ),
            ("command", {"dropIndexes": "c", "index": ["b_1_c_-1", "d_hashed"]}),
        ),
        expect=(*created, *dropped),
    )


CASES = [
    *[
        _one(watch, filled, *index)
        for watch in ("database", "collection")
        for filled in (False, True)
        for index in INDEXES
    ],
    *[_pair(watch, filled) for watch in ("database", "collection") for filled in (False, True)],
]
