"""Bounded work per command: pipeline length and nesting, regular expressions, /metrics and errors.

No command a client sends may cost other clients: a pipeline is at most 1,000 stages and a query
at most 100 levels deep, as the server parses them; a $regex runs on RE2 (linear time) or not in
the engine at all; /metrics labels are bounded and a page is formatted off the loop; a command
the engine cannot handle is answered with a MongoDB error, never with Python exception text.
These tests send the commands through a proxy; tests/unit/test_bounds.py checks the checks.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo.errors import OperationFailure

from buckets.commands import MAX_PIPELINE_STAGES
from mongoformats.mql import MAX_QUERY_DEPTH
from tests.conftest import _close_all, client, free_port, proxy_uri, scrape, sync, wait_until
from tests.unit.test_bounds import CATASTROPHIC, _nested_not, keys, nested_and, values
from wireproxy.app import serve_proxy
from wireproxy.config import ProxyConfig

NS = "$cmd.parallelChangeStream"


@pytest.fixture
async def accelerated(cluster: Any) -> Any:
    """A proxy that serves drivers' watch() from the engine (accelerate_change_streams)."""
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            serve_proxy,
            ProxyConfig(upstream=cluster.uri, listen_port=0, accelerate_change_streams=True),
        )
        yield server
        await sync(_close_all)  # while the proxy still answers endSessions
        nursery.cancel_scope.cancel()


def nested_expression(levels: int) -> dict[str, Any]:
    """An $expr nested `levels` operators deep (two BSON levels each: the operator and its
    array)."""
    expr: Any = True
    for _ in range(levels):
        expr = {"$and": [expr]}
    return {"$expr": expr}


def next_events(c: Any, cursor_id: int, want: int) -> list[Any]:
    """getMore until `want` events came (the guard of the test's deadline applies)."""
    events: list[Any] = []
    while len(events) < want:
        reply = c.admin.command({"getMore": cursor_id, "collection": NS, "maxTimeMS": 200})
        events += reply["cursor"]["nextBatch"]
    return events


# -- pipelines and nesting ------------------------------------------------------------------


async def test_long_and_deep_pipelines_are_refused_at_open_and_the_longest_allowed_run(accelerated):
    """A parallelChangeStream or an accelerated watch() of 1,001 stages fails at once with the
    server's 7749501; 1,000 stages open and deliver events (their $match stages are evaluated as
    one flat $and, however many there are). Nesting past the server's limits fails at open too."""
    proxy = accelerated

    def work():
        c = client(proxy_uri(proxy))
        match = {"$match": {"operationType": {"$in": ["insert", "update"]}}}
        for pipeline in ([match] * 1001, [match] * 10_000):
            with pytest.raises(OperationFailure) as info:
                c.admin.command({"parallelChangeStream": 1, "nBuckets": 1, "pipeline": pipeline})
            assert info.value.code == 7749501
        with pytest.raises(OperationFailure) as info:
            c.long.c.watch([match] * MAX_PIPELINE_STAGES)  # with $changeStream: 1,001
        assert info.value.code == 7749501
        opened = c.admin.command(
            {"parallelChangeStream": 1, "nBuckets": 1, "pipeline": [match] * 1000}
        )
        with c.long.c.watch([match] * (MAX_PIPELINE_STAGES - 1)) as watched:
            c.long.c.insert_one({"_id": 1})
            assert watched.next()["documentKey"] == {"_id": 1}
        events = next_events(c, opened["cursors"][0]["id"], 1)
        assert [e["documentKey"] for e in events] == [{"_id": 1}]
        # ($and takes two BSON levels a level: past 100 $and, the command is past 200 levels)
        for query, code in (
            ({"v": _nested_not(MAX_QUERY_DEPTH + 1)}, 2),
            (nested_and(MAX_QUERY_DEPTH + 1), 15),
            (nested_expression(120), 15),
        ):
            with pytest.raises(OperationFailure) as info:
                c.admin.command(
                    {"parallelChangeStream": 1, "nBuckets": 1, "pipeline": [{"$match": query}]}
                )
            assert info.value.code == code
        c.admin.command(
            {
                "parallelChangeStream": 1,
                "nBuckets": 1,
                "pipeline": [
                    {"$match": nested_expression(90)},
                    {"$match": nested_and(90)},
                    {"$match": {"v": _nested_not(MAX_QUERY_DEPTH)}},
                ],
            }
        )

    await sync(work)


# -- regular expressions --------------------------------------------------------------------


