"""Cutting a getMore reply from a bucket's events: synchronous, no trio (buckets/cursor.py waits
for events and runs lookups and stages around it).

A reply holds at most `limit` events and BATCH_BYTES_LIMIT bytes (each event costs its size plus
BATCH_ELEMENT_OVERHEAD), and at least one event. An event close to the server's size limit is
measured as the server would return it (EventSizer): one too large fails the getMore that reaches
it (BSONObjectTooLarge), or, with $changeStreamSplitLargeEvent, is returned alone, to be split.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from buckets.event_run import EventRun, PlainRun, raw_of
from mongoformats.change_events import ChangeEvent, EventFields
from mongoformats.errors import MongoError
from mongoformats.large_events import (
    MAX_EVENT_BYTES,
    MEASURE_ABOVE_BYTES,
    SPLIT_ABOVE_BYTES,
    event_bytes,
    event_too_large,
)
from mongoformats.oplog_splice import SplicedDocument
from mongoformats.oplog_splice import cursor_document as splice_cursor
from mongoformats.wire import BATCH_BYTES_LIMIT, BATCH_ELEMENT_OVERHEAD


class Size(enum.Enum):
    """What a server does with an event of some size."""

    FITS = "fits"  # returned whole
    SPLIT = "split"  # returned in fragments (the split stage, over the split size)
    TOO_LARGE = "too large"  # fails the getMore with BSONObjectTooLarge


@dataclass(frozen=True)
class EventSizer:
    """Sizes events as a stream returns them: `split` with $changeStreamSplitLargeEvent, `merged`
    when a mongos merges them (its events carry a larger sort key)."""

    split: bool = False
    merged: bool = False

    def size(self, raw: bytes) -> Size:
        nbytes = event_bytes(raw, merged=self.merged)
        if self.split:
            return Size.SPLIT if nbytes > SPLIT_ABOVE_BYTES else Size.FITS
        return Size.TOO_LARGE if nbytes > MAX_EVENT_BYTES else Size.FITS

    def error(self, raw: bytes) -> MongoError:
        """The BSONObjectTooLarge an event sized TOO_LARGE fails its getMore with."""
        error = event_too_large(raw, merged=self.merged)
        assert error is not None, "sized TOO_LARGE"
        return error


class _Cut:
    """A reply being cut: events are taken while they go in."""

    def __init__(self, limit: int, sizer: EventSizer | None) -> None:
        self.limit, self.sizer = limit, sizer
        self.batch: list[EventRun] = []
        self.count = self.size = 0

    @property
    def full(self) -> bool:
        return self.count >= self.limit

    def take(self, ev: EventFields) -> bool:
        """Add one event if it goes in this reply; whether the next may follow it."""
        raw = raw_of(ev)
        cost = len(raw) + BATCH_ELEMENT_OVERHEAD
        if self.full or (self.batch and self.size + cost > BATCH_BYTES_LIMIT):
            return False
        if cost > MEASURE_ABOVE_BYTES and self.sizer is not None:
            size = self.sizer.size(raw)
            if size is not Size.FITS:
                if self.batch:
                    return False  # the events before it first; the next getMore fails or splits it
                if size is Size.TOO_LARGE:
                    raise self.sizer.error(raw)
                self.batch.append(PlainRun([ev]))  # alone: its fragments are the reply
                self.count += 1
                return False
        self.batch.append(PlainRun([ev]))
        self.count, self.size = self.count + 1, self.size + cost
        return True

    def take_run(self, run: EventRun, offset: int) -> int:
        """Take a run's events from `offset` on: those that fit as one slice; an event to
        measure (a large one) or the first that does not fit goes through `take`. Where in the
        run the reply stopped (its length: all taken)."""
        while offset < len(run):
            part = run.sliced(offset, offset + self.limit - self.count)
            fit, cost = part.reply_prefix(
                BATCH_BYTES_LIMIT - self.size, BATCH_ELEMENT_OVERHEAD, MEASURE_ABOVE_BYTES
            )
            if fit:
                self.batch.append(part.sliced(0, fit))
                self.count, self.size, offset = self.count + fit, self.size + cost, offset + fit
            if fit == len(part) or not self.take(part.sliced(fit, fit + 1).fields()[0]):
                break
            offset += 1
        return offset


def cut_reply(
    items: Iterable[tuple[EventRun, int]], limit: int, sizer: EventSizer | None
) -> list[EventRun]:
    """The head of `items` ((run, offset) from Bucket.items_from) that goes into one reply of
    at most `limit` events, as slices of the runs. Events are measured with `sizer`; None when
    lookups or stages change them after this (`fit_shaped` measures what they make)."""
    cut = _Cut(limit, sizer)
    for run, offset in items:
        if cut.take_run(run, offset) < len(run) or cut.full:
            break
    return cut.batch


def fit_shaped(
    shaped: list[tuple[int, ChangeEvent]], sizer: EventSizer
) -> tuple[list[EventFields], int | None]:
    """The longest head of the shaped events within a reply's batch limit (at least one), and how
    many of the taken events it consumed (None: all of them). Lookups and stages grow events after
    the batch was cut; what does not fit is returned by the next getMore. An event grown past
    what a server can return (a document looked up beside a large update) ends the head; the
    getMore that reaches it fails with BSONObjectTooLarge, as the server's does, or, with the
    split stage, returns it alone, to be split."""
    size = 0
    for k, (_, ev) in enumerate(shaped):
        size += len(ev.raw) + BATCH_ELEMENT_OVERHEAD
        if k and size > BATCH_BYTES_LIMIT:
            return [e for _, e in shaped[:k]], shaped[k][0]
        if len(ev.raw) > MEASURE_ABOVE_BYTES and (big := sizer.size(ev.raw)) is not Size.FITS:
            if k:
                return [e for _, e in shaped[:k]], shaped[k][0]
            if big is Size.TOO_LARGE:
                raise sizer.error(ev.raw)
            return [ev], shaped[1][0] if len(shaped) > 1 else None
    return [e for _, e in shaped], None


def splits(ev: EventFields, sizer: EventSizer) -> bool:
    """Whether `ev` is returned in fragments."""
    raw = raw_of(ev)
    return len(raw) > MEASURE_ABOVE_BYTES and sizer.size(raw) is Size.SPLIT


def cursor_document(
    cursor_id: int, ns: str, batch_field: str, events: list[EventRun], pbrt: Mapping[str, Any]
) -> SplicedDocument:
    """A reply's `cursor` sub-document, its batch spliced from the runs' bytes (no
    re-encoding)."""
    parts = [part for run in events for part in run.reply_parts()]
    return splice_cursor(cursor_id, ns, batch_field, parts, {"postBatchResumeToken": pbrt})
