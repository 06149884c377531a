"""SCRAM-SHA-256 against the worked example of RFC 7677 section 3, and both sides together."""

from __future__ import annotations

import pytest

from mongoformats.errors import MongoError
from mongoformats.scram import ScramClient, ScramServer, make_credential


def test_client_matches_the_rfc_7677_example():
    client = ScramClient("user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    assert client.final(server_first) == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    client.verify(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
    with pytest.raises(MongoError):
        client.verify(b"v=AAAA")


@pytest.mark.parametrize(("password", "accepted"), [("right,=pw", True), ("wrong", False)])
def test_server_accepts_only_the_right_proof(password, accepted):
    server = ScramServer({"a,b=c": make_credential("right,=pw", iterations=4096)})
    client = ScramClient("a,b=c", password)
    final = client.final(server.first(client.first()))
    assert server.user == "a,b=c"
    if accepted:
        client.verify(server.final(final))
    else:
        with pytest.raises(MongoError) as info:
            server.final(final)
        assert info.value.code == 18


def test_unknown_user_fails_like_a_wrong_password():
    server = ScramServer({})
    client = ScramClient("ghost", "x")
    with pytest.raises(MongoError) as info:
        server.final(client.final(server.first(client.first())))
    assert info.value.code == 18
