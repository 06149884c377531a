"""A watch()'s stages applied to a batch of events, spread over worker processes.

Stages other than a plain $match (Debezium's $replaceRoot pipeline, projections, a $match on a
looked-up document) decode, evaluate and re-encode every event in Python, so one process shapes
fewer events a second than it reads. With `readerProcesses: k` a getMore's
batch is cut into up to k runs of events, each shaped by a process of trio_parallel's, while the
proxy process goes on merging and serving. Small batches are shaped in place: sending a run to
another process and back costs about as much as shaping a few hundred events.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import trio
import trio_parallel

from mongoformats.change_stages import Stages, shape_events
from mongoformats.errors import MongoError

__all__ = ["SHAPE_RUN_EVENTS", "Shaper"]

log = logging.getLogger("buckets.shaping")

SHAPE_RUN_EVENTS = 256  # the fewest events sent to a worker process in one run


class Shaper:
    """Shapes a stream's batches; `processes` 0 shapes them all in the proxy process."""

    def __init__(self, stages: Stages, processes: int) -> None:
        self.stages = stages
        self.processes = processes
        # Its own limiter: the default one admits os.cpu_count() jobs, and reader processes hold
        # theirs for good.
        self._limiter = trio.CapacityLimiter(processes) if processes else None
        self.runs_sent = 0  # for status: runs shaped in worker processes

    async def warm_up(self) -> None:
        """Start the worker processes while the stream opens, so that the first getMore that
        needs them does not wait for interpreters to start and import the stages."""
        if not self.processes or not self.stages:
            return
        try:
            async with (
                trio.open_nursery() as nursery
            ):  # at once: each busy worker makes the next start
                for _ in range(self.processes):
                    nursery.start_soon(
                        functools.partial(
                            trio_parallel.run_sync, shape_events, [], [], (), limiter=self._limiter
                        )
                    )
        except* (
            trio_parallel.BrokenWorkerError
        ) as group:  # shape() copes with a dead worker when it meets one
            log.warning("a shaping process failed to start: %s", group.exceptions[0])

    async def shape(
        self, raws: Sequence[bytes], tokens: Sequence[Mapping[str, Any]]
    ) -> list[bytes | None]:
        """Each event through the stages, in order: its new bytes, or None where a $match
        dropped it.
        A stage's error is the first failing event's, as if the events were shaped one by one."""
        runs = min(self.processes, len(raws) // SHAPE_RUN_EVENTS)
        if runs < 1:
            return shape_events(raws, tokens, self.stages)
        size = -(-len(raws) // runs)
        results: list[list[bytes | None] | MongoError] = [[] for _ in range(runs)]

        async def run(i: int) -> None:
            part = slice(i * size, (i + 1) * size)
            try:
                try:
                    results[i] = await trio_parallel.run_sync(
                        shape_events, raws[part], tokens[part], self.stages, limiter=self._limiter
                    )
                except (
                    trio_parallel.BrokenWorkerError
                ) as exc:  # killed, out of memory: no reason to fail the stream
                    log.warning(
                        "a shaping process died (%s); its events are shaped in the proxy process",
                        exc,
                    )
                    results[i] = shape_events(raws[part], tokens[part], self.stages)
            except (
                MongoError
            ) as exc:  # a stage's error, raised where it was shaped: kept for its place in order
                results[i] = exc

        async with trio.open_nursery() as nursery:
            for i in range(runs):
                nursery.start_soon(run, i)
        self.runs_sent += runs
        out: list[bytes | None] = []
        for result in results:
            if isinstance(result, MongoError):
                raise result
            out += result
        return out
