"""A run of change events in token order: the one type the engine's data path hands around.

The merge's release, a bucket's share of it, a bucket's retained segments, a replay's events and
a getMore reply's batch are each a list of runs. A run is one of two implementations of the same
interface (`EventRun`): `PlainRun` here, a list of single events (EventFields tuples: what the
oplog transformer makes of transactions, DDL and the other rare shapes, and what lookups and
stages hand back), and the columnar run (buckets/_columnar/run.py: a backlog's events as
columns, from the splice to the reply). Code outside the two never asks which one it holds; it
reads keys, sizes and fields through this interface, which is also the only place that knows
the layout of an EventFields tuple (the EV_* indices).
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

from mongoformats.change_events import (
    EV_DB,
    EV_NAMESPACES,
    EV_OP_TYPE,
    EV_RAW,
    EV_SHARD,
    EVENT_SORT_KEY,
    EventFields,
    event_token,
)

__all__ = [
    "EventRun",
    "PlainRun",
    "Route",
    "count_events",
    "db_of",
    "fields_of",
    "namespaces_of",
    "op_type_of",
    "plain_runs",
    "raw_of",
    "runs_bytes",
    "with_shard",
]

# The buckets of the events of some namespaces (ParallelStream's memoized routing).
Route = Callable[[tuple[str, ...]], tuple[int, ...]]


class EventRun(Protocol):
    """Events in token order, read and cut without asking how they are held."""

    def __len__(self) -> int: ...

    @property
    def first_key(self) -> bytes: ...

    @property
    def last_key(self) -> bytes: ...

    @property
    def nbytes(self) -> int:
        """The events' BSON bytes (what budgets are charged)."""
        ...

    @property
    def pins(self) -> bool:
        """Whether the run keeps a reader's buffer charged (it points into its blocks)."""
        ...

    @property
    def released_bytes(self) -> int:
        """The bytes whose charge to its reader's buffer returns as the merge releases the run
        (a run that holds its charge returns it once the buckets let it go)."""
        ...

    def key(self, i: int) -> bytes: ...

    def keys(self) -> list[bytes]: ...

    def bisect_right(self, key: bytes) -> int:
        """How many events have a sort key <= `key`."""
        ...

    def sliced(self, start: int, stop: int | None = None) -> EventRun: ...

    def pieces(self) -> Iterator[EventRun]:
        """The parts a bucket that has no room for the whole run puts one after another, each
        cut further to the room it has."""
        ...

    def own(self) -> EventRun:
        """These events holding nothing else alive (see `pins`)."""
        ...

    def shares(self, route: Route) -> dict[int, EventRun]:
        """Each bucket's share (non-empty), an event going to the buckets `route` gives for
        its namespaces."""
        ...

    def fields(self) -> list[EventFields]:
        """The events one by one, as EventFields tuples."""
        ...

    def last_token(self) -> dict[str, Any]:
        """The resume token of the last event."""
        ...

    def reply_parts(self) -> list[Any]:
        """The events as parts of a reply's batch (oplog_splice.cursor_document's `events`)."""
        ...

    def count_within(self, room: int) -> int:
        """How many leading events fit in `room` bytes."""
        ...

    def count_reaching(self, total: int) -> tuple[int, int]:
        """(the fewest leading events whose bytes reach `total`, all of them if theirs do not;
        the bytes of those events)."""
        ...

    def reply_prefix(self, room: int, overhead: int, measure_above: int) -> tuple[int, int]:
        """(how many leading events go into a reply with `room` bytes left, each costing its
        size plus `overhead`, stopping before the first that costs more than `measure_above`;
        what they cost together)."""
        ...


_RAW_OF = operator.itemgetter(EV_RAW)


