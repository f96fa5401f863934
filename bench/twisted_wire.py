"""Benchmark: wiring a twisted 8x8x16 slice against the regular one (issue 28). One JSON line.

    python3 dev.py bench twisted_wire [--runs 20]

One ocs_manager process (`python -m lightpath_services.ocs_manager`, as deployed, mTLS)
on a private redis-server: a 64-block pod of 4x4x4 blocks (the 4,096-chip
superpod), K = 1, radix 136, the default switch driver without settling delay.
A run wires an 8x8x16 slice (2x2x4 blocks, 768 cross-connects) twisted and
untwisted, each answered in full (every cross-connect listed, the default
view) and released after; the two alternate which goes first from run to run,
so both see the same machine. `*_wire_ms_p50` is the WireSlice latency as the
caller sees it. `load_avg_1m` is the machine's 1-minute load average at the
end: the figures are only comparable at a similar load.

`measure_twisted_wire(runs)` is the measuring part; bench/slice_mix.py may
import it (with bench/ on sys.path, as `dev.py bench` runs a bench).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import tempfile
import time
from pathlib import Path

from _common import bench_ca, emit, operator_credentials, percentile, private_redis, start_service
from ocs_manager import wire_request

from lightpath.client import channel
from lightpath.security.identity import service_principal
from lightpath.v1 import ocs_manager_pb2 as pb
from lightpath.v1 import ocs_manager_pb2_grpc

POD = "bench-twist"
GRID = (2, 2, 4)  # 8x8x16 chips in 4x4x4 blocks
BLOCKS = list(range(16))


async def _wire_and_release(stub, req: pb.WireSliceRequest) -> tuple[float, int]:
    t = time.perf_counter()
    w = await stub.WireSlice(req)
    ms = (time.perf_counter() - t) * 1000
    assert w.twisted == req.twisted and not w.replayed
    await stub.ReleaseSlice(pb.ReleaseSliceRequest(job_id=req.job_id))
    return ms, w.cross_connect_count


async def measure_twisted_wire(runs: int) -> dict:
    """Start a 64-block pod's ocs_manager, wire the twisted and the regular 8x8x16 `runs`
    times each, interleaved; answer the medians, the run count and the load average."""
    with (
        private_redis() as redis_url,
        tempfile.TemporaryDirectory(prefix="lightpath-bench-") as tmp,
    ):
        ca = bench_ca(Path(tmp) / "pki")
        creds = operator_credentials(ca)
        proc: subprocess.Popen | None = None
        try:
            proc, addr = start_service(
                "ocs_manager",
                service_principal("ocs_manager", POD),
                ca,
                creds,
                Path(tmp),
                {
                    "LIGHTPATH_REDIS_URL": redis_url,
                    "LIGHTPATH_POD_ID": POD,
                    "LIGHTPATH_FABRIC_BLOCK_SHAPE": "4x4x4",
                    "LIGHTPATH_FABRIC_BLOCKS": "64",
                    "LIGHTPATH_FABRIC_OCS_PER_AXIS": "1",
                    "LIGHTPATH_FABRIC_OCS_RADIX": "136",
                },
            )
            async with channel(addr, credentials=creds) as ch:
                stub = ocs_manager_pb2_grpc.OcsManagerStub(ch)
                reqs = {
                    True: wire_request("twisted", GRID, BLOCKS, twisted=True),
                    False: wire_request("regular", GRID, BLOCKS),
                }
                for _ in range(2):  # warm up: connection, scripts, caches
                    for req in reqs.values():
                        await _wire_and_release(stub, req)
                samples: dict[bool, list[float]] = {True: [], False: []}
                counts: dict[bool, int] = {}
                for i in range(runs):
                    for twisted in (True, False) if i % 2 == 0 else (False, True):
                        ms, counts[twisted] = await _wire_and_release(stub, reqs[twisted])
                        samples[twisted].append(ms)
                report = await stub.CheckInvariants(
                    pb.CheckInvariantsRequest(compare_switches=True)
                )
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(10)
    return {
        "twisted_wire_ms_p50": percentile(samples[True], 50),
        "untwisted_wire_ms_p50": percentile(samples[False], 50),
        "twisted_wire_ms_p99": percentile(samples[True], 99),
        "untwisted_wire_ms_p99": percentile(samples[False], 99),
        "twisted_cross_connects": counts.get(True, 0),
        "untwisted_cross_connects": counts.get(False, 0),
        "runs": runs,
        "invariants_ok": report.ok,
        "load_avg_1m": os.getloadavg()[0],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    emit(asyncio.run(measure_twisted_wire(args.runs)))
