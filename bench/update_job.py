#!/usr/bin/env python3
"""UpdateJob latency through the cell (issue 19): a priority change of a job waiting in
the cell queue, and of a job on a pod (the pod's commit, then the cell's record).

    python3 dev.py bench update_job [--updates 300] [--clients 4]

Redis, the cell_scheduler and two superpods (64 blocks each) run as separate
processes with TLS (mTLS, as users run them); the clients run here. Every block of
both pods is taken by jobs at priority 100 (nothing can preempt them); `--clients`
jobs then wait in the cell queue. Each client then changes, back to back, the
priority of one running job (on a pod) and of one waiting job (in the cell queue),
alternating between two values so every update changes something, for the stack's
`--updates` updates of each kind in all.

Prints one JSON line: queued_ms_p50 / p99 and placed_ms_p50 / p99 (milliseconds per
UpdateJob), their counts, updates_per_s over both kinds, and the CPU ms per update of
each process.
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

FULL_POD = [16, 16, 16]  # 64 blocks of 4x4x4


def _update(job_id: str, priority: int) -> cs.UpdateCellJobRequest:
    req = cs.UpdateCellJobRequest(spec=ws.JobSpec(job_id=job_id, priority=priority))
    req.update_mask.paths.append("priority")
    return req


async def bench(
    address: str, operator, pids: dict[str, int], *, updates: int, clients: int
) -> dict:
    async with channel(address, credentials=operator) as ch:
        cell = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)
        for i in range(2):  # every block of both pods, at a priority nothing preempts
            await cell.SubmitJob(
                cs.SubmitJobRequest(
                    spec=ws.JobSpec(job_id=f"full-{i}", shape=c.Shape(dims=FULL_POD), priority=100)
                )
            )
        for i in range(clients):
            waiting = await cell.SubmitJob(
                cs.SubmitJobRequest(
                    spec=ws.JobSpec(job_id=f"wait-{i}", shape=c.Shape(dims=[4, 4, 4]), priority=10)
                )
            )
            assert waiting.job.pod_id == "", "the pods should be full"
        placed_ms: list[float] = []
        queued_ms: list[float] = []

        async def client(i: int, n: int) -> None:
            for k in range(n):
                priority = 100 if k % 2 else 99  # full-N stays above anything waiting
                t = time.perf_counter()
                await cell.UpdateJob(_update(f"full-{i % 2}", priority))
                placed_ms.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                await cell.UpdateJob(_update(f"wait-{i}", 10 + k % 2))
                queued_ms.append((time.perf_counter() - t) * 1000)

        per_client = max(1, updates // clients)
        before = cpu_seconds(pids)  # the set-up (wiring two whole pods) is not counted
        started = time.perf_counter()
        await asyncio.gather(*(client(i, per_client) for i in range(clients)))
        elapsed = time.perf_counter() - started
        cpu = cpu_ms_per(before, cpu_seconds(pids), len(placed_ms) + len(queued_ms))
    return {
        "cpu_ms_per_update": cpu,
        "placed_ms_p50": percentile(placed_ms, 50),
        "placed_ms_p99": percentile(placed_ms, 99),
        "queued_ms_p50": percentile(queued_ms, 50),
        "queued_ms_p99": percentile(queued_ms, 99),
        "placed_updates": len(placed_ms),
        "queued_updates": len(queued_ms),
        "updates_per_s": (len(placed_ms) + len(queued_ms)) / elapsed,
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
