"""The cell scheduler: registry → pure choice → atomic claim → forward to the pod → commit.

A submission (CS-2 … CS-5):

1. check the request, then read the registry and the cell queue (one round trip);
2. resolve it for every registered pod (the pod's own rules; a shape derived
   from a compute demand, CS-4) and choose with the pure planner (`choice`):
   pods that fit now, best first, then pods that fit by preemption; the jobs
   already waiting at the same or higher priority go first;
3. claim the job id atomically — bound to the first candidate with its blocks
   held, or in the cell queue — so a retry, at this replica or another, finds
   the job and never forwards it a second time (X-5);
4. forward it (AdmitJob, `when_no_capacity` FAIL: a pod only places or refuses);
   a refusal sends it to the next candidate, and with none left it waits in
   the cell queue until a pod reports capacity;
5. record job → pod and the pod's answer.

The cell keeps a mirror of each job's state, fed by the pods' heartbeats (their
job transitions, numbered per job so each applies once and in order) and by
the pods' answers to calls made through the cell. A pod silent for longer than
the pod timeout is not chosen and its jobs show UNKNOWN (CS-6); when it
answers again its jobs show their state again and are checked one by one.

`run` is the background loop of every replica: the repairs of `recovery`
(silent pods, forwards a dead replica left, pods that may hold a job whose
forward got no answer) and a pass over the cell queue. Streams: `watch`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import grpc

from lightpath.errors import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from lightpath.v1 import cell_scheduler_pb2, common_pb2, workload_scheduler_pb2
from services.cell_scheduler.choice import (
    FITS,
    Candidate,
    Choice,
    JobDemand,
    PodCapacityView,
    plan_queue,
)
from services.cell_scheduler.metrics import CellMetrics
from services.cell_scheduler.podclient import (
    PodCallError,
    PodClients,
    PodRefused,
    PodUnreachable,
    classify,
    state_name,
)
from services.cell_scheduler.recovery import Recovery
from services.cell_scheduler.request import (
    PodModel,
    Resolved,
    check_request,
    has_demand,
    no_pod_can_host,
    resolve_all,
    tenant_of,
)
from services.cell_scheduler.store import (
    ENDED,
    FORWARDING,
    PLACED,
    QUEUED,
    CellJobRecord,
    CellStore,
    RegistrySnapshot,
    b64,
    unb64,
)
from services.cell_scheduler.watch import CellEventHub

MAX_PLAN_ATTEMPTS = 4
REGISTRY_TTL_S = 0.2
POLL_S = 0.02
# Forwards get this long beyond their own deadline before another replica takes them over.
FORWARD_GRACE_MS = 5_000
CACHE_LIMIT = 20_000
FAIL = workload_scheduler_pb2.WHEN_NO_CAPACITY_FAIL


def _shape(dims) -> str:
    return "x".join(map(str, dims))


@dataclass
class SubmitResult:
    record: CellJobRecord
    created: bool
    pod_job: workload_scheduler_pb2.Job | None = None
    preempted: list[workload_scheduler_pb2.Preemption] = field(default_factory=list)
    outcome: str = ""
    queue_position: int = 0


@dataclass
class JobView:
    record: CellJobRecord
    pod_job: workload_scheduler_pb2.Job | None = None
    queue_position: int = 0


class CellScheduler:
    """The cell: several replicas may run on one Redis; all coordination goes through
    the store's atomic scripts."""

    def __init__(
        self,
        *,
        store: CellStore,
        pods: PodClients,
        node_flops: Mapping[str, float],
        instance_id: str,
        pod_timeout_s: float = 5.0,
        forward_timeout_s: float = 40.0,
        clock: Callable[[], float] = time.time,
        spawn: Callable[..., asyncio.Task] | None = None,
        log: logging.Logger | None = None,
        metrics: CellMetrics | None = None,
    ):
        self.store = store
        self.metrics = metrics or CellMetrics.noop()
        self.pods = pods
        self.node_flops = dict(node_flops)
        self.instance_id = instance_id
        self.pod_timeout_ms = int(pod_timeout_s * 1000)
        self.forward_timeout_s = forward_timeout_s
        self._clock = clock
        self._spawn = spawn or (lambda coro, name: asyncio.ensure_future(coro))
        self.log = log or logging.getLogger("lightpath.cell_scheduler")
        self._models: dict[str, PodModel] = {}  # by registration (base64)
        self._capacities: dict[str, cell_scheduler_pb2.PodCapacity] = {}  # by report (base64)
        self._requests: dict[tuple[str, str], cell_scheduler_pb2.SubmitJobRequest] = {}
        self._resolved: dict[tuple[bytes, str, str], Resolved | InvalidArgument] = {}
        self._endpoints: dict[str, str] = {}
        self._kick = asyncio.Event()
        self.recovery = Recovery(self)
        self.events = CellEventHub(store, self.log)
        self._tasks: set[asyncio.Future] = set()  # forwards that outlive their caller
        self._snap: RegistrySnapshot | None = None
        self._snap_at = 0.0
        self._placed: dict[str, str] = {}  # job -> pod, for jobs this replica saw placed

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    def new_token(self) -> str:
        return f"{self.instance_id}:{uuid.uuid4().hex[:12]}"

    def kick(self) -> None:
        """Ask this replica's dispatcher for a pass over the cell queue soon."""
        self._kick.set()

    async def _registry(self, *, fresh: bool = False) -> RegistrySnapshot:
        """The registry and the cell queue, read at most every REGISTRY_TTL_S for
        submissions (what this replica places and ends meanwhile is assumed in it; the
        claim script checks what a decision needs: free blocks, an empty queue)."""
        if fresh or self._snap is None or time.monotonic() - self._snap_at > REGISTRY_TTL_S:
            read_at = time.monotonic()  # the data is at least this new
            self._snap = await self.store.snapshot()
            self._snap_at = read_at
        return self._snap

    def _assume(self, pod: str, needs: Mapping[str, int], sign: int) -> None:
        """Blocks this replica just took (-1) or freed (+1) on a pod, in its cached registry."""
        if self._snap is not None:
            for t, n in needs.items():
                key = f"{pod}|{t}"
                if key in self._snap.free:
                    self._snap.free[key] += sign * n

    def _remember(self, record: CellJobRecord) -> None:
        """Where a placed job is (a job never leaves the pod it was placed on)."""
        if len(self._placed) > CACHE_LIMIT:
            self._placed.clear()
        self._placed[record.job_id] = record.pod

    # == the registry (CS-1) ======================================================

    def model(self, registration_b64: str) -> PodModel:
        m = self._models.get(registration_b64)
        if m is None:
            reg = cell_scheduler_pb2.PodRegistration.FromString(unb64(registration_b64))
            m = PodModel.of(reg)
            if len(self._models) > CACHE_LIMIT:
                self._models.clear()
            self._models[registration_b64] = m
        return m

    def capacity(self, capacity_b64: str) -> cell_scheduler_pb2.PodCapacity:
        c = self._capacities.get(capacity_b64)
        if c is None:
            c = cell_scheduler_pb2.PodCapacity.FromString(unb64(capacity_b64))
            if len(self._capacities) > CACHE_LIMIT:
                self._capacities.clear()
            self._capacities[capacity_b64] = c
        return c

    def models_of(self, snap: RegistrySnapshot) -> dict[str, PodModel]:
        self._endpoints.update(snap.endpoint)
        return {p: self.model(r) for p, r in sorted(snap.registrations.items())}

    def status_of(self, snap: RegistrySnapshot, pod_id: str, now: int) -> tuple[int, str]:
        """(PodStatus, why) of a registered pod."""
        seen = snap.seen.get(pod_id, 0)
        if pod_id in snap.down or now - seen > self.pod_timeout_ms:
            return (
                cell_scheduler_pb2.POD_STATUS_SILENT,
                f"no heartbeat for {(now - seen) / 1000:.1f} s",
            )
        if snap.suspect.get(pod_id, 0) > now:
            return (
                cell_scheduler_pb2.POD_STATUS_SUSPECT,
                "a call to it just failed; waiting for its next heartbeat",
            )
        return cell_scheduler_pb2.POD_STATUS_READY, ""

    def views_of(self, snap: RegistrySnapshot, now: int) -> dict[str, PodCapacityView]:
        """What planning knows about each pod: free blocks (minus forwards in flight),
        what lower priorities would give up, and whether it may be chosen."""
        out: dict[str, PodCapacityView] = {}
        for pod_id in sorted(snap.registrations):
            status, why = self.status_of(snap, pod_id, now)
            view = PodCapacityView(
                pod_id,
                usable=status == cell_scheduler_pb2.POD_STATUS_READY,
                why_not=why,
                version=snap.versions.get(pod_id, ""),
            )
            raw = snap.capacities.get(pod_id)
            if raw is None:
                view.usable, view.why_not = False, "has not reported its capacity yet"
            else:
                for t in self.capacity(raw).types:
                    key = f"{pod_id}|{t.node_type}"
                    view.free[t.node_type] = max(
                        0, snap.free.get(key, t.free) - snap.held.get(key, 0)
                    )
                    view.preemptible[t.node_type] = dict(t.preemptible_by_priority)
            out[pod_id] = view
        return out

    async def register(self, reg: cell_scheduler_pb2.PodRegistration) -> cell_scheduler_pb2.Pod:
        _check_registration(reg)
        data = b64(reg.SerializeToString(deterministic=True))
        returned = await self.store.register(
            reg.pod_id, data, reg.endpoint, self.now_ms(), reg.events_tip
        )
        self.log.info(
            "pod %s registered from %s: %s",
            reg.pod_id,
            reg.endpoint,
            ", ".join(f"{t.blocks} {t.node_type}" for t in reg.node_types),
            extra={"pod_id": reg.pod_id},
        )
        if returned:
            await self._pod_returned(reg.pod_id, reg.endpoint)
        self.kick()
        return await self.pod_info(reg.pod_id, include_view=False)

    async def report(
        self, req: cell_scheduler_pb2.ReportPodStatusRequest
    ) -> cell_scheduler_pb2.ReportPodStatusResponse:
        """A heartbeat: capacity, liveness and job transitions of one pod (CS-1, CS-6)."""
        free = {t.node_type: t.free for t in req.capacity.types}
        transitions = [
            [
                t.stream_id,
                t.event.job_id,
                t.seq,
                state_name(t.event.from_state) if t.event.from_state else "",
                state_name(t.event.to_state),
                t.event.at.ToMilliseconds(),
                t.event.reason,
            ]
            for t in req.transitions
        ]
        known, ack, returned, wake = await self.store.report(
            req.pod_id,
            endpoint=req.endpoint,
            now_ms=self.now_ms(),
            capacity_b64=b64(req.capacity.SerializeToString(deterministic=True)),
            version=req.capacity.version,
            free=free,
            after=req.events_after,
            until=req.events_until,
            transitions=transitions,
        )
        if not known:
            raise NotFound("pod", req.pod_id, hint="register it first (RegisterPod)")
        self.metrics.reported(self, req.transitions)
        if req.endpoint:
            self._endpoints[req.pod_id] = req.endpoint
        if returned:
            self.log.info("pod %s answers again", req.pod_id, extra={"pod_id": req.pod_id})
            await self._pod_returned(req.pod_id, req.endpoint)
        elif req.resync:
            self._spawn(self.recovery.reconcile_pod(req.pod_id), f"resync {req.pod_id}")
        if wake or returned:
            self.kick()
        return cell_scheduler_pb2.ReportPodStatusResponse(
            events_ack=ack, status=cell_scheduler_pb2.POD_STATUS_READY
        )

    async def _pod_returned(self, pod_id: str, endpoint: str) -> None:
        if endpoint:
            await self.pods.reset(endpoint)
        self._spawn(self.recovery.reconcile_pod(pod_id), f"reconcile {pod_id}")

    async def endpoint(self, pod_id: str, *, fresh: bool = False) -> str:
        addr = None if fresh else self._endpoints.get(pod_id)
        if addr is None:
            addr = await self.store.endpoint(pod_id)
            if addr is None:
                raise NotFound("pod", pod_id, hint="no workload scheduler registered it")
            self._endpoints[pod_id] = addr
        return addr

    async def call(self, pod_id: str, method: str, request: Any, *, timeout: float = 10.0) -> Any:
        """One unary call to a pod's workload scheduler; PodRefused / PodUnreachable on error.
        An unreachable replica is retried once at the endpoint the registry now has, if it
        changed (every call the cell makes is idempotent at the pod: AdmitJob by job id)."""
        for attempt in range(2):
            endpoint = await self.endpoint(pod_id, fresh=attempt > 0)
            try:
                return await getattr(self.pods.stub(endpoint), method)(request, timeout=timeout)
            except grpc.aio.AioRpcError as err:
                failure = classify(pod_id, err)
                if isinstance(failure, PodRefused) or attempt:
                    raise failure from None
                if await self.store.endpoint(pod_id) == endpoint:
                    raise failure from None
        raise AssertionError("unreachable")

    # == submit (CS-2, CS-3, CS-4) ================================================

    async def submit(self, req: cell_scheduler_pb2.SubmitJobRequest) -> SubmitResult:
        violations = check_request(req, self.node_flops)
        if violations:
            raise InvalidArgument.of(violations)
        job_id = req.spec.job_id
        canonical = cell_scheduler_pb2.SubmitJobRequest()
        canonical.CopyFrom(req)
        canonical.validate_only = False
        request_b64 = b64(canonical.SerializeToString(deterministic=True))
        started = time.monotonic()
        for attempt in range(MAX_PLAN_ATTEMPTS):
            snap = await self._registry(fresh=attempt > 0)
            if snap.queue and attempt == 0:
                snap = await self._registry(fresh=True)  # decide with the queue as it is
            read_at = self._snap_at  # when the read of `snap` began
            now = self.now_ms()
            resolved, choice, views, priority = await self._plan_new(canonical, snap, now)
            if (
                not req.validate_only
                and (not choice.candidates or choice.candidates[0].how != FITS)
                and read_at < started
            ):
                # The claim checks free blocks only: a decision to queue in the cell or to
                # count on preemption is made again with the registry as it is now (a
                # cached one may predate the report of what lower priorities give up).
                continue
            if req.validate_only:
                existing = await self.store.job(job_id)
                if existing is not None:
                    return await self._existing(existing, request_b64, validate_only=True)
                return await self._dry_run(canonical, resolved, choice, snap)
            tenant = tenant_of(req)
            if not choice.candidates:
                if req.spec.when_no_capacity == FAIL:
                    existing = await self.store.job(job_id)
                    if existing is not None:
                        return await self._existing(existing, request_b64)
                    raise ResourceExhausted(
                        f"job {job_id} cannot be placed now and asked not to wait: "
                        f"{choice.why_waiting}",
                        reason="NO_CAPACITY",
                    )
                ok, _ = await self.store.claim_new(
                    job_id,
                    fields={"req": request_b64, "priority": priority},
                    tenant=tenant,
                    pod="",
                    needs={},
                    token="",
                    until_ms=0,
                    now_ms=now,
                    check_free=False,
                    reason=f"queued in the cell: {choice.why_waiting}",
                )
                if ok == 0:
                    return await self._existing(await self.job_record(job_id), request_b64)
                record = await self.job_record(job_id)
                position = await self.store.queue_position(job_id)
                self.log.info(
                    "job %s queued in the cell at position %d: %s",
                    job_id,
                    position,
                    choice.why_waiting,
                    extra={"job_id": job_id},
                )
                return SubmitResult(
                    record,
                    True,
                    outcome=f"queued in the cell at position {position}: {choice.why_waiting}",
                    queue_position=position,
                )
            first = choice.candidates[0]
            r = resolved[first.pod_id]
            token = self.new_token()
            ok, _ = await self.store.claim_new(
                job_id,
                fields=self._fields(request_b64, r, first, priority),
                tenant=tenant,
                pod=first.pod_id,
                needs=r.needs,
                token=token,
                until_ms=now + self.forward_window_ms(),
                now_ms=now,
                # The last attempt goes ahead even if others took the blocks meanwhile:
                # the pod's own admission decides.
                check_free=first.how == FITS and attempt < MAX_PLAN_ATTEMPTS - 1,
                reason=f"forwarding to pod {first.pod_id}: {first.reason}",
                expect_empty_queue=not snap.queue,
            )
            if ok == 0:
                return await self._existing(await self.job_record(job_id), request_b64)
            if ok != 1:
                continue  # the blocks went to others, or jobs wait in the cell queue
            self._assume(first.pod_id, r.needs, -1)
            # Claimed: the forward runs to its end even if this caller goes away (a client
            # deadline), so a retry finds the job settled rather than a stalled claim.
            return await self._detached(
                self._forward(
                    job_id, canonical, token, choice.candidates, resolved, views, created=True
                )
            )
        raise Aborted(
            f"job {job_id}: the cell kept changing while placing it; retry", reason="BUSY"
        )

    async def _detached(self, coro):
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)

    def forward_window_ms(self) -> int:
        return int(self.forward_timeout_s * 1000) + FORWARD_GRACE_MS

    def _fields(
        self, request_b64: str, r: Resolved, cand: Candidate, priority: int
    ) -> dict[str, Any]:
        return {
            "req": request_b64,
            "priority": priority,
            "spec": b64(r.spec.SerializeToString(deterministic=True)),
            "chips": _shape(r.chips),
            "blocks": r.block_count,
            "derived": "1" if r.derived else "0",
            "why": cand.reason,
        }

    def _resolve(
        self,
        job_id: str,
        req: cell_scheduler_pb2.SubmitJobRequest,
        models: Mapping[str, PodModel],
        registrations: Mapping[str, str],
        now: int,
    ) -> tuple[dict[str, Resolved], dict[str, InvalidArgument]]:
        """Per pod, what the job would be there. Requests that differ only in their job id
        resolve alike: resolved once per request content and pod registration."""
        if has_demand(req):  # depends on the time left: never cached
            return resolve_all(req, models, now_ms=now, node_flops=self.node_flops)
        template = cell_scheduler_pb2.SubmitJobRequest()
        template.CopyFrom(req)
        template.spec.job_id = "_"
        content = template.SerializeToString(deterministic=True)
        ok: dict[str, Resolved] = {}
        bad: dict[str, InvalidArgument] = {}
        for pod_id, model in models.items():
            key = (content, pod_id, registrations[pod_id])
            got = self._resolved.get(key)
            if got is None:
                one_ok, one_bad = resolve_all(
                    template, {pod_id: model}, now_ms=now, node_flops=self.node_flops
                )
                got = one_ok.get(pod_id) or one_bad[pod_id]
                if len(self._resolved) > CACHE_LIMIT:
                    self._resolved.clear()
                self._resolved[key] = got
            if isinstance(got, InvalidArgument):
                bad[pod_id] = got
            else:
                spec = workload_scheduler_pb2.JobSpec()
                spec.CopyFrom(got.spec)
                spec.job_id = job_id
                ok[pod_id] = replace(got, spec=spec)
        return ok, bad

    async def _plan_new(
        self, req: cell_scheduler_pb2.SubmitJobRequest, snap: RegistrySnapshot, now: int
    ) -> tuple[dict[str, Resolved], Choice, dict[str, PodCapacityView], int]:
        models = self.models_of(snap)
        if not models:
            raise FailedPrecondition(
                "cell", "no superpod has registered with the cell yet", reason="NO_PODS"
            )
        job_id = req.spec.job_id
        resolved, bad = self._resolve(job_id, req, models, snap.registrations, now)
        if not resolved:
            raise no_pod_can_host(bad)
        priority = next(iter(resolved.values())).priority
        views = self.views_of(snap, now)
        demand = JobDemand(job_id, priority, {p: r.needs for p, r in resolved.items()})
        ahead: list[JobDemand] = []
        if snap.queue:
            queued, _ = await self._queued(snap, models, now)
            ahead = [d for d in queued if d.priority >= priority]
        _, choice = plan_queue([*ahead, demand], views.values())[-1]
        return resolved, choice, views, priority

    async def _queued(
        self, snap: RegistrySnapshot, models: Mapping[str, PodModel], now: int
    ) -> tuple[list[JobDemand], dict[str, tuple[cell_scheduler_pb2.SubmitJobRequest, dict]]]:
        """The cell queue in order as planning demands; jobs no pod can host any more
        (a deadline that passed while waiting) fail."""
        demands: list[JobDemand] = []
        details: dict[str, tuple[cell_scheduler_pb2.SubmitJobRequest, dict]] = {}
        for record in await self.store.jobs(snap.queue):
            if record.phase != QUEUED:
                continue
            req = self.request_of(record)
            resolved, bad = self._resolve(record.job_id, req, models, snap.registrations, now)
            if not resolved:
                err = no_pod_can_host(bad)
                await self.store.end_queued(
                    record.job_id, "FAILED", f"no pod can host it any more: {err.message}", now
                )
                self.log.warning("job %s failed in the cell queue: %s", record.job_id, err.message)
                continue
            demands.append(
                JobDemand(
                    record.job_id,
                    record.priority,
                    {p: r.needs for p, r in resolved.items()},
                    record.refused,
                )
            )
            details[record.job_id] = (req, resolved)
        return demands, details

    def request_of(self, record: CellJobRecord) -> cell_scheduler_pb2.SubmitJobRequest:
        key = (record.job_id, record.request_b64)
        req = self._requests.get(key)
        if req is None:
            req = cell_scheduler_pb2.SubmitJobRequest.FromString(unb64(record.request_b64))
            if len(self._requests) > CACHE_LIMIT:
                self._requests.clear()
            self._requests[key] = req
        return req

    async def _forward(
        self,
        job_id: str,
        req: cell_scheduler_pb2.SubmitJobRequest,
        token: str,
        candidates: tuple[Candidate, ...],
        resolved: Mapping[str, Resolved],
        views: Mapping[str, PodCapacityView],
        *,
        created: bool,
    ) -> SubmitResult:
        """Forward a job claimed for candidates[0] (token); on refusal try the next ones."""
        last = ""
        for i, cand in enumerate(candidates):
            pod = cand.pod_id
            r = resolved[pod]
            now = self.now_ms()
            if i > 0:
                token = self.new_token()
                ok, _ = await self.store.claim_queued(
                    job_id,
                    pod=pod,
                    needs=r.needs,
                    token=token,
                    until_ms=now + self.forward_window_ms(),
                    now_ms=now,
                    check_free=cand.how == FITS,
                    reason=f"forwarding to pod {pod}: {cand.reason}",
                )
                if ok != 1:
                    break  # a dispatcher took it meanwhile, or that pod's blocks went elsewhere
                self._assume(pod, r.needs, -1)
            try:
                resp = await self.call(
                    pod,
                    "AdmitJob",
                    workload_scheduler_pb2.AdmitJobRequest(spec=r.spec),
                    timeout=self.forward_timeout_s,
                )
            except PodRefused as err:
                self.metrics.forwarded("refused")
                self._assume(pod, r.needs, +1)
                last = f"pod {pod} refused it: {err.report.message}"
                version = views[pod].version if pod in views else ""
                await self.back_to_queue(job_id, token, pod, last, version=version)
                self.log.info("job %s: %s", job_id, last, extra={"job_id": job_id})
                continue
            except PodUnreachable as err:
                self.metrics.forwarded("unreachable")
                self._assume(pod, r.needs, +1)
                last = f"pod {pod} did not answer ({err.code.name})"
                await self.store.mark_suspect(pod, self.now_ms() + self.pod_timeout_ms)
                await self.back_to_queue(job_id, token, pod, last, uncertain=True)
                self.log.warning(
                    "job %s: %s; trying elsewhere", job_id, last, extra={"job_id": job_id}
                )
                continue
            job = resp.job
            self.metrics.forwarded("placed")
            placed = await self.store.placed(
                job_id,
                token=token,
                pod=pod,
                state=state_name(job.state),
                n=len(job.history),
                reason=job.reason,
                fields=self._fields(self._b64_of(req), r, cand, r.priority),
                now_ms=self.now_ms(),
            )
            record = placed or await self.job_record(job_id)
            if record.phase == PLACED:
                self._remember(record)
            if placed:
                # Routine placements at debug (the job's history keeps them); preemptions
                # and jobs leaving the cell queue at info.
                notable = bool(resp.preempted) or not created
                (self.log.info if notable else self.log.debug)(
                    "job %s placed on pod %s (%s): %s",
                    job_id,
                    pod,
                    state_name(job.state),
                    cand.reason,
                    extra={"job_id": job_id, "pod_id": pod},
                )
            return SubmitResult(
                record,
                created,
                pod_job=job,
                preempted=list(resp.preempted),
                outcome=f"placed on pod {pod}: {cand.reason}"
                + (f" (derived {r.derived.describe()})" if r.derived else ""),
            )
        record = await self.job_record(job_id)
        if record.phase == QUEUED and req.spec.when_no_capacity == FAIL:
            await self.store.end_queued(
                job_id, "FAILED", f"refused: {last} (asked not to wait)", self.now_ms(), forget=True
            )
            raise ResourceExhausted(
                f"job {job_id} cannot be placed now and asked not to wait: {last}",
                reason="NO_CAPACITY",
            )
        self.kick()
        position = await self.store.queue_position(job_id)
        return SubmitResult(
            record,
            created,
            outcome=f"queued in the cell at position {position}: {last or record.reason}",
            queue_position=position,
        )

    async def back_to_queue(
        self,
        job_id: str,
        token: str,
        pod: str,
        why: str,
        *,
        uncertain: bool = False,
        version: str = "",
        cause: str = "refused",
    ) -> None:
        """End a forward without a placement: refused (not tried again on that pod until
        its capacity `version` changes), or uncertain (the pod is checked when it answers)."""
        self.metrics.requeued("unreachable" if uncertain else cause)
        await self.store.unbind(
            job_id,
            token=token,
            pod=pod,
            uncertain=uncertain,
            version=version,
            reason=f"{why}; back in the cell queue",
            now_ms=self.now_ms(),
        )

    @staticmethod
    def _b64_of(req: cell_scheduler_pb2.SubmitJobRequest) -> str:
        return b64(req.SerializeToString(deterministic=True))

    async def _existing(
        self, record: CellJobRecord, request_b64: str, *, validate_only: bool = False
    ) -> SubmitResult:
        if record.request_b64 != request_b64:
            raise FailedPrecondition(
                f"job {record.job_id}",
                "already exists with a different request; choose a new job id",
                reason="JOB_ID_REUSED",
            )
        if not validate_only:
            record = await self._settled(record)
        view = await self.view(record, refresh=not validate_only)
        return SubmitResult(
            view.record,
            False,
            pod_job=view.pod_job,
            outcome=f"already submitted: {view.record.state}"
            + (f" on pod {view.record.pod}" if view.record.pod else ""),
            queue_position=view.queue_position,
        )

    async def _settled(self, record: CellJobRecord) -> CellJobRecord:
        """The job once no forward of it is in flight (bounded by the forward's deadline)."""
        while record.phase == FORWARDING and self.now_ms() < record.until_ms:
            await asyncio.sleep(POLL_S)
            record = await self.job_record(record.job_id)
        return record

    async def _dry_run(
        self,
        req: cell_scheduler_pb2.SubmitJobRequest,
        resolved: Mapping[str, Resolved],
        choice: Choice,
        snap: RegistrySnapshot,
    ) -> SubmitResult:
        """validate_only: what would happen, confirmed by the pod's own dry run."""
        now = self.now_ms()
        job_id = req.spec.job_id
        record = CellJobRecord(
            job_id=job_id,
            request_b64=self._b64_of(req),
            tenant=tenant_of(req),
            priority=next(iter(resolved.values())).priority,
            seq=0,
            phase=QUEUED,
            state="PENDING",
            reason="",
            pod="",
            created_ms=now,
            updated_ms=now,
        )
        for cand in choice.candidates:
            r = resolved[cand.pod_id]
            try:
                resp = await self.call(
                    cand.pod_id,
                    "AdmitJob",
                    workload_scheduler_pb2.AdmitJobRequest(spec=r.spec, validate_only=True),
                )
            except PodCallError:
                continue
            record = replace(
                record,
                pod=cand.pod_id,
                chips=r.chips,
                block_count=r.block_count,
                derived=r.derived is not None,
                why=cand.reason,
                spec_b64=b64(r.spec.SerializeToString(deterministic=True)),
                state=state_name(resp.job.state),
            )
            return SubmitResult(
                record,
                True,
                pod_job=resp.job,
                preempted=list(resp.preempted),
                outcome=f"would go to pod {cand.pod_id} ({cand.reason}): {resp.outcome}",
            )
        if req.spec.when_no_capacity == FAIL:
            raise ResourceExhausted(
                f"job {job_id} cannot be placed now and asked not to wait: {choice.why_waiting}",
                reason="NO_CAPACITY",
            )
        ahead = sum(1 for j in await self.store.jobs(snap.queue) if j.priority >= record.priority)
        return SubmitResult(
            record,
            True,
            outcome=f"would wait in the cell queue at position {ahead + 1}: {choice.why_waiting}",
            queue_position=ahead + 1,
        )

    # == the cell queue ===========================================================

    async def dispatch(self) -> int:
        """One pass over the cell queue: forward every job that has a pod now (CS-3)."""
        snap = await self.store.snapshot()
        if not snap.queue:
            return 0
        models = self.models_of(snap)
        if not models:
            return 0
        now = self.now_ms()
        views = self.views_of(snap, now)
        demands, details = await self._queued(snap, models, now)
        forwards = []
        for demand, choice in plan_queue(demands, views.values()):
            if not choice.candidates:
                continue
            req, resolved = details[demand.job_id]
            first = choice.candidates[0]
            r = resolved[first.pod_id]
            token = self.new_token()
            ok, _ = await self.store.claim_queued(
                demand.job_id,
                pod=first.pod_id,
                needs=r.needs,
                token=token,
                until_ms=now + self.forward_window_ms(),
                now_ms=now,
                check_free=False,  # planned over the queue: the blocks are accounted for
                reason=f"leaving the cell queue for pod {first.pod_id}: {first.reason}",
            )
            if ok != 1:
                continue  # another replica took it
            self._assume(first.pod_id, r.needs, -1)
            # The stored fields name the pod now; _forward stores them again when placed.
            forwards.append(
                self._forward(
                    demand.job_id, req, token, choice.candidates, resolved, views, created=False
                )
            )
        if not forwards:
            return 0
        results = await asyncio.gather(*forwards, return_exceptions=True)
        for res in results:
            if isinstance(res, BaseException) and not isinstance(res, ResourceExhausted):
                self.log.error("forwarding from the cell queue failed", exc_info=res)
        return sum(1 for res in results if isinstance(res, SubmitResult) and res.pod_job)

    # == jobs (CS-5) ==============================================================

    async def job_record(self, job_id: str) -> CellJobRecord:
        record = await self.store.job(job_id)
        if record is None:
            raise NotFound("job", job_id)
        return record

    async def view(
        self, record: CellJobRecord, *, refresh: bool = True, include_rings: bool = False
    ) -> JobView:
        """The job with its pod's view when the pod answers (the mirror follows it)."""
        if record.phase == QUEUED:
            return JobView(record, queue_position=await self.store.queue_position(record.job_id))
        if record.phase != PLACED or not refresh:
            return JobView(record)
        try:
            job = await self.call(
                record.pod,
                "GetJob",
                workload_scheduler_pb2.GetJobRequest(
                    job_id=record.job_id, include_rings=include_rings
                ),
                timeout=5.0,
            )
        except PodCallError:
            return JobView(record)
        return JobView(await self.follow(record, job), job)

    async def follow(self, record: CellJobRecord, job: workload_scheduler_pb2.Job) -> CellJobRecord:
        """Follow a pod's answer about one of its jobs (GetJob, reconcile)."""
        n = len(job.history)
        if n < record.n:
            return record
        _, _, after, _ = await self.store.mirror(
            record.job_id,
            pod=record.pod,
            state=state_name(job.state),
            n=n,
            reason=job.reason,
            now_ms=self.now_ms(),
        )
        return after or record

    async def get(self, job_id: str, *, include_rings: bool = False) -> JobView:
        return await self.view(await self.job_record(job_id), include_rings=include_rings)

    async def list_jobs(
        self,
        *,
        tenant: str = "",
        states: set[str] | None = None,
        pod_id: str = "",
        page_size: int,
        before_seq: int | None,
    ) -> tuple[list[JobView], int | None]:
        """Newest first, filtered; the sequence to continue before, or None on the last page."""
        if tenant:
            index = self.store.key("tenant", tenant, "jobs")
        elif pod_id:
            index = self.store.key("pod", pod_id, "jobs")
        else:
            index = self.store.key("jobs")
        out: list[JobView] = []
        before = before_seq
        while len(out) < page_size:
            ids = await self.store.page(index, before_seq=before, count=page_size)
            if not ids:
                return out, None
            for record in await self.store.jobs(ids):
                before = record.seq
                if states and record.state not in states:
                    continue
                if tenant and record.tenant != tenant:
                    continue
                if pod_id and record.pod != pod_id:
                    continue
                out.append(JobView(record))
                if len(out) == page_size:
                    break
            if len(ids) < page_size and len(out) < page_size:
                return out, None
        assert before is not None
        more = await self.store.page(index, before_seq=before, count=1)
        return out, before if more else None

    async def complete(self, job_id: str) -> JobView:
        pod = self._placed.get(job_id) or await self._placed_pod(job_id)
        return await self._on_pod(
            job_id, pod, "CompleteJob", workload_scheduler_pb2.CompleteJobRequest(job_id=job_id)
        )

    async def _placed_pod(self, job_id: str) -> str:
        """The pod of a job that is on one, else why it cannot be completed."""
        record = await self._settled(await self.job_record(job_id))
        if record.phase == PLACED:
            self._remember(record)
            return record.pod
        if record.phase == QUEUED:
            raise FailedPrecondition(
                f"job {job_id}",
                "is PENDING in the cell queue; only a RUNNING job completes",
                reason="JOB_NOT_RUNNING",
            )
        if record.phase == ENDED:
            raise FailedPrecondition(
                f"job {job_id}", f"already ended: {record.state}", reason="JOB_ENDED"
            )
        raise Aborted(f"job {job_id} is still being placed; retry", reason="BUSY")

    async def cancel(self, job_id: str, reason: str) -> JobView:
        request = workload_scheduler_pb2.CancelJobRequest(job_id=job_id, reason=reason)
        pod = self._placed.get(job_id)
        if pod:
            return await self._on_pod(job_id, pod, "CancelJob", request)
        for _ in range(MAX_PLAN_ATTEMPTS):
            record = await self._settled(await self.job_record(job_id))
            if record.phase == QUEUED:
                ok, _ = await self.store.end_queued(
                    job_id,
                    "CANCELLED",
                    "cancelled in the cell queue" + (f": {reason}" if reason else ""),
                    self.now_ms(),
                )
                if ok:
                    self.log.info("job %s cancelled in the cell queue", job_id)
                    return JobView(await self.job_record(job_id))
                continue
            if record.phase == ENDED:
                if record.state == "CANCELLED":
                    return JobView(record)
                raise FailedPrecondition(
                    f"job {job_id}", f"already ended: {record.state}", reason="JOB_ENDED"
                )
            if record.phase == PLACED:
                self._remember(record)
                return await self._on_pod(job_id, record.pod, "CancelJob", request)
        raise Aborted(f"job {job_id} is still being placed; retry", reason="BUSY")

    async def _on_pod(self, job_id: str, pod: str, method: str, request: Any) -> JobView:
        """Complete or cancel on the job's pod; the cell follows the answer, and counts the
        blocks the job held as free until the pod reports (then jobs waiting may go)."""
        try:
            job = await self.call(pod, method, request)
        except PodCallError as err:
            raise err.relayed() from None
        _, queued, record, freed = await self.store.mirror(
            job_id,
            pod=pod,
            state=state_name(job.state),
            n=len(job.history),
            reason=job.reason,
            now_ms=self.now_ms(),
            ended_here=True,
        )
        if record is None:
            record = await self.job_record(job_id)
        if freed:
            self._assume(pod, record.needs, +1)
        if queued:
            self.kick()  # blocks were freed and jobs wait in the cell queue
        return JobView(record, job)

    async def report_block_health(
        self, pod_id: str, block_id: int, health: int, reason: str
    ) -> workload_scheduler_pb2.ReportBlockHealthResponse:
        await self.registration(pod_id)
        try:
            resp = await self.call(
                pod_id,
                "ReportBlockHealth",
                workload_scheduler_pb2.ReportBlockHealthRequest(
                    block_id=block_id,
                    health=health,  # type: ignore[arg-type]
                    reason=reason,
                ),
            )
        except PodCallError as err:
            raise err.relayed() from None
        if health == common_pb2.BLOCK_HEALTH_HEALTHY:
            self.kick()
        return resp

    async def registration(self, pod_id: str) -> str:
        raw = await self.store.registration(pod_id)
        if raw is None:
            raise NotFound("pod", pod_id, hint="no workload scheduler registered it")
        return raw

    # == pods ====================================================================

    async def pod_info(self, pod_id: str, *, include_view: bool) -> cell_scheduler_pb2.Pod:
        snap = await self.store.snapshot(queue=False)
        if pod_id not in snap.registrations:
            raise NotFound("pod", pod_id, hint="no workload scheduler registered it")
        pod = await self._pod_pb(snap, pod_id, self.now_ms())
        if include_view:
            try:
                pod.view.CopyFrom(
                    await self.call(pod_id, "GetPod", workload_scheduler_pb2.GetPodRequest())
                )
            except PodCallError as err:
                raise err.relayed() from None
        return pod

    async def list_pods(self) -> list[cell_scheduler_pb2.Pod]:
        snap = await self.store.snapshot(queue=False)
        now = self.now_ms()
        return [await self._pod_pb(snap, p, now) for p in sorted(snap.registrations)]

    async def _pod_pb(
        self, snap: RegistrySnapshot, pod_id: str, now: int
    ) -> cell_scheduler_pb2.Pod:
        reg = cell_scheduler_pb2.PodRegistration.FromString(unb64(snap.registrations[pod_id]))
        status, why = self.status_of(snap, pod_id, now)
        pod = cell_scheduler_pb2.Pod(
            registration=reg,
            status=status,  # type: ignore[arg-type]
            status_reason=why,
            cell_jobs=await self.store.live_count(pod_id),
            endpoints=[e for e, _ in await self.store.endpoints(pod_id)],
        )
        if pod_id in snap.capacities:
            pod.capacity.CopyFrom(self.capacity(snap.capacities[pod_id]))
            for t in pod.capacity.types:  # what the cell counts now (placements since the report)
                t.free = max(0, snap.free.get(f"{pod_id}|{t.node_type}", t.free))
        if pod_id in snap.seen:
            pod.last_heartbeat.FromMilliseconds(snap.seen[pod_id])
        return pod

    # == background work (CS-6) ==================================================

    async def run(self, interval_s: float) -> None:
        """Every replica: silent pods, stuck forwards, maybe-placed jobs, the queue.
        A supervised task: a failed round is logged and the loop restarted with backoff."""
        while True:
            await self.recovery.reconcile()
            await self.dispatch()
            # (asyncio.wait, not wait_for: on Python 3.11 wait_for can swallow a cancellation)
            waiter = asyncio.ensure_future(self._kick.wait())
            try:
                await asyncio.wait({waiter}, timeout=interval_s)
            finally:
                waiter.cancel()
            self._kick.clear()


def _check_registration(reg: cell_scheduler_pb2.PodRegistration) -> None:
    from lightpath.errors import FieldViolation
    from services.cell_scheduler.request import is_type_name
    from services.common.keys import ID_RULE, is_valid_id
    from services.common.settings import parse_address

    bad: list[FieldViolation] = []
    if not is_valid_id(reg.pod_id):
        bad.append(FieldViolation("pod.pod_id", ID_RULE))
    try:
        parse_address(reg.endpoint)
    except ValueError as err:
        bad.append(FieldViolation("pod.endpoint", str(err)))
    if not reg.block_shape.dims or any(d < 1 for d in reg.block_shape.dims):
        bad.append(FieldViolation("pod.block_shape", "needs one extent >= 1 per dimension"))
    if not reg.node_types:
        bad.append(FieldViolation("pod.node_types", "name at least one node type"))
    for i, t in enumerate(reg.node_types):
        if not is_type_name(t.node_type):
            bad.append(FieldViolation(f"pod.node_types[{i}].node_type", "is not a node type name"))
        if t.blocks < 1:
            bad.append(FieldViolation(f"pod.node_types[{i}].blocks", "must be >= 1"))
    if bad:
        raise InvalidArgument.of(bad)
