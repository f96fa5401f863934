"""Aggregation commands (AG-2) and the management role's decisions: the
timeout aggregation node (AG-10), predicted stragglers and participation
bitmaps (AG-9), and each switch's part in a command (its plan).

Pure functions of a topology snapshot and a request; the servicer loads the
snapshot, calls them and commits the result.
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from lightpath.aggregation.maths import (
    DEFAULT_FRACTION_BITS,
    DType,
    Op,
    OrderPolicy,
    Reduction,
    Trigger,
    split_chunks,
)
from lightpath.errors import FailedPrecondition, FieldViolation, InvalidArgument
from lightpath.security.identity import NO_TENANT
from lightpath_services.agg_switch.topology import NodeKind, Topology
from lightpath_services.common.keys import ID_RULE, is_valid_id

MAX_LENGTH = 1 << 31
MAX_CHUNK_BYTES = 16 << 20
MAX_DEADLINE_S = 3600.0
DEFAULT_DEADLINE_S = 30.0
DEFAULT_HISTORY_WINDOW = 10


class SlotPolicy(enum.StrEnum):
    """AG-13: what an arrival does when its switch has no free slot."""

    WAIT = "wait"
    FALLBACK = "fallback"


class TaStrategy(enum.StrEnum):
    """AG-10 (seed: 情况1-4)."""

    FIXED = "fixed"
    RANDOM_BY_ID = "random_by_id"
    LEAST_LOAD = "least_load"
    FEWEST_HOPS = "fewest_hops"
    LOWEST_LINK_COST = "lowest_link_cost"


class CommandState(enum.StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True)
class CommandSpec:
    """A started command, as stored (Redis) and as every switch sees it."""

    tree_id: str
    command_id: str
    participants: tuple[str, ...]
    dtype: DType
    op: Op
    length: int
    chunk_elems: int
    order: OrderPolicy = OrderPolicy.PRESET
    trigger: Trigger = Trigger.ALL_OR_THRESHOLD
    fraction_bits: int = DEFAULT_FRACTION_BITS
    tenant: str = NO_TENANT
    slot_policy: SlotPolicy = SlotPolicy.WAIT
    wait_for_all: bool = False
    timeout_aggregator: str = ""
    ta_strategy: TaStrategy = TaStrategy.FIXED
    predicted: tuple[str, ...] = ()
    created_at: float = 0.0
    deadline_at: float = 0.0
    topology_version: int = 0
    ps_model: str = ""
    ps_learning_rate: float = 0.0
    # The compute node the strategy chose when its leaf switch took the role
    # (combine_at_switch); "" otherwise.
    ta_combined_for: str = ""

    @property
    def reduction(self) -> Reduction:
        return Reduction(
            self.dtype, self.op, self.order, self.fraction_bits, len(self.participants)
        )

    @property
    def chunks(self) -> int:
        return split_chunks(self.length, self.chunk_elems)

    def chunk_len(self, index: int) -> int:
        return min(self.chunk_elems, self.length - index * self.chunk_elems)

    @property
    def incremental(self) -> bool:
        return self.trigger is Trigger.INCREMENTAL

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CommandSpec:
        return cls(
            tree_id=data["tree_id"],
            command_id=data["command_id"],
            participants=tuple(data["participants"]),
            dtype=DType(data["dtype"]),
            op=Op(data["op"]),
            length=int(data["length"]),
            chunk_elems=int(data["chunk_elems"]),
            order=OrderPolicy(data["order"]),
            trigger=Trigger(data["trigger"]),
            fraction_bits=int(data["fraction_bits"]),
            tenant=data["tenant"],
            slot_policy=SlotPolicy(data["slot_policy"]),
            wait_for_all=bool(data["wait_for_all"]),
            timeout_aggregator=data["timeout_aggregator"],
            ta_strategy=TaStrategy(data["ta_strategy"]),
            predicted=tuple(data["predicted"]),
            created_at=float(data["created_at"]),
            deadline_at=float(data["deadline_at"]),
            topology_version=int(data["topology_version"]),
            ps_model=data.get("ps_model", ""),
            ps_learning_rate=float(data.get("ps_learning_rate", 0.0)),
            ta_combined_for=data.get("ta_combined_for", ""),
        )


# -- each switch's part ----------------------------------------------------------


@dataclass(frozen=True)
class SwitchPlan:
    """What one switch does for one command.

    `expected`: children aggregating here (the participation bitmap's set
    bits), in topology order — the preset fold order. `members`: children with
    any participant below (where results go down). `carried`: predicted
    timeout nodes this switch names in its partial (their nearest aggregating
    ancestor, S47).
    """

    switch_id: str
    parent: str | None
    threshold_s: float
    expected: tuple[str, ...]
    members: tuple[str, ...]
    carried: tuple[str, ...]
    compute_members: frozenset[str]

    @property
    def is_root(self) -> bool:
        return self.parent is None


@dataclass(frozen=True)
class CommandPlan:
    spec: CommandSpec
    topology: Topology
    switches: Mapping[str, SwitchPlan] = field(default_factory=dict)

    @cached_property
    def position(self) -> dict[str, int]:
        return self.topology.position

    def switch(self, switch_id: str) -> SwitchPlan | None:
        return self.switches.get(switch_id)

    def bitmaps(self) -> list[tuple[str, tuple[str, ...], tuple[bool, ...]]]:
        """(switch, children with participants below, participates) per switch (AG-9)."""
        return [
            (s.switch_id, s.members, tuple(c in s.expected for c in s.members))
            for s in (self.switches[i] for i in self.topology.preorder if i in self.switches)
        ]

    @cached_property
    def preset_order(self) -> list[str]:
        return [n for n in self.topology.preorder if n in self._involved]

    @cached_property
    def _involved(self) -> set[str]:
        out = set(self.switches)
        for s in self.switches.values():
            out.update(s.members)
        return out


def plan_command(topology: Topology, spec: CommandSpec) -> CommandPlan:
    """Every switch's part in `spec` (pure; every switch computes the same)."""
    participants = set(spec.participants)
    predicted = set(spec.predicted)
    aggregating = participants - predicted
    has_member: dict[str, bool] = {}
    has_active: dict[str, bool] = {}
    for node in reversed(topology.preorder):
        kids = topology.children(node)
        has_member[node] = node in participants or any(has_member[k] for k in kids)
        has_active[node] = node in aggregating or any(has_active[k] for k in kids)
    carried: dict[str, list[str]] = {}
    for q in sorted(predicted, key=topology.position.__getitem__):
        up = topology.parent(q)
        while up is not None and not has_active[up]:
            up = topology.parent(up)
        if up is not None:
            carried.setdefault(up, []).append(q)
    switches: dict[str, SwitchPlan] = {}
    for node in topology.preorder:
        if not topology.is_switch(node) or not has_member[node]:
            continue
        kids = topology.children(node)
        members = tuple(k for k in kids if has_member[k])
        expected = tuple(
            k for k in members if (k in aggregating) or (topology.is_switch(k) and has_active[k])
        )
        switches[node] = SwitchPlan(
            switch_id=node,
            parent=topology.parent(node),
            threshold_s=topology.by_id[node].threshold_s,
            expected=expected,
            members=members,
            carried=tuple(carried.get(node, ())),
            compute_members=frozenset(k for k in members if topology.is_compute(k)),
        )
    return CommandPlan(spec, topology, switches)


