"""Crash and outage safety: wiring failures give the blocks back and say why; the
reconcile loop releases leftover wiring and takes over wirings whose replica died."""

from __future__ import annotations

import asyncio
import base64
import contextlib

import redis.asyncio as aioredis

from lightpath.client import channel
from lightpath.domain.slices import PENDING, WIRING, SliceDemand, SliceJob
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import ocs_manager_pb2, ocs_manager_pb2_grpc, workload_scheduler_pb2_grpc
from lightpath.v1 import workload_scheduler_pb2 as ws
from lightpath_services.workload_scheduler.store import PodStore
from tests.helpers import serve
from tests.workload_scheduler.conftest import POD, PodStack, ocs_env

FAST = {"LIGHTPATH_WS_RECONCILE_S": "0.1"}


def ws_env(ocs_addr: str, **extra: str) -> dict[str, str]:
    return {"LIGHTPATH_POD_ID": POD, "LIGHTPATH_OCS_ADDR": ocs_addr, **FAST, **extra}


async def eventually(check, timeout: float = 20.0):
    """Poll `check()` (async, returns a value or None) until it returns something truthy."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = await check()
        if got:
            return got
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def test_ocs_manager_outage_returns_the_blocks_and_retries(redis_url):
    async with contextlib.AsyncExitStack() as stack:
        ocs = await stack.enter_async_context(serve("ocs_manager", redis_url, ocs_env(4)))
        port = ocs.port
        svc = await stack.enter_async_context(
            serve("workload_scheduler", redis_url, ws_env(ocs.address))
        )
        ch = await stack.enter_async_context(
            channel(svc.address, max_attempts=1, default_timeout=60)
        )
        stub = workload_scheduler_pb2_grpc.WorkloadSchedulerStub(ch)
        await stub.GetPod(ws.GetPodRequest())  # the fabric is loaded
        await ocs.server.stop(0)  # the ocs_manager goes away

        resp = await stub.AdmitJob(
            ws.AdmitJobRequest(spec=ws.JobSpec(job_id="patient", shape=c.Shape(dims=[8, 4, 4])))
        )
        assert resp.job.state == c.JOB_STATE_PENDING
        assert "wiring failed, blocks returned, will retry" in resp.job.reason
        assert "UNAVAILABLE" in resp.job.reason
        view = await stub.GetPod(ws.GetPodRequest())
        assert all(not b.job_id for b in view.blocks)

        # It comes back on the same address: the reconcile loop wires the job.
        async with serve(
            "ocs_manager", redis_url, {**ocs_env(4), "LIGHTPATH_LISTEN": f"127.0.0.1:{port}"}
        ) as ocs2:

            async def running():
                job = await stub.GetJob(ws.GetJobRequest(job_id="patient"))
                return job if job.state == c.JOB_STATE_RUNNING else None

            job = await eventually(running, timeout=40)
            async with channel(ocs2.address) as och:
                wiring = await ocs_manager_pb2_grpc.OcsManagerStub(och).GetSliceWiring(
                    ocs_manager_pb2.GetSliceWiringRequest(job_id="patient")
                )
            assert sorted(p.block_id for p in wiring.blocks) == sorted(
                b.block_id for b in job.blocks
            )


async def _stack(redis_url: str, blocks: int = 4):
    stack = contextlib.AsyncExitStack()
    ocs = await stack.enter_async_context(serve("ocs_manager", redis_url, ocs_env(blocks)))
    svc = await stack.enter_async_context(
        serve("workload_scheduler", redis_url, ws_env(ocs.address))
    )
    och = await stack.enter_async_context(channel(ocs.address, max_attempts=1))
    wch = await stack.enter_async_context(channel(svc.address, max_attempts=1))
    pod = PodStack(
        ocs_manager_pb2_grpc.OcsManagerStub(och),
        [workload_scheduler_pb2_grpc.WorkloadSchedulerStub(wch)],
    )
    await pod.pod()
    return stack, pod


async def _wire_directly(pod: PodStack, job_id: str, blocks: list[int]) -> None:
    await pod.ocs.WireSlice(
        ocs_manager_pb2.WireSliceRequest(
            job_id=job_id,
            grid=c.Shape(dims=[len(blocks), 1, 1]),
            blocks=[
                ocs_manager_pb2.BlockPlacement(position=c.Coordinate(coords=[i, 0, 0]), block_id=b)
                for i, b in enumerate(blocks)
            ],
        )
    )


async def test_leftover_wiring_of_an_ended_job_is_released(redis_url):
    stack, pod = await _stack(redis_url)
    async with stack, aioredis.Redis.from_url(redis_url, decode_responses=True) as r:
        # As if a replica died after WireSlice and before recording anything else.
        await _wire_directly(pod, "ghost", [0, 1])
        await r.hset(PodStore(r, POD).keys.wired, mapping={"0": "ghost", "1": "ghost"})

        async def released():
            return await pod.wiring("ghost") is None and not await r.hgetall(
                PodStore(r, POD).keys.wired
            )

        await eventually(released)
        job = (await pod.admit("all", (16, 4, 4))).job
        assert job.state == c.JOB_STATE_RUNNING
        await pod.assert_consistent()


async def test_an_ocs_refusing_the_wiring_fails_the_job_with_the_reason(redis_url):
    stack, pod = await _stack(redis_url)
    async with stack:
        await _wire_directly(pod, "intruder", [0])  # wired behind the scheduler's back

        async def ended():
            job = await pod.job("refused")
            return job if job.state == c.JOB_STATE_FAILED else None

        await pod.admit("refused", (16, 4, 4))
        job = await eventually(ended)
        assert "wiring failed, blocks returned" in job.reason
        assert "FAILED_PRECONDITION" in job.reason
        retries = [e for e in job.history if "will retry" in e.reason]
        assert len(retries) == 2  # refused three times in all
        view = await pod.pod()
        assert all(not b.job_id for b in view.blocks)


async def test_a_wiring_whose_replica_died_is_taken_over(redis_url):
    stack, pod = await _stack(redis_url)
    async with stack, aioredis.Redis.from_url(redis_url, decode_responses=True) as r:
        store = PodStore(r, POD)
        spec = ws.JobSpec(job_id="orphan", shape=c.Shape(dims=[8, 4, 4]))
        job = SliceJob(
            "orphan", PENDING, 1, 50, 1, SliceDemand((2, 1, 1), ("tpu", "tpu"), (True,) * 3)
        )
        txn = store.txn()
        txn.hset(
            store.keys.job("orphan"),
            {"spec": base64.b64encode(spec.SerializeToString()).decode(), "created_ms": 1},
        )
        txn.zadd(store.keys.jobs, 1, "orphan")
        # Allocated and marked by a replica that then died: the deadline has passed.
        wiring = job.with_(state=WIRING, epoch=2, placement=(2, 3), wiring_deadline_ms=1)
        txn.hset(store.keys.owner, {2: "orphan", 3: "orphan"})
        txn.hset(store.keys.wired, {2: "orphan", 3: "orphan"})
        txn.write_job(wiring, old_state=None, reason="placed on blocks 2,3", now_ms=1)
        await store.commit(txn)

        async def running():
            j = await pod.job("orphan")
            return j if j.state == c.JOB_STATE_RUNNING else None

        j = await eventually(running)
        assert sorted(b.block_id for b in j.blocks) == [2, 3]
        assert any("taken over" in e.reason for e in j.history)
        await pod.assert_consistent()


async def test_cancel_queued_and_running_jobs(redis_url):
    stack, pod = await _stack(redis_url)
    async with stack:
        await pod.admit("hold", (16, 4, 4))
        queued = (await pod.admit("q", (4, 4, 4))).job
        assert queued.state == c.JOB_STATE_PENDING
        done = await pod.ws.CancelJob(ws.CancelJobRequest(job_id="q"))
        assert done.state == c.JOB_STATE_CANCELLED
        again = await pod.ws.CancelJob(ws.CancelJobRequest(job_id="q"))
        assert again.state == c.JOB_STATE_CANCELLED
        cancelled = await pod.ws.CancelJob(ws.CancelJobRequest(job_id="hold"))
        assert cancelled.state == c.JOB_STATE_CANCELLED and not cancelled.blocks
        assert await pod.wiring("hold") is None
        await pod.assert_consistent()
