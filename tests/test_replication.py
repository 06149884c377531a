"""simcluster replica sets against unmodified pymongo: secondaries, majority, stepdown, failover,
rollback.

Facts checked (see simcluster/replset.py for sources): secondaries hold byte-identical oplogs and
the same data; a secondary refuses writes (10107) and reads without secondaryOk (13435); a
stepdown elects a caught-up secondary in a new term that starts with a "new primary" noop; a
stopped primary is replaced after electionTimeout; a majority oplog read never shows what a
later rollback removes.
"""

from __future__ import annotations

import threading
from typing import Any

import bson
import pytest
import trio
from bson import Int64, Timestamp
from pymongo import ReadPreference
from pymongo.errors import NotPrimaryError
from pymongo.read_concern import ReadConcern

from simcluster import open_cluster
from tests.conftest import _close_all, client, poll_until, sync, wait_until


def _oplog(node):
    return node.oplog.read_after(0, 1 << 30)


def _docs(node, ns):
    coll = node.coll(ns)
    return {k: bson.encode(v) for k, v in coll.docs.items()} if coll else {}


async def _settled(rs):
    """Wait until every live member is in sync (caught up or rolled back) and has all the primary
    has."""
    await poll_until(
        lambda: (
            not any(
                m.up and (not m.in_sync or m.oplog.last_key() < rs.primary.oplog.last_key())
                for m in rs.members
            )
        ),
        10,
    )


async def test_secondaries_replicate_bytes_and_data():
    async with open_cluster(shards=2, members=3) as cluster:

        def work():
            c = client(cluster.uri)
            c.admin.command("enableSharding", "app")
            c.admin.command("shardCollection", "app.items", key={"_id": "hashed"})
            items = c.app.items
            items.insert_many([{"_id": i, "tags": ["a", "b"], "sub": {"x": 1}} for i in range(40)])
            items.update_many({}, {"$push": {"tags": "c"}, "$set": {"sub.y": 2}, "$inc": {"n": 1}})
            items.update_one({"_id": 3}, {"$pop": {"tags": 1}, "$unset": {"sub.x": ""}})
            items.replace_one({"_id": 4}, {"z": 1})
            items.delete_many({"_id": {"$in": [5, 6]}})
            items.create_index("n")
            c.app.create_collection("plain")
            c.app.command("collMod", "plain", validationLevel="moderate")
            c.app.plain.insert_one({"_id": 1})
            c.admin.command("renameCollection", "app.plain", to="app.renamed")
            c.app.create_collection("view", viewOn="items", pipeline=[{"$match": {"n": 1}}])
            with c.start_session() as s, s.start_transaction():
                items.insert_one({"_id": 100}, session=s)
                items.update_one({"_id": 7}, {"$set": {"t": 1}}, session=s)
                items.insert_one({"_id": 101}, session=s)
            # Read from a secondary through a replica set connection, as an analytics client does.
            rs = client(cluster.shard_uri("shard0"), readPreference="secondary")
            assert rs.app.items.count_documents({}) == len(
                cluster.replsets["shard0"].primary.coll("app.items").docs
            )

        await sync(work)
        for rs in cluster.replsets.values():
            await _settled(rs)
            primary = rs.primary
            for m in rs.members:
                assert _oplog(m) == _oplog(primary), (
                    "a secondary's oplog is the primary's, byte for byte"
                )
                for ns in ("app.items", "app.renamed", "app.view"):
                    assert _docs(m, ns) == _docs(primary, ns), (m.address, ns)

                def catalog(node):
                    return {
                        n: (c.uuid, sorted(c.indexes)) for n, c in node.dbs.get("app", {}).items()
                    }

                assert catalog(m) == catalog(primary)
        await sync(_close_all)


