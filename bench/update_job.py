#!/usr/bin/env python3
"""UpdateJob latency through the cell (issue 19): a priority change of a job waiting in
the cell queue, and of a job on a pod (the pod's commit, then the cell's record).

    python3 dev.py bench update_job [--updates 300] [--clients 4]

Redis, the cell_scheduler and two superpods (64 blocks each) run as separate
processes with TLS (mTLS, as users run them); the clients run here. Every block of
both pods is taken by 32 running jobs of 4 blocks at priority 100 (nothing can
preempt them); 16 more jobs wait in the cell queue. The clients then change the
priorities of the running jobs (on a pod), then of the waiting ones (in the cell
queue), going round the jobs and alternating between two values so every update
changes something, for `--updates` updates of each kind in all. (Each update adds
an event to its job's history, which the answer carries: going round many jobs
keeps the histories short, as they are in use.)

Prints one JSON line, per kind (placed: on a pod; queued: in the cell queue), the
milliseconds per UpdateJob at p50 and p99, updates per second, and the CPU ms per
update of each process (the two kinds run one after the other).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from _common import cpu_ms_per, cpu_seconds, emit, percentile, private_stack, stack_pids
from cell_scheduler import specs, wait_registered

from lightpath.client import channel
from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import cell_scheduler_pb2_grpc
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import workload_scheduler_pb2 as ws

RUNNING_JOBS, WAITING_JOBS = 32, 16
SLICE = [8, 8, 4]  # 4 blocks of 4x4x4: 16 such jobs fill a 64-block pod


def _update(job_id: str, priority: int) -> cs.UpdateCellJobRequest:
    req = cs.UpdateCellJobRequest(spec=ws.JobSpec(job_id=job_id, priority=priority))
    req.update_mask.paths.append("priority")
    return req


async def bench(
    address: str, operator, pids: dict[str, int], *, updates: int, clients: int
) -> dict:
    async with channel(address, credentials=operator) as ch:
        cell = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)
        for i in range(RUNNING_JOBS):  # every block of both pods, at a priority nothing preempts
            await cell.SubmitJob(
                cs.SubmitJobRequest(
                    spec=ws.JobSpec(job_id=f"run-{i}", shape=c.Shape(dims=SLICE), priority=100)
                )
            )
        for i in range(WAITING_JOBS):
            waiting = await cell.SubmitJob(
                cs.SubmitJobRequest(
                    spec=ws.JobSpec(job_id=f"wait-{i}", shape=c.Shape(dims=SLICE), priority=10)
                )
            )
            assert waiting.job.pod_id == "", "the pods should be full"
        per_client = max(1, updates // clients)

        async def phase(kind: str) -> tuple[list[float], dict[str, float], float]:
            """Every client's `per_client` updates of one kind; latencies, CPU, seconds."""
            ms: list[float] = []

            async def client(i: int) -> None:
                for k in range(per_client):
                    j = i + k * clients  # each job in turn
                    if kind == "placed":  # above anything waiting either way
                        req = _update(f"run-{j % RUNNING_JOBS}", 99 + (j // RUNNING_JOBS) % 2)
                    else:
                        req = _update(f"wait-{j % WAITING_JOBS}", 11 - (j // WAITING_JOBS) % 2)
                    t = time.perf_counter()
                    await cell.UpdateJob(req)
                    ms.append((time.perf_counter() - t) * 1000)

            before = cpu_seconds(pids)  # the set-up (wiring two whole pods) is not counted
            started = time.perf_counter()
            await asyncio.gather(*(client(i) for i in range(clients)))
            elapsed = time.perf_counter() - started
            return ms, cpu_ms_per(before, cpu_seconds(pids), len(ms)), elapsed

        placed_ms, placed_cpu, placed_s = await phase("placed")
        queued_ms, queued_cpu, queued_s = await phase("queued")
    return {
        "placed_ms_p50": percentile(placed_ms, 50),
        "placed_ms_p99": percentile(placed_ms, 99),
        "placed_per_s": len(placed_ms) / placed_s,
        "placed_cpu_ms_per_update": placed_cpu,
        "queued_ms_p50": percentile(queued_ms, 50),
        "queued_ms_p99": percentile(queued_ms, 99),
        "queued_per_s": len(queued_ms) / queued_s,
        "queued_cpu_ms_per_update": queued_cpu,
        "updates": len(placed_ms) + len(queued_ms),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=300, help="updates of each kind")
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    with private_stack(specs(), tls=True) as stack:
        pids = stack_pids(stack, stack.redis_url)

        async def go() -> dict:
            await wait_registered(stack.endpoints["cell"], stack.operator)
            return await bench(
                stack.endpoints["cell"],
                stack.operator,
                pids,
                updates=args.updates,
                clients=args.clients,
            )

        result = asyncio.run(go())
    emit({**result, "clients": args.clients, "tls": True})


if __name__ == "__main__":
    main()
