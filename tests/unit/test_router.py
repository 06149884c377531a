"""wireproxy.router.classify, a pure function: which commands the proxy serves itself."""

from __future__ import annotations

from wireproxy.router import CommandTable, Route, classify


async def _getmore(session, db, cmd):
    return {}


async def _kill(session, db, cmd):
    return {}


async def _watch(session, db, cmd):
    return {}


def _table() -> CommandTable:
    table = CommandTable(owned_cursors={7}, get_more=_getmore, kill_cursors=_kill)
    table.change_stream_handler = _watch
    return table


def test_kill_cursors_is_local_when_it_names_an_owned_cursor():
    table = _table()
    assert classify({"killCursors": "c", "cursors": [8, 7]}, table, accelerate=False) == (
        Route.LOCAL,
        _kill,
    )
    for cursors in ([8], [], "7", [True], None):
        route = classify({"killCursors": "c", "cursors": cursors}, table, accelerate=False)
        assert route == (Route.PASSTHROUGH, None), cursors
    assert (
        classify({"getMore": True, "collection": "c"}, table, accelerate=False)[0]
        is Route.PASSTHROUGH
    )


def test_a_change_stream_aggregate_is_local_only_with_acceleration_on():
    table = _table()
    watch = {"aggregate": 1, "pipeline": [{"$changeStream": {}}, {"$match": {}}]}
    assert classify(watch, table, accelerate=True) == (Route.LOCAL, _watch)
    assert classify(watch, table, accelerate=False) == (Route.PASSTHROUGH, None)
    for pipeline in ([{"$match": {}}], [], None, ["$changeStream"]):
        route = classify({"aggregate": "c", "pipeline": pipeline}, table, accelerate=True)
        assert route == (Route.PASSTHROUGH, None), pipeline
    table.change_stream_handler = None
    assert classify(watch, table, accelerate=True) == (Route.PASSTHROUGH, None)
