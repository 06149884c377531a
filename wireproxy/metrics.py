"""Prometheus metrics of one proxy instance (its own registry: no global state).

Every name starts with `pcs_`, carries its unit (`_seconds`, `_bytes`) and, for counters,
`_total`; the page leaves out prometheus_client's `_created` series (one more series per counter
that no dashboard reads) and adds the process's own `process_*` figures (CPU, memory, file
descriptors).

Every label value is bounded: command names only from the server's command set (any other name
a client sends is `other`), routes and codes from fixed sets, stream names by the engine's name
limit; the engine's per-stream series are read from the live streams at each scrape, so those of
a closed stream are gone from the next page. A page is rendered off the trio loop
(`ProxyMetrics.page`): its size grows with the open streams and buckets, and every client waits
while the loop formats text.
"""

from __future__ import annotations

import hashlib
import logging
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

import trio
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

OTHER_COMMAND = "other"

# Command names that may become a label: the server's commands (src/mongo/db/commands/ and
# src/mongo/s/commands/) that drivers, tools and the proxy's own users send, and the proxy's own.
KNOWN_COMMANDS = frozenset(
    {
        "abortTransaction",
        "addShard",
        "aggregate",
        "analyzeShardKey",
        "appendOplogNote",
        "authenticate",
        "balancerStart",
        "balancerStatus",
        "balancerStop",
        "buildInfo",
        "bulkWrite",
        "checkShardingIndex",
        "cleanupOrphaned",
        "clearJumboFlag",
        "collMod",
        "collStats",
        "commitTransaction",
        "compact",
        "configureFailPoint",
        "connPoolStats",
        "connectionStatus",
        "count",
        "create",
        "createIndexes",
        "createRole",
        "createSearchIndexes",
        "createUser",
        "currentOp",
        "dataSize",
        "dbHash",
        "dbStats",
        "delete",
        "distinct",
        "drop",
        "dropAllRolesFromDatabase",
        "dropAllUsersFromDatabase",
        "dropDatabase",
        "dropIndexes",
        "dropRole",
        "dropSearchIndex",
        "dropUser",
        "enableSharding",
        "endSessions",
        "explain",
        "features",
        "find",
        "findAndModify",
        "flushRouterConfig",
        "fsync",
        "getCmdLineOpts",
        "getDefaultRWConcern",
        "getLastError",
        "getLog",
        "getMore",
        "getParameter",
        "getShardMap",
        "getShardVersion",
        "getnonce",
        "grantPrivilegesToRole",
        "grantRolesToRole",
        "grantRolesToUser",
        "hello",
        "hostInfo",
        "insert",
        "isMaster",
        "ismaster",
        "killAllSessions",
        "killAllSessionsByPattern",
        "killCursors",
        "killOp",
        "killSessions",
        "listCollections",
        "listCommands",
        "listDatabases",
        "listIndexes",
        "listSearchIndexes",
        "listShards",
        "lockInfo",
        "logout",
        "mapReduce",
        "moveChunk",
        "movePrimary",
        "moveRange",
        "ping",
        "profile",
        "reIndex",
        "refineCollectionShardKey",
        "refreshSessions",
        "removeShard",
        "renameCollection",
        "replSetGetStatus",
        "reshardCollection",
        "revokePrivilegesFromRole",
        "revokeRolesFromRole",
        "revokeRolesFromUser",
        "rolesInfo",
        "saslContinue",
        "saslStart",
        "serverStatus",
        "setDefaultRWConcern",
        "setFeatureCompatibilityVersion",
        "setParameter",
        "shardCollection",
        "shutdown",
        "split",
        "splitVector",
        "startSession",
        "top",
        "update",
        "updateRole",
        "updateSearchIndex",
        "updateUser",
        "usersInfo",
        "validate",
        "whatsmyuri",
        "parallelChangeStream",
        "parallelChangeStreamStatus",
        "dropParallelChangeStream",
    }
)


def command_label(name: str) -> str:
    """`name` as a label value: itself if the server knows such a command, else `other`."""
    return name if name in KNOWN_COMMANDS else OTHER_COMMAND


