"""Who may do what on agg_switch (issue: security): compute nodes act only as
themselves in commands they take part in, switches relay only as themselves,
tenants start and see only their own commands. Real switches, real mTLS."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import redis.asyncio as aioredis

from lightpath.aggregation import wire
from lightpath.aggregation.maths import DType, Kind, Packet
from lightpath.aggregation.node import aggregate_all
from lightpath.client import error_report
from lightpath.v1 import agg_switch_pb2 as pb
from lightpath_services.common.keys import tree_key
from tests.agg_switch.tree import TREE, agg_tree, node_credentials, stack_tree
from tests.helpers import credentials

FIVE = ["n1", "n2", "n3", "n4", "n5"]


def vectors(length: int, nodes=FIVE) -> dict[str, np.ndarray]:
    return {n: (np.arange(length, dtype=np.int64) + 1) * (i + 1) for i, n in enumerate(nodes)}


async def expect_error(coro, code: grpc.StatusCode):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await coro
    assert info.value.code() == code, info.value.details()
    return error_report(info.value)


def chunk(source: str, command_id: str, index: int, data: np.ndarray) -> bytes:
    return wire.encode_header(
        pb.AggChunk(
            command_id=command_id,
            index=index,
            kind=pb.AGG_CHUNK_KIND_CONTRIBUTION,
            source=source,
            dtype=pb.AGG_DTYPE_INT64,
        ),
        data,
    )


async def stream(call, *raws: bytes, **kw):
    async def gen():
        for r in raws:
            yield r

    return await call(gen(), timeout=10, **kw)


@pytest.fixture
async def tree(redis_url):
    async with agg_tree(redis_url, transport="grpc") as t:
        await t.define(stack_tree(sub_ms=5000, root_ms=5000))
        yield t


async def test_a_node_contributes_reads_and_reports_only_as_itself(tree, redis_url):
    await tree.start("mine", FIVE, 4, chunk_bytes=16)  # two chunks of two int64
    n1 = tree.channel("sub-1", as_=node_credentials("n1"))
    contribute = n1.stream_unary(
        wire.CONTRIBUTE,
        request_serializer=wire.identity,
        response_deserializer=pb.ContributeSummary.FromString,
    )
    forged = np.array([1000, 1000], dtype=np.int64)
    data = vectors(4)

    # n1 sends a chunk in n2's name (both hang from sub-1): refused, and not counted.
    r = await expect_error(
        stream(contribute, chunk("n2", "mine", 0, forged)), grpc.StatusCode.PERMISSION_DENIED
    )
    assert r.reason == "NODE_MISMATCH" and "source 'n2'" in r.message and "'n1'" in r.message
    # ... and for a command that does not exist, before anything is looked up.
    await expect_error(
        stream(contribute, chunk("n2", "ghost", 0, forged)), grpc.StatusCode.PERMISSION_DENIED
    )
    assert (await tree.state("sub-1")).slots_in_use == 0
    # ... and after a chunk of its own in the same stream (that one counts).
    r = await expect_error(
        stream(contribute, chunk("n1", "mine", 1, data["n1"][2:]), chunk("n3", "mine", 1, forged)),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    assert r.reason == "NODE_MISMATCH"

    # n1 opens n2's results: refused.
    results = n1.unary_stream(
        wire.RESULTS,
        request_serializer=pb.ResultsRequest.SerializeToString,
        response_deserializer=wire.identity,
    )

    async def read(request):
        return [raw async for raw in results(request, timeout=10)]

    r = await expect_error(
        read(pb.ResultsRequest(command_id="mine", node_id="n2")),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    assert r.reason == "NODE_MISMATCH" and "node_id 'n2'" in r.message

    # n1 asks to join as n2: refused, naming the field and the credential's node.
    root_as_n1 = tree.stub(as_=node_credentials("n1"))
    r = await expect_error(
        root_as_n1.JoinCommand(pb.JoinCommandRequest(command_id="mine", node_id="n2")),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    assert "node_id 'n2'" in r.message and "node 'n1'" in r.message
    own = await root_as_n1.JoinCommand(pb.JoinCommandRequest(command_id="mine", node_id="n1"))
    assert own.leaf_switch == "sub-1"
    # The operator is no compute node at all.
    await expect_error(
        tree.stub().JoinCommand(pb.JoinCommandRequest(command_id="mine", node_id="n1")),
        grpc.StatusCode.PERMISSION_DENIED,
    )

    # Load: a node reports its own only.
    await expect_error(
        root_as_n1.ReportLoad(pb.ReportLoadRequest(node_id="n2", bytes_per_s=1.0)),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    await root_as_n1.ReportLoad(pb.ReportLoadRequest(node_id="n1", bytes_per_s=7.0))
    # A switch reports only its own.
    sub1 = tree.stub(as_="service:agg_switch/sub-1")
    await expect_error(
        sub1.ReportLoad(pb.ReportLoadRequest(node_id="sub-2", bytes_per_s=1.0)),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        loads = await r.hgetall(tree_key(TREE, "load"))
    finally:
        await r.aclose()
    assert loads.get("n1") == "7.0" and "n2" not in loads

    # Nothing of the refused calls stayed behind: the real aggregation (n1 sending
    # its chunk 1 again, a duplicate) has the true sum, n2's and n3's own data in it.
    done = await aggregate_all(tree.address(), "mine", data, credentials=node_credentials)
    want = sum(data.values()).tolist()
    assert all(res.values.tolist() == want for res in done.values())


async def test_a_node_sees_and_joins_only_commands_it_takes_part_in(tree):
    await tree.start("three", ["n1", "n2", "n3"], 4)
    as_n4 = tree.stub(as_=node_credentials("n4"))
    r = await expect_error(
        as_n4.GetCommand(pb.GetCommandRequest(command_id="three")), grpc.StatusCode.NOT_FOUND
    )
    missing = await expect_error(
        as_n4.GetCommand(pb.GetCommandRequest(command_id="nothing")), grpc.StatusCode.NOT_FOUND
    )
    assert r.message == missing.message.replace("nothing", "three")  # no hint it exists
    r = await expect_error(
        as_n4.JoinCommand(pb.JoinCommandRequest(command_id="three", node_id="n4")),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert r.reason == "NOT_A_PARTICIPANT"
    seen = await tree.stub(as_=node_credentials("n2")).GetCommand(
        pb.GetCommandRequest(command_id="three")
    )
    assert list(seen.participants) == ["n1", "n2", "n3"]
    # Nor can a node list commands or read the tree's history (policy: tenants, operators).
    await expect_error(
        as_n4.ListCommands(pb.ListCommandsRequest()), grpc.StatusCode.PERMISSION_DENIED
    )


async def test_a_switch_relays_only_as_itself(tree):
    await tree.start("relayed", FIVE, 4, chunk_bytes=32)  # one chunk of four int64
    # sub-1's own certificate, claiming to be sub-2: sends root a forged partial of sub-2's nodes.
    ch = tree.channel("root", as_="service:agg_switch/sub-1")
    relay = ch.stream_unary(
        wire.RELAY,
        request_serializer=wire.identity,
        response_deserializer=pb.RelaySummary.FromString,
    )
    forged = wire.encode(
        Packet("relayed", 0, Kind.PARTIAL, "sub-2", np.full(4, 10**6, np.int64)), DType.INT64
    )
    r = await expect_error(
        stream(relay, forged, metadata=((wire.FROM_METADATA, "sub-2"),)),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    assert r.reason == "SWITCH_MISMATCH" and "sub-2" in r.message
    # A compute node may not relay at all, not even in its leaf's name.
    node_ch = tree.channel("root", as_=node_credentials("n1"))
    node_relay = node_ch.stream_unary(
        wire.RELAY,
        request_serializer=wire.identity,
        response_deserializer=pb.RelaySummary.FromString,
    )
    await expect_error(
        stream(node_relay, forged, metadata=((wire.FROM_METADATA, "sub-1"),)),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    # The root took nothing from the forgery: the real sum comes out.
    data = vectors(4)
    done = await aggregate_all(tree.address(), "relayed", data, credentials=node_credentials)
    assert done["n5"].values.tolist() == sum(data.values()).tolist()
    # In its own name the same certificate may relay.
    ok = await stream(relay, metadata=((wire.FROM_METADATA, "sub-1"),))
    assert ok.chunks == 0


async def test_a_tenant_starts_commands_only_for_itself(tree):
    acme = tree.stub(as_="tenant:acme")
    started = await tree.start("a1", FIVE, 4, as_="tenant:acme")
    assert started.tenant == "acme"  # from the credential, the field left empty
    assert (await tree.start("a2", FIVE, 4, as_="tenant:acme", tenant="acme")).tenant == "acme"

    r = await expect_error(
        tree.start("a3", FIVE, 4, as_="tenant:acme", tenant="beta"),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    assert r.reason == "TENANT_MISMATCH" and "'beta'" in r.message
    # Refused before anything was written: no such command, for anyone.
    await expect_error(tree.command("a3"), grpc.StatusCode.NOT_FOUND)
    await expect_error(
        acme.GetCommand(pb.GetCommandRequest(command_id="a3")), grpc.StatusCode.NOT_FOUND
    )
    # beta repeating acme's request word for word does not get acme's command back.
    r = await expect_error(
        tree.start("a1", FIVE, 4, as_="tenant:beta"), grpc.StatusCode.FAILED_PRECONDITION
    )
    assert r.reason == "COMMAND_EXISTS"
    assert (await tree.command("a1")).tenant == "acme"
    # A retry by acme itself is the same command.
    again = await tree.start("a1", FIVE, 4, as_="tenant:acme")
    assert again.created_at == started.created_at
    # Operators start for any tenant.
    assert (await tree.start("o1", FIVE, 4, tenant="beta")).tenant == "beta"


async def test_a_tenant_sees_only_its_own_commands_and_history(tree):
    # Interleaved: newest first that is b3 a3 b2 a2 b1 a1.
    for i in (1, 2, 3):
        await tree.start(f"a{i}", FIVE, 4, as_="tenant:acme")
        await tree.start(f"b{i}", FIVE, 4, as_="tenant:beta")
    acme, beta = tree.stub(as_="tenant:acme"), tree.stub(as_="tenant:beta")

    async def pages(stub, size: int) -> list[list[str]]:
        out, token = [], ""
        while True:
            page = await stub.ListCommands(pb.ListCommandsRequest(page_size=size, page_token=token))
            out.append([c.command_id for c in page.commands])
            token = page.next_page_token
            if not token:
                return out

    assert await pages(acme, 1) == [["a3"], ["a2"], ["a1"]]
    assert await pages(acme, 2) == [["a3", "a2"], ["a1"]]
    assert await pages(beta, 5) == [["b3", "b2", "b1"]]
    assert await pages(tree.stub(), 4) == [["b3", "a3", "b2", "a2"], ["b1", "a1"]]

    # Another tenant's command is NOT_FOUND, as one that does not exist.
    r = await expect_error(
        acme.GetCommand(pb.GetCommandRequest(command_id="b1")), grpc.StatusCode.NOT_FOUND
    )
    assert r.reason == "COMMAND_NOT_FOUND"
    assert (await acme.GetCommand(pb.GetCommandRequest(command_id="a1"))).tenant == "acme"
    assert (await tree.command("b1")).tenant == "beta"  # the operator sees all

    # History: finished commands of both tenants; each sees its own.
    data = vectors(4)
    for cid in ("a1", "b1"):
        await aggregate_all(tree.address(), cid, data, credentials=node_credentials)
        await tree.settled(cid)

    async def history(stub) -> list[str]:
        return [e.command_id for e in (await stub.GetHistory(pb.GetHistoryRequest())).entries]

    assert await history(acme) == ["a1"]
    assert await history(beta) == ["b1"]
    assert await history(tree.stub()) == ["b1", "a1"]
    preview = await acme.PredictStragglers(
        pb.PredictStragglersRequest(options=pb.StragglerPredictionOptions(top_k=1))
    )
    assert list(preview.commands) == ["a1"]


async def test_a_tenant_does_not_see_commands_started_without_a_tenant(tree):
    await tree.start("x", FIVE, 4)
    assert (await tree.command("x")).tenant == "default"
    acme = tree.stub(as_=credentials("tenant:acme"))
    await expect_error(
        acme.GetCommand(pb.GetCommandRequest(command_id="x")), grpc.StatusCode.NOT_FOUND
    )
    assert list((await acme.ListCommands(pb.ListCommandsRequest())).commands) == []


async def test_a_tenants_model_parameters_are_its_own(tree):
    """The first writer's tenant owns a model: another tenant can neither overwrite nor
    read it, nor name it as a parameter-server command's model; operators can."""
    acme, beta, op = tree.stub(as_="tenant:acme"), tree.stub(as_="tenant:beta"), tree.stub()
    data = np.arange(4, dtype=np.float32).tobytes()

    def set_req(values: bytes) -> pb.SetParametersRequest:
        return pb.SetParametersRequest(
            tree_id=TREE, model_id="m-acme", dtype=pb.AGG_DTYPE_FLOAT32, data=values
        )

    first = await acme.SetParameters(set_req(data))
    assert first.version == 1
    r = await expect_error(
        beta.SetParameters(set_req(np.ones(4, dtype=np.float32).tobytes())),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    assert r.reason == "ID_UNAVAILABLE" and "tenant" not in r.message
    get = pb.GetParametersRequest(tree_id=TREE, model_id="m-acme", include_data=True)
    await expect_error(beta.GetParameters(get), grpc.StatusCode.NOT_FOUND)
    # nothing was written by the refused call
    mine = await acme.GetParameters(get)
    assert mine.version == 1 and mine.data == data
    # the operator reads and writes any model; the owner stays acme
    assert (await op.GetParameters(get)).data == data
    assert (await op.SetParameters(set_req(data))).version == 2
    assert (await acme.SetParameters(set_req(data))).version == 3
    # beta cannot run a parameter-server command on acme's model
    r = await expect_error(
        tree.start(
            "ps-b",
            FIVE,
            4,
            as_="tenant:beta",
            dtype=pb.AGG_DTYPE_FLOAT32,
            parameter_server=pb.ParameterServerOptions(model_id="m-acme", learning_rate=0.1),
        ),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    assert r.reason == "ID_UNAVAILABLE"
    await expect_error(tree.command("ps-b"), grpc.StatusCode.NOT_FOUND)
