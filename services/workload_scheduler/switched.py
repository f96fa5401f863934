"""The workload scheduler on a SWITCHED pod (seed 002, SW-2 … SW-5).

Such a pod's "blocks" are its processor groups, so the scheduler's machinery
— queue, priorities, preemption of large jobs, events, completion, failure
handling, replicas — works unchanged; what differs lives here:

* a job names its parallelism degrees (data, pipeline, layer) instead of a
  shape (`normalize_switched`);
* placement is `switched_placement` (small jobs packed into groups reserved
  for them, large jobs in whole groups, locality under one tier-0 switch
  first) — the n-th candidate after n failed ring reservations, so a job whose
  rings could not be routed tries the next-best groups (`plan_switched_admission`);
* a failed group is replaced by a free one under the same tier-0 switch first
  (`plan_switched_replacement`); a small job on a failed group is requeued;
* the pod's ocs_manager reserves the rings (ReserveRings, see ocs.py).
"""

from __future__ import annotations

import math
from collections import Counter
from itertools import islice

from lightpath.errors import FieldViolation, InvalidArgument, ResourceExhausted
from lightpath.v1 import common_pb2, workload_scheduler_pb2
from services.common.keys import ID_RULE, is_valid_id
from services.ocs_manager.switched.fabric import SwitchedFabric
from services.ocs_manager.switched.rings import Degrees, Tile, replacement_order
from services.workload_scheduler.fabric import PodFabric
from services.workload_scheduler.model import FAIL, QUEUE, SHRINK, SUSPEND, SliceDemand, SliceJob
from services.workload_scheduler.placement import PodState, Unplaceable
from services.workload_scheduler.planner import (
    Allocation,
    Replacement,
    _release_first,
    apply_victims,
)
from services.workload_scheduler.preemption import choose_victims
from services.workload_scheduler.spec import (
    POLICY_NAMES,
    NormalizedSpec,
    _node_types,
    degrees_of,
    priority_of,
)
from services.workload_scheduler.switched_placement import (
    SwitchedPodState,
    is_small,
    placements,
)


def _fabric(fabric: PodFabric) -> SwitchedFabric:
    assert fabric.switched is not None
    return fabric.switched


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
    if spec.HasField("shape") and spec.shape.dims:
        dims = list(spec.shape.dims)
        if spec.unit == common_pb2.SHAPE_UNIT_BLOCKS:
            if dims != [groups]:
                violations.append(
                    FieldViolation("spec.shape", f"in groups must be [{groups}] for {n} processors")
                )
        elif dims != [n]:
            violations.append(
                FieldViolation(
                    "spec.shape",
                    f"in processors must be [{n}] (data × pipeline × layer), or leave it empty",
                )
            )
    if spec.wrap:
        violations.append(FieldViolation("spec.wrap", "rings always close on a SWITCHED pod"))
    priority = priority_of(spec, violations)
    policy = POLICY_NAMES.get(spec.preemption_policy)
    if policy is None:
        violations.append(FieldViolation("spec.preemption_policy", "unknown policy"))
    elif policy == SHRINK or spec.shrink_to:
        violations.append(
            FieldViolation("spec.preemption_policy", "SHRINK is not offered on a SWITCHED pod")
        )
    if spec.when_no_capacity not in (0, 1, 2):
        violations.append(FieldViolation("spec.when_no_capacity", "must be QUEUE or FAIL"))
    if spec.on_block_failure not in (0, 1, 2):
        violations.append(FieldViolation("spec.on_block_failure", "must be SUSPEND or FAIL"))
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


def switched_state(state: PodState, node_type: str, allow_wired=()) -> SwitchedPodState:
    """The snapshot as switched placement sees it: groups of other types, held
    groups and groups whose rings may still be reserved count as taken."""
    fabric = state.fabric
    allow = set(allow_wired)
    small = fabric.small_groups
    failed = {
        g
        for g in range(fabric.block_count)
        if g in state.failed or fabric.node_types[g] != node_type
    }
    large = {
        g: state.owner.get(g) or state.wired.get(g, "")
        for g in range(fabric.block_count)
        if g not in small and g not in failed and not state.allocatable(g, allow)
    }
    tiles: dict[str, Tile] = {}
    for n, key in enumerate({**state.tile_owner, **state.tile_wired}):
        g, i, j = (int(x) for x in key[1:].split("."))
        tiles[f"~{n}"] = Tile(g, i, j, 1, 1)
    return SwitchedPodState(frozenset(small), frozenset(failed), large, tiles)


def plan_switched_admission(
    state: PodState, job: SliceJob, *, preempt: bool = True
) -> Allocation | Unplaceable:
    """SW-2/SW-3 placement; the `job.attempts`-th candidate after failed reservations."""
    sf = _fabric(state.fabric)
    assert job.degrees is not None, "a job of a SWITCHED pod carries its degrees"
    degrees = Degrees(*job.degrees)
    node_type = job.demand.node_types[0]
    why = f"no {node_type} groups for {degrees.total} processors"
    try:
        found = list(
            islice(
                placements(sf, switched_state(state, node_type), job.job_id, degrees),
                job.attempts + 1,
            )
        )
    except ResourceExhausted as e:
        found, why = [], e.message
    if found:
        chosen = found[job.attempts % len(found)]
        if chosen.kind == "small":
            (t,) = chosen.tiles
            own = job.job_id in {*state.tile_wired.values(), *state.wired.values()}
            return Allocation(
                job,
                (t.group,),
                (),
                (job.job_id,) if own else (),
                (t.group, t.row, t.col, t.height, t.width),
            )
        groups = tuple(sorted(chosen.groups))
        return Allocation(job, groups, (), _release_first(state, job.job_id, groups))
    unplaceable = Unplaceable((), note=why)
    if not preempt or is_small(sf, degrees):
        return unplaceable
    # Large jobs may take the groups of lower-priority large jobs (WS-4).
    view = state.copy()
    view.failed |= set(state.fabric.small_groups)
    view.failed |= {g for g, t in enumerate(state.fabric.node_types) if t != node_type}
    victims = choose_victims(view, Counter({node_type: job.demand.block_count}), job.priority)
    if not victims:
        return unplaceable
    trial = state.copy()
    apply_victims(trial, victims)
    ids = [v.job_id for v in victims]
    try:
        chosen = next(placements(sf, switched_state(trial, node_type, ids), job.job_id, degrees))
    except (ResourceExhausted, StopIteration):
        return unplaceable  # freed enough groups, but not under reachable switches
    groups = tuple(sorted(chosen.groups))
    return Allocation(job, groups, tuple(victims), _release_first(state, job.job_id, groups, ids))


def plan_switched_replacement(state: PodState, job: SliceJob, failed: int) -> Replacement | None:
    """SW-5: a free group of the same type, under the failed group's tier-0 switch
    when possible (¶57); a small job's group is not replaced (it is requeued)."""
    if job.tile is not None:
        return None
    assert job.placement is not None
    fabric = state.fabric
    node_type = fabric.node_types[failed]
    free = [
        g
        for g in range(fabric.block_count)
        if fabric.node_types[g] == node_type
        and g not in fabric.small_groups
        and state.allocatable(g)
    ]
    order = replacement_order(_fabric(fabric), failed, free)
    if not order:
        return None
    unwired = [g for g in order if g not in state.wired]
    spare = (unwired or order)[0]
    first = (state.wired[spare],) if spare in state.wired else ()
    return Replacement(job, failed, spare, job.placement.index(failed), (), first)
