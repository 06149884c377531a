"""Change events too large for a reply: the size limit a server enforces on each event, and the
fragments `$changeStreamSplitLargeEvent` (6.0.9+, 7.0) cuts such an event into (pure).

Facts, read in the server's source (7.0 line):
- An event is serialized like any document, with BSONObj's default limit, BSONObjMaxInternalSize
  (16 MiB + 16 KiB = 16793600 bytes); a larger one fails the getMore with BSONObjectTooLarge
  (10334) in BSONObj's own words (bsonobj.cpp). The stream cannot pass that event: resuming
  meets it again. That is what the split stage is for.
- With `$changeStreamSplitLargeEvent` as the last stage, an event of more than
  kBSONObjMaxChangeEventSize (the internal limit less 8 KiB) is cut into fragments
  (change_stream_split_event_helpers.cpp): its fields but `_id`, in order of their BSON element
  size and then name, are dealt greedily, each fragment taking fields while it stays within the
  limit less the size of the event's token. Each fragment is `{_id, splitEvent: {fragment, of},
  fields...}`; its `_id` is the event's token with fragmentNum (0-based) set, so the fragments
  sort after the event's own token and in fragment order.
- A fragment's size counts its `$sortKey` metadata field (`[token]`) as the server serializes it
  with its metadata; and on a sharded cluster, where shards split events before mongos merges
  them, so does the event's size (`merged` below).
- Resuming from a fragment's token re-splits the event and skips the fragments up to and
  including that one. If the event no longer needs splitting, or splits into fewer fragments,
  the stream fails with ChangeStreamFatalError (280).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import bson

from mongoformats.errors import MongoError
from mongoformats.oplog_splice import document_of, elements
from mongoformats.resume_token import (
    ResumeTokenData,
    decode_token,
    encode_token,
    token_text,
    whole_event_token,
)
from mongoformats.wire import MAX_INTERNAL_BSON_SIZE

__all__ = [
    "MAX_EVENT_BYTES",
    "MEASURE_ABOVE_BYTES",
    "SPLIT_ABOVE_BYTES",
    "SPLIT_STAGE",
    "event_bytes",
    "event_too_large",
    "join_fragments",
    "split_event",
    "without_split_stage",
]

SPLIT_STAGE = "$changeStreamSplitLargeEvent"
MAX_EVENT_BYTES = MAX_INTERNAL_BSON_SIZE
SPLIT_ABOVE_BYTES = MAX_EVENT_BYTES - 8 * 1024  # kBSONObjMaxChangeEventSize
# Events shorter than this are within both limits whatever their token (the merge metadata adds
# the token's size once more): the hot paths measure only longer ones, with one length compare.
MEASURE_ABOVE_BYTES = SPLIT_ABOVE_BYTES - 64 * 1024


def without_split_stage(stages: list[Any]) -> tuple[list[Any], bool]:
    """`stages` (those after $changeStream) less a final `$changeStreamSplitLargeEvent`, and
    whether it was there, with the server's errors for one whose spec is not an empty object
    (7182800) or that is not the last stage (7182802)."""
    for i, stage in enumerate(stages):
        if isinstance(stage, dict) and SPLIT_STAGE in stage:
            _check_split_stage(stage, last=i == len(stages) - 1)
            return stages[:-1], True
    return stages, False


def _check_split_stage(stage: dict[str, object], *, last: bool) -> None:
    """The server's error for a `$changeStreamSplitLargeEvent` stage whose spec is not an empty
    object (7182800) or that is not the `last` stage (7182802)."""
    if not isinstance(stage[SPLIT_STAGE], dict) or stage[SPLIT_STAGE]:
        raise MongoError(7182800, f"{SPLIT_STAGE} spec should be an empty object")
    if not last:
        raise MongoError(7182802, f"{SPLIT_STAGE} must be the last stage in the pipeline")


def _sort_key_field_bytes(token_bytes: int) -> int:
    """Size of the `$sortKey: [token]` element a document's metadata adds when serialized: the
    element's type and name, then an array of one document."""
    return 1 + len(b"$sortKey\x00") + 4 + 1 + len(b"0\x00") + token_bytes + 1


def _id_span(raw: bytes) -> tuple[int, int]:
    """Where the event's `_id` (its token document) lies; events lead with it, so that is a
    slice, not a walk, for every event checked."""
    if raw[4:9] == b"\x03_id\x00":
        return 9, 9 + int.from_bytes(raw[9:13], "little")
    _, v, e = elements(raw)[b"_id"]
    return v, e


def event_bytes(raw: bytes, *, merged: bool = False) -> int:
    """The size the server checks: the event's, plus its `$sortKey` when a shard serializes it for
    mongos to merge."""
    if not merged:
        return len(raw)
    v, e = _id_span(raw)
    return len(raw) + _sort_key_field_bytes(e - v)


