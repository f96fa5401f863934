"""Demo step of a SWITCHED superpod (seed 002, Fig. 9-11, ¶57): one job with
(data, pipeline, layer) = (4, 3, 3) on groups of 3x3 processors of pod-3, its
Hamiltonian rings with their reserved links, a failed group swapped under a
shared switch, and the pod's groups and switch use."""

from __future__ import annotations

import time
from collections import defaultdict

from lightpath.cli.pod import JOB_SYMBOLS
from lightpath.cli.switched_view import render_switched_pod
from lightpath.demo.context import DemoContext
from lightpath.sdk.cell import state_name
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import ocs_manager_pb2 as ocs
from lightpath.v1 import ocs_manager_pb2_grpc, workload_scheduler_pb2_grpc
from lightpath.v1 import workload_scheduler_pb2 as ws

POD = "pod-3"


def describe_ring(ring: ocs.SwitchedRing) -> str:
    """`g0.0: pr11 > pr21 > pr31 > (c0/p3) >` — processors in ring order, the switches a hop passes."""
    group = {p.split("/")[0] for p in ring.processors}
    same = len(group) == 1
    parts = []
    for proc, hop in zip(ring.processors, ring.hops, strict=True):
        parts.append(proc.split("/")[1] if same else proc)
        via = [n for n in hop.nodes[1:-1] if "/pr" not in n]
        if via:
            parts.append("(" + " ".join(via) + ")")
    prefix = f"{group.pop()}: " if same else ""
    return f"{ring.name:<18} {prefix}" + " > ".join(parts) + " >"


async def run(ctx: DemoContext) -> None:
    ctx.section(f"switched superpod {POD}: Hamiltonian rings with reserved links")
    stub = workload_scheduler_pb2_grpc.WorkloadSchedulerStub(ctx.channel(f"ws-{POD}"))
    fm = ocs_manager_pb2_grpc.OcsManagerStub(ctx.channel(f"ocs-{POD}"))
    fabric = await fm.GetSwitchedFabric(ocs.GetSwitchedFabricRequest())
    print(
        f"{POD}: {fabric.groups} groups of "
        f"{'x'.join(map(str, fabric.config.group_shape.dims))} processors on two-tier switches "
        f"({fabric.spec}); {fabric.tier0_switches} tier-0 and {fabric.tier1_switches} tier-1 switches"
    )
    job_id = f"demo-sw-{time.time_ns() // 1_000_000 % 10**8}"
    resp = await stub.AdmitJob(
        ws.AdmitJobRequest(
            spec=ws.JobSpec(
                job_id=job_id, parallelism=c.ParallelismDegrees(data=4, pipeline=3, layer=3)
            )
        )
    )
    job = resp.job
    groups = ", ".join(t.group_name for t in job.switched.tiles)
    print(
        f"\n{job_id}: (data, pipeline, layer) = (4, 3, 3), 36 processors -> {state_name(job.state)} on {groups}"
    )
    print(f"  {job.reason}")
    if job.state != c.JOB_STATE_RUNNING:
        return
    full = await stub.GetJob(ws.GetJobRequest(job_id=job_id, include_rings=True))
    rings = full.switched.rings
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(rings.channels_by_kind.items()))
    print(
        f"  {len(rings.rings)} rings, {rings.channel_count} link channels reserved ({kinds}); "
        "a ring holds one direction of each link it crosses, no channel is in two rings"
    )
    by_axis = defaultdict(list)
    for r in rings.rings:
        by_axis[r.axis].append(r)
    for axis, what in (
        (
            "layer",
            "layers down a column of each group, closed through its column switch",
        ),
        ("pipeline", "stages along a row, closed through the row switch"),
        ("data", "the same processor of the four model instances a-d"),
    ):
        print(f"\n  {axis} rings: {what}")
        for r in by_axis[axis]:
            print("    " + describe_ring(r))
    one = next(r for r in rings.rings if r.axis == "data")
    print(f"\n  the path of {one.name}, hop by hop:")
    for hop in one.hops:
        print("    " + " ; ".join(hop.channels))

    failed = job.switched.tiles[1]
    print(f"\ngroup {failed.group_name} fails; a free group takes its place, its rings re-routed")
    health = await stub.ReportBlockHealth(
        ws.ReportBlockHealthRequest(
            block_id=failed.group, health=c.BLOCK_HEALTH_FAILED, reason="demo: link errors"
        )
    )
    r = health.replacement
    if r.job_id:
        print(
            f"  group {r.failed_block_id} -> group {r.new_block_id}: {r.rings_rerouted} rings "
            f"re-routed, {r.rings_untouched} untouched"
        )
    else:
        print(f"  {health.action}")
    print()
    print(render_switched_pod(await stub.GetPod(ws.GetPodRequest()), JOB_SYMBOLS))
    free = await fm.GetFreeUplinks(ocs.GetFreeUplinksRequest())
    print(f"\nfree uplinks at tier 0: {free.free_uplinks} of {free.uplinks}")

    # Leave the pod as we found it.
    await stub.CompleteJob(ws.CompleteJobRequest(job_id=job_id))
    await stub.ReportBlockHealth(
        ws.ReportBlockHealthRequest(block_id=failed.group, health=c.BLOCK_HEALTH_HEALTHY)
    )
    report = await fm.CheckInvariants(ocs.CheckInvariantsRequest())
    print(f"{job_id} completed, its rings released; invariants ok: {report.ok}")
