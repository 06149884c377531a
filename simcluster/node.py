"""A shard replica set's primary (mongod): storage, the oplog each write produces, oplog tailing.

Oplog shapes follow shared/reference/mongodb-formats.md C.1-C.10 (field order op, ns, ui, o, o2,
session fields, then ts, t, v, wall; inserts carry o2 = documentKey since 5.3; updates log `$v: 2`
diffs; DDL is `op: "c"` on `<db>.$cmd`; appendOplogNote writes `{op: "n", ns: "", o: data}`).
"""

from __future__ import annotations

from typing import Any

from bson import Int64

from mongoformats.errors import MongoError
from mongoformats.sessions import SessionsNamed
from simcluster.member_core import _wall
from simcluster.member_ddl import DDLCommands
from simcluster.member_reads import ReadCommands
from simcluster.member_replication import Replication
from simcluster.member_writes import WriteCommands
from simcluster.oplog import ClusterClock
from simcluster.server import CommandServer, Request

__all__ = ["READ_COMMANDS", "WRITE_COMMANDS", "ShardNode"]


# Commands a secondary refuses with NotWritablePrimary, and reads it serves only with secondaryOk
# (a non-primary $readPreference; drivers send primaryPreferred on a direct connection).
WRITE_COMMANDS = frozenset(
    {
        "insert",
        "update",
        "delete",
        "findandmodify",
        "create",
        "drop",
        "dropdatabase",
        "createindexes",
        "dropindexes",
        "collmod",
        "renamecollection",
        "appendoplognote",
        "committransaction",
        "aborttransaction",
    }
)
READ_COMMANDS = frozenset(
    {
        "find",
        "aggregate",
        "count",
        "distinct",
        "listcollections",
        "listindexes",
        "listdatabases",
        "dbstats",
        "collstats",
    }
)


class ShardNode(Replication, WriteCommands, ReadCommands, DDLCommands):
    """One member of shard replica set `set_name`: a primary takes writes, a secondary
    replicates them.

    Roles and the commit point live in `simcluster.replset.ReplicaSet`; a node alone (the
    default) is the primary of a set of one.
    """

    runtime_parameters = {
        **CommandServer.runtime_parameters,
        "periodicNoopIntervalSecs": "periodic_noop_interval_s",
        "transactionLifetimeLimitSeconds": "transaction_lifetime_s",
    }

    def __init__(
        self,
        clock: ClusterClock,
        host: str,
        port: int,
        set_name: str,
        *,
        version: str = "7.0",
        oplog_bytes: int = 1 << 30,
        initiate: bool = True,
    ) -> None:
        super().__init__(
            clock, host, port, set_name, version=version, oplog_bytes=oplog_bytes, initiate=initiate
        )
        self.commands.update(
            {
                "insert": self.cmd_insert,
                "update": self.cmd_update,
                "delete": self.cmd_delete,
                "find": self.cmd_find,
                "count": self.cmd_count,
                "distinct": self.cmd_distinct,
                "aggregate": self.cmd_aggregate,
                "findandmodify": self.cmd_find_and_modify,
                "create": self.cmd_create,
                "drop": self.cmd_drop,
                "dropdatabase": self.cmd_drop_database,
                "listdatabases": self.cmd_list_databases,
                "listcollections": self.cmd_list_collections,
                "listindexes": self.cmd_list_indexes,
                "createindexes": self.cmd_create_indexes,
                "dropindexes": self.cmd_drop_indexes,
                "collmod": self.cmd_coll_mod,
                "renamecollection": self.cmd_rename,
                "appendoplognote": self.cmd_append_oplog_note,
                "replsetgetstatus": self.cmd_repl_status,
                "replsetstepdown": self.cmd_step_down,
                "dbstats": self.cmd_db_stats,
                "collstats": self.cmd_coll_stats,
                "committransaction": self.cmd_commit_transaction,
                "aborttransaction": self.cmd_abort_transaction,
            }
        )

    async def check_command(self, name: str, db: str, cmd: dict[str, Any]) -> None:
        lname = name.lower()
        if not self.in_sync and lname in READ_COMMANDS:
            # A member that rejoined serves no reads until it caught up or rolled back (RECOVERING),
            # so no reader sees entries a rollback is about to remove.
            raise MongoError("NotPrimaryOrSecondary", "node is not in primary or recovering state")
        if not self.is_primary:
            # State-change errors carry the topologyVersion (4.4+), so a driver that already knows
            # this version keeps the server instead of marking it Unknown (SDAM "stale errors").
            tv = {"processId": self.process_id, "counter": Int64(self.topology_counter)}
            if lname in WRITE_COMMANDS:
                raise MongoError("NotWritablePrimary", "not primary", topologyVersion=tv)
            rp = cmd.get("$readPreference")
            secondary_ok = isinstance(rp, dict) and rp.get("mode", "primary") != "primary"
            if lname in READ_COMMANDS and not secondary_ok:
                raise MongoError(
                    "NotPrimaryNoSecondaryOk",
                    "not primary and secondaryOk=false",
                    topologyVersion=tv,
                )
        self.check_session(name, cmd)

    async def settle(self, name: str, cmd: dict[str, Any], reply: dict[str, Any]) -> None:
        # The command's last write is the newest entry: no other task ran since the handler wrote.
        if name.lower() in WRITE_COMMANDS and len(self.replset.members) > 1:
            await self.replset.write_concern(cmd, reply, self.oplog.last_key())

    def hello_fields(self, cmd: dict[str, Any]) -> dict[str, Any]:
        rs = self.replset
        last, committed = self.oplog.last_key(), self.commit_key()
        primary = rs.primary_node
        out: dict[str, Any] = {
            "isWritablePrimary": self.is_primary,
            "hosts": rs.hosts,
            "setName": self.set_name,
            "setVersion": 1,
            "secondary": not self.is_primary and self.in_sync,
        }
        if primary is not None:
            out["primary"] = primary.address
        out["me"] = self.address
        if self.is_primary:
            out["electionId"] = self.election_id
        out["lastWrite"] = {
            "opTime": self._optime(last),
            "lastWriteDate": _wall(last),
            "majorityOpTime": self._optime(committed),
            "majorityWriteDate": _wall(committed),
        }
        return out

    def kill_sessions(self, named: SessionsNamed) -> None:
        """Cursors, then the sessions' unprepared transactions
        (killSessionsAbortUnpreparedTransactions)."""
        super().kill_sessions(named)
        self.transactions.kill_sessions(named)

    async def cmd_step_down(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        if db != "admin":
            raise MongoError(
                "Unauthorized", "replSetStepDown may only be run against the admin database."
            )
        secs = float(cmd.get("replSetStepDown") or 60)
        catch_up = float(cmd.get("secondaryCatchUpPeriodSecs", 10))
        await self.replset.step_down(self, secs, catch_up, bool(cmd.get("force")))
        return {}
