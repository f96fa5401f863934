"""Demo step of agg_switch (seed 003): five compute nodes aggregate through the
stack's root and two sub-switches; one node straggles, its switch times it out,
bypasses its late data to the timeout aggregation node, and everyone gets the
verified sum while no switch held a slot waiting for the straggler.

The compute nodes act as themselves: each gets its own certificate from the
local stack's CA (a token on a plaintext stack), since a switch takes a node's
chunks only from that node. The demo runs against the stack of
LIGHTPATH_STATE_DIR (`ensure_stack` sets it)."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from lightpath.aggregation.node import ComputeNode, local_node_credentials
from lightpath.cli._common import table
from lightpath.demo.context import DemoContext
from lightpath.stack import AGG_TREE_NODES, default_agg_topology
from lightpath.v1 import agg_switch_pb2 as pb
from lightpath.v1 import agg_switch_pb2_grpc

# The local stack's tree (lightpath.stack.default_agg_topology): node -> its leaf switch.
NODES = {n: f"agg-{switch}" for switch, nodes in AGG_TREE_NODES.items() for n in nodes}
STRAGGLER, LATE_S = "n3", 0.8
LENGTH, CHUNK_BYTES = 1 << 18, 1 << 18


async def run(ctx: DemoContext) -> None:
    ctx.section("agg_switch: a straggler is bypassed, not waited for")
    root = agg_switch_pb2_grpc.AggSwitchStub(ctx.channel("agg-root"))
    sub1 = agg_switch_pb2_grpc.AggSwitchStub(ctx.channel("agg-sub-1"))
    topo = await root.DefineTopology(pb.DefineTopologyRequest(topology=default_agg_topology()))
    print(
        f"tree {topo.tree_id} v{topo.version}: root (600 ms) over sub-1 [n1 n2 n3] and "
        "sub-2 [n4 n5] (200 ms each)"
    )
    picks = []
    for name, strategy in (
        ("fewest hops", pb.TA_STRATEGY_FEWEST_HOPS),
        ("lowest link cost", pb.TA_STRATEGY_LOWEST_LINK_COST),
        ("random by id", pb.TA_STRATEGY_RANDOM_BY_ID),
    ):
        choice = await root.ChooseTimeoutAggregator(
            pb.ChooseTimeoutAggregatorRequest(
                participants=list(NODES),
                command_id="demo",
                selection=pb.TimeoutAggregatorSelection(
                    strategy=strategy, candidates=["n4", "n5", "sub-2"]
                ),
            )
        )
        picks.append(f"{name} → {choice.node}")
    print("timeout aggregation node by strategy (candidates n4, n5, sub-2): " + "; ".join(picks))

    rng = np.random.default_rng(3)
    inputs = {n: rng.standard_normal(LENGTH).astype(np.float32) for n in NODES}
    creds = await local_node_credentials(NODES)
    what = "certificate (spiffe://lightpath/node/<id>)" if creds["n1"].tls else "token"
    print(f"compute nodes {', '.join(NODES)} each present their own {what}")
    status, results, elapsed, (entries, held), left = await _aggregate(
        ctx, root, sub1, inputs, creds, wait_for_all=False
    )
    print(
        f"\nat +{LATE_S / 2:.1f} s, while {STRAGGLER} is late, sub-1 holds {held} slot(s) "
        "and these bypass entries:"
    )
    print(table(entries, ["command", "chunk", "timeout node"]) if entries else "  (none)")
    print(f"timed out: {', '.join(status.timeout_nodes) or 'nobody'}; all done in {elapsed:.2f} s")
    baseline, _, base_elapsed, (_, base_held), _ = await _aggregate(
        ctx, root, sub1, inputs, creds, wait_for_all=True
    )
    print(
        f"the same with timeouts off (wait for all): {base_elapsed:.2f} s, sub-1 holding "
        f"{base_held} slot(s) at +{LATE_S / 2:.1f} s; slot holds:"
    )
    base = {h.switch_id: h for h in baseline.slot_holds}
    print(
        table(
            [
                (
                    h.switch_id,
                    h.chunks,
                    f"{h.max_ms:.1f}",
                    f"{base[h.switch_id].max_ms:.1f}" if h.switch_id in base else "-",
                    ", ".join(h.timeout_nodes) or "-",
                    h.bypass_entries_created,
                )
                for h in status.slot_holds
            ],
            [
                "switch",
                "slots",
                "max hold ms",
                "waiting for all",
                "timeout nodes",
                "bypass entries",
            ],
        )
    )
    direct = np.sum(np.stack([inputs[n] for n in NODES]).astype(np.float64), axis=0)
    same_bits = len({r.values.tobytes() for r in results}) == 1
    err = float(np.max(np.abs(results[0].values - direct)))
    ok = same_bits and err < 1e-4 and not left
    print(
        f"result: {len(results)} nodes got the same bits: {same_bits}; max |error| vs float64 "
        f"sum {err:.2e}; bypass entries left: {len(left)} → {'verified' if ok else 'MISMATCH'}"
    )
    if not ok:
        raise RuntimeError("agg demo: the aggregated result did not verify")


async def _aggregate(ctx: DemoContext, root, sub1, inputs, creds, *, wait_for_all: bool):
    command_id = f"demo-{int(time.time() * 1000)}"
    cmd = await root.StartCommand(
        pb.StartCommandRequest(
            command_id=command_id,
            participants=list(NODES),
            dtype=pb.AGG_DTYPE_FLOAT32,
            op=pb.AGG_OP_SUM,
            length=LENGTH,
            chunk_bytes=CHUNK_BYTES,
            tenant="demo",
            wait_for_all=wait_for_all,
            timeout_aggregator=pb.TimeoutAggregatorSelection(node="n4"),
        )
    )
    if not wait_for_all:
        print(
            f"command {command_id}: 5 nodes × {LENGTH} float32 in {cmd.chunks} chunks, preset "
            f"order, timeout aggregation node {cmd.timeout_aggregator}; {STRAGGLER} {LATE_S} s late"
        )
    nodes = [
        ComputeNode(
            n,
            ctx.endpoints["agg-root"],
            tracer_provider=ctx.tracer_provider,
            credentials=creds[n],
        )
        for n in NODES
    ]
    started = time.perf_counter()
    tasks = [
        asyncio.ensure_future(
            node.aggregate(
                command_id,
                inputs[node.node_id],
                delay_s=LATE_S if node.node_id == STRAGGLER else 0.0,
            )
        )
        for node in nodes
    ]
    try:
        await asyncio.sleep(LATE_S / 2)
        state = await sub1.GetSwitchState(pb.GetSwitchStateRequest())
        entries = [
            (e.command_id, e.chunk, e.timeout_node)
            for e in state.bypass_entries
            if e.command_id == command_id
        ]
        results = await asyncio.gather(*tasks)
    finally:
        for node in nodes:
            await node.close()
    elapsed = time.perf_counter() - started
    status = cmd
    for _ in range(100):
        status = await root.GetCommand(pb.GetCommandRequest(command_id=command_id))
        if status.state != pb.AGG_COMMAND_STATE_RUNNING and len(status.slot_holds) >= 3:
            break
        await asyncio.sleep(0.05)
    after = await sub1.GetSwitchState(pb.GetSwitchStateRequest())
    left = [e for e in after.bypass_entries if e.command_id == command_id]
    return status, results, elapsed, (entries, state.slots_in_use), left
