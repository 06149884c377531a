"""A shard's replica set: its members, which one is primary, the majority commit point, elections.

Facts kept from the server (replication_coordinator_impl.cpp, and the docs on elections):
- the commit point is the newest optime a majority of the set's voting members have applied;
  majority reads (and change streams) see nothing newer, so nothing they return can roll back;
- a primary that is stopped is replaced after electionTimeoutMillis by the live member with the
  newest oplog, if a majority of members is up; each election starts a new term, and the new
  primary writes a `{msg: "new primary"}` noop;
- a member votes for a candidate only if the candidate's last entry is at least as new as its
  own, by (term, timestamp); a candidate needs a majority of votes. So a member that lacks a
  majority-committed entry is never elected (some member of every majority has it): with no
  other member electable, the set stays without a primary until one is (topology_coordinator.cpp,
  processReplSetRequestVotes);
- `replSetStepDown` waits up to secondaryCatchUpPeriodSecs for an electable secondary to catch up
  (ExceededTimeLimit otherwise, unless `force`), and the old primary may not stand again for
  the stepdown period;
- a member that comes back with oplog entries the new primary never had rolls them back. The
  simulator does it by resyncing from the primary (the state it reaches is the server's);
- until then, such entries are on another branch: they count toward no majority, and the member's
  own commit point stops before them (a secondary does not advance its commit point to a greater
  term than its lastApplied's:
  jstests/replsets/secondaries_do_not_advance_commit_point_to_greater_term), so a majority read on
  it never returns them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

import trio
from bson import ObjectId

from mongoformats.errors import MongoError
from simcluster.roles import ReplMember

__all__ = ["Primaries", "ReplicaSet"]

log = logging.getLogger("simcluster")

# The members' type: what a router reaches through a set is the member class itself.
M = TypeVar("M", bound=ReplMember)


class ReplicaSet(Generic[M]):
    def __init__(
        self,
        set_name: str,
        members: list[M],
        *,
        lag_s: float = 0.0,
        election_timeout_s: float = 10.0,
    ) -> None:
        self.set_name = set_name
        self.members = members
        self.lag_s = lag_s
        self.election_timeout_s = election_timeout_s
        self.term = 1
        self.primary_node: M | None = members[0]
        self._commit = 0
        self._changed = trio.Event()  # set (and replaced) when the commit point or a role changes
        self.nursery: trio.Nursery | None = None  # where elections and restarts run (the cluster's)
        for m in members:
            m.replset = self

    # -- roles -------------------------------------------------------------------------------------

    @property
    def primary(self) -> M:
        """The primary, for a router sending a write; FailedToSatisfyReadPreference during an
        election."""
        if self.primary_node is None:
            raise MongoError(
                "FailedToSatisfyReadPreference",
                "Could not find host matching read preference "
                f'{{ mode: "primary" }} for set {self.set_name}',
            )
        return self.primary_node

    async def wait_primary(self, timeout_s: float) -> None:
        with trio.move_on_after(timeout_s):
            while self.primary_node is None:
                await self._changed.wait()

    @property
    def hosts(self) -> list[str]:
        return [m.address for m in self.members]

    def _wake(self) -> None:
        """Wake everything waiting on the set: for a primary, a caught-up member, the commit
        point."""
        self._changed.set()
        self._changed = trio.Event()

    def notify(self) -> None:
        """A role changed: wake the set's waiters and the drivers' awaitable hellos."""
        self._wake()
        for m in self.members:
            m.bump_topology()

    # -- the commit point --------------------------------------------------------------------------

    @property
    def majority(self) -> int:
        return len(self.members) // 2 + 1

    def commit_key(self) -> int:
        if len(self.members) == 1:  # a set of one commits each write as it is written
            return self.members[0].oplog.last_key()
        return self._commit

    def member_applied(self) -> None:
        """Recompute the commit point after a member applied entries (it never moves back)."""
        keys = sorted((m.applied_key() for m in self.members if m.up and m.in_sync), reverse=True)
        if len(keys) >= self.majority and keys[self.majority - 1] > self._commit:
            self._commit = keys[self.majority - 1]
            self._wake()

    async def wait_commit_beyond(self, key: int, deadline: float) -> bool:
        if len(self.members) == 1:
            return await self.members[0].oplog.wait_beyond(key, deadline)
        while self._commit <= key:
            with trio.move_on_at(deadline):
                await self._changed.wait()
                continue
            return False
        return True

    async def wait_changed(self, deadline: float) -> bool:
        """Wait for the next change of the commit point or of a role; False at the deadline."""
        with trio.move_on_at(deadline):
            await self._changed.wait()
            return True
        return False

    async def wait_majority(self, key: int, timeout_s: float = math.inf) -> bool:
        """writeConcern majority: wait until the commit point reaches `key`."""
        return await self.wait_commit_beyond(key - 1, trio.current_time() + timeout_s)

    async def write_concern(self, cmd: dict[str, Any], reply: dict[str, Any], key: int) -> None:
        """Wait out a write's concern; `key` is its (newest) oplog entry.

        The implicit default is majority (5.0+); w: 0/1 return at once. A wtimeout is reported as
        the server does: the write stands, with a writeConcernError (64). A write that a failover
        rolled back fails with InterruptedDueToReplStateChange, which drivers retry.
        """
        wc = cmd.get("writeConcern") or {}
        if wc.get("w", "majority") in (0, 1):
            return
        if not await self.wait_majority(key, _wtimeout_s(wc)):
            reply["writeConcernError"] = _wtimeout_error()
            return
        await self.wait_primary(20.0)
        if not self._primary_holds(key):
            raise MongoError(
                "InterruptedDueToReplStateChange",
                "operation was interrupted because the primary "
                "stepped down or was stopped before the write was majority committed",
            )

    def _newest_live(self) -> M:
        """The primary, else the newest live member (same bytes up to the commit point, which is
        all a majority reader sees)."""
        live = [m for m in self.members if m.up] or self.members
        return self.primary_node or max(live, key=lambda m: m.oplog.last_key())

    def _primary_holds(self, key: int) -> bool:
        """Whether the current primary's history has the entry `key` (or has truncated past it):
        not so when a failover rolled the write back."""
        primary = self.primary_node
        if primary is None:
            return False
        return primary.oplog.contains(key) or key < primary.oplog.first_key()

    @property
    def oplog(self) -> Any:
        """The oplog a router reads: the primary's, else the newest live member's (same bytes up to
        the commit point, which is all a majority reader sees)."""
        return self._newest_live().oplog

    @property
    def images(self) -> Any:
        """Pre- and post-images, from the same member `oplog` reads."""
        return self._newest_live().applier.images

    @property
    def clock(self) -> Any:
        return self.members[0].clock

    # -- elections ---------------------------------------------------------------------------------

    def elect(self, *, exclude: M | None = None) -> M | None:
        """Make the live member with the newest oplog primary, if a majority of members vote for
        it."""
        up = [m for m in self.members if m.up]
        newest = {m: m.oplog.last_optime() for m in up}
        candidates = [
            m for m in self._electable(up, exclude) if self._votes(m, newest) >= self.majority
        ]
        if not candidates:
            return None
        winner = max(candidates, key=lambda m: (newest[m], -self.members.index(m)))
        self._mark_branches(winner)
        self.term += 1
        self._log_election(winner)
        for m in self.members:
            m.state = "SECONDARY"
        winner.in_sync = True
        winner.become_primary(self.term, ObjectId(f"7fffffff{self.term:016x}"))
        self.primary_node = winner
        self.notify()
        return winner

    def _electable(self, up: list[M], exclude: M | None) -> list[M]:
        """The live members that may stand: in step and not frozen. A member back from a restart
        catches up before it stands, unless no live member is in step (the whole set was down):
        then none has more to learn, and the vote rule alone picks the one with the newest oplog,
        as the set does after a full restart."""
        now = trio.current_time()
        whole_set_restarted = not any(m.in_sync for m in up)
        return [
            m
            for m in up
            if m is not exclude and (m.in_sync or whole_set_restarted) and m.frozen_until <= now
        ]

    @staticmethod
    def _votes(candidate: M, newest: dict[M, tuple[int, int]]) -> int:
        """The live members whose last entry is no newer than the candidate's."""
        return sum(last <= newest[candidate] for last in newest.values())

    def _mark_branches(self, winner: M) -> None:
        """Whoever holds entries past the winner's last one holds what the new history never
        has."""
        branch = winner.oplog.last_key()
        winner.branch_end = None
        for m in self.members:
            if m.oplog.last_key() > branch:
                m.branch_end = branch if m.branch_end is None else min(m.branch_end, branch)

    def _log_election(self, winner: M) -> None:
        log.info(
            "%s: %s elected primary in term %d (its last entry %s)",
            self.set_name,
            winner.address,
            self.term,
            winner.oplog.last_ts(),
        )
        log.debug(
            "%s: members' last entries, up, in sync, branch end: %s; commit point %s",
            self.set_name,
            {m.address: (m.oplog.last_key(), m.up, m.in_sync, m.branch_end) for m in self.members},
            self._commit,
        )

    async def _elect_after_timeout(self) -> None:
        while self.primary_node is None:
            await trio.sleep(self.election_timeout_s)
            self.elect()

    async def step_down(self, node: M, stepdown_s: float, catch_up_s: float, force: bool) -> None:
        if node is not self.primary_node:
            raise MongoError("NotWritablePrimary", "not primary so can't step down")
        target = node.oplog.last_key()

        def caught_up() -> bool:
            return any(
                m is not node and m.up and m.oplog.last_key() >= target for m in self.members
            )

        with trio.move_on_after(catch_up_s):
            while not caught_up():
                await self._changed.wait()
        if not caught_up() and not force:
            raise MongoError(
                "ExceededTimeLimit",
                "No electable secondaries caught up as of "
                f"{trio.current_time():.3f}. Please use the replSetStepDown command with "
                "the argument {force: true} to force node to step down.",
            )
        node.frozen_until = trio.current_time() + stepdown_s
        node.state = "SECONDARY"
        self.primary_node = None
        if self.elect(exclude=node) is None:
            self.notify()
            self._start(self._elect_after_timeout)

    # -- stopping and restarting members -----------------------------------------------------------

    def stop_member(self, node: M) -> None:
        """Like killing the mongod: connections drop; its data and oplog stay (they are on disk)."""
        node.stop()
        self._lost(node)

    async def restart_member(self, node: M) -> None:
        """Start a stopped member again on its port; it rejoins as a secondary and catches up."""
        assert self.nursery is not None
        self._set_rejoining(node)
        await self.nursery.start(node.serve)
        self._rejoined()

    def pause_member(self, node: M) -> None:
        """Like SIGSTOP on the mongod, or a network partition that drops its packets: its
        connections stay open and go unanswered (a client learns only by its own timeout); to the
        set it is down."""
        node.pause()
        self._lost(node)

    def resume_member(self, node: M) -> None:
        """SIGCONT, or the partition healed: it answers what waited, rejoins as a secondary and
        catches up (rolling back what it wrote as a primary that nobody else has)."""
        self._set_rejoining(node)
        node.resume()
        self._rejoined()

    def _lost(self, node: M) -> None:
        node.up = False
        if node is self.primary_node:
            self.primary_node = None
            node.state = "SECONDARY"
            self.notify()
            self._start(self._elect_after_timeout)

    @staticmethod
    def _set_rejoining(node: M) -> None:
        # It catches up from the primary before it serves reads or stands (see `elect` for a set
        # with no primary to catch up from).
        node.up, node.in_sync, node.state = True, False, "SECONDARY"

    def _rejoined(self) -> None:
        self.notify()
        if self.primary_node is None:
            self._start(self._elect_after_timeout)

    def _start(self, fn: Any) -> None:
        if self.nursery is not None:
            self.nursery.start_soon(fn)


class Primaries(Mapping[str, M]):
    """shard id -> that shard's current primary: what a router sends writes to. Looked up on each
    access, so a router keeps routing across elections."""

    def __init__(self, replsets: dict[str, ReplicaSet[M]]) -> None:
        self.replsets = replsets

    def __getitem__(self, shard_id: str) -> M:
        return self.replsets[shard_id].primary

    def __iter__(self) -> Iterator[str]:
        return iter(self.replsets)

    def __len__(self) -> int:
        return len(self.replsets)


def _wtimeout_error() -> dict[str, object]:
    """A write concern's wtimeout as the server reports it: the write stands, with this error."""
    return {
        "code": 64,
        "codeName": "WriteConcernFailed",
        "errmsg": "waiting for replication timed out",
        "errInfo": {"wtimeout": True},
    }


def _wtimeout_s(wc: dict[str, Any]) -> float:
    """A write concern's wtimeout in seconds; none (or 0) waits without end."""
    timeout = wc.get("wtimeout") or 0
    return timeout / 1000 if timeout else math.inf
