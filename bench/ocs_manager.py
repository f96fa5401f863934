"""Benchmark of ocs_manager over gRPC against a real Redis (OCS-9). Prints one JSON line.

    python3 dev.py bench ocs_manager [--runs 20] [--seconds 5]

Two ocs_manager processes (`python -m lightpath_services.ocs_manager`, as deployed) on one
private redis-server: pod "bench-k1" with K = 1 and pod "bench-k2" with K = 2,
both 64 blocks of 4x4x4, radix 136, default switch driver without settling delay.
They serve TLS with client certificates required (the default): a local CA in the
bench's temporary directory issues each its certificate, and the operator's, which
the bench calls with.

* full_pod_*: one slice of all 64 blocks as 4x4x4 blocks with wrap (3,072
  cross-connects), wired then released, `--runs` times; the default answer
  (every cross-connect listed) and, as *_counts, the counts-only view.
* small_wire_release_per_s: 8 concurrent clients, each wiring a 2-block slice
  (2x1x1 with wrap, default answer) and releasing it, for `--seconds`.
* replace_ms_*: a 2x2x2 slice of 8 blocks on the K = 1 pod whose block moves
  back and forth to a free block (default answer: the 8-block wiring, the
  removed and added cross-connects).
* agent_full_pod_*_settle10 / _settle100: the full-pod wire and release (counts
  view) of a K = 1 pod whose 48 OCS sit behind a switch agent process
  (`python -m lightpath_services.switch_agent`, the open southbound) with 10 ms and 100 ms
  of settling per batch: the manager sends one ApplyBatch per OCS, all 48 at once,
  each over mTLS, checked and audited by the agent. Goal: p50 <= settle + 50 ms.
* sonic_full_pod_wire_ms_p50 / netconf_full_pod_wire_ms_p50 (issue 34): the same
  full-pod wire (counts view) of a K = 1 pod whose 48 OCS are real switches' own
  interfaces at realistic settling (the Calient S320 model: 25 ms for one pair,
  200 ms for every port): SONiC OCS, each a redis-server with the orchagent emulator
  (CONFIG_DB batch in one MULTI/EXEC, settled when STATE_DB reads `tuned`), and
  Polatis-style NETCONF switches (one emulator process, an SSH server per switch,
  ncclient sessions from the manager). `sonic_settle_ms` / `netconf_settle_ms` is the
  settling the switches modelled for that wire. Goal: p50 <= settle * 1.1 + 20 ms.
  `*_cpu_ms_per_wire`: the CPU the manager, the emulator process ("switches") and
  its redis-servers ("switches_children") spent per wire. `--baseline DIR` runs the
  same pods from another checkout (e.g. `git worktree add DIR HEAD~3`) side by side,
  run by run, as `*_baseline`; `--drivers sonic` measures one driver.
  `<driver>_reconcile_passes` / `_deferrals`: the reconcile loop's passes during the
  pod's life and its looks that found a change in flight and waited (issue 34).
  `load_avg_1m` is the machine's load when the line was printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import (
    bench_ca,
    emit,
    operator_credentials,
    percentile,
    private_redis,
    source_path,
    start_service,
)

from lightpath.client import channel
from lightpath.domain.slices import grid_positions
from lightpath.embedded_redis import stop_process
from lightpath.security.credentials import Credentials
from lightpath.security.identity import service_principal
from lightpath.security.pki import LocalCA
from lightpath.v1 import common_pb2, ocs_manager_pb2_grpc
from lightpath.v1 import ocs_manager_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
COUNTS = pb.WIRING_VIEW_COUNTS


def wire_request(
    job: str, grid, blocks, view=pb.WIRING_VIEW_UNSPECIFIED, *, twisted: bool = False
) -> pb.WireSliceRequest:
    """`blocks` at the positions of `grid` in order, x fastest (grid_positions)."""
    placements = [
        pb.BlockPlacement(position=common_pb2.Coordinate(coords=pos), block_id=b)
        for pos, b in zip(grid_positions(tuple(grid)), blocks, strict=True)
    ]
    return pb.WireSliceRequest(
        job_id=job, grid=common_pb2.Shape(dims=grid), blocks=placements, view=view, twisted=twisted
    )


def start_server(
    redis_url: str,
    pod: str,
    k: int,
    ca: LocalCA,
    creds: Credentials,
    workdir: Path,
    *,
    blocks: int = 64,
    radix: int = 136,
) -> tuple[subprocess.Popen, str]:
    """pod's ocs_manager (K = `k`, `blocks` blocks of 4x4x4) in a process of its own."""
    return start_service(
        "ocs_manager",
        service_principal("ocs_manager", pod),
        ca,
        creds,
        workdir,
        {
            "LIGHTPATH_REDIS_URL": redis_url,
            "LIGHTPATH_POD_ID": pod,
            "LIGHTPATH_FABRIC_BLOCK_SHAPE": "4x4x4",
            "LIGHTPATH_FABRIC_BLOCKS": str(blocks),
            "LIGHTPATH_FABRIC_OCS_PER_AXIS": str(k),
            "LIGHTPATH_FABRIC_OCS_RADIX": str(radix),
        },
    )


