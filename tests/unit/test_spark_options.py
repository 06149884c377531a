"""The Spark source's options, parsed without Spark: the source's own names, the MongoDB Spark
connector's (mongodb/mongo-spark ReadConfig.java, and its "Streaming Read Configuration Options"
page) where they mean the same, and the start time's forms."""

from __future__ import annotations

import pytest
from bson import Timestamp

from bucketspark.options import Options, parse_start_time, stream_spec


def spec(**raw: str):  # noqa: ANN201 - a StreamSpec
    return stream_spec(Options({"uri": "mongodb://proxy/", **raw}))


def test_the_connectors_names_mean_what_the_source_names_mean() -> None:
    ours = stream_spec(
        Options(
            {
                "uri": "mongodb://p/",
                "pipeline": '[{"$match": {"operationType": "insert"}}]',
                "fullDocument": "updateLookup",
                "startAtOperationTime": "30,2",
            }
        )
    )
    theirs = Options(
        {
            "connection.uri": "mongodb://p/",
            "aggregation.pipeline": '{"$match": {"operationType": "insert"}}',
            "change.stream.lookup.full.document": "updateLookup",
            "change.stream.startup.mode": "timestamp",
            "change.stream.startup.mode.timestamp.start.at.operation.time": "Timestamp(30, 2)",
        }
    )
    assert stream_spec(theirs) == ours
    assert theirs.get("startAtOperationTime") == Timestamp(30, 2)
    # The SparkConf spelling of a connector option, in any case (Spark lowercases option names).
    assert (
        Options({"spark.mongodb.read.connection.uri": "mongodb://p/"}).get("uri") == "mongodb://p/"
    )
    assert Options({"Connection.URI": "mongodb://p/"}).get("uri") == "mongodb://p/"


def test_database_and_collection_filter_the_stream_by_namespace() -> None:
    assert spec(database="shop").pipeline == ({"$match": {"ns.db": "shop"}},)
    assert spec(database="shop", collection="*").pipeline == ({"$match": {"ns.db": "shop"}},)
    # Comma-separated, a backslash escaping a comma, an asterisk or itself (connector 10.3+).
    filtered = spec(
        database="shop",
        collection=r"orders,a\,b,\*",
        pipeline='[{"$changeStreamSplitLargeEvent": {}}]',
    )
    assert filtered.pipeline == (
        {"$match": {"ns.db": "shop", "ns.coll": {"$in": ["orders", "a,b", "*"]}}},
        {"$changeStreamSplitLargeEvent": {}},
    )  # the split stage stays last
    with pytest.raises(ValueError, match="option collection needs option database"):
        spec(collection="orders")
    with pytest.raises(ValueError, match="option collection must be collection names"):
        spec(database="shop", collection="a,,b")


def test_publish_full_document_only_looks_updates_up_unless_another_post_image_is_asked() -> None:
    assert (
        spec(**{"change.stream.publish.full.document.only": "true"}).full_document == "updateLookup"
    )
    assert (
        spec(
            **{"change.stream.publish.full.document.only": "true", "fullDocument": "whenAvailable"}
        ).full_document
        == "whenAvailable"
    )
    assert spec(**{"change.stream.publish.full.document.only": "false"}).full_document == "default"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1700000000,5", Timestamp(1700000000, 5)),  # the source's own form
        ("1700000000", Timestamp(1700000000, 0)),  # seconds since the epoch (the connector's)
        ("Timestamp(1700000000, 5)", Timestamp(1700000000, 5)),  # as mongosh prints one
        ("Timestamp(1700000000,5)", Timestamp(1700000000, 5)),
        (
            "2023-11-14T22:13:20Z",
            Timestamp(1700000000, 0),
        ),  # ISO-8601, whole seconds (the connector's)
        ("2023-11-14T23:13:20+01:00", Timestamp(1700000000, 0)),
        ('{"$timestamp": {"t": 1700000000, "i": 5}}', Timestamp(1700000000, 5)),  # extended JSON
    ],
)
def test_a_start_time_in_each_accepted_form(text: str, expected: Timestamp) -> None:
    assert parse_start_time(text) == expected
    assert Options({"startAtOperationTime": text}).get("startAtOperationTime") == expected


