"""Partitions and a slow, lossy link across hosts (issue 32), in network namespaces the
tests create: a "host" (a namespace with its own loopback) joined to this machine by a
veth pair with two addresses of the tests' own (10.232.x.1 here, .2 there). A link
set down is a partition in both directions, with both sides running on (unlike a
pause: tests/test_pauses.py); nftables rules on the pair drop packets, and a relay
(lightpath.testing.relay) delays what crosses it. Namespaces and veth need root: elsewhere the tests skip, saying so.

* the cell and one pod (its scheduler, ocs_manager and Redis in the namespace)
  partitioned longer than the cell's pod timeout while jobs are submitted, then healed;
* an ocs_manager cut off from its Redis (with the switch agents on its side of the cut)
  in the middle of a change, past its change lease, while another ocs_manager takes the
  change over once the link is back;
* the ocs_manager (with its Redis) in a namespace of its own, behind 5 % loss each way
  (nftables) and 200 ms of delay each way (a relay: this kernel has no tc netem) from
  its scheduler, while jobs are submitted and completed through the cell.

In each: no block in two live jobs, the switches as committed, no acknowledged job
lost (lightpath.testing.history), every job definite within DEFINITE_WITHIN_S of the
heal (a bound on waiting, not an assertion on speed)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2

from lightpath.client import channel
from lightpath.embedded_redis import free_port
from lightpath.security.identity import service_principal
from lightpath.testing.history import DEFINITE, Final, History
from lightpath.testing.netns import Namespace, unavailable
from lightpath.testing.relay import RelayProcess
from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import cell_scheduler_pb2_grpc
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import ocs_manager_pb2 as om
from lightpath.v1 import workload_scheduler_pb2 as ws
from tests.helpers import test_ca
from tests.ocs_manager.conftest import wire_request
from tests.switch_agent.conftest import POD, ServiceProcess, fabric, inject
from tests.test_pauses import invariants_hold, job_spec, ocs_at, scheduler_at, slices, started

pytestmark = pytest.mark.slow

DEFINITE_WITHIN_S = 30.0
DELAY_MS = 200  # one way, each way
LOSS_PERCENT = 5
JOBS, KEPT_RUNNING = 8, 2  # two-block jobs on 8 blocks: the rest run and complete in turn


@pytest.fixture
def namespace() -> Iterator[Namespace]:
    why = unavailable()
    if why:
        pytest.skip(why)
    ns = Namespace()
    try:
        ns.create()
        yield ns
    finally:
        ns.destroy()


class Service(ServiceProcess):
    """`python -m services.<service>` here or in a namespace, listening on `host`, its
    certificate naming the pair's addresses."""

    def __init__(
        self,
        service: str,
        host: str,
        redis_url: str,
        workdir: Path,
        env: dict[str, str],
        hosts: tuple[str, ...],
        ns: Namespace | None = None,
    ):
        self.service = service
        files = test_ca().issue(
            service_principal(service, env.get("LIGHTPATH_POD_ID", "")), hosts=hosts
        )
        tls = {
            "LIGHTPATH_TLS_CERT": str(files.cert),
            "LIGHTPATH_TLS_KEY": str(files.key),
            "LIGHTPATH_TLS_CA": str(files.ca),
        }
        super().__init__(redis_url, workdir, env, host=host, tls=tls)
        if ns is not None:
            self.prefix = ("ip", "netns", "exec", ns.name)


def state(job) -> str:
    return c.JobState.Name(job.state)[len("JOB_STATE_") :]


async def pod_final(sched, ocs) -> Final:
    listed = await sched.ListJobs(ws.ListJobsRequest(page_size=1000))
    return Final(
        jobs={j.job_id: (state(j), tuple(b.block_id for b in j.blocks)) for j in listed.jobs},
        slices=await slices(ocs),
    )


async def eventually(check, what: str, within_s: float = DEFINITE_WITHIN_S):
    deadline = time.monotonic() + within_s
    last: object = None
    while time.monotonic() < deadline:
        with contextlib.suppress(grpc.aio.AioRpcError):
            last = await check()
            if last is True:
                return
        await asyncio.sleep(0.2)
    raise AssertionError(f"not within {within_s} s: {what} (last: {last})")


async def pod_status(cell) -> int:
    """The pod's status as the cell lists it (-1: not listed)."""
    pods = (await cell.ListPods(cs.ListPodsRequest())).pods
    return next((p.status for p in pods if p.registration.pod_id == POD), -1)