class PlainRun:
    """Single events, each an EventFields tuple, in token order. Its bytes are summed once: the
    merge's release, a bucket's charge and each reply's cut ask for them."""

    __slots__ = ("events", "_nbytes")

    def __init__(self, events: list[EventFields]) -> None:
        self.events = events
        self._nbytes = -1  # summed on first use

    def __len__(self) -> int:
        return len(self.events)

    def __repr__(self) -> str:
        return f"<PlainRun of {len(self.events)} events>"

    @property
    def first_key(self) -> bytes:
        return self.events[0][0]

    @property
    def last_key(self) -> bytes:
        return self.events[-1][0]

    @property
    def nbytes(self) -> int:
        if self._nbytes < 0:
            self._nbytes = sum(map(len, map(_RAW_OF, self.events)))
        return self._nbytes

    @property
    def pins(self) -> bool:
        return False

    @property
    def released_bytes(self) -> int:
        return self.nbytes

    def key(self, i: int) -> bytes:
        return self.events[i][0]

    def keys(self) -> list[bytes]:
        return [ev[0] for ev in self.events]

    def bisect_right(self, key: bytes) -> int:
        return bisect.bisect_right(self.events, key, key=EVENT_SORT_KEY)

    def sliced(self, start: int, stop: int | None = None) -> PlainRun:
        return PlainRun(self.events[start:stop])

    def pieces(self) -> Iterator[EventRun]:
        """Event by event: a plain run's slices are copies, too dear to cut again and again."""
        for i in range(len(self.events)):
            yield PlainRun(self.events[i : i + 1])

    def own(self) -> PlainRun:
        return self

    def shares(self, route: Route) -> dict[int, EventRun]:
        out: dict[int, list[EventFields]] = {}
        for ev in self.events:
            for b in route(ev[EV_NAMESPACES]):
                share = out.get(b)
                if share is None:
                    out[b] = [ev]
                else:
                    share.append(ev)
        return {b: PlainRun(share) for b, share in out.items()}

    def fields(self) -> list[EventFields]:
        return self.events

    def last_token(self) -> dict[str, Any]:
        return event_token(self.events[-1])

    def reply_parts(self) -> list[Any]:
        return list(map(_RAW_OF, self.events))

    def count_within(self, room: int) -> int:
        total = 0
        for k, ev in enumerate(self.events):
            total += len(ev[EV_RAW])
            if total > room:
                return k
        return len(self.events)

    def count_reaching(self, total: int) -> tuple[int, int]:
        nbytes = 0
        for k, ev in enumerate(self.events):
            nbytes += len(ev[EV_RAW])
            if nbytes >= total:
                return k + 1, nbytes
        return len(self.events), nbytes

    def reply_prefix(self, room: int, overhead: int, measure_above: int) -> tuple[int, int]:
        cost = 0
        for k, ev in enumerate(self.events):
            one = len(ev[EV_RAW]) + overhead
            if one > measure_above or cost + one > room:
                return k, cost
            cost += one
        return len(self.events), cost


def plain_runs(events: list[EventFields]) -> list[EventRun]:
    """`events` as a list of runs: one plain run, or none."""
    return [PlainRun(events)] if events else []


def count_events(runs: Iterable[EventRun]) -> int:
    return sum(map(len, runs))


def runs_bytes(runs: Iterable[EventRun]) -> int:
    return sum(run.nbytes for run in runs)


def fields_of(runs: Iterable[EventRun]) -> list[EventFields]:
    """The events of `runs`, one by one."""
    out: list[EventFields] = []
    for run in runs:
        out += run.fields()
    return out


# -- an event's fields, for the code that reads them one event at a time --------------------------


def namespaces_of(ev: EventFields) -> tuple[str, ...]:
    return ev[EV_NAMESPACES]


def raw_of(ev: EventFields) -> bytes:
    return ev[EV_RAW]


def op_type_of(ev: EventFields) -> str:
    return ev[EV_OP_TYPE]


def db_of(ev: EventFields) -> str:
    return ev[EV_DB]


def with_shard(events: Sequence[EventFields], shard: str) -> list[EventFields]:
    """`events` tagged with the shard that wrote them (pre-images are read from it)."""
    return [(*ev[:EV_SHARD], shard, *ev[EV_SHARD + 1 :]) for ev in events]
