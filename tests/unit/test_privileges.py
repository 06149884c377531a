"""Privilege matching as the server resolves resources (mongoformats.privileges)."""

from mongoformats.privileges import allows, change_stream_resource, privileges_of_roles

WATCH = ("find", "changeStream")


def test_a_database_role_covers_its_collections_and_database_streams_only():
    read_shop = privileges_of_roles([("read", "shop")])
    assert allows(read_shop, WATCH, change_stream_resource("shop", "orders"))
    assert allows(read_shop, WATCH, change_stream_resource("shop", None))
    assert not allows(read_shop, WATCH, change_stream_resource("crm", None))
    assert not allows(read_shop, WATCH, change_stream_resource(None, None))  # the whole cluster
    assert not allows(read_shop, ("insert",), {"db": "shop", "collection": "orders"})
    assert not allows(
        read_shop, ("find",), {"db": "shop", "collection": "system.js"}
    )  # no wildcard reaches it
    assert not allows(read_shop, ("listShards",), {"cluster": True})


def test_any_database_roles_and_root_cover_cluster_streams():
    for roles in ([("readAnyDatabase", "admin")], [("root", "admin")]):
        assert allows(privileges_of_roles(roles), WATCH, change_stream_resource(None, None))
    assert allows(privileges_of_roles([("root", "admin")]), ("appendOplogNote",), {"cluster": True})
    assert not allows(
        privileges_of_roles([("readAnyDatabase", "admin")]), ("appendOplogNote",), {"cluster": True}
    )


def test_actions_may_come_from_different_privileges():
    split = [
        {"resource": {"db": "", "collection": ""}, "actions": ["find"]},
        {"resource": {"db": "", "collection": ""}, "actions": ["changeStream"]},
    ]
    assert allows(split, WATCH, change_stream_resource(None, None))
    only_one_collection = [
        {"resource": {"db": "shop", "collection": "orders"}, "actions": list(WATCH)}
    ]
    assert allows(only_one_collection, WATCH, change_stream_resource("shop", "orders"))
    assert not allows(only_one_collection, WATCH, change_stream_resource("shop", None))
