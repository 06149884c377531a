"""The proxy's own hello answer, without sockets: wireproxy.hello is synchronous apart from the
streaming hello's wait."""

from __future__ import annotations

import pytest
import trio
from bson import ObjectId

from mongoformats.errors import MongoError
from wireproxy.hello import LOCAL_HELLO_FIELDS, await_topology_change, hello_reply

PROCESS = ObjectId()


def test_hello_and_the_legacy_is_master_name_the_primary_field_each_its_own_way():
    modern = hello_reply({"hello": 1}, PROCESS, (0, 21), 7)
    legacy = hello_reply({"isMaster": 1, "helloOk": True}, PROCESS, (6, 17), 8)
    assert modern["isWritablePrimary"] is True and "ismaster" not in modern
    assert "helloOk" not in modern and "compression" not in modern
    assert legacy["ismaster"] is True and legacy["helloOk"] is True
    assert (legacy["minWireVersion"], legacy["maxWireVersion"], legacy["connectionId"]) == (
        6,
        17,
        8,
    )
    assert modern["msg"] == "isdbgrid" and modern["topologyVersion"]["processId"] == PROCESS
    assert "ok" not in modern  # the session adds it once the upstream's fields are in


def test_only_the_compressors_the_proxy_speaks_are_chosen_in_the_clients_order():
    reply = hello_reply({"hello": 1, "compression": ["lz4", "zstd", "zlib"]}, PROCESS, (0, 21), 1)
    assert reply["compression"] == ["zstd", "zlib"]
    assert "compression" not in hello_reply(
        {"hello": 1, "compression": ["lz4"]}, PROCESS, (0, 21), 1
    )


def test_what_the_proxy_answers_itself_is_left_out_of_the_hello_passed_upstream():
    assert {"compression", "topologyVersion", "maxAwaitTimeMS", "$db"} == LOCAL_HELLO_FIELDS


@pytest.mark.parametrize(
    ("cmd", "code"),
    [({"hello": 1, "topologyVersion": {}}, 51760), ({"hello": 1, "maxAwaitTimeMS": 5}, 51758)],
)
async def test_a_streaming_hello_needs_both_of_its_fields(cmd, code, autojump_clock):
    with pytest.raises(MongoError) as err:
        await await_topology_change(cmd, PROCESS)
    assert err.value.code == code


async def test_a_streaming_hello_on_the_proxys_topology_waits_its_max_await_time(autojump_clock):
    cmd = {"hello": 1, "topologyVersion": {"processId": PROCESS}, "maxAwaitTimeMS": 10_000}
    start = trio.current_time()
    await await_topology_change(cmd, PROCESS)
    assert trio.current_time() - start == pytest.approx(10.0)
    other = {**cmd, "topologyVersion": {"processId": ObjectId()}}
    start = trio.current_time()
    await await_topology_change(other, PROCESS)
    assert trio.current_time() == start
