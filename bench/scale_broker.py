"""Core broker decisions as live reservations grow (issue 15): 1k, 10k and 100k
live reservations on 1,000 devices, near saturation. One JSON line.

    python3 dev.py bench scale_broker [--calls 400] [--quick]

Per point a fresh private redis-server and a real broker process
(`python -m lightpath_services.core_broker`, mTLS with client certificates required);
1,000 devices (GPU, TPU, EDGE_TPU; 64, 96 or 128 cores) registered over gRPC,
then the live reservations made through BatchReserve (500 a call, each naming
one device and an exact window): every device is tiled in lanes of 4-16
cores, back to back from a few seconds after now with an occasional short
gap, so at most a few cores of a twentieth of the devices are free now and
for as long as the lanes run (N / 1,000 reservations a device: one long one
each at 1k, about 100 at 100k, some six hours deep).

Then one sequential client (its own application) sends Reserve calls of a mix
that mostly asks for more than is free now: 16 to 1,024 cores for 5 to 60 minutes,
now or within ten minutes, some with a latest end, a third of them on GPUs
only, accepting nothing, PARTIAL, DEFERRED or both — so most decisions are
the searches over time (PARTIAL, DEFERRED, or REJECTED with the earliest
possible start). Each point reports p50 / p99 ms of a Reserve over gRPC, the
CPU ms per decision of the broker, of Redis and of this client, and the
outcomes with the DEFERRED + REJECTED share. At the 100k point, BatchReserve
calls of 500 requests of the same mix are timed too (each decided in one
batch and committed in one Lua call).

Named keys: `broker_decide_ms_p99_100k`, `broker_batch500_s` (the median of
the batch calls). Benchmarks print; they never assert a time.
`measure(quick=True)` is the short run `bench/scale.py` can call (fewer calls,
one batch).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from collections import Counter
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
    start_service,
)
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from lightpath.client import channel
from lightpath.embedded_redis import stop_process
from lightpath.security.credentials import Credentials
from lightpath.security.identity import Principal, service_principal
from lightpath.security.pki import LocalCA
from lightpath.v1 import common_pb2, core_broker_pb2_grpc
from lightpath.v1 import core_broker_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
DEVICES = 1000
POINTS = (1_000, 10_000, 100_000)
KINDS = (pb.DEVICE_KIND_GPU, pb.DEVICE_KIND_TPU, pb.DEVICE_KIND_EDGE_TPU)
ACCEPT = (
    [],
    [pb.OUTCOME_PARTIAL],
    [pb.OUTCOME_DEFERRED],
    [pb.OUTCOME_PARTIAL, pb.OUTCOME_DEFERRED],
)
S = 1000


def ts(ms: int) -> Timestamp:
    t = Timestamp()
    t.FromMilliseconds(ms)
    return t


def device_cores(rng: random.Random) -> list[int]:
    return [rng.choice((64, 96, 128)) for _ in range(DEVICES)]


def tiling(cores: list[int], live: int, rng: random.Random, clock):
    """(device, cores, start, end) of `live` reservations tiling every device in lanes,
    each device's from a few seconds after `clock()` when its turn comes."""
    per = live // len(cores)
    for i, c in enumerate(cores):
        now = clock()
        left = c - (rng.randrange(1, 9) if rng.random() < 0.05 else 0)
        lanes = []
        while left > 0:
            w = min(left, rng.randrange(4, 17))
            left -= w
            lanes.append(w)
        if per < len(lanes):  # few reservations a device: fewer, wider lanes
            lanes = [sum(lanes[k::per]) for k in range(per)]
        counts = [per // len(lanes) + (k < per % len(lanes)) for k in range(len(lanes))]
        for w, n in zip(lanes, counts, strict=True):
            t = now + rng.randrange(10, 60) * S
            for _ in range(n):
                d = rng.randrange(300, 3600) * S if per > 1 else rng.randrange(3, 6) * 3600 * S
                yield f"dev-{i:04d}", w, t, t + d
                t += d + (rng.randrange(1, 300) * S if rng.random() < 0.1 else 0)


def exact(rid: str, device: str, cores: int, start: int, end: int) -> pb.ReservationRequest:
    return pb.ReservationRequest(
        reservation_id=rid,
        cores=cores,
        duration=Duration(seconds=(end - start) // S),
        window=common_pb2.TimeWindow(earliest_start=ts(start), latest_end=ts(end)),
        device_ids=[device],
        accept=[],
    )


def mixed(rid: str, rng: random.Random, now: int) -> pb.ReservationRequest:
    """A request of the measured mix: more cores than are free now, most of the time."""
    duration_s = rng.randrange(300, 3600)
    start = now + (0 if rng.random() < 0.6 else rng.randrange(0, 600) * S)
    window = common_pb2.TimeWindow(earliest_start=ts(start))
    if rng.random() < 0.7:
        window.latest_end.CopyFrom(ts(start + (duration_s + rng.randrange(60, 7200)) * S))
    return pb.ReservationRequest(
        reservation_id=rid,
        cores=rng.choice((16, 64, 128, 256, 512, 1024)),
        duration=Duration(seconds=duration_s),
        window=window,
        device_kind=pb.DEVICE_KIND_GPU if rng.random() < 1 / 3 else 0,
        accept=rng.choice(ACCEPT),
        priority_hint=rng.randrange(1, 101),
    )


def start_broker(redis_url: str, ca: LocalCA, creds: Credentials, workdir: Path):
    return start_service(
        "core_broker",
        service_principal("core_broker"),
        ca,
        creds,
        workdir,
        {
            "LIGHTPATH_TLS_CLIENT_AUTH": "require",
            "LIGHTPATH_REDIS_URL": redis_url,
            "LIGHTPATH_CB_OPERATOR_TOKEN": "",
            "LIGHTPATH_TOKEN_FILE": "",
            "LIGHTPATH_LOG_LEVEL": "warning",
        },
    )


async def populate(address: str, operator: Credentials, app: Credentials, live: int) -> dict:
    rng = random.Random(live)
    cores = device_cores(rng)
    ch = channel(address, default_timeout=600, credentials=operator)
    stub = core_broker_pb2_grpc.CoreBrokerStub(ch)
    for i, c in enumerate(cores):
        await stub.RegisterDevice(
            pb.RegisterDeviceRequest(
                device=pb.Device(device_id=f"dev-{i:04d}", kind=KINDS[i % len(KINDS)], cores=c)
            )
        )
    await ch.close()
    ch = channel(address, default_timeout=600, credentials=app)
    stub = core_broker_pb2_grpc.CoreBrokerStub(ch)
    t = time.perf_counter()
    outcomes: Counter[str] = Counter()
    batch: list[pb.ReservationRequest] = []
    rows = tiling(cores, live, rng, lambda: int(time.time() * 1000))
    for k, row in enumerate(rows):
        batch.append(exact(f"live-{k}", *row))
        if len(batch) == 500:
            resp = await stub.BatchReserve(pb.BatchReserveRequest(requests=batch))
            outcomes.update(
                pb.Outcome.Name(r.outcome).removeprefix("OUTCOME_") for r in resp.reservations
            )
            batch = []
    if batch:
        resp = await stub.BatchReserve(pb.BatchReserveRequest(requests=batch))
        outcomes.update(
            pb.Outcome.Name(r.outcome).removeprefix("OUTCOME_") for r in resp.reservations
        )
    await ch.close()
    return {
        "made": outcomes.get("GRANTED", 0),
        "refused": sum(outcomes.values()) - outcomes.get("GRANTED", 0),
        "populate_s": time.perf_counter() - t,
        "total_cores": sum(cores),
    }


async def decisions(address: str, app: Credentials, calls: int, tag: str) -> dict:
    rng = random.Random(tag)
    ch = channel(address, default_timeout=120, credentials=app)
    stub = core_broker_pb2_grpc.CoreBrokerStub(ch)
    lat: list[float] = []
    outcomes: Counter[str] = Counter()
    for i in range(calls):
        req = mixed(f"{tag}-{i}", rng, int(time.time() * 1000))
        t = time.perf_counter()
        resp = await stub.Reserve(pb.ReserveRequest(request=req))
        lat.append((time.perf_counter() - t) * 1000)
        outcomes[pb.Outcome.Name(resp.outcome).removeprefix("OUTCOME_")] += 1
    await ch.close()
    return {"lat": lat, "outcomes": outcomes}


async def batches(address: str, app: Credentials, n: int, tag: str) -> dict:
    rng = random.Random(tag)
    ch = channel(address, default_timeout=600, credentials=app)
    stub = core_broker_pb2_grpc.CoreBrokerStub(ch)
    took: list[float] = []
    outcomes: Counter[str] = Counter()
    for b in range(n):
        now = int(time.time() * 1000)
        reqs = [mixed(f"{tag}-{b}-{i}", rng, now) for i in range(500)]
        t = time.perf_counter()
        resp = await stub.BatchReserve(pb.BatchReserveRequest(requests=reqs))
        took.append(time.perf_counter() - t)
        outcomes.update(
            pb.Outcome.Name(r.outcome).removeprefix("OUTCOME_") for r in resp.reservations
        )
    await ch.close()
    return {"s": took, "outcomes": outcomes}


def share(outcomes: Counter[str]) -> float:
    n = sum(outcomes.values())
    return (outcomes.get("DEFERRED", 0) + outcomes.get("REJECTED", 0)) / n if n else float("nan")


def point(live: int, calls: int, nbatch: int) -> dict:
    with private_redis() as url, tempfile.TemporaryDirectory(prefix="lightpath-bench-") as tmp:
        workdir = Path(tmp)
        ca = bench_ca(workdir / "pki")
        operator = operator_credentials(ca)
        proc, address = start_broker(url, ca, operator, workdir)
        try:
            # the application: registered by the operator, calling with its certificate + token
            async def register() -> str:
                ch = channel(address, credentials=operator)
                stub = core_broker_pb2_grpc.CoreBrokerStub(ch)
                resp = await stub.RegisterApplication(
                    pb.RegisterApplicationRequest(
                        application_id="bench", qos_level=pb.QOS_LEVEL_PREMIUM
                    )
                )
                await ch.close()
                return resp.token

            token = asyncio.run(register())
            files = ca.issue(Principal("application", "bench"))
            app = Credentials.from_files(files.ca, files.cert, files.key, token=token)
            made = asyncio.run(populate(address, operator, app, live))
            asyncio.run(decisions(address, app, 20, "warm"))
            pids = {"broker": proc.pid}
            rpid = redis_pid(url)
            if rpid:
                pids["redis"] = rpid
            cpu0 = cpu_seconds(pids)
            res = asyncio.run(decisions(address, app, calls, "m"))
            cpu = cpu_ms_per(cpu0, cpu_seconds(pids), calls)
            out = {
                "live_reservations": made["made"],
                "populate_refused": made["refused"],
                "populate_s": made["populate_s"],
                "decide_ms_p50": percentile(res["lat"], 50),
                "decide_ms_p99": percentile(res["lat"], 99),
                "decide_ms_max": max(res["lat"]),
                "cpu_ms_per_decision": cpu,
                "outcomes": dict(res["outcomes"]),
                "deferred_or_rejected_share": share(res["outcomes"]),
                "calls": calls,
            }
            if nbatch:
                cpu0 = cpu_seconds(pids)
                b = asyncio.run(batches(address, app, nbatch, "b"))
                out["batch500_s"] = b["s"]
                out["batch500_s_median"] = percentile(b["s"], 50)
                out["batch500_cpu_ms_per_request"] = cpu_ms_per(
                    cpu0, cpu_seconds(pids), 500 * nbatch
                )
                out["batch500_outcomes"] = dict(b["outcomes"])
                out["batch500_deferred_or_rejected_share"] = share(b["outcomes"])
            return out
        finally:
            stop_process(proc, 15)


def measure(
    quick: bool = False, calls: int | None = None, points: tuple[int, ...] = POINTS
) -> dict:
    """Broker decisions at 1k / 10k / 100k live reservations on 1,000 devices near
    saturation; `quick`: 60 calls a point and one batch of 500 instead of 400 and 3."""
    n = calls if calls is not None else (60 if quick else 400)
    curve = {}
    for live in points:
        curve[str(live)] = point(live, n, (1 if quick else 3) if live == points[-1] else 0)
    top = curve[str(points[-1])]
    return {
        "bench": "scale_broker",
        "broker_decisions": curve,
        # the named keys: at the largest point (100k unless --points says otherwise)
        "largest_point": points[-1],
        "broker_decide_ms_p50_100k": top["decide_ms_p50"],
        "broker_decide_ms_p99_100k": top["decide_ms_p99"],
        "broker_deferred_or_rejected_share_100k": top["deferred_or_rejected_share"],
        "broker_batch500_s": top["batch500_s_median"],
        "devices": DEVICES,
        "transport": "mtls",
        "load_avg_1m": os.getloadavg()[0],
        "target": {"broker_decide_ms_p99_100k": 20, "broker_batch500_s": 1.0},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--points", default=",".join(map(str, POINTS)), help="live reservations per point"
    )
    args = parser.parse_args()
    emit(measure(args.quick, args.calls, tuple(int(p) for p in args.points.split(","))))