async def pod_ready(cell) -> bool:
    return await pod_status(cell) == cs.POD_STATUS_READY


def cell_and_pod(
    ns: Namespace, redis_url: str, tmp_path: Path, pod_timeout_s: str
) -> tuple[Service, Service, Service]:
    """A cell on this side (on `redis_url`) and a pod in `ns`: its scheduler and
    ocs_manager on a Redis of their own there, heartbeats every 0.3 s."""
    hosts = (ns.host_ip, ns.ip)
    pod_redis = ns.redis(tmp_path)
    cell_env = {"LIGHTPATH_CELL_POD_TIMEOUT_S": pod_timeout_s}
    cell = Service("cell_scheduler", ns.host_ip, redis_url, tmp_path, cell_env, hosts)
    ocs = Service("ocs_manager", ns.ip, pod_redis, tmp_path, fabric(), hosts, ns)
    env = {
        "LIGHTPATH_POD_ID": POD,
        "LIGHTPATH_OCS_ADDR": ocs.address,
        "LIGHTPATH_CELL_ADDR": cell.address,
        "LIGHTPATH_CELL_HEARTBEAT_S": "0.3",
        "LIGHTPATH_WS_RECONCILE_S": "0.3",
    }
    sched = Service("workload_scheduler", ns.ip, pod_redis, tmp_path, env, hosts, ns)
    sched.env["LIGHTPATH_ADVERTISE_ADDR"] = sched.address
    return cell, ocs, sched


async def test_the_cell_and_a_pod_partitioned_past_the_pod_timeout_then_healed(
    namespace, redis_url, tmp_path
):
    ns = namespace
    cell, ocs, sched = cell_and_pod(ns, redis_url, tmp_path, pod_timeout_s="2")
    history = History()
    with started(cell, ocs, sched):
        async with channel(cell.address, max_attempts=1) as ch:
            stub = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)

            await eventually(lambda: pod_ready(stub), "the pod registered and READY")

            async def submit(job_id: str) -> None:
                resp = await stub.SubmitJob(cs.SubmitJobRequest(spec=job_spec(job_id)), timeout=20)
                history.ack("submit", job_id, time.monotonic(), state(resp.job))

            await submit("before")
            ns.partition(True)
            try:

                async def silent() -> bool:
                    return await pod_status(stub) != cs.POD_STATUS_READY

                await eventually(silent, "the cell saw the pod go silent")
                await submit("during")  # waits in the cell queue: no pod answers
                await asyncio.sleep(1.0)
            finally:
                ns.partition(False)

            async def all_definite() -> object:
                jobs = await stub.ListJobs(cs.ListCellJobsRequest(page_size=100))
                states = {j.job_id: state(j) for j in jobs.jobs}
                if await pod_ready(stub) and states.get("during") == "RUNNING":
                    return all(s in DEFINITE for s in states.values()) or states
                return states

            await eventually(all_definite, "healed: every job definite, the queued one placed")
            jobs = (await stub.ListJobs(cs.ListCellJobsRequest(page_size=100))).jobs
            assert {j.job_id: state(j) for j in jobs} == {"before": "RUNNING", "during": "RUNNING"}
        async with scheduler_at(sched.address) as s, ocs_at(ocs.address) as o:
            report = history.check(await pod_final(s, o))
            assert report.ok, report.details()
            assert await invariants_hold(o) == []


