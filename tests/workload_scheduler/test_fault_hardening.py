"""Issue 14, fault hardening of the scheduler ↔ ocs_manager link: a slow OCS (its
settle longer than the call's deadline), wiring removed behind the scheduler's back,
wiring of no job, and the expected race of two releases of one slice."""

from __future__ import annotations

import asyncio
import logging

import grpc

from lightpath.v1 import common_pb2, ocs_manager_pb2
from lightpath.v1 import workload_scheduler_pb2 as ws
from tests.workload_scheduler.conftest import ocs_env, pod_stack

RUNNING = common_pb2.JOB_STATE_RUNNING
WIRING = common_pb2.JOB_STATE_WIRING


async def until(probe, what: str, timeout: float = 40.0):
    """Poll `probe` (async, truthy when done) for up to `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = await probe()
        if got:
            return got
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def slow_ocs(settle_ms: int, blocks: int = 8) -> dict[str, str]:
    return {**ocs_env(blocks), "LIGHTPATH_OCS_DRIVER_SETTLE_MS": str(settle_ms)}


def reasons(job: ws.Job) -> list[str]:
    return [e.reason for e in job.history]


async def test_a_wiring_past_its_deadline_is_followed_through_then_runs(redis_url):
    # Settle 1.2 s, deadline 0.8 s: the first WireSlice times out and the ocs_manager
    # rolls it back; the scheduler learns that (not wiring again blindly), and the retry,
    # with twice the deadline, wires the slice.
    async with pod_stack(
        redis_url,
        blocks=8,
        ocs_environ=slow_ocs(1200),
        ws_environ={"LIGHTPATH_WS_OCS_TIMEOUT_S": "0.8", "LIGHTPATH_WS_WIRING_TIMEOUT_S": "3"},
    ) as pod:
        await pod.admit("slow", (8, 4, 4))

        async def running():
            job = await pod.job("slow")
            return job if job.state == RUNNING else None

        job = await until(running, "the job to run")
        said = reasons(job)
        assert any("rolled the wiring back" in r for r in said), said
        assert any(r.startswith("still wiring after") for r in said), said
        placed = [r for r in said if r.startswith("placed on blocks")]
        assert len(placed) == 2, said
        # No loop: it stays RUNNING and nothing more happens to it.
        await asyncio.sleep(1.0)
        again = await pod.job("slow")
        assert again.state == RUNNING and len(again.history) == len(job.history)
        await pod.settle()
        await pod.assert_consistent()


async def test_a_wiring_that_never_fits_its_deadline_fails_cleanly(redis_url):
    # Settle 1.5 s, deadline 0.2 s: 0.2, 0.4 and 0.8 s attempts all roll back; the job
    # then FAILs saying why, after exactly three wirings, with nothing left at the OCS.
    async with pod_stack(
        redis_url,
        blocks=8,
        ocs_environ=slow_ocs(1500),
        ws_environ={"LIGHTPATH_WS_OCS_TIMEOUT_S": "0.2"},
    ) as pod:
        await pod.admit("hopeless", (4, 4, 4))

        async def failed():
            job = await pod.job("hopeless")
            return job if job.state == common_pb2.JOB_STATE_FAILED else None

        job = await until(failed, "the job to fail")
        assert "LIGHTPATH_WS_OCS_TIMEOUT_S" in job.reason and "3 attempts" in job.reason
        placed = [r for r in reasons(job) if r.startswith("placed on blocks")]
        assert len(placed) == 3, reasons(job)
        assert await pod.wiring("hopeless") is None
        await pod.settle()
        await pod.assert_consistent()


async def test_a_long_wiring_reports_progress_and_is_not_taken_over(redis_url):
    # The default deadline outlasts a slow switch: one WireSlice, progress events on the
    # job while it lasts, and a second replica does not take the wiring over although it
    # lasts longer than the wiring timeout.
    async with pod_stack(
        redis_url,
        blocks=8,
        replicas=2,
        ocs_environ=slow_ocs(2500),
        ws_environ={"LIGHTPATH_WS_WIRING_TIMEOUT_S": "1.5"},
    ) as pod:
        events: list[common_pb2.JobEvent] = []
        admitted = asyncio.ensure_future(pod.admit("long", (4, 4, 4)))
        await until(lambda: _exists(pod, "long"), "the job to be stored", timeout=10)

        async def watch():
            async for e in pod.schedulers[1].WatchJob(ws.WatchJobRequest(job_id="long")):
                events.append(e)
                if e.to_state == RUNNING:
                    return

        await asyncio.wait_for(watch(), 30)
        resp = await admitted
        assert resp.job.state == RUNNING
        said = [e.reason for e in events]
        progress = [r for r in said if r.startswith("still wiring after")]
        assert progress, said
        assert not any("taken over" in r for r in said), said
        assert len([r for r in said if r.startswith("placed on blocks")]) == 1
        await pod.settle()
        await pod.assert_consistent()


async def _exists(pod, job_id: str) -> bool:
    try:
        await pod.job(job_id)
    except grpc.aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.NOT_FOUND:
            return False
        raise
    return True


def _differences(view: ws.PodView, kind: int) -> list[str]:
    return [d.job_id for d in view.wiring_differences if d.kind == kind]


async def test_a_slice_released_behind_the_schedulers_back_is_reported_then_rewired(pod16):
    pod = pod16
    await pod.admit("victim", (8, 4, 4))
    await pod.admit("bystander", (4, 4, 4))
    before = await pod.job("victim")
    assert before.state == RUNNING
    assert not (await pod.pod()).wiring_differences
    # An operator removes the slice's cross-connects; the scheduler still says RUNNING.
    await pod.ocs.ReleaseSlice(ocs_manager_pb2.ReleaseSliceRequest(job_id="victim"))
    assert await pod.wiring("victim") is None

    async def reported():
        view = await pod.pod()
        return _differences(view, ws.WIRING_DIFFERENCE_KIND_MISSING)

    assert await until(reported, "the difference to be reported", timeout=15) == ["victim"]

    async def rewired():
        job = await pod.job("victim")
        view = await pod.pod()
        wired = await pod.wiring("victim")
        ok = job.state == RUNNING and wired is not None and not view.wiring_differences
        return job if ok else None

    job = await until(rewired, "the job to be wired again", timeout=30)
    assert any("vanished at the ocs_manager" in r for r in reasons(job)), reasons(job)
    assert [b.block_id for b in job.blocks] == [b.block_id for b in before.blocks]
    bystander = await pod.job("bystander")
    assert len(bystander.history) == 3  # admitted, placed, wired: untouched
    await pod.settle()
    await pod.assert_consistent()


async def test_a_slice_of_no_job_is_reported_then_released(pod16):
    pod = pod16
    await pod.admit("real", (4, 4, 4))
    # An operator wires a slice the scheduler knows nothing of, on free blocks.
    stray = ocs_manager_pb2.WireSliceRequest(
        job_id="stray",
        grid=common_pb2.Shape(dims=[1, 1, 1]),
        blocks=[
            ocs_manager_pb2.BlockPlacement(
                position=common_pb2.Coordinate(coords=[0, 0, 0]), block_id=15
            )
        ],
        wrap=[True, True, True],
    )
    await pod.ocs.WireSlice(stray)

    async def reported():
        return _differences(await pod.pod(), ws.WIRING_DIFFERENCE_KIND_ORPHANED)

    assert await until(reported, "the stray slice to be reported", timeout=15) == ["stray"]

    async def released():
        view = await pod.pod()
        return await pod.wiring("stray") is None and not view.wiring_differences

    await until(released, "the stray slice to be released", timeout=30)
    assert (await pod.job("real")).state == RUNNING
    await pod.settle()
    await pod.assert_consistent()


async def test_two_releases_of_one_slice_are_an_expected_race_not_a_crash(redis_url, caplog):
    caplog.set_level(logging.DEBUG, logger="lightpath.workload_scheduler")
    async with pod_stack(redis_url, blocks=8, ocs_environ=slow_ocs(1000)) as pod:
        # 1. An operator's release in progress when the job is cancelled: the
        #    scheduler's ReleaseSlice gets ABORTED "release in progress in another call".
        await pod.admit("a", (4, 4, 4))
        operator = asyncio.ensure_future(
            pod.ocs.ReleaseSlice(ocs_manager_pb2.ReleaseSliceRequest(job_id="a"))
        )
        await asyncio.sleep(0.3)
        cancelled = await pod.ws.CancelJob(ws.CancelJobRequest(job_id="a"))
        assert cancelled.state == common_pb2.JOB_STATE_CANCELLED
        await operator
        # 2. Cancelled while being wired: the cancel's release and the wiring task's
        #    (its RUNNING commit lost to the cancel) race for the same slice.
        admitted = asyncio.ensure_future(pod.admit("b", (4, 4, 4)))

        async def wiring():
            return await _exists(pod, "b") and (await pod.job("b")).state == WIRING

        await until(wiring, "job b to be wiring", timeout=10)
        await pod.ws.CancelJob(ws.CancelJobRequest(job_id="b"))
        await admitted

        async def gone():
            return await pod.wiring("a") is None and await pod.wiring("b") is None

        await until(gone, "both slices to be released", timeout=30)
        await pod.settle()
        await pod.assert_consistent()
    records = [r for r in caplog.records if r.name == "lightpath.workload_scheduler"]
    assert not [r for r in records if "crashed" in r.getMessage()]
    loud = [r for r in records if r.levelno >= logging.WARNING and "in progress" in r.getMessage()]
    assert not loud, [r.getMessage() for r in loud]
    quiet = [r for r in records if r.levelno == logging.DEBUG and "in progress" in r.getMessage()]
    assert quiet, "the race did not happen: the test proves nothing"
