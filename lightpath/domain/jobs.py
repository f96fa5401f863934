"""WS-2: a JobSpec as given by a client → the normalized request the planner works on.

Every rule broken is an INVALID_ARGUMENT naming the field and the rule (X-3):
shape not a multiple of the block shape, zero sizes, more blocks than the pod
has (in all or of one type), unknown node type, priority out of range, shrink
arrangements that are not smaller sub-boxes, parallelism degrees whose product
is not the chip count or that cannot be mapped onto rings (WS-10).

On a SWITCHED pod (seed 002) the parallelism degrees are the request and the
shape, if given, must agree (`normalize_switched`). The workload scheduler
normalises every JobSpec it is given; the cell scheduler normalises one against
each pod it considers, so both refuse the same specs with the same words.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from lightpath.domain.blocks import PodFabric
from lightpath.domain.ids import ID_RULE, is_valid_id
from lightpath.domain.rings import RingPlan, plan_rings
from lightpath.domain.slices import (
    DELAY,
    FAIL,
    MAX_PRIORITY,
    MIN_PRIORITY,
    QUEUE,
    SHRINK,
    SUSPEND,
    TERMINATE,
    Grid,
    SliceDemand,
)
from lightpath.domain.switched import SwitchedFabric
from lightpath.domain.switched_rings import Degrees, is_small
from lightpath.domain.twist import twist_violation
from lightpath.errors import FieldViolation, InvalidArgument
from lightpath.v1 import common_pb2, workload_scheduler_pb2

POLICY_NAMES = {
    common_pb2.PREEMPTION_POLICY_UNSPECIFIED: DELAY,
    common_pb2.PREEMPTION_POLICY_TERMINATE: TERMINATE,
    common_pb2.PREEMPTION_POLICY_DELAY: DELAY,
    common_pb2.PREEMPTION_POLICY_SHRINK: SHRINK,
}
POLICY_ENUM = {TERMINATE: 1, DELAY: 2, SHRINK: 3}
DEFAULT_PRIORITY = common_pb2.PRIORITY_CLASS_MEDIUM


@dataclass(frozen=True)
class NormalizedSpec:
    job_id: str
    demand: SliceDemand
    chips: tuple[int, ...]
    priority: int
    preemption: str
    shrink_to: tuple[Grid, ...]
    on_block_failure: str
    when_no_capacity: str
    degrees: dict[str, int] | None
    rings: RingPlan | None


def chips_of(grid: Grid, fabric: PodFabric) -> tuple[int, ...]:
    return tuple(g * b for g, b in zip(grid, fabric.block_shape, strict=True))


def is_sub_block(dims: list[int] | tuple[int, ...], unit: int, block: tuple[int, ...]) -> bool:
    """A shape in chips that fits inside one block and is smaller than it (issue 28)."""
    return (
        unit != common_pb2.SHAPE_UNIT_BLOCKS
        and len(dims) == len(block)
        and all(1 <= n <= b for n, b in zip(dims, block, strict=True))
        and tuple(dims) != tuple(block)
    )


def nearest_whole_blocks(dims: list[int], block: tuple[int, ...]) -> list[str]:
    """The shapes of whole blocks nearest to `dims` in chips: each extent rounded up,
    and each rounded down where that leaves at least one block."""
    up = [-(-n // b) * b for n, b in zip(dims, block, strict=True)]
    down = [max(b, n // b * b) for n, b in zip(dims, block, strict=True)]
    out = ["x".join(map(str, up))]
    if down != up:
        out.append("x".join(map(str, down)))
    if math.prod(dims) <= math.prod(block):  # a ring of 62 chips folds into one block
        out.insert(0, "x".join(map(str, block)) + " (one block)")
    return out


def to_grid(
    field: str, dims: list[int], unit: int, fabric: PodFabric, violations: list[FieldViolation]
) -> Grid | None:
    """Block grid of a shape given in chips or blocks; None (and violations) if it is bad."""
    block = fabric.block_shape
    if len(dims) != len(block):
        violations.append(
            FieldViolation(
                f"{field}.dims",
                f"must have {len(block)} extents, one per fabric dimension (got {len(dims)})",
            )
        )
        return None
    if unit not in (
        common_pb2.SHAPE_UNIT_UNSPECIFIED,
        common_pb2.SHAPE_UNIT_CHIPS,
        common_pb2.SHAPE_UNIT_BLOCKS,
    ):
        violations.append(FieldViolation("spec.unit", "must be CHIPS or BLOCKS"))
        return None
    grid: list[int] = []
    ok = True
    shape = "x".join(map(str, block))
    nearest = " or ".join(nearest_whole_blocks(dims, block)) if all(n >= 1 for n in dims) else ""
    for d, n in enumerate(dims):
        if n < 1:
            violations.append(FieldViolation(f"{field}.dims[{d}]", "must be >= 1"))
            ok = False
        elif unit == common_pb2.SHAPE_UNIT_BLOCKS:
            grid.append(n)
        elif n % block[d]:
            violations.append(
                FieldViolation(
                    f"{field}.dims[{d}]",
                    f"{n} chips is not a multiple of the block's {block[d]} "
                    f"(blocks are {shape} chips): a slice larger than a block is whole "
                    f"blocks, the nearest being {nearest}; one that fits inside a block "
                    f"(every extent <= {shape}) is packed at chip granularity",
                )
            )
            ok = False
        else:
            grid.append(n // block[d])
    return tuple(grid) if ok else None


def priority_of(spec: workload_scheduler_pb2.JobSpec, violations: list[FieldViolation]) -> int:
    if spec.priority:
        if not MIN_PRIORITY <= spec.priority <= MAX_PRIORITY:
            violations.append(
                FieldViolation("spec.priority", f"must be {MIN_PRIORITY}..{MAX_PRIORITY}")
            )
        elif spec.priority_class and spec.priority_class not in common_pb2.PriorityClass.values():
            violations.append(FieldViolation("spec.priority_class", "must be LOW, MEDIUM or HIGH"))
        elif spec.priority_class and spec.priority_class != spec.priority:
            violations.append(
                FieldViolation(
                    "spec.priority_class",
                    f"{common_pb2.PriorityClass.Name(spec.priority_class)} is "
                    f"{int(spec.priority_class)}, which disagrees with priority {spec.priority}",
                )
            )
        return spec.priority
    if spec.priority_class:
        if spec.priority_class not in common_pb2.PriorityClass.values():
            violations.append(FieldViolation("spec.priority_class", "must be LOW, MEDIUM or HIGH"))
            return DEFAULT_PRIORITY
        return int(spec.priority_class)
    return DEFAULT_PRIORITY


def _node_types(
    spec: workload_scheduler_pb2.JobSpec,
    blocks: int,
    fabric: PodFabric,
    violations: list[FieldViolation],
) -> tuple[str, ...] | None:
    known = fabric.type_counts
    names = ", ".join(sorted(known))
    if spec.node_types and spec.node_type_counts:
        violations.append(
            FieldViolation("spec.node_types", "give node_types or node_type_counts, not both")
        )
        return None
    if spec.node_types:
        types = tuple(spec.node_types)
        if len(types) != blocks:
            violations.append(
                FieldViolation(
                    "spec.node_types",
                    f"must name one node type per block position: {blocks}, got {len(types)}",
                )
            )
            return None
        for i, t in enumerate(types):
            if t not in known:
                violations.append(
                    FieldViolation(
                        f"spec.node_types[{i}]",
                        f"unknown node type {t!r}; this pod has {names}",
                    )
                )
        return types if not violations else None
    if spec.node_type_counts:
        counts = dict(spec.node_type_counts)
        for t, n in sorted(counts.items()):
            if t not in known:
                violations.append(
                    FieldViolation(
                        f"spec.node_type_counts[{t}]",
                        f"unknown node type {t!r}; this pod has {names}",
                    )
                )
            elif n < 1:
                violations.append(FieldViolation(f"spec.node_type_counts[{t}]", "must be >= 1"))
        if sum(counts.values()) != blocks:
            violations.append(
                FieldViolation(
                    "spec.node_type_counts",
                    f"counts add up to {sum(counts.values())}, the shape has {blocks} blocks",
                )
            )
        if violations:
            return None
        return tuple(t for t in sorted(counts) for _ in range(counts[t]))
    return (fabric.primary_type,) * blocks


def normalize(spec: workload_scheduler_pb2.JobSpec, fabric: PodFabric) -> NormalizedSpec:
    """Validate `spec` against the pod (WS-2) and resolve its defaults."""
    if fabric.switched is not None:
        return normalize_switched(spec, fabric)
    violations: list[FieldViolation] = []
    if not is_valid_id(spec.job_id):
        violations.append(FieldViolation("spec.job_id", ID_RULE))
    if not spec.HasField("shape") or not spec.shape.dims:
        violations.append(FieldViolation("spec.shape", "is required"))
        raise InvalidArgument.of(violations)
    if is_sub_block(list(spec.shape.dims), spec.unit, fabric.block_shape):
        return normalize_sub_block(spec, fabric, violations)
    grid = to_grid("spec.shape", list(spec.shape.dims), spec.unit, fabric, violations)
    priority = priority_of(spec, violations)
    dims = fabric.dims
    wrap = tuple(spec.wrap) if spec.wrap else (True,) * dims
    if len(wrap) != dims:
        violations.append(
            FieldViolation("spec.wrap", f"must be empty (torus) or have {dims} entries")
        )
    if violations or grid is None:
        raise InvalidArgument.of(violations)
    blocks = math.prod(grid)
    if blocks > fabric.block_count:
        raise InvalidArgument(
            "spec.shape",
            f"needs {blocks} blocks; the pod has {fabric.block_count}",
            reason="MORE_BLOCKS_THAN_POD",
        )
    types = _node_types(spec, blocks, fabric, violations)
    if types is None:
        raise InvalidArgument.of(violations)
    for t, n in sorted(Counter(types).items()):
        if n > fabric.type_counts[t]:
            violations.append(
                FieldViolation(
                    "spec.node_types" if spec.node_types else "spec.node_type_counts",
                    f"needs {n} {t} blocks; the pod has {fabric.type_counts[t]}",
                )
            )
    policy = _policy(spec, violations)
    shrink = _shrink_grids(spec, grid, fabric, policy, violations)
    _wait_and_failure_rules(spec, violations)
    chips = chips_of(grid, fabric)
    if spec.twisted and (why := twist_violation(chips, fabric.block_shape, wrap)):
        violations.append(FieldViolation("spec.twisted", why))
    if violations:
        raise InvalidArgument.of(violations)
    demand = SliceDemand(grid, types, wrap, twisted=spec.twisted)
    return _normalized(spec, demand, chips, priority, policy, shrink)


def normalize_sub_block(
    spec: workload_scheduler_pb2.JobSpec, fabric: PodFabric, violations: list[FieldViolation]
) -> NormalizedSpec:
    """WS-2 for a slice smaller than a block (issue 28): a box of chips inside one block,
    a mesh (its links are the block's electrical ones), of one node type."""
    box = tuple(spec.shape.dims)
    dims = fabric.dims
    shape = "x".join(map(str, box))
    if spec.wrap and any(spec.wrap):
        violations.append(
            FieldViolation(
                "spec.wrap",
                f"{shape} fits inside one block, whose links are electrical: a sub-block "
                "slice is a mesh (leave wrap empty or all false)",
            )
        )
    elif spec.wrap and len(spec.wrap) != dims:
        violations.append(
            FieldViolation("spec.wrap", f"must be empty (torus) or have {dims} entries")
        )
    if spec.twisted:
        violations.append(
            FieldViolation("spec.twisted", f"{shape} cannot be twisted: it fits inside one block")
        )
    priority = priority_of(spec, violations)
    types = _node_types(spec, 1, fabric, violations)
    policy = _policy(spec, violations)
    shrink = _shrink_boxes(spec, box, policy, violations)
    _wait_and_failure_rules(spec, violations)
    if violations or types is None:
        raise InvalidArgument.of(violations)
    demand = SliceDemand((1,) * dims, types, (False,) * dims, box=box)
    return _normalized(spec, demand, box, priority, policy, shrink)


def _policy(spec: workload_scheduler_pb2.JobSpec, violations: list[FieldViolation]) -> str:
    """The preemption policy a job accepts as a victim (DELAY when unknown, with a violation)."""
    policy = POLICY_NAMES.get(spec.preemption_policy)
    if policy is None:
        violations.append(FieldViolation("spec.preemption_policy", "unknown policy"))
        return DELAY
    return policy


def _wait_and_failure_rules(
    spec: workload_scheduler_pb2.JobSpec, violations: list[FieldViolation]
) -> None:
    if spec.when_no_capacity not in (0, 1, 2):
        violations.append(FieldViolation("spec.when_no_capacity", "must be QUEUE or FAIL"))
    if spec.on_block_failure not in (0, 1, 2):
        violations.append(FieldViolation("spec.on_block_failure", "must be SUSPEND or FAIL"))


def _normalized(
    spec: workload_scheduler_pb2.JobSpec,
    demand: SliceDemand,
    chips: tuple[int, ...],
    priority: int,
    policy: str,
    shrink: tuple[Grid, ...],
) -> NormalizedSpec:
    """The request of a valid spec on an OCS_TORUS pod, with its ring plan if it names
    parallelism degrees (WS-10)."""
    degrees = degrees_of(spec.parallelism) if spec.HasField("parallelism") else None
    rings = plan_rings(chips, demand.wrap, degrees, field="spec.parallelism") if degrees else None
    return NormalizedSpec(
        job_id=spec.job_id,
        demand=demand,
        chips=chips,
        priority=priority,
        preemption=policy,
        shrink_to=shrink,
        on_block_failure=FAIL if spec.on_block_failure == 2 else SUSPEND,
        when_no_capacity=FAIL if spec.when_no_capacity == 2 else QUEUE,
        degrees=degrees,
        rings=rings,
    )


def _shrink_asked(
    spec: workload_scheduler_pb2.JobSpec, policy: str, violations: list[FieldViolation]
) -> bool:
    """True when `spec.shrink_to` is to be read: policy SHRINK with arrangements given
    (a violation when one goes without the other)."""
    if policy != SHRINK:
        if spec.shrink_to:
            violations.append(
                FieldViolation("spec.shrink_to", "is only used with preemption_policy SHRINK")
            )
        return False
    if not spec.shrink_to:
        violations.append(
            FieldViolation(
                "spec.shrink_to", "preemption_policy SHRINK needs at least one smaller arrangement"
            )
        )
        return False
    return True


def _shrink_boxes(
    spec: workload_scheduler_pb2.JobSpec,
    box: Grid,
    policy: str,
    violations: list[FieldViolation],
) -> tuple[Grid, ...]:
    """SHRINK of a sub-block slice: smaller boxes in chips, each a sub-box of `box`."""
    if not _shrink_asked(spec, policy, violations):
        return ()
    out: list[Grid] = []
    for i, shape in enumerate(spec.shrink_to):
        g = tuple(shape.dims)
        if spec.unit == common_pb2.SHAPE_UNIT_BLOCKS:
            violations.append(
                FieldViolation(
                    f"spec.shrink_to[{i}]", "a sub-block slice shrinks to boxes in chips"
                )
            )
        elif (
            len(g) != len(box)
            or any(not 1 <= a <= b for a, b in zip(g, box, strict=True))
            or math.prod(g) >= math.prod(box)
        ):
            violations.append(
                FieldViolation(
                    f"spec.shrink_to[{i}]",
                    "must be a sub-box of the shape in chips (every extent 1..that of the "
                    "shape) with fewer chips",
                )
            )
        else:
            out.append(g)
    return tuple(out)


def degrees_of(p: common_pb2.ParallelismDegrees) -> dict[str, int] | None:
    """The degrees given (unset ones are 1), or None when none is given."""
    if not (p.data or p.pipeline or p.layer):
        return None
    return {"data": p.data or 1, "pipeline": p.pipeline or 1, "layer": p.layer or 1}


def _shrink_grids(
    spec: workload_scheduler_pb2.JobSpec,
    grid: Grid,
    fabric: PodFabric,
    policy: str,
    violations: list[FieldViolation],
) -> tuple[Grid, ...]:
    if not _shrink_asked(spec, policy, violations):
        return ()
    out: list[Grid] = []
    for i, shape in enumerate(spec.shrink_to):
        f = f"spec.shrink_to[{i}]"
        g = to_grid(f, list(shape.dims), spec.unit, fabric, violations)
        if g is None:
            continue
        if any(a > b for a, b in zip(g, grid, strict=True)) or math.prod(g) >= math.prod(grid):
            violations.append(
                FieldViolation(
                    f,
                    "must be a sub-box of the shape (every extent <=) with fewer blocks",
                )
            )
            continue
        out.append(g)
    return tuple(out)


def _fabric(fabric: PodFabric) -> SwitchedFabric:
    assert fabric.switched is not None
    return fabric.switched


def switched_spec_rules(
    spec: workload_scheduler_pb2.JobSpec,
    processors: int,
    groups: int,
    violations: list[FieldViolation],
) -> tuple[int, str | None]:
    """The rules of a JobSpec on a SWITCHED pod that need only its processor and group
    counts (the cell checks them too, knowing only the group size): the shape, if
    given, agrees with the degrees; no wrap, no SHRINK. Returns (priority, policy)."""
    if spec.HasField("shape") and spec.shape.dims:
        dims = list(spec.shape.dims)
        if spec.unit == common_pb2.SHAPE_UNIT_BLOCKS:
            if dims != [groups]:
                violations.append(
                    FieldViolation(
                        "spec.shape", f"in groups must be [{groups}] for {processors} processors"
                    )
                )
        elif dims != [processors]:
            violations.append(
                FieldViolation(
                    "spec.shape",
                    f"in processors must be [{processors}] (data × pipeline × layer), "
                    "or leave it empty",
                )
            )
    if spec.wrap:
        violations.append(FieldViolation("spec.wrap", "rings always close on a SWITCHED pod"))
    if spec.twisted:
        violations.append(
            FieldViolation("spec.twisted", "a SWITCHED pod has rings, not a torus to twist")
        )
    priority = priority_of(spec, violations)
    policy = POLICY_NAMES.get(spec.preemption_policy)
    if policy is None:
        violations.append(FieldViolation("spec.preemption_policy", "unknown policy"))
    elif policy == SHRINK or spec.shrink_to:
        violations.append(
            FieldViolation("spec.preemption_policy", "SHRINK is not offered on a SWITCHED pod")
        )
    _wait_and_failure_rules(spec, violations)
    return priority, policy


def normalize_switched(spec: workload_scheduler_pb2.JobSpec, fabric: PodFabric) -> NormalizedSpec:
    """WS-2 on a SWITCHED pod: the degrees are the request; shape, if given, must agree."""
    sf = _fabric(fabric)
    violations: list[FieldViolation] = []
    if not is_valid_id(spec.job_id):
        violations.append(FieldViolation("spec.job_id", ID_RULE))
    found = degrees_of(spec.parallelism) if spec.HasField("parallelism") else None
    if found is None:
        violations.append(
            FieldViolation(
                "spec.parallelism",
                "is required on a SWITCHED pod: give the data, pipeline and layer degrees "
                "(their product is the processor count)",
            )
        )
        raise InvalidArgument.of(violations)
    degrees = Degrees(found["data"], found["pipeline"], found["layer"])
    n = degrees.total
    small = is_small(sf, degrees)
    groups = 1 if small else math.ceil(n / sf.group_size)
    priority, policy = switched_spec_rules(spec, n, groups, violations)
    types = _node_types(spec, groups, fabric, violations)
    if types is not None and len(set(types)) > 1:
        violations.append(
            FieldViolation("spec.node_types", "a job on a SWITCHED pod runs on groups of one type")
        )
    if violations or types is None:
        raise InvalidArgument.of(violations)
    usable = [g for g in range(fabric.block_count) if fabric.node_types[g] == types[0]]
    if small:
        if not any(g in fabric.small_groups for g in usable):
            raise InvalidArgument(
                "spec.parallelism",
                f"{n} processors fit in one group, and this pod reserves no {types[0]} group "
                "for small jobs (LIGHTPATH_SWITCHED_SMALL_GROUPS)",
                reason="NO_SMALL_JOB_GROUPS",
            )
    elif groups > len([g for g in usable if g not in fabric.small_groups]):
        raise InvalidArgument(
            "spec.parallelism",
            f"needs {groups} groups of {sf.group_size} processors; the pod has "
            f"{len(usable) - len(fabric.small_groups & set(usable))} {types[0]} groups for large jobs",
            reason="MORE_BLOCKS_THAN_POD",
        )
    return NormalizedSpec(
        job_id=spec.job_id,
        demand=SliceDemand((groups,), types, ()),
        chips=(n,),
        priority=priority,
        preemption=policy or "DELAY",
        shrink_to=(),
        on_block_failure=FAIL if spec.on_block_failure == 2 else SUSPEND,
        when_no_capacity=FAIL if spec.when_no_capacity == 2 else QUEUE,
        degrees=found,
        rings=None,
    )


def job_degrees(norm: NormalizedSpec) -> tuple[int, int, int] | None:
    d = norm.degrees
    return (d["data"], d["pipeline"], d["layer"]) if d else None
