#!/usr/bin/env python3
"""Submissions + completions per second through the cell scheduler (two superpods,
8 concurrent clients), beside the same load sent directly to one workload scheduler,
with TLS on (mTLS, as users run it) and, in the same run, off.

    python3 dev.py bench cell_scheduler [--seconds 15] [--clients 8] [--rounds 5]

Redis, the cell_scheduler and two superpods (an ocs_manager and a workload_scheduler
each, 64 blocks of 4x4x4, registered with the cell and reporting to it) run as
separate processes with their default settings, as deployed; the clients run here.
Such a stack runs four times, one at a time, each on its own Redis, in the order
TLS, plaintext, plaintext, TLS (serving TLS with client certificates: every process
and the bench's operator hold a certificate of the stack's local CA; or plaintext
on loopback with bearer tokens). Each client loops:
submit a 2-block slice (8x4x4 chips; the call answers once the slice is RUNNING,
wired by the pod's ocs_manager), then complete it. The same run measures the
clients calling pod-1's workload scheduler directly (AdmitJob + CompleteJob) and
the cell (SubmitJob + CompleteJob), in alternating rounds within each stack's turn
(a shared machine's changing load weighs on all alike), so the cell's cost and
TLS's cost show as ratios. Each client keeps one channel per service for the
stack's turn (handshakes are not timed).

Prints one JSON line. With TLS, as the top-level keys: cell_per_s, cell_ms_p50,
cell_ms_p99, direct_per_s, direct_ms_p50, direct_ms_p99, overhead_ratio_p50 (cell
p50 / direct p50), the completion latencies, the jobs per pod, the counts and the
CPU ms per pair of each process; "plaintext": the same keys without TLS;
tls_cost_cell_throughput and tls_cost_direct_throughput (1 - with TLS / without);
"tls": true.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence

from _common import cpu_seconds, emit, percentile, private_stack, stack_pids, tls_cost

from lightpath.client import channel
from lightpath.embedded_redis import free_port
from lightpath.security.credentials import Credentials
from lightpath.stack import ProcessSpec, Stack
from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import cell_scheduler_pb2_grpc, workload_scheduler_pb2_grpc
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import workload_scheduler_pb2 as ws

PODS = ("pod-1", "pod-2")
SHAPE = [8, 4, 4]


def specs(pods: Sequence[str] = PODS, blocks: int | None = None) -> list[ProcessSpec]:
    """The cell and, for each of `pods`, its ocs_manager (`blocks` blocks, default 64)
    and workload scheduler, registered with the cell."""
    out = [ProcessSpec("cell", "cell_scheduler", free_port())]
    fabric = {"LIGHTPATH_FABRIC_BLOCKS": str(blocks)} if blocks else {}
    for pod in pods:
        out.append(
            ProcessSpec(
                f"ocs-{pod}", "ocs_manager", free_port(), {"LIGHTPATH_POD_ID": pod, **fabric}
            )
        )
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

MODES = (("tls", True), ("plaintext", False))


async def measure(
    stubs: list,
    submit: Submit,
    complete: Complete,
    *,
    seconds: float,
    tag: str,
    warmup: float = 1.0,
) -> dict:
    """One client per stub (each on its own channel), `warmup` seconds unrecorded, then
    `seconds` recorded."""
    submit_ms: list[float] = []
    complete_ms: list[float] = []
    pods: collections.Counter[str] = collections.Counter()
    pairs = 0
    all_pairs = 0  # warm-up included (CPU is counted over the warm-up too)
    counter = 0
    elapsed = 0.0

    async def client(index: int, stub, deadline: float, record: bool) -> None:
        nonlocal pairs, all_pairs, counter
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
    await asyncio.gather(*(client(i, s, warm, False) for i, s in enumerate(stubs)))
    start = time.perf_counter()
    await asyncio.gather(*(client(i, s, start + seconds, True) for i, s in enumerate(stubs)))
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


async def wait_registered(
    address: str, credentials: Credentials, pods: Sequence[str] = PODS
) -> None:
    async with channel(address, credentials=credentials) as ch:
        cell = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)
        for _ in range(300):
            listed = (await cell.ListPods(cs.ListPodsRequest())).pods
            if {p.registration.pod_id for p in listed if p.capacity.types} >= set(pods):
                return
            await asyncio.sleep(0.1)
    raise RuntimeError("the pods did not register with the cell")


class Phases:
    """The rounds and CPU seconds of one stack's direct and cell phases."""

    def __init__(self) -> None:
        self.direct_rounds: list[dict] = []
        self.cell_rounds: list[dict] = []
        self.direct_cpu: dict[str, float] = collections.defaultdict(float)
        self.cell_cpu: dict[str, float] = collections.defaultdict(float)

    def summary(self) -> dict:
        direct, cell = merged(self.direct_rounds), merged(self.cell_rounds)
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
            # Where the time goes: CPU ms per submit+complete pair, per process (warm-ups included).
            "direct_cpu_ms_per_pair": {
                k: round(v * ms / max(1, direct["all_pairs"]), 2)
                for k, v in self.direct_cpu.items()
            },
            "cell_cpu_ms_per_pair": {
                k: round(v * ms / max(1, cell["all_pairs"]), 2) for k, v in self.cell_cpu.items()
            },
        }