async def test_secondary_refuses_writes_and_unflagged_reads():
    async with open_cluster(shards=1, members=2) as cluster:
        rs = cluster.replsets["shard0"]
        secondary = rs.members[1]

        def work():
            direct = client(f"mongodb://{secondary.address}/?directConnection=true")
            hello = direct.admin.command("hello")
            assert hello["secondary"] and not hello["isWritablePrimary"]
            assert hello["primary"] == rs.members[0].address and hello["hosts"] == rs.hosts
            with pytest.raises(NotPrimaryError) as err:
                direct.t.c.insert_one({"x": 1})
            assert err.value.details["code"] == 10107  # NotWritablePrimary
            # pymongo sends primaryPreferred on a direct connection, so reads work ...
            assert direct.t.c.count_documents({}) == 0
            # ... and without a read preference the server refuses them (13435
            # NotPrimaryNoSecondaryOk).
            with pytest.raises(NotPrimaryError) as err2:
                direct.t.command({"find": "c", "$readPreference": {"mode": "primary"}})
            assert err2.value.details["code"] == 13435
            status = direct.admin.command("replSetGetStatus")
            assert [m["stateStr"] for m in status["members"]] == ["PRIMARY", "SECONDARY"]
            assert status["myState"] == 2
            rs.members[1].in_sync = False  # as a member that rejoined and is catching up
            assert direct.admin.command("replSetGetStatus")["myState"] == 3  # RECOVERING
            rs.members[1].in_sync = True

        await sync(work)
        await sync(_close_all)


async def test_stepdown_elects_a_new_primary_in_a_new_term_and_clients_follow():
    async with open_cluster(shards=1, members=3) as cluster:
        rs = cluster.replsets["shard0"]
        old = rs.primary

        def work():
            c = client(cluster.shard_uri("shard0"))
            c.t.c.insert_many([{"_id": i} for i in range(10)])
            c.admin.command("replSetStepDown", 60)
            # A retryable write finds the new primary (the driver rediscovers after
            # NotWritablePrimary).
            for i in range(10, 20):
                c.t.c.insert_one({"_id": i})
            hello = c.admin.command("hello")
            assert hello["primary"] != old.address
            return c.t.c.count_documents({})

        assert await sync(work) == 20
        new = rs.primary
        assert new is not old and rs.term == 2 and not old.is_primary
        entries = [bson.decode(e) for e in _oplog(new)]
        noop = next(e for e in entries if e["op"] == "n" and e["o"].get("msg") == "new primary")
        assert noop["t"] == 2 and all(e["t"] == 2 for e in entries if e["ts"] > noop["ts"])
        await _settled(rs)
        assert _oplog(old) == _oplog(new)
        await sync(_close_all)


async def test_failover_after_a_primary_stops_and_rollback_on_its_return():
    # Lag, so the primary holds w:1 writes no secondary has when it is stopped.
    async with open_cluster(
        shards=1, members=3, replication_lag_s=0.3, election_timeout_s=0.2
    ) as cluster:
        rs = cluster.replsets["shard0"]
        old = rs.primary

        def committed():
            c = client(cluster.uri)
            c.t.c.insert_many(
                [{"_id": i} for i in range(10)]
            )  # majority: on a secondary before the reply
            c.t.command({"insert": "c", "documents": [{"_id": "lost"}], "writeConcern": {"w": 1}})

        await sync(committed)
        lost_key = old.oplog.last_key()
        # A majority read of the oplog never returns the w:1 write, which the failover will roll
        # back.
        reader = (
            client(f"mongodb://{rs.members[1].address}/?directConnection=true")
            .local["oplog.rs"]
            .with_options(
                read_concern=ReadConcern("majority"),
                read_preference=ReadPreference.SECONDARY_PREFERRED,
            )
        )
        since = {"ts": {"$gte": Timestamp(lost_key >> 32, lost_key & 0xFFFFFFFF)}}
        seen = await sync(lambda: list(reader.find(since)))
        assert seen == []
        rs.stop_member(old)
        with trio.fail_after(10):
            await rs.wait_primary(10)
        assert rs.primary_node is not None and rs.primary_node is not old

        def after():
            c = client(cluster.uri)
            c.t.c.insert_one({"_id": "after"})
            return sorted(str(d["_id"]) for d in c.t.c.find())

        ids = await sync(after)
        assert "lost" not in ids and "after" in ids and len(ids) == 11
        await rs.restart_member(old)
        await _settled(rs)
        assert not old.is_primary and old.in_sync
        assert _oplog(old) == _oplog(rs.primary), (
            "the returning member rolled back to the primary's history"
        )
        assert _docs(old, "t.c") == _docs(rs.primary, "t.c")
        await sync(_close_all)


