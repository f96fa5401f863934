"""gRPC servicer of workload_scheduler: protobuf <-> domain, errors -> status (via the runtime).

At start the scheduler asks its pod's ocs_manager for the fabric (GetFabric,
retried until it answers): the block count, block shape and K come from there,
the node type of each block from LIGHTPATH_BLOCK_TYPES. Until then the server
is up (health, GetInfo, PlanRings in chips) and the pod's RPCs answer
UNAVAILABLE naming the ocs_manager it waits for.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
from typing import Any

from opentelemetry import trace

from lightpath.domain.blocks import (
    PodFabric,
    block_types_for,
    host_shape_error,
    parse_block_types,
)
from lightpath.domain.job_update import RESERVED_LABELS, parse_update
from lightpath.domain.jobs import (
    POLICY_ENUM,
    chips_of,
    degrees_of,
    normalize,
    to_grid,
)
from lightpath.domain.rings import plan_rings
from lightpath.domain.slices import (
    HOLDING_STATES,
    QUEUED_STATES,
    SUB_BLOCK_OWNER,
    SliceJob,
    grid_positions,
)
from lightpath.domain.switched import SwitchedFabricConfig, build_fabric
from lightpath.errors import FailedPrecondition, InvalidArgument, LightpathError, Unavailable
from lightpath.security.identity import service_principal
from lightpath.v1 import common_pb2, workload_scheduler_pb2, workload_scheduler_pb2_grpc
from lightpath_services.common import paging
from lightpath_services.common.convert import job_event_pb, timestamp
from lightpath_services.common.enums import enum_name
from lightpath_services.common.keys import require_id, require_ids
from lightpath_services.common.server import Runtime, ServiceDefinition
from lightpath_services.workload_scheduler.cell_link import CellReporter
from lightpath_services.workload_scheduler.fabric_kinds import (
    FabricPlanner,
    planner_for,
    ring_plan_pb,
)
from lightpath_services.workload_scheduler.metrics import PodMetrics
from lightpath_services.workload_scheduler.ocs import OcsError, OcsManagerClient
from lightpath_services.workload_scheduler.placement import PodState
from lightpath_services.workload_scheduler.scheduler import (
    Outcome,
    PodContext,
    WorkloadScheduler,
    job_not_found,
)
from lightpath_services.workload_scheduler.settings import WorkloadSchedulerSettings
from lightpath_services.workload_scheduler.store import JobRecord, PodStore
from lightpath_services.workload_scheduler.switched_placement import reserved_small_groups

SERVICE_NAME = workload_scheduler_pb2.DESCRIPTOR.services_by_name["WorkloadScheduler"].full_name
READY_WAIT_S = 5.0
# PlanRings builds a ring through every chip of the shape it is given: bounded so that
# a request cannot make it exhaust the process (64 blocks of 4x4x4 are 4096 chips).
MAX_PLAN_CHIPS = 1 << 16
MAX_PLAN_DIMS = 8


class PodHandle:
    """The scheduler of this pod once the fabric is known (see module doc)."""

    def __init__(
        self,
        runtime: Runtime[WorkloadSchedulerSettings],
        ocs: OcsManagerClient,
        metrics: PodMetrics | None = None,
    ):
        self._rt = runtime
        self._ocs = ocs
        self.metrics = metrics
        self._ready = asyncio.Event()
        self.scheduler: WorkloadScheduler | None = None
        self.problem = f"waiting for the fabric from the ocs_manager at {runtime.settings.ocs_addr}"
        self._fatal: LightpathError | None = None

    async def start(self) -> None:
        settings = self._rt.settings
        entries = parse_block_types(settings.block_types)
        delay, attempts = 0.1, 0
        while True:
            try:
                info = await self._ocs.fabric()
                break
            except OcsError as err:
                attempts += 1
                self.problem = (
                    f"waiting for the fabric from the ocs_manager at {settings.ocs_addr}: {err}"
                )
                if attempts == 1 or attempts % 20 == 0:
                    self._rt.log.warning("%s (attempt %d)", self.problem, attempts)
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)
        try:
            types = block_types_for(entries, info.block_count)
        except FailedPrecondition as err:
            return self._refuse(err)
        # What differs by the fabric's kind is chosen here, once (fabric_kinds.py).
        switched = None
        small: frozenset[int] = frozenset()
        host_shape = settings.host_shape
        ocs = self._ocs
        if info.kind == "SWITCHED":
            try:
                switched = build_fabric(SwitchedFabricConfig.parse(info.switched_spec))
                small = reserved_small_groups(switched, settings.switched_small_groups)
            except InvalidArgument as err:
                return self._refuse(
                    FailedPrecondition(
                        "LIGHTPATH_SWITCHED_SMALL_GROUPS", err.message, reason="BAD_SMALL_GROUPS"
                    )
                )
            host_shape = tuple(info.block_shape)  # one host per group
            ocs = self._ocs.for_rings()
        elif len(host_shape) != len(info.block_shape):
            host_shape = tuple(info.block_shape)  # one host per block
        elif why := host_shape_error(host_shape, info.block_shape):
            return self._refuse(
                FailedPrecondition("LIGHTPATH_HOST_SHAPE", why, reason="BAD_HOST_SHAPE")
            )
        fabric = PodFabric(
            settings.pod_id,
            info.block_shape,
            types,
            info.ocs_per_axis,
            info.first_end_group,
            switched=switched,
            small_groups=small,
            host_shape=host_shape,
        )
        store = PodStore(self._rt.redis, settings.pod_id)
        await store.save_fabric(
            fabric,
            {
                "block_shape": "x".join(map(str, fabric.block_shape)),
                "block_count": str(fabric.block_count),
                "ocs_per_axis": str(fabric.ocs_per_axis),
                "fabric_kind": fabric.kind,
            },
        )
        # The indexes follow every commit; derive them once in case an older version
        # (or a Redis that lost them) left none or stale ones.
        await store.rebuild_indexes(fabric)
        self.scheduler = WorkloadScheduler(
            PodContext(
                store=store,
                ocs=ocs,
                fabric=fabric,
                planner=planner_for(fabric),
                wiring_timeout_s=settings.wiring_timeout_s,
                age_bound_s=settings.age_bound_s,
                spawn=self._rt.spawn,
                log=self._rt.log,
                metrics=self.metrics,
            )
        )
        self._rt.log.info("pod %s ready: %s", settings.pod_id, fabric.describe())
        self._ready.set()
        scheduler = self.scheduler
        self._rt.supervise(lambda: scheduler.run_reconciler(settings.reconcile_s), "reconcile")

    def _refuse(self, err: FailedPrecondition) -> None:
        """A bad configuration: the pod's RPCs answer it until the process restarts."""
        self._fatal = err
        self.problem = err.message
        self._rt.log.critical("bad configuration: %s", err.message)
        self._ready.set()

    async def started(self) -> WorkloadScheduler:
        """The scheduler once the fabric is known; after a bad configuration, never."""
        await self._ready.wait()
        while self.scheduler is None:
            await asyncio.Event().wait()  # the operator must fix and restart the process
        return self.scheduler

    async def get(self) -> WorkloadScheduler:
        if self.scheduler is None and self._fatal is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), READY_WAIT_S)
        if self._fatal is not None:
            raise self._fatal
        if self.scheduler is None:
            raise Unavailable(self.problem, reason="FABRIC_UNKNOWN")
        return self.scheduler


