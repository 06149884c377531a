"""Dealing the merge's released events into a stream's buckets: by the routes of their
namespaces (a run shares itself out, see buckets/event_run.py) or by their documentKeys (a
block's computed as columns, buckets/_columnar/document_routes.py), or one event at a time when
the stream filters them (an accelerated watch()'s scope, a $match)."""

from __future__ import annotations

from typing import Any

import bson

from buckets._columnar.document_routes import event_buckets
from buckets._columnar.run import ColumnarRun
from buckets.bucket import Bucket
from buckets.bucketing import buckets_for_event, buckets_for_namespaces
from buckets.event_run import EventRun, PlainRun, fields_of, namespaces_of, raw_of
from buckets.scope import event_matches, in_scope, invalidates
from mongoformats.change_events import ChangeEvent, EventFields, event_token, invalidate_event
from mongoformats.codecs import PLAIN
from mongoformats.errors import MongoError

__all__ = ["Dealer"]

_ROUTES_CACHED = 1 << 16  # namespace -> buckets routes a stream memoizes before starting over

Shares = dict[int, list[EventFields]]


class Dealer:
    """Deals one stream's merged events into its kept `buckets` (of `n_buckets`)."""

    def __init__(
        self,
        buckets: dict[int, Bucket],
        n_buckets: int,
        *,
        scope: tuple[str, str | None] | None,
        match: dict[str, Any] | None,
        bucket_by: str,
    ) -> None:
        self.buckets = buckets
        self.n_buckets = n_buckets
        self.scope, self.match = scope, match
        self.by_document = bucket_by == "documentKey"
        self._routes: dict[tuple[str, ...], tuple[int, ...]] = {}
        self.ended = False  # an accelerated single-collection or database stream was invalidated
        # Its invalidate's token: where a cursor that read to the end resumes (startAfter).
        self.end_token: dict[str, Any] | None = None

    async def deal(self, ready: list[EventRun]) -> None:
        """Deal merged events into their buckets: each bucket's share is appended in one step."""
        if self.scope is not None or self.match is not None:
            await self._deal_each(fields_of(ready))
            return
        shares: dict[int, list[EventRun]] = {}
        for run in ready:
            for b, share in self._shares_of(run).items():
                shares.setdefault(b, []).append(share)
        for b, runs in shares.items():
            await self.buckets[b].put_many(runs)

    def _shares_of(self, run: EventRun) -> dict[int, EventRun]:
        """`run`'s kept buckets' shares: by its namespaces, or by documentKey (a block's buckets
        computed as columns; single events' in one compiled loop too, those it leaves undecided
        one by one)."""
        if not self.by_document:
            return run.shares(self.route)
        if isinstance(run, ColumnarRun):
            return run.document_shares(self.n_buckets, self.buckets.keys(), self._document_route)
        return self._single_document_shares(run.fields())

    def _single_document_shares(self, events: list[EventFields]) -> dict[int, EventRun]:
        """Single events' kept buckets' shares by documentKey: their buckets found in one
        compiled loop, those it leaves undecided one by one (buckets_for_event)."""
        kept = self.buckets
        shares: Shares = {}
        found = event_buckets(
            list(map(raw_of, events)), list(map(namespaces_of, events)), self.n_buckets
        )
        for ev, bucket in zip(events, found, strict=True):
            for b in self._route_event(ev) if bucket < 0 else (bucket,) if bucket in kept else ():
                shares.setdefault(b, []).append(ev)
        return {b: PlainRun(share) for b, share in shares.items()}

    def _document_route(self, ev: EventFields) -> tuple[int, ...]:
        return buckets_for_event(ev, self.n_buckets, "documentKey")

    async def _deal_each(self, events: list[EventFields]) -> None:
        """Filtered or routed event by event."""
        scope, match = self.scope, self.match
        shares: Shares = {}
        for ev in events:
            if self.ended:
                break
            if scope is not None and not in_scope(ev, scope):
                continue
            if scope is not None and invalidates(ev, scope):
                await self._flush(shares)
                await self._end_with(ev, match)
                break
            if match is not None and not await self._matches(ev, match, shares):
                continue
            for b in self._route_event(ev):
                share = shares.get(b)
                if share is None:
                    shares[b] = [ev]
                else:
                    share.append(ev)
        await self._flush(shares)

    async def _matches(self, ev: EventFields, match: dict[str, Any], shares: Shares) -> bool:
        """Whether `ev` passes the stream's $match. One the $match fails on fails only the buckets
        of the event's namespaces, each once its consumers have read what came before (the
        `shares` dealt so far are put first)."""
        try:
            return event_matches(ev, match)
        except MongoError as exc:
            await self._flush(shares)
            for b in self._route_event(ev):
                self.buckets[b].fail(exc)
            return False

    async def _flush(self, shares: Shares) -> None:
        for b, share in shares.items():
            await self.buckets[b].put_many([PlainRun(share)])
        shares.clear()

    async def _end_with(self, ev: EventFields, match: dict[str, Any] | None) -> None:
        """End the stream at its invalidating event `ev`: the event, then its invalidate, each
        through the user's $match, which comes after $changeStream's own CheckInvalidate stage
        (document_source_change_stream.cpp). A $match that drops the invalidate does not keep
        the stream open: the server's cursor closes on ChangeStreamInvalidated all the same."""
        wall = bson.decode(raw_of(ev), PLAIN).get("wallTime")
        end = tuple(invalidate_event(ChangeEvent._make(ev), wall=wall))
        self.end_token = event_token(end)
        for bucket in self.buckets.values():
            for item in (ev, end):
                try:
                    if match is not None and not event_matches(item, match):
                        continue
                except MongoError as exc:
                    bucket.fail(exc)
                    break
                await bucket.put(PlainRun([item]))
        self.ended = True

    def route(self, namespaces: tuple[str, ...]) -> tuple[int, ...]:
        """The kept buckets of events of `namespaces`, memoized: most streams see few."""
        route = self._routes.get(namespaces)
        if route is None:
            if len(self._routes) >= _ROUTES_CACHED:
                self._routes.clear()
            route = self._routes[namespaces] = tuple(
                b for b in buckets_for_namespaces(namespaces, self.n_buckets) if b in self.buckets
            )
        return route

    def _route_event(self, ev: EventFields) -> tuple[int, ...]:
        """`ev`'s kept buckets; by documentKey, its own (never memoized: it depends on the
        document)."""
        if not self.by_document:
            return self.route(namespaces_of(ev))
        return tuple(
            b for b in buckets_for_event(ev, self.n_buckets, "documentKey") if b in self.buckets
        )
