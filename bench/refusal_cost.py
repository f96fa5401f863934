#!/usr/bin/env python3
"""What a refused submit costs the cell (issue 30): CPU of the cell_scheduler process
per SubmitJob refused as INVALID_ARGUMENT before its handler runs, over mTLS as the
operator, 8 calls in flight. Two refusals: a spec with 65 labels (parsed, then
`limits.check`) and a spec flooded with 90,000 empty node types (180 KB, refused by
the wire walk unparsed); GetInfo (open, not audited) beside them as the floor of a
call. The same cell is started as shipped, without its audit log
(LIGHTPATH_AUDIT_LOG empty), without its INFO log line per refusal (LIGHTPATH_LOG_LEVEL
warning) and without either, in the order given by --order, so each piece's share
is the difference in one run.

    python3 dev.py bench refusal_cost [--calls 3000] [--order shipped,no_audit,no_info,neither]

Prints one JSON line: per variant and request, `cpu_us` (the cell's user + system
CPU per call, µs) and `per_s` (calls answered per second), and the load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

import psutil
from _common import bench_ca, emit, operator_credentials, private_redis, start_service

from lightpath import limits

VARIANTS = {
    "shipped": {},
    "no_audit": {"LIGHTPATH_AUDIT_LOG": ""},
    "no_info": {"LIGHTPATH_LOG_LEVEL": "warning"},
    "neither": {"LIGHTPATH_AUDIT_LOG": "", "LIGHTPATH_LOG_LEVEL": "warning"},
}
IN_FLIGHT = 8


def requests() -> dict[str, tuple[str, bytes]]:
    from lightpath.v1 import cell_scheduler_pb2 as cell
    from lightpath.v1 import common_pb2
    from lightpath.v1 import workload_scheduler_pb2 as ws

    labels = cell.SubmitJobRequest(
        spec=ws.JobSpec(job_id="j", labels={f"k{i}": "v" for i in range(65)})
    ).SerializeToString()
    spec = ws.JobSpec(job_id="j").SerializeToString() + (b"\x22\x00" * 90_000)  # node_types
    flood = limits.varint(1 << 3 | 2) + limits.varint(len(spec)) + spec
    return {
        "labels_65": ("/lightpath.v1.CellScheduler/SubmitJob", labels),
        "node_types_flood": ("/lightpath.v1.CellScheduler/SubmitJob", flood),
        "get_info": (
            "/lightpath.v1.CellScheduler/GetInfo",
            common_pb2.GetInfoRequest().SerializeToString(),
        ),
    }


async def drive(address: str, creds, method: str, raw: bytes, calls: int) -> float:
    import grpc

    from lightpath.client import channel

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
                except grpc.aio.AioRpcError as err:
                    if err.code() != grpc.StatusCode.INVALID_ARGUMENT:
                        raise

        await asyncio.gather(*(one() for _ in range(IN_FLIGHT)))
        return time.perf_counter() - start


def cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000, help="calls of each request per variant")
    parser.add_argument("--order", default=",".join(VARIANTS), help="variants, comma-separated")
    args = parser.parse_args()
    from lightpath.security.identity import service_principal

    load = [round(os.getloadavg()[0], 1)]
    out: dict[str, object] = {"calls": args.calls, "in_flight": IN_FLIGHT}
    with tempfile.TemporaryDirectory(prefix="lightpath-bench-") as tmp, private_redis() as url:
        work = Path(tmp)
        ca = bench_ca(work / "pki")
        operator = operator_credentials(ca)
        for variant in args.order.split(","):
            proc, address = start_service(
                "cell_scheduler",
                service_principal("cell_scheduler"),
                ca,
                operator,
                work,
                {"LIGHTPATH_REDIS_URL": url, **VARIANTS[variant]},
            )
            try:
                for name, (method, raw) in requests().items():
                    asyncio.run(drive(address, operator, method, raw, 200))  # warm up
                    before = cpu(proc.pid)
                    took = asyncio.run(drive(address, operator, method, raw, args.calls))
                    used = cpu(proc.pid) - before
                    out[f"{variant}_{name}_cpu_us"] = round(used / args.calls * 1e6)
                    out[f"{variant}_{name}_per_s"] = round(args.calls / took)
            finally:
                proc.terminate()
                proc.wait(10)
            load.append(round(os.getloadavg()[0], 1))
    out["load"] = load
    emit(out)


if __name__ == "__main__":
    main()
