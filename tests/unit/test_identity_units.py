"""The pure parts behind identity and secrets: URI redaction, signed cluster time, the built-in
roles' privileges, which sessions a kill names, a connection's identity. No sockets."""

from __future__ import annotations

import uuid

import pytest
from bson import Binary, Int64, Timestamp

from mongoformats.errors import MongoError
from mongoformats.privileges import allows, privileges_of_roles
from mongoformats.sessions import sessions_named, user_digest, user_identity
from simcluster.cluster_time import ClusterTimeKey, gossip_in
from wireproxy.config import ProxyConfig
from wireproxy.redact import redact_uri
from wireproxy.session import identity_of
from wireproxy.upstream_target import UpstreamTarget

CLUSTER = {"cluster": True}


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("mongodb://cdc:PASSWORD@127.0.0.1:27017/", "mongodb://cdc:***@127.0.0.1:27017/"),
        ("mongodb://cdc:PASS%40WORD@a:1,b:2/db?tls=true", "mongodb://cdc:***@a:1,b:2/db?tls=true"),
        (
            "mongodb+srv://cdc:PASSWORD@cluster.example.com",
            "mongodb+srv://cdc:***@cluster.example.com",
        ),
        (
            "mongodb://cdc@host/?authMechanism=MONGODB-X509",
            "mongodb://cdc@host/?authMechanism=MONGODB-X509",
        ),
        (
            "mongodb://host/?authMechanismProperties=AWS_SESSION_TOKEN:PASSWORD&tls=true",
            "mongodb://host/?authMechanismProperties=***&tls=true",
        ),
        (
            "mongodb://u:p@h/?tlsCertificateKeyFilePassword=PASSWORD",
            "mongodb://u:***@h/?tlsCertificateKeyFilePassword=***",
        ),
        # Malformed (unescaped '@', '/', '?' in the password), as an error message might quote one.
        ("mongodb://cdc:PASS@WORD@host:1/", "mongodb://cdc:***@host:1/"),
        ("mongodb://cdc:PASS/WORD@host", "mongodb://cdc:***@host"),
        ("mongodb://cdc:PASS?WORD@host/?x=1", "mongodb://cdc:***@host/?x=1"),
        ("mongodb://127.0.0.1:27017", "mongodb://127.0.0.1:27017"),
    ],
)
def test_redact_uri_hides_passwords_and_secret_options(uri: str, shown: str) -> None:
    assert redact_uri(uri) == shown


def test_settings_and_credentials_never_show_the_password() -> None:
    config = ProxyConfig(upstream="mongodb://cdc:PASSWORD@127.0.0.1:1/", listen_port=0)
    for text in (repr(config), str(config), repr(UpstreamTarget.from_uri(config.upstream))):
        assert "PASSWORD" not in text and "cdc" in text
    with pytest.raises(ValueError) as info:
        ProxyConfig(upstream="mongodb://cdc:PASS:WORD@host:notaport/")
    assert "PASS" not in str(info.value)


KEY = ClusterTimeKey(key_id=7, key=b"k" * 20)
NOW = Timestamp(1_700_000_000, 5)
AHEAD = Timestamp(1_700_000_100, 1)


def signed(ts: Timestamp, key: ClusterTimeKey = KEY) -> dict:
    return {"clusterTime": ts, "signature": key.sign(ts)}


def dummy(ts: Timestamp) -> dict:
    return {"clusterTime": ts, "signature": {"hash": Binary(bytes(20), 0), "keyId": Int64(0)}}


def gossip(
    ct: dict, *, key: ClusterTimeKey | None = KEY, authenticated: bool = False, v8: bool = False
) -> Timestamp | None:
    return gossip_in(
        ct, key=key, authenticated=authenticated, newest=NOW, missing_signature_parses=v8
    )


def test_signed_cluster_time_follows_the_servers_rules() -> None:
    assert gossip(signed(AHEAD)) == AHEAD
    # One proof covers the times sharing all but the low 16 bits (time_proof_service.cpp).
    assert KEY.proof(Timestamp(AHEAD.time, 1)) == KEY.proof(Timestamp(AHEAD.time, 0xFFFF))
    assert KEY.proof(AHEAD) != ClusterTimeKey(7, b"x" * 20).proof(AHEAD)
    assert gossip(dummy(AHEAD)) is None  # an unauthenticated client's unsigned time: ignored
    assert gossip(dummy(AHEAD), key=None) == AHEAD  # no authorization: taken
    for ct, authenticated, code in (
        (dummy(AHEAD), True, 211),
        (signed(AHEAD, ClusterTimeKey(8, KEY.key)), False, 211),
        ({"clusterTime": AHEAD, "signature": {**KEY.sign(NOW)}}, False, 204),
        ({"clusterTime": AHEAD}, False, 4),
        ({"signature": KEY.sign(AHEAD)}, False, 4),
        ({"clusterTime": 5, "signature": KEY.sign(AHEAD)}, False, 14),
        ({"clusterTime": AHEAD, "signature": {"hash": Binary(b"x", 0), "keyId": 7}}, False, 12),
    ):
        with pytest.raises(MongoError) as info:
            gossip(ct, authenticated=authenticated)
        assert info.value.code == code, ct
    # A time the process has already seen moves nothing: accepted unchecked.
    assert (
        gossip({"clusterTime": NOW, "signature": {"hash": Binary(b"y" * 20, 0), "keyId": 99}})
        == NOW
    )
    # From 8.0 a missing signature parses: no proof.
    assert gossip({"clusterTime": AHEAD}, v8=True) is None
    with pytest.raises(MongoError) as info:
        gossip({"clusterTime": AHEAD}, v8=True, authenticated=True)
    assert info.value.code == 211


