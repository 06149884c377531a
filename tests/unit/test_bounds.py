"""Bounded work per command, the checks themselves: pipeline length and nesting as the server
parses them, regular expressions on RE2, /metrics labels and pages, throttled logs, and fuzzed
command fields that fail with MongoDB errors (tests/integration/test_bounds.py sends them
through a proxy)."""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

import pytest
from bson import Binary, Decimal128, Int64, Regex, Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from buckets import commands as commands_module
from buckets import watch_command
from buckets.commands import (
    MAX_PIPELINE_STAGES,
    check_open_command,
    check_pipeline,
    check_status_command,
)
from mongoformats.change_stages import apply_stages, compile_stages, unsupported_in_stages
from mongoformats.errors import MongoError
from mongoformats.idl import MAX_BSON_DEPTH, check_depth, get_more_request, kill_cursors_ids
from mongoformats.mql import MAX_QUERY_DEPTH, matches, unsupported_in_query
from mongoformats.resume_token import high_water_mark
from wireproxy import metrics as metrics_module
from wireproxy.metrics import FailureLog, ProxyMetrics, command_label

CATASTROPHIC = "^(a+)+$"  # exponential backtracking on "aaa...ab" in re and PCRE


def nested_and(depth: int) -> dict[str, Any]:
    """A query `depth` levels of $and deep (level 0: the top-level query)."""
    query: dict[str, Any] = {"a": 1}
    for _ in range(depth):
        query = {"$and": [query]}
    return query


def test_pipeline_length_and_command_depth_are_the_servers():
    """7749501 past 1,000 stages (Pipeline::parseCommon, src/mongo/db/pipeline/pipeline.cpp;
    jstests/sharding/query/pipeline_length_limit.js), Overflow past 200 BSON levels
    (src/mongo/bson/bson_depth.h, bson_validate.cpp)."""
    assert check_pipeline([{"$match": {}}] * MAX_PIPELINE_STAGES, "parallelChangeStream")
    with pytest.raises(MongoError) as info:
        check_pipeline([{"$match": {}}] * (MAX_PIPELINE_STAGES + 1), "parallelChangeStream")
    assert (info.value.code, info.value.errmsg) == (
        7749501,
        "Pipeline length must be no longer than 1000 stages.",
    )
    with pytest.raises(MongoError) as info:
        check_pipeline({"$match": {}}, "parallelChangeStream")
    assert info.value.code == 14
    deep: Any = 1
    for _ in range(MAX_BSON_DEPTH):
        deep = {"a": deep}
    check_depth(deep)  # 200 levels, the command's own included
    with pytest.raises(MongoError) as info:
        check_depth({"a": deep})
    assert info.value.code_name == "Overflow"


