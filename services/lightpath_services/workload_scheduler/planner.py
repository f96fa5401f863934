"""Scheduling decisions as pure functions of a pod snapshot (WS-2 … WS-6).

`plan_pass` walks the pod's queue in order (priority, then age) and, on an
in-memory copy of the snapshot, decides for each waiting job: place it on free
blocks, place it by preempting lower-priority slices, or leave it waiting.
Later jobs in the queue may use blocks an earlier one could not use (backfill).
So that this never starves the largest slices, the queue has an age bound (a
setting of the service): the first job in the pass that cannot be placed and has
been in the pod `age_bound_ms` or longer may also preempt the slices of its own
priority admitted after it (each by its own preemption policy) — the jobs that
backfilled past it. Unlike EASY backfill this needs no duration estimates (the
JobSpec has none), and unlike holding free blocks back for the waiting job it
keeps no block idle (the simulator measured that: at offered load 0.95 holding
blocks left 41 % of the pod idle, docs/sim.md).

`plan_replacement` decides how a running slice survives a failed block
(seed 000 Fig. 11, ¶126-132): a healthy free block of the same type, else one
taken from lower-priority work (past the age bound, also from younger slices of
its priority), else nothing (the slice is suspended or fails).

The service commits each decision with one atomic Redis script that re-checks
what the decision assumed, then drives the ocs_manager.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Protocol

from lightpath.domain.blocks import PodFabric
from lightpath.domain.slices import (
    DELAY,
    RUNNING,
    SHRINK,
    SUSPENDED,
    WIRING,
    SliceJob,
    box_chips,
)
from lightpath.domain.switched import SwitchedFabric
from lightpath.domain.switched_rings import Degrees, Tile, is_small, replacement_order
from lightpath.errors import ResourceExhausted
from lightpath_services.workload_scheduler.box_placement import (
    BoxPlacement,
    choose_box_victims,
    place_box,
)
from lightpath_services.workload_scheduler.placement import Placement, PodState, Unplaceable, place
from lightpath_services.workload_scheduler.preemption import VictimAction, choose_victims
from lightpath_services.workload_scheduler.switched_placement import SwitchedPodState, placements


@dataclass(frozen=True)
class Allocation:
    """Give `job` the blocks `placement` (position order), after `victims` give theirs up.

    `release_first`: jobs whose OCS wiring may still include a chosen block (a
    finished slice whose release is pending, a victim, or an earlier attempt of
    this job) and must be released before this job is wired.
    """

    job: SliceJob
    placement: tuple[int, ...]
    victims: tuple[VictimAction, ...] = ()
    release_first: tuple[str, ...] = ()
    # SWITCHED pods: a small job's rectangle in its (shared) group, SW-2.
    tile: tuple[int, int, int, int, int] | None = None
    # A sub-block slice (issue 28): its box's chip offset inside placement[0].
    offset: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Replacement:
    """Swap `failed` for `spare` at the same logical position of `job` (WS-5)."""

    job: SliceJob
    failed: int
    spare: int
    position_index: int
    victims: tuple[VictimAction, ...] = ()
    release_first: tuple[str, ...] = ()


def _release_first(state: PodState, job_id: str, blocks: tuple[int, ...], extra=()) -> tuple:
    ids = {state.wired[b] for b in blocks if b in state.wired} | set(extra)
    if state.has_wiring(job_id):
        ids.add(job_id)  # an earlier attempt of this job may still be wired
    return tuple(sorted(ids))


def apply_victims(state: PodState, victims: tuple[VictimAction, ...] | list[VictimAction]) -> None:
    """Assume the victims gave up their blocks (planning only)."""
    for v in victims:
        job = state.jobs[v.job_id]
        state.assume_released(v.job_id, v.freed)
        if v.action == SHRINK:
            assert v.shrink_grid is not None
            state.jobs[v.job_id] = job.with_(
                state=WIRING,
                demand=job.demand.shrunk(v.shrink_grid),
                placement=v.kept_placement,
            )
        elif v.action == DELAY:
            state.jobs[v.job_id] = job.with_(state=SUSPENDED, placement=None)
        else:
            del state.jobs[v.job_id]


def plan_admission(
    state: PodState,
    job: SliceJob,
    *,
    preempt: bool = True,
    take_younger: bool = False,
    reclaim: frozenset[str] | None = None,
) -> Allocation | Unplaceable:
    """Place one waiting job on free blocks, else by preemption (WS-2, WS-3, WS-4).
    `take_younger`: slices of its priority admitted after it count as lower (the age
    bound, plan_pass). `reclaim`: the cell names the only slices it may preempt,
    whatever their priority (lent quota taken back, issue 35). An OCS_TORUS pod's
    admission (fabric_kinds.TorusPlanner)."""
    younger_than = job.seq if take_younger else None
    if job.demand.sub_block:
        return plan_box_admission(
            state, job, preempt=preempt, younger_than=younger_than, reclaim=reclaim
        )
    found = place(state, job.demand)
    if isinstance(found, Placement):
        return Allocation(job, found.blocks, (), _release_first(state, job.job_id, found.blocks))
    if not preempt:
        return found
    victims = choose_victims(
        state,
        job.demand.type_counts(),
        job.priority,
        younger_than=younger_than,
        only=reclaim,
        preemptor=job.job_id,
    )
    if not victims:
        return found
    trial = state.copy()
    apply_victims(trial, victims)
    victim_ids = [v.job_id for v in victims]
    placed = place(trial, job.demand, allow_wired=victim_ids)
    assert isinstance(placed, Placement), "victims were chosen to cover the shortfall"
    return Allocation(
        job,
        placed.blocks,
        tuple(victims),
        _release_first(state, job.job_id, placed.blocks, victim_ids),
    )


def plan_box_admission(
    state: PodState,
    job: SliceJob,
    *,
    preempt: bool = True,
    younger_than: int | None = None,
    reclaim: frozenset[str] | None = None,
) -> Allocation | Unplaceable:
    """A sub-block slice (issue 28): a box of free chips (box_placement), else room made
    by lower-priority sub-block slices in a block given over to them, else a whole block
    freed by lower-priority block slices. `reclaim`: the only slices it may preempt,
    whatever their priority (issue 35). On a partial snapshot, which does not show the
    chips held, the caller takes a full one."""
    if state.partial:
        return Unplaceable((), note="a sub-block slice is placed on a full snapshot")
    found = place_box(state, job)
    if isinstance(found, BoxPlacement):
        return Allocation(job, (found.block,), offset=found.offset)
    if not preempt:
        return found
    inside = choose_box_victims(state, job, only=reclaim)
    if inside is not None:
        return Allocation(
            job, (inside.placement.block,), inside.victims, (), offset=inside.placement.offset
        )
    assert job.demand.box is not None
    victims = choose_victims(
        state,
        Counter({job.demand.node_types[0]: 1}),
        job.priority,
        younger_than=younger_than,
        only=reclaim,
        preemptor=job.job_id,
    )
    if not victims:
        return found
    trial = state.copy()
    apply_victims(trial, victims)
    ids = [v.job_id for v in victims]
    placed = place_box(trial, job, allow_wired=ids)
    if not isinstance(placed, BoxPlacement):
        return found
    return Allocation(
        job,
        (placed.block,),
        tuple(victims),
        _release_first(state, job.job_id, (placed.block,), ids),
        offset=placed.offset,
    )


def plan_box_move(state: PodState, job: SliceJob) -> BoxPlacement | None:
    """Healthy chips for a running sub-block slice whose chips failed (issue 28): its
    own block first when it has room, else where place_box puts a new one. None when
    no chips can be had without preempting."""
    trial = state.copy()
    trial.assume_released(job.job_id, job.held_keys())
    trial.jobs.pop(job.job_id, None)
    found = place_box(trial, job)
    return found if isinstance(found, BoxPlacement) else None


class Admit(Protocol):
    def __call__(
        self,
        state: PodState,
        job: SliceJob,
        *,
        preempt: bool = True,
        take_younger: bool = False,
        reclaim: frozenset[str] | None = None,
    ) -> Allocation | Unplaceable: ...


def apply_allocation(state: PodState, alloc: Allocation) -> None:
    apply_victims(state, alloc.victims)
    state.assume_allocated(
        alloc.job.with_(
            state=WIRING, placement=alloc.placement, tile=alloc.tile, offset=alloc.offset
        )
    )


# The queue's age bound, s (LIGHTPATH_WS_AGE_BOUND_S): long enough that a large slice
# does not preempt for every short wait, short enough that it is not starved
# (docs/sim.md measures the largest slices' wait under each bound).
DEFAULT_AGE_BOUND_S = 3600.0


def waited_past(job: SliceJob, now_ms: int, age_bound_ms: int | None) -> bool:
    """True when `job` has been in the pod `age_bound_ms` or longer (None: never)."""
    return age_bound_ms is not None and now_ms - job.submitted_ms >= age_bound_ms


def plan_pass(
    state: PodState,
    now_ms: int = 0,
    age_bound_ms: int | None = None,
    admit: Admit = plan_admission,
    reclaim: Mapping[str, frozenset[str]] | None = None,
) -> list[Allocation] | None:
    """Decisions for the whole queue, in queue order, each assuming the ones before it.
    Jobs whose wiring failed wait until their `not_before_ms` (backoff). The first job
    that cannot be placed and has waited `age_bound_ms` (None: no bound) may also take
    the blocks of younger slices of its priority (the module doc).

    On a `partial` state (free blocks only, issue 15): None as soon as a job cannot be
    placed on free blocks, since only a full snapshot can say whether preempting would
    place it; otherwise exactly the decisions the full snapshot gives.

    `admit` places one job: the pod's planner's (fabric_kinds), an OCS_TORUS pod's by
    default. `reclaim`: job id -> the only slices that job may preempt (the cell taking
    lent quota back, issue 35); such a job never takes the age bound's turn."""
    work = state.copy()
    decisions: list[Allocation] = []
    aged = False  # the first blocked job past the age bound has had its turn
    for job in work.queue():
        if job.not_before_ms > now_ms:
            continue
        named = (reclaim or {}).get(job.job_id)
        found = admit(work, job, preempt=not work.partial, reclaim=named)
        if isinstance(found, Unplaceable):
            if work.partial:
                return None
            if named is not None or aged or not waited_past(job, now_ms, age_bound_ms):
                continue
            aged = True
            found = admit(work, job, take_younger=True)
        if isinstance(found, Allocation):
            decisions.append(found)
            apply_allocation(work, found)
    return decisions


