"""Full-pod wiring as the pod grows (issue 15, OCS-9): 64, 256 and 1,024 blocks. One JSON line.

    python3 dev.py bench scale_wiring [--runs 20] [--quick]

One ocs_manager process per pod size (`python -m lightpath_services.ocs_manager`, as deployed,
mTLS with client certificates required) on one private redis-server: blocks of
4x4x4, K = 1, radix 2N (the least a pod of N blocks needs), the default (Redis)
switch driver without settling delay. For each size one slice of every block
(a torus of 4x4x4 / 8x8x4 / 16x8x8 blocks, 3,072 / 12,288 / 49,152 cross-connects)
is wired then released, `--runs` times, one call at a time, with the counts-only
view the workload scheduler asks for; the full view (every cross-connect listed)
is timed too, fewer times.

Per size: wire / release p50 and p99 (ms), CPU ms per wire+release of the service,
of Redis and of this client, µs per cross-connect of the p50 wire. `baseline` holds
figures this bench measured before the tables moved to layout 2 (commit d0cb0fd, on
the machine the change was made on; a recorded number, not re-run), and
`us_per_xc_1024_vs_baseline` divides today's µs per cross-connect at 1,024 blocks by it.
`measure(quick=True)` is the short run `bench/scale.py` can call.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from _common import (
    bench_ca,
    cpu_ms_per,
    cpu_seconds,
    emit,
    operator_credentials,
    percentile,
    private_redis,
    redis_pid,
)
from ocs_manager import start_server, wire_request

from lightpath.client import channel
from lightpath.v1 import ocs_manager_pb2 as pb
from lightpath.v1 import ocs_manager_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
GRIDS = {64: (4, 4, 4), 256: (8, 8, 4), 1024: (16, 8, 8)}

# Measured with this bench (20 runs) at d0cb0fd, before layout 2 (lua.py), on the 2-core
# machine the change was made on: one field per (axis, port), ~1 µs of Redis Lua each.
BASELINE = {
    "commit": "d0cb0fd",
    "full_pod_wire_ms_p50_64": 29.6,
    "full_pod_wire_ms_p50_256": 51.7,
    "full_pod_wire_ms_p50_1024": 230.6,
    "full_pod_wire_ms_p99_1024": 428.0,
    "full_pod_wire_us_per_xc_1024": 4.69,
    "full_pod_wire_full_view_ms_p50_1024": 328.4,
    "cpu_ms_per_wire_release_1024": {"ocs_manager": 40.0, "redis": 413.5, "client": 2.0},
}


async def full_pod(stub, blocks: int, runs: int, view) -> tuple[list[float], list[float], int]:
    """Wire then release one slice of every block `runs` times: (wire ms, release ms, count)."""
    req = wire_request("full-pod", list(GRIDS[blocks]), list(range(blocks)), view)
    rel = pb.ReleaseSliceRequest(job_id="full-pod")
    wire, release, count = [], [], 0
    for _ in range(runs):
        t = time.perf_counter()
        w = await stub.WireSlice(req)
        wire.append((time.perf_counter() - t) * 1000)
        count = w.cross_connect_count
        t = time.perf_counter()
        await stub.ReleaseSlice(rel)
        release.append((time.perf_counter() - t) * 1000)
    return wire, release, count


async def one_size(stub, blocks: int, runs: int, pids: dict[str, int]) -> dict:
    await full_pod(stub, blocks, 2, pb.WIRING_VIEW_COUNTS)  # warm up: channel, scripts, hashes
    before = cpu_seconds(pids)
    wire, release, count = await full_pod(stub, blocks, runs, pb.WIRING_VIEW_COUNTS)
    cpu = cpu_ms_per(before, cpu_seconds(pids), runs)
    full, _, _ = await full_pod(stub, blocks, max(3, runs // 4), pb.WIRING_VIEW_FULL)
    p50 = percentile(wire, 50)
    return {
        "wire_ms_p50": p50,
        "wire_ms_p99": percentile(wire, 99),
        "release_ms_p50": percentile(release, 50),
        "release_ms_p99": percentile(release, 99),
        "wire_full_view_ms_p50": percentile(full, 50),
        "cpu_ms_per_wire_release": cpu,
        "cross_connects": count,
        "us_per_xc": p50 * 1000 / max(1, count),
        "runs": runs,
    }


async def run(runs: int) -> dict:
    out: dict = {}
    with (
        private_redis() as redis_url,
        tempfile.TemporaryDirectory(prefix="lightpath-bench-") as tmp,
    ):
        ca = bench_ca(Path(tmp) / "pki")
        creds = operator_credentials(ca)
        rpid = redis_pid(redis_url)
        for blocks in GRIDS:
            pod = f"wire-{blocks}"
            proc, address = start_server(
                redis_url, pod, 1, ca, creds, Path(tmp), blocks=blocks, radix=2 * blocks
            )
            try:
                pids = {"ocs_manager": proc.pid, **({"redis": rpid} if rpid else {})}
                async with channel(address, credentials=creds) as ch:
                    stub = ocs_manager_pb2_grpc.OcsManagerStub(ch)
                    point = await one_size(stub, blocks, runs, pids)
                    check = await stub.CheckInvariants(
                        pb.CheckInvariantsRequest(compare_switches=True)
                    )
                    point["invariants_ok"] = check.ok
                out[blocks] = point
            finally:
                proc.terminate()
                proc.wait(10)
    return out


def measure(quick: bool = False, runs: int | None = None) -> dict:
    """Full-pod wire at 64 / 256 / 1,024 blocks; `quick`: 5 runs per size instead of 20."""
    n = runs if runs is not None else (5 if quick else 20)
    points = asyncio.run(run(n))
    result: dict = {"full_pod_wire": {str(b): p for b, p in points.items()}}
    for b, p in points.items():
        result[f"full_pod_wire_ms_p50_{b}"] = p["wire_ms_p50"]
        result[f"full_pod_wire_ms_p99_{b}"] = p["wire_ms_p99"]
    result["full_pod_wire_us_per_xc_1024"] = points[1024]["us_per_xc"]
    base = BASELINE["full_pod_wire_us_per_xc_1024"]
    result["us_per_xc_1024_vs_baseline"] = points[1024]["us_per_xc"] / base if base else None
    result["baseline"] = BASELINE
    result["invariants_ok"] = all(p["invariants_ok"] for p in points.values())
    result["runs"] = n
    result["tls"] = True
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    emit(measure(args.quick, args.runs))
