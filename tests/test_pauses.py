"""Leaseholders paused past their leases (issue 32), with real processes and SIGSTOP /
SIGCONT: a paused process is the harshest case of a slow host, a GC pause or a VM
moved, and of a partition between a service and everything else (it holds a lease,
cannot renew it, and acts on a stale view when it wakes); SIGSTOP needs no privilege
and pauses at a moment the test picks, so these run on any machine.
tests/test_partitions.py partitions and slows links in network namespaces.

In each: no block in two live jobs, no cross-connect from a stale view (the switches
and the committed tables agree, and the switches refused the stale holder), no
acknowledged job lost (lightpath.testing.history), every job in a definite state
within the bound the test states. Leases are short through the services' own settings
(LIGHTPATH_OCS_CHANGE_LEASE_S, LIGHTPATH_WS_WIRING_TIMEOUT_S); no test asserts a time."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from google.protobuf import duration_pb2

from lightpath.client import channel, error_report
from lightpath.embedded_redis import free_port
from lightpath.testing.history import DEFINITE, Final, History
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import ocs_manager_pb2 as om
from lightpath.v1 import ocs_manager_pb2_grpc, workload_scheduler_pb2_grpc
from lightpath.v1 import optical_switch_pb2 as sb
from lightpath.v1 import workload_scheduler_pb2 as ws
from tests.common.test_metrics import samples, value
from tests.ocs_manager.conftest import wire_request
from tests.switch_agent.conftest import (
    POD,
    AgentProcess,
    ManagerProcess,
    ServiceProcess,
    admin,
    fabric,
    inject,
    manager_env,
)

pytestmark = pytest.mark.slow

# The bound within which every job is back in a definite state after the pause ends:
# a wiring lease (1 s) and a reconcile round (0.2 s) of the replica that takes over,
# plus a WireSlice and its commit, with room for a loaded 2-core machine.
DEFINITE_WITHIN_S = 20.0


class SchedulerProcess(ServiceProcess):
    service = "workload_scheduler"


@contextlib.contextmanager
def started(*procs: ServiceProcess) -> Iterator[None]:
    try:
        for p in procs:
            p.start()
        yield
    finally:
        for p in procs:
            if p.proc is not None and p.proc.poll() is None:
                os.kill(p.proc.pid, signal.SIGCONT)  # a paused process cannot stop
            p.stop()


def pause(p: ServiceProcess) -> None:
    assert p.proc is not None
    os.kill(p.proc.pid, signal.SIGSTOP)


def resume(p: ServiceProcess) -> None:
    assert p.proc is not None
    os.kill(p.proc.pid, signal.SIGCONT)


@contextlib.asynccontextmanager
async def ocs_at(address: str) -> AsyncIterator[ocs_manager_pb2_grpc.OcsManagerStub]:
    async with channel(address, max_attempts=1) as ch:
        yield ocs_manager_pb2_grpc.OcsManagerStub(ch)


@contextlib.asynccontextmanager
async def scheduler_at(
    address: str,
) -> AsyncIterator[workload_scheduler_pb2_grpc.WorkloadSchedulerStub]:
    async with channel(address, max_attempts=1) as ch:
        yield workload_scheduler_pb2_grpc.WorkloadSchedulerStub(ch)


async def slices(ocs) -> dict[str, tuple[int, ...]]:
    listed = await ocs.ListSlices(om.ListSlicesRequest(page_size=1000))
    return {s.job_id: tuple(s.block_ids) for s in listed.slices}


async def invariants_hold(ocs) -> list[str]:
    report = await ocs.CheckInvariants(om.CheckInvariantsRequest(compare_switches=True))
    return [] if report.ok else [f"{v.rule}: {v.detail}" for v in report.violations] or ["!ok"]


async def test_an_ocs_manager_paused_mid_change_past_its_lease_moves_no_mirror_on_waking(
    redis_url, tmp_path
):
    """Manager A sends a wire's batches and is paused while the switches settle; its
    2 s change lease runs out; manager B touches the slice, takes the change over
    (a higher token), rolls it back and wires it again. A wakes: its own deadline has
    passed, so it undoes its change — under its old token, which the switches refuse.
    Without fencing that undo would disconnect B's committed wiring."""
    agent = AgentProcess(redis_url, tmp_path, fabric())
    env = manager_env(
        agent,
        LIGHTPATH_OCS_CHANGE_LEASE_S="2",
        LIGHTPATH_OCS_SWITCH_TIMEOUT_S="0.9",
        # no reconcile pass to repair what fencing should have prevented
        LIGHTPATH_OCS_RECONCILE_S="3600",
    )
    a, b = ManagerProcess(redis_url, tmp_path, env), ManagerProcess(redis_url, tmp_path, env)
    with started(agent):
        with started(a, b):
            async with ocs_at(a.address) as ocs_a, ocs_at(b.address) as ocs_b:
                await inject(agent.address, "*", extra_delay=duration_pb2.Duration(seconds=3))
                first = asyncio.ensure_future(
                    ocs_a.WireSlice(wire_request("j", [2, 1, 1], [0, 1]), timeout=60)
                )
                await asyncio.sleep(0.3)  # its batches are at the switches, settling
                pause(a)
                await inject(agent.address, "*")  # the switches are quick again
                await asyncio.sleep(3.5)  # A's lease (2 s) and its batches' settling end
                w = await ocs_b.WireSlice(wire_request("j", [2, 1, 1], [0, 1]), timeout=30)
                assert w.state == om.SLICE_STATE_WIRED
                resume(a)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await first
                # the switches are as B committed them (an undo from A's stale view would
                # have disconnected them)
                assert await invariants_hold(ocs_b) == []
                assert await slices(ocs_b) == {"j": (0, 1)}
                report = error_report(err.value)
                assert report.code == grpc.StatusCode.ABORTED, report
                assert report.reason == "LEASE_LOST", report
        async with admin(agent.address) as adm:
            stats = await adm.GetSwitchStats(sb.GetSwitchStatsRequest())
        assert stats.stale_batches_refused >= 1


