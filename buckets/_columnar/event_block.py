"""A run of spliced change events held as columns: the block a batch of oplog entries becomes.

Why columns: an event that is a Python tuple of a key, its bytes and its names costs several
objects to make, marshal to the proxy process, unmarshal, file into a bucket and free again, far
more than the splice's array work. A block holds a batch's events as one Arrow binary column
(their bytes, back to back) beside their sort keys (one numpy row each) and the index of each
one's kind (its operationType and namespace, shared by many). Merging, dealing into buckets
and building a getMore reply are then whole-column operations in compiled code (numpy's sort,
the gather and keying loops below): no per-event object is made until a consumer that needs one
(a $match, a lookup, a stage) asks for `fields()`. A bucket's share of a merge is not copied
out either: it points into the shards' blocks, and its reply gathers and keys its events in one
pass.

What a block can hold: events with no shard tag, each of one namespace, whose tokens' type bits
are their kind's (batch_splice's inserts, updates and deletes of the documentKeys id_keys.py
keys: a kind's have the same types). Their sort keys are rows of one width, each key padded
with zero bytes to the widest (id_keys.py says why that keeps their order); whatever reads a key
as bytes strips the padding.
Every other event stays a tuple (mongoformats.change_events.EventFields); `fields()` gives a
block's events as those tuples, equal to what the per-event path makes.
"""

from __future__ import annotations

import pickle
from collections.abc import Collection, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from buckets._columnar.block_kernels import (
    PREFETCH_BYTES,
    _element_bytes,
    _gather_rows,
    _keyed_gather_into,
    _keyed_size,
    _merge_runs,
)
from buckets._columnar.block_merge import MERGED_RUNS, joined_kinds, run_starts, widened
from buckets._columnar.byte_kernels import byte_table
from buckets._columnar.document_routes import document_buckets, namespace_seeds
from buckets._columnar.key_search import bisect_keys_kernel
from mongoformats.wire import ArrayRun, DeferredPiece

__all__ = ["EventBlock", "KeyedEvents"]

# (operationType, db, coll, namespaces, type bits): what a kind's events share (EventFields'
# names; the type bits of their tokens, whose documentKeys are alike).
Kind = tuple[str, str, str, Any, bytes]


class _KeyRows(Sequence[bytes]):
    """A block's sort keys as a sequence of bytes (only the rows read are made);
    with `order`, row order[i] is the i-th (a merge's keys, probed before they are put in order)."""

    __slots__ = ("rows", "order")

    def __init__(
        self, rows: npt.NDArray[np.uint8], order: npt.NDArray[np.int64] | None = None
    ) -> None:
        self.rows = rows
        self.order = order

    def __len__(self) -> int:
        return len(self.rows) if self.order is None else len(self.order)

    def __getitem__(self, i: Any) -> Any:
        return self.rows[i if self.order is None else self.order[i]].tobytes().rstrip(b"\0")


class _Scattered(NamedTuple):
    """Events that lie in several Arrow columns, read as one column: the columns (held, so that
    the addresses stay valid), each event's address and size, and the columns' blocks' holds
    (see EventBlock.hold)."""

    parts: tuple[pa.LargeBinaryArray, ...]
    addresses: npt.NDArray[np.uintp]
    sizes: npt.NDArray[np.int64]
    holds: tuple[Any, ...]

    @classmethod
    def of(cls, blocks: Sequence[EventBlock]) -> _Scattered:
        parts = tuple(b.events for b in blocks)
        addresses, sizes = [], []
        for part in parts:
            at, values = _offsets_of(part), part.buffers()[2]
            addresses.append(
                at[:-1].astype(np.uintp) + np.uintp(values.address if values is not None else 0)
            )
            sizes.append(np.diff(at))
        return cls(
            parts,
            np.concatenate(addresses),
            np.concatenate(sizes),
            tuple(b.hold for b in blocks if b.hold is not None),
        )

    def gather(self, rows: npt.NDArray[np.int64]) -> pa.LargeBinaryArray:
        """Events `rows`, in that order, in one column of their own: one copy of each, where
        joining the columns and then taking from the join copied each twice."""
        out, offsets = _gather_rows(self.addresses, self.sizes, rows)
        return pa.Array.from_buffers(
            pa.large_binary(), len(rows), [None, pa.py_buffer(offsets), pa.py_buffer(out)]
        )


