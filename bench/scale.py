#!/usr/bin/env python3
"""Scale (issue 15): the cost of one decision as the work grows, one dimension at a
time, with one sequential client (so each figure is one decision's cost, not a
throughput), over mTLS gRPC to services running as separate processes on a
private real Redis.

    python3 dev.py bench scale [--quick] [--only cell,wire,pod,broker]

Curves, each point with p50/p99 ms and CPU ms per operation:
- `cell`: submit+complete of a 1-block job through the cell with 1, 2, 4, 8 pods
  registered (cell and Redis CPU per pair);
- `wire`: full-pod wiring of 64, 256, 1,024 blocks (bench/scale_wiring.py);
- `pod`: admission of one more 1-block job with 0, 100, 1,000 live jobs on a
  1,024-block pod, reconcile idle CPU, and the swap of the last of 4 failures
  reported at once in one slice (bench/scale_pod.py);
- `broker`: reservation decisions at 1k, 10k, 100k live reservations on 1,000
  devices near saturation, with the DEFERRED/REJECTED share, and a BatchReserve
  of 500 (bench/scale_broker.py).

Prints one JSON line: the named figures at the top level
(`broker_decide_ms_p99_100k`, `broker_batch500_s`, `admit_p50_ratio_1000_vs_0`,
`multi_failure_last_swap_ms`, `full_pod_wire_ms_p50_1024`, `cell_pair_ms_p50_by_pods`)
and each part's whole output under its name.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import cell_scheduler as cell_bench
from _common import cpu_ms_per, cpu_seconds, emit, percentile, private_stack, stack_pids

from lightpath.client import channel
from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import cell_scheduler_pb2_grpc
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import workload_scheduler_pb2 as ws

POD_COUNTS = (1, 2, 4, 8)


def pod_names(pods: int) -> list[str]:
    return [f"pod-{i}" for i in range(1, pods + 1)]


async def cell_point(stack, pods: int, pairs: int) -> dict:
    pids = stack_pids(stack, stack.redis_url)
    await cell_bench.wait_registered(stack.endpoints["cell"], stack.operator, pod_names(pods))
    async with channel(stack.endpoints["cell"], credentials=stack.operator) as ch:
        cell = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)

        async def pair(job_id: str) -> float:
            t0 = time.perf_counter()
            resp = await cell.SubmitJob(
                cs.SubmitJobRequest(spec=ws.JobSpec(job_id=job_id, shape=c.Shape(dims=[4, 4, 4])))
            )
            if resp.job.state != c.JOB_STATE_RUNNING:
                raise RuntimeError(f"{job_id}: {c.JobState.Name(resp.job.state)} {resp.job.reason}")
            await cell.CompleteJob(cs.CompleteCellJobRequest(job_id=job_id))
            return (time.perf_counter() - t0) * 1000

        for i in range(20):  # warm-up: channels, scripts, caches
            await pair(f"warm-{i}")
        before = cpu_seconds(pids)
        samples = [await pair(f"p{pods}-{i}") for i in range(pairs)]
        after = cpu_seconds(pids)
    per_pair = cpu_ms_per(before, after, pairs)
    cpu = {k: v for k, v in per_pair.items() if k in ("cell", "redis", "client")}
    return {
        "pods": pods,
        "pair_ms_p50": round(percentile(samples, 50), 3),
        "pair_ms_p99": round(percentile(samples, 99), 3),
        "cpu_ms_per_pair": cpu,
        "pairs": pairs,
    }


def cell_curve(quick: bool) -> dict:
    points = []
    for pods in POD_COUNTS:
        with private_stack(cell_bench.specs(pod_names(pods), blocks=16), tls=True) as stack:
            points.append(asyncio.run(cell_point(stack, pods, 60 if quick else 300)))
    return {"points": points}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples per point")
    parser.add_argument("--only", default="cell,wire,pod,broker", help="which curves")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    out: dict = {"quick": args.quick}
    if "cell" in parts:
        out["cell"] = cell_curve(args.quick)
        out["cell_pair_ms_p50_by_pods"] = {
            str(p["pods"]): p["pair_ms_p50"] for p in out["cell"]["points"]
        }
    if "wire" in parts:
        import scale_wiring

        out["wire"] = scale_wiring.measure(quick=args.quick)
        out["full_pod_wire_ms_p50_1024"] = out["wire"].get("full_pod_wire_ms_p50_1024")
    if "pod" in parts:
        import scale_pod

        out["pod"] = scale_pod.measure(quick=args.quick)
        for key in ("admit_p50_ratio_1000_vs_0", "multi_failure_last_swap_ms"):
            out[key] = out["pod"].get(key)
    if "broker" in parts:
        import scale_broker

        out["broker"] = scale_broker.measure(quick=args.quick)
        for key in ("broker_decide_ms_p99_100k", "broker_batch500_s"):
            out[key] = out["broker"].get(key)
    emit(out)


if __name__ == "__main__":
    main()