async def test_a_stepped_down_primary_never_shows_a_majority_reader_what_it_will_roll_back():
    """A forced stepdown leaves the old primary up, as a secondary, holding a w:1 write no other
    member has. Until it rolls back, a majority read on it must not return that write, however far
    the new primary's commit point moves: its commit point stays on its own branch (a secondary
    does not advance it past its lastApplied's term; the server's jstest
    secondaries_do_not_advance_commit_point_to_greater_term). Nor does the write count toward the
    set's majority."""
    async with open_cluster(shards=1, members=3, replication_lag_s=0.5) as cluster:
        rs = cluster.replsets["shard0"]
        old = rs.primary
        await sync(lambda: client(cluster.uri).t.c.insert_many([{"_id": i} for i in range(5)]))
        old.insert_one("t.c", {"_id": "doomed"}, {})  # w:1: the secondaries trail by 0.5 s
        doomed = old.oplog.last_key()
        await rs.step_down(old, 60, 0, True)
        new = rs.primary
        assert new is not old and not new.oplog.contains(doomed)
        # The old primary would find out at its next sync, after the lag: it is held back
        # (stopReplProducer) to keep the window open. Whenever a member applies entries the commit
        # point is recomputed.
        old.fail_points["stopReplProducer"] = {"mode": "alwaysOn", "data": {}}
        rs.member_applied()
        assert rs.commit_key() < doomed, (
            "a write only the old primary has is not majority committed"
        )
        reader = (
            client(f"mongodb://{old.address}/?directConnection=true")
            .local["oplog.rs"]
            .with_options(
                read_concern=ReadConcern("majority"),
                read_preference=ReadPreference.SECONDARY_PREFERRED,
            )
        )
        since = {"ts": {"$gte": Timestamp(doomed >> 32, doomed & 0xFFFFFFFF)}}
        # The new primary's entries reach the third member: the set's commit point passes the
        # doomed write's time, and still the old primary's majority reads stop short of it.
        await poll_until(lambda: rs.commit_key() > doomed, 10, interval=0.01)
        assert old.oplog.contains(doomed)
        assert await sync(lambda: list(reader.find(since))) == []
        old.fail_points.pop("stopReplProducer")
        await _settled(rs)
        assert not old.oplog.contains(doomed) and not old.select("t.c", {"_id": "doomed"})
        await sync(_close_all)


async def test_a_member_that_lacks_a_committed_write_is_never_elected():
    """Votes go only to a candidate whose oplog is as new as the voter's, so the set rather stays
    without a primary than elects a member that would roll back a majority-committed write.

    C stops fetching (the stopReplProducer fail point), a majority write lands on A and B, A steps
    down (B wins), then B steps down too: C alone could stand, and it lacks the write."""
    async with open_cluster(shards=1, members=3, election_timeout_s=0.1) as cluster:
        rs = cluster.replsets["shard0"]
        a, b, c = rs.members

        def write():
            client(f"mongodb://{c.address}/?directConnection=true").admin.command(
                "configureFailPoint", "stopReplProducer", mode="alwaysOn"
            )
            client(cluster.uri).t.c.insert_one({"_id": "committed"})  # w: majority, on A and B

        await sync(write)
        committed = a.oplog.last_key()
        assert b.oplog.contains(committed) and not c.oplog.contains(committed)
        assert rs.commit_key() >= committed
        await rs.step_down(a, 60, 0, True)
        assert rs.primary is b
        await poll_until(lambda: a.oplog.last_key() == b.oplog.last_key(), 10)  # A follows B
        await rs.step_down(b, 1, 0, True)  # C is the only member that may stand, for a second
        await trio.sleep(0.5)  # elections come and go every 0.1 s
        assert rs.primary_node is None, "C has not the votes of A and B"
        await rs.wait_primary(10)  # B may stand again after its second
        assert rs.primary is b and rs.primary.oplog.contains(committed)
        c.fail_points.pop("stopReplProducer")
        await _settled(rs)
        assert all(m.select("t.c", {"_id": "committed"}) for m in rs.members)
        await sync(_close_all)


