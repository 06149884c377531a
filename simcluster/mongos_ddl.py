"""The router's DDL and catalog commands: fanned out to a collection's owners or sent to its
database's primary shard; and the shards themselves (addShard, listShards)."""

from __future__ import annotations

from typing import Any

from bson import Binary, Int64

from mongoformats.errors import MongoError
from simcluster.mongos_routing import RouterBase
from simcluster.node import ShardNode
from simcluster.replset import ReplicaSet
from simcluster.server import Request


class DdlRouting(RouterBase):
    """create, createIndexes, drop, renameCollection, list*, addShard and the like on a router."""

    async def cmd_primary_ddl(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        name = next(iter(cmd)).lower()
        shard = self.primary_of(db)
        return await shard.commands[name](db, cmd, req)

    async def cmd_owners_ddl(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        name = next(iter(cmd))
        ns = f"{db}.{cmd[name]}"
        reply: dict[str, Any] = {}
        for shard in self.owners(ns):
            sc = self.sharded.get(ns)
            sub = (
                dict(cmd, collectionUUID=Binary(sc.uuid.bytes, 4))
                if sc and name == "createIndexes"
                else cmd
            )
            reply = await shard.commands[name.lower()](db, sub, req)
        return reply

    async def cmd_drop(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['drop']}"
        reply: dict[str, Any] = {}
        primary = self.primary_of(db)
        # 7.0's DropCollectionCoordinator drops on the other shards first, with fromMigrate, then
        # on the primary shard without it: change streams show one drop (buildNotFromMigrateFilter).
        owners = self.owners(ns)
        for shard in [s for s in owners if s is not primary]:
            await shard.cmd_drop(db, cmd, req, from_migrate=True)
        if primary in owners:
            reply = await primary.cmd_drop(db, cmd, req)
        self.sharded.pop(ns, None)
        for rs in self.replsets.values():
            for member in rs.members:
                member.shard_keys.pop(ns, None)
        return reply

    async def cmd_drop_database(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        for shard in self.shards.values():
            if db in shard.dbs or self.db_primary.get(db) == shard.set_name:
                await shard.cmd_drop_database(db, cmd, req)
        for ns in [n for n in self.sharded if n.startswith(db + ".")]:
            del self.sharded[ns]
        self.db_primary.pop(db, None)
        self.db_versions.pop(db, None)
        return {"dropped": db}

    async def cmd_rename(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        src = cmd["renameCollection"]
        if src in self.sharded:
            raise MongoError(
                "IllegalOperation",
                "renameCollection of a sharded collection is not supported by simcluster",
            )
        return await self.primary_of(src.split(".", 1)[0]).cmd_rename(db, cmd, req)

    async def cmd_list_databases(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        names = sorted({n for s in [self.config.node, *self.shards.values()] for n in s.dbs})
        dbs = [{"name": n, "sizeOnDisk": Int64(4096), "empty": False} for n in names]
        if cmd.get("nameOnly"):
            dbs = [{"name": n} for n in names]
        return {"databases": dbs, "totalSize": Int64(4096 * len(dbs))}

    async def cmd_list_collections(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        return await self.primary_of(db).cmd_list_collections(db, cmd, req)

    async def cmd_list_indexes(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        ns = f"{db}.{cmd['listIndexes']}"
        return await self.owners(ns)[0].cmd_list_indexes(db, cmd, req)

    async def cmd_db_stats(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        objects = sum(len(c.docs) for s in self.shards.values() for c in s.dbs.get(db, {}).values())
        return {"db": db, "objects": objects, "raw": {}}

    async def cmd_append_oplog_note(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        # mongos writes the note on every shard (cluster_oplog_note_cmd).
        for shard in self.shards.values():
            await shard.cmd_append_oplog_note(db, cmd, req)
        return {}

    async def cmd_enable_sharding(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        self.primary_of(cmd["enableSharding"])
        return {}

    async def cmd_list_shards(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        if db != "admin":
            raise MongoError(
                "Unauthorized", "listShards may only be run against the admin database."
            )
        return {"shards": self.shard_docs()}

    async def cmd_add_shard(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        """`{addShard: "<set>/<host:port>,...", name?}`: the set must be running (one of the
        cluster's spares) and hold no databases; the default shard name is the set name."""
        seed = _add_shard_seed(db, cmd)
        set_name, _, hosts = seed.rpartition("/")
        seeds = set(hosts.split(","))
        for sid, member in self.replsets.items():
            if seeds & set(member.hosts):  # adding the same set again answers as the first time did
                if cmd.get("name", sid) != sid:
                    raise MongoError(
                        "IllegalOperation",
                        f"A shard already exists containing the replica set '{member.set_name}'",
                    )
                return {"shardAdded": sid}
        rs = self._spare_named(seed, set_name, seeds)
        name = cmd.get("name") or rs.set_name
        if name in self.replsets:
            raise MongoError("IllegalOperation", f"A shard named {name} already exists")
        _check_no_databases(seed, rs.primary)
        del self.spares[rs.set_name]
        self.topology_times[name] = self.clock.tick()
        self.replsets[name] = rs
        return {"shardAdded": name}

    def _spare_named(self, seed: str, set_name: str, seeds: set[str]) -> ReplicaSet[ShardNode]:
        """The running replica set the seed list reaches."""
        rs = next((r for r in self.spares.values() if seeds & set(r.hosts)), None)
        if rs is None:
            raise MongoError(
                "OperationFailed",
                f"failed to run command {{ isMaster: 1 }} when attempting to add "
                f"shard {seed} :: caused by :: HostUnreachable: no member of {seed} answered",
            )
        if set_name and set_name != rs.set_name:
            raise MongoError(
                "OperationFailed",
                f"in seed list {seed}, host {next(iter(seeds))} does not belong to "
                f'replica set {set_name}; found {{ setName: "{rs.set_name}" }}',
            )
        return rs


def _add_shard_seed(db: str, cmd: dict[str, Any]) -> str:
    if db != "admin":
        raise MongoError("Unauthorized", "addShard may only be run against the admin database.")
    seed = cmd["addShard"]
    if not isinstance(seed, str):
        raise MongoError(
            "TypeMismatch",
            "BSON field 'addShard.addShard' is the wrong type, expected type 'string'",
        )
    if "maxSize" in cmd:  # removed in 6.2
        raise MongoError("InvalidOptions", "addShard no longer supports maxSize field")
    return seed


def _check_no_databases(seed: str, primary: ShardNode) -> None:
    databases = sorted(
        d for d, colls in primary.dbs.items() if colls and d not in ("admin", "config", "local")
    )
    if databases:
        raise MongoError(
            "IllegalOperation",
            f"can't add shard '{seed}' because a local database "
            f"'{databases[0]}' exists in another shard",
        )
