"""What the parts of the workload scheduler share: settings of its loops, the results it
answers, and `PodContext`, the collaborators every part is given (see scheduler.py for
the shape of every change)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from lightpath.domain.blocks import PodFabric
from lightpath.domain.jobs import NormalizedSpec
from lightpath.domain.slices import (
    SliceJob,
)
from lightpath.v1 import workload_scheduler_pb2
from lightpath_services.workload_scheduler.fabric_kinds import FabricPlanner, planner_for
from lightpath_services.workload_scheduler.metrics import PodMetrics
from lightpath_services.workload_scheduler.ocs import OcsError, OcsManagerClient
from lightpath_services.workload_scheduler.placement import PodState
from lightpath_services.workload_scheduler.planner import DEFAULT_AGE_BOUND_S
from lightpath_services.workload_scheduler.preemption import VictimAction
from lightpath_services.workload_scheduler.store import JobRecord, PodStore

MAX_COMMIT_ATTEMPTS = 20
# A wiring refused because a block is still wired elsewhere may be a race with a
# release in flight; after this many refusals the job fails.
MAX_WIRING_ATTEMPTS = 3
RETRY_BACKOFF_MS = 500
RELEASE_CLAIM_MS = 30_000
# Leftover wiring of a job that ended less than this ago is left to the call ending it.
STALE_WIRING_GRACE_MS = 3_000
# Records of jobs this replica set RUNNING, kept as a first guess for ending them.
KNOWN_LIMIT = 4096
# A wiring that lasts records a progress event on the job this often (and so pushes its
# wiring deadline on: a slow switch is not a dead replica).
WIRING_PROGRESS_S = 2.0
# The reason of the event a replica writes when it takes over a wiring past its lease
# (reconcile); the replica it was taken from counts its commits refused after it.
WIRING_TAKEN_OVER = "wiring taken over after a timeout"
# CompleteJob / CancelJob / ReportBlockHealth wait this long at most for another call
# changing the slice to end before releasing it; past that the other call (or the
# reconcile loop, which never waits: its next round asks again) releases it.
FINISH_RELEASE_WAIT_S = 5.0
# A reconcile round that finds nothing changed reads one page of this many wiring marks
# and of the ocs_manager's slices (a sweep); a full round reads everything at least this
# often anyway.
SWEEP_PAGE = 50
QUIET_HORIZON_MS = 600_000
# An admission that asked not to wait is refused at once (POD_BUSY, nothing kept) when
# the passes ahead of it would take longer than this (issue 30).
BUSY_WAIT_S = 0.25


class PassTimes:
    """How long a new admission would wait for this replica's pass lock: the passes
    ahead of it (`waiting` admissions, one running) times a pass's recent duration
    (an exponentially weighted mean, the clock injected)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, weight: float = 0.2):
        self._clock = clock
        self._weight = weight
        self.waiting = 0  # admissions waiting for the lock
        self.mean_s = 0.0

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        start = self._clock()
        try:
            yield
        finally:
            took = self._clock() - start
            self.mean_s += self._weight * (took - self.mean_s)

    def wait_s(self, running: bool) -> float:
        return (self.waiting + running) * self.mean_s


class WiringRolledBack(OcsError):
    """A WireSlice past its deadline that the ocs_manager rolled back: nothing is wired."""


@dataclass(frozen=True)
class AdmitResult:
    record: JobRecord
    created: bool
    outcome: str = ""
    preempted: tuple[dict[str, Any], ...] = ()


@dataclass
class _Admission:
    """A job being admitted, as its admission's pass stores it."""

    spec_b64: str
    norm: NormalizedSpec
    spec: workload_scheduler_pb2.JobSpec
    # True once this call stored the job, False if it existed already, None until known.
    created: bool | None = None
    # The only slices it may preempt (the cell reclaiming lent quota, issue 35), or None.
    reclaim: frozenset[str] | None = None
    # The cell's forward token (AdmitJobRequest.forward_token; 0: not fenced).
    forward_token: int = 0


@dataclass
class Outcome:
    """What one admission, failure report or pass did, for responses and logs."""

    preempted: list[dict[str, Any]] = field(default_factory=list)
    replacement: dict[str, Any] | None = None
    affected: list[str] = field(default_factory=list)
    action: str = ""
    # Sub-block slices moved off failed chips: (before, after) (issue 28).
    moved: list[tuple[SliceJob, SliceJob]] = field(default_factory=list)


