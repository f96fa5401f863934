"""Core broker: reservation decisions per second and their latency over gRPC.

A real broker process (`python -m lightpath_services.core_broker`) on a private
redis-server; 1,000 devices, an operator latency table, 8 applications and
10,000 live reservations made through the API; then 8 concurrent clients (own
channel each, own application each) send Reserve calls with a mix of sizes,
windows, placement policies and accepted outcomes; a fifth of them name one to
three of ten "hot" devices that the live load keeps nearly full, so PARTIAL,
DEFERRED and REJECTED (the searches over time) are part of the mix. Each call
is one decision committed through the Lua check.

    python3 dev.py bench core_broker [--calls N] [--clients N] [--replicas N] [--auth token|certificate]

As deployed: the broker serves TLS and requires client certificates (mTLS),
with identities issued by a LocalCA in a temp dir and its audit log written to
a file there. The operator calls with its certificate; each client presents
its application's certificate plus the application's token (`--auth token`,
the token names the caller and is verified against Redis, then cached) or the
certificate alone (`--auth certificate`: the application's record is looked up,
then cached).

Prints one JSON line: decisions_per_s, decide_ms_p50, decide_ms_p99, devices,
live_reservations (when measuring starts) and details, among them the broker's
own CPU time per decision, which a busy shared machine disturbs far less than
the wall-clock rate.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

from _common import emit, percentile, private_redis, start_service
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from lightpath.client import channel
from lightpath.security.credentials import Credentials
from lightpath.security.identity import Principal, service_principal
from lightpath.security.pki import LocalCA
from lightpath.v1 import common_pb2, core_broker_pb2_grpc
from lightpath.v1 import core_broker_pb2 as pb

KINDS = (pb.DEVICE_KIND_GPU, pb.DEVICE_KIND_TPU, pb.DEVICE_KIND_EDGE_TPU)
TASKS = ("computer-vision", "video-analytics", "nlp", "inference", "training")
POLICIES = (
    pb.PLACEMENT_POLICY_SPREAD,
    pb.PLACEMENT_POLICY_PACK,
    pb.PLACEMENT_POLICY_NEAREST,
    pb.PLACEMENT_POLICY_AFFINITY,
    pb.PLACEMENT_POLICY_LOWEST_LATENCY,
)
SITES = [f"site-{i}" for i in range(10)]
# A few devices everybody wants: requests naming them meet contention, so the
# mix also exercises PARTIAL, DEFERRED and REJECTED (the searches over time).
HOT = [f"dev-{i:04d}" for i in range(10)]
HOT_SHARE = 0.2


def ts(ms: int) -> Timestamp:
    t = Timestamp()
    t.FromMilliseconds(ms)
    return t


def request(rid: str, rng: random.Random, now_ms: int, *, live: bool) -> pb.ReservationRequest:
    """A request of the mix; `live` ones are the long, later-starting background load."""
    if live:
        cores = rng.randint(2, 12)
        duration_s = rng.randint(300, 3600)
        start = now_ms + rng.randint(0, 1800) * 1000
        slack_s = rng.randint(5, 600)
    else:
        cores = rng.randint(1, 16)
        duration_s = rng.randint(10, 600)
        start = now_ms + (0 if rng.random() < 0.6 else rng.randint(0, 600) * 1000)
        slack_s = rng.randint(5, 1200)
    policy = rng.choice(POLICIES)
    device_ids = rng.sample(HOT, rng.randint(1, 3)) if rng.random() < HOT_SHARE else []
    accept = rng.choice([[], [pb.OUTCOME_GRANTED], [pb.OUTCOME_PARTIAL], [pb.OUTCOME_DEFERRED]])
    return pb.ReservationRequest(
        reservation_id=rid,
        cores=cores,
        duration=Duration(seconds=duration_s),
        window=common_pb2.TimeWindow(
            earliest_start=ts(start), latest_end=ts(start + (duration_s + slack_s) * 1000)
        ),
        task_type=rng.choice(TASKS),
        priority_hint=rng.randint(1, 100),
        client_location=pb.Location(
            site=rng.choice(SITES), x_km=rng.uniform(0, 1000), y_km=rng.uniform(0, 1000)
        ),
        placement=policy,
        accept=accept,
        device_ids=device_ids,
    )


class Identities:
    """Certificates from a LocalCA in `directory`: the operator's, the applications'."""

    def __init__(self, directory: Path):
        self.ca = LocalCA(directory, common_name="Lightpath bench CA").ensure()
        self.operator = self.credentials(Principal("operator", "operator"))

    def credentials(self, principal: Principal, token: str = "") -> Credentials:
        files = self.ca.issue(principal)
        return Credentials.from_files(files.ca, files.cert, files.key, token=token)


async def setup(
    address: str, operator: Credentials, devices: int, apps: int, live: int, rng: random.Random
):
    ch = channel(address, default_timeout=120, credentials=operator)
    stub = core_broker_pb2_grpc.CoreBrokerStub(ch)
    op: list[tuple[str, str]] = []  # the operator's certificate names the caller
    for i in range(devices):
        await stub.RegisterDevice(
            pb.RegisterDeviceRequest(
                device=pb.Device(
                    device_id=f"dev-{i:04d}",
                    kind=KINDS[i % len(KINDS)],
                    cores=rng.choice((64, 96, 128)),
                    location=pb.Location(
                        site=SITES[i % len(SITES)],
                        x_km=rng.uniform(0, 1000),
                        y_km=rng.uniform(0, 1000),
                    ),
                    task_affinities=rng.sample(TASKS, 2),
                )
            ),
            metadata=op,
        )
    latencies = [
        pb.Latency(site=s, device_id=f"dev-{i:04d}", latency_ms=rng.uniform(0.2, 40))
        for s in SITES
        for i in range(devices)
    ]
    for k in range(0, len(latencies), 2000):
        await stub.SetLatencies(
            pb.SetLatenciesRequest(latencies=latencies[k : k + 2000]), metadata=op
        )
    tokens = []
    for a in range(apps):
        resp = await stub.RegisterApplication(
            pb.RegisterApplicationRequest(
                application_id=f"app-{a}", qos_level=pb.QOS_LEVEL_PREMIUM
            ),
            metadata=op,
        )
        tokens.append(resp.token)
    made = 0
    n = 0
    while made < live:
        now = int(time.time() * 1000)
        batch = [request(f"live-{n + j}", rng, now, live=True) for j in range(500)]
        n += len(batch)
        md = [("authorization", f"Bearer {tokens[n % apps]}")]
        resp = await stub.BatchReserve(pb.BatchReserveRequest(requests=batch), metadata=md)
        made += sum(r.outcome != pb.OUTCOME_REJECTED for r in resp.reservations)
    await ch.close()
    return tokens, made


async def client(
    address: str, creds: Credentials, cid: str, calls: int, rng: random.Random, out: dict
):
    ch = channel(address, default_timeout=30, credentials=creds)
    stub = core_broker_pb2_grpc.CoreBrokerStub(ch)
    for i in range(calls):
        req = request(f"c{cid}-{i}", rng, int(time.time() * 1000), live=False)
        t = time.perf_counter()
        resp = await stub.Reserve(pb.ReserveRequest(request=req))
        out["lat"].append((time.perf_counter() - t) * 1000)
        out["outcomes"][pb.Outcome.Name(resp.outcome).removeprefix("OUTCOME_")] += 1
    await ch.close()


def start_broker(
    redis_url: str, name: str, ids: Identities, workdir: Path
) -> tuple[subprocess.Popen, str]:
    """A broker replica as deployed (mTLS), once it is SERVING: (process, address)."""
    workdir.mkdir()
    env = {
        "LIGHTPATH_REDIS_URL": redis_url,
        "LIGHTPATH_CB_OPERATOR_TOKEN": "",
        "LIGHTPATH_TOKEN_FILE": "",
        "LIGHTPATH_LOG_LEVEL": "warning",
        "LIGHTPATH_INSTANCE_ID": name,
    }
    return start_service(
        "core_broker", service_principal("core_broker"), ids.ca, ids.operator, workdir, env
    )


def cpu_seconds(proc: subprocess.Popen) -> float:
    """User + system CPU the process has used (Linux /proc; 0 elsewhere)."""
    try:
        fields = open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(
    addresses: list[str], creds: list[Credentials], clients: int, calls: int, phase: str
) -> dict:
    out: dict = {"lat": [], "outcomes": Counter()}
    per = calls // clients
    t = time.perf_counter()
    await asyncio.gather(
        *(
            client(
                addresses[c % len(addresses)],
                creds[c % len(creds)],
                f"{phase}{c}",
                per,
                random.Random(phase + str(c)),
                out,
            )
            for c in range(clients)
        )
    )
    out["wall"] = time.perf_counter() - t
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--live", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument(
        "--auth",
        choices=("token", "certificate"),
        default="token",
        help="how the clients name their application: its token (with its certificate) "
        "or its certificate alone",
    )
    args = parser.parse_args()
    rng = random.Random(7)
    with private_redis() as url, tempfile.TemporaryDirectory(prefix="lightpath-bench-") as tmp:
        ids = Identities(Path(tmp) / "pki")
        procs: list[subprocess.Popen] = []
        addresses: list[str] = []
        try:
            for i in range(args.replicas):
                name = f"bench-broker-{i}"
                proc, address = start_broker(url, name, ids, Path(tmp) / name)
                procs.append(proc)
                addresses.append(address)
            tokens, live = asyncio.run(
                setup(addresses[0], ids.operator, args.devices, args.clients, args.live, rng)
            )
            creds = [
                ids.credentials(
                    Principal("application", f"app-{a}"),
                    token=tokens[a] if args.auth == "token" else "",
                )
                for a in range(len(tokens))
            ]
            warm = asyncio.run(measure(addresses, creds, args.clients, 200, "w"))
            cpu0 = [cpu_seconds(p) for p in procs]
            load0 = os.getloadavg()[0]
            res = asyncio.run(measure(addresses, creds, args.clients, args.calls, "m"))
            cpu = sum(cpu_seconds(p) for p in procs) - sum(cpu0)
            live += sum(v for k, v in warm["outcomes"].items() if k != "REJECTED")
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(10)
    lat = res["lat"]
    emit(
        {
            "bench": "core_broker",
            "decisions_per_s": len(lat) / res["wall"],
            "decide_ms_p50": percentile(lat, 50),
            "decide_ms_p99": percentile(lat, 99),
            "devices": args.devices,
            "live_reservations": live,
            "live_reservations_end": live
            + sum(v for k, v in res["outcomes"].items() if k != "REJECTED"),
            "clients": args.clients,
            "replicas": args.replicas,
            "transport": "mtls",
            "auth": args.auth,
            "calls": len(lat),
            "outcomes": dict(res["outcomes"]),
            # what the broker itself spent (less noisy than wall time on a shared machine)
            "broker_cpu_ms_per_decision": 1000 * cpu / len(lat),
            "broker_cpu_share": cpu / res["wall"],
            "load_avg_1m": load0,
            "target": {"decisions_per_s": 800, "decide_ms_p99": 20},
        }
    )


if __name__ == "__main__":
    main()
