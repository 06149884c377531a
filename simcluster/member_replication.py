"""A shard member's replication: its background jobs (sync from the primary, periodic
noops, aborting expired transactions), step-up and rollback, replSetGetStatus,
replSetStepDown and the oplog notes.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import bson
import trio
from bson import Int64, ObjectId, Timestamp

from mongoformats.errors import MongoError
from simcluster.apply import take_prepared
from simcluster.member_core import MemberCore, _wall, log
from simcluster.oplog import ts_key
from simcluster.server import DECODE, Request
from simcluster.transactions import (
    Transaction,
    TxnKey,
)


class Replication(MemberCore):
    """A member's part in its replica set."""

    def become_primary(self, term: int, election_id: ObjectId) -> None:
        self.state = "PRIMARY"
        self.oplog.term = term
        self.election_id = election_id
        self.oplog.append({"op": "n", "ns": "", "o": {"msg": "new primary"}})
        # Transactions prepared under the old primary stay prepared: the coordinator commits or
        # aborts them here (the server restores them from the oplog the same way at step-up).
        for key, lsid, prepare_ts, ops in take_prepared(self.applier):
            self.transactions.restore_prepared(key, dict(lsid), prepare_ts, ops, self.applier.apply)

    async def background(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._periodic_noops)
            nursery.start_soon(self._replicate)
            nursery.start_soon(self._abort_expired_transactions)

    async def _abort_expired_transactions(self) -> None:
        """The server's abortExpiredTransactions job: a pass every half lifetime, at most a
        minute apart. The period is read again every quarter second, so a setParameter takes
        effect at once, as the server's parameter hook resets the job's period."""

        def expired(key: TxnKey, txn: Transaction) -> bool:
            return time.monotonic() - txn.started >= self.transaction_lifetime_s

        last = trio.current_time()
        while True:
            await trio.sleep(0.25)
            await self.wait_running()
            if trio.current_time() - last < min(self.transaction_lifetime_s / 2, 60.0):
                continue
            last = trio.current_time()
            if self.is_primary:
                self.transactions.abort_unprepared(expired)
            self.expired_transaction_passes += 1

    async def _periodic_noops(self) -> None:
        last_seen = self.oplog.last_key()
        while True:
            await trio.sleep(self.periodic_noop_interval_s)
            await self.wait_running()
            # Only a primary writes, and only when nothing was written since the last check, as
            # the server's NoopWriter does (noop_writer.cpp): an idle shard may wait two intervals.
            if self.is_primary and self.oplog.last_key() == last_seen:
                self.oplog.append({"op": "n", "ns": "", "o": {"msg": "periodic noop"}})
            last_seen = self.oplog.last_key()

    async def _replicate(self) -> None:
        """A secondary's sync loop: copy the primary's new entries (after the set's lag) and apply
        them."""
        rs = self.replset
        while True:
            await self.wait_running()
            source = self._sync_source()
            if source is None:
                await trio.sleep(0.05)  # nothing to sync from: roles change rarely, look again soon
                continue
            mine = self.oplog.last_key()
            if source.oplog.last_key() <= mine and self.in_sync:
                await source.oplog.wait_beyond(mine, trio.current_time() + 0.1)
                continue
            if rs.lag_s:
                await trio.sleep(rs.lag_s)
            if self._is_primary_still(source):  # else an election during the lag
                self._sync_from(source, mine)
                self._note_synced()
                await trio.lowlevel.checkpoint()

    def _note_synced(self) -> None:
        """After a sync pass: RECOVERING -> SECONDARY tells the drivers watching; the set's
        commit point may move."""
        if not self.in_sync:
            self.in_sync = True
            self.replset.notify()
        self.replset.member_applied()

    def _sync_source(self) -> MemberCore | None:
        """The member to copy entries from: the primary, unless this member is it (or the
        stopReplProducer fail point, the server's, stops this member fetching)."""
        source = self.replset.primary_node
        if (
            self.is_primary
            or source is None
            or source is self
            or "stopReplProducer" in self.fail_points
        ):
            return None
        return source

    def _is_primary_still(self, source: MemberCore) -> bool:
        return source is self.replset.primary_node

    def _sync_from(self, source: MemberCore, mine: int) -> None:
        """Copy and apply the source's entries after `mine`, or resync from it when `mine` was
        rolled back or is too stale to catch up."""
        if mine and (not source.oplog.contains(mine) or mine < source.oplog.first_key()):
            self._resync(source)
            return
        for raw in source.oplog.read_after(mine, 10_000):
            doc = bson.decode(raw, DECODE)
            self.oplog.append_raw(ts_key(doc["ts"]), raw)
            self.applier.apply(doc)

    def _resync(self, source: MemberCore) -> None:
        log.info(
            "%s: rolling back to the primary's state (resync from %s)", self.address, source.address
        )
        self.dbs.clear()
        self.dbs.update(copy.deepcopy(source.dbs))
        self.applier.pending = copy.deepcopy(source.applier.pending)
        self.applier.prepared = copy.deepcopy(source.applier.prepared)
        self.applier.images = copy.deepcopy(source.applier.images)
        self.applier.statements = copy.deepcopy(source.applier.statements)
        self.oplog.copy_from(source.oplog)
        self.branch_end = None
        self.replset.notify()  # ROLLBACK -> SECONDARY; majority readers here may read on

    async def cmd_repl_status(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        rs = self.replset
        committed = self._optime(rs.commit_key())
        members = [self._member_status(i, m) for i, m in enumerate(rs.members)]
        me = self._optime(self.oplog.last_key())
        my_state = next(
            m["state"] for m in members if m.get("self")
        )  # RECOVERING (3) while catching up
        return {
            "set": self.set_name,
            "myState": my_state,
            "term": Int64(rs.term),
            "optimes": {"lastCommittedOpTime": committed, "appliedOpTime": me, "durableOpTime": me},
            "members": members,
        }

    def _member_status(self, i: int, m: MemberCore) -> dict[str, object]:
        """One member's entry of replSetGetStatus's `members`."""
        state, name = _member_state(m)
        return {
            "_id": i,
            "name": m.address,
            "health": 1.0 if m.up else 0.0,
            "state": state,
            "stateStr": name,
            "optime": m._optime(m.oplog.last_key()),
            "optimeDate": _wall(m.oplog.last_key()),
            **({"self": True} if m is self else {}),
        }

    async def cmd_server_status(self, db: str, cmd: dict[str, Any], req: Request) -> dict[str, Any]:
        reply = await super().cmd_server_status(db, cmd, req)
        reply["metrics"]["abortExpiredTransactions"] = {
            "passes": Int64(self.expired_transaction_passes)
        }
        return reply

    async def cmd_append_oplog_note(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        if db != "admin":
            raise MongoError(
                "Unauthorized", "appendOplogNote may only be run against the admin database."
            )
        data = cmd.get("data")
        if not isinstance(data, dict):
            raise MongoError("BadValue", "'data' field must be a document")
        max_ct = cmd.get("maxClusterTime")
        if max_ct is not None and ts_key(max_ct) <= self.oplog.last_key():
            raise MongoError(
                "StaleClusterTime", "maxClusterTime is not greater than the last applied timestamp"
            )
        self.oplog.append({"op": "n", "ns": "", "o": data})
        return {}

    def append_noop(
        self, o: dict[str, Any], o2: dict[str, Any] | None = None, ui: Any = None, ns: str = ""
    ) -> Timestamp:
        """A noop entry; sharding's notices for change streams name their collection (`ns`,
        `ui`)."""
        entry: dict[str, Any] = {"op": "n", "ns": ns, "o": o}
        if ui is not None:
            entry["ui"] = ui
        if o2 is not None:
            entry["o2"] = o2
        ts, _ = self.oplog.append(entry)
        return ts


def _member_state(m: MemberCore) -> tuple[int, str]:
    """A member's replica set state: (its number, its name)."""
    if not m.up:
        return 8, "(not reachable/healthy)"
    if m.is_primary:
        return 1, "PRIMARY"
    return (2, "SECONDARY") if m.in_sync else (3, "RECOVERING")