# -- protobuf <-> domain ---------------------------------------------------------


def preemption_pb(v: dict[str, Any]) -> workload_scheduler_pb2.Preemption:
    return workload_scheduler_pb2.Preemption(
        job_id=v["job"],
        action=POLICY_ENUM[v["action"]],  # type: ignore[arg-type]
        blocks_taken=v["blocks"],
        shrunk_to=common_pb2.Shape(dims=v["grid"]),
        victim_priority=v["priority"],
    )


def job_pb(
    record: JobRecord,
    planner: FabricPlanner,
    fabric: PodFabric,
    *,
    with_history: bool = True,
    queue_position: int = 0,
    include_rings: bool = False,
) -> workload_scheduler_pb2.Job:
    job = record.summary
    spec = workload_scheduler_pb2.JobSpec.FromString(base64.b64decode(record.spec_b64))
    out = workload_scheduler_pb2.Job(
        job_id=record.job_id,
        pod_id=fabric.pod_id,
        state=common_pb2.JobState.Value("JOB_STATE_" + record.state),
        reason=record.reason,
        spec=spec,
        priority=job.priority,
        grid=common_pb2.Shape(dims=job.demand.grid),
        wrap=list(job.demand.wrap),
        created_at=timestamp(record.created_ms),
        updated_at=timestamp(record.updated_ms),
        queue_position=queue_position,
    )
    if record.state in HOLDING_STATES and job.placement:
        for pos, block, node_type in zip(
            grid_positions(job.demand.grid), job.placement, job.demand.node_types, strict=True
        ):
            out.blocks.append(
                workload_scheduler_pb2.SliceBlock(
                    position=common_pb2.Coordinate(coords=pos), block_id=block, node_type=node_type
                )
            )
        if job.offset is not None and job.demand.box is not None:
            out.box.CopyFrom(chip_box_pb(job.job_id, job.placement[0], job.offset, job.demand.box))
    if with_history:
        out.history.extend(job_event_pb(e, fabric.pod_id) for e in record.history)
    holding = record.state in HOLDING_STATES
    planner.job_view(out, job, spec, holding=holding, include_rings=include_rings)
    return out


