"""A submission checked against the cell's pods: what each pod would be asked (CS-2, CS-4).

The cell does not re-implement a pod's rules: for every registered pod it
builds the pod's static fabric (block shape, node type per block) from the
registration and runs the workload scheduler's own `normalize` on the spec
the pod would get. So a request is refused with INVALID_ARGUMENT, naming the
field and the rule, exactly when no pod of the cell could ever host it, and
the cell knows per pod how many blocks of each node type the job takes.

A SWITCHED pod (seed 002) takes parallelism degrees instead of a shape; the
cell only counts the processor groups such a job takes and leaves the rest to
the pod (`_resolve_switched`).

With a compute demand instead of a shape (CS-4) the shape is derived per pod
(pods may have different blocks) from the time left until the deadline, at
the moment the job is placed: a job that waited in the cell queue gets a
larger slice if the deadline came closer.

A shape in chips that fits inside one block (issue 28: 2x2x1 of a 4x4x4 block) is
a sub-block slice: the pod packs it with others into a block at chip granularity.
The cell counts it as chips of its node type (`choice.chips_key`), never as a
block; a twisted torus (`spec.twisted`) is checked by the same `normalize` and
takes its blocks like any block slice.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from lightpath.domain import job_update
from lightpath.domain.blocks import TYPE_NAME_RULE, PodFabric, parse_block_types
from lightpath.domain.jobs import normalize, switched_spec_rules
from lightpath.errors import FieldViolation, InvalidArgument
from lightpath.security.identity import NO_TENANT
from lightpath.v1 import cell_scheduler_pb2, common_pb2, workload_scheduler_pb2
from lightpath_services.cell_scheduler.choice import chips_key
from lightpath_services.cell_scheduler.demand import DerivedShape, derive_shape
from lightpath_services.common import validate
from lightpath_services.common.keys import ID_RULE, is_valid_id
from lightpath_services.common.settings import parse_address

DEFAULT_TENANT = NO_TENANT  # reserved: no tenant credential can carry it
TENANT_LABEL = job_update.TENANT_LABEL  # one spelling, the domain's

# Refusals that say a pod is not for this kind of request (a SWITCHED pod asked for a
# shape, an OCS_TORUS pod for degrees alone, a pod without the node type named): when
# another pod does apply, its reasons are the answer and these are left out.
TORUS_NEEDS_SHAPE = "TORUS_NEEDS_SHAPE"
SWITCHED_NEEDS_DEGREES = "SWITCHED_NEEDS_DEGREES"
NO_SUCH_NODE_TYPE = "NO_SUCH_NODE_TYPE"
NOT_APPLICABLE = frozenset({TORUS_NEEDS_SHAPE, SWITCHED_NEEDS_DEGREES, NO_SUCH_NODE_TYPE})
GENERIC_REASON = "INVALID_ARGUMENT"
NO_POD_CAN_HOST = "NO_POD_CAN_HOST"


@dataclass(frozen=True)
class PodModel:
    """The static facts of a registered pod (from its registration, CS-1)."""

    pod_id: str
    fabric_kind: int
    block_shape: tuple[int, ...]
    node_types: tuple[tuple[str, int], ...]  # (type, blocks) in block-id order
    ocs_per_axis: int = 1

    @classmethod
    def of(cls, reg: cell_scheduler_pb2.PodRegistration) -> PodModel:
        return cls(
            reg.pod_id,
            int(reg.fabric_kind),
            tuple(reg.block_shape.dims),
            tuple((t.node_type, t.blocks) for t in reg.node_types),
            reg.ocs_per_axis or 1,
        )

    @cached_property
    def fabric(self) -> PodFabric:
        types = tuple(t for t, n in self.node_types for _ in range(n))
        return PodFabric(self.pod_id, self.block_shape, types, self.ocs_per_axis)

    @property
    def block_count(self) -> int:
        return sum(n for _, n in self.node_types)

    def blocks_of(self, node_type: str) -> int:
        return sum(n for t, n in self.node_types if t == node_type)


@dataclass(frozen=True)
class Resolved:
    """A submission as one pod would get it."""

    spec: workload_scheduler_pb2.JobSpec  # what is forwarded
    # Blocks per node type; a sub-block slice: chips of its node type (`chips_key`).
    needs: Counter[str]
    grid: tuple[int, ...]
    chips: tuple[int, ...]
    priority: int
    derived: DerivedShape | None = None
    # A box of chips inside one block (issue 28): it holds no whole block.
    sub_block: bool = False

    @property
    def block_count(self) -> int:
        return 0 if self.sub_block else math.prod(self.grid)


def has_demand(req: cell_scheduler_pb2.SubmitJobRequest) -> bool:
    d = req.demand
    return bool(d.flops or d.chip_hours or d.node_type or d.HasField("deadline"))


def has_degrees(spec: workload_scheduler_pb2.JobSpec) -> bool:
    p = spec.parallelism
    return bool(p.data or p.pipeline or p.layer)


def has_shape(spec: workload_scheduler_pb2.JobSpec) -> bool:
    return spec.HasField("shape") and bool(spec.shape.dims)


def tenant_of(req: cell_scheduler_pb2.SubmitJobRequest) -> str:
    return req.tenant or DEFAULT_TENANT


def check_request(
    req: cell_scheduler_pb2.SubmitJobRequest, node_flops: Mapping[str, float]
) -> list[FieldViolation]:
    """Rules that hold whatever pods the cell has (X-3)."""
    out: list[FieldViolation] = []
    spec = req.spec
    if not is_valid_id(spec.job_id):
        out.append(FieldViolation("spec.job_id", ID_RULE))
    if req.tenant and not is_valid_id(req.tenant):
        out.append(FieldViolation("tenant", ID_RULE))
    if req.preferred_pod and not is_valid_id(req.preferred_pod):
        out.append(FieldViolation("preferred_pod", ID_RULE))
    if req.require_preferred_pod and not req.preferred_pod:
        out.append(
            FieldViolation("require_preferred_pod", "needs preferred_pod (the pod to require)")
        )
    label = spec.labels.get(TENANT_LABEL)
    if label is not None and label != tenant_of(req):
        out.append(
            FieldViolation(
                f"spec.labels[{TENANT_LABEL}]",
                f"{label!r} disagrees with tenant {tenant_of(req)!r}; set only `tenant`",
            )
        )
    if not has_demand(req):
        if (not spec.HasField("shape") or not spec.shape.dims) and not has_degrees(spec):
            out.append(
                FieldViolation(
                    "spec.shape",
                    "is required (or give parallelism degrees for a SWITCHED pod, "
                    "or a demand: flops or chip_hours)",
                )
            )
        return out
    d = req.demand
    for name in ("shape", "parallelism"):
        if spec.HasField(name):
            out.append(
                FieldViolation(f"spec.{name}", "must be empty with a demand (the cell derives it)")
            )
    if spec.unit:
        out.append(FieldViolation("spec.unit", "must be empty with a demand"))
    if spec.node_types or spec.node_type_counts:
        out.append(
            FieldViolation(
                "spec.node_types" if spec.node_types else "spec.node_type_counts",
                "must be empty with a demand; name the type in demand.node_type",
            )
        )
    if spec.shrink_to:
        out.append(
            FieldViolation("spec.shrink_to", "cannot be given with a demand (the shape is derived)")
        )
    values = {"demand.flops": d.flops, "demand.chip_hours": d.chip_hours}
    for f, v in values.items():
        if not math.isfinite(v) or v < 0:
            out.append(FieldViolation(f, "must be a finite number >= 0"))
    if (d.flops > 0) == (d.chip_hours > 0):
        out.append(FieldViolation("demand", "give flops or chip_hours (exactly one, > 0)"))
    try:
        validate.timestamp(validate.present(d, "deadline"), "demand.deadline", required=True)
    except InvalidArgument as err:
        rule = err.violations[0].rule
        out.append(
            FieldViolation("demand.deadline", "is required with a demand")
            if rule == "is required"
            else err.violations[0]
        )
    node_type = d.node_type or default_node_type(node_flops)
    if d.node_type:
        if not is_type_name(d.node_type):
            out.append(FieldViolation("demand.node_type", TYPE_NAME_RULE))
    if d.flops > 0 and node_type not in node_flops:
        known = ", ".join(sorted(node_flops)) or "none"
        out.append(
            FieldViolation(
                "demand.node_type" if d.node_type else "demand.flops",
                f"no throughput is configured for node type {node_type!r} "
                f"(LIGHTPATH_CELL_NODE_FLOPS has {known}); give chip_hours instead",
            )
        )
    return out


def is_type_name(raw: str) -> bool:
    try:
        (entry,) = parse_block_types(raw)
    except ValueError:
        return False
    return entry.count is None and entry.node_type == raw


def default_node_type(node_flops: Mapping[str, float]) -> str:
    return next(iter(node_flops), "")


def resolve(
    req: cell_scheduler_pb2.SubmitJobRequest,
    pod: PodModel,
    *,
    now_ms: int,
    node_flops: Mapping[str, float],
) -> Resolved:
    """The spec `pod` would get, and what it takes there; InvalidArgument when the pod
    could never host it (the field and rule, as the pod itself would say)."""
    spec = workload_scheduler_pb2.JobSpec()
    spec.CopyFrom(req.spec)
    spec.labels[TENANT_LABEL] = tenant_of(req)
    # The cell keeps the job when no pod can place it now: a pod only places or refuses.
    spec.when_no_capacity = workload_scheduler_pb2.WHEN_NO_CAPACITY_FAIL
    _check_node_types(spec, pod)
    if pod.fabric_kind == common_pb2.FABRIC_KIND_SWITCHED:
        return _resolve_switched(req, pod, spec)
    if not has_demand(req) and not has_shape(spec):
        raise InvalidArgument(
            "spec.shape",
            f"is required on OCS_TORUS pod {pod.pod_id} (parallelism degrees alone are a "
            "request for a SWITCHED pod)",
            reason=TORUS_NEEDS_SHAPE,
        )
    derived: DerivedShape | None = None
    if has_demand(req):
        d = req.demand
        node_type = d.node_type or default_node_type(node_flops)
        have = pod.blocks_of(node_type)
        if not have:
            raise InvalidArgument(
                "demand.node_type",
                f"pod {pod.pod_id} has no {node_type} blocks",
                reason=NO_SUCH_NODE_TYPE,
            )
        seconds = (d.deadline.ToMilliseconds() - now_ms) / 1000.0
        try:
            derived = derive_shape(
                flops=d.flops,
                chip_hours=d.chip_hours,
                seconds=seconds,
                node_type=node_type,
                flops_per_chip=node_flops.get(node_type),
                block_shape=pod.block_shape,
            )
        except ValueError as err:
            field = "demand.deadline" if seconds <= 0 else "demand"
            raise InvalidArgument(field, str(err), reason="DEMAND_UNMET") from None
        if derived.blocks > have:
            raise InvalidArgument(
                "demand.deadline",
                f"meeting it takes {derived.blocks} {node_type} blocks "
                f"({derived.chips_needed} chips); pod {pod.pod_id} has {have}",
                reason="DEMAND_UNMET",
            )
        if derived.sub_block:  # a box of chips inside one block (issue 28)
            spec.shape.CopyFrom(common_pb2.Shape(dims=list(derived.chips)))
            spec.unit = common_pb2.SHAPE_UNIT_CHIPS
            spec.node_type_counts[node_type] = 1
        else:
            spec.shape.CopyFrom(common_pb2.Shape(dims=list(derived.grid)))
            spec.unit = common_pb2.SHAPE_UNIT_BLOCKS
            spec.node_type_counts[node_type] = derived.blocks
    norm = normalize(spec, pod.fabric)
    demand = norm.demand
    if demand.box is not None:
        # A sub-block slice takes chips, not a block: counted as chips of its node type.
        (node_type,) = set(demand.node_types)
        needs = Counter({chips_key(node_type): math.prod(demand.box)})
        return Resolved(spec, needs, demand.grid, norm.chips, norm.priority, derived, True)
    return Resolved(spec, demand.type_counts(), demand.grid, norm.chips, norm.priority, derived)


def _resolve_switched(
    req: cell_scheduler_pb2.SubmitJobRequest, pod: PodModel, spec: workload_scheduler_pb2.JobSpec
) -> Resolved:
    """A SWITCHED pod (seed 002): its blocks are processor groups and a job names its
    parallelism degrees. The cell counts the groups the job takes — one when its
    processors fit in a group, else ceil(processors / group size) — and leaves the
    pod's own rules (small-job groups, ring routing) to its admission."""
    if has_demand(req):
        raise InvalidArgument(
            "demand",
            f"pod {pod.pod_id} is SWITCHED: give parallelism degrees instead of a demand",
            reason=SWITCHED_NEEDS_DEGREES,
        )
    p = spec.parallelism
    if not has_degrees(spec):
        raise InvalidArgument(
            "spec.parallelism",
            f"is required on SWITCHED pod {pod.pod_id}: the data, pipeline and layer degrees "
            "(their product is the processor count)",
            reason=SWITCHED_NEEDS_DEGREES,
        )
    processors = (p.data or 1) * (p.pipeline or 1) * (p.layer or 1)
    size = math.prod(pod.block_shape)
    groups = max(1, math.ceil(processors / size))
    # The pod's own rules that need only the group size (a shape that disagrees
    # with the degrees, wrap, SHRINK), as the pod says them (WS-2).
    violations: list[FieldViolation] = []
    priority, _ = switched_spec_rules(spec, processors, groups, violations)
    if violations:
        raise InvalidArgument.of(violations)
    if groups > pod.block_count:
        raise InvalidArgument(
            "spec.parallelism",
            f"needs {groups} groups of {size} processors; pod {pod.pod_id} has {pod.block_count}",
            reason="MORE_BLOCKS_THAN_POD",
        )
    node_type = pod.node_types[0][0]
    return Resolved(spec, Counter({node_type: groups}), (groups,), (processors,), priority)


