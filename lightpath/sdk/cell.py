"""Jobs through the cell scheduler, the job system's one entry point (CS-5).

    from lightpath.sdk import Cell

    with Cell() as cell:                                  # the local stack's cell
        cell.submit("train-7", "8x8x4", priority_class="high", tenant="acme")
        job = cell.wait_running("train-7", timeout=60)
        for job in cell.list_jobs(tenant="acme", states=["running"]):
            print(job.job_id, job.pod_id)
        cell.complete("train-7")

`AsyncCell` is the same with `await` / `async for`. Answers are the protos of
lightpath/v1 (CellJob, JobEvent, Pod, ...); failures raise lightpath.errors
classes (InvalidArgument with `.violations`, NotFound, ResourceExhausted, ...).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from math import prod

from lightpath.errors import FailedPrecondition, InvalidArgument, LightpathError
from lightpath.sdk._base import AsyncClient, SyncClient, blocking, blocking_iter
from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import cell_scheduler_pb2_grpc
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import workload_scheduler_pb2 as ws

PREEMPTION_POLICIES = {
    "terminate": c.PREEMPTION_POLICY_TERMINATE,
    "delay": c.PREEMPTION_POLICY_DELAY,
    "shrink": c.PREEMPTION_POLICY_SHRINK,
}
PRIORITY_CLASSES = {
    "low": c.PRIORITY_CLASS_LOW,
    "medium": c.PRIORITY_CLASS_MEDIUM,
    "high": c.PRIORITY_CLASS_HIGH,
}
# A job in one of these states has ended: it never changes again.
ENDED_STATES = frozenset(
    {c.JOB_STATE_COMPLETED, c.JOB_STATE_CANCELLED, c.JOB_STATE_PREEMPTED, c.JOB_STATE_FAILED}
)

Shape = str | Sequence[int]
State = str | int


def state_name(state: int) -> str:
    """JOB_STATE_RUNNING → "RUNNING"."""
    return c.JobState.Name(state).removeprefix("JOB_STATE_")  # type: ignore[arg-type]


def job_state(state: State) -> int:
    """ "running", "RUNNING", "JOB_STATE_RUNNING" or the number → the JobState number;
    ValueError naming the valid states otherwise."""
    if isinstance(state, int):
        return state
    name = state.strip().upper().removeprefix("JOB_STATE_")
    try:
        return c.JobState.Value("JOB_STATE_" + name)
    except ValueError:
        valid = ", ".join(state_name(v) for v in c.JobState.values() if v)
        raise ValueError(f"unknown job state {state!r}: one of {valid}") from None


def parse_shape(shape: Shape) -> list[int]:
    """ "8x8x4" or (8, 8, 4) → [8, 8, 4]."""
    if isinstance(shape, str):
        try:
            return [int(p) for p in shape.lower().split("x")]
        except ValueError:
            raise ValueError(f"shape {shape!r} must look like 8x8x4") from None
    return [int(d) for d in shape]


def fill_degrees(
    chips: int, data: int = 0, pipeline: int = 0, layer: int = 0
) -> tuple[int, int, int]:
    """(data, pipeline, layer) with the degrees not given (0) filled in: the first of
    them takes what makes the product the chip count (when that divides), the others 1.
    `fill_degrees(256)` → (256, 1, 1); `fill_degrees(256, data=8, layer=4)` → (8, 8, 4)."""
    given = [data, pipeline, layer]
    known = prod(d for d in given if d)
    missing = [i for i, d in enumerate(given) if not d]
    if missing and known and chips % known == 0:
        given[missing[0]] = chips // known
    data, pipeline, layer = (d or 1 for d in given)
    return data, pipeline, layer


def _choice(table: Mapping[str, int], value: str | int, what: str) -> int:
    if isinstance(value, int):
        return value
    try:
        return table[value.lower()]
    except KeyError:
        raise ValueError(f"unknown {what} {value!r}: one of {', '.join(sorted(table))}") from None


def job_spec(
    job_id: str,
    shape: Shape | None = None,
    *,
    blocks: bool = False,
    node_types: Mapping[str, int] | None = None,
    priority: int = 0,
    priority_class: str | int | None = None,
    preemption: str | int | None = None,
    shrink_to: Iterable[Shape] = (),
    wrap: bool = True,
    parallelism: tuple[int, int, int] | None = None,
    labels: Mapping[str, str] | None = None,
    wait: bool = True,
    twisted: bool = False,
) -> ws.JobSpec:
    """The JobSpec of `AsyncCell.submit`'s arguments (see there)."""
    spec = ws.JobSpec(job_id=job_id, priority=priority, twisted=twisted)
    if shape is not None:
        dims = parse_shape(shape)
        spec.shape.dims.extend(dims)
        if not wrap:
            spec.wrap.extend([False] * len(dims))
    if blocks:
        spec.unit = c.SHAPE_UNIT_BLOCKS
    if priority_class is not None:
        spec.priority_class = _choice(PRIORITY_CLASSES, priority_class, "priority class")  # type: ignore[assignment]
    if preemption is not None:
        spec.preemption_policy = _choice(PREEMPTION_POLICIES, preemption, "preemption policy")  # type: ignore[assignment]
    for s in shrink_to:
        spec.shrink_to.add(dims=parse_shape(s))
    for name, n in (node_types or {}).items():
        spec.node_type_counts[name] = n
    if parallelism is not None:
        data, pipeline, layer = parallelism
        spec.parallelism.CopyFrom(c.ParallelismDegrees(data=data, pipeline=pipeline, layer=layer))
    for k, v in (labels or {}).items():
        spec.labels[k] = v
    if not wait:
        spec.when_no_capacity = ws.WHEN_NO_CAPACITY_FAIL
    return spec