# -- the timeout aggregation node (AG-10) ----------------------------------------


@dataclass(frozen=True)
class Candidate:
    node: str
    kind: NodeKind
    hops: int
    link_cost: float
    load: float
    score: float


def eligible_candidates(topology: Topology, participants: Iterable[str]) -> list[str]:
    """Participants, the switches above them and the dedicated nodes, in preorder."""
    parts = set(participants)
    above: set[str] = set()
    for p in parts:
        above.update(topology.path_to_root(p)[1:])
    return [
        n
        for n in topology.preorder
        if n in parts or n in above or topology.kind(n) is NodeKind.DEDICATED
    ]


def _check_candidate(
    topology: Topology, node: str, participants: set[str], field_name: str
) -> FieldViolation | None:
    if node not in topology.by_id:
        return FieldViolation(field_name, f"{node!r} is not a node of tree {topology.tree_id}")
    if topology.is_compute(node) and node not in participants:
        return FieldViolation(
            field_name,
            f"compute node {node!r} is not a participant; a compute node aggregates "
            "late data only for a command it takes part in",
        )
    return None


def choose_timeout_aggregator(
    topology: Topology,
    participants: Sequence[str],
    strategy: TaStrategy,
    *,
    node: str = "",
    candidates: Sequence[str] = (),
    command_id: str = "",
    loads: Mapping[str, float] | None = None,
) -> tuple[str, list[Candidate]]:
    """AG-10: the fixed node, or the best candidate by the strategy (ties go to
    the earlier node in preorder). Returns the node and every candidate scored."""
    parts = set(participants)
    loads = loads or {}
    bad: list[FieldViolation] = []
    for i, c in enumerate(candidates):
        if v := _check_candidate(topology, c, parts, f"candidates[{i}]"):
            bad.append(v)
    if len(set(candidates)) != len(candidates):
        bad.append(FieldViolation("candidates", "must not repeat a node"))
    if strategy is TaStrategy.FIXED:
        fixed = node or topology.default_timeout_aggregator()
        if v := _check_candidate(topology, fixed, parts, "node"):
            bad.append(v)
        elif candidates and fixed not in candidates:
            bad.append(FieldViolation("node", f"{fixed!r} is not among the candidates"))
    elif node:
        bad.append(FieldViolation("node", f"names the node of FIXED; strategy is {strategy}"))
    if bad:
        raise InvalidArgument.of(bad, reason="INVALID_TIMEOUT_AGGREGATOR")
    pool = list(candidates) or eligible_candidates(topology, parts)

    def score(n: str) -> float:
        if strategy is TaStrategy.RANDOM_BY_ID:
            digest = hashlib.sha256(f"{command_id}/{n}".encode()).digest()
            return int.from_bytes(digest[:8], "big") / float(1 << 64)
        if strategy is TaStrategy.LEAST_LOAD:
            return float(loads.get(n, 0.0))
        if strategy is TaStrategy.FEWEST_HOPS:
            return float(topology.hops(n))
        if strategy is TaStrategy.LOWEST_LINK_COST:
            return topology.link_cost_to_root(n)
        return 0.0 if n == fixed else 1.0

    scored = [
        Candidate(
            n,
            topology.kind(n),
            topology.hops(n),
            topology.link_cost_to_root(n),
            float(loads.get(n, 0.0)),
            score(n),
        )
        for n in pool
    ]
    if strategy is TaStrategy.FIXED:
        return fixed, scored
    best = min(scored, key=lambda c: (c.score, topology.position[c.node]))
    return best.node, scored


