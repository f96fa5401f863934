"""The seed's clusters (seed 003) as topologies, and small helpers."""

from __future__ import annotations

from collections.abc import Sequence

from lightpath.aggregation.maths import DType, Op, OrderPolicy, Trigger
from lightpath_services.agg_switch.command import (
    CommandRequest,
    CommandSpec,
    SlotPolicy,
    TaStrategy,
    new_command,
)
from lightpath_services.agg_switch.topology import NodeKind, NodeSpec, Topology, validate_topology

S, C, D = NodeKind.SWITCH, NodeKind.COMPUTE, NodeKind.DEDICATED


def two_switch_cluster(sub_ms: int = 100, root_ms: int = 300, dedicated: bool = False) -> Topology:
    """The clusters of the seed's last two embodiments: a first switch with
    compute nodes 1-3, a second with 4-5, both under the root."""
    nodes = [
        NodeSpec("root", S, "", root_ms),
        NodeSpec("sw1", S, "root", sub_ms),
        NodeSpec("sw2", S, "root", sub_ms),
        NodeSpec("n1", C, "sw1"),
        NodeSpec("n2", C, "sw1"),
        NodeSpec("n3", C, "sw1"),
        NodeSpec("n4", C, "sw2"),
        NodeSpec("n5", C, "sw2"),
    ]
    if dedicated:
        nodes.append(NodeSpec("ta", D, "root"))
    return validate_topology("seed-end", nodes)


# The seed's HPCC 100 (Fig. 1 as the text describes it): root switch 240 over
# sub-switches 201, 202, 203; 201 over sub-switch 250 and compute node 113;
# 250 over 111 and 112; 202 over 121-123; 203 over six compute nodes. The
# figure numbering the last six is not in the text; they are listed so that
# the history example's values fall on the nodes the text names (the twelve
# values in order: 4.5 s → 113, 6 s → 134).
HPCC_COMPUTE = ["111", "112", "113", "121", "122", "123", "131", "132", "134", "135", "136", "137"]
HISTORY_LATENESS = [0, 2.1, 4.5, 1.3, 0.5, 0.5, 0.3, 1.5, 6, 2, 3, 4]


def hpcc_100(sub_ms: int = 100, root_ms: int = 400) -> Topology:
    nodes = [
        NodeSpec("240", S, "", root_ms),
        NodeSpec("201", S, "240", sub_ms * 2),
        NodeSpec("250", S, "201", sub_ms),
        NodeSpec("111", C, "250"),
        NodeSpec("112", C, "250"),
        NodeSpec("113", C, "201"),
        NodeSpec("202", S, "240", sub_ms),
        NodeSpec("121", C, "202"),
        NodeSpec("122", C, "202"),
        NodeSpec("123", C, "202"),
        NodeSpec("203", S, "240", sub_ms),
        *(NodeSpec(n, C, "203") for n in HPCC_COMPUTE[6:]),
    ]
    return validate_topology("hpcc-100", nodes)


def command(
    topology: Topology,
    participants: Sequence[str] | None = None,
    *,
    command_id: str = "X",
    dtype: DType = DType.INT64,
    op: Op = Op.SUM,
    length: int = 3,
    chunk_elems: int = 2,
    ta: str = "",
    strategy: TaStrategy = TaStrategy.FIXED,
    order: OrderPolicy = OrderPolicy.PRESET,
    trigger: Trigger = Trigger.ALL_OR_THRESHOLD,
    predicted: Sequence[str] = (),
    deadline_s: float = 30.0,
    wait_for_all: bool = False,
    slot_policy: SlotPolicy = SlotPolicy.WAIT,
    tenant: str = "",
    fraction_bits: int | None = None,
    history: Sequence[dict[str, float]] = (),
    top_k: int = 0,
    threshold_s: float = 0.0,
) -> CommandSpec:
    return new_command(
        topology,
        CommandRequest(
            command_id=command_id,
            participants=list(participants or topology.compute_nodes),
            dtype=dtype,
            op=op,
            length=length,
            order=order,
            trigger=trigger,
            deadline_s=deadline_s,
            tenant=tenant,
            slot_policy=slot_policy,
            wait_for_all=wait_for_all,
            chunk_bytes=chunk_elems * dtype.numpy.itemsize,
            ta_strategy=strategy,
            ta_node=ta,
            predicted=list(predicted),
            predict_top_k=top_k,
            predict_threshold_s=threshold_s,
            fraction_bits=fraction_bits,
        ),
        now=0.0,
        default_chunk_bytes=1 << 20,
        history=history,
    )
