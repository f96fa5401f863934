"""The cell's jobs (CS-5): their records, their phase, and the changes the cell makes to them.

A job's phase in the cell (store.py keeps the atomic scripts that move it):

    QUEUED ──claim──▶ FORWARDING ──placed──▶ PLACED ──mirror (pod reports)──▶ ended
      ▲ ▲                 │                    │
      │ └─back_to_queue───┘ (refused, unreachable, or a forward that was lost)
      └──────────released──────────────────────┘ (its pod let it go: a reclaim, issue 35)
    QUEUED ──end_queued──▶ ended (cancelled or failed in the cell queue)

A claim binds the job to one pod with a token and a deadline
(`forward_window_ms`); only the holder of the token ends that forward, placed
or back in the queue. Each claim (and each take-over) also takes the next number
of the cell's forward sequence, its fencing token at the pod
(`AdmitJobRequest.forward_token`): the pod refuses a forward older than one it
was sent for the job, so a replica that paused past its deadline cannot have
the job admitted after another replica took the forward over (issue 32). Once PLACED, the job's state mirrors its pod's, each pod
transition numbered so it applies once and in order (`follow`). `CellJobs`
holds the cell-side part of that machine:
the claims (`queue_new`, `claim_new`, `claim_queued`; called by the submit
path in cell.py and by forward.py), the placement (`placed`), following a
pod's answer (`follow`), ending a forward without a placement
(`back_to_queue`), and the job calls of the API: get, list, complete, cancel
(ending a job on its pod, or in the cell queue). It also reads records, waits
out a forward in flight (`settled`) and answers a retried submit
(`existing`). Elsewhere, each beside the reason it happens: the repairs after
a failure (recovery.py: take-over, adoption, a job its pod no longer knows),
a queued job that no pod can host any more (admission.py, while planning the
queue) or that asked not to wait (forward.py), and the heartbeat's
transitions (the store's report script).
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import logging
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from lightpath.errors import RELEASED_TO_CELL, Aborted, FailedPrecondition, NotFound
from lightpath.v1 import cell_scheduler_pb2, common_pb2, workload_scheduler_pb2
from lightpath_services.cell_scheduler.choice import CHIPS_SUFFIX, Candidate
from lightpath_services.cell_scheduler.metrics import CellMetrics
from lightpath_services.cell_scheduler.podclient import PodCallError, box_of, state_name
from lightpath_services.cell_scheduler.pods import CACHE_LIMIT, PodDirectory
from lightpath_services.cell_scheduler.quotas import charge_of
from lightpath_services.cell_scheduler.request import Resolved
from lightpath_services.cell_scheduler.store import (
    ENDED,
    FINAL,
    FORWARDING,
    PLACED,
    QUEUED,
    CellJobRecord,
    Conflict,
    QuotaGuard,
    b64,
)

MAX_PLAN_ATTEMPTS = 4
POLL_S = 0.02
# Forwards get this long beyond their own deadline before another replica takes them over.
FORWARD_GRACE_MS = 5_000


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


def request_b64(req: cell_scheduler_pb2.SubmitJobRequest) -> str:
    return b64(req.SerializeToString(deterministic=True))


def record_fields(
    request: str, r: Resolved, cand: Candidate, priority: int, reclaim: Sequence[str] = ()
) -> dict[str, Any]:
    """What a job's record says of where it goes: its request, the spec resolved for
    the pod and the reason the pod was chosen; and, when it went there reclaiming
    quota (issue 35), the jobs it reclaimed from ("rcl") and the blocks per node type
    it gives up at most under its own policy ("rcb"): what the cell's choice never
    counts for those jobs (choice.shielded_blocks). Each placement sets both anew."""
    return {
        "req": request,
        "priority": priority,
        "spec": b64(r.spec.SerializeToString(deterministic=True)),
        "chips": _shape(r.chips),
        "blocks": r.block_count,
        "derived": "1" if r.derived else "0",
        "why": cand.reason,
        **reclaim_fields(r, reclaim),
    }


def reclaim_fields(r: Resolved, reclaim: Sequence[str]) -> dict[str, str]:
    """The record's "rcl" and "rcb" for a job going to a pod reclaiming from `reclaim`
    (none: both "")."""
    return {
        "rcl": json.dumps(sorted(reclaim)) if reclaim else "",
        "rcb": json.dumps(gives_up(r)) if reclaim else "",
    }


def gives_up(r: Resolved) -> dict[str, int]:
    """Blocks per node type a job resolved for a pod gives up at most when preempted
    (as the pod counts it, preemption.max_freeable, but for health: the cell does not
    know it): all of them, a shrinking job those beyond the smallest arrangement it
    accepts, a sub-block slice none (it gives up chips)."""
    if r.sub_block:
        return {}
    blocks = {t: n for t, n in sorted(r.needs.items()) if not t.endswith(CHIPS_SUFFIX) and n}
    if r.spec.preemption_policy != common_pb2.PREEMPTION_POLICY_SHRINK:
        return blocks
    per_block = [c // g for c, g in zip(r.chips, r.grid, strict=True)]
    kept = min(
        (
            math.prod(
                d if r.spec.unit == common_pb2.SHAPE_UNIT_BLOCKS else d // b
                for d, b in zip(s.dims, per_block, strict=True)
            )
            for s in r.spec.shrink_to
        ),
        default=r.block_count,
    )
    freed = r.block_count - kept
    out: dict[str, int] = {}
    for i, (t, n) in enumerate(blocks.items()):  # a shrink frees blocks of its types alike
        out[t] = freed - sum(out.values()) if i == len(blocks) - 1 else freed * n // r.block_count
    return {t: n for t, n in out.items() if n}


@dataclass(frozen=True)
class Claim:
    """A forward this replica holds: its token in the cell (whoever holds it ends the
    forward) and its fencing token at the pod (the cell's forward number)."""

    token: str
    fence: int


class CellJobs:
    def __init__(
        self,
        *,
        pods: PodDirectory,
        instance_id: str,
        forward_timeout_s: float,
        kick: Callable[[], None],
        log: logging.Logger,
        metrics: CellMetrics,
    ):
        self.pods = pods
        self.store = pods.store
        self.instance_id = instance_id
        self.forward_timeout_s = forward_timeout_s
        self._kick = kick
        self.log = log
        self.metrics = metrics
        self._placed: dict[str, str] = {}  # job -> pod, for jobs this replica saw placed

    def new_token(self) -> str:
        """The token of a claim: whoever holds it ends that forward."""
        return f"{self.instance_id}:{uuid.uuid4().hex[:12]}"

    def forward_window_ms(self) -> int:
        return int(self.forward_timeout_s * 1000) + FORWARD_GRACE_MS

    # -- claims: a new job to QUEUED or FORWARDING, a queued one to FORWARDING ---------

    async def queue_new(
        self, job_id: str, request: str, tenant: str, priority: int, reason: str, now_ms: int
    ) -> None:
        """A new job straight into the cell queue (Conflict EXISTS: the id exists already)."""
        await self.store.claim_new(
            job_id,
            fields={"req": request, "priority": priority},
            tenant=tenant,
            pod="",
            needs={},
            token="",
            until_ms=0,
            now_ms=now_ms,
            check_free=False,
            reason=reason,
        )

    async def claim_new(
        self,
        job_id: str,
        request: str,
        tenant: str,
        priority: int,
        r: Resolved,
        cand: Candidate,
        *,
        check_free: bool,
        expect_empty_queue: bool,
        now_ms: int,
        quota: QuotaGuard | None = None,
    ) -> Claim:
        """A new job bound to its first candidate, its blocks held and its chips charged
        to its tenant: the claim. Conflict (store.claim_new): EXISTS, STALE (the
        blocks went to others), WAITING or QUOTA (what the decision knew of its tenant's
        quota, `quota`, changed)."""
        token = self.new_token()
        now = now_ms
        claimed = await self.store.claim_new(
            job_id,
            fields=record_fields(request, r, cand, priority),
            tenant=tenant,
            pod=cand.pod_id,
            needs=r.needs,
            token=token,
            until_ms=now + self.forward_window_ms(),
            now_ms=now,
            check_free=check_free,
            reason=f"forwarding to pod {cand.pod_id}: {cand.reason}",
            expect_empty_queue=expect_empty_queue,
            charge=charge_of(r),
            quota=quota,
        )
        self.pods.assume(cand.pod_id, r.needs, -1)
        return Claim(token, claimed.fence)

    async def claim_queued(
        self,
        job_id: str,
        r: Resolved,
        cand: Candidate,
        *,
        check_free: bool,
        reason: str,
        now_ms: int | None = None,
        request: str = "",
        quota: QuotaGuard | None = None,
        reclaim: Sequence[str] = (),
    ) -> Claim | None:
        """A job in the cell queue bound to a pod, its blocks held and its chips charged:
        the claim, or None when another replica took it (or, with `check_free`,
        the blocks went; with `request`, an update changed the request the decision was
        made for; with `quota`, what the decision knew of its tenant's quota changed).
        The jobs it reclaims from (`reclaim`) are on its record from the claim on, so a
        job found on the pod after a lost answer (adopted) has them too."""
        token = self.new_token()
        now = self.pods.now_ms() if now_ms is None else now_ms
        try:
            fence = await self.store.claim_queued(
                job_id,
                pod=cand.pod_id,
                needs=r.needs,
                token=token,
                until_ms=now + self.forward_window_ms(),
                now_ms=now,
                check_free=check_free,
                reason=reason,
                request=request,
                charge=charge_of(r),
                quota=quota,
                fields=reclaim_fields(r, reclaim),
            )
        except Conflict:  # MOVED, STALE, CHANGED or QUOTA
            return None
        self.pods.assume(cand.pod_id, r.needs, -1)
        return Claim(token, fence)

    async def placed(
        self,
        job_id: str,
        token: str,
        pod: str,
        job: workload_scheduler_pb2.Job,
        fields: Mapping[str, Any],
    ) -> CellJobRecord | None:
        """FORWARDING → PLACED: the pod has the job (its answer to the forward, or to a
        GetJob after a take-over); the record after, or None when the token no longer
        holds the claim."""
        return await self.store.placed(
            job_id,
            token=token,
            pod=pod,
            state=state_name(job.state),
            n=len(job.history),
            reason=job.reason,
            fields={**fields, "box": box_of(job)},
            now_ms=self.pods.now_ms(),
        )

    def remember(self, record: CellJobRecord) -> None:
        """Where a placed job is (a guess: a reclaim may send it back to the cell queue,
        which the pod's answer then says)."""
        if len(self._placed) > CACHE_LIMIT:
            self._placed.clear()
        self._placed[record.job_id] = record.pod

    # == the registry (CS-1) ======================================================

    async def job_record(self, job_id: str) -> CellJobRecord:
        record = await self.store.job(job_id)
        if record is None:
            raise NotFound("job", job_id)
        return record

    async def settled(self, record: CellJobRecord) -> CellJobRecord:
        """The job once no forward of it is in flight (bounded by the forward's deadline)."""
        while record.phase == FORWARDING and self.pods.now_ms() < record.until_ms:
            await asyncio.sleep(POLL_S)
            record = await self.job_record(record.job_id)
        return record

    async def follow(self, record: CellJobRecord, job: workload_scheduler_pb2.Job) -> CellJobRecord:
        """Follow a pod's answer about one of its jobs (GetJob, reconcile)."""
        n = len(job.history)
        if n < record.n:
            return record
        mirrored = await self.store.mirror(
            record.job_id,
            pod=record.pod,
            state=state_name(job.state),
            n=n,
            reason=job.reason,
            now_ms=self.pods.now_ms(),
            box=box_of(job),
        )
        return mirrored.record or record

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
            now_ms=self.pods.now_ms(),
        )

    async def released(self, job_id: str, pod: str, err: PodCallError) -> bool:
        """Whether `err` is the pod's answer that it let the job go back to the cell queue
        (a reclaim delayed it, issue 35); if so the job is queued again now, in case the
        pod's report of it has not done so yet (or its event was lost)."""
        if err.report.reason != RELEASED_TO_CELL:
            return False
        self._placed.pop(job_id, None)
        why = err.report.metadata.get("released_reason", f"pod {pod} let it go")
        if await self.store.requeue_released(
            job_id, pod=pod, reason=why, now_ms=self.pods.now_ms()
        ):
            self.metrics.requeued("reclaimed")
            self._kick()
        return True

    async def existing(
        self, record: CellJobRecord, request_b64: str, *, validate_only: bool = False
    ) -> SubmitResult:
        if record.submitted_b64 != request_b64:
            raise FailedPrecondition(
                f"job {record.job_id}",
                "already exists with a different request; choose a new job id",
                reason="JOB_ID_REUSED",
            )
        if not validate_only:
            record = await self.settled(record)
        view = await self.view(record, refresh=not validate_only)
        return SubmitResult(
            view.record,
            False,
            pod_job=view.pod_job,
            outcome=f"already submitted: {view.record.state}"
            + (f" on pod {view.record.pod}" if view.record.pod else ""),
            queue_position=view.queue_position,
        )

    async def view(
        self, record: CellJobRecord, *, refresh: bool = True, include_rings: bool = False
    ) -> JobView:
        """The job with its pod's view when the pod answers (the mirror follows it)."""
        if record.phase == QUEUED:
            return JobView(record, queue_position=await self.store.queue_position(record.job_id))
        if record.phase != PLACED or not refresh:
            return JobView(record)
        if record.state == "UNKNOWN":
            return JobView(record)  # its pod is marked silent (CS-6): answer at once
        silent = await self.pods.silent_for(record.pod)
        if silent is not None:  # a silent pod is not asked: the cell answers what it knows
            if record.state in FINAL:
                return JobView(record)
            # Silent past the pod timeout, not marked yet: mark it now, as the cell's
            # own pass would (CS-6): its live jobs UNKNOWN, their last state kept.
            now = self.pods.now_ms()
            count = await self.store.mark_down(record.pod, now, self.pods.pod_timeout_ms)
            if count >= 0:
                self.log.warning(
                    "pod %s silent for %.1f s: not chosen; %d job(s) now UNKNOWN",
                    record.pod,
                    silent,
                    count,
                    extra={"pod_id": record.pod},
                )
            return JobView(await self.job_record(record.job_id))
        try:
            job = await self.pods.call(
                record.pod,
                "GetJob",
                workload_scheduler_pb2.GetJobRequest(
                    job_id=record.job_id, include_rings=include_rings
                ),
                timeout=5.0,
            )
        except PodCallError as err:
            if await self.released(record.job_id, record.pod, err):
                return await self.view(await self.job_record(record.job_id))
            return JobView(as_of(record, "its pod did not answer"))
        return JobView(fresh(await self.follow(record, job), job), job)

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
                return await self._with_positions(out), None
        assert before is not None
        more = await self.store.page(index, before_seq=before, count=1)
        return await self._with_positions(out), before if more else None

    async def _with_positions(self, views: list[JobView]) -> list[JobView]:
        """Jobs in the cell queue with their 1-based place in it (CellJob.cell_queue_position)."""
        queued = [v.record.job_id for v in views if v.record.phase == QUEUED]
        if not queued:
            return views
        places = await self.store.queue_positions(queued)
        return [
            JobView(v.record, v.pod_job, places.get(v.record.job_id, 0))
            if v.record.phase == QUEUED
            else v
            for v in views
        ]

    async def complete(self, job_id: str) -> JobView:
        request = workload_scheduler_pb2.CompleteJobRequest(job_id=job_id)
        pod = self._placed.get(job_id) or await self._placed_pod(job_id)
        view = await self._on_pod(job_id, pod, "CompleteJob", request)
        if view is None:  # back in the cell queue (issue 35): as the record now says
            view = await self._on_pod(
                job_id, await self._placed_pod(job_id), "CompleteJob", request
            )
        if view is None:
            raise Aborted(f"job {job_id} is going back to the cell queue; retry", reason="BUSY")
        return view

    async def _placed_pod(self, job_id: str) -> str:
        """The pod of a job that is on one, else why it cannot be completed."""
        record = await self.settled(await self.job_record(job_id))
        if record.phase == PLACED:
            self.remember(record)
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
        if pod and (view := await self._on_pod(job_id, pod, "CancelJob", request)):
            return view
        for _ in range(MAX_PLAN_ATTEMPTS):
            record = await self.settled(await self.job_record(job_id))
            if record.phase == QUEUED:
                try:
                    await self.store.end_queued(
                        job_id,
                        "CANCELLED",
                        "cancelled in the cell queue" + (f": {reason}" if reason else ""),
                        self.pods.now_ms(),
                    )
                except Conflict:  # MOVED on meanwhile
                    continue
                self.log.info("job %s cancelled in the cell queue", job_id)
                return JobView(await self.job_record(job_id))
            if record.phase == ENDED:
                if record.state == "CANCELLED":
                    return JobView(record)
                raise FailedPrecondition(
                    f"job {job_id}", f"already ended: {record.state}", reason="JOB_ENDED"
                )
            if record.phase == PLACED:
                self.remember(record)
                if view := await self._on_pod(job_id, record.pod, "CancelJob", request):
                    return view
        raise Aborted(f"job {job_id} is still being placed; retry", reason="BUSY")

    async def _on_pod(self, job_id: str, pod: str, method: str, request: Any) -> JobView | None:
        """Complete or cancel on the job's pod; the cell follows the answer, and counts the
        blocks the job held as free until the pod reports (then jobs waiting may go). None:
        the pod let the job go back to the cell queue (a reclaim, issue 35), queued again
        now if its report has not done so yet; the caller reads the record again."""
        try:
            job = await self.pods.call(pod, method, request)
        except PodCallError as err:
            if await self.released(job_id, pod, err):
                return None
            raise err.relayed() from None
        mirrored = await self.store.mirror(
            job_id,
            pod=pod,
            state=state_name(job.state),
            n=len(job.history),
            reason=job.reason,
            now_ms=self.pods.now_ms(),
            ended_here=True,
            box=box_of(job),
        )
        record = mirrored.record or await self.job_record(job_id)
        if mirrored.freed:
            self.pods.assume(pod, record.needs, +1)
        if mirrored.queued:
            self._kick()  # blocks were freed and jobs wait in the cell queue
        return JobView(fresh(record, job), job)


def fresh(record: CellJobRecord, job: workload_scheduler_pb2.Job) -> CellJobRecord:
    """What to answer about a placed job its pod has just described: the pod's state,
    even where the cell's record did not follow it (the record was ahead by its count of
    events, or its pod is marked down): the pod's answer is the newest there is, and the
    record catches up with the pod's next report (issue 30: an acknowledgement through
    the other cell replica answered RUNNING for a job the pod had ended)."""
    state = state_name(job.state)
    if record.phase != PLACED or record.state == state or not state:
        return record
    return replace(record, state=state, pod_state=state, reason=job.reason or record.reason)


def as_of(record: CellJobRecord, why: str) -> CellJobRecord:
    """A placed job answered from the cell's record alone: the reason says as of when."""
    if record.phase != PLACED:
        return record
    at = _dt.datetime.fromtimestamp(record.updated_ms / 1000, _dt.UTC)
    note = f"{why}: state as of {at.isoformat(timespec='milliseconds').replace('+00:00', 'Z')}"
    return replace(record, reason=f"{record.reason} ({note})" if record.reason else note)