class _SwapRun:
    """This replica swapping the failed blocks of one slice one after another; a report
    of one of them waits here for its block's outcome (issue 15)."""

    def __init__(self) -> None:
        self.done: dict[int, Outcome] = {}
        # The outcome that ended the slice (suspended, failed): the answer for the rest.
        self.lost: Outcome | None = None
        self.ended = False
        self._changed = asyncio.Event()

    def record(self, job_id: str, block: int, outcome: Outcome) -> None:
        self.done[block] = outcome
        if job_id in outcome.affected and outcome.replacement is None:
            self.lost = outcome
        self._changed.set()
        self._changed = asyncio.Event()

    def end(self) -> None:
        self.ended = True
        self._changed.set()

    async def outcome_of(self, block: int) -> Outcome | None:
        """The outcome of `block`'s swap, the slice's loss, or None when the run ended
        without it (the caller then decides itself)."""
        while True:
            if block in self.done:
                return self.done[block]
            if self.lost is not None:
                return self.lost
            if self.ended:
                return None
            await self._changed.wait()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class PodContext:
    """What every part of one pod's scheduler is given: its store, its ocs_manager client
    (of the fabric's kind), its fabric and planner, the clock, how background tasks
    start, its log and metrics, and the settings the parts share."""

    def __init__(
        self,
        *,
        store: PodStore,
        ocs: OcsManagerClient,
        fabric: PodFabric,
        planner: FabricPlanner | None = None,
        wiring_timeout_s: float = 30.0,
        age_bound_s: float | None = DEFAULT_AGE_BOUND_S,
        clock: Callable[[], float] = time.time,
        spawn: Callable[..., asyncio.Task] | None = None,
        log: logging.Logger | None = None,
        metrics: PodMetrics | None = None,
    ):
        self.store = store
        self.ocs = ocs
        self.metrics = metrics or PodMetrics.noop()
        self.fabric = fabric
        # What differs by the fabric's kind (fabric_kinds.py), chosen once for the pod.
        self.planner = planner or planner_for(fabric)
        self.pod_id = store.keys.pod_id
        self.wiring_timeout_s = wiring_timeout_s
        self.wiring_timeout_ms = int(wiring_timeout_s * 1000)
        # The queue's age bound (planner.plan_pass), ms; None: no bound.
        self.age_bound_ms = None if age_bound_s is None else int(age_bound_s * 1000)
        self.clock = clock
        self.spawn = spawn or (lambda coro, name: asyncio.ensure_future(coro))
        self.log = log or logging.getLogger("lightpath.workload_scheduler")

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def snapshot(self) -> PodState:
        return await self.store.snapshot(self.fabric)


async def job_event_after(store: PodStore, job_id: str, after: str, timeout_s: float) -> None:
    """Return once the pod's event stream has a transition of `job_id` after the entry
    `after` (store.tip() read before the job), or after `timeout_s`: a change another
    replica makes is awaited, not polled for."""
    redis: Any = store.redis
    limit = time.monotonic() + timeout_s
    while (left := limit - time.monotonic()) > 0:
        got = await redis.xread({store.keys.events: after}, block=max(1, int(left * 1000)))
        for _stream, entries in got or []:
            for entry_id, fields in entries:
                after = entry_id
                if fields.get("kind") == "job" and fields.get("job") == job_id:
                    return


class Part:
    """A part of the scheduler (wiring, admission, swap, reconcile): the pod's
    collaborators as its own attributes; the other parts it calls are given to it."""

    def __init__(self, pod: PodContext):
        self.store, self.ocs, self.fabric = pod.store, pod.ocs, pod.fabric
        self.planner, self.log, self.metrics = pod.planner, pod.log, pod.metrics
        self.pod_id, self.wiring_timeout_ms = pod.pod_id, pod.wiring_timeout_ms
        self.age_bound_ms, self._spawn = pod.age_bound_ms, pod.spawn
        self.now_ms, self.snapshot = pod.now_ms, pod.snapshot


def _pos(position: tuple[int, ...]) -> str:
    return "(" + ",".join(map(str, position)) + ")"


def _victim_json(v: VictimAction, job: SliceJob) -> dict[str, Any]:
    return {
        "job": v.job_id,
        "action": v.action,
        # Blocks taken; a sub-block victim gives up chips of one block: that block.
        "blocks": sorted({b if isinstance(b, int) else int(b[1:].split(".")[0]) for b in v.freed}),
        "grid": list(v.shrink_grid) if v.shrink_grid else [],
        "priority": job.priority,
    }
