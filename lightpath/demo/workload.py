"""Demo step of the workload scheduler (seed 000 Fig. 2, ¶104-105, Fig. 11): slices on
superpod pod-1 wired by its ocs_manager, a high-priority job preempting, a failed block
swapped at the same logical position, and the block map before and after."""

from __future__ import annotations

import asyncio
import time

from lightpath.cli.pod import render_pod
from lightpath.demo import DemoContext
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import ocs_manager_pb2, ocs_manager_pb2_grpc, workload_scheduler_pb2_grpc
from lightpath.v1 import workload_scheduler_pb2 as ws

POD = "pod-1"
NEEDED_FREE = 64


def _policy(p: c.PreemptionPolicy.ValueType) -> str:
    return c.PreemptionPolicy.Name(p).removeprefix("PREEMPTION_POLICY_").lower()


async def run(ctx: DemoContext) -> None:
    ctx.section(f"workload scheduler: slices, preemption and a failed block on {POD}")
    stub = workload_scheduler_pb2_grpc.WorkloadSchedulerStub(ctx.channel(f"ws-{POD}"))
    ocs = ocs_manager_pb2_grpc.OcsManagerStub(ctx.channel(f"ocs-{POD}"))
    view = await stub.GetPod(ws.GetPodRequest())
    free = sum(t.free for t in view.types)
    if free < NEEDED_FREE:
        print(f"{POD} has only {free} free blocks (needs {NEEDED_FREE}); skipping this step")
        return
    run_id = f"{int(time.time()) % 100000}"
    ids: list[str] = []

    async def admit(name: str, chips, **spec) -> ws.AdmitJobResponse:
        job_id = f"demo-{run_id}-{name}"
        ids.append(job_id)
        resp = await stub.AdmitJob(
            ws.AdmitJobRequest(
                spec=ws.JobSpec(job_id=job_id, shape=c.Shape(dims=list(chips)), **spec)
            )
        )
        job = resp.job
        state = c.JobState.Name(job.state).removeprefix("JOB_STATE_")
        blocks = ",".join(str(b.block_id) for b in job.blocks)
        print(
            f"  {job_id}: {'x'.join(map(str, chips))} chips, priority {job.priority} -> "
            f"{state}{' on blocks ' + blocks if blocks else ''}"
        )
        for v in resp.preempted:
            extra = f" to {'x'.join(map(str, v.shrunk_to.dims))} blocks" if v.shrunk_to.dims else ""
            print(
                f"      preempted {v.job_id} (priority {v.victim_priority}): {_policy(v.action)}{extra}"
            )
        return resp

    print("Fig. 2: three slices from scattered healthy blocks, each wired into its own torus")
    a = await admit(
        "8x8x4", (8, 8, 4), priority=50, preemption_policy=c.PREEMPTION_POLICY_TERMINATE
    )
    await admit("8x8x8", (8, 8, 8), priority=20, preemption_policy=c.PREEMPTION_POLICY_DELAY)
    await admit(
        "16x8x16",
        (16, 8, 16),
        priority=50,
        preemption_policy=c.PREEMPTION_POLICY_SHRINK,
        shrink_to=[c.Shape(dims=[16, 8, 8]), c.Shape(dims=[16, 8, 4])],
    )
    wiring = await ocs.GetSliceWiring(ocs_manager_pb2.GetSliceWiringRequest(job_id=a.job.job_id))
    print(f"  ocs_manager: {a.job.job_id} has {len(wiring.cross_connects)} cross-connects")

    print(
        "\na HIGH-priority 16x16x12 job needs 48 blocks: lower-priority slices give way, "
        "each by its own policy"
    )
    urgent = await admit("urgent", (16, 16, 12), priority_class=c.PRIORITY_CLASS_HIGH)

    print("\nFig. 11: a block of the running urgent slice fails")
    failed = urgent.job.blocks[5]
    resp = await stub.ReportBlockHealth(
        ws.ReportBlockHealthRequest(
            block_id=failed.block_id, health=c.BLOCK_HEALTH_FAILED, reason="demo: ECC errors"
        )
    )
    print(f"  {resp.action}")
    for v in resp.replacement.preempted:
        print(
            f"  (the block came from {v.job_id}, priority {v.victim_priority}: {_policy(v.action)})"
        )

    print()
    print(render_pod(await stub.GetPod(ws.GetPodRequest())))

    print("\nthe urgent job completes; queued work resumes in priority order")
    await stub.CompleteJob(ws.CompleteJobRequest(job_id=urgent.job.job_id))
    for _ in range(100):  # CompleteJob answers once queued work is placed; wiring follows
        view = await stub.GetPod(ws.GetPodRequest())
        if all(j.state != c.JOB_STATE_WIRING for j in view.live_jobs):
            break
        await asyncio.sleep(0.05)
    for job_id in ids:
        job = await stub.GetJob(ws.GetJobRequest(job_id=job_id))
        print(f"  {job_id}: {c.JobState.Name(job.state).removeprefix('JOB_STATE_')} - {job.reason}")

    # Leave the pod as we found it.
    for job_id in ids:
        job = await stub.GetJob(ws.GetJobRequest(job_id=job_id))
        if job.state not in (
            c.JOB_STATE_COMPLETED,
            c.JOB_STATE_CANCELLED,
            c.JOB_STATE_PREEMPTED,
            c.JOB_STATE_FAILED,
        ):
            await stub.CancelJob(ws.CancelJobRequest(job_id=job_id, reason="demo cleanup"))
    await stub.ReportBlockHealth(
        ws.ReportBlockHealthRequest(block_id=failed.block_id, health=c.BLOCK_HEALTH_HEALTHY)
    )
