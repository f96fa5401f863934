"""Contract tests: real agg_switch servers (root + two sub-switches) on one
real Redis, real gRPC between the switches and from the compute-node SDK.

Every test on the `tree` fixture runs twice: with shared memory between the
switches and the SDK (the default on one host, here for chunks of any size)
and with the gRPC bytes path only."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
from opentelemetry.trace import SpanKind

from lightpath.aggregation.node import ComputeNode, aggregate_all
from lightpath.client import error_report
from lightpath.v1 import agg_switch_pb2 as pb
from lightpath.v1 import common_pb2
from tests.agg_switch.tree import (
    CN,
    DN,
    SW,
    agg_tree,
    node,
    node_credentials,
    patient_tree,
    stack_tree,
)

FIVE = ["n1", "n2", "n3", "n4", "n5"]
TRANSPORTS = ["shm", "grpc"]


def vectors(length: int, dtype=np.int64, nodes=FIVE) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    if np.dtype(dtype).kind == "f":
        return {n: rng.standard_normal(length).astype(dtype) for n in nodes}
    return {n: rng.integers(-1000, 1000, length).astype(dtype) for n in nodes}


async def expect_error(coro, code: grpc.StatusCode):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await coro
    assert info.value.code() == code, info.value.details()
    return error_report(info.value)


async def wait_for(predicate, timeout: float = 10.0, every: float = 0.01):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not await predicate():
        if loop.time() > end:
            raise AssertionError("condition not reached")
        await asyncio.sleep(every)


async def late_at(tree, node_id: str, switch: str, command_id: str) -> bool:
    """`switch` timed `node_id` out on every chunk (a bypass entry per chunk names
    it): the node's data, sent now, is late for all of them."""
    chunks = (await tree.command(command_id)).chunks
    state = await tree.state(switch)
    named = [
        e for e in state.bypass_entries if e.timeout_node == node_id and e.command_id == command_id
    ]
    return len(named) == chunks


async def held_at(tree, switch: str, command_id: str) -> bool:
    """`switch` holds a slot of the command: a chunk of it arrived there."""
    state = await tree.state(switch)
    return any(c.command_id == command_id and c.slots_held for c in state.commands)


async def done_at(tree, switch: str, command_id: str) -> bool:
    """`switch` sent its partial of every chunk of the command up."""
    state = await tree.state(switch)
    return any(c.command_id == command_id and c.chunks_done == c.chunks for c in state.commands)


async def straggle(tree, node_id: str, switch: str, command_id: str, values, **kw):
    """Contribute only once `switch` timed the node out on every chunk: late by
    construction, whatever the machine's speed (after one entry only, the node's
    later chunks would race their own timers)."""
    await wait_for(lambda: late_at(tree, node_id, switch, command_id))
    async with ComputeNode(
        node_id, tree.address("root"), credentials=node_credentials(node_id)
    ) as cn:
        return await cn.aggregate(command_id, values, **kw)


async def arrive(tree, command_id: str, values: dict[str, np.ndarray], until):
    """The nodes of `values` contributing (a task, returned) once `until()` holds:
    the test, not the machine's speed, orders the arrivals."""
    task = asyncio.ensure_future(
        aggregate_all(tree.address(), command_id, values, credentials=node_credentials)
    )

    async def reached() -> bool:
        if task.done():
            task.result()  # the nodes failed: say why, not "condition not reached"
        return await until()

    await wait_for(reached)
    return task


async def n5_clearly_last(tree, command_id: str, data: dict[str, np.ndarray]) -> dict:
    """Every node's result, n5 the latest by construction (no sleep): n4 first, then
    sub-1's nodes, all in, then n5, so n5's lateness at sub-2 exceeds any at sub-1.
    sub-2 must wait for n5 (not time it out)."""
    n4 = await arrive(
        tree, command_id, {"n4": data["n4"]}, lambda: held_at(tree, "sub-2", command_id)
    )
    sub1 = await arrive(
        tree,
        command_id,
        {n: data[n] for n in ("n1", "n2", "n3")},
        lambda: done_at(tree, "sub-1", command_id),
    )
    async with ComputeNode("n5", tree.address(), credentials=node_credentials("n5")) as n5:
        last = await n5.aggregate(command_id, data["n5"])
    return {**(await n4), **(await sub1), "n5": last}


# A refused chunk gets a minute to be sent again here (the tests that refuse one go on
# to complete the command); tests/agg_switch/test_abort.py covers the grace running out.
PATIENT = {"LIGHTPATH_AGG_CORRECTION_GRACE_S": "60"}


