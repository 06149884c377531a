"""The router's statement hooks: what a command waits for before it runs (a shard's primary,
its transaction) and after (write concern), and transactions across shards (two-phase commit)."""

from __future__ import annotations

from typing import Any

from bson import Timestamp

from mongoformats.errors import MongoError, has_category
from mongoformats.sessions import UNKNOWN_USER, SessionsNamed
from simcluster.config_server import CONFIG_DATABASES
from simcluster.mongos_routing import RouterBase
from simcluster.node import READ_COMMANDS, WRITE_COMMANDS
from simcluster.oplog import ts_key
from simcluster.server import Request
from simcluster.transactions import TxnKey, no_such_transaction, txn_key


class TransactionRouting(RouterBase):
    """Transactions as mongos runs them: participants join on first use; commit is direct for one,
    two-phase for several."""

    async def check_command(self, name: str, db: str, cmd: dict[str, Any]) -> None:
        await self._wait_for_primaries(name, db, cmd)
        if cmd.get("autocommit") is not False or "lsid" not in cmd:
            return
        lsid, number = txn_key(cmd)
        if cmd.get("startTransaction"):
            self.txn_numbers[lsid] = number
        elif self.txn_numbers.get(lsid) != number:
            raise no_such_transaction((lsid, number))

    async def _wait_for_primaries(self, name: str, db: str, cmd: dict[str, Any]) -> None:
        """During an election a command for the shards waits for the new primary
        (defaultFindReplicaSetHostTimeoutMS, 20 s) before it fails with
        FailedToSatisfyReadPreference; what mongos answers itself (hello, ping, ...) does not
        wait, nor does a command on a collection wait for shards that hold none of it."""
        if name.lower() not in WRITE_COMMANDS and name.lower() not in READ_COMMANDS:
            return
        coll = cmd.get(name)
        targets = (
            [self.replsets[sid] for sid in self.owner_ids(f"{db}.{coll}")]
            if isinstance(coll, str) and db not in CONFIG_DATABASES
            else list(self.replsets.values())
        )
        for rs in targets:
            if rs.primary_node is None:
                await rs.wait_primary(20.0)

    async def settle(self, name: str, cmd: dict[str, Any], reply: dict[str, Any]) -> None:
        if name.lower() not in WRITE_COMMANDS:
            return
        # Each shard's newest entry, taken before any wait: no other task ran since the handler
        # wrote.
        written = [
            (rs, rs.primary_node.oplog.last_key())
            for rs in self.replsets.values()
            if len(rs.members) > 1 and rs.primary_node is not None
        ]
        for rs, key in written:
            try:
                await rs.write_concern(cmd, reply, key)
            except MongoError as exc:
                shown = _as_seen_by_the_router(exc, rs.set_name)
                if shown is exc:
                    raise
                raise shown from exc

    def _participants(self, key: TxnKey) -> list[str]:
        return [
            sid for sid, s in sorted(self.shards.items()) if s.transactions.open(key) is not None
        ]

    async def cmd_commit_transaction(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        """One participant commits directly; several go through two-phase commit, as mongos's
        coordinator does: prepare everywhere, wait until every prepare is majority-committed (so
        a new primary still holds it), record the decision, then commit on each shard's current
        primary. A retried commit finishes a recorded decision (after a failover, on the shards'
        new primaries, which took the prepared transaction over)."""
        key = txn_key(cmd)
        decided = self.commit_decisions.get(key)
        if decided is not None:
            await self._write_decision(key, *decided)
            self.commit_decisions.pop(key, None)
            return {}
        participants = self._participants(key)
        if any(
            getattr(s.transactions.txns.get(key), "state", None) == "aborted"
            for s in self.shards.values()
        ):
            # A participant already ended it (killSessions, transactionLifetimeLimitSeconds): the
            # router, which knows every participant, aborts the rest rather than commit a part.
            for sid in participants:
                self.shards[sid].transactions.abort(key)
            raise no_such_transaction(key)
        if len(participants) == 1:
            self.shards[participants[0]].transactions.commit(key)
        elif participants:
            await self._two_phase_commit(key, participants)
        return {}

    async def _two_phase_commit(self, key: TxnKey, participants: list[str]) -> None:
        prepared = {sid: self.shards[sid].transactions.prepare(key) for sid in participants}
        commit_ts = max(prepared.values(), key=lambda ts: (ts.time, ts.inc))
        for sid, ts in prepared.items():
            await self._check_prepare_held(key, sid, ts, participants)
        self.commit_decisions[key] = (participants, commit_ts)
        await self.hang_while("hangBeforeWritingDecision")
        await self._write_decision(key, participants, commit_ts)
        # Written everywhere: a commit retried from now on finds no participant and answers ok.
        self.commit_decisions.pop(key, None)

    async def _check_prepare_held(
        self, key: TxnKey, sid: str, ts: Timestamp, participants: list[str]
    ) -> None:
        """Wait until the shard's prepare is majority-committed; when a failover lost it, the
        coordinator decides to abort, everywhere."""
        rs = self.replsets[sid]
        if len(rs.members) == 1:
            return
        await rs.wait_majority(ts_key(ts), timeout_s=30.0)
        await rs.wait_primary(20.0)
        if rs.primary_node is not None and rs.primary_node.transactions.open(key) is not None:
            return
        for other in participants:
            node = self.replsets[other].primary_node
            if node is not None and node.transactions.open(key) is not None:
                node.transactions.abort(key)
        raise no_such_transaction(key)

    async def _write_decision(
        self, key: TxnKey, participants: list[str], commit_ts: Timestamp
    ) -> None:
        for sid in participants:
            rs = self.replsets[sid]
            await rs.wait_primary(20.0)
            node = rs.primary  # FailedToSatisfyReadPreference if the shard still has none: retry
            txn = node.transactions.open(key)
            if txn is not None and txn.state == "prepared":
                node.transactions.commit_prepared(key, commit_ts)

    def kill_sessions(self, named: SessionsNamed) -> None:
        """Its own cursors, then on to every shard (cluster_kill_sessions forwards it), whose
        unprepared transactions of those sessions end; the router forgets them too."""
        super().kill_sessions(named)
        for shard in self.shards.values():
            shard.transactions.kill_sessions(named)
        for lsid in [lsid for lsid in self.txn_numbers if named(lsid, UNKNOWN_USER)]:
            del self.txn_numbers[lsid]

    async def cmd_abort_transaction(
        self, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        key = txn_key(cmd)
        participants = self._participants(key)
        if not participants and self.txn_numbers.get(key[0]) != key[1]:
            raise no_such_transaction(key)
        for sid in participants:
            self.shards[sid].transactions.abort(key)
        self.txn_numbers.pop(key[0], None)
        return {}


def _as_seen_by_the_router(exc: MongoError, shard: str) -> MongoError:
    """A shard's error as mongos reports it. A state-change error from a shard would make the
    driver mark mongos itself Unknown: mongos reports the shard connection it lost instead, which
    a driver retries (the retryable-write label) without doubting mongos."""
    if not has_category(exc.code, "NotPrimaryError"):
        return exc
    return MongoError(
        "HostUnreachable",
        f"write to shard {shard} was interrupted :: caused by :: {exc.code_name}: {exc.errmsg}",
    )
