"""Random parallelChangeStream commands, getMores and killCursors through a live proxy: every
answer is a reply or a MongoDB error with a code other than InternalError, and the connection
and the proxy serve the next command (bad input gets a clear error and hurts nothing)."""

from __future__ import annotations

from typing import Any

import trio
from bson import Int64, Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo.errors import OperationFailure

from mongoformats.resume_token import high_water_mark
from tests.conftest import _close_all, client, proxy_uri, sync
from wireproxy.app import serve_proxy
from wireproxy.config import ProxyConfig

NS = "$cmd.parallelChangeStream"

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-3, 1100),
    st.floats(allow_nan=True),
    st.text(max_size=6),
    st.binary(max_size=6),
    st.builds(Int64, st.integers(-(2**63), 2**63 - 1)),
    st.builds(Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
)
keys = st.text(
    st.characters(codec="utf-8", exclude_characters="\x00"), max_size=4
)  # what BSON can encode
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)),
    max_leaves=6,
)
tokens = st.one_of(
    st.builds(
        lambda t, i: high_water_mark(Timestamp(t, i)), st.integers(0, 2**32 - 1), st.integers(0, 9)
    ),
    st.builds(lambda h: {"_data": h}, st.text("0123456789ABCDEFabcdefXZ", max_size=40)),
    values,
)
# Valid values of each option (readerProcesses and bogus: only invalid ones). A command takes a
# valid value two times in three, anything else the third, so that many commands succeed and the
# rest fail on one field or several.
OPTIONS = {
    "name": st.sampled_from(["f1", "f2"]),
    "bucket": st.integers(0, 3),
    "pipeline": st.sampled_from([[], [{"$match": {"operationType": "insert"}}]]),
    "fullDocument": st.sampled_from(["default", "updateLookup"]),
    "showExpandedEvents": st.booleans(),
    "resumeAfter": st.one_of(tokens, st.lists(tokens)),
    "startAfter": tokens,
    "batchSize": st.integers(0, 10),
    "maxAwaitTimeMS": st.integers(0, 50),
    "shardBufferBytes": st.integers(1 << 16, 1 << 24),
    "bucketBufferBytes": st.integers(1 << 16, 1 << 24),
    "fullDocumentBeforeChange": st.just("off"),
    "startAtOperationTime": st.builds(Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 9)),
    # readerProcesses only invalid: a valid one starts interpreters, which is not what is fuzzed
    # here
    "readerProcesses": st.one_of(st.integers(65, 100), st.integers(-5, -1), st.text(max_size=2)),
    "bogus": values,
}
commands = st.fixed_dictionaries(
    {
        "parallelChangeStream": values,
        "nBuckets": st.one_of(st.integers(1, 4), st.integers(1, 4), values),
    },
    optional={
        k: (v if k in ("readerProcesses", "bogus") else st.one_of(v, v, values))
        for k, v in OPTIONS.items()
    },
)


async def test_random_commands_get_errors_with_codes_and_hurt_nothing(cluster):
    async with trio.open_nursery() as nursery:
        proxy = await nursery.start(
            serve_proxy,
            ProxyConfig(upstream=cluster.uri, listen_port=0, stream_idle_teardown_s=0.5),
        )

        def work() -> None:
            c = client(proxy_uri(proxy))
            streams_opened = 0

            # A getMore on a cursor of the engine's: short waits only (a long maxTimeMS would wait).
            owned_more = st.fixed_dictionaries(
                {
                    "collection": st.one_of(st.just(NS), values),
                    "maxTimeMS": st.one_of(
                        st.integers(-3, 20), st.floats(-1, 20), st.text(max_size=2)
                    ),
                },
                optional={"batchSize": st.one_of(st.integers(-3, 5), values)},
            )

            # A getMore for mongos (no cursor of the engine's): its parser's errors, then
            # CursorNotFound.
            theirs = st.fixed_dictionaries(
                {
                    "getMore": st.one_of(st.builds(Int64, st.integers(1, 2**40)), values),
                    "collection": st.one_of(st.just("c"), values),
                },
                optional={"batchSize": values, "maxTimeMS": values},
            )

            @settings(
                max_examples=300,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                database=None,
            )
            @given(cmd=commands, more=theirs, mine=owned_more)
            def one(cmd: dict[str, Any], more: dict[str, Any], mine: dict[str, Any]) -> None:
                nonlocal streams_opened

                def run(command: dict[str, Any]) -> dict[str, Any] | None:
                    try:
                        return dict(c.admin.command(command))
                    except OperationFailure as exc:
                        assert exc.code not in (None, 1), (command, exc.details)
                        return None

                opened: list[Any] = []
                if (reply := run(cmd)) is not None:
                    streams_opened += 1
                    opened.extend(cur["id"] for cur in reply.get("cursors", []))
                    if "cursor" in reply:
                        opened.append(reply["cursor"]["id"])
                if opened:
                    run({"getMore": opened[0], **mine})
                for command in (
                    more,
                    {"killCursors": NS, "cursors": [more["getMore"]]},
                    {"killCursors": NS, "cursors": [*opened, more["getMore"]]},
                ):
                    run(command)
                assert c.admin.command("ping")["ok"] == 1

            one()
            assert streams_opened >= 10  # the fuzz reached the commands that succeed too

        await sync(work)
        await sync(_close_all)
        nursery.cancel_scope.cancel()
