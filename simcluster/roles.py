"""What the cluster's parts need of a shard member, stated as protocols.

A replica set, a chunk migration and the balancer each use a few of a member's attributes and
methods. Naming those here, instead of importing the member's class, keeps the member (which
imports the replica set) and its users free of import cycles; `simcluster.node.ShardNode`
satisfies both protocols structurally.
"""

from __future__ import annotations

from typing import Any, Protocol

import trio
from bson import ObjectId, Timestamp

from simcluster.oplog import ClusterClock, Oplog
from simcluster.storage import Collection


class ShardMember(Protocol):
    """What a migration (simcluster.chunks) and the balancer read and write on a shard's primary:
    its collections, its oplog, and its logged writes."""

    @property
    def set_name(self) -> str: ...

    @property
    def dbs(self) -> dict[str, dict[str, Collection]]: ...

    @property
    def oplog(self) -> Oplog: ...

    @property
    def clock(self) -> ClusterClock: ...

    def coll(self, ns: str) -> Collection | None: ...

    def select(self, ns: str, filt: dict[str, Any]) -> list[dict[str, Any]]: ...

    def insert_one(
        self, ns: str, doc: dict[str, Any], session: dict[str, Any], *, from_migrate: bool = False
    ) -> None: ...

    def delete_docs(
        self,
        ns: str,
        filt: dict[str, Any],
        limit: int,
        session: dict[str, Any],
        *,
        from_migrate: bool = False,
    ) -> int: ...

    def append_noop(
        self, o: dict[str, Any], o2: dict[str, Any] | None = None, ui: Any = None, ns: str = ""
    ) -> Timestamp: ...


class ReplMember(Protocol):
    """What a replica set (simcluster.replset) reads and sets on its members: liveness, sync
    state and electability, the oplog, and the process's start, stop and pause."""

    # Set by the replica set: the member joins it, and elections and failures change these.
    replset: Any
    up: bool
    in_sync: bool
    state: str
    frozen_until: float
    branch_end: int | None

    @property
    def address(self) -> str: ...

    @property
    def oplog(self) -> Oplog: ...

    @property
    def clock(self) -> ClusterClock: ...

    @property
    def applier(self) -> Any: ...

    def applied_key(self) -> int: ...

    def become_primary(self, term: int, election_id: ObjectId) -> None: ...

    def bump_topology(self) -> None: ...

    def stop(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    async def serve(
        self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None: ...