def chip_box_pb(
    job_id: str, block: int, offset: tuple[int, ...], box: tuple[int, ...]
) -> workload_scheduler_pb2.ChipBox:
    return workload_scheduler_pb2.ChipBox(
        block_id=block,
        offset=common_pb2.Coordinate(coords=offset),
        chips=common_pb2.Shape(dims=box),
        job_id=job_id,
    )


def queue_position(state: PodState, job_id: str) -> int:
    ids = [j.job_id for j in state.queue()]
    return ids.index(job_id) + 1 if job_id in ids else 0


def _note(**attrs: Any) -> None:
    span = trace.get_current_span()
    for k, v in attrs.items():
        span.set_attribute(f"lightpath.{k}", v)


class WorkloadSchedulerServicer(workload_scheduler_pb2_grpc.WorkloadSchedulerServicer):
    def __init__(self, runtime: Runtime[WorkloadSchedulerSettings], pod: PodHandle):
        self._rt = runtime
        self._settings = runtime.settings
        self._pod = pod

    async def GetInfo(self, request: common_pb2.GetInfoRequest, context) -> common_pb2.ServiceInfo:
        sched = self._pod.scheduler
        return self._rt.info(
            SERVICE_NAME,
            pod_id=self._settings.pod_id,
            ocs_manager=self._settings.ocs_addr,
            fabric=sched.fabric.describe() if sched else self._pod.problem,
            # for the cell's registry (CS-1): OCS_TORUS or SWITCHED, once the fabric is known
            fabric_kind=sched.fabric.kind if sched else "",
        )

    async def _job_pb(
        self, sched: WorkloadScheduler, record: JobRecord, *, include_rings: bool = False
    ) -> workload_scheduler_pb2.Job:
        position = 0
        if record.state in QUEUED_STATES:
            position = queue_position(await sched.snapshot(), record.job_id)
        out = job_pb(
            record,
            sched.planner,
            sched.fabric,
            queue_position=position,
            include_rings=include_rings,
        )
        if include_rings and record.state in HOLDING_STATES:
            await sched.planner.add_rings(out, record.job_id, sched.ocs)
        return out

    async def AdmitJob(
        self, request: workload_scheduler_pb2.AdmitJobRequest, context
    ) -> workload_scheduler_pb2.AdmitJobResponse:
        sched = await self._pod.get()
        norm = normalize(request.spec, sched.fabric)
        _note(job_id=norm.job_id, priority=norm.priority, blocks=norm.demand.block_count)
        require_ids(**{f"reclaim[{i}]": j for i, j in enumerate(request.reclaim)})
        result = await sched.admit(
            request.spec,
            norm,
            validate_only=request.validate_only,
            reclaim=frozenset(request.reclaim) if request.reclaim else None,
            forward_token=request.forward_token,
        )
        job = await self._job_pb(sched, result.record)
        if norm.rings is not None and result.record.summary.demand.grid == norm.demand.grid:
            job.rings.CopyFrom(ring_plan_pb(norm.rings))
        _note(state=result.record.state, created=result.created)
        return workload_scheduler_pb2.AdmitJobResponse(
            job=job,
            created=result.created,
            preempted=[preemption_pb(v) for v in result.preempted],
            outcome=result.outcome,
        )

    async def GetJob(
        self, request: workload_scheduler_pb2.GetJobRequest, context
    ) -> workload_scheduler_pb2.Job:
        sched = await self._pod.get()
        _note(job_id=require_id(request.job_id, "job_id"))
        if request.forward_token:
            # A take-over's question, fenced before it is answered (issue 32).
            await sched.admission.fence_forward(request.job_id, request.forward_token)
        record = await sched.store.job(request.job_id, history=True)
        if record is None:
            raise await job_not_found(sched.store, request.job_id)
        return await self._job_pb(sched, record, include_rings=request.include_rings)

    async def ListJobs(
        self, request: workload_scheduler_pb2.ListJobsRequest, context
    ) -> workload_scheduler_pb2.ListJobsResponse:
        sched = await self._pod.get()
        size = paging.page_size(request.page_size)
        before = paging.token_int(request.page_token)
        wanted = {
            enum_name(common_pb2.JobState, s, f"states[{i}]", "JOB_STATE_")
            for i, s in enumerate(request.states)
        }
        state = await sched.snapshot()
        out = workload_scheduler_pb2.ListJobsResponse()
        # Scan in batches until a page of matching jobs is full (filters may skip many).
        while len(out.jobs) < size:
            batch = await sched.store.jobs_page(before_seq=before, count=size)
            if not batch:
                before = None
                break
            for record in batch:
                before = record.summary.seq
                if wanted and record.state not in wanted:
                    continue
                out.jobs.append(
                    job_pb(
                        record,
                        sched.planner,
                        sched.fabric,
                        with_history=False,
                        queue_position=queue_position(state, record.job_id),
                    )
                )
                if len(out.jobs) == size:
                    break
        if before is not None and len(out.jobs) == size:
            more = await sched.store.jobs_page(before_seq=before, count=1)
            if more:
                out.next_page_token = paging.page_token(before)
        return out

    async def CompleteJob(
        self, request: workload_scheduler_pb2.CompleteJobRequest, context
    ) -> workload_scheduler_pb2.Job:
        sched = await self._pod.get()
        _note(job_id=require_id(request.job_id, "job_id"))
        record = await sched.complete(request.job_id)
        return await self._job_pb(sched, record)

    async def CancelJob(
        self, request: workload_scheduler_pb2.CancelJobRequest, context
    ) -> workload_scheduler_pb2.Job:
        sched = await self._pod.get()
        _note(job_id=require_id(request.job_id, "job_id"))
        record = await sched.cancel(request.job_id, request.reason)
        return await self._job_pb(sched, record)

    async def UpdateJob(
        self, request: workload_scheduler_pb2.UpdateJobRequest, context
    ) -> workload_scheduler_pb2.Job:
        _note(job_id=require_id(request.spec.job_id, "spec.job_id"))
        # The same rules as at the cell: the tenant label is the cell's (issue 33).
        plan = parse_update(request.spec, list(request.update_mask.paths), reserved=RESERVED_LABELS)
        sched = await self._pod.get()
        record = await sched.update(plan, request.spec.job_id)
        return await self._job_pb(sched, record)

    async def ReportBlockHealth(
        self, request: workload_scheduler_pb2.ReportBlockHealthRequest, context
    ) -> workload_scheduler_pb2.ReportBlockHealthResponse:
        sched = await self._pod.get()
        if request.health not in (common_pb2.BLOCK_HEALTH_HEALTHY, common_pb2.BLOCK_HEALTH_FAILED):
            raise InvalidArgument("health", "must be HEALTHY (recovered) or FAILED")
        _note(block=request.block_id, health=common_pb2.BlockHealth.Name(request.health))
        outcome: Outcome = await sched.report_health(
            request.block_id,
            request.health == common_pb2.BLOCK_HEALTH_HEALTHY,
            request.reason,
            host=request.host if request.HasField("host") else None,
        )
        rings = (outcome.replacement or {}).get("unit") == "rings"
        if sched.planner.lean:
            block = await block_view(sched, request.block_id)  # whatever the live jobs
        else:
            block = (await pod_view(sched)).blocks[request.block_id]
        resp = workload_scheduler_pb2.ReportBlockHealthResponse(
            block=block,
            action=outcome.action,
            affected_jobs=outcome.affected,
        )
        for before, after in outcome.moved:
            assert before.placement and after.placement and before.offset and after.offset
            assert before.demand.box and after.demand.box
            resp.moved.append(
                workload_scheduler_pb2.ChipBoxMove(
                    job_id=before.job_id,
                    to=chip_box_pb(
                        after.job_id, after.placement[0], after.offset, after.demand.box
                    ),
                    **{
                        "from": chip_box_pb(
                            before.job_id, before.placement[0], before.offset, before.demand.box
                        )
                    },
                )
            )
        if outcome.replacement:
            r = outcome.replacement
            resp.replacement.CopyFrom(
                workload_scheduler_pb2.BlockReplacement(
                    job_id=r["job"],
                    failed_block_id=r["failed"],
                    new_block_id=r["new"],
                    position=common_pb2.Coordinate(coords=r["position"]),
                    cross_connects_moved=0 if rings else r["moved"],
                    cross_connects_untouched=0 if rings else r["untouched"],
                    rings_rerouted=r["moved"] if rings else 0,
                    rings_untouched=r["untouched"] if rings else 0,
                    preempted=[preemption_pb(v) for v in outcome.preempted],
                )
            )
        return resp

    async def WatchJob(self, request: workload_scheduler_pb2.WatchJobRequest, context):
        sched = await self._pod.get()
        _note(job_id=require_id(request.job_id, "job_id"))
        async for event in sched.watch_job(request.job_id):
            yield job_event_pb(event, sched.pod_id)

    async def WatchPod(self, request: workload_scheduler_pb2.WatchPodRequest, context):
        sched = await self._pod.get()
        async for kind, event in sched.watch_pod():
            if kind == "block":
                yield workload_scheduler_pb2.PodEvent(
                    block=workload_scheduler_pb2.BlockEvent(
                        block_id=event["block"],
                        health=common_pb2.BlockHealth.Value("BLOCK_HEALTH_" + event["health"]),
                        at=timestamp(event["at"]),
                        reason=event.get("reason", ""),
                        pod_id=sched.pod_id,
                        host=event.get("host"),
                    )
                )
            else:
                yield workload_scheduler_pb2.PodEvent(job=job_event_pb(event, sched.pod_id))

    async def GetPod(
        self, request: workload_scheduler_pb2.GetPodRequest, context
    ) -> workload_scheduler_pb2.PodView:
        return await pod_view(await self._pod.get())

    async def PlanRings(
        self, request: workload_scheduler_pb2.PlanRingsRequest, context
    ) -> workload_scheduler_pb2.RingPlan:
        dims = list(request.shape.dims)
        if not dims:
            raise InvalidArgument("shape", "is required")
        if len(dims) > MAX_PLAN_DIMS:
            raise InvalidArgument("shape", f"may have at most {MAX_PLAN_DIMS} dimensions")
        if request.unit not in (common_pb2.SHAPE_UNIT_CHIPS, common_pb2.SHAPE_UNIT_BLOCKS, 0):
            raise InvalidArgument("unit", "must be CHIPS or BLOCKS")
        if request.unit != common_pb2.SHAPE_UNIT_BLOCKS:
            bad = [d for d, n in enumerate(dims) if n < 1]
            if bad:
                raise InvalidArgument(f"shape.dims[{bad[0]}]", "must be >= 1")
            if math.prod(dims) > MAX_PLAN_CHIPS:
                # the plan visits every chip: an unbounded shape would exhaust the process
                raise InvalidArgument("shape", f"may hold at most {MAX_PLAN_CHIPS} chips")
        sched = await self._pod.get()
        fabric = sched.fabric
        sched.planner.plan_rings_allowed(sched.pod_id)
        # Only a slice this pod could host is planned: whole blocks, no more than it has
        # (the rules and words of admission, WS-2).
        violations: list = []
        grid = to_grid("shape", dims, request.unit, fabric, violations)
        if grid is None:
            raise InvalidArgument.of(violations)
        if math.prod(grid) > fabric.block_count:
            raise InvalidArgument(
                "shape",
                f"needs {math.prod(grid)} blocks of {'x'.join(map(str, fabric.block_shape))} "
                f"chips; pod {sched.pod_id} has {fabric.block_count}",
                reason="MORE_BLOCKS_THAN_POD",
            )
        chips = chips_of(grid, fabric)
        wrap = tuple(request.wrap) if request.wrap else (True,) * len(chips)
        if len(wrap) != len(chips):
            raise InvalidArgument("wrap", f"must be empty (torus) or have {len(chips)} entries")
        degrees = degrees_of(request.parallelism)
        if degrees is None:
            raise InvalidArgument("parallelism", "give at least one degree (data, pipeline, layer)")
        return ring_plan_pb(plan_rings(chips, wrap, degrees))


