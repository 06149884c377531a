"""Signed cluster time: the `$clusterTime` a cluster with authorization gossips, and the checks on
the one a client sends back. Sans-IO.

The server's rules (facts from src/mongo/db/vector_clock.cpp SignedComponentFormat,
logical_time_validator.cpp, time_proof_service.cpp, logical_time.cpp, and the jstest
jstests/sharding/advance_cluster_time_action_type.js):

  - Every process of a cluster signs with the cluster's key (admin.system.keys: a random 20-byte
    key and its keyId). The signature of a time is `{hash: HMAC-SHA1(key, t), keyId}`, where t is
    the time's 64 bits (seconds << 32 | increment) with the low 16 set, little-endian: one proof
    covers a range of times.
  - Without authorization every client may move the clock: replies carry a dummy signature
    (20 zero bytes, keyId 0) and nothing is checked. So do clients holding advanceClusterTime
    with authorization on (only the internal __system user holds it).
  - With authorization on, a time sent with no proof or the dummy one by a client that has not
    authenticated is ignored (not gossiped in, no error). Otherwise a time ahead of what the
    process has seen must carry a valid signature: an unknown keyId is KeyNotFound (211), a hash
    that does not match TimeProofMismatch (204). A time not ahead is accepted unchecked (it moves
    nothing). A `$clusterTime` without `signature` fails to parse before 8.0 (NoSuchKey); from
    8.0 it is a time without a proof.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bson import Binary, Int64, Timestamp

from mongoformats.errors import MongoError

__all__ = ["DUMMY_SIGNATURE", "ClusterTimeKey", "gossip_in"]

_HASH_BYTES = 20  # SHA-1
_RANGE_MASK = 0xFFFF
DUMMY_SIGNATURE: dict[str, Any] = {"hash": Binary(bytes(_HASH_BYTES), 0), "keyId": Int64(0)}


@dataclass(frozen=True)
class ClusterTimeKey:
    """The cluster's signing key (what admin.system.keys holds), shared by all its processes."""

    key_id: int
    key: bytes

    @classmethod
    def generate(cls, now: Timestamp) -> ClusterTimeKey:
        # The server numbers a key by the cluster time it was made at.
        return cls(key_id=(now.time << 32) | now.inc, key=secrets.token_bytes(_HASH_BYTES))

    def proof(self, ts: Timestamp) -> bytes:
        ceiling = ((ts.time << 32) | ts.inc) | _RANGE_MASK
        return hmac.new(self.key, struct.pack("<Q", ceiling), hashlib.sha1).digest()

    def sign(self, ts: Timestamp) -> dict[str, Any]:
        return {"hash": Binary(self.proof(ts), 0), "keyId": Int64(self.key_id)}


def _field(doc: Mapping[str, Any], name: str, kinds: tuple[type, ...], kind_name: str) -> Any:
    if name not in doc:
        raise MongoError("NoSuchKey", f'Missing expected field "{name}"')
    value = doc[name]
    if not isinstance(value, kinds) or isinstance(value, bool):
        raise MongoError(
            "TypeMismatch",
            f'"{name}" had the wrong type. Expected {kind_name}, found {type(value).__name__}',
        )
    return value


def gossip_in(
    cluster_time: Any,
    *,
    key: ClusterTimeKey | None,
    authenticated: bool,
    newest: Timestamp,
    missing_signature_parses: bool,
) -> Timestamp | None:
    """The time a command's `$clusterTime` moves the clock to, None to ignore it, or the
    server's error (see the module docstring). `key` None: authorization is off. `newest`: the
    process's cluster time (a time not ahead of it is accepted unchecked).
    `missing_signature_parses`: 8.0 and later."""
    if not isinstance(cluster_time, Mapping):
        raise MongoError("TypeMismatch", "$clusterTime must be an object")
    ts = _field(cluster_time, "clusterTime", (Timestamp,), "timestamp")
    proof, key_id = None, 0
    if "signature" in cluster_time or not missing_signature_parses:
        proof, key_id = _signature(cluster_time)
    if key is None:
        return ts  # no authorization: every client may advance the clock
    if _unsigned(proof) and not authenticated:
        return None  # not gossiped: an unauthenticated client's unsigned time
    if (ts.time, ts.inc) <= (newest.time, newest.inc):
        return ts
    _verify(ts, proof, key_id, key)
    return ts


def _unsigned(proof: bytes | None) -> bool:
    """No proof, or the all-zero one a client without the key sends."""
    return proof is None or proof == bytes(_HASH_BYTES)


def _signature(cluster_time: Mapping[str, Any]) -> tuple[bytes, int]:
    """(the proof, the key id) of a `$clusterTime`'s signature."""
    signature = _field(cluster_time, "signature", (Mapping,), "object")
    digest = _field(signature, "hash", (bytes,), "binData")
    if len(digest) != _HASH_BYTES:
        raise MongoError("UnsupportedFormat", f"Unsupported SHA1Block hash length: {len(digest)}")
    return bytes(digest), int(_field(signature, "keyId", (int, float), "long"))


def _verify(ts: Timestamp, proof: bytes | None, key_id: int, key: ClusterTimeKey) -> None:
    """A time ahead of the process's must be signed with the cluster's key."""
    if key_id != key.key_id:
        raise MongoError(
            "KeyNotFound", f"No keys found for HMAC that is valid for time: {ts} with id: {key_id}"
        )
    if proof is None:
        raise MongoError("CannotVerifyAndSignLogicalTime", "Proof is missing")
    if not hmac.compare_digest(proof, key.proof(ts)):
        raise MongoError("TimeProofMismatch", "Proof does not match the cluster time")
