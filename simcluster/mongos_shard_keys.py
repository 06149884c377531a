"""The commands that set a collection's shard key: shardCollection, refineCollectionShardKey
and reshardCollection."""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

from bson import Binary, Int64, MaxKey, MinKey, ObjectId

from mongoformats.errors import MongoError
from simcluster.catalog import index_name
from simcluster.chunks import (
    Chunk,
    ShardedCollection,
    key_text,
)
from simcluster.mongos_migrate import MigrationRouting
from simcluster.node import ShardNode
from simcluster.server import Request
from simcluster.storage import Collection


class ShardKeyCommands(MigrationRouting):
    """Sharding a collection, and changing its key afterwards."""

    async def cmd_shard_collection(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        ns = cmd["shardCollection"]
        key = dict(cmd["key"])
        if ns in self.sharded:
            if self.sharded[ns].key == key:
                return {"collectionsharded": ns}
            raise MongoError("AlreadyInitialized", f"sharding already enabled for collection {ns}")
        primary = self.primary_of(ns.split(".", 1)[0])
        existing = primary.coll(ns)
        coll_uuid = existing.uuid if existing else uuidlib.uuid4()
        await self._prepare_collection(primary, ns, key, coll_uuid, req)
        sc = ShardedCollection(
            ns, key, coll_uuid, bool(cmd.get("unique")), timestamp=self.clock.tick()
        )
        sc.chunks = self._initial_chunks(sc, primary, empty=existing is None or not existing.docs)
        self.sharded[ns] = sc
        self._spread(sc, primary)
        o2 = _shard_collection_o2(sc, cmd)
        primary.append_noop({"msg": {"shardCollection": ns}}, o2, Binary(coll_uuid.bytes, 4), ns)
        return {"collectionsharded": ns, "collectionUUID": Binary(coll_uuid.bytes, 4)}

    async def _prepare_collection(
        self,
        primary: ShardNode,
        ns: str,
        key: dict[str, Any],
        coll_uuid: uuidlib.UUID,
        req: Request,
    ) -> None:
        """The collection on its primary shard, created if need be, with its shard key index."""
        dbname, name = ns.split(".", 1)
        if primary.coll(ns) is None:
            primary._create(dbname, name, {}, coll_uuid)
        coll = primary.coll(ns)
        assert coll is not None
        if not coll.docs and not any(ix.key == key for ix in coll.indexes.values()):
            # Sharding an empty or new collection creates its shard key index first, logged as
            # a createIndexes (CreateCollectionCoordinator; "When sharding a non-existent
            # collection, MongoDB implicitly ... creates the shard key index").
            index = {"key": key, "name": index_name(key)}
            await primary.cmd_create_indexes(
                dbname, {"createIndexes": name, "indexes": [index]}, req
            )

    def _initial_chunks(
        self, sc: ShardedCollection, primary: ShardNode, *, empty: bool
    ) -> list[Chunk]:
        """One chunk on the primary shard; or, for an empty collection hashed on its first field,
        one chunk per shard (7.0 default), cut on hash values, the fields after it at MinKey in
        each cut. Versions 1|0, 1|1, ... in key order; each chunk on its first shard since the
        collection's timestamp."""
        ids = sorted(self.shards)
        low, high = sc.edge(MinKey), sc.edge(MaxKey)
        if sc.presplit and empty:
            step = 2**64 // len(ids)
            cuts = [Int64(-(2**63) + step * i) for i in range(1, len(ids))]
            bounds = [low, *(sc.as_point([cut, *sc.values_of(low)[1:]]) for cut in cuts), high]
            owners = ids
        else:
            bounds, owners = [low, high], [primary.set_name]
        return [
            Chunk(bounds[i], bounds[i + 1], sid, (1, i), [(sc.timestamp, sid)])
            for i, sid in enumerate(owners)
        ]

    def _spread(self, sc: ShardedCollection, primary: ShardNode) -> None:
        """Every member learns the shard key; the other shards given chunks create the collection
        silently (the server does not log these as user DDL). A shard given none creates it when
        a migration first brings it a chunk (chunks.clone_range)."""
        dbname, name = sc.ns.split(".", 1)
        owners = {c.shard for c in sc.chunks}
        for sid in sorted(self.shards):
            shard = self.shards[sid]
            for member in self.replsets[sid].members:
                member.shard_keys[sc.ns] = sc.key
            if shard is not primary and shard.coll(sc.ns) is None and sid in owners:
                shard.dbs.setdefault(dbname, {})[name] = Collection(name, uuid=sc.uuid)

    def _key_argument(
        self, db: str, cmd: dict[str, Any], name: str
    ) -> tuple[ShardedCollection, dict[str, Any]]:
        """The sharded collection and new key of a reshardCollection/refineCollectionShardKey."""
        if db != "admin":
            raise MongoError("Unauthorized", f"{name} may only be run against the admin database.")
        if "key" not in cmd:
            raise MongoError(
                "IDLFailedToParse", f"BSON field '{name}.key' is missing but a required field"
            )
        if not isinstance(cmd["key"], dict) or not cmd["key"]:
            raise MongoError(
                "TypeMismatch", f"BSON field '{name}.key' is the wrong type, expected type 'object'"
            )
        return self._sharded(cmd[name]), dict(cmd["key"])

    def _set_shard_key(self, sc: ShardedCollection, key: dict[str, Any]) -> None:
        sc.key = key
        sc.epoch, sc.timestamp = ObjectId(), self.clock.tick()
        for rs in self.replsets.values():
            for member in rs.members:
                member.shard_keys[sc.ns] = key

    async def cmd_refine_collection_shard_key(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        """`{refineCollectionShardKey: ns, key}`: the key gains suffix fields; every chunk keeps
        its range, its bounds extended with MinKey (MaxKey for the top). The coordinator on the
        primary shard then logs the noop change streams show as refineCollectionShardKey
        (refine_collection_shard_key_coordinator.cpp,
        notifyChangeStreamsOnRefineCollectionShardKeyComplete: o2 {refineCollectionShardKey,
        shardKey, oldShardKey})."""
        sc, key = self._key_argument(db, cmd, "refineCollectionShardKey")
        old = dict(sc.key)
        if list(key.items())[: len(old)] != list(old.items()) or len(key) <= len(old):
            # simcluster's words
            raise MongoError(
                "InvalidOptions",
                "refineCollectionShardKey: the proposed shard key "
                f"{key_text(key)} does not extend the current shard key "
                f"{key_text(old)}",
            )
        primary = self.primary_of(sc.ns.split(".", 1)[0])
        _check_key_index(primary, sc.ns, key)
        await self._wait_to_migrate(sc.ns)
        added = len(key) - len(old)
        for chunk in sc.chunks:
            chunk.min, chunk.max = (_extended(sc, bound, added) for bound in (chunk.min, chunk.max))
        self._set_shard_key(sc, key)
        o2 = {"refineCollectionShardKey": sc.ns, "shardKey": key, "oldShardKey": old}
        msg = f"Refine shard key for collection {sc.ns} with {key_text(key)}"
        primary.append_noop({"msg": msg}, o2, Binary(sc.uuid.bytes, 4), sc.ns)
        return {}

    async def cmd_reshard_collection(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        """`{reshardCollection: ns, key, unique?, numInitialChunks?, collation?}`: the collection
        is rebuilt under the new key as the server's resharding does, simulated with one
        recipient, the primary shard: a temporary `system.resharding.<old uuid>` collection with
        the resharding UUID, the collection's indexes and the new key's, every shard's documents
        copied into it (fromMigrate), then renamed over the original (fromMigrate, dropTarget);
        the other shards delete their copies (fromMigrate). Streams see none of that (system.*,
        fromMigrate), only the coordinator's noop (reshard_collection_coordinator.cpp,
        notifyChangeStreamsOnReshardCollectionComplete: ui the old collection UUID; o2
        {reshardCollection, reshardUUID, shardKey, oldShardKey, unique, numInitialChunks?,
        collation?}; 8.0 adds provenance). Later events carry the new UUID."""
        sc, key = self._key_argument(db, cmd, "reshardCollection")
        dbname, name = sc.ns.split(".", 1)
        primary = self.primary_of(dbname)
        await self._wait_to_migrate(sc.ns)
        old, old_uuid, reshard_uuid = dict(sc.key), sc.uuid, uuidlib.uuid4()
        temp = f"system.resharding.{old_uuid}"
        await _create_resharding_copy(primary, sc.ns, temp, key, reshard_uuid, req)
        self._set_shard_key(sc, key)
        sc.unique = bool(cmd.get("unique", False))
        for shard in self.shards.values():
            self._reshard_from(shard, primary, sc.ns, temp, reshard_uuid)
        await primary.cmd_rename(
            dbname,
            {"renameCollection": f"{dbname}.{temp}", "to": sc.ns, "dropTarget": True},
            req,
            from_migrate=True,
        )
        sc.uuid = reshard_uuid
        created = sc.timestamp
        sc.chunks = [
            Chunk(
                sc.edge(MinKey),
                sc.edge(MaxKey),
                primary.set_name,
                (1, 0),
                [(created, primary.set_name)],
            )
        ]
        o2 = _reshard_o2(sc, old, cmd, with_provenance=self.version >= "8.0")
        msg = f"Reshard collection {sc.ns} with shard key {key_text(key)}"
        primary.append_noop({"msg": msg}, o2, Binary(old_uuid.bytes, 4), sc.ns)
        return {}

    def _reshard_from(
        self, shard: ShardNode, primary: ShardNode, ns: str, temp: str, reshard_uuid: uuidlib.UUID
    ) -> None:
        """A shard's documents copied into the primary's resharding collection (fromMigrate);
        the other shards' copies deleted, their (now empty) collection taking the new UUID
        unlogged on every member, as shardCollection makes the other shards' copies."""
        dbname, name = ns.split(".", 1)
        for doc in list(shard.coll(ns) or []):
            primary.insert_one(f"{dbname}.{temp}", doc, {}, from_migrate=True)
            if shard is not primary:
                shard.delete_docs(ns, {"_id": doc["_id"]}, 1, {}, from_migrate=True)
        if shard is primary:
            return
        for member in self.replsets[shard.set_name].members:
            copy = member.dbs.get(dbname, {}).get(name)
            if copy is not None:
                copy.uuid = reshard_uuid


def _check_key_index(primary: ShardNode, ns: str, key: dict[str, Any]) -> None:
    coll = primary.coll(ns)
    wanted = list(key.items())
    if coll is None or not any(
        list(ix.key.items())[: len(wanted)] == wanted for ix in coll.indexes.values()
    ):
        raise MongoError(
            "InvalidOptions",
            "Please create an index that starts with the "
            "proposed shard key before sharding the collection",
        )


def _extended(sc: ShardedCollection, bound: Any, added: int) -> list[Any]:
    """A chunk bound under a refined key: its values, then MinKey for each added field (MaxKey
    for the top bound)."""
    values = sc.values_of(bound)
    fill = MaxKey if all(isinstance(v, MaxKey) for v in values) else MinKey
    return [*values, *(fill() for _ in range(added))]


async def _create_resharding_copy(
    primary: ShardNode,
    ns: str,
    temp: str,
    key: dict[str, Any],
    reshard_uuid: uuidlib.UUID,
    req: Request,
) -> None:
    """The temporary collection resharding fills: the collection's options and indexes, and the
    new key's index."""
    dbname = ns.split(".", 1)[0]
    source = primary.coll(ns)
    primary._create(dbname, temp, dict(source.options) if source is not None else {}, reshard_uuid)
    specs = [
        dict(ix.spec)
        for ix in (source.indexes.values() if source is not None else [])
        if ix.name != "_id_"
    ]
    if not any(spec["key"] == key for spec in specs):
        specs.append({"key": key, "name": index_name(key)})
    await primary.cmd_create_indexes(dbname, {"createIndexes": temp, "indexes": specs}, req)


def _reshard_o2(
    sc: ShardedCollection, old: dict[str, Any], cmd: dict[str, Any], *, with_provenance: bool
) -> dict[str, Any]:
    o2: dict[str, Any] = {
        "reshardCollection": sc.ns,
        "reshardUUID": Binary(sc.uuid.bytes, 4),
        "shardKey": sc.key,
        "oldShardKey": old,
        "unique": sc.unique,
    }
    if "numInitialChunks" in cmd:
        o2["numInitialChunks"] = Int64(cmd["numInitialChunks"])
    if "collation" in cmd:
        o2["collation"] = dict(cmd["collation"])
    if with_provenance:
        o2["provenance"] = "reshardCollection"
    return o2


def _shard_collection_o2(sc: ShardedCollection, cmd: dict[str, Any]) -> dict[str, Any]:
    """The request as the coordinator logs it (notifyChangeStreamsOnShardCollection): what was
    given, in the IDL's order (shardCollection_events jstest: numInitialChunks as given,
    collation when given)."""
    o2 = {
        "shardCollection": sc.ns,
        "shardKey": sc.key,
        "unique": sc.unique,
        "numInitialChunks": Int64(cmd.get("numInitialChunks") or 0),
        "presplitHashedZones": bool(cmd.get("presplitHashedZones", False)),
    }
    if "collation" in cmd:
        o2["collation"] = dict(cmd["collation"])
    return o2
