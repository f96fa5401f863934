"""CS-2, CS-3: which superpod gets a job — a pure function of the registry.

Seed 000 ¶52: the cell scheduler picks a superpod "that includes at least a
sufficient number of available and healthy building blocks" of the requested
node types to form the target arrangement; ¶54: among several it balances the
load by picking "the superpod with the most capacity, e.g. the most available
and healthy building blocks"; ¶53: a pod's workload scheduler may reassign
blocks of lower-priority work.

For one job, every registered pod is in one of these classes:

1. **fits now** — enough healthy free blocks of each node type it needs.
   Ordered by the most healthy free blocks of the job's node types, then the
   most healthy free blocks in all, then pod id; the pod the submitter prefers
   (`preferred_pod`), when it fits, goes first.
2. **fits by preemption** (CS-3) — free blocks plus the blocks that running
   jobs of *lower* priority would give up under their own policy cover the
   need — not counting a job that reclaimed quota from this one (issue 35: it is
   never that one's victim, so the pod would refuse the forward). Ordered by the
   fewest blocks to take from others, then as in 1 (the preferred pod first among
   them too).
3. **not now** — with the reason (silent, short of blocks, cannot host it).

A sub-block slice (issue 28: a box of c chips inside one block) is counted in
chips, never as a block: its need is `{chips_key(type): c}`. A pod fits it now
when the largest box of that type's chips it can give without preempting
anything (the report's `largest_free_box`) holds c chips, and the pods that fit
are ordered by their free chips of the type (`chips_free`: free blocks' chips
plus free chips on healthy hosts of partly used blocks), most first, as block
demands are by free blocks. It fits by preemption when lower-priority work
would give up a block (whose chips hold any sub-block box). Block demands keep
counting blocks. Planning a sub-block placement takes its chips from
`chips_free`, caps `largest_free_box` by what is left, and leaves no more free
blocks than the chips left could make (it may have started a free block); a
block placement takes its blocks' chips too. A report is recent, not exact, and
the pod's own admission confirms, as for blocks.

The pods of class 1, then of class 2, are the candidates, tried in that order:
the registry is a recent report, not the truth, so the pod's own admission
confirms (a pod that refuses is skipped and the next one tried). No
candidate: the job waits in the cell queue.

`plan_queue` walks the cell queue in order (priority, then age) over an
in-memory copy of the registry: each job that has a candidate takes it and
the capacity it uses is assumed gone for the jobs after it; a job with no
candidate waits without holding anything, so smaller jobs behind it may still
go (backfill, as the pods' own queues do).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from lightpath.domain.slices import shields

FITS = "fits"
PREEMPTS = "preempts"
# A need keyed `<type>#chips` counts chips of that type (a sub-block slice), not blocks;
# node type names never hold a '#' (lightpath.domain.blocks.TYPE_NAME_RULE).
CHIPS_SUFFIX = "#chips"


def chips_key(node_type: str) -> str:
    """The need (and registry) key of `node_type`'s chips: what sub-block slices take."""
    return node_type + CHIPS_SUFFIX