# One stack lives at a time (an idle second stack's background work would weigh on
# the measured one); TLS and plaintext in the order A B B A, so neither always goes first.
ORDER = ("tls", "plaintext", "plaintext", "tls")


async def segment(
    stack: Stack,
    ph: Phases,
    pids: dict[str, int],
    *,
    seconds: float,
    clients: int,
    rounds: int,
    tag: str,
) -> None:
    """One stack's share: direct and through the cell in `rounds` alternations."""
    await wait_registered(stack.endpoints["cell"], stack.operator)
    async with contextlib.AsyncExitStack() as channels:

        async def open_stubs(name: str, make_stub: Callable) -> list:
            creds = stack.operator
            return [
                make_stub(
                    await channels.enter_async_context(
                        channel(stack.endpoints[name], credentials=creds)
                    )
                )
                for _ in range(clients)
            ]

        direct_stubs = await open_stubs(
            "ws-pod-1", workload_scheduler_pb2_grpc.WorkloadSchedulerStub
        )
        cell_stubs = await open_stubs("cell", cell_scheduler_pb2_grpc.CellSchedulerStub)
        for r in range(rounds):
            t0 = cpu_seconds(pids)
            ph.direct_rounds.append(
                await measure(
                    direct_stubs,
                    direct_submit,
                    direct_complete,
                    seconds=seconds / rounds,
                    tag=f"{tag}-d{r}",
                )
            )
            t1 = cpu_seconds(pids)
            ph.cell_rounds.append(
                await measure(
                    cell_stubs,
                    cell_submit,
                    cell_complete,
                    seconds=seconds / rounds,
                    tag=f"{tag}-c{r}",
                )
            )
            t2 = cpu_seconds(pids)
            for k in t2:
                ph.direct_cpu[k] += t1[k] - t0[k]
                ph.cell_cpu[k] += t2[k] - t1[k]


def run(seconds: float, clients: int, rounds: int) -> dict:
    phases = {mode: Phases() for mode, _ in MODES}
    tls_of = dict(MODES)
    per_segment = seconds / ORDER.count("tls")
    for i, mode in enumerate(ORDER):
        with private_stack(specs(), tls=tls_of[mode]) as stack:
            pids = stack_pids(stack, stack.redis_url)
            asyncio.run(
                segment(
                    stack,
                    phases[mode],
                    pids,
                    seconds=per_segment,
                    clients=clients,
                    rounds=rounds,
                    tag=f"s{i}",
                )
            )
    common = {"clients": clients, "seconds": seconds, "rounds": rounds * ORDER.count("tls")}
    with_tls = {**phases["tls"].summary(), **common}
    plaintext = {**phases["plaintext"].summary(), **common}
    return {
        **with_tls,
        "tls": True,
        "plaintext": plaintext,
        "tls_cost_cell_throughput": tls_cost(with_tls["cell_per_s"], plaintext["cell_per_s"]),
        "tls_cost_direct_throughput": tls_cost(with_tls["direct_per_s"], plaintext["direct_per_s"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seconds",
        type=float,
        default=15.0,
        help="recorded seconds of each phase (direct, cell) per mode (TLS on, off)",
    )
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternations of direct and cell in each stack's turn"
    )
    args = parser.parse_args()
    emit(run(args.seconds, args.clients, args.rounds))


if __name__ == "__main__":
    main()