async def test_a_job_ended_while_its_pod_cannot_report_is_definite_at_once_and_after_the_heal(
    namespace, redis_url, tmp_path
):
    """The pod's reports cannot reach the cell (nftables drops what goes to the cell's
    port) while the cell's calls still reach the pod: what a pod cut off from its Redis
    looks like from the cell (bench/partitions.py found it so). The cell marks the pod
    silent, its job UNKNOWN; a CompleteJob through the cell reaches the pod and is
    answered. The end is known for good: the cell shows it at once, and after the heal
    every job is definite (it once stayed UNKNOWN for ever: the end left the pod's live
    jobs while they showed UNKNOWN, and only live jobs show again when the pod reports)."""
    ns = namespace
    cell, ocs, sched = cell_and_pod(ns, redis_url, tmp_path, pod_timeout_s="1.5")
    history = History()
    with started(cell, ocs, sched):
        async with channel(cell.address, max_attempts=1) as ch:
            stub = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)

            async def cell_state(job_id: str) -> str:
                return state(await stub.GetJob(cs.GetCellJobRequest(job_id=job_id), timeout=10))

            async def running(job_id: str) -> object:
                return await cell_state(job_id) == "RUNNING" or await cell_state(job_id)

            await eventually(lambda: pod_ready(stub), "the pod registered and READY")
            for job_id in ("ends", "runs"):
                resp = await stub.SubmitJob(cs.SubmitJobRequest(spec=job_spec(job_id)), timeout=20)
                history.ack("submit", job_id, time.monotonic(), state(resp.job))
                await eventually(lambda j=job_id: running(j), f"{job_id} RUNNING")
            ns.cut_ports([int(cell.address.rsplit(":", 1)[1])])
            try:

                async def unknown() -> object:
                    return await cell_state("ends") == "UNKNOWN" or await cell_state("ends")

                await eventually(unknown, "the cell marked the pod silent")
                await stub.CompleteJob(cs.CompleteCellJobRequest(job_id="ends"), timeout=20)
                history.ack("complete", "ends", time.monotonic())
                # the pod answered it: known, not UNKNOWN (the other job still is)
                assert await cell_state("ends") == "COMPLETED"
                assert await cell_state("runs") == "UNKNOWN"
            finally:
                ns.heal()

            async def all_definite() -> object:
                jobs = (await stub.ListJobs(cs.ListCellJobsRequest(page_size=100))).jobs
                states = {j.job_id: state(j) for j in jobs}
                return states == {"ends": "COMPLETED", "runs": "RUNNING"} or states

            await eventually(all_definite, "healed: every job definite at the cell")
        async with scheduler_at(sched.address) as s, ocs_at(ocs.address) as o:
            report = history.check(await pod_final(s, o))
            assert report.ok, report.details()
            assert await invariants_hold(o) == []


async def test_a_slow_lossy_link_between_the_pod_and_its_ocs_manager_under_load(
    namespace, redis_url, tmp_path
):
    """The ocs_manager (with its Redis) in a namespace of its own; the cell and the pod's
    scheduler on this side. Between the scheduler and the ocs_manager: a relay holding
    every chunk 200 ms each way (lightpath.testing.relay: this kernel may have no tc
    netem) and 5 % of the packets to and from the ocs_manager's port dropped each way on
    the veth (nftables). Jobs are submitted and completed through the cell the whole time;
    each needs a WireSlice (two blocks) across that link, and a completed one a release."""
    ns = namespace
    hosts = (ns.host_ip, ns.ip)
    ocs = Service(
        "ocs_manager", ns.ip, ns.redis(tmp_path), tmp_path, {**fabric(blocks=8)}, hosts, ns
    )
    relay = RelayProcess({f"{ns.host_ip}:{free_port()}": ocs.address}, delay_ms=DELAY_MS)
    cell = Service("cell_scheduler", ns.host_ip, redis_url, tmp_path, {}, hosts)
    sched = Service(
        "workload_scheduler",
        ns.host_ip,
        redis_url,
        tmp_path,
        {
            "LIGHTPATH_POD_ID": POD,
            "LIGHTPATH_OCS_ADDR": next(iter(relay.routes)),  # the slow way to its ocs_manager
            "LIGHTPATH_CELL_ADDR": cell.address,
            "LIGHTPATH_ADVERTISE_ADDR": "",
            "LIGHTPATH_CELL_HEARTBEAT_S": "0.3",
            "LIGHTPATH_WS_RECONCILE_S": "0.3",
            "LIGHTPATH_WS_OCS_TIMEOUT_S": "15",
        },
        hosts,
    )
    sched.env["LIGHTPATH_ADVERTISE_ADDR"] = sched.address
    history = History()
    relay.start(tmp_path / "relay.log")
    try:
        with started(ocs, cell, sched):
            port = int(ocs.address.rsplit(":", 1)[1])
            ns.lose(LOSS_PERCENT, listeners=[port])
            async with channel(cell.address, max_attempts=1) as ch:
                stub = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)

                await eventually(lambda: pod_ready(stub), "the pod registered and READY")

                async def job(n: int) -> None:
                    job_id = f"slow-{n}"
                    resp = await stub.SubmitJob(
                        cs.SubmitJobRequest(spec=job_spec(job_id)), timeout=60
                    )
                    history.ack("submit", job_id, time.monotonic(), state(resp.job))
                    if n < KEPT_RUNNING:
                        return

                    async def running() -> object:
                        got = await stub.GetJob(cs.GetCellJobRequest(job_id=job_id))
                        return got.state == c.JOB_STATE_RUNNING or state(got)

                    await eventually(running, f"{job_id} RUNNING")
                    await stub.CompleteJob(cs.CompleteCellJobRequest(job_id=job_id), timeout=60)
                    history.ack("complete", job_id, time.monotonic())

                await asyncio.gather(*(job(n) for n in range(JOBS)))

                async def settled() -> object:
                    cell_jobs = (await stub.ListJobs(cs.ListCellJobsRequest(page_size=100))).jobs
                    return all(state(j) in DEFINITE for j in cell_jobs) or {
                        j.job_id: state(j) for j in cell_jobs
                    }

                await eventually(settled, "every job definite at the cell")
            async with scheduler_at(sched.address) as s, ocs_at(ocs.address) as o:

                async def wired_as_running() -> object:
                    final = await pod_final(s, o)
                    running_jobs = {j: b for j, (st, b) in final.jobs.items() if st == "RUNNING"}
                    if all(st in DEFINITE for st, _ in final.jobs.values()) and (
                        running_jobs == final.slices
                    ):
                        return True
                    return final

                await eventually(wired_as_running, "the slices those of the RUNNING jobs")
                final = await pod_final(s, o)
                report = history.check(final)
                assert report.ok, report.details()
                running = sorted(j for j, (st, _) in final.jobs.items() if st == "RUNNING")
                assert running == [f"slow-{n}" for n in range(KEPT_RUNNING)]
                assert await invariants_hold(o) == []
    finally:
        relay.stop()