def start_agent_pod(
    redis_url: str, pod: str, settle_ms: int, ca: LocalCA, creds: Credentials, workdir: Path
) -> tuple[list[subprocess.Popen], str]:
    """A K = 1 pod (64 blocks of 4x4x4) whose switches are a switch agent process settling
    `settle_ms` per batch, and its ocs_manager driving them: (processes, manager address)."""
    fabric = {
        "LIGHTPATH_REDIS_URL": redis_url,
        "LIGHTPATH_POD_ID": pod,
        "LIGHTPATH_FABRIC_BLOCK_SHAPE": "4x4x4",
        "LIGHTPATH_FABRIC_BLOCKS": "64",
        "LIGHTPATH_FABRIC_OCS_PER_AXIS": "1",
        "LIGHTPATH_FABRIC_OCS_RADIX": "136",
    }
    agent, agent_addr = start_service(
        "switch_agent",
        service_principal("switch_agent", pod),
        ca,
        creds,
        workdir,
        {**fabric, "LIGHTPATH_AGENT_SETTLE_MS": str(settle_ms)},
    )
    ocs, addr = start_service(
        "ocs_manager",
        service_principal("ocs_manager", pod),
        ca,
        creds,
        workdir,
        {**fabric, "LIGHTPATH_OCS_SWITCH_AGENTS": agent_addr},
    )
    return [ocs, agent], addr


DEVICE_FABRIC = {
    "LIGHTPATH_FABRIC_BLOCK_SHAPE": "4x4x4",
    "LIGHTPATH_FABRIC_BLOCKS": "64",
    "LIGHTPATH_FABRIC_OCS_PER_AXIS": "1",
    "LIGHTPATH_FABRIC_OCS_RADIX": "136",
}