def test_built_in_roles_follow_the_servers_definitions() -> None:
    """src/mongo/db/auth/builtin_roles.yml: killAnySession and killAnyCursor are hostManager's,
    inprog clusterMonitor's; clusterAdmin and root include both; no read or write role holds
    them."""

    def holds(roles: list[tuple[str, str]], action: str) -> bool:
        return allows(privileges_of_roles(roles), (action,), CLUSTER)

    for role in (
        "read",
        "readWrite",
        "readAnyDatabase",
        "readWriteAnyDatabase",
        "dbAdmin",
        "dbAdminAnyDatabase",
    ):
        db = "admin" if "Any" in role else "shop"
        for action in ("killAnySession", "killAnyCursor", "inprog", "setParameter", "getParameter"):
            assert not holds([(role, db)], action), (role, action)
    assert holds([("hostManager", "admin")], "killAnySession") and holds(
        [("hostManager", "admin")], "killAnyCursor"
    )
    assert not holds([("hostManager", "admin")], "inprog")
    assert holds([("clusterMonitor", "admin")], "inprog") and not holds(
        [("clusterMonitor", "admin")], "setParameter"
    )
    for role in ("clusterAdmin", "root"):
        for action in (
            "killAnySession",
            "killAnyCursor",
            "inprog",
            "setParameter",
            "appendOplogNote",
        ):
            assert holds([(role, "admin")], action), (role, action)
    assert not holds(
        [("root", "admin")], "advanceClusterTime"
    )  # the internal __system user's alone
    monitor = privileges_of_roles(
        [("clusterMonitor", "admin")]
    )  # includes read on config and local
    assert allows(monitor, ("find",), {"db": "config", "collection": "chunks"})
    assert not allows(monitor, ("find",), {"db": "shop", "collection": "orders"})
    # Chunk commands act on the namespace (any_normal), not the cluster.
    manager = privileges_of_roles([("clusterManager", "admin")])
    assert allows(manager, ("moveChunk", "splitChunk"), {"db": "shop", "collection": "orders"})


def test_kill_sessions_names_others_sessions_only_for_kill_any_session() -> None:
    mine, hers = uuid.uuid4().bytes, uuid.uuid4().bytes
    alice, bob = user_identity("alice", "admin"), user_identity("bob", "admin")
    by_id = {"killSessions": [{"id": Binary(hers, 4)}]}
    assert not sessions_named(by_id, bob, access_control=True)(hers, alice)
    assert sessions_named(by_id, bob, access_control=True, kill_any=True)(hers, alice)
    assert not sessions_named(by_id, bob, access_control=True, kill_any=True)(mine, bob)
    own = sessions_named({"killSessions": []}, bob, access_control=True, kill_any=True)
    assert own(mine, bob) and not own(hers, alice)
    named = sessions_named(
        {"killAllSessions": [{"user": "alice", "db": "admin"}]}, bob, access_control=True
    )
    assert named(hers, alice) and not named(mine, bob)
    by_lsid = {"lsid": {"id": Binary(hers, 4), "uid": user_digest(alice)}}
    for patterns, hers_named, mine_named in (
        ([], True, True),
        ([by_lsid], True, False),
        ([{"uid": user_digest(bob)}], False, True),
        ([{"users": [{"user": "alice", "db": "admin"}]}], True, False),
    ):
        named = sessions_named({"killAllSessionsByPattern": patterns}, bob, access_control=True)
        assert (named(hers, alice), named(mine, bob)) == (hers_named, mine_named), patterns


def test_identity_of_a_connection() -> None:
    assert identity_of([]) is None and identity_of(None) is None
    assert identity_of([{"user": "alice", "db": "admin"}]) == "alice@admin"
    assert (
        identity_of([{"user": "b", "db": "shop"}, {"user": "a", "db": "admin"}]) == "a@admin,b@shop"
    )
    assert identity_of([{"user": "alice", "db": "admin"}]) != identity_of(
        [{"user": "alice", "db": "shop"}]
    )