def availability(held: bool, failed: bool) -> common_pb2.BlockAvailability.ValueType:
    """BlockAvailability: a failed block nobody holds is UNAVAILABLE, never FREE."""
    if held:
        return common_pb2.BLOCK_AVAILABILITY_ALLOCATED
    if failed:
        return common_pb2.BLOCK_AVAILABILITY_UNAVAILABLE
    return common_pb2.BLOCK_AVAILABILITY_FREE


async def block_view(sched: WorkloadScheduler, b: int) -> workload_scheduler_pb2.BlockView:
    """One block of an OCS_TORUS pod as pod_view draws it, from one read (issue 15); a
    block hosting sub-block slices or with failed hosts from a snapshot."""
    owner, failed, job = await sched.store.block(b)
    if owner == SUB_BLOCK_OWNER or failed:
        state = await sched.snapshot()
        return _block_pb(sched.planner, state, b, {}, state.chips_held(), {})
    position = None
    if job is not None and job.placement and b in job.placement:
        position = grid_positions(job.demand.grid)[job.placement.index(b)]
    return workload_scheduler_pb2.BlockView(
        block_id=b,
        node_type=sched.fabric.node_types[b],
        health=common_pb2.BLOCK_HEALTH_FAILED if failed else common_pb2.BLOCK_HEALTH_HEALTHY,
        availability=availability(bool(owner), failed),
        job_id=owner,
        position=common_pb2.Coordinate(coords=position) if position is not None else None,
        chips_free=0 if owner else sched.fabric.chips_per_block,
    )