def _deep_list(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def test_a_very_deep_document_is_refused_without_recursion():
    """The depth check walks iteratively: a document far past the limit costs one error."""
    with pytest.raises(MongoError) as info:
        check_depth({"pipeline": _deep_list(100_000)})
    assert info.value.code_name == "Overflow"


def test_queries_deeper_than_the_servers_tree_limit_are_refused():
    """BadValue past 100 levels, as MatchExpressionParser's kMaximumTreeDepth refuses them
    (src/mongo/db/matcher/expression_parser.cpp); at the limit the query is evaluated."""
    for at_limit in (nested_and(MAX_QUERY_DEPTH), {"v": _nested_not(MAX_QUERY_DEPTH)}):
        assert unsupported_in_query(at_limit) is None
        matches({"a": 1, "v": 2}, at_limit)  # no RecursionError
    for past in (
        nested_and(MAX_QUERY_DEPTH + 1),
        {"v": _nested_not(MAX_QUERY_DEPTH + 1)},
        nested_and(5000),
    ):
        with pytest.raises(MongoError) as info:
            unsupported_in_query(past)
        assert info.value.code == 2
        assert info.value.errmsg.startswith("exceeded maximum query tree depth of 100 at ")
        assert len(info.value.errmsg) < 300  # the query is not echoed whole


def _nested_not(depth: int) -> Any:
    cond: Any = {"$eq": 2}
    for _ in range(depth):
        cond = {"$not": cond}
    return cond


def test_patterns_only_a_backtracking_engine_runs_are_named():
    """Backreferences, lookaround, possessive quantifiers and the x option are not RE2's: the
    engine leaves such a query to mongos (watch()) or refuses it (parallelChangeStream)."""
    for query in (
        {"a": {"$regex": r"(a)\1"}},
        {"a": {"$regex": "a(?=b)"}},
        {"a": {"$regex": "(?<!x)a"}},
        {"a": {"$regex": "a++"}},
        {"a": {"$regex": "a b", "$options": "x"}},
        {"a": Regex(r"(a)\1")},
        {"a": {"$in": [Regex("(?=a)")]}},
        {"a": {"$not": Regex(r"(a)\1")}},
        {"a": {"$elemMatch": {"$regex": r"(a)\1"}}},
        {"$or": [{"a": {"$regex": 5}}]},
    ):
        assert unsupported_in_query(query) is not None, query
    for query in (
        {"a": {"$regex": CATASTROPHIC}},
        {"a": {"$regex": "^A.B$", "$options": "ims"}},
        {"a": Regex("x", "i")},
        {"a": {"$in": [Regex("^a"), 1]}},
    ):
        assert unsupported_in_query(query) is None, query


def test_patterns_the_server_refuses_are_refused():
    """BadValue for a pattern past 32,764 characters or with a NUL byte (RegexMatchExpression,
    src/mongo/db/matcher/expression_leaf.cpp): RE2 is never asked to compile such a pattern."""
    for query in (
        {"a": {"$regex": "a" * 32765}},
        {"a": {"$regex": "a\0"}},
        {"a": Regex("a" * 40000)},
        {"a": {"$regex": "a", "$options": "i\0"}},
    ):
        with pytest.raises(MongoError) as info:
            unsupported_in_query(query)
        assert info.value.code == 2 and info.value.errmsg.startswith("Regular expression")
    assert unsupported_in_query({"a": {"$regex": "a" * 32764}}) is None


@pytest.mark.parametrize(
    "pattern, options, subject, expected",
    [
        ("b$", "", "ab\n", True),  # PCRE's $ matches before a final newline
        ("b$", "", "ab\nc", False),
        (r"b\$", "", "ab$", True),  # an escaped $ is no anchor
        ("^b$", "m", "a\nb\nc", True),
        ("A.B", "is", "xa\nb", True),
        ("A.B", "", "xa\nb", False),
        (r"\d+", "", "x42", True),
    ],
)
def test_re2_matches_as_the_server_does(pattern, options, subject, expected):
    assert matches({"s": subject}, {"s": {"$regex": pattern, "$options": options}}) is expected


def test_only_known_command_names_become_labels():
    assert command_label("find") == "find"
    assert command_label("parallelChangeStream") == "parallelChangeStream"
    assert command_label("x" * 10_000) == "other"
    assert command_label("FIND") == "other"


def test_counted_commands_are_labelled_as_by_labels(monkeypatch):
    """count_command counts under the labels `commands.labels` gives (unknown names as other),
    also once its kept children start over."""
    monkeypatch.setattr(metrics_module, "_COMMAND_CHILDREN_KEPT", 2)
    metrics = ProxyMetrics()
    for name in ("find", "getMore", "find", "noSuchCommand", "getMore", "find"):
        metrics.count_command(name, "passthrough")
    metrics.count_command("getMore", "local")
    page = metrics_module.generate_latest(metrics.registry).decode()
    for line in (
        'pcs_commands_total{command="find",route="passthrough"} 3.0',
        'pcs_commands_total{command="getMore",route="passthrough"} 2.0',
        'pcs_commands_total{command="other",route="passthrough"} 1.0',
        'pcs_commands_total{command="getMore",route="local"} 1.0',
    ):
        assert line in page


async def test_a_page_is_formatted_off_the_loop(monkeypatch, autojump_clock):
    """The text of a page comes from a worker thread; the families are those of the registry."""
    metrics = ProxyMetrics()
    metrics.commands.labels(command="find", route="passthrough").inc()
    threads = []
    real = metrics_module.generate_latest

    def recording(registry: Any) -> bytes:
        threads.append(threading.current_thread())
        return real(registry)

    monkeypatch.setattr(metrics_module, "generate_latest", recording)
    page = (await metrics.page()).decode()
    assert threads and threads[0] is not threading.main_thread()
    assert 'pcs_commands_total{command="find",route="passthrough"} 1.0' in page

    def names(text: str) -> set[str]:
        return {line.split()[2] for line in text.splitlines() if line.startswith("# HELP")}

    assert names(page) == {
        n for n in names(real(metrics.registry).decode()) if not n.endswith("_created")
    }


def test_a_failure_is_logged_once_per_error_id_and_interval(caplog):
    failures = FailureLog(logging.getLogger("test.failures"), interval_s=3600)

    def fail(value: Any) -> None:
        for _ in value:
            pass

    ids = []
    with caplog.at_level(logging.ERROR, logger="test.failures"):
        for value in (5, 5, 5, 5, None):  # one place in the code, whatever the value
            try:
                fail(value)
            except TypeError as exc:
                ids.append(failures.record(exc, "conn1: find"))
    assert len(set(ids)) == 1  # the same place in the code: the same id
    assert len(caplog.records) == 1 and ids[0] in caplog.records[0].getMessage()


# Fuzzed values: every BSON type the proxy decodes, numbers at and past their limits, operator
# names, and documents and arrays of them, nested.
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.binary(max_size=17),
    st.builds(Int64, st.integers(-(2**63), 2**63 - 1)),
    st.builds(Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
    st.builds(Decimal128, st.sampled_from(["1", "NaN", "-Infinity", "-1E+6000", "2.5", "1E+30"])),
    st.builds(
        Regex, st.sampled_from(["a", r"(a)\1", CATASTROPHIC, "["]), st.sampled_from(["", "i", "x"])
    ),
    st.sampled_from(["$a", "$$ROOT", "$$NOW", "$fullDocument.a", "x" * 300]),
)


keys = st.one_of(
    st.sampled_from(
        [
            "$and",
            "$or",
            "$not",
            "$regex",
            "$options",
            "$in",
            "$elemMatch",
            "$expr",
            "$eq",
            "$match",
            "$project",
            "$set",
            "$unset",
            "$replaceRoot",
            "newRoot",
            "$concat",
            "$literal",
            "_data",
            "_typeBits",
            "id",
            "a",
            "fullDocument",
        ]
    ),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=4),
)


