"""Protobuf ⇄ domain for agg_switch (no decisions here)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format

from lightpath.aggregation.maths import DType, Op, OrderPolicy, Trigger
from lightpath.aggregation.wire import DTYPE_TO_PB, PB_TO_DTYPE
from lightpath.errors import FieldViolation, InvalidArgument
from lightpath.v1 import agg_switch_pb2 as pb
from lightpath_services.agg_switch.command import (
    CommandRequest,
    CommandSpec,
    CommandState,
    SlotPolicy,
    TaStrategy,
    plan_command,
)
from lightpath_services.agg_switch.store import CommandRecord
from lightpath_services.agg_switch.topology import NodeKind, NodeSpec, Topology
from lightpath_services.common import validate

OP_TO_PB = {
    Op.SUM: pb.AGG_OP_SUM,
    Op.MIN: pb.AGG_OP_MIN,
    Op.MAX: pb.AGG_OP_MAX,
    Op.PROD: pb.AGG_OP_PROD,
    Op.AND: pb.AGG_OP_AND,
    Op.OR: pb.AGG_OP_OR,
}
PB_TO_OP = {v: k for k, v in OP_TO_PB.items()}
ORDER_TO_PB = {
    OrderPolicy.ARRIVAL: pb.ORDER_POLICY_ARRIVAL,
    OrderPolicy.PRESET: pb.ORDER_POLICY_PRESET,
    OrderPolicy.EXACT: pb.ORDER_POLICY_EXACT,
}
PB_TO_ORDER = {v: k for k, v in ORDER_TO_PB.items()} | {
    pb.ORDER_POLICY_UNSPECIFIED: OrderPolicy.PRESET
}
TRIGGER_TO_PB = {
    Trigger.ALL_OR_THRESHOLD: pb.TRIGGER_MODE_ALL_OR_THRESHOLD,
    Trigger.INCREMENTAL: pb.TRIGGER_MODE_INCREMENTAL,
}
PB_TO_TRIGGER = {v: k for k, v in TRIGGER_TO_PB.items()} | {
    pb.TRIGGER_MODE_UNSPECIFIED: Trigger.ALL_OR_THRESHOLD
}
SLOT_TO_PB = {SlotPolicy.WAIT: pb.SLOT_POLICY_WAIT, SlotPolicy.FALLBACK: pb.SLOT_POLICY_FALLBACK}
PB_TO_SLOT = {v: k for k, v in SLOT_TO_PB.items()} | {pb.SLOT_POLICY_UNSPECIFIED: SlotPolicy.WAIT}
STRATEGY_TO_PB = {
    TaStrategy.FIXED: pb.TA_STRATEGY_FIXED,
    TaStrategy.RANDOM_BY_ID: pb.TA_STRATEGY_RANDOM_BY_ID,
    TaStrategy.LEAST_LOAD: pb.TA_STRATEGY_LEAST_LOAD,
    TaStrategy.FEWEST_HOPS: pb.TA_STRATEGY_FEWEST_HOPS,
    TaStrategy.LOWEST_LINK_COST: pb.TA_STRATEGY_LOWEST_LINK_COST,
}
PB_TO_STRATEGY = {v: k for k, v in STRATEGY_TO_PB.items()} | {
    pb.TA_STRATEGY_UNSPECIFIED: TaStrategy.FIXED
}
STATE_TO_PB = {
    CommandState.RUNNING: pb.AGG_COMMAND_STATE_RUNNING,
    CommandState.COMPLETED: pb.AGG_COMMAND_STATE_COMPLETED,
    CommandState.FAILED: pb.AGG_COMMAND_STATE_FAILED,
}
KIND_TO_PB = {
    NodeKind.SWITCH: pb.AGG_NODE_KIND_SWITCH,
    NodeKind.COMPUTE: pb.AGG_NODE_KIND_COMPUTE,
    NodeKind.DEDICATED: pb.AGG_NODE_KIND_DEDICATED,
}
PB_TO_KIND = {v: k for k, v in KIND_TO_PB.items()}


def enum_value(mapping: Mapping[Any, Any], value: int, field: str, allowed: str) -> Any:
    if value not in mapping:
        raise InvalidArgument(field, f"must be one of {allowed}")
    return mapping[value]


# -- topology -------------------------------------------------------------------


def node_specs(topology: pb.AggTopology) -> list[NodeSpec]:
    return [
        NodeSpec(
            id=n.id,
            kind=PB_TO_KIND.get(n.kind),
            parent=n.parent,
            threshold_ms=n.threshold_ms,
            endpoint=n.endpoint,
            link_cost=n.link_cost,
        )
        for n in topology.nodes
    ]


def topology_to_pb(topo: Topology, endpoints: Mapping[str, str]) -> pb.AggTopology:
    out = pb.AggTopology(
        tree_id=topo.tree_id,
        timeout_aggregator=topo.timeout_aggregator,
        version=topo.version,
        nodes=[
            pb.AggNode(
                id=n.id,
                kind=KIND_TO_PB[n.kind],
                parent=n.parent or "",
                threshold_ms=n.threshold_ms,
                endpoint=n.endpoint,
                link_cost=n.link_cost,
            )
            for n in topo.nodes
        ],
    )
    if topo.defined_at:
        out.defined_at.FromNanoseconds(int(topo.defined_at * 1e9))
    for n in topo.nodes:
        if n.kind is not NodeKind.COMPUTE:
            addr = n.endpoint or endpoints.get(n.id, "")
            if addr:
                out.endpoints[n.id] = addr
    return out


# -- commands -------------------------------------------------------------------


def command_request(req: pb.StartCommandRequest) -> CommandRequest:
    bad: list[FieldViolation] = []
    dtype = PB_TO_DTYPE.get(req.dtype)
    op = PB_TO_OP.get(req.op)
    checks: list[tuple[str, int, Mapping[Any, Any], str]] = [
        ("order_policy", req.order_policy, PB_TO_ORDER, "ARRIVAL, PRESET or EXACT"),
        ("trigger", req.trigger, PB_TO_TRIGGER, "ALL_OR_THRESHOLD or INCREMENTAL"),
        ("slot_policy", req.slot_policy, PB_TO_SLOT, "WAIT or FALLBACK"),
        (
            "timeout_aggregator.strategy",
            req.timeout_aggregator.strategy,
            PB_TO_STRATEGY,
            "FIXED, RANDOM_BY_ID, LEAST_LOAD, FEWEST_HOPS or LOWEST_LINK_COST",
        ),
    ]
    for field, value, mapping, allowed in checks:
        if value not in mapping:
            bad.append(FieldViolation(field, f"must be one of {allowed}"))
    deadline_s = 0.0
    try:
        deadline_s = validate.duration(req.deadline, "deadline", min_s=0) or 0.0
    except InvalidArgument as err:
        bad.extend(err.violations)
    opts = req.predict_stragglers
    if opts.threshold_s < 0:
        bad.append(FieldViolation("predict_stragglers.threshold_s", "must be >= 0"))
    if opts.top_k and opts.threshold_s:
        bad.append(FieldViolation("predict_stragglers", "set top_k or threshold_s, not both"))
    if bad:
        raise InvalidArgument.of(bad)
    return CommandRequest(
        command_id=req.command_id,
        participants=list(req.participants),
        dtype=dtype,
        op=op,
        length=req.length,
        order=PB_TO_ORDER[req.order_policy],
        trigger=PB_TO_TRIGGER[req.trigger],
        deadline_s=deadline_s,
        tenant=req.tenant,
        slot_policy=PB_TO_SLOT[req.slot_policy],
        wait_for_all=req.wait_for_all,
        chunk_bytes=req.chunk_bytes,
        ta_strategy=PB_TO_STRATEGY[req.timeout_aggregator.strategy],
        ta_node=req.timeout_aggregator.node,
        ta_candidates=list(req.timeout_aggregator.candidates),
        ta_combine_at_switch=req.timeout_aggregator.combine_at_switch,
        predicted=list(req.predicted_timeout_nodes),
        predict_top_k=opts.top_k,
        predict_threshold_s=opts.threshold_s,
        history_window=opts.history_window,
        fraction_bits=(req.exact_fraction_bits if req.HasField("exact_fraction_bits") else None),
        ps_model=req.parameter_server.model_id,
        ps_learning_rate=req.parameter_server.learning_rate,
    )


def request_digest(req: pb.StartCommandRequest, tree_id: str) -> str:
    """Fingerprint of a StartCommand request: a retry carries the same (X-5)."""
    canonical = json_format.MessageToDict(req, preserving_proto_field_name=True)
    canonical["tree_id"] = tree_id
    return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()


def _ts(msg: Any, seconds: float) -> None:
    if seconds:
        msg.FromNanoseconds(int(seconds * 1e9))


def bitmaps_to_pb(bitmaps) -> list[pb.SwitchBitmap]:
    return [
        pb.SwitchBitmap(switch_id=s, children=list(kids), participates=list(bits))
        for s, kids, bits in bitmaps
    ]


def hold_to_pb(switch_id: str, h: Mapping[str, Any]) -> pb.SlotHold:
    return pb.SlotHold(
        switch_id=switch_id,
        chunks=h["chunks"],
        max_ms=h["max_ms"],
        mean_ms=h["mean_ms"],
        total_ms=h["total_ms"],
        timed_out_chunks=h["timed_out_chunks"],
        fallback_chunks=h["fallback_chunks"],
        timeout_nodes=h["timeout_nodes"],
        bypass_entries_created=h["bypass_entries_created"],
        duplicates=h["duplicates"],
        waited_ms=h["waited_ms"],
    )


def command_to_pb(
    spec: CommandSpec, topology: Topology | None, record: CommandRecord | None = None
) -> pb.AggCommand:
    out = pb.AggCommand(
        tree_id=spec.tree_id,
        command_id=spec.command_id,
        state=STATE_TO_PB[record.state if record else CommandState.RUNNING],
        participants=list(spec.participants),
        dtype=DTYPE_TO_PB[spec.dtype],
        op=OP_TO_PB[spec.op],
        length=spec.length,
        order_policy=ORDER_TO_PB[spec.order],
        trigger=TRIGGER_TO_PB[spec.trigger],
        tenant=spec.tenant,
        slot_policy=SLOT_TO_PB[spec.slot_policy],
        wait_for_all=spec.wait_for_all,
        chunk_elems=spec.chunk_elems,
        chunks=spec.chunks,
        timeout_aggregator=spec.timeout_aggregator,
        combined_for=spec.ta_combined_for,
        ta_strategy=STRATEGY_TO_PB[spec.ta_strategy],
        predicted_timeout_nodes=list(spec.predicted),
        topology_version=spec.topology_version,
        exact_fraction_bits=spec.fraction_bits,
        parameter_server=pb.ParameterServerOptions(
            model_id=spec.ps_model, learning_rate=spec.ps_learning_rate
        ),
    )
    _ts(out.created_at, spec.created_at)
    _ts(out.deadline, spec.deadline_at)
    if topology is not None and topology.version == spec.topology_version:
        plan = plan_command(topology, spec)
        out.bitmaps.extend(bitmaps_to_pb(plan.bitmaps()))
        out.preset_order.extend(plan.preset_order)
    if record is not None:
        _ts(out.finished_at, record.finished_at)
        out.failure = record.failure
        out.failure_reason = record.failure_reason
        out.missing_nodes.extend(record.missing)
        timeouts: set[str] = set()
        pos = topology.position if topology else {}
        for switch in sorted(record.holds, key=lambda s: (pos.get(s, 1 << 30), s)):
            h = record.holds[switch]
            out.slot_holds.append(hold_to_pb(switch, h))
            timeouts.update(h["timeout_nodes"])
        out.timeout_nodes.extend(sorted(timeouts, key=lambda n: (pos.get(n, 0), n)))
    return out


def dtype_of(value: int, field: str) -> DType:
    dtype = PB_TO_DTYPE.get(value)
    if dtype is None:
        raise InvalidArgument(field, "must be one of int32, int64, float32, float64, bool")
    return dtype