@pytest.fixture(params=TRANSPORTS)
async def tree(redis_url, request):
    async with agg_tree(
        redis_url,
        transport=request.param,
        env={s: PATIENT for s in ("root", "sub-1", "sub-2")},
    ) as t:
        yield t


# -- topology (AG-1) ---------------------------------------------------------------


async def test_define_and_get_topology_with_registered_endpoints(tree):
    topo = await tree.define(stack_tree())
    assert topo.version == 1 and topo.tree_id == "tree-1"
    assert dict(topo.endpoints) == {s: tree.address(s) for s in ("root", "sub-1", "sub-2")}
    again = await tree.stub("sub-2").GetTopology(pb.GetTopologyRequest())
    assert [n.id for n in again.nodes] == [n.id for n in stack_tree()]
    assert (await tree.define(stack_tree(sub_ms=50))).version == 2
    info = await tree.stub("sub-1").GetInfo(common_pb2.GetInfoRequest())
    assert info.attributes["switch_id"] == "sub-1" and info.attributes["tree"] == "tree-1"


@pytest.mark.parametrize(
    ("nodes", "field", "rule"),
    [
        (
            [node("a", SW, "b", 10), node("b", SW, "a", 10), node("c", CN, "a")],
            "topology.nodes",
            "exactly one root switch",
        ),
        (
            [
                node("r", SW, "", 10),
                node("a", SW, "b", 10),
                node("b", SW, "a", 10),
                node("c", CN, "a"),
            ],
            "topology.nodes[1].parent",
            "cycle",
        ),
        ([node("r", SW, "", 10), node("c", CN, "")], "topology.nodes[1].parent", "only the root"),
        ([node("r", SW, "", 10), node("c", CN, "x")], "topology.nodes[1].parent", "not a node"),
        (
            [node("r", SW, "", 10), node("c", CN, "r"), node("d", CN, "c")],
            "topology.nodes[2].parent",
            "not a switch",
        ),
        ([node("r", SW, "", 0), node("c", CN, "r")], "topology.nodes[0].threshold_ms", "threshold"),
        ([node("r", SW, "", 10), node("r", CN, "r")], "topology.nodes[1].id", "already"),
        ([node("r", SW, "", 10), node("s", SW, "r", 10)], "topology.nodes", "compute node"),
    ],
)
async def test_topology_that_is_not_a_tree_is_refused(tree, nodes, field, rule):
    report = await expect_error(tree.define(nodes), grpc.StatusCode.INVALID_ARGUMENT)
    assert any(f == field and rule in r for f, r in report.field_violations), report
    await expect_error(tree.stub().GetTopology(pb.GetTopologyRequest()), grpc.StatusCode.NOT_FOUND)


# -- commands (AG-2) ---------------------------------------------------------------


