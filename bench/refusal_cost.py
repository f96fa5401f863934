#!/usr/bin/env python3
"""What a refused submit costs the cell (issue 30): CPU of the cell_scheduler process
per SubmitJob refused before its handler runs, over mTLS as the operator, 8 calls in
flight. Three refusals: a spec with 65 labels (INVALID_ARGUMENT: parsed, then
`limits.check`), a spec flooded with 90,000 empty node types (180 KB, INVALID_ARGUMENT
from the wire walk, unparsed) and a valid 2-block submit shed at the door
(`shed_submit`: RESOURCE_EXHAUSTED, reason OVERLOADED, what most calls at 4x the
sustainable load are answered); GetInfo (open, not audited, never shed) beside them as
the floor of a call. To shed every submit the cell serves one call at a time with no
queue (LIGHTPATH_MAX_INFLIGHT 1, LIGHTPATH_MAX_QUEUED 0; the other requests never take
a slot) and that slot is held by a GetJob waiting on the bench's Redis, paused
(SIGSTOP) for the shed phase.

The same cell is started as shipped, without its audit log (LIGHTPATH_AUDIT_LOG
empty), without its INFO log line per refusal (LIGHTPATH_LOG_LEVEL warning) and without
either, in the order given by --order, so each piece's share is the difference in one
run; `--baseline DIR` (another checkout, e.g. `git worktree add /tmp/base main`) adds
the variant `baseline`: that tree's cell as shipped, interleaved with this one's.

    python3 dev.py bench refusal_cost [--calls 3000] [--order shipped,no_audit,no_info,neither]
        [--baseline DIR] [--rounds 1]

Prints one JSON line: per variant and request, `cpu_us` (the cell's user + system
CPU per call, µs), `caller_cpu_us` (the bench's own, as the caller: on a machine the
callers share with the stack, as bench/chaos.py's do, a refusal costs both) and `per_s`
(calls answered per second), and the load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
from _common import bench_ca, emit, operator_credentials, start_service

from lightpath import limits
from lightpath.embedded_redis import EmbeddedRedis

VARIANTS = {
    "shipped": {},
    "no_audit": {"LIGHTPATH_AUDIT_LOG": ""},
    "no_info": {"LIGHTPATH_LOG_LEVEL": "warning"},
    "neither": {"LIGHTPATH_AUDIT_LOG": "", "LIGHTPATH_LOG_LEVEL": "warning"},
}
# One call served at a time, none queued, a fixed limit: with that slot held, every
# submit is shed (the module doc).
SHED_ENV = {
    "LIGHTPATH_MAX_INFLIGHT": "1",
    "LIGHTPATH_MAX_QUEUED": "0",
    "LIGHTPATH_TARGET_LATENCY_S": "0",
}
IN_FLIGHT = 8


def requests() -> dict[str, tuple[str, bytes, str]]:
    """name: (method, request bytes, the status code every call of it answers)."""
    from lightpath.v1 import cell_scheduler_pb2 as cell
    from lightpath.v1 import common_pb2
    from lightpath.v1 import workload_scheduler_pb2 as ws

    labels = cell.SubmitJobRequest(
        spec=ws.JobSpec(job_id="j", labels={f"k{i}": "v" for i in range(65)})
    ).SerializeToString()
    spec = ws.JobSpec(job_id="j").SerializeToString() + (b"\x22\x00" * 90_000)  # node_types
    flood = limits.varint(1 << 3 | 2) + limits.varint(len(spec)) + spec
    # as bench/chaos.py's overload shape submits: 2 blocks, not waiting for capacity
    submit = cell.SubmitJobRequest(
        spec=ws.JobSpec(
            job_id="shed-1",
            shape=common_pb2.Shape(dims=[8, 4, 4]),
            when_no_capacity=ws.WHEN_NO_CAPACITY_FAIL,
        )
    ).SerializeToString()
    return {
        "labels_65": ("/lightpath.v1.CellScheduler/SubmitJob", labels, "INVALID_ARGUMENT"),
        "node_types_flood": ("/lightpath.v1.CellScheduler/SubmitJob", flood, "INVALID_ARGUMENT"),
        "shed_submit": ("/lightpath.v1.CellScheduler/SubmitJob", submit, "RESOURCE_EXHAUSTED"),
        "get_info": (
            "/lightpath.v1.CellScheduler/GetInfo",
            common_pb2.GetInfoRequest().SerializeToString(),
            "OK",
        ),
    }


async def drive(address: str, creds, method: str, raw: bytes, expect: str, calls: int) -> float:
    import grpc

    from lightpath.client import channel, error_report

    async with channel(address, credentials=creds, max_attempts=1) as ch:
        call = ch.unary_unary(
            method, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        left = calls
        start = time.perf_counter()

        async def one() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                try:
                    await call(raw, timeout=30)
                    code, reason = "OK", ""
                except grpc.aio.AioRpcError as err:
                    code, reason = err.code().name, error_report(err).reason
                # a shed submit is OVERLOADED with a retry delay, not any exhaustion
                if code != expect or (code == "RESOURCE_EXHAUSTED" and reason != "OVERLOADED"):
                    raise RuntimeError(f"{method} answered {code} {reason}, expected {expect}")

        await asyncio.gather(*(one() for _ in range(IN_FLIGHT)))
        return time.perf_counter() - start


@contextlib.contextmanager
def slot_held(redis: EmbeddedRedis, address: str, creds) -> Iterator[None]:
    """The cell's one slot taken by a GetJob that waits on `redis`, paused meanwhile."""
    import threading

    from lightpath.client import channel
    from lightpath.v1 import cell_scheduler_pb2 as cell
    from lightpath.v1 import cell_scheduler_pb2_grpc

    loop = asyncio.new_event_loop()
    held = asyncio.Event()

    async def hold() -> None:
        async with channel(address, credentials=creds, max_attempts=1) as ch:
            stub = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)
            call = stub.GetJob(cell.GetCellJobRequest(job_id="held"), timeout=600)
            await asyncio.sleep(1.0)  # sent, admitted, waiting on Redis
            held.set()
            with contextlib.suppress(Exception):
                await call

    os.kill(redis.process.pid, signal.SIGSTOP)
    task = loop.create_task(hold())
    thread = threading.Thread(target=loop.run_until_complete, args=(task,), daemon=True)
    thread.start()
    try:
        while not held.is_set():
            time.sleep(0.05)
        yield
    finally:
        os.kill(redis.process.pid, signal.SIGCONT)
        thread.join(30)
        loop.close()


def cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def measure(proc, address: str, creds, redis: EmbeddedRedis, calls: int) -> dict[str, float]:
    """Per request: the cell's and the caller's CPU per call (µs), the calls answered per second."""
    out: dict[str, float] = {}
    for name, (method, raw, expect) in requests().items():
        with (
            slot_held(redis, address, creds) if name == "shed_submit" else contextlib.nullcontext()
        ):
            asyncio.run(drive(address, creds, method, raw, expect, 200))  # warm up
            before, caller = cpu(proc.pid), cpu(os.getpid())
            took = asyncio.run(drive(address, creds, method, raw, expect, calls))
            used, called = cpu(proc.pid) - before, cpu(os.getpid()) - caller
        out[f"{name}_cpu_us"] = used / calls * 1e6
        out[f"{name}_caller_cpu_us"] = called / calls * 1e6
        out[f"{name}_per_s"] = calls / took
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000, help="calls of each request per variant")
    parser.add_argument(
        "--order",
        help="variants, comma-separated (default: every one, `baseline` first with --baseline)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout: its cell as shipped runs as the variant `baseline`",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the variants in turn this many times: the median of each figure, its range "
        "beside it (`..._range`)",
    )
    args = parser.parse_args()
    from lightpath.security.identity import service_principal

    variants = (args.order or ",".join(["baseline"] * bool(args.baseline) + [*VARIANTS])).split(",")
    unknown = set(variants) - {*VARIANTS, "baseline"}
    if unknown:
        parser.error(f"unknown variant(s) {sorted(unknown)}: {', '.join(VARIANTS)} or baseline")
    if "baseline" in variants and not args.baseline:
        parser.error("the variant `baseline` needs --baseline DIR")
    load = [round(os.getloadavg()[0], 1)]
    seen: dict[str, list[float]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="lightpath-bench-") as tmp,
        EmbeddedRedis(Path(tmp) / "redis", appendonly=False) as redis,
    ):
        work = Path(tmp)
        ca = bench_ca(work / "pki")
        operator = operator_credentials(ca)
        for variant in variants * args.rounds:
            proc, address = start_service(
                "cell_scheduler",
                service_principal("cell_scheduler"),
                ca,
                operator,
                work,
                {"LIGHTPATH_REDIS_URL": redis.url, **SHED_ENV, **VARIANTS.get(variant, {})},
                root=args.baseline if variant == "baseline" else None,
            )
            try:
                for key, value in measure(proc, address, operator, redis, args.calls).items():
                    seen.setdefault(f"{variant}_{key}", []).append(value)
            finally:
                proc.terminate()
                proc.wait(10)
            load.append(round(os.getloadavg()[0], 1))
    out: dict[str, object] = {"calls": args.calls, "in_flight": IN_FLIGHT, "rounds": args.rounds}
    for key, values in seen.items():
        out[key] = round(statistics.median(values))
        if len(values) > 1:
            out[f"{key}_range"] = [round(min(values)), round(max(values))]
    out["load"] = load
    emit(out)


if __name__ == "__main__":
    main()