values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)),
    max_leaves=12,
)


FUZZ = settings(
    max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None
)


@FUZZ
@given(
    fields=st.dictionaries(
        st.sampled_from(sorted(commands_module._OPEN_FIELDS)), values, max_size=6
    ),
    first=values,
)
def test_fuzzed_open_and_status_fields_fail_with_mongodb_errors(fields, first):
    """Whatever the fields, the checks raise a MongoError or let through a command the engine's
    later steps (token lists, settings, stages) read without a Python exception."""
    cmd = {"parallelChangeStream": first, **fields}
    try:
        checked = check_open_command(cmd)
        n = commands_module.int_option(checked, "nBuckets", 1, 1024)
        commands_module._one_token_if_common(checked, n)
        for name in commands_module._SETTINGS:
            commands_module.setting(checked, name, 0)
        for stage in checked.get("pipeline", []):
            if "$match" in stage:
                unsupported_in_query(stage["$match"])
    except MongoError:
        pass
    status = {
        "parallelChangeStreamStatus": 1,
        **{k: v for k, v in fields.items() if k in ("name", "lsid")},
        "after": fields.get("resumeAfter"),
        "maxEvents": fields.get("batchSize"),
    }
    with contextlib.suppress(MongoError):
        check_status_command(status)


@FUZZ
@given(
    stages=st.lists(
        st.one_of(values, st.dictionaries(keys, values, min_size=1, max_size=1)), max_size=3
    ),
    spec=values,
    cursor=values,
    more=st.dictionaries(
        st.sampled_from(["getMore", "collection", "batchSize", "maxTimeMS", "cursors"]), values
    ),
)
def test_fuzzed_watch_and_cursor_fields_fail_with_mongodb_errors(stages, spec, cursor, more):
    """An accelerated aggregate's fields: typed (else left to mongos) or refused with MongoErrors,
    and stages the engine accepts run on an event with MongoErrors at most; getMore and
    killCursors fields fail with the server's IDL errors."""
    cmd = {"aggregate": "c", "pipeline": [{"$changeStream": spec}, *stages], "cursor": cursor}
    event = {
        "_id": {"_data": "00"},
        "operationType": "insert",
        "fullDocument": {"a": [1, "x"], "s": "a" * 30},
    }
    try:
        check_depth(cmd)
        check_pipeline(cmd["pipeline"], "aggregate")
        if watch_command._well_typed_watch(cmd) and unsupported_in_stages(stages) is None:
            apply_stages(event, compile_stages(stages), {"_data": "00"})
    except MongoError:
        pass
    for parse in (get_more_request, kill_cursors_ids):
        with contextlib.suppress(MongoError):
            parse({"getMore": Int64(5), "killCursors": "c", **more})


