"""An error a failed stream or bucket keeps is a copy without a traceback (MongoError.copied).

A stream fails with the error raised where it failed; its cursors raise it at every getMore
until they close. The raised error's traceback keeps the frames it passed and their locals: a
shard's batch, whose blocks hold their share of the shard's budget and of the proxy's memory
pool (buckets/budget.py, BudgetHold), for as long as the error is kept; and each raise of one
kept object adds the frames that raise passes."""

from __future__ import annotations

import weakref

from bson import Timestamp

from buckets.bucket import Bucket
from mongoformats.errors import MongoError
from mongoformats.resume_token import high_water_mark, token_sort_key


class _Batch:
    """Stands in for a batch a failing frame held."""


def _raised_holding(batch: _Batch) -> MongoError:
    def fails(held: _Batch) -> None:
        raise MongoError("CappedPositionLost", "the oplog moved past the read position")

    try:
        fails(batch)
    except MongoError as exc:
        return exc
    raise AssertionError("not raised")


def test_a_copy_keeps_the_reply_and_nothing_the_original_was_raised_through() -> None:
    batch = _Batch()
    gone = weakref.ref(batch)
    original = _raised_holding(batch)
    original.__context__ = ValueError("a chained error")
    labeled = original.with_labels("NonResumableChangeStreamError")
    copy = labeled.copied()
    assert copy is not labeled and copy.to_reply() == labeled.to_reply()
    assert copy.__traceback__ is None and copy.__context__ is None and copy.__cause__ is None
    del batch, original, labeled
    assert gone() is None


def test_a_failed_bucket_keeps_a_copy_of_its_error() -> None:
    floor = high_water_mark(Timestamp(1, 0))
    bucket = Bucket(0, 1 << 20, token_sort_key(floor), floor)
    batch = _Batch()
    gone = weakref.ref(batch)
    error = _raised_holding(batch)
    bucket.fail(error)
    del batch, error
    assert gone() is None
    assert bucket.error is not None and bucket.error.code_name == "CappedPositionLost"