def plan_replacement(
    state: PodState, job: SliceJob, failed: int, *, take_younger: bool = False
) -> Replacement | None:
    """A block for the failed one's logical position (WS-5), or None if none can be had
    (an OCS_TORUS pod's; fabric_kinds.TorusPlanner). `take_younger` (the slice has been
    in the pod past the queue's age bound, plan_pass): after lower priorities, a block
    of a slice of its priority admitted after it may be taken, as the slice could take
    all its blocks back were it suspended and requeued: one victim's block rather than
    giving up every block it holds (docs/sim.md measured it)."""
    assert job.placement is not None and failed in job.placement
    position = job.placement.index(failed)
    node_type = state.fabric.node_types[failed]
    groups = state.fabric.first_end_group
    types = state.fabric.node_types
    spares = [b for b in state.candidates() if types[b] == node_type and state.allocatable(b)]
    if spares:
        # Same first-end OCS group as the failed block keeps the slice's port spread (K >= 2).
        spare = min(spares, key=lambda b: (b in state.wired, groups[b] != groups[failed], b))
        return Replacement(job, failed, spare, position, (), _release_first_one(state, spare))
    if state.partial:
        return None  # victims need a full snapshot (the caller takes one)
    victims = choose_victims(
        state,
        Counter({node_type: 1}),
        job.priority,
        exclude=frozenset({job.job_id}),
        younger_than=job.seq if take_younger else None,
    )
    if not victims:
        return None
    trial = state.copy()
    apply_victims(trial, victims)
    victim_ids = {v.job_id for v in victims}
    freed = [
        b
        for v in victims
        for b in v.freed
        if isinstance(b, int)  # block victims only: choose_victims skips sub-block slices
        and state.fabric.node_types[b] == node_type
        and trial.allocatable(b, victim_ids)
    ]
    if not freed:
        # The victims chosen were a block's sub-block slices (preemption._box_groups):
        # they free chips, not a block this swap can take; the slice is lost as with none.
        return None
    spare = min(freed, key=lambda b: (groups[b] != groups[failed], b))
    return Replacement(
        job,
        failed,
        spare,
        position,
        tuple(victims),
        tuple(sorted(victim_ids | set(_release_first_one(state, spare)))),
    )


