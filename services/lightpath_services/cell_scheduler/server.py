"""gRPC servicer of cell_scheduler: protobuf <-> domain, errors -> status (via the runtime)."""

from __future__ import annotations

import re

from google.protobuf.timestamp_pb2 import Timestamp
from opentelemetry import trace

from lightpath.errors import FieldViolation, InvalidArgument, NotFound, PermissionDenied
from lightpath.security.identity import NO_TENANT
from lightpath.v1 import cell_scheduler_pb2, cell_scheduler_pb2_grpc, common_pb2
from lightpath_services.cell_scheduler.admission import SUBMITS
from lightpath_services.cell_scheduler.cell import CellScheduler
from lightpath_services.cell_scheduler.jobs import JobView
from lightpath_services.cell_scheduler.metrics import CellMetrics
from lightpath_services.cell_scheduler.podclient import PodClients
from lightpath_services.cell_scheduler.quotas import hold_pb
from lightpath_services.cell_scheduler.request import has_demand
from lightpath_services.cell_scheduler.settings import CellSchedulerSettings, node_flops
from lightpath_services.cell_scheduler.store import CellStore
from lightpath_services.cell_scheduler.watch import watch_job, watch_pod
from lightpath_services.common import paging, validate
from lightpath_services.common.auth import require_service_scope, require_tenant_field, tenant_scope
from lightpath_services.common.enums import enum_name
from lightpath_services.common.keys import ID_RULE, is_valid_id, require_ids
from lightpath_services.common.server import Runtime, ServiceDefinition

SERVICE_NAME = cell_scheduler_pb2.DESCRIPTOR.services_by_name["CellScheduler"].full_name


def _ts(ms: int) -> Timestamp:
    t = Timestamp()
    t.FromMilliseconds(int(ms))
    return t


def _note(**attrs) -> None:
    span = trace.get_current_span()
    for k, v in attrs.items():
        span.set_attribute(f"lightpath.{k}", v)


def cell_job_pb(cell: CellScheduler, view: JobView) -> cell_scheduler_pb2.CellJob:
    r = view.record
    req = cell.admission.request_of(r)
    out = cell_scheduler_pb2.CellJob(
        job_id=r.job_id,
        tenant=r.tenant,
        state=common_pb2.JobState.Value("JOB_STATE_" + r.state),
        reason=r.reason,
        pod_id=r.pod,
        priority=r.priority,
        spec=req.spec,
        chips=common_pb2.Shape(dims=r.chips),
        block_count=r.block_count,
        shape_derived=r.derived,
        cell_queue_position=view.queue_position,
        placement_reason=r.why,
        created_at=_ts(r.created_ms),
        updated_at=_ts(r.updated_ms),
    )
    if r.state == "UNKNOWN" and r.pod_state and r.pod_state != "UNKNOWN":
        out.last_known_state = common_pb2.JobState.Value("JOB_STATE_" + r.pod_state)
    if not r.chips and req.spec.unit != common_pb2.SHAPE_UNIT_BLOCKS:
        out.chips.dims.extend(req.spec.shape.dims)  # waiting in the cell: the shape asked for
    if has_demand(req):
        out.demand.CopyFrom(req.demand)
    if view.pod_job is not None:
        out.pod_job.CopyFrom(view.pod_job)
    return out


_STREAM_ID = re.compile(r"^[0-9]{1,17}(-[0-9]{1,10})?\Z")
_STREAM_RULE = "must be a Redis stream id such as 1700000000000-0"


def _check_report(request: cell_scheduler_pb2.ReportPodStatusRequest) -> None:
    """A pod's report names stream positions, jobs and states; refuse a malformed one whole."""
    bad: list[FieldViolation] = []
    for field, value in (
        ("events_after", request.events_after),
        ("events_until", request.events_until),
        ("capacity.version", request.capacity.version),
    ):
        if value and not _STREAM_ID.match(value):
            bad.append(FieldViolation(field, _STREAM_RULE))
    _check_time(bad, validate.present(request.capacity, "at"), "capacity.at")
    for i, t in enumerate(request.transitions):
        at = f"transitions[{i}]"
        if not _STREAM_ID.match(t.stream_id):
            bad.append(FieldViolation(f"{at}.stream_id", _STREAM_RULE))
        if not is_valid_id(t.event.job_id):
            bad.append(FieldViolation(f"{at}.event.job_id", ID_RULE))
        if t.event.to_state not in _STATES or t.event.to_state == common_pb2.JOB_STATE_UNSPECIFIED:
            bad.append(FieldViolation(f"{at}.event.to_state", "must be a defined job state"))
        if t.event.from_state not in _STATES:
            bad.append(
                FieldViolation(f"{at}.event.from_state", "must be a defined job state or unset")
            )
        _check_time(bad, validate.present(t.event, "at"), f"{at}.event.at")
    if bad:
        raise InvalidArgument.of(bad)