async def test_a_retried_write_statement_is_applied_once():
    """The server keeps retryable-write results per (lsid, txnNumber, stmtId) (config.transactions):
    the same statement sent again is acknowledged, not applied again, also by a new primary."""
    bump = {
        "update": "c",
        "updates": [{"q": {"_id": 1}, "u": {"$inc": {"n": 1}}}],
        "txnNumber": Int64(103),
    }
    async with open_cluster(shards=1, members=3) as cluster:
        c = client(cluster.uri)
        # pymongo puts its lsid on each command; the txnNumbers are ours, above any it used itself.
        session = c.start_session()

        def send_twice(cmd):
            return [
                c.t.command(cmd, session=session)["n"] for _ in range(2)
            ]  # the statement, then its retry

        def work():
            c.t.c.insert_one({"_id": 1, "n": 0})
            assert send_twice(
                {"insert": "c", "documents": [{"_id": 2}], "txnNumber": Int64(101)}
            ) == [1, 1]
            assert send_twice(
                {"delete": "c", "deletes": [{"q": {"_id": 2}, "limit": 1}], "txnNumber": Int64(102)}
            ) == [1, 1]
            assert send_twice(bump) == [1, 1]
            return c.t.c.find_one({"_id": 1})["n"], c.t.c.count_documents({})

        assert await sync(work) == (1, 1)
        rs = cluster.replsets["shard0"]
        await _settled(rs)
        await rs.step_down(rs.primary, 60, 10, False)

        def retry_on_the_new_primary():
            c.t.command(bump, session=session)
            return c.t.c.find_one({"_id": 1})["n"]

        assert await sync(retry_on_the_new_primary) == 1
        await sync(session.end_session)
        await sync(_close_all)


async def test_prepared_transaction_survives_a_failover_between_prepare_and_commit():
    """mongos's coordinator records its commit decision once every prepare is majority-committed;
    a shard primary that dies before the decision reaches it is replaced by a member that took the
    prepared transaction over from the oplog, and the commit lands there, exactly once."""
    # Short periodic noops: the native stream waits for an idle shard's noop, as mongos does.
    async with open_cluster(
        shards=2, members=3, election_timeout_s=0.2, periodic_noop_s=0.2
    ) as cluster:
        rs = cluster.replsets["shard0"]
        old = rs.primary_node

        def work() -> None:
            c = client(cluster.uri)
            c.admin.command("shardCollection", "tx.h", key={"_id": "hashed"})
            start = c.admin.command("ping")["operationTime"]
            native = c.watch(start_at_operation_time=start, max_await_time_ms=200)
            c.admin.command("configureFailPoint", "hangBeforeWritingDecision", mode="alwaysOn")
            done: list[Any] = []

            def commit() -> None:
                with c.start_session() as s:
                    s.start_transaction()
                    c.tx.h.insert_many([{"_id": 1000 + j} for j in range(8)], session=s)
                    s.commit_transaction()
                done.append(True)

            worker = threading.Thread(target=commit)
            worker.start()
            wait_until(
                lambda: cluster.mongos.commit_decisions, timeout=20
            )  # the coordinator decided
            trio.from_thread.run_sync(rs.stop_member, old)  # before the decision reached shard0
            wait_until(lambda: rs.primary_node not in (None, old), timeout=20)  # a new primary
            c.admin.command("configureFailPoint", "hangBeforeWritingDecision", mode="off")
            worker.join(30)
            assert done == [True]
            assert sorted(d["_id"] for d in c.tx.h.find({"_id": {"$gte": 1000}})) == list(
                range(1000, 1008)
            )
            on_new = [d["_id"] for d in rs.primary_node.select("tx.h", {})]
            assert on_new, "shard0 owns part of the transaction"
            seen = []
            while len(seen) < 8:
                change = native.try_next()
                if change is not None and change["operationType"] == "insert":
                    seen.append(change["documentKey"]["_id"])
            assert sorted(seen) == list(
                range(1000, 1008)
            )  # each write once, after the failover too
            native.close()

        await sync(work)
        await sync(_close_all)