def _release_first_one(state: PodState, block: int) -> tuple[str, ...]:
    return (state.wired[block],) if block in state.wired else ()


def running_with_failed_blocks(state: PodState) -> list[tuple[SliceJob, int]]:
    """Running slices that still hold a failed block (a missed or interrupted replacement).
    A block with a failed host is a failed block to a block slice; a sub-block slice
    is judged by its own chips (boxes_on_failed_chips)."""
    out: list[tuple[SliceJob, int]] = []
    for job in sorted(state.jobs.values(), key=SliceJob.queue_key):
        if job.state == RUNNING and job.placement and not job.replacing and job.offset is None:
            out.extend((job, b) for b in job.placement if b in state.failed)
    return out


def boxes_on_failed_chips(state: PodState, block: int | None = None) -> list[SliceJob]:
    """Running sub-block slices (on `block`, or anywhere) with a chip on a failed host
    or on a failed block, in queue order."""
    fabric = state.fabric
    out = []
    for job in sorted(state.jobs.values(), key=SliceJob.queue_key):
        if job.state != RUNNING or job.offset is None or not job.placement:
            continue
        b = job.placement[0]
        if block is not None and b != block:
            continue
        assert job.demand.box is not None
        bad = state.failed_hosts.get(b, frozenset())
        if state.whole_failed(b) or any(
            fabric.host_of(c) in bad for c in box_chips(job.offset, job.demand.box)
        ):
            out.append(job)
    return out