def combine_at_switch(topology: Topology, node: str) -> tuple[str, str]:
    """(the node that combines, the compute node it combines for or "").

    A compute node chosen as timeout aggregation node hands the role to its
    leaf switch: the late data reaches that switch on its way to the node
    anyway, and the switch's combine is the same preset-order code as the
    SDK's (`TimeoutAggregator`), so the bits do not change. A client that does
    not implement the combine then never has the role."""
    if topology.is_compute(node):
        return topology.leaf_switch(node), node
    return node, ""


# -- predicted stragglers (AG-9) -------------------------------------------------


def worst_lateness(history: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Each node's largest lateness over the history entries."""
    out: dict[str, float] = {}
    for entry in history:
        for node, late in entry.items():
            if late > out.get(node, -math.inf):
                out[node] = late
    return out


def predict_stragglers(
    history: Iterable[Mapping[str, float]],
    *,
    top_k: int = 0,
    threshold_s: float = 0.0,
    order: Mapping[str, int] | None = None,
) -> list[tuple[str, float]]:
    """AG-9 (seed: the text after S302): from each node's lateness against the
    first arrival at its switch, the `top_k` latest nodes, or every node later
    than `threshold_s`. Nodes never late (0 s) are never predicted."""
    if top_k and threshold_s:
        raise InvalidArgument("options", "set top_k or threshold_s, not both")
    if top_k < 0 or threshold_s < 0 or not math.isfinite(threshold_s):
        raise InvalidArgument("options", "top_k and threshold_s must be >= 0")
    worst = worst_lateness(history)
    rank = order or {}
    ranked = sorted(
        ((n, w) for n, w in worst.items() if w > 0),
        key=lambda nw: (-nw[1], rank.get(nw[0], 0), nw[0]),
    )
    if top_k:
        return ranked[:top_k]
    if threshold_s:
        return [(n, w) for n, w in ranked if w > threshold_s]
    return []


# -- a new command (AG-2) --------------------------------------------------------


@dataclass(frozen=True)
class CommandRequest:
    """StartCommand's fields, as plain values."""

    command_id: str
    participants: Sequence[str]
    dtype: DType | None
    op: Op | None
    length: int
    order: OrderPolicy = OrderPolicy.PRESET
    trigger: Trigger = Trigger.ALL_OR_THRESHOLD
    deadline_s: float = 0.0
    tenant: str = ""
    slot_policy: SlotPolicy = SlotPolicy.WAIT
    wait_for_all: bool = False
    chunk_bytes: int = 0
    ta_strategy: TaStrategy = TaStrategy.FIXED
    ta_node: str = ""
    ta_candidates: Sequence[str] = ()
    ta_combine_at_switch: bool = False
    predicted: Sequence[str] = ()
    predict_top_k: int = 0
    predict_threshold_s: float = 0.0
    history_window: int = 0
    fraction_bits: int | None = None
    ps_model: str = ""
    ps_learning_rate: float = 0.0


def new_command(
    topology: Topology,
    req: CommandRequest,
    *,
    now: float,
    default_chunk_bytes: int,
    loads: Mapping[str, float] | None = None,
    history: Sequence[Mapping[str, float]] = (),
) -> CommandSpec:
    """Validate `req` against the tree and decide what management decides:
    the timeout aggregation node and the predicted stragglers. Raises
    InvalidArgument (bad fields) or FailedPrecondition (valid fields the tree
    cannot honour)."""
    bad: list[FieldViolation] = []
    if not is_valid_id(req.command_id):
        bad.append(FieldViolation("command_id", ID_RULE))
    if not req.participants:
        bad.append(FieldViolation("participants", "must name at least one compute node"))
    seen: set[str] = set()
    for i, p in enumerate(req.participants):
        if p in seen:
            bad.append(FieldViolation(f"participants[{i}]", f"{p!r} is listed twice"))
        seen.add(p)
        if not topology.is_compute(p):
            bad.append(
                FieldViolation(
                    f"participants[{i}]", f"{p!r} is not a compute node of tree {topology.tree_id}"
                )
            )
    if req.dtype is None:
        bad.append(FieldViolation("dtype", "must be one of int32, int64, float32, float64, bool"))
    if req.op is None:
        bad.append(FieldViolation("op", "must be one of sum, min, max, prod, and, or"))
    if not 0 < req.length <= MAX_LENGTH:
        bad.append(FieldViolation("length", f"must be within 1..{MAX_LENGTH} elements"))
    if not (0 <= req.deadline_s <= MAX_DEADLINE_S and math.isfinite(req.deadline_s)):
        bad.append(FieldViolation("deadline", f"must be within 0..{MAX_DEADLINE_S:.0f} s"))
    tenant = req.tenant or NO_TENANT
    if not is_valid_id(tenant):
        bad.append(FieldViolation("tenant", ID_RULE))
    if req.ps_model and not is_valid_id(req.ps_model):
        bad.append(FieldViolation("parameter_server.model_id", ID_RULE))
    if req.ps_model and not math.isfinite(req.ps_learning_rate):
        bad.append(FieldViolation("parameter_server.learning_rate", "must be finite"))
    reduction: Reduction | None = None
    if req.dtype is not None and req.op is not None:
        bits = DEFAULT_FRACTION_BITS if req.fraction_bits is None else req.fraction_bits
        reduction = Reduction(req.dtype, req.op, req.order, bits, max(1, len(req.participants)))
        bad.extend(reduction.violations())
        if req.ps_model and not (req.dtype.is_float and req.op is Op.SUM):
            bad.append(
                FieldViolation(
                    "parameter_server.model_id",
                    "a parameter server applies a float sum (dtype float32/float64, op sum)",
                )
            )
    chunk_elems = 0
    if reduction is not None:
        chunk_bytes = req.chunk_bytes or default_chunk_bytes
        if not (reduction.itemsize <= chunk_bytes <= MAX_CHUNK_BYTES) or (
            chunk_bytes % reduction.itemsize
        ):
            bad.append(
                FieldViolation(
                    "chunk_bytes",
                    f"must be a multiple of {reduction.itemsize} (the {req.dtype} size) "
                    f"within {reduction.itemsize}..{MAX_CHUNK_BYTES}",
                )
            )
        chunk_elems = chunk_bytes // reduction.itemsize
    for i, p in enumerate(req.predicted):
        if p not in seen:
            bad.append(
                FieldViolation(f"predicted_timeout_nodes[{i}]", f"{p!r} is not a participant")
            )
    if req.predicted and (req.predict_top_k or req.predict_threshold_s):
        bad.append(
            FieldViolation(
                "predicted_timeout_nodes", "name the stragglers or predict them, not both"
            )
        )
    if bad:
        raise InvalidArgument.of(bad)
    assert req.dtype is not None and req.op is not None and reduction is not None
    participants = tuple(sorted(req.participants, key=topology.position.__getitem__))
    predicted = list(req.predicted)
    if req.predict_top_k or req.predict_threshold_s:
        window = [{n: v for n, v in h.items() if n in seen} for h in history]
        predicted = [
            n
            for n, _ in predict_stragglers(
                window,
                top_k=req.predict_top_k,
                threshold_s=req.predict_threshold_s,
                order=topology.position,
            )
        ]
    if predicted and set(predicted) >= set(participants):
        raise FailedPrecondition(
            "predicted_timeout_nodes",
            "every participant would be a timeout node; at least one must aggregate in the tree",
            reason="NO_AGGREGATING_PARTICIPANT",
        )
    ta, _ = choose_timeout_aggregator(
        topology,
        participants,
        req.ta_strategy,
        node=req.ta_node,
        candidates=req.ta_candidates,
        command_id=req.command_id,
        loads=loads,
    )
    combined_for = ""
    if req.ta_combine_at_switch:
        ta, combined_for = combine_at_switch(topology, ta)
    deadline_s = req.deadline_s or DEFAULT_DEADLINE_S
    return CommandSpec(
        tree_id=topology.tree_id,
        command_id=req.command_id,
        participants=participants,
        dtype=req.dtype,
        op=req.op,
        length=req.length,
        chunk_elems=chunk_elems,
        order=req.order,
        trigger=req.trigger,
        fraction_bits=reduction.fraction_bits,
        tenant=tenant,
        slot_policy=req.slot_policy,
        wait_for_all=req.wait_for_all,
        timeout_aggregator=ta,
        ta_strategy=req.ta_strategy,
        predicted=tuple(sorted(predicted, key=topology.position.__getitem__)),
        created_at=now,
        deadline_at=now + deadline_s,
        topology_version=topology.version,
        ps_model=req.ps_model,
        ps_learning_rate=req.ps_learning_rate,
        ta_combined_for=combined_for,
    )


def participation_bitmaps(
    topology: Topology, participants: Sequence[str], predicted: Sequence[str]
) -> list[tuple[str, tuple[str, ...], tuple[bool, ...]]]:
    """The bitmaps a command of `participants` would get with `predicted` cleared (AG-9)."""
    spec = CommandSpec(
        tree_id=topology.tree_id,
        command_id="preview",
        participants=tuple(participants),
        dtype=DType.FLOAT32,
        op=Op.SUM,
        length=1,
        chunk_elems=1,
        predicted=tuple(predicted),
    )
    return plan_command(topology, spec).bitmaps()
