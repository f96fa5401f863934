#!/usr/bin/env python3
"""The workload scheduler as its pod fills: admission at 0 / 100 / 1,000 live jobs on a
1,024-block pod, reconcile idle CPU at 0 and 1,000 live jobs, and the multi-failure swap
latency (issue 15).

    python3 bench/scale_pod.py [--quick]

Redis, the ocs_manager (1,024 blocks of 4x4x4 chips, K = 1) and the workload_scheduler
run as separate processes with TLS (mTLS, as users run them) and default settings (a
reconcile round a second); the bench is one sequential client, so each figure is the
cost of one decision.

* Admission: the pod is filled with 1-block jobs to N live ones (8 clients, not
  recorded); then rounds of `batch` sequential AdmitJob calls of one more 1-block job
  (each answers once its slice is RUNNING, wired by the ocs_manager) are recorded,
  their jobs completed after each round (not recorded), so the pod stays at N..N+batch.
  CPU ms per admission of the scheduler, Redis and ocs_manager processes are read
  around the recorded calls only.
* Reconcile idle: CPU ms per second of each process while nothing is asked, at N live
  (`reconcile_idle_cpu_ratio_1000_vs_0`: each process's ratio; at 0 jobs a sweep
  has nothing to read, so 1,000 vs 100 is the flatness to look at).
* Multi-failure: a running 2x2x1-block slice (8x8x4 chips) has all 4 of its blocks
  reported FAILED at once (4 concurrent ReportBlockHealth calls); the time from the
  reports to the last "replaced by" transition of the job (the event's own time) is
  `multi_failure_last_swap_ms` (p50 over rounds; max beside it). The failed blocks
  recover and the slice completes between rounds.

Prints one JSON line; `measure(quick)` returns the same dict. Never asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cpu_ms_per, cpu_seconds, emit, percentile, private_stack, stack_pids

from lightpath.client import channel
from lightpath.embedded_redis import free_port
from lightpath.stack import ProcessSpec
from lightpath.v1 import common_pb2, workload_scheduler_pb2, workload_scheduler_pb2_grpc

POD = "pod-scale"
BLOCKS = 1024
LEVELS = (0, 100, 1000)
ONE_BLOCK = (4, 4, 4)
FOUR_BLOCKS = (8, 8, 4)


def specs() -> list[ProcessSpec]:
    return [
        ProcessSpec(
            "ocs-scale",
            "ocs_manager",
            free_port(),
            env={
                "LIGHTPATH_POD_ID": POD,
                "LIGHTPATH_FABRIC_BLOCK_SHAPE": "4x4x4",
                "LIGHTPATH_FABRIC_BLOCKS": str(BLOCKS),
                "LIGHTPATH_FABRIC_OCS_PER_AXIS": "1",
                "LIGHTPATH_FABRIC_OCS_RADIX": str(2 * BLOCKS),
            },
        ),
        ProcessSpec(
            "ws-scale",
            "workload_scheduler",
            free_port(),
            env={"LIGHTPATH_POD_ID": POD},
            peers={"LIGHTPATH_OCS_ADDR": "ocs-scale"},
        ),
    ]


def _spec(job_id: str, chips=ONE_BLOCK, **kw) -> workload_scheduler_pb2.JobSpec:
    return workload_scheduler_pb2.JobSpec(
        job_id=job_id, shape=common_pb2.Shape(dims=list(chips)), **kw
    )


async def _admit(stub, job_id: str, chips=ONE_BLOCK) -> workload_scheduler_pb2.Job:
    resp = await stub.AdmitJob(workload_scheduler_pb2.AdmitJobRequest(spec=_spec(job_id, chips)))
    if resp.job.state != common_pb2.JOB_STATE_RUNNING:
        raise RuntimeError(f"{job_id} is {resp.job.state}: {resp.job.reason}")
    return resp.job


async def _complete(stub, job_id: str) -> None:
    await stub.CompleteJob(workload_scheduler_pb2.CompleteJobRequest(job_id=job_id))


async def _fill(stubs, live: list[str], target: int) -> None:
    """Admit 1-block filler jobs until `target` are live (8 concurrent clients)."""
    todo = [f"fill-{i}" for i in range(len(live), target)]

    async def client(stub) -> None:
        while todo:
            job_id = todo.pop()
            await _admit(stub, job_id)
            live.append(job_id)

    await asyncio.gather(*(client(s) for s in stubs))


async def _admissions(stub, pids, level: int, rounds: int, batch: int) -> dict:
    samples: list[float] = []
    cpu: dict[str, float] = {}
    counter = 0
    for r in range(rounds):
        ids = []
        cpu0 = cpu_seconds(pids)
        for _ in range(batch):
            counter += 1
            job_id = f"probe-{level}-{counter}"
            t0 = time.perf_counter()
            await _admit(stub, job_id)
            samples.append((time.perf_counter() - t0) * 1000)
            ids.append(job_id)
        cpu1 = cpu_seconds(pids)
        if r > 0:  # the first round warms up (connections, scripts, caches)
            for k in cpu1:
                cpu[k] = cpu.get(k, 0.0) + cpu1[k] - cpu0[k]
        for job_id in ids:
            await _complete(stub, job_id)
    recorded = samples[batch:]
    n = len(recorded)
    return {
        "admit_ms_p50": percentile(recorded, 50),
        "admit_ms_p99": percentile(recorded, 99),
        "admissions": n,
        "cpu_ms_per_admit": {k: round(v * 1000.0 / max(1, n), 3) for k, v in cpu.items()},
    }


async def _idle(pids, seconds: float) -> dict[str, float]:
    """CPU ms per second of each process while nobody calls (reconcile rounds only)."""
    await asyncio.sleep(1.0)
    cpu0 = cpu_seconds(pids)
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)
    cpu1 = cpu_seconds(pids)
    elapsed = time.perf_counter() - t0
    per_s = cpu_ms_per(cpu0, cpu1, 1)
    return {k: round(v / elapsed, 2) for k, v in per_s.items() if k != "client"}


async def _multi_failure(stub, rounds: int, tag: str) -> list[float]:
    """Per round: ms from 4 simultaneous FAILED reports of one slice's blocks to the
    last of its "replaced by" transitions."""
    out = []
    for r in range(rounds):
        job_id = f"multi-{tag}-{r}"
        job = await _admit(stub, job_id, FOUR_BLOCKS)
        blocks = [b.block_id for b in job.blocks]
        t0_ms = time.time() * 1000
        await asyncio.gather(
            *(
                stub.ReportBlockHealth(
                    workload_scheduler_pb2.ReportBlockHealthRequest(
                        block_id=b, health=common_pb2.BLOCK_HEALTH_FAILED, reason="bench"
                    )
                )
                for b in blocks
            )
        )
        swapped: dict[int, float] = {}
        deadline = time.monotonic() + 30
        while len(swapped) < len(blocks) and time.monotonic() < deadline:
            got = await stub.GetJob(workload_scheduler_pb2.GetJobRequest(job_id=job_id))
            for e in got.history:
                for b in blocks:
                    if e.reason.startswith(f"block {b} replaced by block "):
                        swapped[b] = e.at.seconds * 1000 + e.at.nanos / 1e6
            if len(swapped) < len(blocks):
                await asyncio.sleep(0.01)
        if len(swapped) == len(blocks):
            out.append(max(swapped.values()) - t0_ms)
        else:
            out.append(float("nan"))
        await _complete(stub, job_id)
        for b in blocks:
            await stub.ReportBlockHealth(
                workload_scheduler_pb2.ReportBlockHealthRequest(
                    block_id=b, health=common_pb2.BLOCK_HEALTH_HEALTHY
                )
            )
    return out


async def _run(stack, quick: bool) -> dict:
    rounds, batch = (3, 10) if quick else (6, 20)
    idle_s = 10.0 if quick else 20.0  # two rounds that read everything (10 s apart) in a full run
    failure_rounds = 3 if quick else 7
    pids = stack_pids(stack, stack.redis_url)
    result: dict = {"blocks": BLOCKS, "admission": {}, "reconcile_idle_cpu_ms_per_s": {}}
    async with contextlib.AsyncExitStack() as channels:
        stubs = [
            workload_scheduler_pb2_grpc.WorkloadSchedulerStub(
                await channels.enter_async_context(
                    channel(stack.endpoints["ws-scale"], credentials=stack.operator)
                )
            )
            for _ in range(8)
        ]
        stub = stubs[0]
        live: list[str] = []
        for level in LEVELS:
            await _fill(stubs, live, level)
            result["reconcile_idle_cpu_ms_per_s"][str(level)] = await _idle(pids, idle_s)
            if level == 0:
                ms = await _multi_failure(stub, failure_rounds, "0")
                result["multi_failure_last_swap_ms"] = percentile(ms, 50)
                result["multi_failure_last_swap_ms_max"] = max(ms)
            result["admission"][str(level)] = await _admissions(stub, pids, level, rounds, batch)
        ms = await _multi_failure(stub, failure_rounds, "1000")
        result["multi_failure_last_swap_ms_at_1000_jobs"] = percentile(ms, 50)
    adm = result["admission"]
    result["admit_p50_ratio_1000_vs_0"] = adm["1000"]["admit_ms_p50"] / adm["0"]["admit_ms_p50"]
    idle = result["reconcile_idle_cpu_ms_per_s"]
    result["reconcile_idle_cpu_ratio_1000_vs_0"] = {
        k: round(idle["1000"][k] / idle["0"][k], 2) if idle["0"][k] else None for k in idle["0"]
    }
    result["quick"] = quick
    return result


def measure(quick: bool = False) -> dict:
    """The whole run on a private TLS stack; the dict printed as one JSON line."""
    with private_stack(specs(), tls=True) as stack:
        return asyncio.run(_run(stack, quick))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (about a minute)")
    args = parser.parse_args()
    emit(measure(args.quick))


if __name__ == "__main__":
    main()