async def test_secondaries_keep_the_pre_images_the_primary_kept():
    """Pre-images are written on every member as it applies the oplog (as in
    config.system.preimages), also for a transaction's writes, so a new primary still has them."""
    async with open_cluster(shards=1, members=2) as cluster:
        rs = cluster.replsets["shard0"]

        def work() -> None:
            c = client(cluster.uri)
            c.pre.create_collection("c", changeStreamPreAndPostImages={"enabled": True})
            c.pre.c.insert_many([{"_id": 1, "v": 1}, {"_id": 2, "v": 2}])
            c.pre.c.update_one({"_id": 1}, {"$set": {"v": 10}})
            with c.start_session() as s:
                s.with_transaction(
                    lambda s: (
                        c.pre.c.delete_one({"_id": 2}, session=s),
                        c.pre.c.update_one({"_id": 1}, {"$inc": {"v": 1}}, session=s),
                    )
                )
            primary, secondary = rs.members
            wait_until(lambda: len(secondary.images) == len(primary.images) == 3, timeout=10)
            assert secondary.images == primary.images
            assert sorted(before["v"] for before, _ in primary.images.values()) == [1, 2, 10]
            assert sorted(index for _, _, index in primary.images) == [0, 0, 1]

        await sync(work)
        await sync(_close_all)


async def test_a_migration_commits_only_copies_no_failover_can_roll_back():
    """A chunk changes hands only once the recipient's copies are majority-committed, with the
    collection's writes held meanwhile. The recipient's secondaries stop fetching, so its copies
    stay on its primary alone; that primary steps down and rolls them back: the migration fails
    (OperationFailed) and the chunk, its documents and the write held during it stay on the donor.
    (Committed at once, the migration lost all fifty documents.)"""
    async with open_cluster(shards=2, members=3, election_timeout_s=0.1) as cluster:
        c = client(cluster.uri)

        def setup():
            c.admin.command("balancerStop")
            c.admin.command("enableSharding", "mig")
            c.admin.command("shardCollection", "mig.c", key={"k": 1})
            c.mig.c.insert_many([{"_id": i, "k": i} for i in range(50)])
            return c.config.chunks.find_one({})["shard"]

        donor_id = await sync(setup)
        recipient_id = next(s for s in cluster.replsets if s != donor_id)
        rs = cluster.replsets[recipient_id]
        old = rs.primary
        for member in rs.members:
            if member is not old:
                member.fail_points["stopReplProducer"] = {"mode": "alwaysOn", "data": {}}
        outcome: dict[str, Any] = {}

        def move():
            try:
                c.admin.command("moveChunk", "mig.c", find={"k": 0}, to=recipient_id)
            except Exception as exc:  # noqa: BLE001 - the outcome is what the test checks
                outcome["error"] = exc

        def write_during_migration():
            c.mig.c.insert_one({"_id": 100, "k": 100})
            outcome["written_while_migrating"] = cluster.mongos.migrating("mig.c")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sync, move)
            await poll_until(
                lambda: len(old.select("mig.c", {})) == 50, 10
            )  # cloned, not committed
            nursery.start_soon(sync, write_during_migration)
            await trio.sleep(0.3)
            assert cluster.mongos.migrating("mig.c") and "written_while_migrating" not in outcome
            # The chunk still reads as the donor's: the recipient's copies are orphans.
            assert await sync(lambda: c.mig.c.count_documents({})) == 50
            await rs.step_down(old, 60, 0, True)
            for member in rs.members:
                member.fail_points.pop("stopReplProducer", None)
        error = outcome["error"]
        assert error.code == 96 and "migrate failed" in str(error), error  # OperationFailed
        assert outcome["written_while_migrating"] is False
        await _settled(rs)
        assert all(
            not m.select("mig.c", {}) for m in rs.members
        )  # rolled back, or deleted as orphans

        def check():
            assert {d["_id"] for d in c.mig.c.find()} == set(range(50)) | {100}
            assert c.config.chunks.find_one({})["shard"] == donor_id
            c.admin.command(
                "moveChunk", "mig.c", find={"k": 0}, to=recipient_id
            )  # now it goes through
            assert {d["_id"] for d in c.mig.c.find()} == set(range(50)) | {100}

        await sync(check)
        await poll_until(lambda: all(len(m.select("mig.c", {})) == 51 for m in rs.members), 10)
        await sync(_close_all)
