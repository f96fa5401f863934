"""Job states stay truthful when switches fail (issue 20): the workload_scheduler admits
jobs onto a pod whose ocs_manager drives a real switch agent; a job whose wiring failed
is not RUNNING, nothing of it is wired, and it runs once the switch is well."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from lightpath.v1 import common_pb2
from lightpath.v1 import ocs_manager_pb2 as pb
from lightpath.v1 import workload_scheduler_pb2 as ws
from tests.switch_agent.conftest import agent_process, inject
from tests.workload_scheduler.conftest import POD, ocs_env, pod_stack, rpc_error

pytestmark = pytest.mark.slow  # runs for many seconds: handed out first

RUNNING = common_pb2.JOB_STATE_RUNNING


async def wait_state(pod, job_id: str, want: set[int], timeout: float = 30.0) -> int:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        state = (await pod.job(job_id)).state
        if state in want:
            return state
        assert loop.time() < deadline, f"{job_id} stayed {common_pb2.JobState.Name(state)}"
        await asyncio.sleep(0.05)


# What CheckInvariants(compare_switches) reports in place of a comparison when a switch did
# not answer its read in time (services/lightpath_services/ocs_manager/server.py).
UNREAD = "the switch driver cannot read state"


async def switches_agree(pod, timeout: float = 30.0) -> None:
    """The switches hold what the tables say. Each read has LIGHTPATH_OCS_SWITCH_TIMEOUT_S
    (2 s here), which 48 reads at once can miss on a loaded machine: such a report compared
    nothing, so it is asked again until every switch answered; that answer must be ok."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        report = await pod.ocs.CheckInvariants(pb.CheckInvariantsRequest(compare_switches=True))
        if not any(v.detail == UNREAD for v in report.violations) or loop.time() > deadline:
            assert report.ok, list(report.violations)
            return
        await asyncio.sleep(0.2)


async def test_a_job_whose_wiring_failed_is_not_running(redis_url, tmp_path):
    env = ocs_env(16)
    with agent_process(redis_url, tmp_path, **env) as ag:
        ocs_environ = {
            **env,
            "LIGHTPATH_OCS_SWITCH_AGENTS": ag.address,
            "LIGHTPATH_OCS_SWITCH_TIMEOUT_S": "2",
            "LIGHTPATH_OCS_RECONCILE_S": "0.2",
        }
        async with pod_stack(redis_url, ocs_environ=ocs_environ) as pod:
            await pod.admit("ok-1", (8, 4, 4))
            await wait_state(pod, "ok-1", {RUNNING})
            # one of the pod's 48 OCS stops answering: every wiring needs it
            await inject(ag.address, "ocs-x-0-0", unreachable=True)
            # a job that asked not to wait hears what failed (issue 34), not "the pod is
            # busy": UNAVAILABLE (retryable) WIRING_FAILED naming the switch, nothing kept
            err = await rpc_error(
                pod.admit("impatient", (4, 4, 4), when_no_capacity=ws.WHEN_NO_CAPACITY_FAIL)
            )
            assert err.code == grpc.StatusCode.UNAVAILABLE, err
            assert err.reason == "WIRING_FAILED", err
            assert "nothing is kept" in err.message, err.message
            gone = await rpc_error(pod.job("impatient"))  # forgotten, as the reason says
            assert gone.code == grpc.StatusCode.NOT_FOUND, gone
            assert "switch ocs-x-0-0" in err.message and "busy" not in err.message, err.message
            await pod.admit("hit", (4, 4, 4))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 3
            while loop.time() < deadline:  # however long it keeps trying, it is never RUNNING
                job = await pod.job("hit")
                assert job.state != RUNNING, job
                wiring = await pod.wiring("hit")  # at most a wiring in flight, never wired
                assert wiring is None or wiring.state != pb.SLICE_STATE_WIRED, wiring.state
                await asyncio.sleep(0.1)
            # (the scheduler keeps retrying meanwhile, so the pod never settles: its views
            # are compared once the switch is back; the switches can be compared only then too)
            report = await pod.ocs.CheckInvariants(pb.CheckInvariantsRequest())
            assert report.ok, list(report.violations)
            await inject(ag.address, "ocs-x-0-0")  # the switch is back: the job runs
            await wait_state(pod, "hit", {RUNNING})
            await pod.settle()
            await pod.assert_consistent()
            await switches_agree(pod)
            # a switch that refuses a batch: the job is not RUNNING either
            await inject(ag.address, "ocs-y-0-0", reject_batches=1)
            await pod.admit("refused", (4, 4, 4))
            # Its refused wiring puts it back in the queue, retried RETRY_BACKOFF_MS (0.5 s)
            # later: longer than settle()'s quiet time, so a settled pod may still be about to
            # wire it (a slice at the OCS, the job PENDING). It ends RUNNING or FAILED.
            await wait_state(pod, "refused", {RUNNING, common_pb2.JOB_STATE_FAILED})
            await pod.settle()
            state = (await pod.job("refused")).state
            wired = await pod.wiring("refused")
            assert (state == RUNNING) == (wired is not None and wired.state == pb.SLICE_STATE_WIRED)
            await pod.assert_consistent()
            await switches_agree(pod)
    assert POD == "pod-w"
