"""The submit decision (CS-2, CS-3, CS-4): which pods a job may go to, best first.

`Admission` turns a checked request and a registry snapshot into a `Choice`:
the request is resolved for every registered pod by that pod's own rules (a
shape derived from a compute demand, CS-4; cached per request content and
registration), and the pure planner (choice.plan_queue) orders the pods that
fit now, then the pods that fit by preemption, with the jobs already waiting
in the cell queue at the same or higher priority going first. It also plans
the cell queue itself for the dispatcher (`queued`; a job no pod can host any
more fails there) and answers validate_only submits (`dry_run`, confirmed by
the pod's own dry run). It commits nothing: the claim is the caller's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import replace

from lightpath.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from lightpath.v1 import cell_scheduler_pb2, workload_scheduler_pb2
from lightpath_services.cell_scheduler.choice import (
    Choice,
    JobDemand,
    PodCapacityView,
    plan_queue,
    shielded_blocks,
)
from lightpath_services.cell_scheduler.jobs import SubmitResult, request_b64
from lightpath_services.cell_scheduler.podclient import PodCallError, state_name
from lightpath_services.cell_scheduler.pods import CACHE_LIMIT, PodDirectory
from lightpath_services.cell_scheduler.quotas import (
    NEVER_UNDER_QUOTA,
    QUOTA_ALLOWS,
    RECLAIM_FIELDS,
    WAITING_FOR_QUOTA,
    Queued,
    QuotaState,
    capacity_of,
    charge_of,
    gate,
    reclaimers,
    waits_for_quota,
    within_pod_quotas,
)
from lightpath_services.cell_scheduler.request import (
    PodModel,
    Resolved,
    has_demand,
    no_pod_can_host,
    resolve_all,
    tenant_of,
)
from lightpath_services.cell_scheduler.store import (
    QUEUED,
    CellJobRecord,
    Conflict,
    RegistrySnapshot,
    b64,
    unb64,
)
from lightpath_services.common.admission import RefusalRate

FAIL = workload_scheduler_pb2.WHEN_NO_CAPACITY_FAIL
# When a submit that asked not to wait may try again (google.rpc.RetryInfo): about the
# time a running job takes to end and a pod to report it, jittered so refused callers
# do not all come back at once, and longer the more recent submits found no room (so
# their retries never become most of what the cell serves).
NO_CAPACITY_RETRY_S = 0.25
SUBMITS = RefusalRate()


def resumes(record: CellJobRecord) -> str:
    """What a waiting reason adds for a job a reclaim sent back from its pod (issue 35)."""
    if not record.reclaimed:
        return ""
    return "; a reclaim sent it back from its pod: it resumes from its checkpoint when placed"


HELD_FOR_OWNER = (
    "held for a tenant's job within its nominal quota that no pod could make room for: "
    "jobs that would borrow quota wait for other pods meanwhile"
)


def without_pod(demand: JobDemand, pod: str) -> JobDemand:
    """`demand` with `pod` taken out of the pods that could host it ("": as it is)."""
    if not pod or pod not in demand.needs:
        return demand
    return replace(demand, needs={p: n for p, n in demand.needs.items() if p != pod})


def no_capacity_delay() -> float:
    SUBMITS.record(True)
    return SUBMITS.delay(NO_CAPACITY_RETRY_S)


class Admission:
    def __init__(self, *, pods: PodDirectory, node_flops: Mapping[str, float], log: logging.Logger):
        self.pods = pods
        self.store = pods.store
        self.node_flops = dict(node_flops)
        self.log = log
        self._requests: dict[tuple[str, str], cell_scheduler_pb2.SubmitJobRequest] = {}
        self._resolved: dict[tuple[bytes, str, str], Resolved | InvalidArgument] = {}

    async def plan(
        self, req: cell_scheduler_pb2.SubmitJobRequest, snap: RegistrySnapshot, now: int
    ) -> tuple[dict[str, Resolved], Choice, dict[str, PodCapacityView], int]:
        models = self.pods.models_of(snap)
        if not models:
            raise FailedPrecondition(
                "cell", "no superpod has registered with the cell yet", reason="NO_PODS"
            )
        job_id = req.spec.job_id
        if req.preferred_pod and req.preferred_pod not in models:
            raise InvalidArgument(
                "preferred_pod",
                f"no pod {req.preferred_pod!r} is registered; the cell has "
                + ", ".join(sorted(models)),
                reason="UNKNOWN_POD",
            )
        resolved, bad = self.resolve(job_id, req, models, snap.registrations, now)
        resolved, bad = only_preferred(req, resolved, bad)
        if not resolved:
            raise no_pod_can_host(bad)
        priority = next(iter(resolved.values())).priority
        views = self.pods.views_of(snap, now)
        state = QuotaState.of(snap.quotas)
        tenant = tenant_of(req)
        on_pods, pods_full = within_pod_quotas(tenant, resolved, state)
        demand = JobDemand(
            job_id,
            priority,
            {p: r.needs for p, r in (on_pods or resolved).items()},
            preferred=req.preferred_pod,
        )
        # one that would borrow stays off the pod held for an owner's job (quota.Hold)
        kept_out = state.keeps_out(job_id, tenant, charge_of(next(iter(resolved.values()))))
        demand = without_pod(demand, kept_out)
        ahead: list[JobDemand] = []
        if snap.queue:
            queued, _ = await self.queued(snap, models, now)
            ahead = [d for d in queued if d.priority >= priority]
        _, choice = plan_queue([*ahead, demand], views.values())[-1]
        if kept_out:
            choice = replace(choice, not_now={**choice.not_now, kept_out: HELD_FOR_OWNER})
        if pods_full:
            choice = Choice((), choice.not_now, held_back=WAITING_FOR_QUOTA + pods_full)
        elif tenant in state.quotas:
            need = charge_of(
                resolved[choice.candidates[0].pod_id]
                if choice.candidates
                else next(iter(resolved.values()))
            )
            book = state.book()
            verdict = book.check(tenant, need)
            if not verdict.ok:
                never = book.never_fits(tenant, need)
                why = (NEVER_UNDER_QUOTA + never) if never else WAITING_FOR_QUOTA + verdict.reason
                choice = Choice((), choice.not_now, held_back=why)
        return resolved, choice, views, priority

    async def queued(
        self,
        snap: RegistrySnapshot,
        models: Mapping[str, PodModel],
        now: int,
        *,
        own_forward_ms: int | None = None,
    ) -> tuple[list[JobDemand], dict[str, tuple[cell_scheduler_pb2.SubmitJobRequest, dict]]]:
        """The cell queue in order as planning demands; jobs no pod can host any more
        (a deadline that passed while waiting) fail. A job that asked not to wait is no
        demand: it is in the queue only between a pod's refusal and its own submit's
        next candidate or refusal, which decide (issue 30: forwarded from the queue
        meanwhile, it was placed while its caller was told "not placed, nothing kept",
        and held blocks nobody would end). The dispatcher passes `own_forward_ms`: one
        left there longer (its replica died mid-forward) is refused then."""
        demands: list[JobDemand] = []
        details: dict[str, tuple[cell_scheduler_pb2.SubmitJobRequest, dict]] = {}
        gated: list[Queued] = []
        records: dict[str, CellJobRecord] = {}
        state = QuotaState.of(snap.quotas)
        pod_waits: dict[str, str] = {}  # held back on every pod by its quotas there
        for record in await self.store.jobs(snap.queue):
            if record.phase != QUEUED:
                continue
            req = self.request_of(record)
            # (A job a reclaim sent back from its pod was admitted once: it waits like any.)
            if req.spec.when_no_capacity == FAIL and not record.reclaimed:
                if own_forward_ms is not None and now - record.updated_ms >= own_forward_ms:
                    with contextlib.suppress(Conflict):  # moved on meanwhile
                        await self.store.end_queued(
                            record.job_id,
                            "FAILED",
                            "refused (asked not to wait): its forward did not finish",
                            now,
                            forget=True,
                        )
                continue
            resolved, bad = self.resolve(record.job_id, req, models, snap.registrations, now)
            resolved, bad = only_preferred(req, resolved, bad)
            if not resolved:
                err = no_pod_can_host(bad) if bad else _gone(req.preferred_pod)
                with contextlib.suppress(Conflict):  # moved on meanwhile
                    await self.store.end_queued(
                        record.job_id, "FAILED", f"no pod can host it any more: {err.message}", now
                    )
                self.log.warning("job %s failed in the cell queue: %s", record.job_id, err.message)
                continue
            resolved, pods_full = within_pod_quotas(record.tenant, resolved, state)
            if pods_full:
                pod_waits[record.job_id] = WAITING_FOR_QUOTA + pods_full
                records[record.job_id] = record
                continue
            demands.append(
                JobDemand(
                    record.job_id,
                    record.priority,
                    {p: r.needs for p, r in resolved.items()},
                    record.refused,
                    preferred=req.preferred_pod,
                )
            )
            details[record.job_id] = (req, resolved)
            records[record.job_id] = record
            gated.append(
                Queued(
                    record.job_id,
                    record.tenant,
                    record.priority,
                    record.seq,
                    charge_of(next(iter(resolved.values()))),
                )
            )
        demands = await self._shielded(demands, records, models)
        if state.hold is not None:  # jobs that would borrow stay off the held pod
            charges = {g.job_id: g.chips for g in gated}
            demands = [
                without_pod(
                    d, state.keeps_out(d.job_id, records[d.job_id].tenant, charges[d.job_id])
                )
                for d in demands
            ]
        admit, waits = gate(gated, state, capacity_of(models.values()), now)
        waits.update(pod_waits)
        for job_id, why in waits.items():
            why += resumes(records[job_id])
            if records[job_id].reason != why:
                await self.store.waiting_reason(job_id, why, now)
        for job_id in admit:  # no longer held back by its quota: it says so
            if waits_for_quota(records[job_id].reason):
                await self.store.waiting_reason(
                    job_id, QUOTA_ALLOWS + resumes(records[job_id]), now
                )
        if not state.active:
            return demands, details
        by_id = {d.job_id: d for d in demands}
        return [by_id[j] for j in admit], details

    async def _shielded(
        self,
        demands: list[JobDemand],
        records: Mapping[str, CellJobRecord],
        models: Mapping[str, PodModel],
    ) -> list[JobDemand]:
        """The demands with what the jobs that reclaimed quota from them hold (issue 35:
        never given to them, so the cell forwards none of them where only those would
        make room). Only a job a reclaim sent back can be one's: for none, no read."""
        if not any(records[d.job_id].reclaimed for d in demands):
            return demands
        live = await self.store.live_fields(sorted(models), RECLAIM_FIELDS)
        holders = reclaimers(live)
        if not holders:
            return demands
        return [
            replace(d, shielded=shielded_blocks(d.job_id, d.priority, holders))
            if records[d.job_id].reclaimed
            else d
            for d in demands
        ]

    def request_of(self, record: CellJobRecord) -> cell_scheduler_pb2.SubmitJobRequest:
        key = (record.job_id, record.request_b64)
        req = self._requests.get(key)
        if req is None:
            req = cell_scheduler_pb2.SubmitJobRequest.FromString(unb64(record.request_b64))
            if len(self._requests) > CACHE_LIMIT:
                self._requests.clear()
            self._requests[key] = req
        return req

    def resolve(
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

    async def dry_run(
        self,
        req: cell_scheduler_pb2.SubmitJobRequest,
        resolved: Mapping[str, Resolved],
        choice: Choice,
        snap: RegistrySnapshot,
    ) -> SubmitResult:
        """validate_only: what would happen, confirmed by the pod's own dry run."""
        now = self.pods.now_ms()
        job_id = req.spec.job_id
        record = CellJobRecord(
            job_id=job_id,
            request_b64=request_b64(req),
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
                resp = await self.pods.call(
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
                retry_delay_s=no_capacity_delay(),
            )
        ahead = sum(1 for j in await self.store.jobs(snap.queue) if j.priority >= record.priority)
        return SubmitResult(
            record,
            True,
            outcome=f"would wait in the cell queue at position {ahead + 1}: {choice.why_waiting}",
            queue_position=ahead + 1,
        )


def only_preferred(
    req: cell_scheduler_pb2.SubmitJobRequest,
    resolved: dict[str, Resolved],
    bad: dict[str, InvalidArgument],
) -> tuple[dict[str, Resolved], dict[str, InvalidArgument]]:
    """With `require_preferred_pod`, the preferred pod alone (resolved, or why it could
    never host the job); otherwise every pod."""
    if not req.require_preferred_pod:
        return resolved, bad
    pod = req.preferred_pod
    return (
        {p: r for p, r in resolved.items() if p == pod},
        {p: e for p, e in bad.items() if p == pod},
    )


def _gone(pod: str) -> InvalidArgument:
    return InvalidArgument(
        "preferred_pod", f"pod {pod!r}, which the job requires, is no longer registered"
    )
