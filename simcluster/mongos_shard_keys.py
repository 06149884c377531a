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
from simcluster.server import Request


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
        dbname = ns.split(".", 1)[0]
        primary = self.primary_of(dbname)
        existing = primary.coll(ns)
        coll_uuid = existing.uuid if existing else uuidlib.uuid4()
        if existing is None:
            primary._create(dbname, ns.split(".", 1)[1], {}, coll_uuid)
        coll = primary.coll(ns)
        assert coll is not None
        if not coll.docs and not any(ix.key == key for ix in coll.indexes.values()):
            # Sharding an empty or new collection creates its shard key index first, logged as
            # a createIndexes (CreateCollectionCoordinator; "When sharding a non-existent
            # collection, MongoDB implicitly ... creates the shard key index").
            index = {"key": key, "name": index_name(key)}
            await primary.cmd_create_indexes(
                dbname, {"createIndexes": ns.split(".", 1)[1], "indexes": [index]}, req
            )
        created = self.clock.tick()
        sc = ShardedCollection(ns, key, coll_uuid, bool(cmd.get("unique")), timestamp=created)
        ids = sorted(self.shards)
        low, high = sc.edge(MinKey), sc.edge(MaxKey)
        if sc.presplit and (existing is None or not existing.docs):
            # An empty collection hashed on its first field starts with one chunk per shard (7.0
            # default), cut on hash values; the fields after it sit at MinKey in each cut.
            step = 2**64 // len(ids)
            cuts = [Int64(-(2**63) + step * i) for i in range(1, len(ids))]
            bounds = [low, *(sc.as_point([cut, *sc.values_of(low)[1:]]) for cut in cuts), high]
            owners = ids
        else:
            bounds, owners = [low, high], [primary.set_name]
        # Versions 1|0, 1|1, ... in key order; each chunk on its first shard since the collection's timestamp.
        sc.chunks = [
            Chunk(bounds[i], bounds[i + 1], sid, (1, i), [(created, sid)])
            for i, sid in enumerate(owners)
        ]
        self.sharded[ns] = sc
        for sid in ids:
            shard = self.shards[sid]
            for member in self.replsets[sid].members:
                member.shard_keys[ns] = key
            if shard is not primary and shard.coll(ns) is None and sid in owners:
                # Created silently on the other shards given chunks: the server does not log these
                # as user DDL. A shard given none creates it when a migration first brings it a
                # chunk (chunks.clone_range).
                shard.dbs.setdefault(dbname, {})
                from simcluster.storage import Collection

                shard.dbs[dbname][ns.split(".", 1)[1]] = Collection(
                    ns.split(".", 1)[1], uuid=coll_uuid
                )
        # The request as the coordinator logs it (notifyChangeStreamsOnShardCollection): what was
        # given, in the IDL's order (shardCollection_events jstest: numInitialChunks as given,
        # collation when given).
        o2 = {
            "shardCollection": ns,
            "shardKey": key,
            "unique": sc.unique,
            "numInitialChunks": Int64(cmd.get("numInitialChunks") or 0),
            "presplitHashedZones": bool(cmd.get("presplitHashedZones", False)),
        }
        if "collation" in cmd:
            o2["collation"] = dict(cmd["collation"])
        primary.append_noop({"msg": {"shardCollection": ns}}, o2, Binary(coll_uuid.bytes, 4), ns)
        return {"collectionsharded": ns, "collectionUUID": Binary(coll_uuid.bytes, 4)}

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
        dbname = sc.ns.split(".", 1)[0]
        primary = self.primary_of(dbname)
        coll = primary.coll(sc.ns)
        wanted = list(key.items())
        if coll is None or not any(
            list(ix.key.items())[: len(wanted)] == wanted for ix in coll.indexes.values()
        ):
            raise MongoError(
                "InvalidOptions",
                "Please create an index that starts with the "
                "proposed shard key before sharding the collection",
            )
        await self._wait_to_migrate(sc.ns)
        added = len(key) - len(old)
        for chunk in sc.chunks:
            for end in ("min", "max"):
                values = sc.values_of(getattr(chunk, end))
                fill = MaxKey if all(isinstance(v, MaxKey) for v in values) else MinKey
                setattr(chunk, end, [*values, *(fill() for _ in range(added))])
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
        source = primary.coll(sc.ns)
        temp = f"system.resharding.{old_uuid}"
        primary._create(
            dbname, temp, dict(source.options) if source is not None else {}, reshard_uuid
        )
        specs = [
            dict(ix.spec)
            for ix in (source.indexes.values() if source is not None else [])
            if ix.name != "_id_"
        ]
        if not any(spec["key"] == key for spec in specs):
            specs.append({"key": key, "name": index_name(key)})
        await primary.cmd_create_indexes(dbname, {"createIndexes": temp, "indexes": specs}, req)
        self._set_shard_key(sc, key)
        sc.unique = bool(cmd.get("unique", False))
        for shard in self.shards.values():
            for doc in list(shard.coll(sc.ns) or []):
                primary.insert_one(f"{dbname}.{temp}", doc, {}, from_migrate=True)
                if shard is not primary:
                    shard.delete_docs(sc.ns, {"_id": doc["_id"]}, 1, {}, from_migrate=True)
            if shard is not primary:
                # Its (now empty) copy takes the new UUID unlogged on every member, as
                # shardCollection makes the other shards' copies.
                for member in self.replsets[shard.set_name].members:
                    copy = member.dbs.get(dbname, {}).get(name)
                    if copy is not None:
                        copy.uuid = reshard_uuid
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
        o2: dict[str, Any] = {
            "reshardCollection": sc.ns,
            "reshardUUID": Binary(reshard_uuid.bytes, 4),
            "shardKey": key,
            "oldShardKey": old,
            "unique": sc.unique,
        }
        if "numInitialChunks" in cmd:
            o2["numInitialChunks"] = Int64(cmd["numInitialChunks"])
        if "collation" in cmd:
            o2["collation"] = dict(cmd["collation"])
        if self.version >= "8.0":
            o2["provenance"] = "reshardCollection"
        msg = f"Reshard collection {sc.ns} with shard key {key_text(key)}"
        primary.append_noop({"msg": msg}, o2, Binary(old_uuid.bytes, 4), sc.ns)
        return {}