def resolve_all(
    req: cell_scheduler_pb2.SubmitJobRequest,
    pods: Mapping[str, PodModel],
    *,
    now_ms: int,
    node_flops: Mapping[str, float],
) -> tuple[dict[str, Resolved], dict[str, InvalidArgument]]:
    """Per pod: the resolved request, or why that pod could never host it."""
    ok: dict[str, Resolved] = {}
    bad: dict[str, InvalidArgument] = {}
    for pod_id, pod in pods.items():
        try:
            ok[pod_id] = resolve(req, pod, now_ms=now_ms, node_flops=node_flops)
        except InvalidArgument as err:
            bad[pod_id] = err
    return ok, bad


def _check_node_types(spec: workload_scheduler_pb2.JobSpec, pod: PodModel) -> None:
    """A request naming node types `pod` has none of: that pod does not apply to it."""
    have = sorted({t for t, _ in pod.node_types})
    rule = "unknown node type {!r}; this pod has " + ", ".join(have)
    bad = [
        FieldViolation(f"spec.node_types[{i}]", rule.format(t))
        for i, t in enumerate(spec.node_types)
        if t not in have
    ]
    bad += [
        FieldViolation(f"spec.node_type_counts[{t}]", rule.format(t))
        for t in sorted(spec.node_type_counts)
        if t not in have
    ]
    if bad:
        raise InvalidArgument.of(bad, reason=NO_SUCH_NODE_TYPE)


