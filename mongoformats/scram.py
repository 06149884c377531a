"""SCRAM-SHA-256 (RFC 5802, RFC 7677) as MongoDB runs it over saslStart/saslContinue, sans-IO.

Both sides: `ScramClient` is what the proxy's own upstream connections (shard readers, lookups)
run with the credentials of its `--upstream` URI; `ScramServer` is what simcluster runs when it
requires authentication. MongoDB specifics: the password is SASLprep'd for SHA-256 (pymongo's
`saslprep`), at least 4096 iterations, the GS2 header is always "n,," (no channel binding, so
`c=biws`), and the server's last step may be skipped (`options: {skipEmptyExchange: true}`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from typing import NamedTuple

from mongoformats.errors import MongoError

__all__ = ["MECHANISM", "ScramClient", "ScramCredential", "ScramServer", "make_credential"]

MECHANISM = "SCRAM-SHA-256"
ITERATIONS = 15000  # the server's default scramSHA256IterationCount


def _prep(password: str) -> bytes:
    from pymongo.saslprep import saslprep

    return str(saslprep(password)).encode()


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.digest(key, msg, "sha256")


def _salted(password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", _prep(password), salt, iterations)


def _fields(message: bytes) -> dict[str, str]:
    out = {}
    for part in message.decode().split(","):
        key, sep, value = part.partition("=")
        if sep:
            out[key] = value
    return out


def _escape_name(user: str) -> str:
    return user.replace("=", "=3D").replace(",", "=2C")


def _auth_failed() -> MongoError:
    return MongoError("AuthenticationFailed", "Authentication failed.")


class ScramCredential(NamedTuple):
    """What a server stores for a user: never the password."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def make_credential(
    password: str, *, iterations: int = ITERATIONS, salt: bytes | None = None
) -> ScramCredential:
    salt = salt if salt is not None else os.urandom(28)
    salted = _salted(password, salt, iterations)
    return ScramCredential(
        salt,
        iterations,
        hashlib.sha256(_hmac(salted, b"Client Key")).digest(),
        _hmac(salted, b"Server Key"),
    )


class ScramClient:
    def __init__(self, user: str, password: str, *, nonce: str | None = None) -> None:
        self._password = password
        self._nonce = nonce or base64.b64encode(os.urandom(24)).decode()
        self._first_bare = f"n={_escape_name(user)},r={self._nonce}".encode()
        self._server_signature = b""

    def first(self) -> bytes:
        return b"n,," + self._first_bare

    def final(self, server_first: bytes) -> bytes:
        f = _fields(server_first)
        if not f.get("r", "").startswith(self._nonce):
            raise MongoError("AuthenticationFailed", "server returned an invalid nonce")
        iterations = int(f["i"])
        if iterations < 4096:
            raise MongoError("AuthenticationFailed", "server returned an invalid iteration count")
        salted = _salted(self._password, base64.b64decode(f["s"]), iterations)
        client_key = _hmac(salted, b"Client Key")
        without_proof = b"c=biws,r=" + f["r"].encode()
        auth_message = b",".join((self._first_bare, server_first, without_proof))
        signature = _hmac(hashlib.sha256(client_key).digest(), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = _hmac(_hmac(salted, b"Server Key"), auth_message)
        return without_proof + b",p=" + base64.b64encode(proof)

    def verify(self, server_final: bytes) -> None:
        if not hmac.compare_digest(
            _fields(server_final).get("v", "").encode(), base64.b64encode(self._server_signature)
        ):
            raise MongoError("AuthenticationFailed", "server signature did not match")


class ScramServer:
    """One conversation. `lookup(user)` returns the user's credential or None."""

    def __init__(self, lookup: dict[str, ScramCredential]) -> None:
        self._lookup = lookup
        self.user = ""
        self._credential: ScramCredential | None = None
        self._auth_prefix = b""
        self._nonce = ""

    def first(self, client_first: bytes) -> bytes:
        if not client_first.startswith(b"n,"):
            raise MongoError(
                "BadValue", "SCRAM channel binding is not supported; the GS2 header must be 'n,,'"
            )
        bare = client_first.split(b",", 2)[2]
        f = _fields(bare)
        self.user = f.get("n", "").replace("=2C", ",").replace("=3D", "=")
        self._credential = self._lookup.get(self.user)
        # An unknown user still gets a well-formed challenge; the proof fails later (no user
        # oracle).
        cred = self._credential or make_credential(
            "unknown user", iterations=4096, salt=hashlib.sha256(bare).digest()
        )
        self._nonce = f.get("r", "") + base64.b64encode(os.urandom(24)).decode()
        server_first = (
            f"r={self._nonce},s={base64.b64encode(cred.salt).decode()},i={cred.iterations}".encode()
        )
        self._auth_prefix = bare + b"," + server_first
        return server_first

    def final(self, client_final: bytes) -> bytes:
        without_proof, _, proof_part = client_final.rpartition(b",p=")
        if self._credential is None or _fields(without_proof).get("r") != self._nonce:
            raise _auth_failed()
        auth_message = self._auth_prefix + b"," + without_proof
        signature = _hmac(self._credential.stored_key, auth_message)
        client_key = _client_key(proof_part, signature)
        if not hmac.compare_digest(
            hashlib.sha256(client_key).digest(), self._credential.stored_key
        ):
            raise _auth_failed()
        return b"v=" + base64.b64encode(_hmac(self._credential.server_key, auth_message))


def _client_key(proof_part: bytes, signature: bytes) -> bytes:
    """The ClientKey a client's proof gives (ClientProof XOR ClientSignature, RFC 5802); an
    authentication failure for a proof that is not base64 or not of the signature's length."""
    try:
        proof = base64.b64decode(proof_part, validate=True)
    except ValueError:
        raise _auth_failed() from None
    if len(proof) != len(signature):
        raise _auth_failed()
    return bytes(a ^ b for a, b in zip(proof, signature, strict=True))
