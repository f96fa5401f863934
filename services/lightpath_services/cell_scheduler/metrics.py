"""The cell's domain metrics (issue 18): jobs by state and pod, the cell queue, pods by
status, heartbeat age, forwards, requeues and submit-to-running latency; tenants'
quotas and the pod held for an owner's job (issue 35).

Names and attributes are those of lightpath_services.common.metric_names. The gauges read a
snapshot that `run` (a background loop of the service) refreshes every `refresh_s`:
the registry and the queue in one pipelined read, and the state of each pod's live
jobs (never the jobs that ended), so a scrape never touches Redis and never waits
for the event loop. Counters and the histogram are recorded where the event happens.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from opentelemetry.metrics import CallbackOptions, Meter, NoOpMeterProvider, Observation

from lightpath import __version__
from lightpath.v1 import cell_scheduler_pb2, common_pb2
from lightpath_services.cell_scheduler.quotas import QuotaState, waits_for_quota
from lightpath_services.common import instruments

if TYPE_CHECKING:
    from lightpath_services.cell_scheduler.pods import PodDirectory
    from lightpath_services.cell_scheduler.store import RegistrySnapshot

METER_NAME = "lightpath.cell_scheduler"
REFRESH_S = 5.0
_SEEN_LIMIT = 10_000  # jobs remembered as started (a retried report is not counted twice)
_RUNNING = common_pb2.JOB_STATE_RUNNING
_STATUS: dict[int, str] = {
    cell_scheduler_pb2.POD_STATUS_READY: "ready",
    cell_scheduler_pb2.POD_STATUS_SUSPECT: "suspect",
    cell_scheduler_pb2.POD_STATUS_SILENT: "silent",
}


class CellMetrics:
    """The cell's instruments and the cached state its gauges show."""

    def __init__(self, meter: Meter | None = None, *, refresh_s: float = REFRESH_S):
        meter = meter or instruments.get_meter(METER_NAME, __version__)
        self.refresh_s = refresh_s
        self._jobs: dict[tuple[str, str], int] = {}  # (state, pod) -> jobs
        self._queue: int | None = None
        self._pods: dict[str, int] = {}  # status -> pods
        self._seen_ms: dict[str, int] = {}  # pod -> last heartbeat (ms since the epoch)
        self._started: dict[str, None] = {}  # job ids already observed RUNNING
        meter.create_observable_gauge(
            "lightpath.cell.jobs", [self._observe_jobs], description="jobs by state and pod"
        )
        meter.create_observable_gauge(
            "lightpath.cell.queue.depth",
            [self._observe_queue],
            description="jobs waiting in the cell queue",
        )
        meter.create_observable_gauge(
            "lightpath.cell.pods", [self._observe_pods], description="pods by status"
        )
        meter.create_observable_gauge(
            "lightpath.cell.heartbeat.age",
            [self._observe_heartbeats],
            unit="s",
            description="seconds since a pod's last heartbeat",
        )
        self._submit_to_running = meter.create_histogram(
            "lightpath.cell.submit_to_running.duration",
            unit="s",
            description="time from submit to running",
        )
        self._forwards = meter.create_counter(
            "lightpath.cell.forwards", description="jobs forwarded to pods"
        )
        self._requeues = meter.create_counter(
            "lightpath.cell.requeues", description="jobs requeued"
        )
        # Tenants' quotas (issue 35): (tenant, pod, node type, kind) -> chips (pod "": the
        # cell-wide quota, else one on that pod); (tenant, cause) -> jobs.
        self._tenant_chips: dict[tuple[str, str, str, str], int] = {}
        self._tenant_waiting: dict[tuple[str, str], int] = {}
        meter.create_observable_gauge(
            "lightpath.cell.tenant.chips",
            [self._observe_tenant_chips],
            description="a tenant's chips per node type: its quota, what it holds, what of "
            "that it borrows (on the cell, or on one pod for a quota of that pod)",
        )
        meter.create_observable_gauge(
            "lightpath.cell.tenant.waiting",
            [self._observe_tenant_waiting],
            description="a tenant's jobs in the cell queue, waiting for its quota or for room",
        )
        # The pod held for an owner's job (quota.Hold): (pod, its tenant, since ms).
        self._hold: tuple[str, str, int] | None = None
        meter.create_observable_gauge(
            "lightpath.cell.pod.held",
            [self._observe_hold],
            unit="s",
            description="seconds since the cell held the pod for a tenant's job within its "
            "nominal quota that no pod could make room for",
        )

    @classmethod
    def noop(cls) -> CellMetrics:
        return cls(NoOpMeterProvider().get_meter(METER_NAME))

    # -- events --------------------------------------------------------------------

    def forwarded(self, result: str) -> None:
        """A forward to a pod ended: placed, refused or unreachable."""
        self._forwards.add(1, {"result": result})

    def requeued(self, reason: str) -> None:
        """A job went back to the cell queue: refused, unreachable or lost (its forward), or
        reclaimed (its pod let it go, issue 35)."""
        self._requeues.add(1, {"reason": reason})

    def reported(
        self,
        directory: PodDirectory,
        transitions: Iterable[cell_scheduler_pb2.PodJobTransition],
        spawn: Callable[..., Any],
    ) -> None:
        """A pod reported job transitions: time each job's first RUNNING since its submit
        (the submit time is the cell's record, read in the background)."""
        started = {
            t.event.job_id: t.event.at.ToMilliseconds()
            for t in transitions
            if t.event.to_state == _RUNNING
            and t.event.from_state != _RUNNING
            and t.event.job_id not in self._started
        }
        if started:
            spawn(self._time_started(directory, started), "metrics: submit to running")

    async def _time_started(self, directory: PodDirectory, started: dict[str, int]) -> None:
        if len(self._started) > _SEEN_LIMIT:
            self._started.clear()
        ids = list(started)
        async with directory.store.redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hget(directory.store.job_key(job_id), "created_ms")
            created = await pipe.execute()
        for job_id, raw in zip(ids, created, strict=True):
            if raw is None or job_id in self._started:
                continue
            self._started[job_id] = None
            self._submit_to_running.record(max(0.0, (started[job_id] - int(raw)) / 1000))

    # -- the gauges' snapshot ------------------------------------------------------

    async def run(self, directory: PodDirectory) -> None:
        """Refresh the snapshot every refresh_s (a supervised background task)."""
        while True:
            await self.refresh(directory)
            await asyncio.sleep(self.refresh_s)

    async def refresh(self, directory: PodDirectory) -> None:
        snap = await directory.store.snapshot()
        now = directory.now_ms()
        pods = sorted(snap.registrations)
        statuses = Counter(
            _STATUS.get(directory.status_of(snap, p, now)[0], "unknown") for p in pods
        )
        jobs: Counter[tuple[str, str]] = Counter()
        for pod, _, f in await directory.store.live_fields(pods, ("state",)):
            if "state" in f:
                jobs[(f["state"], pod)] += 1
        jobs[("PENDING", "")] = len(snap.queue)  # waiting in the cell queue, on no pod
        # A state or pod seen once stays, at 0, so its series does not vanish.
        self._jobs = {**dict.fromkeys(self._jobs, 0), **jobs}
        self._pods = {**dict.fromkeys(self._pods, 0), **dict.fromkeys(_STATUS.values(), 0)}
        self._pods.update(statuses)
        self._queue = len(snap.queue)
        self._seen_ms = {p: snap.seen.get(p, 0) for p in pods}
        await self._refresh_tenants(directory, snap)

    async def _refresh_tenants(self, directory: PodDirectory, snap: RegistrySnapshot) -> None:
        state = QuotaState.of(snap.quotas)
        hold = state.hold
        self._hold = (hold.pod, hold.tenant, hold.since_ms) if hold else None
        book = state.book()
        chips: dict[tuple[str, str, str, str], int] = {}
        for tenant in state.tenants():
            q = state.quotas.get(tenant)
            used = state.used.get(tenant, {})
            for t in sorted(set(used) | set(q.nominal if q else ())):
                if q is not None:
                    chips[(tenant, "", t, "quota")] = q.nominal.get(t, 0)
                    chips[(tenant, "", t, "borrowed")] = book.borrowed(tenant, t)
                chips[(tenant, "", t, "used")] = used.get(t, 0)
        for (tenant, pod), q in state.pod_quotas.items():  # no borrowing on a pod's quota
            used = state.pod_used.get((tenant, pod), {})
            for t in sorted(set(used) | set(q.nominal)):
                chips[(tenant, pod, t, "quota")] = q.nominal.get(t, 0)
                chips[(tenant, pod, t, "used")] = used.get(t, 0)
        waiting: Counter[tuple[str, str]] = Counter()
        for record in await directory.store.jobs(snap.queue):
            waiting[(record.tenant, "quota" if waits_for_quota(record.reason) else "room")] += 1
        self._tenant_chips = {**dict.fromkeys(self._tenant_chips, 0), **chips}
        self._tenant_waiting = {**dict.fromkeys(self._tenant_waiting, 0), **waiting}

    # -- callbacks (the reader's thread: cached values only) ----------------------

    def _observe_jobs(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"state": s, "pod": p}) for (s, p), n in self._jobs.items()]

    def _observe_tenant_chips(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(n, {"tenant": t, "pod": p, "node_type": nt, "kind": k})
            for (t, p, nt, k), n in self._tenant_chips.items()
        ]

    def _observe_tenant_waiting(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(n, {"tenant": t, "cause": c}) for (t, c), n in self._tenant_waiting.items()
        ]

    def _observe_hold(
        self, options: CallbackOptions, clock: Callable[[], float] = time.time
    ) -> Iterable[Observation]:
        if self._hold is None:
            return []
        pod, tenant, since_ms = self._hold
        return [Observation(max(0.0, clock() - since_ms / 1000), {"pod": pod, "tenant": tenant})]

    def _observe_queue(self, options: CallbackOptions) -> Iterable[Observation]:
        return [] if self._queue is None else [Observation(self._queue)]

    def _observe_pods(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"status": s}) for s, n in self._pods.items()]

    def _observe_heartbeats(
        self, options: CallbackOptions, clock: Callable[[], float] = time.time
    ) -> Iterable[Observation]:
        now_ms = clock() * 1000
        return [
            Observation(max(0.0, (now_ms - seen) / 1000), {"pod": p})
            for p, seen in self._seen_ms.items()
            if seen
        ]


__all__ = ["CellMetrics"]
