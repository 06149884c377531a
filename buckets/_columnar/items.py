"""Lists of events that may hold blocks: a batch of events travels as a list whose items are
EventFields tuples (one event each) or EventBlocks (a run of events each)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from buckets._columnar.event_block import EventBlock
from mongoformats.change_events import EV_RAW

__all__ = ["as_fields", "count_events", "first_key", "is_block", "items_bytes", "last_key"]


def is_block(item: Any) -> bool:
    return type(item) is EventBlock


def count_events(items: Sequence[Any]) -> int:
    """How many events a list of items holds."""
    return sum(len(i) if type(i) is EventBlock else 1 for i in items)


def items_bytes(items: Sequence[Any]) -> int:
    """The events' BSON bytes in a list of items (what their budgets are charged)."""
    return sum(i.nbytes if type(i) is EventBlock else len(i[EV_RAW]) for i in items)


def as_fields(items: Sequence[Any]) -> list[tuple[Any, ...]]:
    """The events of a list of items, each an EventFields tuple."""
    if not any(type(i) is EventBlock for i in items):
        return list(items)
    out: list[tuple[Any, ...]] = []
    for item in items:
        if type(item) is EventBlock:
            out += item.fields()
        else:
            out.append(item)
    return out


def first_key(item: Any) -> bytes:
    return item.first_key if type(item) is EventBlock else item[0]


def last_key(item: Any) -> bytes:
    return item.last_key if type(item) is EventBlock else item[0]