@pytest.mark.parametrize(
    "text",
    [
        "2023-11-14T22:13:20",
        "2023-11-14T22:13:20.5Z",
        "yesterday",
        "Timestamp(1, x)",
        '{"$date": "2023-11-14T22:13:20Z"}',
        "-5",
    ],
)
def test_a_start_time_that_is_ambiguous_or_malformed_is_refused_by_name(text: str) -> None:
    """A local time (no zone) would depend on the machine; a fraction of a second cannot be
    expressed in a cluster time."""
    with pytest.raises(
        ValueError, match="option change.stream.startup.mode.timestamp.start.at.operation.time must"
    ):
        Options({"change.stream.startup.mode.timestamp.start.at.operation.time": text})


def test_a_setting_given_under_both_names_must_agree() -> None:
    agreed = Options({"uri": "mongodb://p/", "connection.uri": "mongodb://p/"})
    assert agreed.get("uri") == "mongodb://p/"
    with pytest.raises(
        ValueError, match=r"options uri \('mongodb://a/'\) and connection.uri \('mongodb://b/'\)"
    ):
        Options({"uri": "mongodb://a/", "connection.uri": "mongodb://b/"})
    # Compared as parsed values: two spellings of one time agree, two times do not.
    Options(
        {
            "startAtOperationTime": "30,0",
            "change.stream.startup.mode.timestamp.start.at.operation.time": "30",
        }
    )
    with pytest.raises(
        ValueError, match="startAtOperationTime .* and change.stream.startup.mode.timestamp"
    ):
        Options(
            {
                "startAtOperationTime": "30,1",
                "change.stream.startup.mode.timestamp.start.at.operation.time": "30",
            }
        )
    with pytest.raises(ValueError, match="fullDocument .* and change.stream.lookup.full.document"):
        Options({"fullDocument": "updateLookup", "change.stream.lookup.full.document": "default"})


def test_a_startup_mode_that_contradicts_the_start_time_is_refused() -> None:
    with pytest.raises(ValueError, match="startup.mode is 'latest' but a start time"):
        Options({"change.stream.startup.mode": "latest", "startAtOperationTime": "30"})
    with pytest.raises(ValueError, match="startup.mode is 'timestamp' but no start time"):
        Options({"change.stream.startup.mode": "timestamp"})
    with pytest.raises(
        ValueError, match="option change.stream.startup.mode must be latest or timestamp"
    ):
        Options({"change.stream.startup.mode": "copy_existing"})
    assert Options({"change.stream.startup.mode": "LATEST"}).get("startAtOperationTime") is None


def test_unknown_names_and_missing_uri_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown option 'connection.url'"):
        Options({"connection.url": "mongodb://p/"})
    with pytest.raises(ValueError, match="option 'connection.uri'"):
        stream_spec(Options({"database": "shop"}))
    with pytest.raises(
        ValueError, match="option aggregation.pipeline must be a JSON list of stages"
    ):
        Options({"aggregation.pipeline": "[1, 2]"})


def test_bucket_by_is_namespace_unless_asked_and_checked() -> None:
    assert stream_spec(Options({"uri": "mongodb://p/"})).bucket_by == "namespace"
    spec = stream_spec(Options({"uri": "mongodb://p/", "bucketBy": "documentKey"}))
    assert spec.bucket_by == "documentKey" and spec.open_command()["bucketBy"] == "documentKey"
    with pytest.raises(ValueError, match="option 'bucketBy' is 'document'"):
        stream_spec(Options({"uri": "mongodb://p/", "bucketBy": "document"}))


def test_the_sources_bucket_by_values_are_the_ones_the_proxy_accepts() -> None:
    """bucketspark keeps its own copy (it imports nothing of the proxy or the engine)."""
    from buckets.bucketing import BUCKET_BY as ENGINE_BUCKET_BY
    from bucketspark.options import BUCKET_BY

    assert BUCKET_BY == ENGINE_BUCKET_BY
