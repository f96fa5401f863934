"""How fast a command fails across an aggregation tree (issue 19): one JSON line.

    python3 dev.py bench agg_abort [--reps 20]

A root over two sub-switches (3 agg_switch processes, mTLS, real gRPC, one
Redis); per rep a command of 5 participants, 4 of them (under both
sub-switches) contributing and waiting on their results, the fifth never
coming, a 60 s deadline. Then:

* abort_to_all_told_ms: AbortCommand at sub-1 until the last of the 4 waiting
  nodes' calls ended ABORTED (p50, p99, max over --reps): the failure crossing
  the tree through the aborts stream, instead of the deadline.
* correction_to_all_told_ms: a FINAL sent by the timeout aggregation node to a
  wrong destination (refused) until the last waiting node ended ABORTED, minus
  the switches' correction grace (LIGHTPATH_AGG_CORRECTION_GRACE_S, set to
  0.2 s here): what the mechanism adds to the grace.

The nodes run in this process (`ComputeNode`, each with its own certificate).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

import grpc
import numpy as np
from _common import emit, percentile, private_redis
from agg_switch import Pki, define, start, switches

TREE = "abort-tree"
GRACE_S = 0.2
WAITING = ("n1", "n2", "n4", "n5")


def tree_nodes():
    from lightpath.v1 import agg_switch_pb2 as pb

    sw, cn = pb.AGG_NODE_KIND_SWITCH, pb.AGG_NODE_KIND_COMPUTE
    nodes = [
        pb.AggNode(id="root", kind=sw, threshold_ms=60_000),
        pb.AggNode(id="sub-1", kind=sw, parent="root", threshold_ms=60_000),
        pb.AggNode(id="sub-2", kind=sw, parent="root", threshold_ms=60_000),
    ]
    for n, parent in (("n1", "sub-1"), ("n2", "sub-1"), ("n3", "sub-1"), ("n4", "sub-2")):
        nodes.append(pb.AggNode(id=n, kind=cn, parent=parent))
    nodes.append(pb.AggNode(id="n5", kind=cn, parent="sub-2"))
    return nodes


async def waiting_nodes(pki: Pki, addresses, command_id: str):
    """The 4 nodes contributing and waiting; (tasks, the time each call ended)."""
    from lightpath.aggregation.node import ComputeNode
    from lightpath.client import channel
    from lightpath.v1 import agg_switch_pb2 as pb
    from lightpath.v1 import agg_switch_pb2_grpc

    ended: dict[str, float] = {}
    nodes = [
        ComputeNode(n, addresses["root"], tree_id=TREE, transport="grpc", credentials=pki.node(n))
        for n in WAITING
    ]

    async def one(node) -> None:
        try:
            await node.aggregate(command_id, np.ones(1024, np.float32))
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.ABORTED:
                raise
        ended[node.node_id] = time.perf_counter()
        await node.close()

    tasks = [asyncio.ensure_future(one(n)) for n in nodes]
    # Every waiting node's data is in at both sub-switches (sub-1 holds a slot: n3 never comes).
    for switch in ("sub-1", "sub-2"):
        async with channel(addresses[switch], credentials=pki.operator) as ch:
            stub = agg_switch_pb2_grpc.AggSwitchStub(ch)
            while True:
                for task in tasks:
                    if task.done():
                        task.result()  # a node that failed otherwise: say why
                state = await stub.GetSwitchState(pb.GetSwitchStateRequest())
                if any(
                    c.command_id == command_id and (c.slots_held or c.chunks_done)
                    for c in state.commands
                ):
                    break
                await asyncio.sleep(0.005)
    return tasks, ended


async def abort_rep(pki: Pki, addresses, i: int) -> float:
    from lightpath.client import channel
    from lightpath.v1 import agg_switch_pb2 as pb
    from lightpath.v1 import agg_switch_pb2_grpc

    cid = f"abort-{i}"
    await start(pki, addresses["root"], TREE, cid, ["n1", "n2", "n3", "n4", "n5"], 1024)
    tasks, ended = await waiting_nodes(pki, addresses, cid)
    async with channel(addresses["sub-1"], credentials=pki.operator) as ch:
        t0 = time.perf_counter()
        await agg_switch_pb2_grpc.AggSwitchStub(ch).AbortCommand(
            pb.AbortCommandRequest(tree_id=TREE, command_id=cid, reason="bench")
        )
    await asyncio.gather(*tasks)
    return (max(ended.values()) - t0) * 1000.0


async def correction_rep(pki: Pki, addresses, i: int) -> float:
    from lightpath.aggregation import wire
    from lightpath.aggregation.maths import DType, Kind, Packet
    from lightpath.client import channel
    from lightpath.v1 import agg_switch_pb2 as pb

    cid = f"final-{i}"
    await start(
        pki,
        addresses["root"],
        TREE,
        cid,
        ["n1", "n2", "n3", "n4", "n5"],
        1024,
        timeout_aggregator=pb.TimeoutAggregatorSelection(node="n5"),
    )
    tasks, ended = await waiting_nodes(pki, addresses, cid)
    async with channel(addresses["sub-2"], credentials=pki.node("n5")) as ch:
        contribute = ch.stream_unary(
            wire.CONTRIBUTE,
            request_serializer=wire.identity,
            response_deserializer=pb.ContributeSummary.FromString,
        )
        wrong = Packet(cid, 0, Kind.FINAL, "n5", np.zeros(1024, np.float32), destination="sub-1")
        t0 = time.perf_counter()
        try:
            await contribute(iter([wire.encode(wrong, DType.FLOAT32)]))
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    await asyncio.gather(*tasks)
    return (max(ended.values()) - t0) * 1000.0 - GRACE_S * 1000.0


async def run(reps: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="lightpath-bench-") as tmp, private_redis() as url:
        pki = Pki(tmp)
        with switches(
            pki,
            url,
            TREE,
            ["root", "sub-1", "sub-2"],
            LIGHTPATH_AGG_CORRECTION_GRACE_S=str(GRACE_S),
            LIGHTPATH_AGG_TRANSPORT="grpc",
        ) as addresses:
            await define(pki, addresses["root"], TREE, tree_nodes())
            aborts = [await abort_rep(pki, addresses, i) for i in range(reps)]
            corrections = [await correction_rep(pki, addresses, i) for i in range(reps)]
    return {
        "bench": "agg_abort",
        "reps": reps,
        "waiting_nodes": len(WAITING),
        "abort_to_all_told_ms": {
            "p50": percentile(aborts, 50),
            "p99": percentile(aborts, 99),
            "max": max(aborts),
        },
        "correction_grace_s": GRACE_S,
        "correction_to_all_told_ms_beyond_grace": {
            "p50": percentile(corrections, 50),
            "p99": percentile(corrections, 99),
            "max": max(corrections),
        },
        "command_deadline_s": 60,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20, help="commands per measure")
    args = parser.parse_args()
    emit(asyncio.run(run(args.reps)))


if __name__ == "__main__":
    main()