async def test_start_command_is_idempotent_and_validated(tree):
    await expect_error(tree.start("c1", FIVE, 4), grpc.StatusCode.FAILED_PRECONDITION)
    await tree.define(stack_tree())
    cmd = await tree.start("c1", FIVE, 10, chunk_bytes=32)
    assert cmd.state == pb.AGG_COMMAND_STATE_RUNNING
    assert (cmd.chunk_elems, cmd.chunks, cmd.timeout_aggregator) == (4, 3, "root")
    assert [(b.switch_id, list(b.children)) for b in cmd.bitmaps] == [
        ("root", ["sub-1", "sub-2"]),
        ("sub-1", ["n1", "n2", "n3"]),
        ("sub-2", ["n4", "n5"]),
    ]
    assert list(cmd.preset_order) == ["root", "sub-1", "n1", "n2", "n3", "sub-2", "n4", "n5"]
    # A retry through another switch is the same command ...
    again = await tree.start("c1", FIVE, 10, chunk_bytes=32, via="sub-2")
    assert again.created_at == cmd.created_at
    # ... but the same id for something else is refused.
    report = await expect_error(tree.start("c1", FIVE, 11), grpc.StatusCode.FAILED_PRECONDITION)
    assert report.reason == "COMMAND_EXISTS"
    bad = await expect_error(
        tree.start(
            "c2",
            ["n1", "n9"],
            0,
            dtype=pb.AGG_DTYPE_FLOAT32,
            op=pb.AGG_OP_AND,
            chunk_bytes=6,
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    fields = {f for f, _ in bad.field_violations}
    assert {"participants[1]", "length", "op", "chunk_bytes"} <= fields
    exact_prod = await expect_error(
        tree.start(
            "c3",
            FIVE,
            4,
            dtype=pb.AGG_DTYPE_FLOAT64,
            op=pb.AGG_OP_PROD,
            order_policy=pb.ORDER_POLICY_EXACT,
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert exact_prod.field_violations[0][0] == "order_policy"
    every = await expect_error(
        tree.start("c4", ["n1", "n2"], 4, predicted_timeout_nodes=["n1", "n2"]),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert every.reason == "NO_AGGREGATING_PARTICIPANT"
    await expect_error(tree.command("nope"), grpc.StatusCode.NOT_FOUND)
    # The topology cannot change under a running command.
    busy = await expect_error(tree.define(stack_tree()), grpc.StatusCode.FAILED_PRECONDITION)
    assert busy.reason == "TREE_BUSY"
    listed = await tree.stub().ListCommands(pb.ListCommandsRequest(page_size=1))
    assert [c.command_id for c in listed.commands] == ["c1"] and listed.next_page_token == ""


async def test_rpc_spans_carry_the_command_for_operators(redis_url, spans_factory):
    spans = spans_factory("agg-test")
    async with agg_tree(redis_url, tracer_provider=spans.provider) as t:
        await t.define(stack_tree())
        await t.start("traced", FIVE, 4, tenant="acme")
        await aggregate_all(t.address(), "traced", vectors(4), credentials=node_credentials)
    by_name = {}
    for span in spans.finished():
        if span.kind is SpanKind.SERVER:
            by_name.setdefault(span.name, []).append(span)
    start = by_name["lightpath.v1.AggSwitch/StartCommand"][0].attributes
    assert (start["lightpath.command_id"], start["lightpath.tenant"]) == ("traced", "acme")
    contributes = by_name["lightpath.v1.AggSwitch/Contribute"]
    assert {s.attributes["lightpath.node"] for s in contributes} == set(FIVE)
    assert all(s.attributes["lightpath.chunks_accepted"] == 1 for s in contributes)
    relays = by_name["lightpath.v1.AggSwitch/Relay"]
    assert {s.attributes["lightpath.peer"] for s in relays} >= {"sub-1", "sub-2", "root"}


async def test_concurrent_starts_of_one_command_on_every_switch_make_one_command(tree):
    await tree.define(stack_tree())
    cmds = await asyncio.gather(
        *(tree.start("same", FIVE, 8, via=s) for s in ("root", "sub-1", "sub-2") for _ in range(3))
    )
    assert len({c.created_at.ToNanoseconds() for c in cmds}) == 1
    listed = await tree.stub("sub-1").ListCommands(pb.ListCommandsRequest())
    assert [c.command_id for c in listed.commands] == ["same"]


# -- the data path: timeouts, bypass entries, the timeout aggregation node ----------


async def test_one_straggler_is_bypassed_to_a_compute_timeout_aggregator(tree):
    """AG-3 … AG-7 over real processes: n5 misses sub-2's threshold; sub-2 sends
    its partial up carrying n5, records bypass entries and frees its slots; n5's
    data is flagged on arrival and reaches n1 (the timeout aggregation node,
    under sub-1), which completes every chunk and has the root broadcast it."""
    await tree.define(patient_tree({"sub-2": 1000}))
    length = 1000
    cmd = await tree.start(
        "late-1",
        FIVE,
        length,
        chunk_bytes=8 * 256,
        timeout_aggregator=pb.TimeoutAggregatorSelection(node="n1"),
    )
    assert cmd.timeout_aggregator == "n1" and cmd.chunks == 4
    data = vectors(length)
    # n4 first (sub-2 times n5 out), then sub-1's nodes, all in before n5: n5 is the
    # latest at its switch by more than any node at sub-1, by construction.
    n4 = await arrive(
        tree, "late-1", {"n4": data["n4"]}, lambda: late_at(tree, "n5", "sub-2", "late-1")
    )
    sub1_nodes = {n: data[n] for n in ("n1", "n2", "n3")}
    on_time = await arrive(tree, "late-1", sub1_nodes, lambda: done_at(tree, "sub-1", "late-1"))
    # While n5 is late: the entries are on sub-2 only, and sub-2 holds no slot.
    sub2 = await tree.state("sub-2")
    assert sorted((e.command_id, e.chunk, e.timeout_node) for e in sub2.bypass_entries) == [
        ("late-1", i, "n5") for i in range(4)
    ]
    assert sub2.slots_in_use == 0
    assert (await tree.state("root")).bypass_entries == []
    assert not on_time.done() and not n4.done()
    late = await straggle(tree, "n5", "sub-2", "late-1", data["n5"])
    results = {**(await on_time), **(await n4), "n5": late}
    expected = sum(data.values())
    for n, r in results.items():
        assert r.values.tolist() == expected.tolist(), n
    assert results["n1"].timeout_aggregator and not results["n4"].timeout_aggregator
    for s in ("root", "sub-1", "sub-2"):
        st = await tree.state(s)
        assert st.bypass_entries == [] and st.slots_in_use == 0
    sub2 = await tree.state("sub-2")
    assert sub2.counters["flagged"] == 4 and sub2.counters["timeouts"] == 4
    root = await tree.state("root")
    assert root.counters["forwarded_flagged"] == 4  # passed on, never aggregated
    sub1 = await tree.state("sub-1")
    assert sub1.counters["forwarded_flagged"] == 4
    done = await tree.settled("late-1")
    assert done.state == pb.AGG_COMMAND_STATE_COMPLETED
    assert list(done.timeout_nodes) == ["n5"]
    holds = {h.switch_id: h for h in done.slot_holds}
    assert holds["sub-2"].timed_out_chunks == 4 and list(holds["sub-2"].timeout_nodes) == ["n5"]
    assert holds["sub-2"].bypass_entries_created == 4
    assert holds["sub-1"].timed_out_chunks == 0 and holds["root"].chunks == 4
    history = await tree.stub().GetHistory(pb.GetHistoryRequest())
    lateness = {x.node: x for x in history.entries[0].lateness}
    assert set(lateness) == set(FIVE)
    assert lateness["n5"].switch_id == "sub-2"
    assert lateness["n5"].lateness_s == max(x.lateness_s for x in lateness.values()) > 0


class _TaClient(ComputeNode):
    """A compute node whose client addresses its FINAL chunks to `root` (as a client
    written from the protos might: "" when it leaves `destination` unset)."""

    def __init__(self, *args, root: str, **kw):
        super().__init__(*args, **kw)
        self._final_to = root

    async def join(self, command_id: str) -> pb.Assignment:
        a = await super().join(command_id)
        a.root_switch = self._final_to  # NodeCommand addresses FINAL there
        return a


async def test_a_final_without_destination_goes_to_the_root_and_a_wrong_one_is_named(tree):
    """Issue 19: a FINAL with `destination` unset was refused blaming `source`, and the
    command then waited for its deadline. Unset now means the root; another node is
    refused naming `destination`, and the refusal changes nothing, so the command
    still completes."""
    from lightpath.aggregation import wire
    from lightpath.aggregation.maths import DType, Kind, Packet
    from lightpath.client import channel

    await tree.define(patient_tree({"sub-2": 1000}))
    await tree.start(
        "final-1", FIVE, 8, timeout_aggregator=pb.TimeoutAggregatorSelection(node="n1")
    )
    # The timeout aggregation node n1, at its leaf sub-1: a FINAL to sub-2 is refused.
    async with channel(tree.address("sub-1"), credentials=node_credentials("n1")) as ch:
        contribute = ch.stream_unary(
            wire.CONTRIBUTE,
            request_serializer=wire.identity,
            response_deserializer=pb.ContributeSummary.FromString,
        )
        wrong = Packet("final-1", 0, Kind.FINAL, "n1", np.zeros(8, np.int64), destination="sub-2")
        err = await expect_error(
            contribute(iter([wire.encode(wrong, DType.INT64)])),
            grpc.StatusCode.INVALID_ARGUMENT,
        )
    assert [f for f, _ in err.field_violations] == ["destination"], err
    assert "root switch 'root'" in err.message and "source" not in err.message
    # The whole command, n5 late so that n1 combines, n1 leaving `destination` unset.
    data = vectors(8)
    on_time = asyncio.ensure_future(
        aggregate_all(
            tree.address(),
            "final-1",
            {n: data[n] for n in ("n2", "n3", "n4")},
            credentials=node_credentials,
        )
    )
    async with _TaClient("n1", tree.address(), root="", credentials=node_credentials("n1")) as n1:
        ta = asyncio.ensure_future(n1.aggregate("final-1", data["n1"]))
        late = await straggle(tree, "n5", "sub-2", "final-1", data["n5"])
        results = {**(await on_time), "n5": late, "n1": await ta}
    expected = sum(data.values())
    assert results["n1"].timeout_aggregator
    for n, r in results.items():
        assert r.values.tolist() == expected.tolist(), n
    assert (await tree.settled("final-1")).state == pb.AGG_COMMAND_STATE_COMPLETED


async def test_predicted_straggler_tags_its_own_data(tree):
    """AG-9 end to end: history says n5 is late; StartCommand with top-1
    clears its bit at sub-2; n5 tags its data, sub-2 passes it on."""
    await tree.define(patient_tree())  # no switch times a child out: nobody is cut off
    await tree.start("warm", FIVE, 4)
    data = vectors(4)
    await n5_clearly_last(tree, "warm", data)  # history says so
    await tree.settled("warm")
    preview = await tree.stub("sub-1").PredictStragglers(
        pb.PredictStragglersRequest(options=pb.StragglerPredictionOptions(top_k=1))
    )
    assert list(preview.nodes) == ["n5"] and list(preview.commands) == ["warm"]
    # Issue 19: every node's worst lateness, not only the predicted node's.
    worst = {x.node: x for x in preview.lateness}
    assert set(worst) == set(FIVE)
    assert worst["n5"].lateness_s == max(x.lateness_s for x in worst.values()) > 0
    assert worst["n4"].switch_id == "sub-2" and worst["n1"].switch_id == "sub-1"
    bitmap = {
        b.switch_id: dict(zip(b.children, b.participates, strict=True)) for b in preview.bitmaps
    }
    assert bitmap["sub-2"] == {"n4": True, "n5": False}
    cmd = await tree.start(
        "predicted",
        FIVE,
        4,
        predict_stragglers=pb.StragglerPredictionOptions(top_k=1),
        timeout_aggregator=pb.TimeoutAggregatorSelection(node="n1"),
    )
    assert list(cmd.predicted_timeout_nodes) == ["n5"]
    results = await aggregate_all(tree.address(), "predicted", data, credentials=node_credentials)
    assert all(r.values.tolist() == sum(data.values()).tolist() for r in results.values())
    assert results["n5"].predicted_timeout
    sub2 = await tree.state("sub-2")
    assert sub2.counters["flagged"] == 1 and sub2.counters["timeouts"] == 0
    done = await tree.settled("predicted")
    assert list(done.timeout_nodes) == []  # nobody timed out: n5 was planned around


async def test_late_timeout_aggregator_and_late_sub_switch(tree):
    """AG-11: the root times sub-1 out (its threshold is shorter than sub-1's);
    sub-1 times out n1, which is also the timeout aggregation node. Sub-1's
    partial, then n1's own data, are flagged and routed to n1, which completes.

    The tree is sub-1 (n1, n2) and sub-2 (n3..n5, never timing out), and the test
    orders the arrivals: sub-2's nodes, until the root (its timer started by
    sub-2's partial) timed sub-1 out; then n2, whose chunk starts sub-1's timer;
    then n1, once sub-1 timed it out."""
    await tree.define(patient_tree({"root": 100, "sub-1": 400}, per_sub=(2, 3)))
    cmd = await tree.start(
        "agg-late", FIVE, 6, timeout_aggregator=pb.TimeoutAggregatorSelection(node="n1")
    )
    assert cmd.timeout_aggregator == "n1"
    data = vectors(6)
    sub2 = await arrive(
        tree,
        "agg-late",
        {n: data[n] for n in ("n3", "n4", "n5")},
        lambda: late_at(tree, "sub-1", "root", "agg-late"),
    )
    n2 = asyncio.ensure_future(
        aggregate_all(tree.address(), "agg-late", {"n2": data["n2"]}, credentials=node_credentials)
    )
    late = await straggle(tree, "n1", "sub-1", "agg-late", data["n1"])
    others = {**(await sub2), **(await n2)}
    assert late.timeout_aggregator
    for r in [late, *others.values()]:
        assert r.values.tolist() == sum(data.values()).tolist()
    done = await tree.settled("agg-late")
    holds = {h.switch_id: h for h in done.slot_holds}
    assert "sub-1" in holds["root"].timeout_nodes  # the entry names the switch
    assert list(holds["sub-1"].timeout_nodes) == ["n1"]


async def test_node_that_never_arrives_fails_the_command_cleanly(tree):
    """AG-11: the deadline fails the command everywhere: every waiting node gets
    DEADLINE_EXCEEDED naming who is missing, every slot and entry is freed."""
    await tree.define(stack_tree(sub_ms=100, root_ms=300))
    # the deadline runs from the start: the four nodes that come must join before it (a
    # join after it is refused as COMMAND_FAILED), which 1.5 s did not always allow on a
    # loaded machine
    await tree.start("never", FIVE, 4, chunk_bytes=16, deadline_s=4)
    data = vectors(4)
    outcomes = await asyncio.gather(
        *(
            ComputeNode(n, tree.address(), credentials=node_credentials(n)).aggregate(
                "never", data[n]
            )
            for n in FIVE
            if n != "n2"
        ),
        return_exceptions=True,
    )
    for out in outcomes:
        assert isinstance(out, grpc.aio.AioRpcError), out
        assert out.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "n2" in out.details()
    done = await tree.command("never")
    assert done.state == pb.AGG_COMMAND_STATE_FAILED
    assert "n2" in done.missing_nodes and "deadline" in done.failure
    for s in ("root", "sub-1", "sub-2"):
        st = await tree.state(s)
        assert st.slots_in_use == 0 and st.bypass_entries == [] and st.parked == 0
        assert not [c for c in st.commands if c.command_id == "never"]
    # Late arrivals after the failure are refused plainly.
    async with ComputeNode("n2", tree.address(), credentials=node_credentials("n2")) as n2:
        report = await expect_error(
            n2.aggregate("never", data["n2"]), grpc.StatusCode.FAILED_PRECONDITION
        )
    assert report.reason == "COMMAND_FAILED"


# -- bad input on the data path (X-3) ------------------------------------------------


async def test_bad_contributions_are_refused_and_duplicates_count_once(tree):
    from lightpath.aggregation import wire

    await tree.define(stack_tree(sub_ms=5000, root_ms=5000))
    await tree.start("bad", FIVE, 4, chunk_bytes=16)

    def contributor(node_id: str, switch: str = "sub-1"):
        """Contribute on `switch` as compute node `node_id` (its own certificate)."""
        return tree.channel(switch, as_=node_credentials(node_id)).stream_unary(
            wire.CONTRIBUTE,
            request_serializer=wire.identity,
            response_deserializer=pb.ContributeSummary.FromString,
        )

    contribute = contributor("n1")

    def chunk(cid="bad", source="n1", dtype=pb.AGG_DTYPE_INT64, data=None, index=0):
        data = np.arange(2, dtype=np.int64) if data is None else data
        return wire.encode_header(
            pb.AggChunk(
                command_id=cid,
                index=index,
                kind=pb.AGG_CHUNK_KIND_CONTRIBUTION,
                source=source,
                dtype=dtype,
            ),
            data,
        )

    async def send(*raws, call=contribute):
        async def gen():
            for r in raws:
                yield r

        return await call(gen(), timeout=10)

    await expect_error(send(chunk(cid="ghost")), grpc.StatusCode.NOT_FOUND)
    # A node sends only its own chunks (tests/agg_switch/test_security.py has more).
    r = await expect_error(send(chunk(source="n2")), grpc.StatusCode.PERMISSION_DENIED)
    assert r.reason == "NODE_MISMATCH"
    r = await expect_error(
        send(chunk(source="n9"), call=contributor("n9")), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert r.field_violations[0][0] == "source" and r.reason == "NOT_A_PARTICIPANT"
    r = await expect_error(
        send(chunk(source="n4"), call=contributor("n4")), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert r.reason == "WRONG_SWITCH"
    r = await expect_error(
        send(chunk(data=np.arange(3, dtype=np.int64))), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert r.field_violations[0][0] == "data" and "2 int64 elements" in r.field_violations[0][1]
    r = await expect_error(
        send(chunk(dtype=pb.AGG_DTYPE_FLOAT64)), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert r.field_violations[0][0] == "dtype"
    r = await expect_error(send(chunk(index=7)), grpc.StatusCode.INVALID_ARGUMENT)
    assert r.field_violations[0][0] == "index"
    # Nothing of the refused chunks stayed behind.
    assert (await tree.state("sub-1")).slots_in_use == 0
    # The same chunk twice counts once.
    summary = await send(chunk(), chunk(), chunk(index=1, data=np.array([5, 6])))
    assert (summary.accepted, summary.duplicates) == (2, 1)
    data = {n: np.arange(4, dtype=np.int64) * (i + 1) for i, n in enumerate(FIVE)}
    data["n1"] = np.array([0, 1, 5, 6])
    results = await aggregate_all(
        tree.address(), "bad", data, credentials=node_credentials
    )  # n1 sends all again
    assert results["n1"].values.tolist() == sum(data.values()).tolist()
    await expect_error(
        tree.stub(as_=node_credentials("n9")).JoinCommand(
            pb.JoinCommandRequest(command_id="bad", node_id="n9")
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    async with ComputeNode("n1", tree.address(), credentials=node_credentials("n1")) as n1:
        with pytest.raises(Exception, match="values"):
            await n1.aggregate("bad", np.zeros(3, np.int64))


# -- the timeout aggregation node's strategies (AG-10) -----------------------------


async def test_choose_timeout_aggregator_by_every_strategy(tree):
    nodes = stack_tree()
    nodes[2].link_cost = 0.25  # sub-2 is cheap to reach
    nodes.append(node("ded", DN, "root", link_cost=5.0))
    await tree.define(nodes)
    stub = tree.stub("sub-1")

    async def choose(strategy, **kw):
        return await stub.ChooseTimeoutAggregator(
            pb.ChooseTimeoutAggregatorRequest(
                participants=FIVE,
                command_id=kw.pop("command_id", "c"),
                selection=pb.TimeoutAggregatorSelection(strategy=strategy, **kw),
            )
        )

    assert (await choose(pb.TA_STRATEGY_FIXED)).node == "root"
    assert (await choose(pb.TA_STRATEGY_FIXED, node="n2")).node == "n2"
    hops = await choose(pb.TA_STRATEGY_FEWEST_HOPS, candidates=["n4", "sub-1", "ded"])
    assert hops.node == "sub-1"  # sub-1 and ded are 1 hop; sub-1 comes first in preorder
    assert {c.node: c.hops for c in hops.candidates} == {"n4": 2, "sub-1": 1, "ded": 1}
    cost = await choose(pb.TA_STRATEGY_LOWEST_LINK_COST, candidates=["n1", "n4", "ded"])
    assert cost.node == "n4"  # 1 + 0.25 < 2 < 5
    await stub.ReportLoad(pb.ReportLoadRequest(node_id="n2", bytes_per_s=10.0))
    await stub.ReportLoad(pb.ReportLoadRequest(node_id="n1", bytes_per_s=99.0))
    assert (await choose(pb.TA_STRATEGY_LEAST_LOAD, candidates=["n1", "n2"])).node == "n2"
    picks = {
        (await choose(pb.TA_STRATEGY_RANDOM_BY_ID, command_id=f"cmd-{i}")).node for i in range(12)
    }
    assert len(picks) > 1  # spread over the candidates by command id ...
    first = await choose(pb.TA_STRATEGY_RANDOM_BY_ID, command_id="cmd-3")
    assert (await choose(pb.TA_STRATEGY_RANDOM_BY_ID, command_id="cmd-3")).node == first.node
    bad = await expect_error(
        tree.stub().ChooseTimeoutAggregator(
            pb.ChooseTimeoutAggregatorRequest(
                participants=["n1"],
                selection=pb.TimeoutAggregatorSelection(candidates=["n2", "zz"], strategy=3),
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert {f for f, _ in bad.field_violations} == {"candidates[0]", "candidates[1]"}
    await expect_error(
        stub.ReportLoad(pb.ReportLoadRequest(node_id="zz", bytes_per_s=1)),
        grpc.StatusCode.NOT_FOUND,
    )


# -- dedicated node, parameter server, EXACT ------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_dedicated_timeout_aggregator_and_parameter_server(redis_url, transport):
    """AG-12 with a dedicated timeout aggregation node process (AG-10): the root
    applies params -= lr × sum and broadcasts the parameters."""
    async with agg_tree(redis_url, ("root", "sub-1", "sub-2", "ded"), transport=transport) as t:
        await t.define([*patient_tree({"sub-2": 200}), node("ded", DN, "root")])
        base = np.linspace(0, 1, 6, dtype=np.float32)
        await t.stub().SetParameters(
            pb.SetParametersRequest(model_id="m", dtype=pb.AGG_DTYPE_FLOAT32, data=base.tobytes())
        )
        await t.start(
            "ps-1",
            FIVE,
            6,
            dtype=pb.AGG_DTYPE_FLOAT32,
            chunk_bytes=12,
            parameter_server=pb.ParameterServerOptions(model_id="m", learning_rate=0.5),
            timeout_aggregator=pb.TimeoutAggregatorSelection(node="ded"),
        )
        grads = {n: np.full(6, i + 1, np.float32) for i, n in enumerate(FIVE)}
        on_time = asyncio.ensure_future(
            aggregate_all(
                t.address(),
                "ps-1",
                {n: grads[n] for n in FIVE if n != "n5"},
                credentials=node_credentials,
            )
        )
        late = await straggle(t, "n5", "sub-2", "ps-1", grads["n5"])
        results = {**(await on_time), "n5": late}
        want = base - np.float32(0.5) * sum(grads.values())
        for r in results.values():
            assert r.parameters and r.values.tolist() == want.tolist()
        await t.settled("ps-1")
        params = await t.stub("sub-1").GetParameters(
            pb.GetParametersRequest(model_id="m", include_data=True)
        )
        assert params.version == 2
        assert np.frombuffer(params.data, np.float32).tolist() == want.tolist()
        await expect_error(
            t.start(
                "ps-bad",
                FIVE,
                7,
                dtype=pb.AGG_DTYPE_FLOAT32,
                parameter_server=pb.ParameterServerOptions(model_id="m"),
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
        )
        # One command updates a model at a time, whichever switch starts them.
        ps = dict(
            dtype=pb.AGG_DTYPE_FLOAT32, parameter_server=pb.ParameterServerOptions(model_id="m")
        )
        await t.start("ps-2", FIVE, 6, via="sub-1", **ps)
        busy = await expect_error(
            t.start("ps-3", FIVE, 6, via="sub-2", **ps), grpc.StatusCode.FAILED_PRECONDITION
        )
        assert busy.reason == "MODEL_BUSY"


async def test_exact_mode_gives_the_same_bits_whoever_is_late(tree):
    """AG-8 EXACT through the real tree: different late nodes, same bits."""
    await tree.define(stack_tree(sub_ms=200, root_ms=4000))
    data = vectors(300, np.float32)
    outs = []
    for cid, straggler, switch in (("ex-1", "n2", "sub-1"), ("ex-2", "n5", "sub-2")):
        await tree.start(
            cid,
            FIVE,
            300,
            dtype=pb.AGG_DTYPE_FLOAT32,
            order_policy=pb.ORDER_POLICY_EXACT,
            trigger=pb.TRIGGER_MODE_INCREMENTAL,
            chunk_bytes=400,
        )
        on_time = asyncio.ensure_future(
            aggregate_all(
                tree.address(),
                cid,
                {n: data[n] for n in FIVE if n != straggler},
                credentials=node_credentials,
            )
        )
        late = await straggle(tree, straggler, switch, cid, data[straggler])
        outs.append([late.values, *(r.values for r in (await on_time).values())])
    flat = [v.tobytes() for run in outs for v in run]
    assert len(set(flat)) == 1
    assert np.allclose(outs[0][0], sum(d.astype(np.float64) for d in data.values()), atol=1e-6)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_tenants_share_a_small_slot_pool_without_corrupting_each_other(redis_url, transport):
    """AG-13: sub-1 has 2 slots for two tenants' 4-chunk commands; WAIT queues,
    FALLBACK bypasses to the timeout aggregation node; both results are exact."""
    env = {"sub-1": {"LIGHTPATH_AGG_SLOTS": "2"}}
    async with agg_tree(redis_url, env=env, transport=transport) as t:
        await t.define(patient_tree())  # on time, all of them: no switch cuts one off
        data = {
            "a": vectors(16, np.int64),
            "b": {n: v * 3 + 1 for n, v in vectors(16, np.int64).items()},
        }
        await t.start("ta", FIVE, 16, chunk_bytes=32, tenant="alpha")
        await t.start(
            "tb",
            FIVE,
            16,
            chunk_bytes=32,
            tenant="beta",
            slot_policy=pb.SLOT_POLICY_FALLBACK,
            timeout_aggregator=pb.TimeoutAggregatorSelection(node="sub-2"),
        )
        ra, rb = await asyncio.gather(
            aggregate_all(t.address(), "ta", data["a"], credentials=node_credentials),
            aggregate_all(t.address(), "tb", data["b"], credentials=node_credentials),
        )
        assert all(r.values.tolist() == sum(data["a"].values()).tolist() for r in ra.values())
        assert all(r.values.tolist() == sum(data["b"].values()).tolist() for r in rb.values())
        holds_a = {h.switch_id: h for h in (await t.settled("ta")).slot_holds}
        holds_b = {h.switch_id: h for h in (await t.settled("tb")).slot_holds}
        # Every chunk either held one of the two slots or (FALLBACK only) went around.
        assert (holds_a["sub-1"].chunks, holds_a["sub-1"].fallback_chunks) == (4, 0)
        assert holds_b["sub-1"].chunks + holds_b["sub-1"].fallback_chunks == 4
        st = await t.state("sub-1")
        assert st.slots_total == 2 and st.slots_in_use == 0 and st.bypass_entries == []
