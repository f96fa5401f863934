#!/usr/bin/env python3
"""Submissions + completions per second through the cell scheduler (two superpods,
8 concurrent clients), beside the same load sent directly to one workload scheduler.

    python3 dev.py bench cell_scheduler [--seconds 15] [--clients 8]

Redis, the cell_scheduler and two superpods (an ocs_manager and a workload_scheduler
each, 64 blocks of 4x4x4, registered with the cell and reporting to it) run as
separate processes with their default settings, as deployed; the clients run here.
Each client loops: submit a 2-block slice (8x4x4 chips; the call answers once the
slice is RUNNING, wired by the pod's ocs_manager), then complete it. The same run
measures the clients calling pod-1's workload scheduler directly (AdmitJob +
CompleteJob) and the cell (SubmitJob + CompleteJob), in alternating rounds (a shared
machine's changing load weighs on both alike), so the cell's cost shows as a ratio. Prints one JSON line: cell_per_s, cell_ms_p50, cell_ms_p99, direct_per_s,
direct_ms_p50, direct_ms_p99, overhead_ratio_p50 (cell p50 / direct p50), plus the
completion latencies, the jobs per pod and the counts.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from _common import cpu_seconds, emit, percentile, private_redis, stack_pids

from lightpath.client import channel
from lightpath.embedded_redis import free_port
from lightpath.stack import ProcessSpec, Stack
from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import cell_scheduler_pb2_grpc, workload_scheduler_pb2_grpc
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import workload_scheduler_pb2 as ws

PODS = ("pod-1", "pod-2")
SHAPE = [8, 4, 4]


def specs() -> list[ProcessSpec]:
    out = [ProcessSpec("cell", "cell_scheduler", free_port())]
    for pod in PODS:
        out.append(ProcessSpec(f"ocs-{pod}", "ocs_manager", free_port(), {"LIGHTPATH_POD_ID": pod}))
        out.append(
            ProcessSpec(
                f"ws-{pod}",
                "workload_scheduler",
                free_port(),
                {"LIGHTPATH_POD_ID": pod},
                {
                    "LIGHTPATH_OCS_ADDR": f"ocs-{pod}",
                    "LIGHTPATH_CELL_ADDR": "cell",
                    "LIGHTPATH_ADVERTISE_ADDR": f"ws-{pod}",
                },
            )
        )
    return out


# submit(stub, job_id) -> the pod that runs it; complete(stub, job_id)
Submit = Callable[[object, str], Awaitable[str]]
Complete = Callable[[object, str], Awaitable[None]]


async def measure(
    address: str,
    make_stub: Callable,
    submit: Submit,
    complete: Complete,
    *,
    seconds: float,
    clients: int,
    tag: str,
    warmup: float = 1.0,
) -> dict:
    submit_ms: list[float] = []
    complete_ms: list[float] = []
    pods: collections.Counter[str] = collections.Counter()
    pairs = 0
    all_pairs = 0  # warm-up included (CPU is counted over the warm-up too)
    counter = 0
    elapsed = 0.0

    async def client(index: int, deadline: float, record: bool) -> None:
        nonlocal pairs, all_pairs, counter
        async with channel(address) as ch:
            stub = make_stub(ch)
            while time.perf_counter() < deadline:
                counter += 1
                job_id = f"{tag}-{index}-{counter}"
                t0 = time.perf_counter()
                pod = await submit(stub, job_id)
                t1 = time.perf_counter()
                await complete(stub, job_id)
                t2 = time.perf_counter()
                all_pairs += 1
                if record:
                    submit_ms.append((t1 - t0) * 1000)
                    complete_ms.append((t2 - t1) * 1000)
                    pods[pod] += 1
                    pairs += 1

    warm = time.perf_counter() + warmup
    await asyncio.gather(*(client(i, warm, False) for i in range(clients)))
    start = time.perf_counter()
    await asyncio.gather(*(client(i, start + seconds, True) for i in range(clients)))
    elapsed = time.perf_counter() - start
    return {
        "elapsed": elapsed,
        "submit_ms": submit_ms,
        "complete_ms": complete_ms,
        "pairs": pairs,
        "all_pairs": all_pairs,
        "pods": dict(pods),
    }


def merged(rounds: list[dict]) -> dict:
    submit = [x for r in rounds for x in r["submit_ms"]]
    complete = [x for r in rounds for x in r["complete_ms"]]
    pods: collections.Counter[str] = collections.Counter()
    for r in rounds:
        pods.update(r["pods"])
    pairs = sum(r["pairs"] for r in rounds)
    return {
        "all_pairs": sum(r["all_pairs"] for r in rounds),
        "per_s": pairs / sum(r["elapsed"] for r in rounds),
        "ms_p50": percentile(submit, 50),
        "ms_p99": percentile(submit, 99),
        "complete_ms_p50": percentile(complete, 50),
        "complete_ms_p99": percentile(complete, 99),
        "pairs": pairs,
        "pods": dict(pods),
    }


async def direct_submit(stub, job_id: str) -> str:
    resp = await stub.AdmitJob(
        ws.AdmitJobRequest(spec=ws.JobSpec(job_id=job_id, shape=c.Shape(dims=SHAPE)))
    )
    if resp.job.state != c.JOB_STATE_RUNNING:
        raise RuntimeError(f"{job_id} is {resp.job.state}: {resp.job.reason}")
    return resp.job.pod_id


async def direct_complete(stub, job_id: str) -> None:
    await stub.CompleteJob(ws.CompleteJobRequest(job_id=job_id))


async def cell_submit(stub, job_id: str) -> str:
    resp = await stub.SubmitJob(
        cs.SubmitJobRequest(spec=ws.JobSpec(job_id=job_id, shape=c.Shape(dims=SHAPE)))
    )
    if resp.job.state != c.JOB_STATE_RUNNING:
        raise RuntimeError(f"{job_id} is {resp.job.state}: {resp.job.reason}")
    return resp.job.pod_id


async def cell_complete(stub, job_id: str) -> None:
    await stub.CompleteJob(cs.CompleteCellJobRequest(job_id=job_id))


async def wait_registered(address: str) -> None:
    async with channel(address) as ch:
        cell = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)
        for _ in range(300):
            pods = (await cell.ListPods(cs.ListPodsRequest())).pods
            if {p.registration.pod_id for p in pods if p.capacity.types} >= set(PODS):
                return
            await asyncio.sleep(0.1)
    raise RuntimeError("the pods did not register with the cell")


async def run(
    endpoints: dict[str, str], seconds: float, clients: int, pids: dict[str, int], rounds: int
) -> dict:
    """Direct and through the cell in alternating rounds, so that a change in the load of
    a shared machine weighs on both alike."""
    await wait_registered(endpoints["cell"])
    direct_rounds, cell_rounds = [], []
    direct_cpu: dict[str, float] = collections.defaultdict(float)
    cell_cpu: dict[str, float] = collections.defaultdict(float)
    for r in range(rounds):
        t0 = cpu_seconds(pids)
        direct_rounds.append(
            await measure(
                endpoints["ws-pod-1"],
                workload_scheduler_pb2_grpc.WorkloadSchedulerStub,
                direct_submit,
                direct_complete,
                seconds=seconds / rounds,
                clients=clients,
                tag=f"d{r}",
            )
        )
        t1 = cpu_seconds(pids)
        cell_rounds.append(
            await measure(
                endpoints["cell"],
                cell_scheduler_pb2_grpc.CellSchedulerStub,
                cell_submit,
                cell_complete,
                seconds=seconds / rounds,
                clients=clients,
                tag=f"c{r}",
            )
        )
        t2 = cpu_seconds(pids)
        for k in t2:
            direct_cpu[k] += t1[k] - t0[k]
            cell_cpu[k] += t2[k] - t1[k]
    direct, cell = merged(direct_rounds), merged(cell_rounds)
    ms = 1000.0
    return {
        "cell_per_s": cell["per_s"],
        "cell_ms_p50": cell["ms_p50"],
        "cell_ms_p99": cell["ms_p99"],
        "direct_per_s": direct["per_s"],
        "direct_ms_p50": direct["ms_p50"],
        "direct_ms_p99": direct["ms_p99"],
        "overhead_ratio_p50": cell["ms_p50"] / direct["ms_p50"],
        "cell_complete_ms_p50": cell["complete_ms_p50"],
        "direct_complete_ms_p50": direct["complete_ms_p50"],
        "cell_jobs_by_pod": cell["pods"],
        "cell_pairs": cell["pairs"],
        "direct_pairs": direct["pairs"],
        "clients": clients,
        "seconds": seconds,
        "rounds": rounds,
        # Where the time goes: CPU ms per submit+complete pair, per process (warm-ups included).
        "direct_cpu_ms_per_pair": {
            k: round(v * ms / max(1, direct["all_pairs"]), 2) for k, v in direct_cpu.items()
        },
        "cell_cpu_ms_per_pair": {
            k: round(v * ms / max(1, cell["all_pairs"]), 2) for k, v in cell_cpu.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5, help="alternations of the two phases")
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
                run(stack.endpoints, args.seconds, args.clients, pids, args.rounds)
            )
        finally:
            stack.stop()
    emit(result)


if __name__ == "__main__":
    main()