def _timestamp_of(when: datetime | timedelta | float) -> datetime:
    from datetime import UTC

    if isinstance(when, timedelta):
        return datetime.now(UTC) + when
    if isinstance(when, datetime):
        return when if when.tzinfo else when.replace(tzinfo=UTC)
    return datetime.fromtimestamp(when, UTC)


class JobEnded(FailedPrecondition):
    """A wait for a state the job can no longer reach: it ended (`job` is how)."""

    reason = "JOB_ENDED"

    def __init__(self, job: cs.CellJob, wanted: str):
        self.job = job
        super().__init__(
            f"job {job.job_id}",
            f"ended {state_name(job.state)} before it was {wanted}"
            + (f": {job.reason}" if job.reason else ""),
            reason="JOB_ENDED",
        )


class WaitTimeout(LightpathError, TimeoutError):
    """A wait ran out of time (`job` is the last state seen)."""

    code = "DEADLINE_EXCEEDED"
    reason = "WAIT_TIMEOUT"

    def __init__(self, job: cs.CellJob, wanted: str, timeout: float):
        self.job = job
        super().__init__(
            f"job {job.job_id} was not {wanted} within {timeout:g} s "
            f"(it is {state_name(job.state)})"
        )


class AsyncCell(AsyncClient):
    """The cell scheduler: submit, read, list, watch, wait for, cancel and complete jobs;
    the cell's pods. Address: $LIGHTPATH_CELL_ADDR, else the local stack's."""

    PROCESS = "cell-scheduler"
    ADDR_ENV = "LIGHTPATH_CELL_ADDR"
    STUB = cell_scheduler_pb2_grpc.CellSchedulerStub

    async def submit(
        self,
        job_id: str,
        shape: Shape | None = None,
        *,
        blocks: bool = False,
        node_type: str | None = None,
        node_types: Mapping[str, int] | None = None,
        priority: int = 0,
        priority_class: str | int | None = None,
        preemption: str | int | None = None,
        shrink_to: Iterable[Shape] = (),
        wrap: bool = True,
        parallelism: tuple[int, int, int] | None = None,
        labels: Mapping[str, str] | None = None,
        tenant: str = "",
        wait: bool = True,
        flops: float = 0.0,
        chip_hours: float = 0.0,
        deadline: datetime | timedelta | float | None = None,
        validate_only: bool = False,
        spec: ws.JobSpec | None = None,
        pod: str = "",
        require_pod: bool = False,
        twisted: bool = False,
    ) -> cs.SubmitJobResponse:
        """Submit job `job_id` (the idempotency key: submitting it again answers the job
        there is, `created` False). The cell picks the pod, or queues it.

        shape: "8x8x4" or (8, 8, 4), in chips (in blocks with `blocks=True`): whole blocks,
          or a box inside one block ("2x2x1" of 4x4x4 blocks: a sub-block slice, packed with
          others into a block, a mesh, no OCS change; `job.pod_job.box` says where); or,
          instead of a shape, a demand: `flops` or `chip_hours` by `deadline` (a datetime, a
          timedelta from now, or seconds since the epoch), sized by the cell (a small one
          as a box inside one block).
        twisted: a twisted torus (shapes k x k x 2k and k x 2k x 2k in chips, k a multiple
          of the block edge, in any axis order: 4x4x8, 4x8x8 with 4x4x4 blocks); any other
          shape is InvalidArgument naming spec.twisted.
        node_type: every block of this type (with a chip shape, the block count comes
          from the cell's pods of that type); node_types: blocks per type {"tpu": 2}.
        priority 1..100, or priority_class "low" | "medium" | "high";
        preemption "terminate" | "delay" | "shrink" (with `shrink_to` shapes);
        wrap False: a mesh; parallelism (data, pipeline, layer): a SWITCHED pod's job;
        wait False: refused (ResourceExhausted) rather than queued when nothing is free.
        spec: a complete JobSpec instead of all these (job_id and shape taken from it).
        pod: the pod to place it on when that pod can host it (else another, as usual);
          with `require_pod`, that pod only (the job waits in the cell queue for it).
        """
        if spec is None:
            counts = dict(node_types or {})
            if node_type and not counts and shape is not None:
                dims = parse_shape(shape)
                counts[node_type] = (
                    prod(dims) if blocks else await self.blocks_of_type(node_type, dims)
                )
            spec = job_spec(
                job_id,
                shape,
                blocks=blocks,
                node_types=counts,
                priority=priority,
                priority_class=priority_class,
                preemption=preemption,
                shrink_to=shrink_to,
                wrap=wrap,
                parallelism=parallelism,
                labels=labels,
                wait=wait,
                twisted=twisted,
            )
        req = cs.SubmitJobRequest(
            spec=spec,
            tenant=tenant,
            validate_only=validate_only,
            preferred_pod=pod,
            require_preferred_pod=require_pod,
        )
        if flops or chip_hours or deadline is not None:
            req.demand.flops = flops
            req.demand.chip_hours = chip_hours
            if node_type:
                req.demand.node_type = node_type
            if deadline is not None:
                req.demand.deadline.FromDatetime(_timestamp_of(deadline))
        return await self._call("SubmitJob", req)  # type: ignore[no-any-return]

    async def blocks_of_type(self, node_type: str, chips: Sequence[int]) -> int:
        """Blocks of `node_type` a slice of `chips` takes: from the block shape of the cell's
        pods that have that type (they must agree); 1 for a box inside one block (a
        sub-block slice: its node type is that block's). InvalidArgument otherwise."""
        pods = await self.pods()
        shapes = {
            tuple(p.registration.block_shape.dims)
            for p in pods
            if any(t.node_type == node_type for t in p.registration.node_types)
        }
        if not shapes:
            known = sorted({t.node_type for p in pods for t in p.registration.node_types})
            raise InvalidArgument(
                "node_type",
                f"no pod of the cell has {node_type!r} blocks; the cell's node types: "
                + (", ".join(known) or "none (no pod registered)"),
            )
        if len(shapes) != 1:
            raise InvalidArgument(
                "node_type",
                f"the pods with {node_type} blocks have different block shapes ("
                + ", ".join(sorted("x".join(map(str, s)) for s in shapes))
                + "): give the shape in blocks",
            )
        (block,) = shapes
        if len(chips) == len(block) and all(1 <= d <= b for d, b in zip(chips, block, strict=True)):
            return 1
        if len(chips) != len(block) or any(d % b for d, b in zip(chips, block, strict=True)):
            shape = "x".join(map(str, block))
            raise InvalidArgument(
                "shape",
                f"must be a multiple of the {node_type} block {shape}, or fit inside one "
                f"(every extent <= {shape})",
            )
        return prod(d // b for d, b in zip(chips, block, strict=True))

    async def get(self, job_id: str, *, include_rings: bool = False) -> cs.CellJob:
        """The job as the cell knows it, with its pod's view when the pod answers."""
        return await self._call(  # type: ignore[no-any-return]
            "GetJob", cs.GetCellJobRequest(job_id=job_id, include_rings=include_rings)
        )

    async def list_jobs_page(
        self,
        *,
        tenant: str = "",
        states: Iterable[State] = (),
        pod: str = "",
        page_size: int = 100,
        page_token: str = "",
    ) -> cs.ListCellJobsResponse:
        """One page of jobs, newest first; `next_page_token` asks for the next."""
        return await self._call(  # type: ignore[no-any-return]
            "ListJobs",
            cs.ListCellJobsRequest(
                tenant=tenant,
                states=[job_state(s) for s in states],  # type: ignore[misc]
                pod_id=pod,
                page_size=page_size,
                page_token=page_token,
            ),
        )

    async def list_jobs(
        self,
        *,
        tenant: str = "",
        states: Iterable[State] = (),
        pod: str = "",
        limit: int | None = None,
        page_size: int = 100,
        page_token: str = "",
    ) -> AsyncIterator[cs.CellJob]:
        """Every job matching the filters (at most `limit`), newest first, fetching pages
        as the loop goes; `page_token` starts from a page a listing returned."""
        wanted = [job_state(s) for s in states]
        first = page_token

        def make(token: str) -> cs.ListCellJobsRequest:
            return cs.ListCellJobsRequest(
                tenant=tenant,
                states=wanted,  # type: ignore[arg-type]
                pod_id=pod,
                page_size=page_size,
                page_token=token or first,
            )

        async for job in self._pages("ListJobs", make, lambda page: page.jobs, limit):
            first = ""
            yield job

    async def watch(self, job_id: str) -> AsyncIterator[c.JobEvent]:
        """The job's transitions: its history first, then live until it ends (then the
        iteration stops)."""
        async for event in self._stream("WatchJob", cs.WatchCellJobRequest(job_id=job_id)):
            yield event

    async def wait(
        self, job_id: str, states: Iterable[State], *, timeout: float | None = None
    ) -> cs.CellJob:
        """The job once it is in one of `states` (or has ended: check `state`), following
        its transitions. WaitTimeout (also a TimeoutError) after `timeout` seconds."""
        wanted = {job_state(s) for s in states}
        what = " or ".join(sorted(state_name(s) for s in wanted))
        deadline = None if timeout is None else time.monotonic() + timeout
        job = await self.get(job_id)
        while job.state not in wanted and job.state not in ENDED_STATES:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeout(job, what, timeout or 0.0)
            try:
                async with asyncio.timeout(left):
                    async for event in self.watch(job_id):
                        if event.to_state in wanted or event.to_state in ENDED_STATES:
                            break
            except TimeoutError:
                job = await self.get(job_id)
                raise WaitTimeout(job, what, timeout or 0.0) from None
            job = await self.get(job_id)
        return job

    async def wait_running(self, job_id: str, *, timeout: float | None = None) -> cs.CellJob:
        """The job once it RUNS; JobEnded if it ends first, WaitTimeout after `timeout` s."""
        job = await self.wait(job_id, [c.JOB_STATE_RUNNING], timeout=timeout)
        if job.state != c.JOB_STATE_RUNNING:
            raise JobEnded(job, "RUNNING")
        return job

    async def wait_ended(self, job_id: str, *, timeout: float | None = None) -> cs.CellJob:
        """The job once it has ended (COMPLETED, CANCELLED, PREEMPTED or FAILED)."""
        return await self.wait(job_id, ENDED_STATES, timeout=timeout)

    async def cancel(self, job_id: str, reason: str = "") -> cs.CellJob:
        """Cancel the job, in the cell queue or on its pod."""
        return await self._call(  # type: ignore[no-any-return]
            "CancelJob", cs.CancelCellJobRequest(job_id=job_id, reason=reason)
        )

    async def complete(self, job_id: str) -> cs.CellJob:
        """Report that the job's workload finished."""
        return await self._call(  # type: ignore[no-any-return]
            "CompleteJob", cs.CompleteCellJobRequest(job_id=job_id)
        )

    async def update(
        self,
        job_id: str,
        *,
        priority: int | None = None,
        priority_class: str | int | None = None,
        labels: Mapping[str, str | None] | None = None,
        replace_labels: bool = False,
    ) -> cs.CellJob:
        """Change a submitted job's priority or labels without resubmitting it (an update
        with a field mask: only what is given changes). In the cell queue or a pod's queue
        the job takes its new place at once; a running job keeps its blocks and later
        preemption decisions see the new priority.

        priority 1..100, or priority_class "low" | "medium" | "high" (each replaces the
        other); labels {"team": "ml", "old": None}: set each, remove those given None;
        with `replace_labels`, `labels` becomes the whole set.
        InvalidArgument (naming the field) for a bad value, NotFound, FailedPrecondition
        for an ended job, Aborted while the job is being placed or wired (retry)."""
        spec = ws.JobSpec(job_id=job_id)
        paths: list[str] = []
        if priority is not None:
            spec.priority = priority
            paths.append("priority")
        if priority_class is not None:
            spec.priority_class = _choice(PRIORITY_CLASSES, priority_class, "priority class")  # type: ignore[assignment]
            paths.append("priority_class")
        if replace_labels:
            paths.append("labels")
        for k, v in (labels or {}).items():
            if v is not None:
                spec.labels[k] = v
            elif replace_labels:
                continue
            if not replace_labels:
                paths.append(f"labels.{k}")
        if not paths:
            raise InvalidArgument(
                "update_mask", "give priority, priority_class or labels to change"
            )
        req = cs.UpdateCellJobRequest(spec=spec)
        req.update_mask.paths.extend(paths)
        return await self._call("UpdateJob", req)  # type: ignore[no-any-return]

    async def set_quota(self, quota: cs.Quota) -> cs.TenantQuota:
        """Create or replace a tenant's quota (operators; issue 35): its row after."""
        return await self._call(  # type: ignore[no-any-return]
            "SetQuota", cs.SetQuotaRequest(quota=quota)
        )

    async def delete_quota(self, tenant: str, pod: str = "") -> cs.TenantQuota:
        """Remove a tenant's quota (operators; `pod`: its quota on that pod): its row as
        it was."""
        resp = await self._call("DeleteQuota", cs.DeleteQuotaRequest(tenant=tenant, pod=pod))
        return resp.deleted  # type: ignore[no-any-return]

    async def quotas(self, tenant: str = "") -> list[cs.TenantQuota]:
        """Quotas with their usage, by tenant, each tenant's cell-wide row before its
        pod-scoped ones (a tenant's credential: its own rows)."""
        return list((await self.quota_view(tenant)).quotas)

    async def quota_view(self, tenant: str = "") -> cs.ListQuotasResponse:
        """`quotas` with the pod the cell holds for an owner's job (`hold`, unset when
        none; a tenant's credential sees whose job only when it is its own)."""
        return await self._call(  # type: ignore[no-any-return]
            "ListQuotas", cs.ListQuotasRequest(tenant=tenant)
        )

    async def pods(self) -> list[cs.Pod]:
        """The cell's superpods: registration, capacity, status."""
        return list((await self._call("ListPods", cs.ListPodsRequest())).pods)

    async def pod(self, pod_id: str, *, include_view: bool = False) -> cs.Pod:
        """One pod; with `include_view`, its block map relayed from the pod."""
        return await self._call(  # type: ignore[no-any-return]
            "GetPod", cs.GetCellPodRequest(pod_id=pod_id, include_view=include_view)
        )

    async def report_block_health(
        self,
        pod_id: str,
        block_id: int,
        *,
        failed: bool,
        reason: str = "",
        host: int | None = None,
    ) -> ws.ReportBlockHealthResponse:
        """Report a block of a pod FAILED (`failed=True`) or recovered; with `host`, one
        host of the block only (0..hosts-1, x fastest over the block's grid of hosts: 16
        hosts of 2x2x1 chips in a 4x4x4 block). A failed host takes its chips out:
        sub-block slices on it move to healthy chips (`moved`), the block takes no block
        slice until it is healthy again, its other hosts keep serving sub-block slices.
        A host the block does not have is InvalidArgument naming `host`."""
        health = c.BLOCK_HEALTH_FAILED if failed else c.BLOCK_HEALTH_HEALTHY
        req = cs.ReportCellBlockHealthRequest(
            pod_id=pod_id, block_id=block_id, health=health, reason=reason
        )
        if host is not None:
            req.host = host
        return await self._call("ReportBlockHealth", req)  # type: ignore[no-any-return]


class Cell(SyncClient[AsyncCell]):
    """`AsyncCell` with blocking methods (same arguments and answers)."""

    ASYNC = AsyncCell

    submit = blocking(AsyncCell.submit)
    blocks_of_type = blocking(AsyncCell.blocks_of_type)
    get = blocking(AsyncCell.get)
    list_jobs_page = blocking(AsyncCell.list_jobs_page)
    list_jobs = blocking_iter(AsyncCell.list_jobs)
    watch = blocking_iter(AsyncCell.watch)
    wait = blocking(AsyncCell.wait)
    wait_running = blocking(AsyncCell.wait_running)
    wait_ended = blocking(AsyncCell.wait_ended)
    cancel = blocking(AsyncCell.cancel)
    complete = blocking(AsyncCell.complete)
    update = blocking(AsyncCell.update)
    pods = blocking(AsyncCell.pods)
    set_quota = blocking(AsyncCell.set_quota)
    delete_quota = blocking(AsyncCell.delete_quota)
    quotas = blocking(AsyncCell.quotas)
    quota_view = blocking(AsyncCell.quota_view)
    pod = blocking(AsyncCell.pod)
    report_block_health = blocking(AsyncCell.report_block_health)