def _block_pb(
    planner: FabricPlanner,
    state: PodState,
    b: int,
    positions: dict[int, tuple[int, ...]],
    held: dict[int, dict[tuple[int, ...], str]],
    boxes: dict[int, list[SliceJob]],
) -> workload_scheduler_pb2.BlockView:
    """One block of the block map (WS-9), with its sub-block boxes and failed hosts."""
    fabric = state.fabric
    owner = state.owner.get(b, "")
    shared = {int(k[1:].split(".")[0]) for k in state.tile_owner if k[0] == "t"}
    bad = state.failed_hosts.get(b, frozenset())
    out = workload_scheduler_pb2.BlockView(
        block_id=b,
        node_type=fabric.node_types[b],
        health=common_pb2.BLOCK_HEALTH_FAILED
        if b in state.failed
        else common_pb2.BLOCK_HEALTH_HEALTHY,
        availability=availability(bool(owner) or b in shared, b in state.failed),
        job_id="" if owner == SUB_BLOCK_OWNER else owner,
        position=common_pb2.Coordinate(coords=positions[b])
        if owner in state.jobs and b in positions
        else None,
        failed_hosts=sorted(bad),
    )
    out.chips_free = planner.chips_free(state, b, held)
    jobs = boxes.get(b)
    if jobs is None and owner == SUB_BLOCK_OWNER:
        jobs = [
            j
            for j in state.jobs.values()
            if j.offset is not None and j.placement and j.placement[0] == b
        ]
    for job in sorted(jobs or (), key=lambda j: j.offset or ()):
        assert job.offset is not None and job.demand.box is not None
        out.boxes.append(chip_box_pb(job.job_id, b, job.offset, job.demand.box))
    return out


