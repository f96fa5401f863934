"""The cell scheduler: the parts of the cell put together, and the submit path through them.

A submission (CS-2 … CS-5) reads as one path:

    server.SubmitJob → request.check_request → admission.plan (the decision)
      → store.claim_new (the commit) → forward.Forwarder.forward

1. check the request (`request`), then read the registry and the cell queue
   (`pods`; one round trip);
2. decide (`admission`): resolve the job for every registered pod and choose
   with the pure planner (`choice`): pods that fit now, best first, then pods
   that fit by preemption; the jobs already waiting at the same or higher
   priority go first;
3. claim the job id atomically — bound to the first candidate with its blocks
   held, or in the cell queue — so a retry, at this replica or another, finds
   the job and never forwards it a second time (X-5);
4. forward it (`forward`): a refusal sends it to the next candidate, and with
   none left it waits in the cell queue until a pod reports capacity; the
   placement is recorded with the pod's answer.

Who owns what: `pods` the registry as read and the calls to pods; `jobs` the
job records, their phases and every later change (follow, requeue, complete,
cancel; the servicer calls it directly for those); `admission` the decision; `forward` forwarding and the dispatcher's
pass over the cell queue; `recovery` the repairs after a failure half-way;
`watch` the streams; `updates` a job's priority or labels changed in place. This module keeps the registry's writes (register, the
heartbeat report, CS-1, CS-6), the pods API and `run`, the background loop of
every replica: the repairs of `recovery` and a pass over the cell queue.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping

from lightpath.errors import Aborted, InvalidArgument, NotFound, ResourceExhausted
from lightpath.v1 import cell_scheduler_pb2, common_pb2, workload_scheduler_pb2
from lightpath_services.cell_scheduler.admission import FAIL, Admission, no_capacity_delay
from lightpath_services.cell_scheduler.choice import FITS, PodCapacityView, chips_key
from lightpath_services.cell_scheduler.forward import Forwarder
from lightpath_services.cell_scheduler.jobs import (
    MAX_PLAN_ATTEMPTS,
    CellJobs,
    JobView,
    SubmitResult,
)
from lightpath_services.cell_scheduler.metrics import CellMetrics
from lightpath_services.cell_scheduler.podclient import PodCallError, PodClients, state_name
from lightpath_services.cell_scheduler.pods import PodDirectory, capacity_view, reported_chips
from lightpath_services.cell_scheduler.quota import Hold
from lightpath_services.cell_scheduler.quotas import (
    QuotaState,
    capacity_of,
    charge_of,
    pod_quota_pb,
    quota_from_pb,
    quota_key,
    tenant_quota_pb,
    to_json,
)
from lightpath_services.cell_scheduler.recovery import Recovery
from lightpath_services.cell_scheduler.request import check_registration, check_request, tenant_of
from lightpath_services.cell_scheduler.store import (
    EXISTS,
    QUOTA,
    CellStore,
    Conflict,
    RegistrySnapshot,
    b64,
    unb64,
)
from lightpath_services.cell_scheduler.updates import Updates
from lightpath_services.cell_scheduler.watch import CellEventHub

__all__ = ["CellScheduler", "JobView", "SubmitResult"]


# Claims a submit may lose to other admissions' quota charges beyond its attempts.
MAX_QUOTA_LOSSES = 64


class Attempts:
    """A submit's attempts at a decision and its claim: `n`, and one more for each
    `extend` (at most `extra_max`)."""

    def __init__(self, n: int, extra_max: int):
        self.n, self.extra, self.extra_max = n, 0, extra_max

    def __iter__(self) -> Iterator[int]:
        i = 0
        while i < self.n + self.extra:
            yield i
            i += 1

    def extend(self) -> bool:
        if self.extra >= self.extra_max:
            return False
        self.extra += 1
        return True

    def last(self, i: int) -> bool:
        return i >= self.n + self.extra - 1


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
        self.node_flops = dict(node_flops)
        self._spawn = spawn or (lambda coro, name: asyncio.ensure_future(coro))
        self.log = log or logging.getLogger("lightpath.cell_scheduler")
        self._kick = asyncio.Event()
        self.pods = PodDirectory(
            store=store, clients=pods, pod_timeout_s=pod_timeout_s, clock=clock
        )
        self.jobs = CellJobs(
            pods=self.pods,
            instance_id=instance_id,
            forward_timeout_s=forward_timeout_s,
            kick=self.kick,
            log=self.log,
            metrics=self.metrics,
        )
        self.admission = Admission(pods=self.pods, node_flops=node_flops, log=self.log)
        self.forwarder = Forwarder(
            jobs=self.jobs,
            admission=self.admission,
            forward_timeout_s=forward_timeout_s,
            kick=self.kick,
            log=self.log,
            metrics=self.metrics,
        )
        self.recovery = Recovery(pods=self.pods, jobs=self.jobs, kick=self.kick, log=self.log)
        self.updates = Updates(
            jobs=self.jobs, request_of=self.admission.request_of, kick=self.kick, log=self.log
        )
        self.events = CellEventHub(store, self.log)

    def kick(self) -> None:
        """Ask this replica's dispatcher for a pass over the cell queue soon."""
        self._kick.set()

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
        budget = Attempts(MAX_PLAN_ATTEMPTS, MAX_QUOTA_LOSSES)
        for attempt in budget:
            snap = await self.pods.registry(fresh=attempt > 0)
            if snap.queue and attempt == 0:
                snap = await self.pods.registry(fresh=True)  # decide with the queue as it is
            read_at = self.pods.snap_at  # when the read of `snap` began
            now = self.pods.now_ms()
            resolved, choice, views, priority = await self.admission.plan(canonical, snap, now)
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
                    return await self.jobs.existing(existing, request_b64, validate_only=True)
                return await self.admission.dry_run(canonical, resolved, choice, snap)
            tenant = tenant_of(req)
            if not choice.candidates:
                if req.spec.when_no_capacity == FAIL:
                    existing = await self.store.job(job_id)
                    if existing is not None:
                        return await self.jobs.existing(existing, request_b64)
                    raise ResourceExhausted(
                        f"job {job_id} cannot be placed now and asked not to wait: "
                        f"{choice.why_waiting}",
                        reason="NO_CAPACITY",
                        retry_delay_s=no_capacity_delay(),
                    )
                try:
                    await self.jobs.queue_new(
                        job_id,
                        request_b64,
                        tenant,
                        priority,
                        f"queued in the cell: {choice.why_waiting}",
                        now,
                    )
                except Conflict:  # EXISTS: the only check of a job queued at once
                    return await self.jobs.existing(await self.jobs.job_record(job_id), request_b64)
                record = await self.jobs.job_record(job_id)
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
            try:
                claim = await self.jobs.claim_new(
                    job_id,
                    request_b64,
                    tenant,
                    priority,
                    r,
                    first,
                    # The last attempt goes ahead even if others took the blocks meanwhile:
                    # the pod's own admission decides.
                    check_free=first.how == FITS and not budget.last(attempt),
                    expect_empty_queue=not snap.queue,
                    now_ms=now,
                    quota=QuotaState.of(snap.quotas).guard(
                        tenant, pod=first.pod_id, need=charge_of(r)
                    ),
                )
            except Conflict as c:
                if c.reason == EXISTS:
                    return await self.jobs.existing(await self.jobs.job_record(job_id), request_b64)
                if c.reason == QUOTA and budget.extend():
                    # Another admission charged the quotas meanwhile: decide again. Each
                    # loss is another's admission, so a burst of one tenant's submits
                    # goes through whole, not refused as busy.
                    continue
                # STALE: the blocks went to others; WAITING: jobs wait in the cell queue. A
                # job that asked not to wait is answered now once a fresh look lost the
                # race: planning again under load held such callers for seconds (issue 30).
                if req.spec.when_no_capacity == FAIL and attempt > 0:
                    raise ResourceExhausted(
                        f"job {job_id} cannot be placed now and asked not to wait: the "
                        "blocks it would take went to other jobs meanwhile",
                        reason="NO_CAPACITY",
                        retry_delay_s=no_capacity_delay(),
                    ) from None
                continue
            # Claimed: the forward runs to its end even if this caller goes away (a client
            # deadline), so a retry finds the job settled rather than a stalled claim.
            return await self.forwarder.detached(
                self.forwarder.forward(
                    job_id, canonical, claim, choice.candidates, resolved, views, created=True
                )
            )
        raise Aborted(
            f"job {job_id}: the cell kept changing while placing it; retry", reason="BUSY"
        )

    # == quotas (issue 35) ========================================================

    async def set_quota(self, pb: cell_scheduler_pb2.Quota) -> cell_scheduler_pb2.TenantQuota:
        """Create or replace a tenant's quota; the next admission decides with it."""
        for _ in range(MAX_PLAN_ATTEMPTS):
            snap = await self.pods.registry(fresh=True)
            state = QuotaState.of(snap.quotas)
            models = self.pods.models_of(snap)
            known = {t for m in models.values() for t, _ in m.node_types}
            q = quota_from_pb(pb, known_types=known, quotas=state.quotas, known_pods=models)
            try:
                await self.store.put_quota(
                    quota_key(q.tenant, q.pod), to_json(q), snap.quotas.version
                )
            except Conflict:
                continue  # another change of the quotas meanwhile: check against it
            self.log.info("quota of tenant %s%s set: %s", q.tenant, _on(q.pod), to_json(q))
            self.kick()  # jobs waiting for quota may fit now
            return _row_of(await self.list_quotas(q.tenant), q.pod)
        raise Aborted("the quotas kept changing; retry", reason="BUSY")

    async def delete_quota(self, tenant: str, pod: str = "") -> cell_scheduler_pb2.TenantQuota:
        key = quota_key(tenant, pod)
        for _ in range(MAX_PLAN_ATTEMPTS):
            rows = await self.store.quota_rows()
            if key not in rows.quotas:
                raise NotFound("quota", key, hint="`lightpath quota list` shows the quotas")
            before = _row_of(await self.list_quotas(tenant), pod)
            try:
                await self.store.put_quota(key, None, rows.version)
            except Conflict:
                continue
            self.log.info("quota of tenant %s%s deleted", tenant, _on(pod))
            self.kick()
            return before
        raise Aborted("the quotas kept changing; retry", reason="BUSY")

    async def list_quotas(self, tenant: str = "") -> list[cell_scheduler_pb2.TenantQuota]:
        """Every tenant with a quota or chips held, by name; with `tenant`, its row only
        (empty of usage when it has neither)."""
        return (await self.quota_view(tenant))[0]

    async def quota_view(
        self, tenant: str = ""
    ) -> tuple[list[cell_scheduler_pb2.TenantQuota], Hold | None]:
        """list_quotas's rows and the pod held for an owner's job (quota.Hold), if any,
        both read from one snapshot: the hold shown is the one the rows were counted with."""
        snap = await self.store.snapshot()
        state = QuotaState.of(snap.quotas)
        capacity = capacity_of(self.pods.models_of(snap).values())
        waiting: dict[str, list[str]] = {}
        for record in await self.store.jobs(snap.queue):
            waiting.setdefault(record.tenant, []).append(record.reason)
        names = [tenant] if tenant else sorted(set(state.tenants()) | set(waiting))
        now = self.pods.now_ms()
        rows = [
            row
            for t in names
            for row in (
                tenant_quota_pb(t, state, capacity, now, waiting.get(t, [])),
                *(pod_quota_pb(t, p, state) for p in state.pods_of(t)),
            )
        ]
        return rows, state.hold

    # == the registry (CS-1) ======================================================

    async def register(self, reg: cell_scheduler_pb2.PodRegistration) -> cell_scheduler_pb2.Pod:
        check_registration(reg)
        data = b64(reg.SerializeToString(deterministic=True))
        returned = await self.store.register(
            reg.pod_id, data, reg.endpoint, self.pods.now_ms(), reg.events_tip
        )
        self.pods.forget_snapshot()
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
        free: dict[str, int] = {t.node_type: t.free for t in req.capacity.types}
        # Chips for sub-block slices (issue 28), counted apart from blocks (choice.chips_key).
        block_chips = await self.pods.block_chips(req.pod_id)
        for t in req.capacity.types:
            free[chips_key(t.node_type)] = reported_chips(t, block_chips)[0]
        transitions = [
            [
                t.stream_id,
                t.event.job_id,
                t.seq,
                state_name(t.event.from_state) if t.event.from_state else "",
                state_name(t.event.to_state),
                t.event.at.ToMilliseconds(),
                t.event.reason,
                int(t.released),
            ]
            for t in req.transitions
        ]
        try:
            reported = await self.store.report(
                req.pod_id,
                endpoint=req.endpoint,
                now_ms=self.pods.now_ms(),
                capacity_b64=b64(req.capacity.SerializeToString(deterministic=True)),
                version=req.capacity.version,
                free=free,
                after=req.events_after,
                until=req.events_until,
                transitions=transitions,
                assume_ms=self.pods.pod_timeout_ms,
            )
        except Conflict:  # UNKNOWN_POD
            raise NotFound("pod", req.pod_id, hint="register it first (RegisterPod)") from None
        self.metrics.reported(self.pods, req.transitions, self._spawn)
        for _ in range(reported.requeued):
            self.metrics.requeued("reclaimed")
        if req.endpoint:
            self.pods.heard_from(req.pod_id, req.endpoint)
        if reported.returned:
            self.pods.forget_snapshot()
            self.log.info("pod %s answers again", req.pod_id, extra={"pod_id": req.pod_id})
            await self._pod_returned(req.pod_id, req.endpoint)
        elif req.resync:
            self._spawn(self.recovery.reconcile_pod(req.pod_id), f"resync {req.pod_id}")
        if reported.wake or reported.returned:
            self.kick()
        return cell_scheduler_pb2.ReportPodStatusResponse(
            events_ack=reported.ack, status=cell_scheduler_pb2.POD_STATUS_READY
        )

    async def _pod_returned(self, pod_id: str, endpoint: str) -> None:
        if endpoint:
            await self.pods.clients.reset(endpoint)
        self._spawn(self.recovery.reconcile_pod(pod_id), f"reconcile {pod_id}")

    async def report_block_health(
        self, pod_id: str, block_id: int, health: int, reason: str, host: int | None = None
    ) -> workload_scheduler_pb2.ReportBlockHealthResponse:
        """A block's health, or one host's (`host`, issue 28), relayed to its pod: the pod
        checks the host id against its block (INVALID_ARGUMENT naming `host`)."""
        await self.pods.registration(pod_id)
        request = workload_scheduler_pb2.ReportBlockHealthRequest(
            block_id=block_id,
            health=health,  # type: ignore[arg-type]
            reason=reason,
        )
        if host is not None:
            request.host = host
        try:
            resp = await self.pods.call(pod_id, "ReportBlockHealth", request)
        except PodCallError as err:
            raise err.relayed() from None
        if health == common_pb2.BLOCK_HEALTH_HEALTHY:
            self.kick()
        return resp

    # == pods ====================================================================

    async def pod_info(self, pod_id: str, *, include_view: bool) -> cell_scheduler_pb2.Pod:
        snap = await self.store.snapshot(queue=False)
        if pod_id not in snap.registrations:
            raise NotFound("pod", pod_id, hint="no workload scheduler registered it")
        pod = await self._pod_pb(snap, pod_id, self.pods.now_ms())
        if include_view:
            try:
                pod.view.CopyFrom(
                    await self.pods.call(pod_id, "GetPod", workload_scheduler_pb2.GetPodRequest())
                )
            except PodCallError as err:
                raise err.relayed() from None
        return pod

    async def list_pods(self) -> list[cell_scheduler_pb2.Pod]:
        snap = await self.store.snapshot(queue=False)
        now = self.pods.now_ms()
        return [await self._pod_pb(snap, p, now) for p in sorted(snap.registrations)]

    async def _pod_pb(
        self, snap: RegistrySnapshot, pod_id: str, now: int
    ) -> cell_scheduler_pb2.Pod:
        reg = cell_scheduler_pb2.PodRegistration.FromString(unb64(snap.registrations[pod_id]))
        status, why = self.pods.status_of(snap, pod_id, now)
        pod = cell_scheduler_pb2.Pod(
            registration=reg,
            status=status,  # type: ignore[arg-type]
            status_reason=why,
            cell_jobs=await self.store.live_count(pod_id),
            endpoints=[e for e, _ in await self.store.endpoints(pod_id)],
        )
        if pod_id in snap.capacities:
            pod.capacity.CopyFrom(self.pods.capacity(snap.capacities[pod_id]))
            view = PodCapacityView(pod_id, block_chips=math.prod(reg.block_shape.dims))
            for t in pod.capacity.types:  # what the cell counts now (placements since the report)
                if t.chips_total:
                    capacity_view(view, t, snap)
                    t.chips_free = view.chips_free[t.node_type]
                    t.largest_free_box = min(t.largest_free_box, t.chips_free)
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
            await self.forwarder.dispatch()
            # (asyncio.wait, not wait_for: on Python 3.11 wait_for can swallow a cancellation)
            waiter = asyncio.ensure_future(self._kick.wait())
            try:
                await asyncio.wait({waiter}, timeout=interval_s)
            finally:
                waiter.cancel()
            self._kick.clear()


def _on(pod: str) -> str:
    return f" on pod {pod}" if pod else ""


def _row_of(rows: list[cell_scheduler_pb2.TenantQuota], pod: str) -> cell_scheduler_pb2.TenantQuota:
    """A tenant's row of one scope (its rows from list_quotas)."""
    return next(r for r in rows if r.pod == pod)