class _Families:
    """Collected metric families, as a registry-like object generate_latest can render."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


class _Registry(CollectorRegistry):
    """A registry that remembers its collectors, so that a scrape can ask those with an async
    `snapshot()` (the engine's) for their families on the loop."""

    def __init__(self) -> None:
        super().__init__()
        self.collectors: list[Collector] = []

    def register(self, collector: Collector) -> None:
        super().register(collector)
        self.collectors.append(collector)

    def unregister(self, collector: Collector) -> None:
        super().unregister(collector)
        self.collectors.remove(collector)


class FailureLog:
    """Unexpected failures of commands, for the log and for the client's reply.

    A client may send a command that trips the same bug again and again, so each failure is
    named by a fingerprint of its type and the code lines it passed (its error id, which the
    client's InternalError reply carries instead of any exception text): one traceback per error
    id is logged, then at most one per `interval_s` with the count of those not logged."""

    _MAX_IDS = 1000  # bounds the table even if failures came from unboundedly many places

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0) -> None:
        self.logger, self.interval_s = logger, interval_s
        self._logged_at: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    @staticmethod
    def error_id(exc: BaseException) -> str:
        frames = traceback.extract_tb(exc.__traceback__)
        where = "|".join(f"{f.filename}:{f.lineno}" for f in frames)
        fingerprint = f"{type(exc).__qualname__}|{where}".encode()
        return hashlib.blake2b(fingerprint, digest_size=6).hexdigest()

    def record(self, exc: BaseException, what: str) -> str:
        """Log `exc` (a failure of `what`) if its error id is due; returns the error id."""
        error_id = self.error_id(exc)
        now = time.monotonic()
        last = self._logged_at.get(error_id)
        if last is not None and now - last < self.interval_s:
            self._unlogged[error_id] = self._unlogged.get(error_id, 0) + 1
            return error_id
        if last is None and len(self._logged_at) >= self._MAX_IDS:
            self._logged_at.clear()
            self._unlogged.clear()
        self._logged_at[error_id] = now
        repeats = self._unlogged.pop(error_id, 0)
        self.logger.error(
            "%s failed: error id %s (%d more of it since it was last logged)",
            what,
            error_id,
            repeats,
            exc_info=exc,
        )
        return error_id


class ThrottledLog:
    """Log lines that clients cause (a bad frame, a connection closed for what it sent): at most
    one per `interval_s` for each kind, the next one saying how many were left out. A client
    sending a hundred thousand bad frames must neither fill the log nor spend the loop's time on
    formatting lines."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger, self.interval_s, self._clock = logger, interval_s, clock
        self._logged_at: dict[str, float] = {}
        self._left_out: dict[str, int] = {}

    def info(self, kind: str, message: str, *args: Any) -> None:
        """Log `message % args` unless a line of `kind` (one of a few fixed names) was logged
        within the interval."""
        now = self._clock()
        last = self._logged_at.get(kind)
        if last is not None and now - last < self.interval_s:
            self._left_out[kind] = self._left_out.get(kind, 0) + 1
            return
        self._logged_at[kind] = now
        left_out = self._left_out.pop(kind, 0)
        if left_out:
            message, args = message + " (and %d more since the last such line)", (*args, left_out)
        self.logger.info(message, *args)


# Labelled command counters ProxyMetrics keeps at hand before starting over (a client may
# send any number of names, each counted as `other`).
_COMMAND_CHILDREN_KEPT = 1024


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = _Registry()
        # One page rendered at a time: scrapes that come together do not each take a thread.
        self._render = trio.CapacityLimiter(1)
        self.connections = Gauge(
            "pcs_client_connections", "Open client connections", registry=self.registry
        )
        self.commands = Counter(
            "pcs_commands_total",
            "Commands received (command: the command's name if the server knows it, else other)",
            ["command", "route"],
            registry=self.registry,
        )
        self.errors = Counter(
            "pcs_error_replies_total",
            "Error replies sent, by code",
            ["code"],
            registry=self.registry,
        )
        self.upstream_latency = Histogram(
            "pcs_upstream_request_duration_seconds",
            "Round trip of a command passed to the upstream",
            registry=self.registry,
        )
        self.upstream_up = Gauge(
            "pcs_upstream_up",
            "1 while the upstream host (a mongos) answers the proxy's hello checks",
            ["address"],
            registry=self.registry,
        )
        self.protocol_errors = Counter(
            "pcs_protocol_errors_total", "Connections closed for bad frames", registry=self.registry
        )
        ProcessCollector(registry=self.registry)
        # Commands that failed unexpectedly (answered InternalError): logged by error id.
        self.failures = FailureLog(logging.getLogger("wireproxy.session"))
        # What clients send that closes their connection: logged, but not once per client.
        self.client_log = ThrottledLog(logging.getLogger("wireproxy"))
        # `commands`' labelled children by (command name, route): labels() costs microseconds a
        # call, and a consumer's getMores come one per batch.
        self._command_children: dict[tuple[str, str], Any] = {}

    def count_command(self, name: str, route: str) -> None:
        """Count one command received (`commands`, labelled by command_label(name))."""
        key = (name, route)
        child = self._command_children.get(key)
        if child is None:
            if len(self._command_children) >= _COMMAND_CHILDREN_KEPT:  # clients' own names
                self._command_children.clear()
            child = self._command_children[key] = self.commands.labels(
                command=command_label(name), route=route
            )
        child.inc()

    async def page(self) -> bytes:
        """The exposition page. Collectors that read the engine's state do so on the loop (the
        state's only writer: no lock needed), each between checkpoints; the client library's own
        metrics are thread-safe; the text is then formatted in a worker thread."""
        families: list[Metric] = []
        for collector in list(self.registry.collectors):
            snapshot: Any = getattr(collector, "snapshot", None)
            families.extend(await snapshot() if snapshot is not None else collector.collect())
            await trio.sleep(0)
        for family in families:  # fresh objects of each collect(): theirs to change
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
        return await trio.to_thread.run_sync(
            generate_latest, _Families(families), limiter=self._render
        )
