#!/usr/bin/env python3
"""Admissions + completions per second through gRPC, with the real ocs_manager wiring
every slice: 2-block slices (8x4x4 chips) on a 64-block pod, 8 concurrent clients.

    python3 dev.py bench workload_scheduler [--seconds 15] [--clients 8]

Redis, the ocs_manager and the workload_scheduler run as separate processes (as
deployed, default settings: info logs, no trace export); the clients run here. Each client loops: AdmitJob (answers once the slice
is RUNNING, i.e. wired by the ocs_manager) then CompleteJob (answers once it is
unwired). Prints one JSON line: admit_complete_per_s, admit_ms_p50, admit_ms_p99,
plus complete_ms_p50/p99, pairs, clients, seconds and cpu_ms_per_pair (CPU ms per
pair of each process: the services, Redis, and this client).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from _common import cpu_ms_per, cpu_seconds, emit, percentile, private_redis, stack_pids

from lightpath.client import channel
from lightpath.embedded_redis import free_port
from lightpath.stack import ProcessSpec, Stack
from lightpath.v1 import common_pb2, workload_scheduler_pb2, workload_scheduler_pb2_grpc

POD = "pod-bench"


def specs() -> list[ProcessSpec]:
    return [
        ProcessSpec(
            "ocs-bench",
            "ocs_manager",
            free_port(),
            env={"LIGHTPATH_POD_ID": POD},
        ),
        ProcessSpec(
            "ws-bench",
            "workload_scheduler",
            free_port(),
            env={"LIGHTPATH_POD_ID": POD},
            peers={"LIGHTPATH_OCS_ADDR": "ocs-bench"},
        ),
    ]


async def measure(
    address: str, seconds: float, clients: int, pids: dict[str, int]
) -> dict[str, object]:
    admit_ms: list[float] = []
    complete_ms: list[float] = []
    pairs = 0
    counter = 0

    async def client(index: int, deadline: float, record: bool) -> None:
        nonlocal pairs, counter
        async with channel(address) as ch:
            stub = workload_scheduler_pb2_grpc.WorkloadSchedulerStub(ch)
            while time.perf_counter() < deadline:
                counter += 1
                job_id = f"b{index}-{counter}"
                spec = workload_scheduler_pb2.JobSpec(
                    job_id=job_id, shape=common_pb2.Shape(dims=[8, 4, 4])
                )
                t0 = time.perf_counter()
                resp = await stub.AdmitJob(workload_scheduler_pb2.AdmitJobRequest(spec=spec))
                t1 = time.perf_counter()
                if resp.job.state != common_pb2.JOB_STATE_RUNNING:
                    raise RuntimeError(f"{job_id} is {resp.job.state}: {resp.job.reason}")
                await stub.CompleteJob(workload_scheduler_pb2.CompleteJobRequest(job_id=job_id))
                t2 = time.perf_counter()
                if record:
                    admit_ms.append((t1 - t0) * 1000)
                    complete_ms.append((t2 - t1) * 1000)
                    pairs += 1

    warm = time.perf_counter() + 2.0
    await asyncio.gather(*(client(i, warm, False) for i in range(clients)))
    cpu0 = cpu_seconds(pids)
    start = time.perf_counter()
    await asyncio.gather(*(client(i, start + seconds, True) for i in range(clients)))
    elapsed = time.perf_counter() - start
    cpu1 = cpu_seconds(pids)
    return {
        "admit_complete_per_s": pairs / elapsed,
        "admit_ms_p50": percentile(admit_ms, 50),
        "admit_ms_p99": percentile(admit_ms, 99),
        "complete_ms_p50": percentile(complete_ms, 50),
        "complete_ms_p99": percentile(complete_ms, 99),
        "pairs": pairs,
        "clients": clients,
        "seconds": elapsed,
        # Where the time goes: CPU ms per admit+complete pair, per process ("client": this one).
        "cpu_ms_per_pair": cpu_ms_per(cpu0, cpu1, pairs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    with (
        private_redis() as redis_url,
        tempfile.TemporaryDirectory(prefix="lightpath-bench-") as tmp,
    ):
        stack = Stack(Path(tmp), specs=specs(), redis_url=redis_url, log=lambda *_: None)
        stack.start()
        try:
            pids = stack_pids(stack, redis_url)
            result = asyncio.run(
                measure(stack.endpoints["ws-bench"], args.seconds, args.clients, pids)
            )
        finally:
            stack.stop()
    emit(result)


if __name__ == "__main__":
    main()
