"""What the balancer and the config server need of the router, stated as protocols.

The router (simcluster.mongos) owns the balancer and the config server and passes itself to
them; naming here the few attributes they use, instead of importing the router's class, keeps
the imports one way. `simcluster.mongos.Mongos` satisfies these protocols structurally.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

from bson import Timestamp

from simcluster.chunks import Chunk, ShardedCollection
from simcluster.roles import ShardMember


class BalancerSettings(Protocol):
    """config.settings as the balancer reads it (simcluster.config_server.ConfigServer)."""

    def balancer_mode(self) -> str: ...

    def chunk_size_mb(self) -> int | None: ...


class ShardSet(Protocol):
    """A shard's replica set, as far as the balancer asks: whether it has a primary now."""

    @property
    def primary_node(self) -> object | None: ...


class BalancedRouter(Protocol):
    """What the balancer (simcluster.balancer) reads of the router and asks it to do."""

    @property
    def config(self) -> BalancerSettings: ...

    @property
    def fail_points(self) -> Mapping[str, Mapping[str, Any]]: ...

    @property
    def replsets(self) -> Mapping[str, ShardSet]: ...

    @property
    def shards(self) -> Mapping[str, ShardMember]: ...

    @property
    def sharded(self) -> Mapping[str, ShardedCollection]: ...

    def in_transaction(self, ns: str) -> bool: ...

    def migrating(self, ns: str) -> bool: ...

    async def migrate(self, sc: ShardedCollection, chunk: Chunk, to: str) -> None: ...


class CatalogRouter(Protocol):
    """What the config server builds the sharding catalog (config.shards, config.databases,
    config.collections, config.chunks, config.mongos) and the changelog from."""

    @property
    def address(self) -> str: ...

    @property
    def full_version(self) -> str: ...

    @property
    def started_at(self) -> datetime.datetime: ...

    @property
    def db_primary(self) -> Mapping[str, str]: ...

    @property
    def db_versions(self) -> Mapping[str, tuple[uuid.UUID, Timestamp]]: ...

    @property
    def sharded(self) -> Mapping[str, ShardedCollection]: ...

    def shard_docs(self) -> list[dict[str, Any]]: ...