@contextlib.contextmanager
def sonic_switches(workdir: Path, root: Path = ROOT):
    """48 SONiC OCS (68 A x 68 B ports): an emulator process starting a redis-server each
    and playing orchagent on it at the Calient timing. Yields (LIGHTPATH_OCS_SWITCHES,
    the emulator's process)."""
    from lightpath.domain.torus import Fabric, FabricConfig

    fabric = Fabric.build(FabricConfig((4, 4, 4), 64, 1, 136))
    args = [sys.executable, "-m", "lightpath_services.switch_emulators.sonic", "--a-ports", "68"]
    args += ["--b-ports", "68", "--dir", str(workdir), "--timing", "calient-s320"]
    for sid in fabric.ocs_ids:
        args += ["--switch", sid]
    env = {**os.environ, "PYTHONPATH": source_path(root)}
    proc = subprocess.Popen(
        args, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None and b"ready" in proc.stdout.readline()
        entries = [proc.stdout.readline().decode().strip() for _ in fabric.ocs_ids]
        yield {"LIGHTPATH_OCS_SWITCHES": ",".join(entries)}, proc
    finally:
        stop(proc)


@contextlib.contextmanager
def netconf_switches(workdir: Path, root: Path = ROOT):
    """48 Polatis-style 68x68 switches: one emulator process, an SSH server each, at the
    Calient timing. Yields (the manager's settings for them, the emulator's process)."""
    from lightpath.domain.torus import Fabric, FabricConfig
    from lightpath.embedded_redis import free_port
    from lightpath_services.switch_emulators.polatis import write_host_key

    fabric = Fabric.build(FabricConfig((4, 4, 4), 64, 1, 136))
    workdir.mkdir(parents=True, exist_ok=True)
    key, known, secret = workdir / "host_key", workdir / "known_hosts", workdir / "password"
    public = write_host_key(key)
    ports = {sid: free_port() for sid in fabric.ocs_ids}
    known.write_text("".join(f"[127.0.0.1]:{p} {public}\n" for p in ports.values()))
    secret.write_text(os.urandom(8).hex())
    args = [sys.executable, "-m", "lightpath_services.switch_emulators.polatis", "--ports", "68"]
    args += ["--host-key", str(key), "--timing", "calient-s320"]
    for sid, port in ports.items():
        args += ["--switch", f"{sid}=127.0.0.1:{port}"]
    env = {**os.environ, "POLATIS_PASSWORD": secret.read_text(), "PYTHONPATH": source_path(root)}
    proc = subprocess.Popen(
        args, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None and b"ready" in proc.stdout.readline()
        settings = {
            "LIGHTPATH_OCS_SWITCHES": ",".join(
                f"{sid}=netconf://admin@127.0.0.1:{p}" for sid, p in ports.items()
            ),
            "LIGHTPATH_OCS_NETCONF_PASSWORD_FILE": str(secret),
            "LIGHTPATH_OCS_NETCONF_KNOWN_HOSTS": str(known),
        }
        yield settings, proc
    finally:
        stop(proc)


SWITCHES = {"sonic": sonic_switches, "netconf": netconf_switches}


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if it has not ended in 30 s (a loaded machine)."""
    stop_process(proc, 30.0)


def process_cpu(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process and, as "<name>_children", of its
    children (the SONiC emulator's redis-servers)."""
    import psutil

    out = {}
    for name, pid in pids.items():
        proc = psutil.Process(pid)
        t = proc.cpu_times()
        out[name] = t.user + t.system
        kids = 0.0
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                c = child.cpu_times()
                kids += c.user + c.system
        if kids:
            out[f"{name}_children"] = kids
    return out


@contextlib.asynccontextmanager
async def device_pod(
    redis_url: str, driver: str, tag: str, ca, creds, workdir: Path, root: Path = ROOT
):
    """A K = 1 pod whose 48 OCS are `driver`'s emulated devices, and its ocs_manager
    process, both run from `root`: yields (stub, {process name: pid})."""
    pod = f"bench-{driver}{tag}"
    with SWITCHES[driver](workdir / pod, root) as (env, switches):
        proc, addr = start_service(
            "ocs_manager",
            service_principal("ocs_manager", pod),
            ca,
            creds,
            workdir,
            {
                "LIGHTPATH_REDIS_URL": redis_url,
                "LIGHTPATH_POD_ID": pod,
                **DEVICE_FABRIC,
                # the emulators of 48 switches share this machine's cores with everything else
                "LIGHTPATH_OCS_SWITCH_TIMEOUT_S": "29",
                "LIGHTPATH_OCS_CHANGE_LEASE_S": "60",
                **env,
            },
            timeout=120.0,
            root=root,
        )
        try:
            async with channel(addr, credentials=creds, default_timeout=120.0) as ch:
                stub = ocs_manager_pb2_grpc.OcsManagerStub(ch)
                await full_pod(stub, 2, COUNTS)  # warm up: sessions, connections
                yield stub, {"manager": proc.pid, "switches": switches.pid}
        finally:
            stop(proc)


async def device_runs(pods: dict[str, tuple], runs: int) -> dict[str, dict]:
    """`runs` full-pod wires and releases on each pod (name -> (stub, pids)), taking turns
    run by run so that every pod meets the same machine, the order reversed every other
    round (in a fixed order, the same NETCONF code measured 2-5 ms slower as the first
    pod, whichever checkout that was; reversed every other round, 241.1 against 243.0
    ms, 2026-12-08); the CPU each process spent in the wires, per wire."""
    wires: dict[str, list[float]] = {name: [] for name in pods}
    releases: dict[str, list[float]] = {name: [] for name in pods}
    cpu: dict[str, dict[str, float]] = {name: {} for name in pods}
    counts: dict[str, int] = {}
    req = wire_request("full-pod", [4, 4, 4], list(range(64)), COUNTS)
    for i in range(runs):
        for name, (stub, pids) in list(pods.items())[:: -1 if i % 2 else 1]:
            before = process_cpu(pids)
            t = time.perf_counter()
            w = await stub.WireSlice(req)
            wires[name].append((time.perf_counter() - t) * 1000)
            for k, v in process_cpu(pids).items():
                cpu[name][k] = cpu[name].get(k, 0.0) + v - before.get(k, 0.0)
            counts[name] = w.cross_connect_count
            t = time.perf_counter()
            await stub.ReleaseSlice(pb.ReleaseSliceRequest(job_id="full-pod"))
            releases[name].append((time.perf_counter() - t) * 1000)
    return {
        name: {
            "wire_p50": percentile(wires[name], 50),
            "wire_p99": percentile(wires[name], 99),
            "release_p50": percentile(releases[name], 50),
            "count": counts[name],
            "cpu_ms_per_wire": {k: round(v * 1000 / runs, 1) for k, v in cpu[name].items()},
        }
        for name in pods
    }


async def device_bench(
    redis_url: str, ca, creds, workdir: Path, runs: int, drivers: list[str], baseline: Path | None
) -> tuple[dict, bool]:
    """The full-pod wire through each driver's 48 emulated devices (issue 34), and with
    `baseline` (another checkout, e.g. the previous commit) side by side in the same run:
    JSON keys `<driver>_*`, and `<driver>_*_baseline`."""
    out: dict = {}
    ok = True
    for driver in drivers:
        async with contextlib.AsyncExitStack() as stack:
            pods = {
                "": await stack.enter_async_context(
                    device_pod(redis_url, driver, "", ca, creds, workdir)
                )
            }
            if baseline is not None:
                pods["_baseline"] = await stack.enter_async_context(
                    device_pod(redis_url, driver, "-baseline", ca, creds, workdir, baseline)
                )
            results = await device_runs(pods, runs)
            for tag, (stub, _) in pods.items():
                report = await stub.CheckInvariants(
                    pb.CheckInvariantsRequest(compare_switches=True)
                )
                ok = ok and report.ok
                r = results[tag]
                info = await stub.GetInfo(common_pb2.GetInfoRequest())
                passes = info.attributes.get("switch_reconcile_passes", "")
                deferrals = info.attributes.get("switch_reconcile_deferrals", "")
                out |= {
                    # the reconcile loop's passes and looks that waited for a change in flight
                    # (a checkout before the wait has no deferrals: null)
                    f"{driver}_reconcile_passes{tag}": int(passes) if passes else None,
                    f"{driver}_reconcile_deferrals{tag}": int(deferrals) if deferrals else None,
                    f"{driver}_full_pod_wire_ms_p50{tag}": r["wire_p50"],
                    f"{driver}_full_pod_wire_ms_p99{tag}": r["wire_p99"],
                    f"{driver}_full_pod_release_ms_p50{tag}": r["release_p50"],
                    f"{driver}_cpu_ms_per_wire{tag}": r["cpu_ms_per_wire"],
                }
            out[f"{driver}_settle_ms"] = modelled_settle_ms()
    return out, ok


def modelled_settle_ms() -> float:
    """What the Calient model gives a full-pod wire on one OCS: 64 cross-connects made,
    128 of its 136 ports moved, no conflict."""
    from lightpath.domain.switch_timing import SwitchTiming

    return SwitchTiming().settle_s(128, 136) * 1000


async def full_pod(stub, runs: int, view) -> dict[str, float]:
    wire, release, count = [], [], 0
    req = wire_request("full-pod", [4, 4, 4], list(range(64)), view)
    for _ in range(runs):
        t = time.perf_counter()
        w = await stub.WireSlice(req)
        wire.append((time.perf_counter() - t) * 1000)
        count = w.cross_connect_count
        t = time.perf_counter()
        await stub.ReleaseSlice(pb.ReleaseSliceRequest(job_id="full-pod"))
        release.append((time.perf_counter() - t) * 1000)
    return {
        "wire_p50": percentile(wire, 50),
        "wire_p99": percentile(wire, 99),
        "release_p50": percentile(release, 50),
        "release_p99": percentile(release, 99),
        "count": count,
    }


async def small_slices(stub, seconds: float, clients: int = 8) -> float:
    done = 0
    stop = time.monotonic() + seconds

    async def client(i: int) -> None:
        nonlocal done
        req = wire_request(f"small-{i}", [2, 1, 1], [2 * i, 2 * i + 1])
        rel = pb.ReleaseSliceRequest(job_id=f"small-{i}")
        while time.monotonic() < stop:
            await stub.WireSlice(req)
            await stub.ReleaseSlice(rel)
            done += 1

    start = time.monotonic()
    await asyncio.gather(*(client(i) for i in range(clients)))
    return done / (time.monotonic() - start)


async def replaces(stub, runs: int, view) -> tuple[float, float]:
    await stub.WireSlice(wire_request("rep", [2, 2, 2], list(range(8)), COUNTS))
    samples = []
    a, b = 3, 40
    for _ in range(runs):
        t = time.perf_counter()
        await stub.ReplaceBlock(
            pb.ReplaceBlockRequest(job_id="rep", failed_block_id=a, new_block_id=b, view=view)
        )
        samples.append((time.perf_counter() - t) * 1000)
        a, b = b, a
    await stub.ReleaseSlice(pb.ReleaseSliceRequest(job_id="rep"))
    return percentile(samples, 50), percentile(samples, 99)


async def devices_only(args: argparse.Namespace) -> None:
    """--devices-only: just the SONiC and NETCONF full-pod wires (issue 34)."""
    with (
        private_redis() as redis_url,
        tempfile.TemporaryDirectory(prefix="lightpath-bench-") as tmp,
    ):
        ca = bench_ca(Path(tmp) / "pki")
        creds = operator_credentials(ca)
        devices, ok = await device_bench(
            redis_url, ca, creds, Path(tmp), args.runs, args.drivers, args.baseline
        )
    emit(
        {
            **devices,
            "load_avg_1m": os.getloadavg()[0],
            "runs": args.runs,
            "invariants_ok": ok,
        }
    )


async def main(args: argparse.Namespace) -> None:
    if args.devices_only:
        await devices_only(args)
        return
    with (
        private_redis() as redis_url,
        tempfile.TemporaryDirectory(prefix="lightpath-bench-") as tmp,
    ):
        ca = bench_ca(Path(tmp) / "pki")
        creds = operator_credentials(ca)
        procs = []
        try:
            p1, addr1 = start_server(redis_url, "bench-k1", 1, ca, creds, Path(tmp))
            procs.append(p1)
            p2, addr2 = start_server(redis_url, "bench-k2", 2, ca, creds, Path(tmp))
            procs.append(p2)
            agents = {}
            for settle in (10, 100):
                ps, addr = start_agent_pod(
                    redis_url, f"bench-agents-{settle}", settle, ca, creds, Path(tmp)
                )
                procs += ps
                agents[settle] = addr
            async with (
                channel(addr1, credentials=creds) as ch1,
                channel(addr2, credentials=creds) as ch2,
            ):
                k1, k2 = (
                    ocs_manager_pb2_grpc.OcsManagerStub(ch1),
                    ocs_manager_pb2_grpc.OcsManagerStub(ch2),
                )
                for stub in (k1, k2):  # warm up: connections, script loading
                    await full_pod(stub, 2, COUNTS)
                    await small_slices(stub, 0.3)
                f1 = await full_pod(k1, args.runs, pb.WIRING_VIEW_UNSPECIFIED)
                f2 = await full_pod(k2, args.runs, pb.WIRING_VIEW_UNSPECIFIED)
                c1 = await full_pod(k1, args.runs, COUNTS)
                c2 = await full_pod(k2, args.runs, COUNTS)
                small = await small_slices(k1, args.seconds)
                small_k2 = await small_slices(k2, args.seconds)
                rep50, rep99 = await replaces(k1, max(100, args.runs), pb.WIRING_VIEW_UNSPECIFIED)
                repc50, repc99 = await replaces(k1, max(100, args.runs), COUNTS)
                check = await k1.CheckInvariants(pb.CheckInvariantsRequest(compare_switches=True))
                check2 = await k2.CheckInvariants(pb.CheckInvariantsRequest(compare_switches=True))
                agent_runs, agents_ok = {}, True
                for settle, addr in agents.items():
                    async with channel(addr, credentials=creds) as ch:
                        stub = ocs_manager_pb2_grpc.OcsManagerStub(ch)
                        await full_pod(stub, 2, COUNTS)  # warm up
                        agent_runs[settle] = await full_pod(stub, args.runs, COUNTS)
                        report = await stub.CheckInvariants(
                            pb.CheckInvariantsRequest(compare_switches=True)
                        )
                        agents_ok = agents_ok and report.ok
            devices, devices_ok = await device_bench(
                redis_url, ca, creds, Path(tmp), args.runs, args.drivers, args.baseline
            )
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(10)
    emit(
        {
            "full_pod_wire_ms_p50_k1": f1["wire_p50"],
            "full_pod_wire_ms_p99_k1": f1["wire_p99"],
            "full_pod_wire_ms_p50_k2": f2["wire_p50"],
            "full_pod_wire_ms_p99_k2": f2["wire_p99"],
            "full_pod_release_ms_p50_k1": f1["release_p50"],
            "full_pod_release_ms_p99_k1": f1["release_p99"],
            "full_pod_release_ms_p50_k2": f2["release_p50"],
            "full_pod_cross_connects_k1": f1["count"],
            "full_pod_cross_connects_k2": f2["count"],
            "full_pod_wire_ms_p50_k1_counts": c1["wire_p50"],
            "full_pod_wire_ms_p99_k1_counts": c1["wire_p99"],
            "full_pod_wire_ms_p50_k2_counts": c2["wire_p50"],
            "full_pod_wire_ms_p99_k2_counts": c2["wire_p99"],
            "small_wire_release_per_s": small,
            "small_wire_release_per_s_k2": small_k2,
            "replace_ms_p50": rep50,
            "replace_ms_p99": rep99,
            "replace_ms_p50_counts": repc50,
            "replace_ms_p99_counts": repc99,
            **{
                f"agent_full_pod_{what}_ms_{q}_settle{settle}": r[f"{what}_{q}"]
                for settle, r in agent_runs.items()
                for what in ("wire", "release")
                for q in ("p50", "p99")
            },
            "agent_full_pod_cross_connects": agent_runs[10]["count"],
            **devices,
            "load_avg_1m": os.getloadavg()[0],
            "runs": args.runs,
            "invariants_ok": check.ok and check2.ok and agents_ok and devices_ok,
            "tls": True,  # mTLS, client certificates required (the services' default)
        }
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--devices-only",
        action="store_true",
        help="only the SONiC and NETCONF full-pod wires (sonic_*, netconf_*)",
    )
    parser.add_argument(
        "--drivers",
        type=lambda v: [d for d in v.split(",") if d],
        default=["sonic", "netconf"],
        help="the device drivers to measure (default sonic,netconf)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout (e.g. `git worktree add /tmp/base HEAD~3`): its manager and "
        "emulators run side by side, run by run, as *_baseline",
    )
    asyncio.run(main(parser.parse_args()))