def split_need(need: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """(blocks per node type, chips per node type) of one job's need on one pod."""
    blocks: dict[str, int] = {}
    chips: dict[str, int] = {}
    for key, n in need.items():
        if key.endswith(CHIPS_SUFFIX):
            chips[key.removesuffix(CHIPS_SUFFIX)] = n
        else:
            blocks[key] = n
    return blocks, chips


@dataclass
class PodCapacityView:
    """What the registry says about one pod, for planning (mutable in a planning copy)."""

    pod_id: str
    # Healthy free blocks per node type, minus blocks of forwards in flight.
    free: Counter[str] = field(default_factory=Counter)
    # Per node type: priority -> blocks running jobs of that priority would give up.
    preemptible: dict[str, dict[int, int]] = field(default_factory=dict)
    # Fresh heartbeat and not suspect; else `why_not` says why it is not chosen.
    usable: bool = True
    why_not: str = ""
    # Version of the capacity report (a refusal at this version is not retried).
    version: str = ""
    # Per node type: chips able to take a sub-block slice now, and the largest box of
    # them (in chips) one slice can get without preempting anything (issue 28).
    chips_free: Counter[str] = field(default_factory=Counter)
    largest_box: Counter[str] = field(default_factory=Counter)
    # Chips in one block of the pod.
    block_chips: int = 0

    def copy(self) -> PodCapacityView:
        return PodCapacityView(
            self.pod_id,
            Counter(self.free),
            {t: dict(p) for t, p in self.preemptible.items()},
            self.usable,
            self.why_not,
            self.version,
            Counter(self.chips_free),
            Counter(self.largest_box),
            self.block_chips,
        )

    def takeable(self, node_type: str, priority: int) -> int:
        """Blocks of `node_type` that work of lower priority than `priority` would give up."""
        return sum(n for p, n in self.preemptible.get(node_type, {}).items() if p < priority)


@dataclass(frozen=True)
class JobDemand:
    """One job as the planner sees it."""

    job_id: str
    priority: int
    # Blocks per node type on each pod that could ever host it (shapes may differ
    # per pod when derived from a compute demand). Pods absent here cannot host it.
    needs: Mapping[str, Counter[str]]
    # Pods that refused it, with the capacity version they refused it at: not
    # tried again until their capacity changes.
    refused: Mapping[str, str] = field(default_factory=dict)
    # The pod the submitter prefers (SubmitJobRequest.preferred_pod): first among the
    # pods of its class (fits now, or fits by preemption) when it is one of them.
    preferred: str = ""
    # Per pod, blocks per node type of lower-priority jobs that reclaimed quota from
    # this one (issue 35): counted in what lower priorities give up, never given to it
    # (lightpath.domain.slices.shields; `shielded_blocks`).
    shielded: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def takeable(self, pod: PodCapacityView, node_type: str) -> int:
        """Blocks of `node_type` that lower-priority work on `pod` would give up to it."""
        held = self.shielded.get(pod.pod_id, {}).get(node_type, 0)
        return max(0, pod.takeable(node_type, self.priority) - held)


def shielded_blocks(
    job_id: str,
    priority: int,
    holders: Iterable[tuple[str, Iterable[str], int, Mapping[str, int]]],
) -> dict[str, dict[str, int]]:
    """JobDemand.shielded of job `job_id` at `priority`: per pod, the blocks per node
    type that running jobs of lower priority would give up but not to it, since they
    reclaimed quota from it. `holders`: (pod, the jobs it reclaimed from, its priority,
    blocks per type it gives up at most) of each running job that reclaimed."""
    out: dict[str, dict[str, int]] = {}
    for pod, reclaimed_from, p, blocks in holders:
        if p < priority and shields(tuple(reclaimed_from), job_id):
            per_type = out.setdefault(pod, {})
            for t, n in blocks.items():
                per_type[t] = per_type.get(t, 0) + n
    return out


@dataclass(frozen=True)
class Candidate:
    pod_id: str
    how: str  # FITS or PREEMPTS
    reason: str


@dataclass(frozen=True)
class Choice:
    candidates: tuple[Candidate, ...]
    # Pods not chosen and why, for the job's reason when it waits.
    not_now: Mapping[str, str]
    # Why it waits whatever the pods have (its tenant's quota, issue 35).
    held_back: str = ""

    @property
    def why_waiting(self) -> str:
        if self.held_back:
            return self.held_back
        if not self.not_now:
            return "no pod is registered"
        return "; ".join(f"{p}: {why}" for p, why in sorted(self.not_now.items()))


def _blocks(c: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {t}" for t, n in sorted(c.items()))


def _chips(c: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {t} chips" for t, n in sorted(c.items()))


def _shielded(job: JobDemand, pod: PodCapacityView, node_type: str) -> str:
    n = min(
        job.shielded.get(pod.pod_id, {}).get(node_type, 0), pod.takeable(node_type, job.priority)
    )
    if not n:
        return ""
    return f" (and {n} by lower-priority jobs that reclaimed quota from it: never given to it)"


def choose(job: JobDemand, pods: Iterable[PodCapacityView]) -> Choice:
    """The pods that can place `job` now, best first (CS-2), then those that can by
    preempting lower-priority work (CS-3)."""
    fits: list[tuple[tuple, PodCapacityView, Mapping[str, int]]] = []
    preempts: list[tuple[tuple, PodCapacityView, Mapping[str, int]]] = []
    not_now: dict[str, str] = {}
    for pod in pods:
        need = job.needs.get(pod.pod_id)
        if need is None:
            continue  # cannot host it at all (the caller knows why)
        if not pod.usable:
            not_now[pod.pod_id] = pod.why_not
            continue
        if pod.pod_id in job.refused and job.refused[pod.pod_id] == pod.version:
            not_now[pod.pod_id] = "refused it; waiting for its capacity to change"
            continue
        blocks, chips = split_need(need)
        if chips:  # a sub-block slice: chips free of its types, then in all
            balance: tuple = (
                pod.pod_id != job.preferred,
                -sum(pod.chips_free[t] for t in chips),
                -sum(pod.chips_free.values()),
                pod.pod_id,
            )
        else:
            balance = (
                pod.pod_id != job.preferred,
                -sum(pod.free[t] for t in blocks),
                -sum(pod.free.values()),
                pod.pod_id,
            )
        short: dict[str, int] = {t: n - pod.free[t] for t, n in blocks.items() if pod.free[t] < n}
        # A box that no free chips can take needs a block given up by lower priorities.
        short |= {chips_key(t): 1 for t, n in chips.items() if pod.largest_box[t] < n}
        if not short:
            fits.append((balance, pod, need))
        elif all(job.takeable(pod, t.removesuffix(CHIPS_SUFFIX)) >= n for t, n in short.items()):
            preempts.append(((balance[0], sum(short.values()), *balance[1:]), pod, short))
        else:
            not_now[pod.pod_id] = "needs " + "; ".join(
                [
                    f"{n} {t} blocks: {pod.free[t]} free, "
                    f"{job.takeable(pod, t)} held by lower-priority work{_shielded(job, pod, t)}"
                    for t, n in sorted(blocks.items())
                    if t in short
                ]
                + [
                    f"a box of {n} {t} chips: the largest free holds {pod.largest_box[t]} "
                    f"({pod.chips_free[t]} chips free), "
                    f"{job.takeable(pod, t)} blocks held by lower-priority work"
                    f"{_shielded(job, pod, t)}"
                    for t, n in sorted(chips.items())
                    if chips_key(t) in short
                ]
            )
    fits.sort(key=lambda e: e[0])
    preempts.sort(key=lambda e: e[0])
    out: list[Candidate] = []
    for _, pod, fit in fits:
        blocks, chips = split_need(fit)
        types = "/".join(sorted(chips or blocks))
        if chips:
            free = sum(pod.chips_free[t] for t in chips)
            unit = "chips"
            enough = (
                f"room for a box of {_chips(chips)} ({free} free, "
                f"the largest free box {max(pod.largest_box[t] for t in chips)})"
            )
        else:
            free = sum(pod.free[t] for t in blocks)
            unit = "blocks"
            enough = f"enough free healthy {types} blocks ({free})"
        if pod.pod_id == job.preferred:
            reason = f"the pod asked for, with {enough}"
        elif len(fits) > 1:
            reason = f"most free healthy {types} {unit} ({free}) of {len(fits)} pods that fit now"
        else:
            reason = f"the one pod with {enough}"
        if job.preferred and pod.pod_id != job.preferred:
            reason += f"; {job.preferred}, the pod asked for, " + (
                "cannot host it" if job.preferred not in job.needs else "does not fit now"
            )
        out.append(Candidate(pod.pod_id, FITS, reason))
    for _, pod, gap in preempts:
        asked = "the pod asked for; " if pod.pod_id == job.preferred else ""
        out.append(
            Candidate(
                pod.pod_id,
                PREEMPTS,
                f"{asked}no pod fits now; lower-priority work there can give up "
                f"{_blocks({t.removesuffix(CHIPS_SUFFIX): n for t, n in gap.items()})} "
                "block(s)",
            )
        )
    return Choice(tuple(out), not_now)


def assume_placed(pod: PodCapacityView, need: Mapping[str, int], priority: int) -> None:
    """Planning only: the job took its blocks (or its box of chips) on `pod` — free ones
    first, then those of the lowest-priority work below its own."""
    blocks, chips = split_need(need)
    for t, c in chips.items():
        if pod.largest_box[t] >= c:
            take_chips(pod, t, c)
        else:  # by preemption: a lower-priority block gives up its chips
            blocks[t] = blocks.get(t, 0) + 1
    for t, n in blocks.items():
        use = min(n, pod.free[t])
        pod.free[t] -= use
        take_chips(pod, t, use * pod.block_chips)
        rest = n - use
        levels = pod.preemptible.get(t, {})
        for p in sorted(levels):
            if rest <= 0 or p >= priority:
                break
            take = min(rest, levels[p])
            levels[p] -= take
            rest -= take


def take_chips(pod: PodCapacityView, node_type: str, chips: int) -> None:
    """`chips` of `node_type` are no longer free on `pod`: the largest free box holds at
    most what is left, and no more blocks are free than the chips left make."""
    left = max(0, pod.chips_free[node_type] - chips)
    pod.chips_free[node_type] = left
    pod.largest_box[node_type] = min(pod.largest_box[node_type], left)
    if pod.block_chips:
        pod.free[node_type] = min(pod.free[node_type], left // pod.block_chips)


def plan_queue(
    queue: Iterable[JobDemand], pods: Iterable[PodCapacityView]
) -> list[tuple[JobDemand, Choice]]:
    """Every job's choice, in queue order, each assuming the jobs before it took their
    first candidate (backfill: a job without a candidate holds nothing)."""
    work = {p.pod_id: p.copy() for p in pods}
    out: list[tuple[JobDemand, Choice]] = []
    for job in queue:
        choice = choose(job, work.values())
        if choice.candidates:
            first = choice.candidates[0]
            assume_placed(work[first.pod_id], job.needs[first.pod_id], job.priority)
        out.append((job, choice))
    return out