class _Unsorted(NamedTuple):
    """A merge's events before they are put in order: its blocks' key rows one after the other,
    their events (not joined), and the merge's order of those rows."""

    keys: npt.NDArray[np.uint8]
    events: _Scattered
    order: npt.NDArray[np.int64]


class KeyedEvents(DeferredPiece):
    """The events at `rows` of a scattered column as the elements of a BSON array keyed from
    `first_index` on (type 3, the index in decimal, the event): a reply's batch, written in one
    compiled loop as the reply is sent, a part at a time into the sender's buffer (see
    wire.DeferredPiece). It holds the column, so the blocks' bytes (and their holds) stay until
    the reply is gone."""

    __slots__ = ("_events", "_rows", "_first", "_size", "_ahead")

    def __init__(self, events: _Scattered, rows: npt.NDArray[np.int64], first_index: int) -> None:
        self._events = events
        self._rows = rows
        self._first = first_index
        self._size = _keyed_size(events.sizes, rows, first_index)
        self._ahead = max(1, PREFETCH_BYTES * len(rows) // max(self._size, 1))

    def __len__(self) -> int:
        return self._size

    def pieces(self, scratch: Any) -> Iterator[memoryview]:
        at, n = 0, len(self._rows)
        buffer = np.frombuffer(scratch, np.uint8)  # a view: the sender's bytearray is written
        while at < n:
            part = buffer
            following, written = self._gather_into(part, at)
            if following == at:  # an event too large for the buffer alone: a part of its own
                part = np.empty(
                    _element_bytes(self._events.sizes[self._rows[at]], self._first + at), np.uint8
                )
                following, written = self._gather_into(part, at)
            yield part.data[:written]
            at = following

    def materialize(self) -> memoryview:
        out = np.empty(self._size, np.uint8)
        _, written = self._gather_into(out, 0)
        assert written == self._size
        return out.data

    def _gather_into(self, out: npt.NDArray[np.uint8], at: int) -> tuple[int, int]:
        """The elements from row `at` on that fit in `out`: (the next row, the bytes written)."""
        return _keyed_gather_into(
            out,
            self._events.addresses,
            self._events.sizes,
            self._rows,
            at,
            self._first,
            self._ahead,
        )


class EventBlock(ArrayRun):
    """Events in token order: `keys` (one row of sort-key bytes each), `events` (their BSON
    documents, an Arrow large_binary array), `kinds` (each one's index into `kind_table`).

    `hold` is any object the block's owner wants kept alive exactly as long as some of these
    events' bytes are: every block sliced, merged or taken from this one holds it too, and one
    that copies the events out (`events` of a merge, `own()`) lets it go. The proxy's readers
    hold each shard block's charge to the shard's buffer budget this way, so the charge returns
    when the last bucket share that points into the block is freed (buckets.budget.BudgetHold).
    """

    __slots__ = ("_keys", "_events", "_unsorted", "kinds", "kind_table", "_sizes", "hold")

    def __init__(
        self,
        keys: npt.NDArray[np.uint8] | None,
        events: pa.LargeBinaryArray | None,
        kinds: npt.NDArray[np.int32],
        kind_table: tuple[Kind, ...],
        unsorted: _Unsorted | None = None,
        hold: Any = None,
    ) -> None:
        """A merge's block gives `unsorted` in place of `keys` and `events`, taken on first use."""
        self._keys = keys
        self._events = events
        self._unsorted = unsorted
        self.kinds = kinds
        self.kind_table = kind_table
        self._sizes: npt.NDArray[np.int64] | None = None
        self.hold = hold

    @property
    def keys(self) -> npt.NDArray[np.uint8]:
        if self._keys is None:
            assert self._unsorted is not None
            self._keys = self._unsorted.keys[self._unsorted.order]
        return self._keys

    @property
    def events(self) -> pa.LargeBinaryArray:
        """The events' BSON, in order. A merge's block (or a share taken from one) gathers them
        from its blocks only here, for a consumer that wants them as a column (a reply keys them
        from where they lie). Once gathered, the blocks are let go (a merge kept whole would
        otherwise hold its events twice)."""
        if self._events is None:
            assert self._unsorted is not None
            self._events = self._unsorted.events.gather(self._unsorted.order)
            self._keys = self.keys
            self._unsorted = None
        return self._events

    @property
    def pins(self) -> bool:
        """Whether this block keeps some hold alive (its events point into held blocks)."""
        return self.hold is not None or (
            self._unsorted is not None and bool(self._unsorted.events.holds)
        )

    def own(self) -> EventBlock:
        """These events in memory of their own, holding nothing: what a buffer keeps when the
        blocks it points into must be let go (their budget is full)."""
        if self._events is None:
            self.events  # noqa: B018 (gathers them, letting the merge's blocks go)
            return self
        if self.hold is None:
            return self
        values = self.events.buffers()[2]
        offsets = self._offsets()
        body = (
            pa.py_buffer(bytes(values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))))
            if values is not None
            else pa.py_buffer(b"")
        )
        events = pa.Array.from_buffers(
            pa.large_binary(), len(self), [None, pa.py_buffer(offsets - offsets[0]), body]
        )
        return EventBlock(self.keys.copy(), events, self.kinds, self.kind_table)

    # -- reading -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.kinds)

    def __repr__(self) -> str:
        return f"<EventBlock of {len(self)} events, {self.nbytes} bytes>"

    def _key_rows(self) -> _KeyRows:
        """The sort keys, read one by one: a merge's are read in its order, not sorted first (its
        first and last keys, a bisection's probes)."""
        if self._keys is None:
            assert self._unsorted is not None
            return _KeyRows(self._unsorted.keys, self._unsorted.order)
        return _KeyRows(self._keys)

    def key_list(self) -> list[bytes]:
        """The sort keys as bytes, in order, their padding stripped."""
        return [row.tobytes().rstrip(b"\0") for row in self.keys]

    def key(self, i: int) -> bytes:
        return self._key_rows()[i]

    @property
    def first_key(self) -> bytes:
        return self.key(0)

    @property
    def last_key(self) -> bytes:
        return self.key(-1)

    def bisect_right(self, key: bytes, lo: int = 0) -> int:
        """How many events have a sort key <= `key` (Python's bytes order, whatever its length)."""
        cuts, _ = self.bisect_keys([key], lo)
        return cuts[0]

    def bisect_keys(self, keys: Sequence[bytes], lo: int = 0) -> tuple[list[int], bool]:
        """`bisect_right` of each of the sorted `keys` (from `lo` on), and whether some key equals
        an event's. One compiled loop for them all: a merge of blocks with single events cuts
        the merged block at every single, and a bisection in Python made a bytes object of
        each row it probed (a merge's rows, through its order)."""
        if self._keys is None:
            assert self._unsorted is not None
            rows, order, ordered = self._unsorted.keys, self._unsorted.order, True
        else:
            rows, order, ordered = self._keys, _NO_ORDER, False
        needles, bounds = byte_table(keys)
        cuts = np.empty(len(keys), np.int64)
        exact = bisect_keys_kernel(rows, order, ordered, needles, bounds, lo, cuts)
        return cuts.tolist(), bool(exact)

    @property
    def sizes(self) -> npt.NDArray[np.int64]:
        """Each event's BSON size."""
        if self._sizes is None:
            if self._events is None:
                assert self._unsorted is not None
                self._sizes = self._unsorted.events.sizes[self._unsorted.order]
            else:
                self._sizes = np.diff(self._offsets())
        return self._sizes

    @property
    def nbytes(self) -> int:
        if self._events is None:
            return int(self.sizes.sum())
        offsets = self._offsets()
        return int(offsets[-1] - offsets[0]) if len(offsets) else 0

    def fields(self) -> list[tuple[Any, ...]]:
        """The events as EventFields tuples (sort key, type bits, operationType, db, coll, bytes,
        namespaces, shard, applied at), as the per-event path makes them."""
        keys = np.ascontiguousarray(self.keys).tobytes()
        width = self.keys.shape[1]
        names = map(self.kind_table.__getitem__, self.kinds.tolist())
        return [
            (keys[i : i + width].rstrip(b"\0"), bits, op, db, coll, raw, namespaces, "", None)
            for i, (op, db, coll, namespaces, bits), raw in zip(
                range(0, len(keys), width), names, self.events.to_pylist(), strict=True
            )
        ]

    # -- making other blocks ---------------------------------------------------------------------

    def sliced(self, start: int, stop: int | None = None) -> EventBlock:
        """Events [start, stop): views, nothing copied (a merge's stays unsorted: a part of its
        order)."""
        stop = len(self) if stop is None else min(stop, len(self))
        if self._events is None:
            assert self._unsorted is not None
            unsorted = self._unsorted._replace(order=self._unsorted.order[start:stop])
            return EventBlock(
                None if self._keys is None else self._keys[start:stop],
                None,
                self.kinds[start:stop],
                self.kind_table,
                unsorted,
            )
        block = EventBlock(
            self.keys[start:stop],
            self.events.slice(start, stop - start),
            self.kinds[start:stop],
            self.kind_table,
            hold=self.hold,
        )
        if self._sizes is not None:
            block._sizes = self._sizes[start:stop]
        return block

    def take(self, indices: npt.NDArray[np.int64]) -> EventBlock:
        """The events at `indices`, in that order, as a merge's block: their addresses in the
        blocks they lie in, nothing copied (a block of its own columns is read as the merge of
        one). The bytes are gathered once, by the reply that keys them (`array_body`): gathering
        them here, into each bucket's share, would cost one more pass over every event's bytes."""
        unsorted = self._unsorted if self._events is None else self._as_merge()._unsorted
        assert unsorted is not None
        return EventBlock(
            None,
            None,
            self.kinds[indices],
            self.kind_table,
            unsorted._replace(order=unsorted.order[indices]),
        )

    def _as_merge(self) -> EventBlock:
        """This block as a merge of itself alone (its order the identity), whose events' addresses
        are found once for all the parts taken from it."""
        return EventBlock(
            None,
            None,
            self.kinds,
            self.kind_table,
            _Unsorted(self.keys, _Scattered.of((self,)), np.arange(len(self))),
        )

    def shares(self, routes: Sequence[Collection[int]]) -> dict[int, EventBlock]:
        """Each bucket's share of the block, `routes[k]` being the buckets of kind k's events: one
        mask per bucket over the kinds. A kind of the table may have no event here (the block was
        cut from a longer one); a bucket whose share is empty is left out."""
        out = {}
        source = None  # what the shares are taken from (read once, on the first partial share)
        for b in sorted(set().union(*routes)):
            mine = np.array([b in route for route in routes])[self.kinds]
            if mine.all():
                out[b] = self
            elif mine.any():
                if source is None:
                    source = self if self._events is None else self._as_merge()
                out[b] = source.take(np.flatnonzero(mine))
        return out

    def document_buckets(self, n: int) -> npt.NDArray[np.int64]:
        """Each event's bucket (of `n`) by documentKey, read from where the events lie; -1 for
        those the per-event path decides (document_routes.py says which)."""
        unsorted = self._unsorted if self._events is None else self._as_merge()._unsorted
        assert unsorted is not None
        seeds = namespace_seeds([kind[3] for kind in self.kind_table])
        events = unsorted.events
        return document_buckets(
            events.addresses, events.sizes, unsorted.order, self.kinds, seeds, n
        )

    def dealt(self, buckets: npt.NDArray[np.int64], kept: Collection[int]) -> dict[int, EventBlock]:
        """Each of the `kept` buckets' share of the block, event i going to bucket buckets[i],
        or to every bucket where that is -1: a take per bucket of its events, in order (a
        share of all the block's events is the block). A bucket whose share is empty is left
        out."""
        everywhere = np.flatnonzero(buckets < 0)
        # Each bucket's events, in order: a stable sort of 16-bit numbers is numpy's radix sort.
        order = np.argsort(buckets.astype(np.int16), kind="stable")
        ends = np.searchsorted(buckets[order], np.arange(-1, 1 + max(kept, default=-1)), "right")
        out = {}
        source = None  # what the shares are taken from (read once, on the first partial share)
        for b in sorted(kept):
            mine = order[ends[b] : ends[b + 1]]
            if len(everywhere):
                mine = np.sort(np.concatenate((mine, everywhere)))
            if len(mine) == len(self):
                out[b] = self
            elif len(mine):
                if source is None:
                    source = self if self._events is None else self._as_merge()
                out[b] = source.take(mine)
        return out

    @classmethod
    def of_fields(cls, events: Sequence[tuple[Any, ...]]) -> EventBlock:
        """Single events (EventFields, in token order, each one a block holds: run._block_holds)
        as a block of their own columns; their applied-at times are not kept."""
        table: dict[Kind, int] = {}
        kinds = np.fromiter(
            (table.setdefault((e[2], e[3], e[4], e[6], e[1]), len(table)) for e in events),
            np.int32,
            len(events),
        )
        width = max(len(e[0]) for e in events)
        keys = np.frombuffer(b"".join(e[0].ljust(width, b"\0") for e in events), np.uint8)
        values, offsets = byte_table([e[5] for e in events])
        # (from its buffers: pa.array() of a list imports pandas, seconds into the proxy)
        column = pa.Array.from_buffers(
            pa.large_binary(),
            len(events),
            [None, pa.py_buffer(offsets), pa.py_buffer(values)],
        )
        return cls(keys.reshape(len(events), width), column, kinds, tuple(table))

    def inserted(self, block: EventBlock, cuts: Sequence[int]) -> EventBlock:
        """This block with `block`'s events put in, its i-th before this block's cuts[i]-th
        event (`cuts` sorted, as `bisect_keys` gives them): a merge's block, nothing copied."""
        mine = (self if self._events is None else self._as_merge())._unsorted
        assert mine is not None
        width = max(mine.keys.shape[1], block.keys.shape[1])
        keys = np.concatenate([widened(mine.keys, width), widened(block.keys, width)])
        theirs = _Scattered.of((block,))
        events = _Scattered(
            mine.events.parts + theirs.parts,
            np.concatenate([mine.events.addresses, theirs.addresses]),
            np.concatenate([mine.events.sizes, theirs.sizes]),
            mine.events.holds + theirs.holds,
        )
        at = np.asarray(cuts, np.int64)
        order = np.insert(mine.order, at, np.arange(len(mine.keys), len(keys)))
        return EventBlock(
            None,
            None,
            np.insert(self.kinds, at, block.kinds + np.int32(len(self.kind_table))),
            self.kind_table + block.kind_table,
            _Unsorted(keys, events, order),
        )

    @classmethod
    def merge(cls, blocks: Sequence[EventBlock]) -> EventBlock:
        """The events of several blocks (each in token order) in token order; equal keys keep
        the blocks' order (Python's order of bytes: numpy's and the merge loop's alike). The
        blocks fall into sorted runs (a shard's batches follow one another), and the runs are
        merged in one compiled pass (`_merge_runs`), a fraction of what a stable sort of the
        keys as byte strings costs (benchmarks/README.md). The events are not joined: each
        reply gathers its own in that order as it keys them."""
        if len(blocks) == 1:
            return blocks[0]
        kinds, table = joined_kinds(blocks)
        width = max(b.keys.shape[1] for b in blocks)
        keys = np.concatenate([widened(b.keys, width) for b in blocks])
        starts = run_starts(blocks)
        if len(starts) == 1:
            order = np.arange(len(keys))
        elif len(starts) <= MERGED_RUNS and keys.shape[1] >= 8:
            order = _merge_runs(keys, np.array([*starts, len(keys)], np.int64))
        else:
            order = np.argsort(keys.view(f"S{keys.shape[1]}").ravel(), kind="stable")
        return cls(
            None,
            None,
            kinds[order],
            table,
            _Unsorted(keys, _Scattered.of(blocks), order),
        )

    def ties_last(self, n: int) -> bool:
        """Whether some event of a merge's last `n` rows (its last block's) has a key equal to
        an event of the other blocks'. The merge puts such an event after its equals (blocks
        keep their order on a tie), so only the event before each of them needs a look.
        Compared as rows: keys that differ only in trailing zero bytes count as equal."""
        unsorted = self._unsorted if self._events is None else self._as_merge()._unsorted
        assert unsorted is not None
        order = unsorted.order
        theirs = len(unsorted.keys) - n
        at = np.flatnonzero(order >= theirs)
        at = at[at > 0]
        before = order[at - 1]
        mine = before < theirs
        rows = unsorted.keys
        return bool(np.any(np.all(rows[before[mine]] == rows[order[at[mine]]], axis=1)))

    def array_body(self, first_index: int) -> KeyedEvents:
        """The events as the elements of a BSON array, keyed from `first_index` on: a reply's
        batch between its length and its terminator, gathered from where the events lie as it is
        sent (KeyedEvents)."""
        unsorted = self._unsorted if self._events is None else self._as_merge()._unsorted
        assert unsorted is not None
        return KeyedEvents(unsorted.events, unsorted.order, first_index)

    # -- between processes ------------------------------------------------------------------------

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        """Pickled as its columns' buffers: with protocol 5 and a buffer_callback (the reader
        processes' messages) they travel out of band, not copied into the pickle. A large bytes
        object in a pickle costs its copy into fresh memory, which faults in page by page."""
        offsets = self._offsets()
        values = self.events.buffers()[2]
        body = (
            values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
            if values is not None
            else pa.py_buffer(b"")
        )
        columns = (
            np.ascontiguousarray(self.keys),
            offsets - offsets[0],
            memoryview(body),
            np.ascontiguousarray(self.kinds),
        )
        wrap = pickle.PickleBuffer if protocol >= 5 else bytes
        return (_restore, (*map(wrap, columns), self.keys.shape[1], self.kind_table))

    def _offsets(self) -> npt.NDArray[np.int64]:
        return _offsets_of(self.events)


def _offsets_of(events: pa.LargeBinaryArray) -> npt.NDArray[np.int64]:
    """Where each event starts in the column's values buffer, and where the last ends (len + 1
    of them)."""
    if not len(events):
        return np.zeros(1, np.int64)
    return np.frombuffer(events.buffers()[1], np.int64)[
        events.offset : events.offset + len(events) + 1
    ]


def _restore(
    keys: Any, offsets: Any, body: Any, kinds: Any, width: int, kind_table: tuple[Kind, ...]
) -> EventBlock:
    kinds = np.frombuffer(kinds, np.int32)
    n = len(kinds)
    events = pa.Array.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(body)]
    )
    return EventBlock(np.frombuffer(keys, np.uint8).reshape(n, width), events, kinds, kind_table)


_NO_ORDER = np.zeros(0, np.int64)