def event_too_large(raw: bytes, *, merged: bool = False) -> MongoError | None:
    """BSONObjectTooLarge (10334), as BSONObj words it, if the event cannot be returned; else
    None."""
    size = event_bytes(raw, merged=merged)
    if size <= MAX_EVENT_BYTES:
        return None
    v, e = _id_span(raw)
    shown = token_text(bson.decode(raw[v:e]), spaced=True)
    return MongoError(
        "BSONObjectTooLarge",
        f"BSONObj size: {size} (0x{size:X}) is invalid. Size must be between 0 "
        f"and {MAX_EVENT_BYTES}(16MB) First element: _id: {shown}",
    )


def _check_unsplit(skip: int) -> None:
    """An event that needs no split: error 280 if the stream resumes from one of its fragments
    (`skip` past none)."""
    if skip:
        raise MongoError(
            "ChangeStreamFatalError",
            "Attempted to resume from a split event fragment, but the event in "
            "the resumed stream was not large enough to be split",
        )


def split_event(
    raw: bytes, *, merged: bool = False, skip: int = 0
) -> list[tuple[dict[str, Any], bytes]] | None:
    """The fragments of a too-large event after the first `skip`, each as (its token, its BSON),
    or None if it needs no split.

    `skip` is the fragmentNum of the token a stream resumes from, plus one: that fragment was
    returned. The server fails such a resume if the event now splits otherwise."""
    if event_bytes(raw, merged=merged) <= SPLIT_ABOVE_BYTES:
        _check_unsplit(skip)
        return None
    fields = elements(raw)
    _, v, e = fields.pop(b"_id")
    token = bson.decode(raw[v:e])
    if not fields:
        raise MongoError(
            7182502, "Cannot split an empty event or an event containing solely '_id' field"
        )
    # (element size, name, element bytes): the server's map orders by size, then name.
    by_size = sorted(
        (end - (start - len(name) - 2), name, raw[start - len(name) - 2 : end])
        for name, (_, start, end) in fields.items()
    )
    fragments = _deal(by_size, decode_token(token), SPLIT_ABOVE_BYTES - (e - v))
    if skip > len(fragments):
        raise MongoError(
            "ChangeStreamFatalError",
            "Attempted to resume from a split event, but the resumed stream produced "
            "a different split. Ensure that the pipeline used to resume is the same "
            "as the original",
        )
    return [_fragment(fragments, number) for number in range(skip + 1, len(fragments) + 1)]


# A fragment as dealt: its token and the elements it took.
_Dealt = tuple[dict[str, Any], list[bytes]]


def _deal(
    by_size: list[tuple[int, bytes, bytes]], data: ResumeTokenData, limit: int
) -> list[_Dealt]:
    """The fields (sorted by size) dealt greedily into fragments of at most `limit` bytes, each
    taking at least one."""
    fragments: list[_Dealt] = []
    i = 0
    while i < len(by_size):
        fragment_token = encode_token(dataclasses.replace(data, fragment_num=len(fragments)))
        size = _fragment_overhead(fragment_token)
        taken = []
        while True:
            taken.append(by_size[i][2])
            size += by_size[i][0]
            i += 1
            if i == len(by_size) or size + by_size[i][0] > limit:
                break
        if size > limit:
            raise MongoError(
                7182500,
                f"Splitting change event failed: fragment size {size} is "
                f"greater than maximum allowed fragment size {limit}",
            )
        fragments.append((fragment_token, taken))
    return fragments


def _fragment_overhead(fragment_token: dict[str, Any]) -> int:
    """A fragment's size without its fields: `_id`, `splitEvent` and the `$sortKey` metadata."""
    encoded_token = len(bson.encode(fragment_token))
    head = bson.encode({"_id": fragment_token, "splitEvent": {"fragment": 1, "of": 0}})
    return len(head) + _sort_key_field_bytes(encoded_token)


def _fragment(fragments: list[_Dealt], number: int) -> tuple[dict[str, Any], bytes]:
    """Fragment `number` (1-based) as (its token, its BSON)."""
    fragment_token, taken = fragments[number - 1]
    split = {"fragment": number, "of": len(fragments)}
    head = bson.encode({"_id": fragment_token, "splitEvent": split})
    return fragment_token, document_of(head[4:-1] + b"".join(taken))


def join_fragments(fragments: list[bytes]) -> bytes:
    """The event that `fragments` (all of a split event's, in order) were cut from, for a consumer
    that needs whole events: its token (without fragmentNum) as `_id`, then every fragment's
    fields but `_id` and `splitEvent`, in the fragments' order (the event's own order is lost;
    the split dealt its fields by size). Over 16 MiB, so never sent on the wire."""
    v, e = _id_span(fragments[0])
    whole_token = whole_event_token(decode_token(bson.decode(fragments[0][v:e])))
    body = [bson.encode({"_id": whole_token})[4:-1]]
    for raw in fragments:
        for name, (_, start, end) in elements(raw).items():
            if name not in (b"_id", b"splitEvent"):
                body.append(raw[start - len(name) - 2 : end])
    return document_of(b"".join(body))
