"""Scheduling decisions as pure functions of a pod snapshot (WS-2 … WS-6).

`plan_pass` walks the pod's queue in order (priority, then age) and, on an
in-memory copy of the snapshot, decides for each waiting job: place it on free
blocks, place it by preempting lower-priority slices, or leave it waiting.
Later jobs in the queue may use blocks an earlier one could not use (backfill):
an earlier job that could not be placed even by preemption cannot use them.

`plan_replacement` decides how a running slice survives a failed block
(seed 000 Fig. 11, ¶126-132): a healthy free block of the same type, else one
taken from lower-priority work, else nothing (the slice is suspended or fails).

The service commits each decision with one atomic Redis script that re-checks
what the decision assumed, then drives the ocs_manager.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from services.workload_scheduler.model import (
    DELAY,
    RUNNING,
    SHRINK,
    SUSPENDED,
    WIRING,
    SliceJob,
)
from services.workload_scheduler.placement import Placement, PodState, Unplaceable, place
from services.workload_scheduler.preemption import VictimAction, choose_victims


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
    state: PodState, job: SliceJob, *, preempt: bool = True
) -> Allocation | Unplaceable:
    """Place one waiting job on free blocks, else by preemption (WS-2, WS-3, WS-4)."""
    if state.fabric.switched is not None:
        from services.workload_scheduler.switched import plan_switched_admission

        return plan_switched_admission(state, job, preempt=preempt)
    found = place(state, job.demand)
    if isinstance(found, Placement):
        return Allocation(job, found.blocks, (), _release_first(state, job.job_id, found.blocks))
    if not preempt:
        return found
    victims = choose_victims(state, job.demand.type_counts(), job.priority)
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


def apply_allocation(state: PodState, alloc: Allocation) -> None:
    apply_victims(state, alloc.victims)
    state.assume_allocated(
        alloc.job.with_(state=WIRING, placement=alloc.placement, tile=alloc.tile)
    )


def plan_pass(state: PodState, now_ms: int = 0) -> list[Allocation] | None:
    """Decisions for the whole queue, in queue order, each assuming the ones before it.
    Jobs whose wiring failed wait until their `not_before_ms` (backoff).

    On a `partial` state (free blocks only, issue 15): None as soon as a job cannot be
    placed on free blocks, since only a full snapshot can say whether preempting would
    place it; otherwise exactly the decisions the full snapshot gives."""
    work = state.copy()
    decisions: list[Allocation] = []
    for job in work.queue():
        if job.not_before_ms > now_ms:
            continue
        found = plan_admission(work, job, preempt=not work.partial)
        if isinstance(found, Allocation):
            decisions.append(found)
            apply_allocation(work, found)
        elif work.partial:
            return None
    return decisions


def plan_replacement(state: PodState, job: SliceJob, failed: int) -> Replacement | None:
    """A block for the failed one's logical position (WS-5), or None if none can be had."""
    assert job.placement is not None and failed in job.placement
    position = job.placement.index(failed)
    node_type = state.fabric.node_types[failed]
    groups = state.fabric.first_end_group
    if state.fabric.switched is not None:
        from services.workload_scheduler.switched import plan_switched_replacement

        return plan_switched_replacement(state, job, failed)
    types = state.fabric.node_types
    spares = [b for b in state.candidates() if types[b] == node_type and state.allocatable(b)]
    if spares:
        # Same first-end OCS group as the failed block keeps the slice's port spread (K >= 2).
        spare = min(spares, key=lambda b: (b in state.wired, groups[b] != groups[failed], b))
        return Replacement(job, failed, spare, position, (), _release_first_one(state, spare))
    if state.partial:
        return None  # victims need a full snapshot (the caller takes one)
    victims = choose_victims(
        state, Counter({node_type: 1}), job.priority, exclude=frozenset({job.job_id})
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
        if state.fabric.node_types[b] == node_type and trial.allocatable(b, victim_ids)
    ]
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
    """Running slices that still hold a failed block (a missed or interrupted replacement)."""
    out: list[tuple[SliceJob, int]] = []
    for job in sorted(state.jobs.values(), key=SliceJob.queue_key):
        if job.state == RUNNING and job.placement and not job.replacing:
            out.extend((job, b) for b in job.placement if b in state.failed)
    return out