def no_pod_can_host(bad: Mapping[str, InvalidArgument]) -> InvalidArgument:
    """One INVALID_ARGUMENT for a request every pod refused, from the pods it applies
    to (all of them when none does): see `grouped`."""
    applicable = {p: e for p, e in bad.items() if e.reason not in NOT_APPLICABLE}
    return grouped(applicable or bad)


def _pods(pods: list[str]) -> str:
    return ("pod " if len(pods) == 1 else "pods ") + ", ".join(pods)


def grouped(per_pod: Mapping[str, InvalidArgument]) -> InvalidArgument:
    """The pods' refusals as one error: said once when every pod refused alike, else the
    message grouped by pod; one field violation per field (each rule once, with the
    pods that gave it); the pods' own ErrorInfo reason when they agree or only one is
    specific (else NO_POD_CAN_HOST), each pod's in the metadata."""
    pods = sorted(per_pod)
    own = {p: list(dict.fromkeys(per_pod[p].violations)) for p in pods}
    rules: dict[str, dict[str, list[str]]] = {}
    for p in pods:
        for v in own[p]:
            rules.setdefault(v.field, {}).setdefault(v.rule, []).append(p)
    alike = len({tuple(vs) for vs in own.values()}) == 1
    violations = [
        FieldViolation(
            field,
            next(iter(by_rule))
            if alike
            else "; ".join(f"{rule} ({_pods(ps)})" for rule, ps in by_rule.items()),
        )
        for field, by_rule in rules.items()
    ]
    reasons = {per_pod[p].reason for p in pods}
    specific = reasons - {GENERIC_REASON}
    reason = (
        reasons.pop()
        if len(reasons) == 1
        else specific.pop()
        if len(specific) == 1
        else NO_POD_CAN_HOST
    )
    message = None
    if not alike:
        message = "no pod can host it: " + " | ".join(
            f"pod {p}: " + "; ".join(f"{v.field}: {v.rule}" for v in own[p]) for p in pods
        )
    metadata = {p: per_pod[p].reason for p in pods} if len(pods) > 1 else None
    return InvalidArgument.of(violations, reason=reason, message=message, metadata=metadata)


def check_registration(reg: cell_scheduler_pb2.PodRegistration) -> None:
    """A pod registration (CS-1): its id, endpoint, block shape and node types."""
    bad: list[FieldViolation] = []
    if not is_valid_id(reg.pod_id):
        bad.append(FieldViolation("pod.pod_id", ID_RULE))
    try:
        parse_address(reg.endpoint)
    except ValueError as err:
        bad.append(FieldViolation("pod.endpoint", str(err)))
    if not reg.block_shape.dims or any(d < 1 for d in reg.block_shape.dims):
        bad.append(FieldViolation("pod.block_shape", "needs one extent >= 1 per dimension"))
    if not reg.node_types:
        bad.append(FieldViolation("pod.node_types", "name at least one node type"))
    for i, t in enumerate(reg.node_types):
        if not is_type_name(t.node_type):
            bad.append(FieldViolation(f"pod.node_types[{i}].node_type", "is not a node type name"))
        if t.blocks < 1:
            bad.append(FieldViolation(f"pod.node_types[{i}].blocks", "must be >= 1"))
    if bad:
        raise InvalidArgument.of(bad)