async def test_an_ocs_manager_cut_off_from_redis_mid_change_leaves_nothing_of_its_change(
    namespace, tmp_path
):
    """Manager A (in the namespace, with the switch agents) sends a wire's batches; the
    link to Redis (on this side, with manager B) goes down while they settle, for longer
    than A's 2 s change lease. A keeps running: its driver gives up on the slow switches,
    its rollback too, and its lock stays in Redis past its lease. Once the link is back
    B touches the slice, takes the change over (a higher token), rolls it back and wires
    it again. The switches end as B committed them: nothing of A's survives. (A write of
    A's arriving after B's is refused by its old token: tests/test_pauses.py makes one.)"""
    ns = namespace
    hosts = (ns.host_ip, ns.ip)
    shared = ns.redis(tmp_path, here=True)
    agent = Service("switch_agent", ns.ip, ns.redis(tmp_path), tmp_path, fabric(), hosts, ns)
    env = {
        **fabric(),
        "LIGHTPATH_OCS_SWITCH_AGENTS": agent.address,
        "LIGHTPATH_OCS_SWITCH_TIMEOUT_S": "0.9",
        "LIGHTPATH_OCS_CHANGE_LEASE_S": "2",
        "LIGHTPATH_OCS_RECONCILE_S": "3600",  # no repair of what fencing should prevent
    }
    a = Service("ocs_manager", ns.ip, shared, tmp_path, env, hosts, ns)
    b = Service("ocs_manager", ns.host_ip, shared, tmp_path, env, hosts)
    with started(agent, a, b):
        async with ocs_at(a.address) as ocs_a, ocs_at(b.address) as ocs_b:
            await inject(agent.address, "*", extra_delay=duration_pb2.Duration(seconds=3))
            first = asyncio.ensure_future(
                ocs_a.WireSlice(wire_request("j", [2, 1, 1], [0, 1]), timeout=60)
            )
            await asyncio.sleep(0.3)  # A's batches are at the switches, settling
            await inject(agent.address, "*")  # quick again (the batch in flight settles on)
            ns.partition(True)
            try:
                await asyncio.sleep(4.0)  # past A's lease; A's commit cannot reach Redis
            finally:
                ns.partition(False)
            w = await ocs_b.WireSlice(wire_request("j", [2, 1, 1], [0, 1]), timeout=30)
            assert w.state == om.SLICE_STATE_WIRED
            with contextlib.suppress(grpc.aio.AioRpcError):
                await first  # cut off mid-call: whatever it answers is not acknowledged
            await asyncio.sleep(1.0)  # anything A still had to send has been sent
            assert await invariants_hold(ocs_b) == []
            assert await slices(ocs_b) == {"j": (0, 1)}
