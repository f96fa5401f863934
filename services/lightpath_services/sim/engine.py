"""The discrete-event simulator (issue 29): a virtual clock over one pod or a cell of
pods, every decision made by the services' own pure decision code.

What decides, what events there are, and how work, restarts and failures are costed:
docs/sim.md, "The model" (which function of the services each decision is, and the
test that checks the "priority" policy against `plan_pass` itself). The policies
differ only in which of those decisions they take (see Policy); the static torus
baseline (static.py) has no blocks: it packs contiguous boxes.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightpath.domain.blocks import PodFabric
from lightpath.domain.slices import (
    DELAY,
    FAIL,
    HOLDING_STATES,
    PENDING,
    RUNNING,
    SUB_BLOCK_OWNER,
    SUSPENDED,
    TERMINATE,
    WIRING,
    SliceDemand,
    SliceJob,
    shields,
)
from lightpath_services.cell_scheduler.choice import (
    FITS,
    JobDemand,
    PodCapacityView,
    chips_key,
    choose,
    shielded_blocks,
)
from lightpath_services.cell_scheduler.quota import (
    DEFAULT_HALF_LIFE_S,
    Hold,
    Quota,
    RunningJob,
    Waiting,
)
from lightpath_services.sim.fast_state import IndexedPodState
from lightpath_services.sim.quotas import (
    NO_POD_REACH,
    NODE_TYPE,
    NOT_BORROWED,
    REFUSED_BY_POD,
    SimQuotas,
)
from lightpath_services.sim.static import Torus, fitting_shape
from lightpath_services.sim.workload import TraceJob
from lightpath_services.workload_scheduler.box_placement import (
    BoxPlacement,
    largest_free_box,
    place_box,
)
from lightpath_services.workload_scheduler.placement import Unplaceable
from lightpath_services.workload_scheduler.planner import (
    DEFAULT_AGE_BOUND_S,
    Allocation,
    apply_allocation,
    apply_victims,
    boxes_on_failed_chips,
    plan_admission,
    plan_box_move,
    plan_replacement,
    waited_past,
)
from lightpath_services.workload_scheduler.preemption import VictimAction, max_freeable

# Hold a pod for an owner's job reclaim can place nowhere (quota.Hold): off only to
# measure what the hold changes.
HOLDS = True
BLOCK = (4, 4, 4)
HOST = (2, 2, 1)
BLOCKS = 64
EDGE = 16

# sim job states
QUEUED = "QUEUED"  # in a pod's queue (PENDING or SUSPENDED there)
AT_CELL = "AT_CELL"  # waiting in the cell's queue for a pod
DONE = "COMPLETED"
PREEMPTED = "PREEMPTED"
FAILED = "FAILED"
ENDED = frozenset({DONE, PREEMPTED, FAILED})
# Why healthy chips are not working (the summary's `idle_by_cause`, ÷ healthy chips; with
# utilisation they add up to 1). Each idle chip counts under the first cause that holds,
# in this order: where in the pod it lies first (only sub-block slices can use the free
# chips of a block with a down host or of a shared block), then, for whole free blocks,
# what the jobs waiting for the pod (its queue and the cell's) need and may have.
IDLE_CAUSES = (
    "wiring",  # held by a block slice being wired (WIRING, --reconfig-s)
    "queue_empty",  # free, and no job waits for the pod (in its queue or the cell's)
    "down_host_blocks",  # free chips of blocks with a down host (only sub-block slices fit)
    "shared_blocks",  # free chips of healthy blocks given over to sub-block slices
    # whole free blocks enough for a waiting job its quota admits (or no quotas), kept
    # out by the policy: an EASY reservation, FIFO's blocked head
    "blocks_kept",
    # whole free blocks enough for a job at the cell that its tenant's quota (and what it
    # may borrow) refuses, and for no job the quotas admit
    "quota",
    # whole free blocks fewer than any waiting job needs, and each waiting job larger than
    # its tenant's whole nominal quota: it runs on borrowed chips only, after the owners'
    # jobs within nominal (with quotas only)
    "jobs_above_nominal",
    "blocks_too_few",  # whole free blocks fewer than any waiting job needs
    "static_fragments",  # the static torus: free chips while jobs wait (no waiting box fits)
)
# The planner's answer for a block slice that no free blocks and no victims can place.
_NO_ROOM = Unplaceable((), note="too few free blocks and no lower priority to preempt")


@dataclass(frozen=True)
class Policy:
    """How the queue is served.

    `backfill`: "none" (strict queue order: the first job that cannot start stops the
    pass), "greedy" (any later job that fits starts) or "easy" (later jobs start only
    when they do not delay the first waiting job's reservation, computed from the
    running jobs' estimated ends: EASY backfill).
    `age_bound_s`: the workload scheduler's age bound (planner.plan_pass): the first
    job that cannot start and has waited this long may preempt younger jobs of its
    priority; None: no bound.
    `preempt`: higher priorities take lower priorities' blocks (WS-4).
    `defrag`: when the first waiting block slice lacks whole blocks, move sub-block
    slices out of the emptiest shared blocks into room in other shared blocks (each
    move a checkpoint-restart), if that frees enough blocks for it.
    `static`: the static-torus baseline (contiguous boxes, no swaps)."""

    name: str
    backfill: str = "greedy"
    preempt: bool = True
    defrag: bool = False
    static: bool = False
    age_bound_s: float | None = None


POLICIES = {
    "static": Policy("static", backfill="greedy", preempt=False, static=True),
    "fifo": Policy("fifo", backfill="none", preempt=False),
    "priority": Policy("priority", backfill="greedy", preempt=True),
    # the workload scheduler as it ships (LIGHTPATH_WS_AGE_BOUND_S at its default)
    "aged": Policy("aged", backfill="greedy", preempt=True, age_bound_s=DEFAULT_AGE_BOUND_S),
    "easy": Policy("easy", backfill="easy", preempt=True),
    "defrag": Policy("defrag", backfill="easy", preempt=True, defrag=True),
}
# The service's own queue (plan_pass with its age bound at the shipped default).
DEFAULT_POLICY = "aged"


@dataclass(frozen=True)
class Failures:
    """Hosts go down and come back: each host alternates up (exponential, mean
    `mtbf_s`) and down (exponential, mean `mttr_s`). From an availability a:
    mtbf = mttr x a / (1 - a)."""

    mtbf_s: float
    mttr_s: float

    @classmethod
    def from_availability(cls, availability: float, mttr_s: float) -> Failures:
        if not 0 < availability < 1:
            raise ValueError("availability must be between 0 and 1 (e.g. 0.995)")
        return cls(mttr_s * availability / (1 - availability), mttr_s)

    @property
    def availability(self) -> float:
        return self.mtbf_s / (self.mtbf_s + self.mttr_s)


@dataclass(frozen=True)
class SimConfig:
    policy: Policy = POLICIES[DEFAULT_POLICY]
    pods: int = 1
    restart_s: float = 300.0  # checkpoint-restart cost of an interrupted slice
    reconfig_s: float = 0.0  # OCS wiring time of a block slice (WIRING -> RUNNING)
    failures: Failures | None = None
    seed: int = 1  # of the failure draws (the workload has its own)
    # Tenants' quotas (issue 35): every job then passes the cell's quota check and
    # fair-share order (services/lightpath_services/sim/quotas.py); none: no quotas, priority order.
    quotas: tuple[Quota, ...] = ()
    half_life_s: float = DEFAULT_HALF_LIFE_S  # of the usage fair share orders by


@dataclass
class JobRun:
    """What happened to one job."""

    trace: TraceJob
    seq: int
    state: str = PENDING
    pod: int = -1
    work: float = 0.0  # chip-seconds left
    rate: int = 0  # chips working now
    since: float = 0.0  # RUNNING since
    epoch: int = 0
    first_start: float | None = None
    end: float | None = None
    preemptions: int = 0
    suspensions: int = 0  # by failures
    swaps: int = 0
    moves: int = 0
    lost_preemption: float = 0.0  # chip-seconds
    lost_failure: float = 0.0
    lost_defrag: float = 0.0
    done_work: float = 0.0  # chip-seconds done so far (all attempts)

    @property
    def chips(self) -> int:
        return self.trace.chip_count

    def est_end(self, now: float) -> float:
        """When its work ends by the user's estimate (EASY reservations)."""
        rate = self.rate or self.chips
        left = self.work / rate
        if self.state == RUNNING:
            left -= now - self.since
        scale = self.trace.estimate / self.trace.duration_s
        return now + left * scale


class Result:
    def __init__(self, jobs: list[JobRun], stats: dict, series: list[tuple[float, int, int]]):
        self.jobs = jobs
        self.stats = stats
        self.series = series  # (t, chips busy, chips healthy) at each change


# -- the pods --------------------------------------------------------------------------


class _Queue:
    """A pod's (or the cell's) waiting jobs in queue order: priority, then age."""

    def __init__(self) -> None:
        self.keys: list[tuple[int, int, str]] = []

    def add(self, priority: int, seq: int, job_id: str) -> None:
        bisect.insort(self.keys, (-priority, seq, job_id))

    def remove(self, priority: int, seq: int, job_id: str) -> None:
        i = bisect.bisect_left(self.keys, (-priority, seq, job_id))
        assert self.keys[i][2] == job_id
        del self.keys[i]

    def __len__(self) -> int:
        return len(self.keys)

    def ids(self) -> list[str]:
        return [k[2] for k in self.keys]


_DEMANDS: dict[SliceDemand, int] = {}


def _demand_id(demand: SliceDemand) -> int:
    """A small number per distinct demand (equal demands, equal numbers)."""
    got = _DEMANDS.get(demand)
    if got is None:
        got = _DEMANDS[demand] = len(_DEMANDS)
    return got


def pod_fabric(pod_id: str) -> PodFabric:
    return PodFabric(pod_id, BLOCK, ("tpu",) * BLOCKS, host_shape=HOST)


class Sim:
    """One run: a workload through one policy on `config.pods` pods."""

    def __init__(self, jobs: list[TraceJob], config: SimConfig):
        self.config = config
        self.policy = config.policy
        self.runs = [JobRun(j, i + 1) for i, j in enumerate(jobs)]
        self.by_id = {r.trace.job_id: r for r in self.runs}
        self.now = 0.0
        self._heap: list[tuple[float, int, str, Any]] = []
        self._n = 0
        self.ended = 0
        self.fabrics = [pod_fabric(f"pod-{i}") for i in range(config.pods)]
        self.chips_total = config.pods * BLOCKS * math.prod(BLOCK)
        self.busy = 0
        self.down_hosts = 0
        self.counters: Counter[str] = Counter()
        # time integrals
        self._t = 0.0
        self.busy_area = 0.0
        self.healthy_area = 0.0
        self.idle_waiting = 0  # free healthy chips while jobs wait (set after each event)
        # Healthy chips not working now, by why (IDLE_CAUSES; set after each event).
        self.idle_causes: dict[str, int] = {}
        self.window_idle = dict.fromkeys(IDLE_CAUSES, 0.0)  # their chip-s inside the window
        self.series: list[tuple[float, int, int]] = []
        self.window: tuple[float, float] = (
            (jobs[0].arrival_s, jobs[-1].arrival_s) if jobs else (0.0, 0.0)
        )
        self.window_areas = [0.0, 0.0, 0.0]  # busy, healthy, frag inside the window
        self.quota = (
            SimQuotas(config.quotas, self.chips_total, config.half_life_s)
            if config.quotas and not config.policy.static
            else None
        )
        if self.policy.static:
            self.model: _Model = StaticModel(self)
        else:
            self.model = OcsModel(self)

    # -- the clock -------------------------------------------------------------------

    def at(self, t: float, kind: str, what: Any) -> None:
        self._n += 1
        heapq.heappush(self._heap, (t, self._n, kind, what))

    def _advance(self, t: float) -> None:
        dt = t - self._t
        if dt > 0:
            healthy = self.chips_total - self.down_hosts * math.prod(HOST)
            self.busy_area += self.busy * dt
            self.healthy_area += healthy * dt
            lo, hi = self.window
            a, b = max(self._t, lo), min(t, hi)
            if b > a:
                self.window_areas[0] += self.busy * (b - a)
                self.window_areas[1] += healthy * (b - a)
                self.window_areas[2] += self.idle_waiting * (b - a)
                for cause, chips in self.idle_causes.items():
                    self.window_idle[cause] += chips * (b - a)
            if self.quota is not None:
                self.quota.advance(self._t, t, self.window)
        self._t = t
        self.now = t

    def _record(self) -> None:
        healthy = self.chips_total - self.down_hosts * math.prod(HOST)
        if self.series and self.series[-1][0] == self.now:
            self.series[-1] = (self.now, self.busy, healthy)
        else:
            self.series.append((self.now, self.busy, healthy))

    def run(self) -> Result:
        for r in self.runs:
            r.work = r.chips * r.trace.duration_s
            self.at(r.trace.arrival_s, "arrive", r)
        if self.config.failures is not None:
            self._start_failures()
        total = len(self.runs)
        while self._heap and self.ended < total:
            t, _, kind, what = heapq.heappop(self._heap)
            self._advance(t)
            if kind == "arrive":
                self.model.arrive(what)
            elif kind == "done":
                run, epoch = what
                if run.epoch == epoch and run.state == RUNNING:
                    self.model.complete(run)
            elif kind == "wired":
                run, epoch = what
                if run.epoch == epoch and run.state == WIRING:
                    self.model.wired(run)
            elif kind == "aged":
                self.model.aged(*what)
            elif kind == "host":
                pod, block, host, down = what
                self._host_event(pod, block, host, down)
            self.model.note_idle()
            self._record()
        return Result(self.runs, self._stats(), self.series)

    # -- failures --------------------------------------------------------------------

    def _start_failures(self) -> None:
        f = self.config.failures
        assert f is not None
        self._frng = random.Random(f"failures-{self.config.seed}")
        hosts = BLOCKS * math.prod(b // h for b, h in zip(BLOCK, HOST, strict=True))
        for pod in range(self.config.pods):
            for h in range(hosts):
                block, host = divmod(h, hosts // BLOCKS)
                self.at(self._frng.expovariate(1 / f.mtbf_s), "host", (pod, block, host, True))

    def _host_event(self, pod: int, block: int, host: int, down: bool) -> None:
        f = self.config.failures
        assert f is not None
        mean = f.mttr_s if down else f.mtbf_s
        self.at(self.now + self._frng.expovariate(1 / mean), "host", (pod, block, host, not down))
        self.down_hosts += 1 if down else -1
        self.counters["host_failures" if down else "host_recoveries"] += 1
        self.model.host(pod, block, host, down)

    # -- a job's life ------------------------------------------------------------------

    def start(self, run: JobRun, chips: int) -> None:
        """RUNNING on `chips` chips from now."""
        run.state = RUNNING
        run.rate = chips
        run.since = self.now
        run.epoch += 1
        if run.first_start is None:
            run.first_start = self.now
        self.busy += chips
        self.at(self.now + run.work / chips, "done", (run, run.epoch))

    def stop(self, run: JobRun) -> None:
        """Stops working (its work so far is counted)."""
        if run.state == RUNNING:
            did = (self.now - run.since) * run.rate
            run.work = max(0.0, run.work - did)
            run.done_work += did
            self.busy -= run.rate
        run.epoch += 1

    def interrupt(self, run: JobRun, why: str) -> None:
        """Stopped and to restart from its checkpoint: pays restart_s of its slice."""
        was_running = run.state == RUNNING
        self.stop(run)
        if not was_running:
            return  # never ran since it was placed: nothing to restore
        cost = self.config.restart_s * run.chips
        run.work += cost
        if why == "failure":
            run.lost_failure += cost
        elif why == "defrag":
            run.lost_defrag += cost
        else:
            run.lost_preemption += cost

    def end(self, run: JobRun, state: str) -> None:
        if state != DONE:
            lost = run.done_work + (
                (self.now - run.since) * run.rate if run.state == RUNNING else 0.0
            )
            if state == PREEMPTED:
                run.lost_preemption += lost
            else:
                run.lost_failure += lost
        self.stop(run)
        run.state = state
        run.end = self.now
        self.ended += 1
        if self.quota is not None:
            self.quota.release(run.trace.job_id, self.now)
        self.counters[state.lower()] += 1

    # -- the summary --------------------------------------------------------------------

    def _stats(self) -> dict:
        lo, hi = self.window
        busy_w, healthy_w, frag_w = self.window_areas
        span = max(hi - lo, 1e-9)
        return {
            "utilisation_healthy": busy_w / healthy_w if healthy_w else 0.0,
            "utilisation_all": busy_w / (self.chips_total * span) if hi > lo else 0.0,
            "utilisation_healthy_whole_run": (
                self.busy_area / self.healthy_area if self.healthy_area else 0.0
            ),
            "fragmentation": frag_w / healthy_w if healthy_w else 0.0,
            # shares of the healthy chip-seconds (utilisation's denominator) not worked, by why
            "idle_by_cause": {
                cause: self.window_idle[cause] / healthy_w if healthy_w else 0.0
                for cause in IDLE_CAUSES
            },
            "makespan_s": self.now,
            "window_s": [lo, hi],
            "counters": dict(self.counters),
        } | ({"quotas": self._quota_stats()} if self.quota is not None else {})

    def _quota_stats(self) -> dict:
        assert self.quota is not None
        waits: dict[str, list[float]] = {}
        for r in self.runs:
            if r.first_start is not None:
                waits.setdefault(r.trace.tenant, []).append(r.first_start - r.trace.arrival_s)
        return self.quota.summary(self.window, waits)


class _Model:
    def note_idle(self) -> None:
        """Sets the sim's idle_causes and idle_waiting for the state now (after an event)."""

    def arrive(self, run: JobRun) -> None: ...
    def complete(self, run: JobRun) -> None: ...
    def wired(self, run: JobRun) -> None: ...
    def aged(self, pod: Any, job_id: str) -> None: ...
    def host(self, pod: int, block: int, host: int, down: bool) -> None: ...


# -- OCS pods: the workload scheduler's planner ------------------------------------------


class OcsPod:
    def __init__(self, index: int, fabric: PodFabric):
        self.index = index
        self.state = IndexedPodState(fabric)
        self.queue = _Queue()
        self.waiting: dict[str, SliceJob] = {}
        # Per waiting job, what a pass asks of it each time: (its demand and priority as
        # a key, a block slice of one node type?, blocks, that node type).
        self.traits: dict[str, tuple[tuple[int, int], bool, int, str]] = {}
        self.version = 0  # of the capacity the cell sees
        self._view: tuple[int, PodCapacityView] | None = None
        # The version at which the pod's last pass admitted nothing and changed nothing
        # (a fixed point of the queue), or None: see OcsModel._submit.
        self.quiet: int | None = None
        self.quiet_ms = 0  # when that pass ran
        # Waiting jobs by the whole blocks they need (a sub-block slice: 1).
        self.needs: Counter[int] = Counter()
        self._idle: tuple[int, tuple[int, int, int, int]] = (-1, (0, 0, 0, 0))

    def idle_chips(self) -> tuple[int, int, int, int]:
        """_idle_chips of its state, once per version."""
        if self._idle[0] != self.version:
            self._idle = (self.version, _idle_chips(self.state))
        return self._idle[1]

    def enqueue(self, job: SliceJob) -> None:
        self.waiting[job.job_id] = job
        self.queue.add(job.priority, job.seq, job.job_id)
        d = job.demand
        kinds = set(d.node_types)
        one_type = d.box is None and len(kinds) == 1
        self.traits[job.job_id] = (
            (_demand_id(d), job.priority),
            one_type,
            d.block_count,
            d.node_types[0] if one_type else "",
        )
        self.needs[d.block_count] += 1

    def dequeue(self, job_id: str) -> SliceJob:
        job = self.waiting.pop(job_id)
        self.queue.remove(job.priority, job.seq, job_id)
        del self.traits[job_id]
        self.needs[job.demand.block_count] -= 1
        if not self.needs[job.demand.block_count]:
            del self.needs[job.demand.block_count]
        return job

    def view(self) -> PodCapacityView:
        """What the pod reports to the cell (cell_link.capacity_pb, pods.capacity_view)."""
        if self._view is not None and self._view[0] == self.version:
            return self._view[1]
        state = self.state
        fabric = state.fabric
        view = PodCapacityView(fabric.pod_id, block_chips=fabric.chips_per_block)
        preemptible: dict[str, dict[int, int]] = {}
        for job in state.jobs.values():
            if job.state == RUNNING and job.placement and job.offset is None:
                for t, n in max_freeable(state, job).items():
                    levels = preemptible.setdefault(t, {})
                    levels[job.priority] = levels.get(job.priority, 0) + n
        free = state.free_counts()
        for t, chips_free in state.chips_free_by_type().items():
            view.free[t] = free[t]
            view.chips_free[t] = chips_free
            view.largest_box[t] = largest_free_box(state, t)
            view.preemptible[t] = preemptible.get(t, {})
        self._view = (self.version, view)
        return view


class OcsModel(_Model):
    # Answers known without asking (a pass that cannot change anything is skipped, a
    # block slice that free blocks and victims cannot place is not planned, a demand no
    # pod took at the same capacity versions is not offered to the pods again): they
    # change no decision (tests/sim runs both ways and compares every job).
    shortcuts = True

    def __init__(self, sim: Sim):
        self.sim = sim
        self.pods = [OcsPod(i, f) for i, f in enumerate(sim.fabrics)]
        self.cell_queue = _Queue()
        self.jobs: dict[str, SliceJob] = {}  # jobs waiting at the cell
        # (demand, priority) -> the pods' versions when choose() found no pod for it
        self._no_pod: dict[tuple[int, int], tuple[int, ...]] = {}
        self._cell_key: dict[str, tuple[int, int]] = {}  # its (demand, priority) per job
        self.cell_needs: Counter[int] = Counter()  # jobs at the cell by the blocks they need
        self._hold: Hold | None = None  # the pod held for an owner's job (quota.Hold)
        # _reclaimers at these pod versions
        self._reclaimers_at: tuple[tuple[int, ...], dict] = ((), {})
        # Tests: called with each allocation before it is applied.
        self.on_decision: Callable[[OcsPod, Allocation], None] | None = None

    # -- arrivals and the cell -------------------------------------------------------

    def _slice_job(self, run: JobRun) -> SliceJob:
        n = run.trace.norm
        return SliceJob(
            job_id=run.trace.job_id,
            state=PENDING,
            epoch=1,
            priority=n.priority,
            seq=run.seq,
            demand=n.demand,
            preemption=n.preemption,
            shrink_to=n.shrink_to,
            on_block_failure=n.on_block_failure,
            when_no_capacity=n.when_no_capacity,
        )

    def arrive(self, run: JobRun) -> None:
        job = self._slice_job(run)
        if len(self.pods) == 1 and self.sim.quota is None:
            self._submit(self.pods[0], run, job)
            return
        if self.sim.quota is not None and self.sim.quota.book.never_fits(
            run.trace.tenant, {NODE_TYPE: self._chips(job)}
        ):
            self.sim.counters["over_quota"] += 1
            self.sim.end(run, FAILED)  # the cell refuses it: no quota can ever admit it
            return
        run.state = AT_CELL
        self._to_cell(job)
        self._cell_pass()

    def _to_cell(self, job: SliceJob) -> None:
        self.jobs[job.job_id] = job
        self._cell_key[job.job_id] = (_demand_id(job.demand), job.priority)
        self.cell_queue.add(job.priority, job.seq, job.job_id)
        self.cell_needs[job.demand.block_count] += 1

    def _from_cell(self, job_id: str) -> None:
        job = self.jobs.pop(job_id)
        del self._cell_key[job_id]
        self.cell_queue.remove(job.priority, job.seq, job_id)
        n = job.demand.block_count
        self.cell_needs[n] -= 1
        if not self.cell_needs[n]:
            del self.cell_needs[n]

    def _need(self, job: SliceJob) -> Counter[str]:
        d = job.demand
        if d.box is not None:
            return Counter({chips_key(d.node_types[0]): math.prod(d.box)})
        return d.type_counts()

    def _cell_pass(self) -> None:
        """The cell's queue in order: each job to its first candidate pod (choice.choose
        over the pods' capacity as they report it), else it waits (backfill)."""
        if not len(self.cell_queue):
            return
        if self.sim.quota is not None:
            # a reclaim can free more than the owner's job takes: pass again, as the
            # cell's dispatcher does when the pod reports the freed capacity
            for _ in range(100):
                if not self._quota_pass():
                    break
            return
        # choose() is a function of the job's need and priority and of the pods' views,
        # and a view changes only with its pod's version: a (need, priority) that found
        # no pod at these versions finds none again (across passes too). And choose()
        # takes or leaves each pod on that pod's view alone (no refusals, preferred pod
        # or shielded blocks here): when only some pods changed since it found none, it
        # is asked about those, and about all only if one of them would take the job.
        versions = tuple(p.version for p in self.pods)
        no_pod, cell_key = self._no_pod, self._cell_key
        skipped = 0
        for job_id in self.cell_queue.ids():
            key = cell_key[job_id]
            seen = no_pod.get(key) if self.shortcuts else None
            if seen == versions:
                skipped += 1
                continue
            job = self.jobs[job_id]
            need = self._need(job)
            if seen is not None:
                views = [p.view() for p, v in zip(self.pods, seen, strict=True) if p.version != v]
                demand = JobDemand(job_id, job.priority, {v.pod_id: need for v in views})
                if not choose(demand, views).candidates:
                    no_pod[key] = versions
                    continue
            views = [p.view() for p in self.pods]
            demand = JobDemand(job_id, job.priority, {v.pod_id: need for v in views})
            choice = choose(demand, views)
            if not choice.candidates:
                no_pod[key] = versions
                continue
            pod = next(p for p in self.pods if p.state.fabric.pod_id == choice.candidates[0].pod_id)
            self._from_cell(job_id)
            self._submit(pod, self.sim.by_id[job_id], job)
            versions = tuple(p.version for p in self.pods)
        if skipped:
            self.sim.counters["cell_offers_skipped"] += skipped

    def _quota_pass(self) -> bool:
        """The cell queue with quotas: in fair-share order, each job its tenant's quota
        admits goes to the pod `choose` picks; one within its nominal quota that no
        pod takes reclaims borrowed chips (QuotaBook.reclaim) on one pod and goes there.
        True when it reclaimed (a further pass may use what was freed)."""
        sim = self.sim
        quota = sim.quota
        assert quota is not None
        waiting = [
            Waiting(
                j,
                sim.by_id[j].trace.tenant,
                self.jobs[j].priority,
                self.jobs[j].seq,
                {NODE_TYPE: self._chips(self.jobs[j])},
            )
            for j in self.cell_queue.ids()
        ]
        left: list[Waiting] = []
        causes: dict[str, str] = {}  # why an owner's job within nominal was not placed
        reclaimed = False
        if self._hold is not None and self._hold.job_id not in self.jobs:
            self._hold = None  # its job started or left: the pod is anyone's again
        for w in quota.order(waiting):
            job = self.jobs[w.job_id]
            verdict = quota.book.check(w.tenant, w.chips)
            if not verdict.ok:
                left.append(w)
                continue
            need = self._need(job)
            views = [p.view() for p in self.pods]
            # one that would borrow stays off the pod held for an owner's job
            held = self._hold.keeps_out(w.job_id, not verdict.within_nominal) if self._hold else ""
            reclaimers = self._reclaimers()
            choice = choose(
                JobDemand(
                    w.job_id,
                    job.priority,
                    {v.pod_id: need for v in views if v.pod_id != held},
                    shielded=shielded_blocks(w.job_id, job.priority, reclaimers.values()),
                ),
                views,
            )
            # The cell forwards asking not to wait: a pod that cannot place it now refuses
            # (the cell's view is a summary), and the next candidate is asked.
            pod_id = None
            for c in choice.candidates:
                if c.how == FITS or self._places(c.pod_id, job):
                    pod_id = c.pod_id
                    break
                sim.counters["cell_refusals"] += 1
            if pod_id is None:
                reclaim = None
                if verdict.within_nominal:
                    placed, holders = self._placed_jobs()
                    # never a job that reclaimed from this one (the pod would refuse it)
                    placed = [
                        r
                        for r in placed
                        if r.job_id not in reclaimers
                        or not shields(reclaimers[r.job_id][1], w.job_id)
                    ]
                    reclaim = quota.book.reclaim(
                        w.tenant,
                        w.chips,
                        placed,
                        self._room(views),
                        box=job.demand.box is not None,
                        block_chips={v.pod_id: v.block_chips for v in views},
                        holders=holders,
                    )
                pod = None
                if reclaim is not None:
                    pod = next(p for p in self.pods if p.state.fabric.pod_id == reclaim.pod)
                    if not self._fits_without(pod, job, [v.job_id for v in reclaim.victims]):
                        pod = None  # the pod would refuse it: nothing is taken
                        causes[w.job_id] = REFUSED_BY_POD
                elif verdict.within_nominal:
                    causes[w.job_id] = self._why_no_reclaim(w, placed, views)
                    if self._hold is None and job.demand.box is None and HOLDS:
                        # as the service's dispatcher does (forward.Forwarder._reclaim)
                        to_hold = quota.book.pod_to_hold(
                            w.tenant, w.chips, placed, self._room(views)
                        )
                        if to_hold is not None:
                            self._hold = Hold(w.job_id, to_hold)
                            sim.counters["holds"] += 1
                if reclaim is None or pod is None:
                    left.append(w)
                    continue
                pod_id = reclaim.pod
                for v in reclaim.victims:
                    self._reclaim(pod, v.job_id)
                # as the pod admits it: never a victim of the jobs it reclaimed from
                job = job.with_(reclaimed_from=tuple(sorted(v.job_id for v in reclaim.victims)))
                reclaimed = True
            pod = next(p for p in self.pods if p.state.fabric.pod_id == pod_id)
            self._from_cell(w.job_id)
            quota.admit(w.job_id, w.tenant, w.chips[NODE_TYPE], sim.now)
            self._submit(pod, sim.by_id[w.job_id], job)
        quota.note_waiting([w for w in left if w.job_id in self.jobs], causes)
        return reclaimed

    def _why_no_reclaim(
        self, w: Waiting, placed: list[RunningJob], views: list[PodCapacityView]
    ) -> str:
        """Why reclaim found nothing for an owner's job within its nominal (the causes of
        `denied_within_nominal`): no pod where its free blocks and the chips of jobs of
        tenants that borrow now make the job's chips (NO_POD_REACH), or some pod has
        them but not in jobs reclaim may take, its borrowers' turns (NOT_BORROWED)."""
        book = self.sim.quota.book  # type: ignore[union-attr]
        reach = book.reach(w.tenant, NODE_TYPE, placed, self._room(views))
        return (
            NOT_BORROWED if max(reach.values(), default=0) >= w.chips[NODE_TYPE] else NO_POD_REACH
        )

    def _reclaimers(self) -> dict[str, tuple[str, tuple[str, ...], int, Counter[str]]]:
        """Per running job that reclaimed quota: (its pod, the jobs it reclaimed from, its
        priority, the blocks it gives up at most: none for a sub-block slice), as the
        service's cell reads them (quotas.reclaimers) for choice.shielded_blocks. Once
        per set of pod versions."""
        versions = tuple(p.version for p in self.pods)
        if self._reclaimers_at[0] != versions:
            found = {
                j.job_id: (
                    p.state.fabric.pod_id,
                    j.reclaimed_from,
                    j.priority,
                    max_freeable(p.state, j) if j.offset is None else Counter(),
                )
                for p in self.pods
                for j in p.state.jobs.values()
                if j.reclaimed_from and j.state == RUNNING and j.placement
            }
            self._reclaimers_at = (versions, found)
        return self._reclaimers_at[1]

    def _places(self, pod_id: str, job: SliceJob) -> bool:
        """Whether the pod's planner places `job` now, preempting if it must (its answer
        to a forward that asked not to wait)."""
        pod = next(p for p in self.pods if p.state.fabric.pod_id == pod_id)
        return not isinstance(plan_admission(pod.state, job), Unplaceable)

    def _fits_without(self, pod: OcsPod, job: SliceJob, victims: list[str]) -> bool:
        """Whether the pod's planner places `job` once `victims` leave (the pod's own
        admission confirming a reclaim before anything is taken)."""
        trial = pod.state.copy()
        for v in victims:
            gone = trial.jobs[v]
            trial.assume_released(v, gone.held_keys())
            trial.jobs.pop(v, None)
        found = plan_admission(trial, job, preempt=False)
        return not isinstance(found, Unplaceable)

    def _placed_jobs(
        self,
    ) -> tuple[list[RunningJob], dict[tuple[str, int], set[str]]]:
        """Admitted jobs holding chips on a pod (WIRING or RUNNING): what reclaim frees;
        and per (pod, block) given over to sub-block slices, every slice holding chips
        there (as the service reads them: plan_reclaim)."""
        quota = self.sim.quota
        assert quota is not None
        pod_of: dict[str, str] = {}
        order: dict[str, tuple[int, int]] = {}
        block_of: dict[str, int] = {}
        holders: dict[tuple[str, int], set[str]] = {}
        for p in self.pods:
            pod_id = p.state.fabric.pod_id
            for j in p.state.jobs.values():
                if j.offset is not None and j.placement and j.state in HOLDING_STATES:
                    block_of[j.job_id] = j.placement[0]
                    holders.setdefault((pod_id, j.placement[0]), set()).add(j.job_id)
                if j.job_id in quota.admitted:
                    pod_of[j.job_id] = pod_id
                    order[j.job_id] = (j.priority, j.seq)
        return quota.running(pod_of, order, block_of), holders

    def _room(self, views: list[PodCapacityView]) -> dict[str, dict[str, int]]:
        """Chips a job could use per pod without preempting, as the service's reclaim
        counts them: whole free blocks' (a box's free chips beside others: not counted,
        since they need not add up with a victim's in one place)."""
        return {v.pod_id: {NODE_TYPE: v.free[NODE_TYPE] * v.block_chips} for v in views}

    def _reclaim(self, pod: OcsPod, job_id: str) -> None:
        """A borrower's job leaves the pod for an owner's: terminated, or (delay,
        shrink) delayed, to restart from its checkpoint: as the service's pod lets a job
        a reclaim delays go, back in the cell queue (its first place there) with its
        quota charge given back; the cell may place it on any pod."""
        sim = self.sim
        quota = sim.quota
        assert quota is not None
        job = pod.state.jobs[job_id]
        run = sim.by_id[job_id]
        quota.reclaimed += 1
        sim.counters["reclaims"] += 1
        run.preemptions += 1
        self._release(pod, job)
        if job.preemption == TERMINATE:
            sim.end(run, PREEMPTED)
            return
        sim.interrupt(run, "preemption")
        quota.release(job_id, sim.now)
        again = self._slice_job(run)
        run.state = AT_CELL
        self._to_cell(again)

    def _submit(self, pod: OcsPod, run: JobRun, job: SliceJob) -> None:
        run.pod = pod.index
        run.state = QUEUED
        job = job.with_(submitted_ms=_ms(self.sim.now))  # the pod admits it (_new_job)
        bound = self.sim.policy.age_bound_s
        if bound is not None:  # a pass when it reaches the age bound (reconcile's `due`)
            self.sim.at(self.sim.now + bound, "aged", (pod, job.job_id))
        pod.enqueue(job)
        if self.shortcuts and pod.quiet == pod.version and self._still_quiet(pod, run, job):
            self.sim.counters["passes_skipped"] += 1
            return
        self.schedule(pod)

    def _still_quiet(self, pod: OcsPod, run: JobRun, job: SliceJob) -> bool:
        """True when a pass now would decide nothing: the pod's state has not changed
        since a pass that admitted nothing, and the job that just joined the queue would
        not start. The jobs waiting before it get the same answers from the planner on
        the same state; the reservation EASY gives the head of the queue can only move
        later by as much as the clock did (estimated ends are fixed, or move with the
        clock), so a job it kept out stays out. A pass is still run when the new job
        is the new head (under EASY its reservation replaces the old one; under defrag,
        the first block slice, what defragmentation works for)."""
        policy = self.sim.policy
        first = pod.queue.keys[0][2]
        if not self._aging_quiet(pod):
            return False
        if policy.backfill == "none" and first != job.job_id:
            return True  # the pass stops at the head, blocked as before
        if policy.backfill == "easy" and first == job.job_id:
            return False
        if policy.defrag and job.demand.box is None:
            head = next(j for j in pod.queue.ids() if pod.waiting[j].demand.box is None)
            if head == job.job_id:
                return False
        state = pod.state
        found = plan_admission(state, job, preempt=policy.preempt)
        if isinstance(found, Unplaceable):
            return True
        if found.victims or policy.backfill != "easy":
            return False
        reservation = self._reservation(pod, pod.waiting[first])
        if reservation is None:
            return False
        return (
            self._ends(run) > reservation[0] and self._blocks_taken(state, found) > (reservation[1])
        )

    def _aging_quiet(self, pod: OcsPod) -> bool:
        """False when the age bound's turn would go to another job than in the pod's last
        (quiet) pass: a job that reached the bound since comes before, in queue order, the
        first job that had reached it then. Otherwise the same job takes the turn on the
        same state and fails again (the quiet pass placed nothing). Only a greedy walk
        is sure to have offered that first job the turn (EASY's reservation and FIFO's
        stop may pass it over): otherwise any job reaching the bound since counts."""
        policy = self.sim.policy
        if policy.age_bound_s is None:
            return True
        bound, now_ms = _ms(policy.age_bound_s), _ms(self.sim.now)
        waiting = pod.waiting
        greedy = self.shortcuts and policy.backfill == "greedy" and not policy.defrag
        for _, _, job_id in pod.queue.keys:
            due = waiting[job_id].submitted_ms + bound
            if due <= pod.quiet_ms:
                if greedy:
                    return True  # had its turn then: it takes it again
            elif due <= now_ms:
                return False  # reached the bound since (ahead of it)
        return True

    def _ends(self, run: JobRun) -> float:
        """When a waiting job started now would end by its estimate (EASY)."""
        sim = self.sim
        return (
            sim.now
            + sim.config.reconfig_s
            + run.work / run.chips * (run.trace.estimate / run.trace.duration_s)
        )

    # -- scheduling passes -----------------------------------------------------------

    def schedule(self, pod: OcsPod) -> None:
        """Passes until one changes nothing that a further pass could use (as the
        service's passes, and the pass its wirings ask for, do)."""
        for _ in range(100):
            again = self._pass(pod)
            if not again:
                break

    def _pass(self, pod: OcsPod) -> bool:
        sim = self.sim
        policy = sim.policy
        state = pod.state
        started: list[Allocation] = []
        failed_at: dict[tuple, int] = {}
        failed_blocks: dict[int, int] = {}  # priority -> fewest blocks that failed
        victims_applied = 0
        reservation: list[float] | None = None  # [shadow time, spare blocks]
        # The age bound, as plan_pass applies it: the first blocked job past it asks again.
        bound = None if policy.age_bound_s is None else _ms(policy.age_bound_s)
        aged = bound is None
        now_ms = _ms(sim.now)
        blocked = False
        rerun = False
        defragged = False
        # What the planner would answer for a block slice of one node type, known
        # without asking it: with fewer free blocks than it needs and no RUNNING slice
        # of lower priority (the only victims, choose_victims / _box_groups), Unplaceable;
        # with enough, an allocation on free blocks (which EASY's reservation may keep
        # out). `low` is taken before the queue is walked: within a pass RUNNING slices
        # only leave (victims), so the lowest priority among them can only rise.
        free_blocks: Counter[str] | None = None
        full: bool | None = None  # nothing free: no block, no chip on a healthy host
        low = min((j.priority for j in state.jobs.values() if j.state == RUNNING), default=1 << 30)
        traits = pod.traits
        ids = pod.queue.ids()
        # No job after the last one past the bound can take its turn: from there on the
        # pass walks as if the turn had been taken (the shortcuts below that wait for it).
        last_due = -1
        due_ms = now_ms - bound if bound is not None else 0  # submitted by then: past it
        if not aged and not self.shortcuts:
            last_due = len(ids)  # the full walk: every job waits for the turn
        elif not aged:
            waiting = pod.waiting
            for i in range(len(ids) - 1, -1, -1):
                if waiting[ids[i]].submitted_ms <= due_ms:
                    last_due = i
                    break
        for i, job_id in enumerate(ids):
            if i > last_due:
                aged = True
            # Skipped without asking the planner when its answer is known: the same demand,
            # or (a block slice of one node type) as many blocks or more at the same or a
            # lower priority, failed since the last preemption (the pod only fills up
            # within a pass; a preemption may free more than its preemptor takes).
            key, one_type, n, node_type = traits[job_id]
            if self.shortcuts and aged and key[1] <= low:
                # Nothing is free (no block, no chip on a healthy host) and neither this
                # job nor any after it (no higher priority) has a lower priority to
                # preempt, nor the age bound's turn: no later job can be placed.
                if full is None:  # asked once per state, not once per job
                    if free_blocks is None:
                        free_blocks = state.free_counts()
                    full = not any(free_blocks.values()) and _free_chips(state) == 0
                if full:
                    blocked = True
                    sim.counters["queue_walks_cut"] += 1
                    break
            known = failed_at.get(key) == victims_applied
            if not known and one_type and failed_blocks:
                priority = key[1]
                for p, m in failed_blocks.items():
                    if p >= priority and m <= n:
                        known = True
                        break
            if known and (aged or (self.shortcuts and pod.waiting[job_id].submitted_ms > due_ms)):
                # known Unplaceable and (past the turn, or not due for it): nothing to ask
                continue
            job = pod.waiting[job_id]
            found: Allocation | Unplaceable | None = None
            if known:
                found = _NO_ROOM  # known: only its age-bound turn may place it
            elif one_type and self.shortcuts:
                if free_blocks is None:
                    free_blocks = state.free_counts()
                if free_blocks[node_type] < n:
                    if job.priority <= low:
                        found = _NO_ROOM
                elif (
                    reservation is not None
                    and self._ends(sim.by_id[job_id]) > reservation[0]
                    and n > reservation[1]
                ):
                    continue  # would delay the first waiting job's reservation
            if found is None:
                found = plan_admission(state, job, preempt=policy.preempt)
            if isinstance(found, Unplaceable) and not aged and waited_past(job, now_ms, bound):
                aged = True
                found = plan_admission(state, job, take_younger=True)
            if isinstance(found, Unplaceable):
                failed_at[key] = victims_applied
                if one_type:
                    failed_blocks[job.priority] = min(failed_blocks.get(job.priority, n), n)
                if not blocked:
                    blocked = True
                    if policy.backfill == "none":
                        break
                    if policy.backfill == "easy":
                        reservation = self._reservation(pod, job)
                continue
            if reservation is not None and not found.victims:
                taken = self._blocks_taken(state, found)
                if self._ends(sim.by_id[job_id]) > reservation[0]:
                    if taken > reservation[1]:
                        continue  # would delay the first waiting job's reservation
                    reservation[1] -= taken
            pod.dequeue(job_id)
            if self.on_decision is not None:
                self.on_decision(pod, found)
            apply_allocation(state, found)
            free_blocks = full = None
            if found.victims:
                victims_applied += 1
                failed_blocks.clear()
            started.append(found)
            self._commit(pod, found)
            if any(v.action != TERMINATE for v in found.victims):
                rerun = True
        if blocked and policy.defrag and self._defrag(pod):
            rerun = defragged = True
        # The slices placed run (after their wiring): a waiting job of higher priority
        # may now preempt one of them, which it could not while they were WIRING.
        top = -pod.queue.keys[0][0] if len(pod.queue) else 0
        for alloc in started:
            self._placed(pod, alloc)
            if policy.preempt and sim.config.reconfig_s == 0 and top > alloc.job.priority:
                rerun = True
        pod.quiet = pod.version if not (started or defragged or rerun) else None
        pod.quiet_ms = now_ms
        return rerun

    def _blocks_taken(self, state: IndexedPodState, alloc: Allocation) -> int:
        if alloc.offset is not None:
            return 0 if state.owner.get(alloc.placement[0]) == SUB_BLOCK_OWNER else 1
        return len(alloc.placement)

    def _reservation(self, pod: OcsPod, head: SliceJob) -> list[float] | None:
        """EASY: when `head` can start if nothing else starts (the running jobs' estimated
        ends free their blocks), and how many blocks are spare then. None when it could
        not start even on an empty pod.

        Blocks are counted one at a time in the order their holders end (a block shared
        by sub-block slices when the last of them ends), so the block that completes the
        head's need leaves none spare. One pass over the placed jobs: a block slice's
        healthy blocks all end with it."""
        state = pod.state
        sim = self.sim
        need = 1 if head.demand.box is not None else head.demand.block_count
        failed = state.failed
        if need > BLOCKS - len(failed):
            return None
        free = sum(state.free_counts().values())
        if free >= need:  # blocks enough, but not usable now (a box on no aligned place)
            return [sim.now, free - need]
        now = sim.now
        reconfig = sim.config.reconfig_s
        by_id = sim.by_id
        ends: list[tuple[float, int]] = []
        shared: dict[int, float] = {}
        for job in state.jobs.values():
            placement = job.placement
            if placement is None:
                continue
            t = by_id[job.job_id].est_end(now)
            if job.state == WIRING:
                t += reconfig
            if job.offset is not None:
                b = placement[0]
                if b not in failed and t > shared.get(b, 0.0):
                    shared[b] = t
            elif failed:
                n = sum(1 for b in placement if b not in failed)
                if n:
                    ends.append((t, n))
            else:
                ends.append((t, len(placement)))
        ends.extend((t, 1) for t in shared.values())
        ends.sort()
        got = free
        for t, n in ends:
            got += n
            if got >= need:
                return [t, 0.0]
        return None

    def _commit(self, pod: OcsPod, alloc: Allocation) -> None:
        """The victims' side of a committed allocation (the state already has it)."""
        state = pod.state
        for v in alloc.victims:
            self._victim(pod, v)
        if alloc.offset is None:
            for b in alloc.placement:
                state.wired[b] = alloc.job.job_id
        pod.version += 1

    def _victim(self, pod: OcsPod, v: VictimAction) -> None:
        sim = self.sim
        state = pod.state
        run = sim.by_id[v.job_id]
        sim.counters["preemptions"] += 1
        run.preemptions += 1
        self._unwire(state, v.job_id, v.freed)
        if v.action == TERMINATE:
            sim.end(run, PREEMPTED)
            return
        sim.interrupt(run, "preemption")
        job = state.jobs[v.job_id]
        if v.action == DELAY:
            del state.jobs[v.job_id]
            run.state = QUEUED
            pod.enqueue(job)
            return
        # SHRINK: rewired to the kept part, then runs on fewer chips
        run.state = WIRING
        sim.counters["reconfigurations"] += 1
        self._run_after_wiring(pod, job)

    def _unwire(self, state: IndexedPodState, job_id: str, keys) -> None:
        for b in keys:
            if isinstance(b, int) and state.wired.get(b) == job_id:
                del state.wired[b]

    def _chips(self, job: SliceJob) -> int:
        d = job.demand
        return math.prod(d.box) if d.box is not None else d.block_count * math.prod(BLOCK)

    def _placed(self, pod: OcsPod, alloc: Allocation) -> None:
        run = self.sim.by_id[alloc.job.job_id]
        run.state = WIRING
        run.pod = pod.index
        job = pod.state.jobs[alloc.job.job_id]
        if alloc.offset is None:
            self.sim.counters["reconfigurations"] += 1
            self._run_after_wiring(pod, job)
        else:
            self._running(pod, job)  # a box needs no OCS change

    def _run_after_wiring(self, pod: OcsPod, job: SliceJob) -> None:
        if self.sim.config.reconfig_s > 0:
            run = self.sim.by_id[job.job_id]
            run.epoch += 1
            self.sim.at(self.sim.now + self.sim.config.reconfig_s, "wired", (run, run.epoch))
        else:
            self._running(pod, job)

    def _running(self, pod: OcsPod, job: SliceJob) -> None:
        pod.state.jobs[job.job_id] = job.with_(state=RUNNING)
        pod.version += 1
        self.sim.start(self.sim.by_id[job.job_id], self._chips(job))

    def aged(self, pod: OcsPod, job_id: str) -> None:
        """A waiting job reached the age bound: a pass (the service's reconcile round)."""
        if job_id not in pod.waiting:
            return
        policy = self.sim.policy
        if (
            self.shortcuts
            and pod.quiet == pod.version
            and policy.backfill == "greedy"
            and not policy.defrag
            and self._aging_quiet(pod)
        ):
            # nothing changed since a pass that placed nothing, and the age bound's turn
            # goes to the same job: the pass would decide nothing again
            self.sim.counters["passes_skipped"] += 1
            return
        self.schedule(pod)

    def wired(self, run: JobRun) -> None:
        pod = self.pods[run.pod]
        job = pod.state.jobs[run.trace.job_id]
        self._running(pod, job)
        # blocks that failed while it was wired are swapped now (the reconcile loop)
        for b in list(job.placement or ()):
            if b in pod.state.failed and job.offset is None:
                if self._block_failed(pod, pod.state.jobs[job.job_id], b):
                    break
        if job.offset is not None and job in boxes_on_failed_chips(pod.state):
            self._box_failed(pod, pod.state.jobs[job.job_id])
        if len(pod.queue):
            self.schedule(pod)

    # -- completion ------------------------------------------------------------------

    def complete(self, run: JobRun) -> None:
        pod = self.pods[run.pod]
        state = pod.state
        self._release(pod, state.jobs[run.trace.job_id])
        self.sim.end(run, DONE)
        if len(pod.queue):
            self.schedule(pod)
        self._cell_pass()

    def _release(self, pod: OcsPod, job: SliceJob) -> None:
        state = pod.state
        keys = job.held_keys()
        state.assume_released(job.job_id, keys)
        self._unwire(state, job.job_id, keys)
        state.jobs.pop(job.job_id, None)
        pod.version += 1

    # -- failures (swap.py) ------------------------------------------------------------

    def host(self, pod_i: int, block: int, host: int, down: bool) -> None:
        pod = self.pods[pod_i]
        state = pod.state
        pod.version += 1
        if not down:
            hosts = set(state.failed_hosts.get(block, frozenset())) - {host}
            if hosts:
                state.failed_hosts[block] = frozenset(hosts)
            else:
                state.failed_hosts.pop(block, None)
                state.failed.discard(block)
            if len(pod.queue):
                self.schedule(pod)
            self._cell_pass()
            return
        state.failed.add(block)
        state.failed_hosts[block] = frozenset({*state.failed_hosts.get(block, ()), host})
        holder = state.owner.get(block)
        if holder == SUB_BLOCK_OWNER:
            for job in boxes_on_failed_chips(state, block):
                self._box_failed(pod, job)
        elif holder is not None:
            job = state.jobs[holder]
            if job.state == RUNNING:
                self._block_failed(pod, job, block)
        if len(pod.queue):
            self.schedule(pod)

    def _box_failed(self, pod: OcsPod, job: SliceJob) -> None:
        sim = self.sim
        state = pod.state
        run = sim.by_id[job.job_id]
        target = plan_box_move(state, job)
        if target is not None:
            state.assume_released(job.job_id, job.held_keys())
            moved = job.with_(placement=(target.block,), offset=target.offset, epoch=job.epoch + 1)
            state.assume_allocated(moved)
            sim.counters["moves"] += 1
            run.moves += 1
            sim.interrupt(run, "failure")
            sim.start(run, self._chips(moved))
            return
        self._lose(pod, job)

    def _block_failed(self, pod: OcsPod, job: SliceJob, failed: int) -> bool:
        """A swap (plan_replacement), else the slice is lost; True when it was lost."""
        sim = self.sim
        state = pod.state
        run = sim.by_id[job.job_id]
        bound = sim.policy.age_bound_s
        younger = waited_past(job, _ms(sim.now), None if bound is None else _ms(bound))
        plan = plan_replacement(state, job, failed, take_younger=younger)
        if plan is None:
            self._lose(pod, job)
            return True
        apply_victims(state, plan.victims)
        for v in plan.victims:
            self._victim(pod, v)
        assert job.placement is not None
        placement = list(job.placement)
        placement[plan.position_index] = plan.spare
        if state.owner.get(failed) == job.job_id:
            del state.owner[failed]
        state.owner[plan.spare] = job.job_id
        state.wired.pop(failed, None)
        state.wired[plan.spare] = job.job_id
        state.jobs[job.job_id] = job.with_(placement=tuple(placement), epoch=job.epoch + 1)
        sim.counters["swaps"] += 1
        if plan.victims:
            sim.counters["swaps_taking_blocks"] += 1  # the spare taken from other slices
        sim.counters["reconfigurations"] += 1
        run.swaps += 1
        sim.interrupt(run, "failure")
        sim.start(run, self._chips(job))
        return False

    def _lose(self, pod: OcsPod, job: SliceJob) -> None:
        """No healthy place: SUSPENDED (requeued) or FAILED as the job asked (WS-5)."""
        sim = self.sim
        run = sim.by_id[job.job_id]
        self._release(pod, job)
        if job.on_block_failure == FAIL:
            sim.end(run, FAILED)
            return
        sim.counters["suspensions"] += 1
        run.suspensions += 1
        sim.interrupt(run, "failure")
        run.state = QUEUED
        pod.enqueue(job.with_(state=SUSPENDED, placement=None, epoch=job.epoch + 1))

    # -- defragmentation -----------------------------------------------------------------

    def _defrag(self, pod: OcsPod) -> bool:
        """Free whole blocks for the first waiting block slice by moving sub-block slices
        out of the emptiest shared blocks into room in other shared blocks (place_box),
        only when that frees enough for it."""
        state = pod.state
        head = next(
            (pod.waiting[j] for j in pod.queue.ids() if pod.waiting[j].demand.box is None),
            None,
        )
        if head is None:
            return False
        need = head.demand.block_count - sum(state.free_counts().values())
        if need <= 0:
            return False
        held = state.chips_held()
        shared = sorted(
            (b for b, o in state.owner.items() if o == SUB_BLOCK_OWNER and b not in state.failed),
            key=lambda b: (len(held.get(b, {})), b),
        )
        if len(shared) < need + 1:
            return False
        trial = state.copy()
        moves: list[tuple[SliceJob, SliceJob]] = []
        emptied = 0
        for src in shared:
            if emptied >= need:
                break
            members = sorted(
                {trial.jobs[j] for j in trial.chips_held().get(src, {}).values()},
                key=lambda j: (-math.prod(j.demand.box or (1,)), j.seq, j.job_id),
            )
            if any(j.state != RUNNING for j in members):
                continue
            attempt = trial.copy()
            attempt.failed.add(src)  # no box goes back into the block being emptied
            ok: list[tuple[SliceJob, SliceJob]] = []
            for job in members:
                attempt.assume_released(job.job_id, job.held_keys())
                attempt.jobs.pop(job.job_id, None)
                spot = place_box(attempt, job)
                if not isinstance(spot, BoxPlacement) or (
                    attempt.owner.get(spot.block) != SUB_BLOCK_OWNER
                ):
                    ok = []
                    break
                moved = job.with_(placement=(spot.block,), offset=spot.offset, epoch=job.epoch + 1)
                attempt.assume_allocated(moved)
                ok.append((job, moved))
            if not ok:
                continue
            attempt.failed.discard(src)
            trial = attempt
            moves += ok
            emptied += 1
        if emptied < need:
            return False
        sim = self.sim
        for job, moved in moves:
            state.assume_released(job.job_id, job.held_keys())
            state.assume_allocated(moved)
            run = sim.by_id[job.job_id]
            sim.counters["defrag_moves"] += 1
            run.moves += 1
            sim.interrupt(run, "defrag")
            sim.start(run, self._chips(moved))
        pod.version += 1
        return True

    # -- idle chips ------------------------------------------------------------------------

    def note_idle(self) -> None:
        """The pods' healthy chips not working now by cause (IDLE_CAUSES, in their order
        of precedence), and the free ones while jobs wait for them (fragmentation)."""
        sim = self.sim
        quota = sim.quota
        # the fewest blocks a job at the cell needs: of those its quota admits (all,
        # without quotas), and of those it refuses
        admitted = min(self.cell_needs) if self.cell_needs else None
        refused = None
        if quota is not None and self.jobs:
            admitted, refused = self._cell_needs_by_quota(quota)
        causes: Counter[str] = Counter()
        waiting_free = 0
        for pod in self.pods:
            whole, down, shared, wiring = pod.idle_chips()
            causes["wiring"] += wiring
            need = min(pod.needs) if pod.needs else None
            if admitted is not None and (need is None or admitted < need):
                need = admitted
            if need is None and refused is None:
                causes["queue_empty"] += whole + down + shared
                continue
            waiting_free += whole + down + shared
            causes["down_host_blocks"] += down
            causes["shared_blocks"] += shared
            if not whole:
                continue
            blocks = whole // pod.state.fabric.chips_per_block
            if need is not None and need <= blocks:
                cause = "blocks_kept"
            elif refused is not None and refused <= blocks:
                cause = "quota"
            elif quota is not None and self._all_above_nominal(pod, quota):
                cause = "jobs_above_nominal"
            else:
                cause = "blocks_too_few"
            causes[cause] += whole
        sim.idle_waiting = waiting_free
        sim.idle_causes = causes

    def _cell_needs_by_quota(self, quota: SimQuotas) -> tuple[int | None, int | None]:
        """The fewest blocks a job at the cell needs, of the jobs its tenant's quota admits
        now and of those it refuses (None: no such job)."""
        admitted: int | None = None
        refused: int | None = None
        asked: dict[tuple[str, int], bool] = {}  # (tenant, chips) -> admitted
        by_id = self.sim.by_id
        for job in self.jobs.values():
            n = job.demand.block_count
            if (admitted is None or n < admitted) or (refused is None or n < refused):
                key = (by_id[job.job_id].trace.tenant, self._chips(job))
                ok = asked.get(key)
                if ok is None:
                    ok = asked[key] = quota.book.check(key[0], {NODE_TYPE: key[1]}).ok
                if ok and (admitted is None or n < admitted):
                    admitted = n
                elif not ok and (refused is None or n < refused):
                    refused = n
        return admitted, refused

    def _all_above_nominal(self, pod: OcsPod, quota: SimQuotas) -> bool:
        """Every job waiting for `pod` (in its queue or the cell's) is larger than its
        tenant's whole nominal quota."""
        by_id = self.sim.by_id
        for job in (*pod.waiting.values(), *self.jobs.values()):
            nominal = quota.nominal(by_id[job.job_id].trace.tenant)
            if nominal is None or self._chips(job) <= nominal:
                return False
        return True


def _ms(seconds: float) -> int:
    """Virtual seconds as the service's clock reads them (core.PodContext.now_ms)."""
    return int(seconds * 1000)


def _idle_chips(state: IndexedPodState) -> tuple[int, int, int, int]:
    """A pod's healthy chips that no RUNNING slice works on: (in whole free blocks, free
    in blocks with a down host, free in healthy blocks given over to sub-block slices,
    held by block slices being wired). The first three are its free chips."""
    fabric = state.fabric
    per_block = fabric.chips_per_block
    per_host = math.prod(fabric.host_shape)
    held = state.chips_held()
    owner, failed, failed_hosts = state.owner, state.failed, state.failed_hosts
    # one pass over the held and the failed blocks, not over every block: many calls
    whole = per_block * (fabric.block_count - len(owner.keys() | failed))
    down = shared = wiring = 0
    for b, holder in owner.items():
        if holder != SUB_BLOCK_OWNER or (b in failed and b not in failed_hosts):
            continue
        bad = len(failed_hosts.get(b, ()))
        if bad:
            down += per_block - bad * per_host - len(held.get(b, {}))
        else:
            shared += per_block - len(held.get(b, {}))
    for b, hosts in failed_hosts.items():
        if b not in owner:
            down += per_block - len(hosts) * per_host
    for job in state.jobs.values():
        if job.state == WIRING and job.offset is None and job.placement:
            for b in job.placement:
                if owner.get(b) == job.job_id and not state.whole_failed(b):
                    wiring += per_block - len(failed_hosts.get(b, ())) * per_host
    return whole, down, shared, wiring


def _free_chips(state: IndexedPodState) -> int:
    return sum(_idle_chips(state)[:3])


# -- the static torus ------------------------------------------------------------------


class StaticModel(_Model):
    """Pods as statically cabled 16x16x16 tori; one queue for all, greedy backfill in
    queue order (the utilisation-friendliest order a static machine has), no swaps: a
    down host under a slice suspends it (or fails it, as it asked)."""

    def __init__(self, sim: Sim):
        self.sim = sim
        self.tori = [Torus(EDGE) for _ in range(sim.config.pods)]
        self.queue = _Queue()
        self.where: dict[str, int] = {}
        self.shape: dict[str, tuple[int, int, int]] = {}

    def arrive(self, run: JobRun) -> None:
        run.state = QUEUED
        self.queue.add(run.trace.priority, run.seq, run.trace.job_id)
        self.shape[run.trace.job_id] = fitting_shape(run.trace.chips, EDGE)
        self.schedule()

    def schedule(self) -> None:
        sim = self.sim
        failed: set[tuple[int, int, int]] = set()
        for job_id in self.queue.ids():
            shape = self.shape[job_id]
            if shape in failed:
                continue
            run = sim.by_id[job_id]
            spot = None
            for i in sorted(range(len(self.tori)), key=lambda i: -self.tori[i].free_chips):
                got = self.tori[i].place(shape)
                if got is not None:
                    spot = (i, got)
                    break
            if spot is None:
                failed.add(shape)
                if sim.policy.backfill == "none":
                    break
                continue
            i, (offset, box) = spot
            self.tori[i].take(job_id, offset, box)
            self.queue.remove(run.trace.priority, run.seq, job_id)
            self.where[job_id] = i
            run.pod = i
            sim.counters["placements"] += 1
            sim.start(run, run.chips)

    def note_idle(self) -> None:
        sim = self.sim
        free = sum(t.free_chips for t in self.tori)
        sim.idle_waiting = free if len(self.queue) else 0
        sim.idle_causes = {"static_fragments" if len(self.queue) else "queue_empty": free}

    def complete(self, run: JobRun) -> None:
        self.tori[self.where.pop(run.trace.job_id)].release(run.trace.job_id)
        self.sim.end(run, DONE)
        self.schedule()

    def wired(self, run: JobRun) -> None:  # pragma: no cover - no wiring in a static torus
        pass

    def host(self, pod: int, block: int, host: int, down: bool) -> None:
        torus = self.tori[pod]
        bx, by, bz = block % 4, (block // 4) % 4, block // 16
        hg = tuple(b // h for b, h in zip(BLOCK, HOST, strict=True))
        hx, hy, hz = host % hg[0], (host // hg[0]) % hg[1], host // (hg[0] * hg[1])
        offset = (bx * 4 + hx * HOST[0], by * 4 + hy * HOST[1], bz * 4 + hz * HOST[2])
        if down:
            sim = self.sim
            for job_id in sorted(torus.holders_of(offset, HOST)):
                run = sim.by_id[job_id]
                torus.release(job_id)
                del self.where[job_id]
                if run.trace.norm.on_block_failure == FAIL:
                    sim.end(run, FAILED)
                    continue
                sim.counters["suspensions"] += 1
                run.suspensions += 1
                sim.interrupt(run, "failure")
                run.state = QUEUED
                self.queue.add(run.trace.priority, run.seq, job_id)
        torus.set_down(offset, HOST, down)
        self.schedule()


def simulate(jobs: list[TraceJob], config: SimConfig) -> Result:
    return Sim(jobs, config).run()


__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "Failures",
    "JobRun",
    "Policy",
    "Result",
    "Sim",
    "SimConfig",
    "simulate",
]