def test_a_catastrophic_pattern_is_matched_in_linear_time():
    """^(a+)+$ against 100 a's and a b: 2^100 steps for a backtracking engine, none for RE2.
    Run in a process of its own, so that a backtracking engine fails the test at the deadline
    instead of holding this one (re holds the GIL for the whole match)."""
    code = (
        "from bson import Regex\n"
        "from mongoformats.mql import matches\n"
        f"pattern = {CATASTROPHIC!r}\n"
        "doc = {'s': 'a' * 100 + 'b', 't': ['x', 'a' * 100 + 'b']}\n"
        "for query in ({'s': {'$regex': pattern}}, {'s': Regex(pattern)},\n"
        "              {'t': {'$in': [Regex(pattern)]}},\n"
        "              {'s': {'$regex': pattern, '$options': 'i'}}):\n"
        "    assert not matches(doc, query), query\n"
        "assert matches(doc, {'s': {'$not': Regex(pattern)}})\n"
        "print('done')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "done", done.stderr


async def test_a_catastrophic_regex_in_a_stream_starves_no_client(accelerated):
    """A stream's $match with ^(a+)+$ meets a 100-character value: its consumer gets the events
    that match, another client is answered meanwhile, and the proxy goes on serving. A pattern
    RE2 cannot run is refused at open (BadValue) and a watch() with one goes to mongos."""
    proxy = accelerated

    def work():
        c, other = client(proxy_uri(proxy)), client(proxy_uri(proxy))
        opened = c.admin.command(
            {
                "parallelChangeStream": 1,
                "nBuckets": 1,
                "pipeline": [{"$match": {"fullDocument.s": {"$regex": CATASTROPHIC}}}],
            }
        )
        c.re.c.insert_many([{"_id": 1, "s": "a" * 100 + "b"}, {"_id": 2, "s": "aaaa"}])
        assert other.admin.command("ping")["ok"] == 1
        events = next_events(c, opened["cursors"][0]["id"], 1)
        assert [e["documentKey"] for e in events] == [{"_id": 2}]
        with pytest.raises(OperationFailure) as info:
            c.admin.command(
                {
                    "parallelChangeStream": 1,
                    "nBuckets": 1,
                    "pipeline": [{"$match": {"fullDocument.s": {"$regex": r"(a)\1"}}}],
                }
            )
        assert info.value.code == 2 and "RE2" in info.value.details["errmsg"]
        before = proxy.engine.watches["passedThrough"]
        try:  # (simcluster, in mongos's place, does not evaluate it either)
            c.re.c.watch([{"$match": {"fullDocument.s": {"$regex": r"(b)\1"}}}]).close()
        except OperationFailure as exc:
            assert exc.code == 238
        assert proxy.engine.watches["passedThrough"] == before + 1

    await sync(work)


# -- /metrics -------------------------------------------------------------------------------


async def test_metrics_labels_are_bounded_and_closed_streams_leave_the_page(cluster):
    """Client-chosen command names are labelled `other`; a stream name past 255 bytes is refused
    (InvalidNamespace, as a namespace past MaxNsLen is); a torn-down stream's series are gone."""
    port = free_port()
    async with trio.open_nursery() as nursery:
        config = ProxyConfig(
            upstream=cluster.uri, listen_port=0, metrics_port=port, stream_idle_teardown_s=0.5
        )
        proxy = await nursery.start(serve_proxy, config)

        def work():
            c = client(proxy_uri(proxy))
            for i in range(20):
                with pytest.raises(OperationFailure):
                    c.admin.command({f"bogus{i}" + "x" * 1000: 1})
            with pytest.raises(OperationFailure) as info:
                c.admin.command({"parallelChangeStream": 1, "nBuckets": 1, "name": "n" * 256})
            assert info.value.code == 73
            with pytest.raises(OperationFailure) as info:
                c.admin.command(
                    {"parallelChangeStream": 1, "nBuckets": 1, "name": "é" * 128}
                )  # 256 bytes
            assert info.value.code == 73
            opened = c.admin.command({"parallelChangeStream": 1, "nBuckets": 2, "name": "s" * 255})
            lines = scrape(port)
            assert not any("bogus" in ln for ln in lines)
            other = 'pcs_commands_total{command="other",route="passthrough"} 20.0'
            assert other in lines
            assert any(f'stream="{"s" * 255}"' in ln for ln in lines)
            ids = [cur["id"] for cur in opened["cursors"]]
            c.admin.command({"killCursors": NS, "cursors": ids})
            wait_until(lambda: not any("stream=" in ln for ln in scrape(port)), timeout=20)

        await sync(work)
        await sync(_close_all)
        nursery.cancel_scope.cancel()


# -- errors ---------------------------------------------------------------------------------


async def test_an_unexpected_failure_is_answered_without_python_text(proxy, caplog):
    """InternalError with an error id the log holds, never the exception's words."""

    async def broken(session: Any, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        raise TypeError("'int' object is not iterable: secret detail")

    proxy.server.table.commands["parallelchangestreamstatus"] = broken

    def work():
        c = client(proxy_uri(proxy))
        with pytest.raises(OperationFailure) as info:
            c.admin.command({"parallelChangeStreamStatus": 1})
        return info.value

    with caplog.at_level(logging.ERROR, logger="wireproxy.session"):
        failure = await sync(work)
    message = failure.details["errmsg"]
    assert failure.code == 1
    assert not any(word in message for word in ("TypeError", "secret", "iterable"))
    error_id = message.split("error id ")[1].split(";")[0]
    assert any(error_id in r.getMessage() and r.exc_info for r in caplog.records)


async def test_fuzzed_engine_commands_through_the_proxy_never_fail_with_internal_error(cluster):
    """parallelChangeStream (pipelines and names of every shape), parallelChangeStreamStatus, an
    accelerated watch()'s aggregate, and getMore and killCursors on the cursors they open, with
    fuzzed fields: a reply or a MongoDB error other than InternalError, and the proxy serves on."""
    async with trio.open_nursery() as nursery:
        proxy = await nursery.start(
            serve_proxy,
            ProxyConfig(
                upstream=cluster.uri,
                listen_port=0,
                stream_idle_teardown_s=0.5,
                accelerate_change_streams=True,
            ),
        )

        def work() -> None:
            c = client(proxy_uri(proxy))
            codes: set[int] = set()
            opened_kinds: set[str] = set()  # databases of the cursors opened: streams, watches

            def run(db: str, command: dict[str, Any]) -> dict[str, Any] | None:
                passed = proxy.engine.watches["passedThrough"]
                try:
                    return dict(c[db].command(command))
                except OperationFailure as exc:
                    # An aggregate the engine left to mongos has mongos's answer (simcluster's).
                    if proxy.engine.watches["passedThrough"] == passed:
                        assert exc.code not in (None, 1), (command, exc.details)
                        codes.add(exc.code)
                    return None

            stages = st.lists(st.dictionaries(keys, values, min_size=1, max_size=1), max_size=3)
            status_fields = {
                "name": st.one_of(st.just("fz"), values),
                "after": values,
                "maxEvents": values,
            }

            # Derandomized: the same 150 commands every run, so the closing check that the fuzz
            # reached several of the engine's errors cannot fail by chance.
            @settings(
                max_examples=150,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                database=None,
                derandomize=True,
            )
            @given(
                pipeline=st.one_of(values, stages),
                name=st.one_of(st.just("fz"), st.just("fz"), values),
                spec=st.one_of(st.just({}), values),
                status=st.fixed_dictionaries({}, optional=status_fields),
                cursor=st.one_of(st.just({}), values),
                more=st.fixed_dictionaries(
                    {"maxTimeMS": st.one_of(st.integers(0, 20), values)},
                    optional={"batchSize": values, "collection": values},
                ),
            )
            def one(pipeline, name, status, spec, cursor, more):
                opened: list[tuple[str, Any, str]] = []
                reply = run(
                    "admin",
                    {"parallelChangeStream": 1, "nBuckets": 1, "name": name, "pipeline": pipeline},
                )
                if reply is not None:
                    opened.append(("admin", reply["cursors"][0]["id"], NS))
                run("admin", {"parallelChangeStreamStatus": 1, **status})
                stages = pipeline if isinstance(pipeline, list) else [pipeline]
                reply = run(
                    "fz",
                    {
                        "aggregate": "c",
                        "pipeline": [{"$changeStream": spec}, *stages],
                        "cursor": cursor,
                    },
                )
                if reply is not None and reply["cursor"]["id"]:
                    opened.append(("fz", reply["cursor"]["id"], "c"))
                for db, cid, coll in opened:
                    opened_kinds.add(db)
                    run(db, {"getMore": cid, "collection": coll, **more})
                    run(db, {"killCursors": coll, "cursors": [cid]})
                assert c.admin.command("ping")["ok"] == 1

            one()
            # the fuzz reached the checks and the commands that succeed too
            assert len(codes) >= 2 and len(opened_kinds) == 2, (codes, opened_kinds)

        await sync(work, timeout=600)
        await sync(_close_all)
        nursery.cancel_scope.cancel()