async def pod_view(sched: WorkloadScheduler) -> workload_scheduler_pb2.PodView:
    """WS-9: counts by state and type, and the block map."""
    state = await sched.snapshot()
    counts = await sched.store.state_counts()
    fabric = sched.fabric
    view = workload_scheduler_pb2.PodView(
        pod_id=fabric.pod_id,
        block_shape=common_pb2.Shape(dims=fabric.block_shape),
        block_count=fabric.block_count,
        ocs_per_axis=fabric.ocs_per_axis,
        jobs_by_state=counts,
        fabric_kind=common_pb2.FabricKind.Value("FABRIC_KIND_" + fabric.kind),
    )
    await sched.planner.pod_view(view, state, sched.ocs)
    for diff in sorted((await sched.store.wiring_report()).values(), key=lambda d: d["since"]):
        view.wiring_differences.append(
            workload_scheduler_pb2.WiringDifference(
                job_id=diff["job"],
                kind=workload_scheduler_pb2.WiringDifferenceKind.Value(
                    "WIRING_DIFFERENCE_KIND_" + diff["kind"]
                ),
                detail=diff["detail"],
                since=timestamp(diff["since"]),
            )
        )
    for node_type, c in state.counts_by_type().items():
        view.types.append(workload_scheduler_pb2.TypeCounts(node_type=node_type, **c))
    view.host_shape.dims.extend(fabric.host_shape)
    positions: dict[int, tuple[int, ...]] = {}
    boxes: dict[int, list[SliceJob]] = {}
    for job in state.jobs.values():
        if job.offset is not None and job.placement and job.state in HOLDING_STATES:
            boxes.setdefault(job.placement[0], []).append(job)
        elif job.placement:
            for pos, b in zip(grid_positions(job.demand.grid), job.placement, strict=True):
                positions[b] = pos
    held = state.chips_held()
    for b in range(fabric.block_count):
        view.blocks.append(_block_pb(sched.planner, state, b, positions, held, boxes))
    holding = sorted(
        (j for j in state.jobs.values() if j.state in HOLDING_STATES), key=lambda j: j.seq
    )
    for job in [*holding, *state.queue()]:
        view.live_jobs.append(
            workload_scheduler_pb2.JobSummary(
                job_id=job.job_id,
                state=common_pb2.JobState.Value("JOB_STATE_" + job.state),
                priority=job.priority,
                grid=common_pb2.Shape(dims=job.demand.grid),
                block_count=job.demand.block_count,
                twisted=job.demand.twisted,
                box=chip_box_pb(job.job_id, job.placement[0], job.offset, job.demand.box)
                if job.offset is not None and job.placement and job.demand.box is not None
                else None,
            )
        )
    return view


async def build(
    runtime: Runtime[WorkloadSchedulerSettings], *, metrics: PodMetrics | None = None
) -> list[ServiceDefinition]:
    ocs = OcsManagerClient(
        runtime.channel(
            runtime.settings.ocs_addr,
            # Only this pod's ocs_manager wires its slices.
            expect=service_principal("ocs_manager", runtime.settings.pod_id),
        ),
        timeout_s=runtime.settings.ocs_timeout_s,
    )
    metrics = metrics or PodMetrics()
    metrics.serving(runtime.settings.pod_id)
    pod = PodHandle(runtime, ocs, metrics)
    runtime.supervise(lambda: metrics.run(pod), "pod metrics", needed=False)
    # Retried until the fabric is known (a Redis error while saving it is not the end).
    runtime.supervise(pod.start, "load fabric")
    if runtime.settings.cell_addr:
        reporter = CellReporter(runtime, pod)
        runtime.supervise(reporter.run, "cell registration and heartbeat", forever=True)
    servicer = WorkloadSchedulerServicer(runtime, pod)
    return [
        ServiceDefinition(
            SERVICE_NAME,
            servicer,
            workload_scheduler_pb2_grpc.add_WorkloadSchedulerServicer_to_server,
        )
    ]