_STATES = frozenset(common_pb2.JobState.values())


def _check_time(bad: list[FieldViolation], ts: Timestamp | None, field: str) -> None:
    try:
        validate.timestamp(ts, field)
    except InvalidArgument as err:
        bad.extend(err.violations)


class CellSchedulerServicer(cell_scheduler_pb2_grpc.CellSchedulerServicer):
    def __init__(self, runtime: Runtime[CellSchedulerSettings], cell: CellScheduler):
        self._rt = runtime
        self._cell = cell

    async def GetInfo(self, request, context) -> common_pb2.ServiceInfo:
        return self._rt.info(
            SERVICE_NAME,
            pod_timeout_s=str(self._rt.settings.pod_timeout_s),
            node_flops=self._rt.settings.node_flops,
        )

    async def _own_job(self, job_id: str) -> None:
        """A tenant may touch only its own jobs; another tenant's is NOT_FOUND to it."""
        own = tenant_scope()
        if own is None:
            return
        record = await self._cell.store.job(job_id)
        if record is None or record.tenant != own:
            raise NotFound("job", job_id)

    async def SubmitJob(self, request, context) -> cell_scheduler_pb2.SubmitJobResponse:
        own = tenant_scope()
        if own is not None:
            # The tenant of a job comes from the credential, never from the request.
            request.tenant = require_tenant_field(request.tenant)
            if request.spec.job_id and is_valid_id(request.spec.job_id):
                existing = await self._cell.store.job(request.spec.job_id)
                if existing is not None and existing.tenant != own:
                    # Ids are the cell's, not a tenant's: the id cannot be used, and the
                    # answer says no more (not whose it is, nor what it is: issue 30).
                    raise PermissionDenied(
                        f"job id {request.spec.job_id!r} cannot be used; choose another",
                        reason="ID_UNAVAILABLE",
                    )
        _note(job_id=request.spec.job_id, tenant=request.tenant or NO_TENANT)
        result = await self._cell.submit(request)
        SUBMITS.record(False)  # (refusals are counted where they are made)
        _note(pod_id=result.record.pod, state=result.record.state, created=result.created)
        return cell_scheduler_pb2.SubmitJobResponse(
            job=cell_job_pb(
                self._cell, JobView(result.record, result.pod_job, result.queue_position)
            ),
            created=result.created,
            preempted=result.preempted,
            outcome=result.outcome,
        )

    async def GetJob(self, request, context) -> cell_scheduler_pb2.CellJob:
        require_ids(job_id=request.job_id)
        _note(job_id=request.job_id)
        await self._own_job(request.job_id)
        return cell_job_pb(
            self._cell,
            await self._cell.jobs.get(request.job_id, include_rings=request.include_rings),
        )

    async def ListJobs(self, request, context) -> cell_scheduler_pb2.ListCellJobsResponse:
        require_ids(
            **{k: v for k, v in (("tenant", request.tenant), ("pod_id", request.pod_id)) if v}
        )
        tenant = require_tenant_field(request.tenant)
        size = paging.page_size(request.page_size)
        before = paging.token_int(request.page_token)
        states = {
            enum_name(common_pb2.JobState, s, f"states[{i}]", "JOB_STATE_")
            for i, s in enumerate(request.states)
        }
        views, more = await self._cell.jobs.list_jobs(
            tenant=tenant,
            states=states,
            pod_id=request.pod_id,
            page_size=size,
            before_seq=before,
        )
        return cell_scheduler_pb2.ListCellJobsResponse(
            jobs=[cell_job_pb(self._cell, v) for v in views],
            next_page_token=paging.page_token(more) if more is not None else "",
        )

    async def CompleteJob(self, request, context) -> cell_scheduler_pb2.CellJob:
        require_ids(job_id=request.job_id)
        _note(job_id=request.job_id)
        await self._own_job(request.job_id)
        return cell_job_pb(self._cell, await self._cell.jobs.complete(request.job_id))

    async def CancelJob(self, request, context) -> cell_scheduler_pb2.CellJob:
        require_ids(job_id=request.job_id)
        _note(job_id=request.job_id)
        await self._own_job(request.job_id)
        return cell_job_pb(self._cell, await self._cell.jobs.cancel(request.job_id, request.reason))

    async def UpdateJob(self, request, context) -> cell_scheduler_pb2.CellJob:
        require_ids(**{"spec.job_id": request.spec.job_id})
        _note(job_id=request.spec.job_id)
        await self._own_job(request.spec.job_id)
        view = await self._cell.updates.update(request.spec, list(request.update_mask.paths))
        return cell_job_pb(self._cell, view)

    async def WatchJob(self, request, context):
        require_ids(job_id=request.job_id)
        _note(job_id=request.job_id)
        await self._own_job(request.job_id)
        async for event in watch_job(self._cell.jobs, self._cell.events, request.job_id):
            yield event

    async def ReportBlockHealth(self, request, context):
        if request.health not in (common_pb2.BLOCK_HEALTH_HEALTHY, common_pb2.BLOCK_HEALTH_FAILED):
            raise InvalidArgument("health", "must be HEALTHY (recovered) or FAILED")
        require_ids(pod_id=request.pod_id)
        host = request.host if request.HasField("host") else None
        _note(pod_id=request.pod_id, block=request.block_id)
        if host is not None:
            _note(host=host)
        return await self._cell.report_block_health(
            request.pod_id, request.block_id, request.health, request.reason, host
        )

    async def ListPods(self, request, context) -> cell_scheduler_pb2.ListPodsResponse:
        return cell_scheduler_pb2.ListPodsResponse(pods=await self._cell.list_pods())

    async def GetPod(self, request, context) -> cell_scheduler_pb2.Pod:
        require_ids(pod_id=request.pod_id)
        _note(pod_id=request.pod_id)
        return await self._cell.pod_info(request.pod_id, include_view=request.include_view)

    async def WatchPod(self, request, context):
        require_ids(pod_id=request.pod_id)
        _note(pod_id=request.pod_id)
        async for event in watch_pod(self._cell.pods, request.pod_id):
            yield event

    async def RegisterPod(self, request, context) -> cell_scheduler_pb2.Pod:
        _note(pod_id=request.pod.pod_id)
        require_service_scope("workload_scheduler", request.pod.pod_id, "pod")
        if request.pod.events_tip and not _STREAM_ID.match(request.pod.events_tip):
            raise InvalidArgument("pod.events_tip", _STREAM_RULE)
        return await self._cell.register(request.pod)

    async def SetQuota(self, request, context) -> cell_scheduler_pb2.TenantQuota:
        _note(tenant=request.quota.tenant)
        return await self._cell.set_quota(request.quota)

    async def DeleteQuota(self, request, context) -> cell_scheduler_pb2.DeleteQuotaResponse:
        require_ids(tenant=request.tenant)
        if request.pod:
            require_ids(pod=request.pod)
        _note(tenant=request.tenant)
        return cell_scheduler_pb2.DeleteQuotaResponse(
            deleted=await self._cell.delete_quota(request.tenant, request.pod)
        )

    async def ListQuotas(self, request, context) -> cell_scheduler_pb2.ListQuotasResponse:
        if request.tenant:
            require_ids(tenant=request.tenant)
        # A tenant sees its own row only: no other tenant's name reaches it.
        tenant = require_tenant_field(request.tenant)
        rows, hold = await self._cell.quota_view(tenant)
        resp = cell_scheduler_pb2.ListQuotasResponse(quotas=rows)
        if hold is not None:  # whose job it is held for: an operator's or that tenant's
            resp.hold.CopyFrom(hold_pb(hold, tenant_scope()))
        return resp

    async def ReportPodStatus(self, request, context) -> cell_scheduler_pb2.ReportPodStatusResponse:
        require_ids(pod_id=request.pod_id)
        require_service_scope("workload_scheduler", request.pod_id, "pod")
        _check_report(request)
        _note(pod_id=request.pod_id, transitions=len(request.transitions))
        return await self._cell.report(request)


async def build(
    runtime: Runtime[CellSchedulerSettings], *, metrics: CellMetrics | None = None
) -> list[ServiceDefinition]:
    settings = runtime.settings
    metrics = metrics or CellMetrics()
    pods = PodClients(runtime.tracer_provider, runtime.credentials)
    runtime.on_stop(pods.close)
    cell = CellScheduler(
        store=CellStore(runtime.redis),
        pods=pods,
        node_flops=node_flops(settings.node_flops),
        instance_id=runtime.instance_id,
        pod_timeout_s=settings.pod_timeout_s,
        forward_timeout_s=settings.forward_timeout_s,
        spawn=runtime.spawn,
        log=runtime.log,
        metrics=metrics,
    )
    runtime.supervise(lambda: cell.run(settings.reconcile_s), "cell reconcile")
    runtime.supervise(lambda: metrics.run(cell.pods), "cell metrics", needed=False)
    runtime.supervise(cell.events.run, "cell event stream reader", forever=True)
    servicer = CellSchedulerServicer(runtime, cell)
    return [
        ServiceDefinition(
            SERVICE_NAME, servicer, cell_scheduler_pb2_grpc.add_CellSchedulerServicer_to_server
        )
    ]
