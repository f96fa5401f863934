#!/usr/bin/env python3
"""Admissions + completions per second through gRPC, with the real ocs_manager wiring
every slice: 2-block slices (8x4x4 chips) on a 64-block pod, 8 concurrent clients,
with TLS on (mTLS, as users run it) and, in the same run, off.

    python3 dev.py bench workload_scheduler [--seconds 15] [--clients 8]

Redis, the ocs_manager and the workload_scheduler run as separate processes (as
deployed, default settings: info logs, no trace export); the clients run here. Such
a stack runs four times, one at a time, each on its own Redis, in the order TLS,
plaintext, plaintext, TLS (so a shared machine's changing load weighs on both
alike): serving TLS with client certificates (every process and the bench's
operator hold a certificate of the stack's local CA), or plaintext on loopback
(bearer tokens). In each turn every client keeps one channel and loops, after a
2 s warm-up: AdmitJob (answers once the slice is RUNNING, i.e. wired by the
ocs_manager) then CompleteJob (answers once it is unwired).

Prints one JSON line. With TLS, as the top-level keys: admit_complete_per_s,
admit_ms_p50, admit_ms_p99, plus complete_ms_p50/p99, pairs, clients, seconds
(recorded) and cpu_ms_per_pair (CPU ms per pair of each process: the services,
Redis, and this client); "plaintext": the same keys without TLS;
tls_cost_throughput (1 - with TLS / without); turns; "tls": true.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import time

from _common import cpu_seconds, emit, percentile, private_stack, stack_pids, tls_cost

from lightpath.client import channel
from lightpath.embedded_redis import free_port
from lightpath.stack import ProcessSpec, Stack
from lightpath.v1 import common_pb2, workload_scheduler_pb2, workload_scheduler_pb2_grpc

POD = "pod-bench"
MODES = (("tls", True), ("plaintext", False))
WARMUP_S = 2.0


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


class Tally:
    """What one stack's recorded rounds add up to."""

    def __init__(self) -> None:
        self.admit_ms: list[float] = []
        self.complete_ms: list[float] = []
        self.pairs = 0
        self.elapsed = 0.0
        self.cpu: dict[str, float] = collections.defaultdict(float)
        self.counter = 0  # job ids, unique over the stack's whole run

    @property
    def per_s(self) -> float:
        return self.pairs / self.elapsed if self.elapsed else float("nan")

    def summary(self, clients: int) -> dict[str, object]:
        ms = 1000.0
        return {
            "admit_complete_per_s": self.per_s,
            "admit_ms_p50": percentile(self.admit_ms, 50),
            "admit_ms_p99": percentile(self.admit_ms, 99),
            "complete_ms_p50": percentile(self.complete_ms, 50),
            "complete_ms_p99": percentile(self.complete_ms, 99),
            "pairs": self.pairs,
            "clients": clients,
            "seconds": self.elapsed,
            # Where the time goes: CPU ms per admit+complete pair, per process ("client": this one).
            "cpu_ms_per_pair": {
                k: round(v * ms / max(1, self.pairs), 2) for k, v in self.cpu.items()
            },
        }


async def drive(stubs: list, tally: Tally, seconds: float, record: bool) -> None:
    """One client per stub for `seconds`; recorded into `tally` when `record`."""

    async def client(index: int, stub, deadline: float) -> None:
        while time.perf_counter() < deadline:
            tally.counter += 1
            job_id = f"b{index}-{tally.counter}"
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
                tally.admit_ms.append((t1 - t0) * 1000)
                tally.complete_ms.append((t2 - t1) * 1000)
                tally.pairs += 1

    start = time.perf_counter()
    await asyncio.gather(*(client(i, s, start + seconds) for i, s in enumerate(stubs)))
    if record:
        tally.elapsed += time.perf_counter() - start


# One stack lives at a time (an idle second stack's background work would weigh on
# the measured one); TLS and plaintext in the order A B B A, so neither always goes first.
ORDER = ("tls", "plaintext", "plaintext", "tls")


async def segment(
    stack: Stack, tally: Tally, pids: dict[str, int], seconds: float, clients: int
) -> None:
    async with contextlib.AsyncExitStack() as channels:
        creds = stack.operator
        stubs = [
            workload_scheduler_pb2_grpc.WorkloadSchedulerStub(
                await channels.enter_async_context(
                    channel(stack.endpoints["ws-bench"], credentials=creds)
                )
            )
            for _ in range(clients)
        ]
        # warm up: connections and handshakes, script loading
        await drive(stubs, tally, WARMUP_S, record=False)
        cpu0 = cpu_seconds(pids)
        await drive(stubs, tally, seconds, record=True)
        cpu1 = cpu_seconds(pids)
        for k in cpu1:
            tally.cpu[k] += cpu1[k] - cpu0[k]


def run(seconds: float, clients: int) -> dict[str, object]:
    tallies = {mode: Tally() for mode, _ in MODES}
    tls_of = dict(MODES)
    per_segment = seconds / ORDER.count("tls")
    for mode in ORDER:
        with private_stack(specs(), tls=tls_of[mode]) as stack:
            pids = stack_pids(stack, stack.redis_url)
            asyncio.run(segment(stack, tallies[mode], pids, per_segment, clients))
    with_tls = tallies["tls"].summary(clients)
    plaintext = tallies["plaintext"].summary(clients)
    return {
        **with_tls,
        "tls": True,
        "plaintext": plaintext,
        "tls_cost_throughput": tls_cost(tallies["tls"].per_s, tallies["plaintext"].per_s),
        "turns": len(ORDER),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seconds", type=float, default=15.0, help="recorded seconds per mode (TLS on, off)"
    )
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    emit(run(args.seconds, args.clients))


if __name__ == "__main__":
    main()
