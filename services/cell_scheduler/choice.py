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
   need. Ordered by the fewest blocks to take from others, then as in 1 (the
   preferred pod first among them too).
3. **not now** — with the reason (silent, short of blocks, cannot host it).

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

FITS = "fits"
PREEMPTS = "preempts"


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

    def copy(self) -> PodCapacityView:
        return PodCapacityView(
            self.pod_id,
            Counter(self.free),
            {t: dict(p) for t, p in self.preemptible.items()},
            self.usable,
            self.why_not,
            self.version,
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

    @property
    def why_waiting(self) -> str:
        if not self.not_now:
            return "no pod is registered"
        return "; ".join(f"{p}: {why}" for p, why in sorted(self.not_now.items()))


def _blocks(c: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {t}" for t, n in sorted(c.items()))


def choose(job: JobDemand, pods: Iterable[PodCapacityView]) -> Choice:
    """The pods that can place `job` now, best first (CS-2), then those that can by
    preempting lower-priority work (CS-3)."""
    fits: list[tuple[tuple, PodCapacityView, Counter[str]]] = []
    preempts: list[tuple[tuple, PodCapacityView, Counter[str]]] = []
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
        free_of_type = sum(pod.free[t] for t in need)
        balance = (
            pod.pod_id != job.preferred,
            -free_of_type,
            -sum(pod.free.values()),
            pod.pod_id,
        )
        short = Counter({t: n - pod.free[t] for t, n in need.items() if pod.free[t] < n})
        if not short:
            fits.append((balance, pod, need))
        elif all(pod.takeable(t, job.priority) >= n for t, n in short.items()):
            preempts.append(((balance[0], sum(short.values()), *balance[1:]), pod, short))
        else:
            not_now[pod.pod_id] = "needs " + "; ".join(
                f"{n} {t} blocks: {pod.free[t]} free, "
                f"{pod.takeable(t, job.priority)} held by lower-priority work"
                for t, n in sorted(need.items())
                if t in short
            )
    fits.sort(key=lambda e: e[0])
    preempts.sort(key=lambda e: e[0])
    out: list[Candidate] = []
    for _, pod, need in fits:
        types = "/".join(sorted(need))
        free = sum(pod.free[t] for t in need)
        if pod.pod_id == job.preferred:
            reason = f"the pod asked for, with enough free healthy {types} blocks ({free})"
        elif len(fits) > 1:
            reason = f"most free healthy {types} blocks ({free}) of {len(fits)} pods that fit now"
        else:
            reason = f"the one pod with enough free healthy {types} blocks ({free})"
        if job.preferred and pod.pod_id != job.preferred:
            reason += f"; {job.preferred}, the pod asked for, " + (
                "cannot host it" if job.preferred not in job.needs else "does not fit now"
            )
        out.append(Candidate(pod.pod_id, FITS, reason))
    for _, pod, short in preempts:
        asked = "the pod asked for; " if pod.pod_id == job.preferred else ""
        out.append(
            Candidate(
                pod.pod_id,
                PREEMPTS,
                f"{asked}no pod fits now; lower-priority work there can give up "
                f"{_blocks(short)} block(s)",
            )
        )
    return Choice(tuple(out), not_now)


def assume_placed(pod: PodCapacityView, need: Mapping[str, int], priority: int) -> None:
    """Planning only: the job took its blocks on `pod` — free ones first, then those of
    the lowest-priority work below its own."""
    for t, n in need.items():
        use = min(n, pod.free[t])
        pod.free[t] -= use
        rest = n - use
        levels = pod.preemptible.get(t, {})
        for p in sorted(levels):
            if rest <= 0 or p >= priority:
                break
            take = min(rest, levels[p])
            levels[p] -= take
            rest -= take


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
