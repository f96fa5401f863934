"""Demo step of the cell scheduler: the superpod story told from a job system's side
(seed 000 Fig. 1, ¶43-55, Fig. 2, ¶104-105, Fig. 11).

Everything goes through the cell scheduler, as a job system would: jobs of several
shapes and priorities land on both superpods (most free healthy blocks of the types
asked); a high-priority job takes blocks from lower-priority work, each victim by its
own policy; a failed block is swapped while its job runs; a job waits in the cell
queue and starts when blocks free. The block map and the OCS port use are shown
before and after, and the trace id of one submission with the services that logged
under it (cell → workload scheduler → ocs_manager).
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from opentelemetry import trace

from lightpath.cli.cell import describe_pods
from lightpath.cli.pod import render_pod
from lightpath.demo.context import DemoContext
from lightpath.sdk.cell import state_name
from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import cell_scheduler_pb2_grpc, ocs_manager_pb2, ocs_manager_pb2_grpc
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import workload_scheduler_pb2 as ws

PODS = ("pod-1", "pod-2")
NEEDED_FREE = {"pod-1": 64, "pod-2": 60}
FINAL = (c.JOB_STATE_COMPLETED, c.JOB_STATE_CANCELLED, c.JOB_STATE_PREEMPTED, c.JOB_STATE_FAILED)


def _policy(p: int) -> str:
    return c.PreemptionPolicy.Name(p).removeprefix("PREEMPTION_POLICY_").lower()  # type: ignore[arg-type]


async def _wait(predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        got = await predicate()
        if got or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.1)


async def _port_use(ocs: ocs_manager_pb2_grpc.OcsManagerStub, since: int = 0) -> tuple[str, int]:
    """OCS ports in cross-connects, and routing-table updates (table versions) since `since`."""
    from lightpath.cli.ocs import _all_pages

    switches = await _all_pages(ocs.ListSwitches, ocs_manager_pb2.ListSwitchesRequest, "switches")
    used = sum(s.ports_in_use for s in switches)
    cabled = sum(s.ports_cabled for s in switches)
    versions = sum(s.version for s in switches)
    text = f"{used} of {cabled} cabled OCS ports in cross-connects"
    if since:
        busy = sum(1 for s in switches if s.ports_in_use)
        text += f"; {versions - since} routing-table updates on {busy} OCS since before"
    return text, versions


def _log_dir(endpoints: dict[str, str]) -> Path | None:
    """The logs of the stack serving `endpoints` (`lightpath up`'s, or the demo's own)."""
    import tempfile

    from lightpath.stack import default_state_dir

    candidates = [default_state_dir(), *Path(tempfile.gettempdir()).glob("lightpath-demo-*")]
    for d in candidates:
        try:
            if json.loads((d / "stack.json").read_text())["endpoints"] == endpoints:
                return d / "logs"
        except (OSError, ValueError, KeyError):
            continue
    return None


def _traced_lines(log_dir: Path, trace_id: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path in sorted(log_dir.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if trace_id not in line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("trace_id") == trace_id:
                out.setdefault(path.stem, []).append(rec.get("msg", ""))
    return out


async def run(ctx: DemoContext) -> None:
    ctx.section("cell scheduler: one entry point for job systems across two superpods")
    cell = cell_scheduler_pb2_grpc.CellSchedulerStub(ctx.channel("cell-scheduler"))

    async def pods() -> dict[str, cs.Pod]:
        return {p.registration.pod_id: p for p in (await cell.ListPods(cs.ListPodsRequest())).pods}

    async def ready():
        got = await pods()
        ok = all(
            p in got and got[p].status == cs.POD_STATUS_READY and got[p].capacity.types
            for p in PODS
        )
        return got if ok else None

    registry = await _wait(ready)
    if not registry:
        print("the superpods did not register with the cell in time; skipping this step")
        return
    print(describe_pods(list(registry.values())))
    for pod_id, need in NEEDED_FREE.items():
        free = sum(t.free for t in registry[pod_id].capacity.types if t.node_type == "tpu")
        if free < need:
            print(f"{pod_id} has only {free} free tpu blocks (needs {need}); skipping this step")
            return

    run_id = f"{int(time.time()) % 100000}"
    ids: list[str] = []

    async def submit(name: str, chips=None, **spec) -> cs.SubmitJobResponse:
        job_id = f"{name}-{run_id}"
        ids.append(job_id)
        demand = spec.pop("demand", None)
        if chips:
            spec["shape"] = c.Shape(dims=list(chips))
        resp = await cell.SubmitJob(
            cs.SubmitJobRequest(
                spec=ws.JobSpec(job_id=job_id, **spec), tenant="demo", demand=demand
            )
        )
        job = resp.job
        shape = "x".join(map(str, job.chips.dims))
        where = f"on {job.pod_id}" if job.pod_id else "in the cell queue"
        print(
            f"  {job_id:<20} {shape:>9} chips p{job.priority:<3} -> {state_name(job.state)} {where}"
            + (f"  ({job.placement_reason})" if job.pod_id else f"  ({job.reason})")
        )
        for v in resp.preempted:
            extra = f" to {'x'.join(map(str, v.shrunk_to.dims))} blocks" if v.shrunk_to.dims else ""
            print(f"      {v.job_id} (p{v.victim_priority}) gave way: {_policy(v.action)}{extra}")
        return resp

    print("\njobs of several shapes and priorities; the cell picks the pod:")
    await submit(
        "train",
        (16, 16, 8),
        priority=40,
        preemption_policy=c.PREEMPTION_POLICY_SHRINK,
        shrink_to=[c.Shape(dims=[16, 16, 4])],
    )
    prod = await submit("prod", (16, 16, 12), priority=90)
    await submit("eval", (16, 16, 4), priority=20, preemption_policy=c.PREEMPTION_POLICY_DELAY)
    await submit("batch", (16, 8, 8), priority=30, preemption_policy=c.PREEMPTION_POLICY_TERMINATE)
    await submit(
        "render",
        shape=c.Shape(dims=[2, 1, 1]),
        unit=c.SHAPE_UNIT_BLOCKS,
        node_type_counts={"gpu": 2},
    )
    deadline = datetime.now(UTC) + timedelta(hours=2, seconds=2)
    demand = cs.ComputeDemand(flops=256 * 275e12 * 7200, node_type="tpu")
    demand.deadline.FromDatetime(deadline)
    derived = await submit("finetune", demand=demand)
    print(
        f"      {derived.job.job_id}: 256 TPU v4 chips' worth of work due in 2 h -> "
        f"shape derived: {'x'.join(map(str, derived.job.chips.dims))} chips"
    )

    ocs1 = ocs_manager_pb2_grpc.OcsManagerStub(ctx.channel("ocs-pod-1"))
    view = (await cell.GetPod(cs.GetCellPodRequest(pod_id="pod-1", include_view=True))).view
    print("\nbefore:", render_pod(view))
    use, versions = await _port_use(ocs1)
    print(f"ocs-pod-1: {use}")

    async def reported():  # the pods' heartbeats have told the cell what runs where
        got = await pods()
        takeable = sum(
            n
            for t in got["pod-1"].capacity.types
            for p, n in t.preemptible_by_priority.items()
            if p < c.PRIORITY_CLASS_HIGH
        )
        return takeable >= 48

    await _wait(reported)
    print("\na HIGH-priority 16x16x12 job (48 blocks): no pod has room; on pod-1 lower-priority")
    print("work can make room, each by its own policy:")
    with ctx.tracer.start_as_current_span("demo: submit urgent") as span:
        urgent = await submit("urgent", (16, 16, 12), priority_class=c.PRIORITY_CLASS_HIGH)
        trace_id = trace.format_trace_id(span.get_span_context().trace_id)

    print("\na block of prod (pod-2) fails; the job keeps running on a spare block")
    failed = prod.job.pod_job.blocks[7]
    rep = await cell.ReportBlockHealth(
        cs.ReportCellBlockHealthRequest(
            pod_id=prod.job.pod_id,
            block_id=failed.block_id,
            health=c.BLOCK_HEALTH_FAILED,
            reason="demo: ECC errors",
        )
    )
    print(f"  {rep.action}")
    after = await cell.GetJob(cs.GetCellJobRequest(job_id=prod.job.job_id))
    print(f"  {after.job_id}: {state_name(after.state)}")

    view = (await cell.GetPod(cs.GetCellPodRequest(pod_id="pod-1", include_view=True))).view
    print("\nafter:", render_pod(view))
    print(f"ocs-pod-1: {(await _port_use(ocs1, versions))[0]}")

    print("\na job no pod can place now waits in the cell queue (priority, then age) ...")
    late = await submit("late", (16, 16, 4), priority=50)
    print(f"... and starts when {urgent.job.job_id} completes and frees its blocks:")
    await cell.CompleteJob(cs.CompleteCellJobRequest(job_id=urgent.job.job_id))

    async def late_placed():
        job = await cell.GetJob(cs.GetCellJobRequest(job_id=late.job.job_id))
        return job if job.state == c.JOB_STATE_RUNNING else None

    if await _wait(late_placed):
        for job_id in ids:
            job = await cell.GetJob(cs.GetCellJobRequest(job_id=job_id))
            print(f"  {job_id:<20} {state_name(job.state):<10} {job.pod_id or '-':<6} {job.reason}")

    print(f"\ntrace of the urgent submission: {trace_id}")
    log_dir = _log_dir(ctx.endpoints)
    lines = _traced_lines(log_dir, trace_id) if log_dir else {}
    for process in ("cell-scheduler", "ws-pod-1", "ocs-pod-1"):
        msgs = lines.get(process, [])
        if msgs:
            print(f"  {process:<15} {len(msgs)} log line(s), e.g. {msgs[-1]}")
    if not lines:
        print("  (spans carry it in every service; logs with trace_id show it per service)")

    # Leave the cell as we found it.
    for job_id in ids:
        job = await cell.GetJob(cs.GetCellJobRequest(job_id=job_id))
        if job.state not in FINAL:
            await cell.CancelJob(cs.CancelCellJobRequest(job_id=job_id, reason="demo cleanup"))
    await cell.ReportBlockHealth(
        cs.ReportCellBlockHealthRequest(
            pod_id=prod.job.pod_id, block_id=failed.block_id, health=c.BLOCK_HEALTH_HEALTHY
        )
    )
