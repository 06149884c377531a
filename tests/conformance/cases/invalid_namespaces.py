"""jstests/change_streams/invalid_namespaces.js: a change stream cannot watch the admin or config
database, nor a `system.` collection (InvalidNamespace, 73); collections whose names merely
contain "system" can be watched.

The index holds a 2018-era version of this jstest; the rule and its error code are unchanged in
7.0/8.0 (`DocumentSourceChangeStream::assertIsLegalSpecification`)."""

from tests.conformance.model import DB, Case

SOURCE = "jstests/change_streams/invalid_namespaces.js"

CASES = [
    Case(
        "invalid-namespace-database-admin", SOURCE, "database", watch_db="admin", ops=(), error=73
    ),
    Case(
        "invalid-namespace-database-config", SOURCE, "database", watch_db="config", ops=(), error=73
    ),
    *[
        Case(
            f"invalid-namespace-collection-{coll.replace('.', '-')}",
            SOURCE,
            "collection",
            coll=coll,
            ops=(),
            error=73,
        )
        for coll in ("system.users", "system.profile", "system.version")
    ],
    *[
        Case(
            f"valid-namespace-collection-{coll}",
            SOURCE,
            "collection",
            coll=coll,
            ops=(("insert", coll, {"_id": 0}),),
            expect=(
                {
                    "operationType": "insert",
                    "ns": {"db": DB, "coll": coll},
                    "documentKey": {"_id": 0},
                    "fullDocument": {"_id": 0},
                },
            ),
        )
        for coll in ("systemindexes", "system_users")
    ],
]