def scheduler_env(ocs: ServiceProcess) -> dict[str, str]:
    return {
        "LIGHTPATH_POD_ID": POD,
        "LIGHTPATH_OCS_ADDR": ocs.address,
        "LIGHTPATH_WS_WIRING_TIMEOUT_S": "1",
        "LIGHTPATH_WS_RECONCILE_S": "0.2",
        "LIGHTPATH_WS_OCS_TIMEOUT_S": "5",
    }


def stale_commits(metrics_at: str) -> float:
    """A scheduler's lightpath_pod_stale_commits_refused_total, from its scrape."""
    with urllib.request.urlopen(f"http://{metrics_at}/metrics", timeout=5) as resp:
        found = samples(resp.read().decode())
    return value(found, "lightpath_pod_stale_commits_refused_total")


def job_spec(job_id: str) -> ws.JobSpec:
    return ws.JobSpec(job_id=job_id, shape=c.Shape(dims=[4, 2, 2]))  # two 2x2x2 blocks


async def final_state(sched, ocs) -> Final:
    listed = await sched.ListJobs(ws.ListJobsRequest(page_size=1000))
    jobs = {
        j.job_id: (
            c.JobState.Name(j.state)[len("JOB_STATE_") :],
            tuple(b.block_id for b in j.blocks),
        )
        for j in listed.jobs
    }
    return Final(jobs=jobs, slices=await slices(ocs))


async def settled(sched, ocs, within_s: float) -> tuple[Final, float]:
    """The final state once every job is definite and the slices are those of the
    RUNNING jobs (or as it is when `within_s` ran out), and how long that took."""
    t0 = time.monotonic()
    while True:
        final = await final_state(sched, ocs)
        running = {j: b for j, (s, b) in final.jobs.items() if s == "RUNNING"}
        definite = all(s in DEFINITE for s, _ in final.jobs.values())
        if (definite and running == final.slices) or time.monotonic() - t0 > within_s:
            return final, time.monotonic() - t0
        await asyncio.sleep(0.1)


async def until_state(sched, job_id: str, state: int, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while True:
        job = await sched.GetJob(ws.GetJobRequest(job_id=job_id))
        if job.state == state:
            return
        assert time.monotonic() < deadline, f"{job_id} {c.JobState.Name(job.state)}: {job.reason}"
        await asyncio.sleep(0.1)


async def test_a_scheduler_replica_paused_past_its_wiring_lease_wakes_to_a_job_taken_over(
    redis_url, tmp_path
):
    """Replica A admits a job and is paused while its slice is being wired; past the
    wiring lease (1 s) replica B takes the wiring over (a higher epoch), finds it wired
    and runs the job; the job completes and a second one takes its blocks. A wakes
    holding the old epoch: whatever it does then is refused (its commit by the epoch,
    its calls to the ocs_manager by the lease token), and nothing acknowledged is lost."""
    ocs = ManagerProcess(
        redis_url,
        tmp_path,
        {**fabric(), "LIGHTPATH_OCS_DRIVER_SETTLE_MS": "1500", "LIGHTPATH_OCS_RECONCILE_S": "0.2"},
    )
    with started(ocs):
        scrape_a = f"127.0.0.1:{free_port()}"  # A's metrics: its refused commit is counted
        a = SchedulerProcess(
            redis_url, tmp_path, {**scheduler_env(ocs), "LIGHTPATH_METRICS_LISTEN": scrape_a}
        )
        b = SchedulerProcess(redis_url, tmp_path, scheduler_env(ocs))
        with started(a, b):
            history = History()
            async with (
                scheduler_at(a.address) as sa,
                scheduler_at(b.address) as sb_,
                ocs_at(ocs.address) as o,
            ):
                admit = asyncio.ensure_future(
                    sa.AdmitJob(ws.AdmitJobRequest(spec=job_spec("j1")), timeout=60)
                )
                await asyncio.sleep(0.4)  # A has marked the job WIRING and called WireSlice
                pause(a)
                await until_state(sb_, "j1", c.JOB_STATE_RUNNING, DEFINITE_WITHIN_S)
                history.ack("submit", "j1", time.monotonic(), "RUNNING")
                await sb_.CompleteJob(ws.CompleteJobRequest(job_id="j1"))
                history.ack("complete", "j1", time.monotonic())
                second = await sb_.AdmitJob(ws.AdmitJobRequest(spec=job_spec("j2")), timeout=30)
                history.ack("submit", "j2", time.monotonic(), c.JobState.Name(second.job.state))
                await until_state(sb_, "j2", c.JOB_STATE_RUNNING, DEFINITE_WITHIN_S)
                resume(a)
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await admit  # its answer came too late to count as acknowledged
                final, _ = await settled(sb_, o, DEFINITE_WITHIN_S)
                report = history.check(final)
                assert report.ok, report.details()
                assert final.jobs["j1"][0] == "COMPLETED"
                assert final.slices == {"j2": final.jobs["j2"][1]}
                assert await invariants_hold(o) == []
                # A's one commit of j1's wiring, refused by the epoch, counted once
                assert await asyncio.to_thread(stale_commits, scrape_a) == 1
