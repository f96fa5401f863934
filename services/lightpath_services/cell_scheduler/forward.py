"""Forwarding claimed jobs to their pods (CS-3), and the dispatcher's pass over the cell queue.

A job reaches `Forwarder.forward` already claimed (FORWARDING, bound to the
first candidate with its blocks held). It is sent with AdmitJob
(`when_no_capacity` FAIL: a pod only places or refuses); a refusal or a pod
that does not answer sends it back to the cell queue and on to the next
candidate (claimed again), and with none left it waits in the cell queue
until a pod reports capacity. A placement is committed with the pod's
answer. `dispatch` is one pass of the dispatcher: plan the cell queue,
claim each job that has a pod now, and forward them side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from lightpath.client import wrong_peer
from lightpath.errors import WIRING_FAILED, InvalidArgument, ResourceExhausted, Unavailable
from lightpath.v1 import cell_scheduler_pb2, workload_scheduler_pb2
from lightpath_services.cell_scheduler.admission import (
    FAIL,
    HELD_FOR_OWNER,
    Admission,
    no_capacity_delay,
)
from lightpath_services.cell_scheduler.choice import (
    CHIPS_SUFFIX,
    FITS,
    PREEMPTS,
    Candidate,
    PodCapacityView,
    plan_queue,
)
from lightpath_services.cell_scheduler.jobs import (
    CellJobs,
    Claim,
    SubmitResult,
    record_fields,
    request_b64,
)
from lightpath_services.cell_scheduler.metrics import CellMetrics
from lightpath_services.cell_scheduler.podclient import PodRefused, PodUnreachable, state_name
from lightpath_services.cell_scheduler.quota import Hold
from lightpath_services.cell_scheduler.quotas import (
    RECLAIM_FIELDS,
    WAITING_FOR_QUOTA,
    QuotaState,
    charge_of,
    plan_reclaim,
    running_of,
)
from lightpath_services.cell_scheduler.request import Resolved, grouped, tenant_of
from lightpath_services.cell_scheduler.store import PLACED, QUEUED, Conflict
from lightpath_services.common.admission import POD_BUSY


class Forwarder:
    def __init__(
        self,
        *,
        jobs: CellJobs,
        admission: Admission,
        forward_timeout_s: float,
        kick: Callable[[], None],
        log: logging.Logger,
        metrics: CellMetrics,
    ):
        self.jobs = jobs
        self.pods = jobs.pods
        self.store = jobs.store
        self.admission = admission
        self.forward_timeout_s = forward_timeout_s
        self._kick = kick
        self.log = log
        self.metrics = metrics
        self._tasks: set[asyncio.Future] = set()  # forwards that outlive their caller

    async def detached(self, coro):
        """Run a claimed forward to its end even if the caller goes away (a client
        deadline), so a retry finds the job settled rather than a stalled claim."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)

    async def forward(
        self,
        job_id: str,
        req: cell_scheduler_pb2.SubmitJobRequest,
        claim: Claim,
        candidates: tuple[Candidate, ...],
        resolved: Mapping[str, Resolved],
        views: Mapping[str, PodCapacityView],
        *,
        created: bool,
        reclaim: Sequence[str] = (),
    ) -> SubmitResult:
        """Forward a job claimed for candidates[0]; on refusal try the next ones (each
        claimed anew: a new token and a newer fencing token at the pod).
        When every pod that could host it by the cell's check refuses it as
        INVALID_ARGUMENT (their own rules go further than the cell's), no pod can: it is
        refused (at submit: INVALID_ARGUMENT with the pods' reasons, nothing kept) or,
        from the cell queue, FAILED — never left waiting."""
        last = ""
        wiring_failed = False  # the last pod placed it but a switch failed (issue 34)
        busy_delay_s: float | None = None  # the last pod was too busy to look (POD_BUSY)
        invalid: dict[str, InvalidArgument] = {}
        token = claim.token
        for i, cand in enumerate(candidates):
            pod = cand.pod_id
            r = resolved[pod]
            if i > 0:
                # Back in the queue its chips were given back: charged again only if its
                # tenant's quota still has them (checked against the version read).
                quotas = QuotaState.of(await self.store.quota_rows())
                tenant = tenant_of(req)
                if not quotas.book().check(tenant, charge_of(r)).ok:
                    break
                over = quotas.pod_refusal(tenant, pod, charge_of(r))
                if over:  # its quota on that pod is used up: the next pod may do
                    last = WAITING_FOR_QUOTA + over
                    continue
                if quotas.keeps_out(job_id, tenant, charge_of(r)) == pod:  # held since
                    last = f"pod {pod}: {HELD_FOR_OWNER}"
                    continue
                claimed = await self.jobs.claim_queued(
                    job_id,
                    r,
                    cand,
                    check_free=cand.how == FITS,
                    reason=f"forwarding to pod {pod}: {cand.reason}",
                    request=request_b64(req),
                    quota=quotas.guard(tenant, pod=pod, need=charge_of(r)),
                )
                if claimed is None:
                    break  # a dispatcher took it meanwhile, or that pod's blocks went elsewhere
                claim = claimed
                token = claim.token
            try:
                resp = await self.pods.call(
                    pod,
                    "AdmitJob",
                    workload_scheduler_pb2.AdmitJobRequest(
                        spec=r.spec,
                        reclaim=reclaim if i == 0 else (),
                        forward_token=claim.fence,
                    ),
                    timeout=self.forward_timeout_s,
                )
            except PodRefused as err:
                self.metrics.forwarded("refused")
                self.pods.assume(pod, r.needs, +1)
                last = f"pod {pod} refused it: {err.report.message}"
                relayed = err.relayed()
                wiring_failed = relayed.reason == WIRING_FAILED
                busy_delay_s = (
                    (err.report.retry_delay_s or no_capacity_delay())
                    if relayed.reason == POD_BUSY
                    else None
                )
                if isinstance(relayed, InvalidArgument):
                    invalid[pod] = relayed
                version = views[pod].version if pod in views else ""
                await self.jobs.back_to_queue(job_id, token, pod, last, version=version)
                self.log.info("job %s: %s", job_id, last, extra={"job_id": job_id})
                continue
            except PodUnreachable as err:
                self.metrics.forwarded("unreachable")
                self.pods.assume(pod, r.needs, +1)
                last = f"pod {pod} did not answer ({err.code.name})"
                wiring_failed = False
                busy_delay_s = None
                # Refused in the handshake (the endpoint is not the pod that registered):
                # nothing was sent, so the pod cannot hold it; the reason says whom it found.
                refused = wrong_peer(err.error)
                if refused:
                    last = f"pod {pod} was not reached: {err.report.message}"
                await self.store.mark_suspect(pod, self.pods.now_ms() + self.pods.pod_timeout_ms)
                await self.jobs.back_to_queue(job_id, token, pod, last, uncertain=not refused)
                self.log.warning(
                    "job %s: %s; trying elsewhere", job_id, last, extra={"job_id": job_id}
                )
                continue
            job = resp.job
            self.metrics.forwarded("placed")
            placed = await self.jobs.placed(
                job_id,
                token,
                pod,
                job,
                record_fields(
                    request_b64(req), r, cand, r.priority, reclaim=reclaim if i == 0 else ()
                ),
            )
            record = placed or await self.jobs.job_record(job_id)
            if record.phase == PLACED:
                self.jobs.remember(record)
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
        record = await self.jobs.job_record(job_id)
        if record.phase == QUEUED and invalid and set(resolved) <= set(invalid):
            refusal = grouped(invalid)
            try:
                await self.store.end_queued(
                    job_id,
                    "FAILED",
                    f"no pod can host it: {refusal.message}",
                    self.pods.now_ms(),
                    forget=created,
                )
                ended = True
            except Conflict:  # MOVED on meanwhile
                ended = False
            if ended:
                self.log.info(
                    "job %s: every pod refused it as invalid: %s",
                    job_id,
                    refusal.message,
                    extra={"job_id": job_id},
                )
                if created:
                    raise refusal
                return SubmitResult(await self.jobs.job_record(job_id), created, outcome=last)
            record = await self.jobs.job_record(job_id)
        # (one a reclaim sent back from its pod was admitted once: it waits like any)
        if record.phase == QUEUED and req.spec.when_no_capacity == FAIL and not record.reclaimed:
            with contextlib.suppress(Conflict):
                await self.store.end_queued(
                    job_id,
                    "FAILED",
                    f"refused: {last} (asked not to wait)",
                    self.pods.now_ms(),
                    forget=True,
                )
            if wiring_failed:  # a switch failed, not the capacity: retryable, as the pod said
                raise Unavailable(
                    f"job {job_id} was not wired and asked not to wait: {last}",
                    reason=WIRING_FAILED,
                )
            if busy_delay_s is not None:
                # Not the capacity: the pod was too busy to decide soon. Said as the pod
                # said it, so the caller knows, and the cell's admission takes it as a
                # sign to let fewer calls in (lightpath_services.common.admission).
                raise ResourceExhausted(
                    f"job {job_id} was not placed and asked not to wait: {last}",
                    reason=POD_BUSY,
                    retry_delay_s=busy_delay_s,
                )
            raise ResourceExhausted(
                f"job {job_id} cannot be placed now and asked not to wait: {last}",
                reason="NO_CAPACITY",
                retry_delay_s=no_capacity_delay(),
            )
        position = await self.store.queue_position(job_id)
        if position == 0:  # another replica's dispatcher took it meanwhile
            record = await self.jobs.job_record(job_id)
        self._kick()
        return SubmitResult(
            record,
            created,
            outcome=f"queued in the cell at position {position}: {last or record.reason}",
            queue_position=position,
        )

    async def dispatch(self) -> int:
        """One pass over the cell queue: forward every job that has a pod now (CS-3)."""
        if not await self.store.queue_or_hold():
            return 0  # (an empty queue and no hold to release: most background rounds)
        snap = await self.store.snapshot()
        hold = snap.quotas.hold
        if hold is not None and hold.job_id not in snap.queue:
            await self._release(hold)  # (also when the queue is empty now)
        if not snap.queue:
            return 0
        models = self.pods.models_of(snap)
        if not models:
            return 0
        now = self.pods.now_ms()
        views = self.pods.views_of(snap, now)
        # A no-wait job's own forward tries each candidate for up to the forward timeout.
        demands, details = await self.admission.queued(
            snap, models, now, own_forward_ms=int(2 * self.forward_timeout_s * 1000)
        )
        quotas = QuotaState.of(snap.quotas)
        version = quotas.version  # this pass's own charges bump it
        on_pods: dict[tuple[str, str], Counter[str]] = {}  # ... and hold chips on pods
        forwards = []
        roomless: list[str] = []
        for demand, choice in plan_queue(demands, views.values()):
            if not choice.candidates:
                roomless.append(demand.job_id)
                continue
            req, resolved = details[demand.job_id]
            first = choice.candidates[0]
            r = resolved[first.pod_id]
            tenant = tenant_of(req)
            held = on_pods.setdefault((tenant, first.pod_id), Counter())
            if quotas.pod_refusal(tenant, first.pod_id, charge_of(r), held):
                continue  # this pass's own claims used its quota on that pod: the next pass
            claim = await self.jobs.claim_queued(
                demand.job_id,
                r,
                first,
                check_free=False,  # planned over the queue: the blocks are accounted for
                reason=f"leaving the cell queue for pod {first.pod_id}: {first.reason}",
                now_ms=now,
                request=request_b64(req),
                quota=quotas.guard(tenant, version, first.pod_id, charge_of(r)),
            )
            if claim is None:
                continue  # another replica took it, or an update changed it (next pass)
            held.update(charge_of(r))
            if quotas.limits(tenant, first.pod_id):
                version = str(int(version or 0) + 1)
            # The stored fields name the pod now; _forward stores them again when placed.
            forwards.append(
                self.forward(
                    demand.job_id, req, claim, choice.candidates, resolved, views, created=False
                )
            )
        if quotas.active and roomless and not forwards:
            reclaimed = await self._reclaim(roomless, details, views, now)
            if reclaimed is not None:
                forwards.append(reclaimed)
        if not forwards:
            return 0
        results = await asyncio.gather(*forwards, return_exceptions=True)
        for res in results:
            if isinstance(res, BaseException) and not isinstance(res, ResourceExhausted):
                self.log.error("forwarding from the cell queue failed", exc_info=res)
        return sum(1 for res in results if isinstance(res, SubmitResult) and res.pod_job)

    async def _reclaim(
        self,
        roomless: Sequence[str],
        details: Mapping[str, tuple[cell_scheduler_pb2.SubmitJobRequest, dict]],
        views: Mapping[str, PodCapacityView],
        now: int,
    ) -> Coroutine[Any, Any, SubmitResult] | None:
        """Lent quota taken back (issue 35): the first job, in the planned order, that is
        within its tenant's nominal quota and finds no room goes to the pod where the
        fewest, lowest-priority jobs of its cohort's borrowers free enough; that pod
        preempts exactly those, each by its own policy. One reclaim a pass (the next
        pass sees what it freed); its forward, or None."""
        quotas = QuotaState.of(await self.store.quota_rows())  # as it is now
        for job_id in roomless:
            req, resolved = details[job_id]
            tenant = tenant_of(req)
            if tenant not in quotas.quotas:
                continue
            some = next(iter(resolved.values()))
            need = charge_of(some)
            if not quotas.book().check(tenant, need).within_nominal:
                continue
            pods = sorted(p for p in resolved if p in views and views[p].usable)
            room = {  # chips of whole free blocks (a box's free chips in a used block: unknown)
                p: {
                    t: n * views[p].block_chips
                    for t, n in views[p].free.items()
                    if CHIPS_SUFFIX not in t
                }
                for p in pods
            }
            live = await self.store.live_fields(pods, RECLAIM_FIELDS)
            sizes = {p: views[p].block_chips for p in pods}
            plan = plan_reclaim(
                job_id, tenant, need, quotas, live, room, box=some.sub_block, block_chips=sizes
            )
            if plan is None and quotas.hold is None and not some.sub_block:
                running, _ = running_of(job_id, live, sizes)
                pod = quotas.book().pod_to_hold(tenant, need, running, room)
                if pod is not None:
                    await self._hold(Hold(job_id, pod, tenant, now))
                    quotas = QuotaState.of(await self.store.quota_rows())
            if plan is None or plan.pod not in resolved:
                continue
            if quotas.pod_refusal(tenant, plan.pod, charge_of(resolved[plan.pod])):
                continue  # its quota on that pod would not cover it there
            cand = Candidate(plan.pod, PREEMPTS, plan.reason)
            victims = [v.job_id for v in plan.victims]
            claim = await self.jobs.claim_queued(
                job_id,
                resolved[plan.pod],
                cand,
                check_free=False,
                reason=f"leaving the cell queue for pod {plan.pod}: {plan.reason}",
                now_ms=now,
                request=request_b64(req),
                quota=quotas.guard(tenant, pod=plan.pod),
                reclaim=victims,
            )
            if claim is None:
                return None  # changed meanwhile: the next pass decides again
            self.log.info(
                "job %s: %s (%s)", job_id, plan.reason, ", ".join(victims), extra={"job_id": job_id}
            )
            return self.forward(
                job_id, req, claim, (cand,), resolved, views, created=False, reclaim=victims
            )
        return None

    async def _release(self, hold: Hold) -> None:
        """Its job started or left the cell queue: the pod is anyone's again. (Not sooner:
        ended while its tenant's other jobs run past its nominal, the hold moved between
        pods and the room it gathered was lost — owners were denied 30 % of the time in
        the simulator's 4-pod run at seed 2, 7 % kept.)"""
        if await self.store.release_pod(hold.job_id):
            self.log.info(
                "pod %s no longer held for job %s",
                hold.pod,
                hold.job_id,
                extra={"job_id": hold.job_id},
            )

    async def _hold(self, hold: Hold) -> None:
        """Hold a pod for an owner's job reclaim could place nowhere (quota.Hold), unless
        another replica held one first."""
        if await self.store.hold_pod(hold.job_id, hold.pod, hold.tenant, hold.since_ms):
            self.log.info(
                "pod %s held for job %s: within its tenant's nominal quota, no pod's free "
                "and borrowed chips make its room; jobs that would borrow stay off it",
                hold.pod,
                hold.job_id,
                extra={"job_id": hold.job_id, "pod_id": hold.pod},
            )

    # == jobs (CS-5) ==============================================================