@FUZZ
@given(
    data=st.one_of(
        st.binary(max_size=60),
        st.builds(
            lambda tail, cut: bytes.fromhex(_TOKEN)[:cut] + tail,
            st.binary(max_size=30),
            st.integers(0, 40),
        ),
    ),
    bits=st.one_of(st.just(b""), st.binary(max_size=4)),
)
def test_fuzzed_resume_tokens_fail_with_mongodb_errors(data, bits):
    """Token bytes cut anywhere and type bits of any length: InvalidResumeToken and its kin."""
    token = {"_data": data.hex().upper(), "_typeBits": Binary(bits, 0)}
    with contextlib.suppress(MongoError):
        check_open_command({"parallelChangeStream": 1, "nBuckets": 1, "resumeAfter": token})


def test_type_bits_shorter_than_their_length_are_an_invalid_token():
    token = {"_data": _TOKEN, "_typeBits": Binary(b"\x80", 0)}
    with pytest.raises(MongoError) as info:
        check_open_command({"parallelChangeStream": 1, "nBuckets": 1, "resumeAfter": token})
    assert info.value.code_name == "InvalidResumeToken"


_TOKEN = high_water_mark(Timestamp(5, 1))["_data"]


def test_lines_clients_cause_are_throttled(caplog):
    """A flood of bad frames logs one line per interval, the next saying how many were left out."""
    now = [0.0]
    log = metrics_module.ThrottledLog(
        logging.getLogger("throttle-test"), interval_s=10.0, clock=lambda: now[0]
    )
    with caplog.at_level(logging.INFO, logger="throttle-test"):
        for conn in range(100_000):
            log.info("bad frame", "conn%d: closing after a bad frame: %s", conn, "junk")
        now[0] = 10.5
        log.info("bad frame", "conn%d: closing after a bad frame: %s", 100_000, "junk")
        log.info("closing", "conn%d: closing: %s", 7, "idle timeout")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "conn0: closing after a bad frame: junk",
        "conn100000: closing after a bad frame: junk (and 99999 more since the last such line)",
        "conn7: closing: idle timeout",
    ]
