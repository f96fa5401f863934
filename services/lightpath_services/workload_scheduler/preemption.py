"""WS-4: which running slices give up blocks for higher-priority work, and how.

Seed 000 ¶104-105: when healthy free blocks are too few, blocks of
lower-priority workloads are reassigned by terminating, delaying or shrinking
them. Victims are chosen to disturb least, lexicographically:

1. the highest priority among the victims is as low as possible (take from
   the lowest priority first);
2. as few victims as possible (greedy on how much of the shortfall each one
   covers, then a pass that drops victims no longer needed);
3. less disruptive policies first at equal priority (shrink, then delay, then
   terminate), then the youngest slice (least work lost), then the job id;
4. a shrinking victim keeps the largest arrangement it declared acceptable that
   still covers what is missing.

A job never preempts one of higher priority, nor one of equal priority unless it
has waited past the queue's age bound and the victim is younger (`younger_than`,
planner.plan_pass); only RUNNING slices are victims (a slice being wired is in
flight and is left alone).

Sub-block slices (issue 28) give up a block together: the sub-block slices of one
block count as one candidate victim worth that block, at the highest priority
among them (all must be lower than the preemptor's), as disruptive as the most
disruptive of their policies, as young as the youngest. Chosen, each of them is
delayed or terminated by its own policy (one that would shrink is delayed: the
whole block is needed).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from lightpath.domain.slices import (
    DELAY,
    DISRUPTION,
    RUNNING,
    SHRINK,
    SUB_BLOCK_OWNER,
    TERMINATE,
    Grid,
    SliceJob,
    shields,
    sub_box_indices,
)
from lightpath_services.workload_scheduler.placement import PodState


@dataclass(frozen=True)
class VictimAction:
    """What happens to one victim: TERMINATE (→ PREEMPTED), DELAY (→ SUSPENDED,
    requeued) or SHRINK (rewired to `shrink_grid`, keeping `kept_placement`)."""

    job_id: str
    action: str
    # Blocks, or a sub-block victim's chips ("c<b>.<x>.<y>.<z>", SliceJob.held_keys).
    freed: tuple[int | str, ...]
    shrink_grid: Grid | None = None
    kept_placement: tuple[int, ...] | None = None


def _healthy_counts(state: PodState, blocks: list[int] | tuple[int, ...]) -> Counter[str]:
    types = state.fabric.node_types
    return Counter(types[b] for b in blocks if state.healthy(b))


def _shrink_options(job: SliceJob) -> list[tuple[Grid, list[int], list[int]]]:
    """(grid, kept blocks, freed blocks) per declared arrangement, largest kept first."""
    assert job.placement is not None
    out = []
    for grid in job.shrink_to:
        keep_idx = set(sub_box_indices(job.demand.grid, grid))
        kept = [job.placement[i] for i in sub_box_indices(job.demand.grid, grid)]
        freed = [b for i, b in enumerate(job.placement) if i not in keep_idx]
        out.append((grid, kept, freed))
    out.sort(key=lambda o: (-len(o[1]), o[0]))
    return out


def max_freeable(state: PodState, job: SliceJob) -> Counter[str]:
    """Healthy blocks per type that `job` gives up at most under its own policy."""
    assert job.placement is not None
    if job.preemption == SHRINK:
        options = _shrink_options(job)
        if not options:
            return Counter()
        return _healthy_counts(state, options[-1][2])
    return _healthy_counts(state, job.placement)


def _covered(deficit: Counter[str], gained: Counter[str]) -> bool:
    return all(gained[t] >= n for t, n in deficit.items())


def _useful(deficit: Counter[str], gained: Counter[str]) -> int:
    return sum(min(n, gained[t]) for t, n in deficit.items() if n > 0)


def shortfall(state: PodState, need: Counter[str]) -> Counter[str]:
    """Blocks per type missing from the free pool for `need`."""
    free = state.free_counts()
    return Counter({t: n - free[t] for t, n in need.items() if n > free[t]})


def _below(job: SliceJob, priority: int, younger_than: int | None) -> bool:
    """May be preempted at `priority`: lower, or equal and admitted after `younger_than`."""
    return job.priority < priority or (
        younger_than is not None and job.priority == priority and job.seq > younger_than
    )


def choose_victims(
    state: PodState,
    need: Counter[str],
    priority: int,
    *,
    exclude: frozenset[str] = frozenset(),
    younger_than: int | None = None,
    only: frozenset[str] | None = None,
    preemptor: str = "",
) -> list[VictimAction] | None:
    """Victims that free enough blocks for `need` at `priority` ([] when none are
    needed), or None when even every lower-priority slice would not be enough. With
    `younger_than` (a seq), slices of equal priority admitted after it count as lower
    (the age bound): taken only after every lower priority. With `only` (the cell
    reclaiming lent quota, issue 35): those slices alone, whatever their priority. A
    slice that reclaimed quota from `preemptor` is never its victim."""
    deficit = shortfall(state, need)
    if not deficit:
        return []
    pool = [
        j
        for j in state.running()
        # small jobs of a SWITCHED pod share their groups: never victims; sub-block
        # slices give up chips, not blocks (box_placement.choose_box_victims)
        if (_below(j, priority, younger_than) if only is None else j.job_id in only)
        and j.job_id not in exclude
        and not shields(j.reclaimed_from, preemptor)
        and j.placement is not None
        and j.tile is None
        and j.offset is None
    ]
    freeable = {j.job_id: max_freeable(state, j) for j in pool}
    groups = _box_groups(state, priority, exclude, younger_than, only, preemptor)
    for group, members in groups.items():
        pool.append(group)
        freeable[group.job_id] = Counter({state.fabric.node_types[members[0].placement[0]]: 1})  # type: ignore[index]
    pool = [j for j in pool if _useful(deficit, freeable[j.job_id]) > 0]
    for level in sorted({j.priority for j in pool}):
        candidates = [j for j in pool if j.priority <= level]
        total: Counter[str] = Counter()
        for j in candidates:
            total.update(freeable[j.job_id])
        if not _covered(deficit, total):
            continue
        chosen = _greedy(candidates, freeable, deficit)
        return _actions(state, chosen, freeable, deficit, groups)
    return None


def _box_groups(
    state: PodState,
    priority: int,
    exclude: frozenset[str],
    younger_than: int | None = None,
    only: frozenset[str] | None = None,
    preemptor: str = "",
) -> dict[SliceJob, list[SliceJob]]:
    """Per block given over to sub-block slices whose slices are all RUNNING and of lower
    priority (`_below`; with `only`: all named, as choose_victims), none of which
    reclaimed from `preemptor`: a stand-in victim for the whole block, and its members."""
    members: dict[int, list[SliceJob]] = {}
    for j in state.jobs.values():
        if j.offset is not None and j.placement and j.state != "SUSPENDED":
            members.setdefault(j.placement[0], []).append(j)
    out: dict[SliceJob, list[SliceJob]] = {}
    for block, jobs in sorted(members.items()):
        if (
            state.owner.get(block) != SUB_BLOCK_OWNER
            or block in state.failed
            or any(
                j.state != RUNNING
                or not (_below(j, priority, younger_than) if only is None else j.job_id in only)
                or shields(j.reclaimed_from, preemptor)
                or j.job_id in exclude
                for j in jobs
            )
        ):
            continue
        worst = max(jobs, key=lambda j: DISRUPTION[j.preemption])
        stand_in = SliceJob(
            job_id=f"~block-{block}",
            state=RUNNING,
            epoch=0,
            priority=max(j.priority for j in jobs),
            seq=max(j.seq for j in jobs),
            demand=jobs[0].demand,
            placement=(block,),
            preemption=TERMINATE if worst.preemption == TERMINATE else DELAY,
        )
        out[stand_in] = jobs
    return out


def _tiebreak(job: SliceJob) -> tuple[int, int, int, str]:
    """Lower priority, less disruptive policy, younger, then id."""
    return (job.priority, DISRUPTION[job.preemption], -job.seq, job.job_id)


def _greedy(
    candidates: list[SliceJob], freeable: dict[str, Counter[str]], deficit: Counter[str]
) -> list[SliceJob]:
    remaining = Counter(deficit)
    chosen: list[SliceJob] = []
    left = sorted(candidates, key=_tiebreak)
    while any(n > 0 for n in remaining.values()):
        best = min(left, key=lambda j: (-_useful(remaining, freeable[j.job_id]), _tiebreak(j)))
        left.remove(best)
        chosen.append(best)
        for t in list(remaining):
            remaining[t] = max(0, remaining[t] - freeable[best.job_id][t])
    # Drop victims that became unnecessary, the most important / most disturbed first.
    for job in sorted(chosen, key=_tiebreak, reverse=True):
        rest = [j for j in chosen if j is not job]
        total: Counter[str] = Counter()
        for j in rest:
            total.update(freeable[j.job_id])
        if _covered(deficit, total):
            chosen = rest
    return sorted(chosen, key=_tiebreak)


def _actions(
    state: PodState,
    chosen: list[SliceJob],
    freeable: dict[str, Counter[str]],
    deficit: Counter[str],
    groups: dict[SliceJob, list[SliceJob]] | None = None,
) -> list[VictimAction]:
    remaining = Counter(deficit)
    actions: list[VictimAction] = []
    # Whole victims first; shrinking ones then give only what is still missing.
    for job in sorted(chosen, key=lambda j: (j.preemption == SHRINK, _tiebreak(j))):
        assert job.placement is not None
        if groups and job in groups:  # a block's sub-block slices, each by its own policy
            for member in sorted(groups[job], key=_tiebreak):
                action = TERMINATE if member.preemption == TERMINATE else DELAY
                actions.append(VictimAction(member.job_id, action, tuple(member.held_keys())))
            for t in list(remaining):
                remaining[t] = max(0, remaining[t] - freeable[job.job_id][t])
            continue
        if job.preemption != SHRINK:
            actions.append(VictimAction(job.job_id, job.preemption, tuple(job.placement)))
            for t in list(remaining):
                remaining[t] = max(0, remaining[t] - freeable[job.job_id][t])
            continue
        options = _shrink_options(job)
        pick = options[-1]
        for option in options:  # largest kept first: the least shrink that covers the rest
            if _covered(+remaining, _healthy_counts(state, option[2])):
                pick = option
                break
        grid, kept, freed = pick
        actions.append(VictimAction(job.job_id, SHRINK, tuple(freed), grid, tuple(kept)))
        gained = _healthy_counts(state, freed)
        for t in list(remaining):
            remaining[t] = max(0, remaining[t] - gained[t])
    return actions