# -- SWITCHED pods (seed 002, SW-2 … SW-5) ---------------------------------------
#
# Such a pod's "blocks" are its processor groups, so the scheduler's machinery
# (queue, priorities, preemption of large jobs, events, completion, failure
# handling, replicas) works unchanged; what differs is placement and replacement:
# * placement is `switched_placement` (small jobs packed into groups reserved
#   for them, large jobs in whole groups, locality under one tier-0 switch
#   first): the n-th candidate after n failed ring reservations, so a job whose
#   rings could not be routed tries the next-best groups;
# * a failed group is replaced by a free one under the same tier-0 switch first;
#   a small job on a failed group is requeued.
# A job's degrees are normalised in lightpath.domain.jobs (`normalize_switched`);
# the pod's ocs_manager reserves the rings (ReserveRings, see ocs.py).


def _fabric(fabric: PodFabric) -> SwitchedFabric:
    assert fabric.switched is not None
    return fabric.switched


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


def plan_switched_replacement(
    state: PodState, job: SliceJob, failed: int, *, take_younger: bool = False
) -> Replacement | None:
    """SW-5: a free group of the same type, under the failed group's tier-0 switch
    when possible (¶57); a small job's group is not replaced (it is requeued). Only
    free groups: nothing is preempted for a swap here (`take_younger` changes nothing)."""
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
