"""What is not a stale commit (issue 32): lightpath.pod.stale_commits_refused counts a
replica's commit of a wiring refused because the job was taken over after its wiring
lease ran out (tests/test_pauses.py pauses a replica past it and sees its one refused
commit counted). A wiring whose commit is refused for another reason, within its
lease, is not counted: a cancel, or another write to the job (here one shaped like a
take-over, but made while the replica still held its lease)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import redis.asyncio as aioredis

from lightpath.domain.slices import WIRING
from lightpath.v1 import common_pb2
from lightpath.v1 import workload_scheduler_pb2 as ws
from lightpath_services.workload_scheduler import server as ws_server
from lightpath_services.workload_scheduler.core import WIRING_TAKEN_OVER
from lightpath_services.workload_scheduler.metrics import PodMetrics
from lightpath_services.workload_scheduler.store import PodStore
from tests.metrics_reader import install, value
from tests.workload_scheduler.conftest import POD, pod_stack
from tests.workload_scheduler.test_fault_hardening import slow_ocs, until

REFUSED = "lightpath.pod.stale_commits_refused"
LEASE_S = 1.5  # the wiring lease; the switches settle for longer (3 s)


async def _wiring(store: PodStore, job_id: str):
    record = await store.job(job_id)
    return record if record is not None and record.state == WIRING else None


async def _write_while_leased(store: PodStore, job_id: str) -> int:
    """The WIRING job under a higher epoch, with a take-over's reason, while the replica
    wiring it still holds its lease (its refused commit is not a stale one)."""
    record = await until(lambda: _wiring(store, job_id), f"{job_id} WIRING", timeout=20)
    job = record.summary
    now = int(time.time() * 1000)
    assert now < job.wiring_deadline_ms
    txn = store.txn()
    txn.expect_job(job_id, [WIRING], job.epoch)
    txn.write_job(
        job.with_(epoch=job.epoch + 1, wiring_deadline_ms=now + 60_000),
        old_state=WIRING,
        reason=WIRING_TAKEN_OVER,
        now_ms=now,
    )
    await store.commit(txn)
    return job.epoch + 1


async def _refused_commit(pod, store: PodStore, job_id: str, epoch: int) -> None:
    """Until the replica's wiring of `job_id` has ended, its commit refused: the OCS
    holds the slice, and the job is as the other write left it."""
    await until(lambda: pod.wiring(job_id), f"{job_id}'s slice wired", timeout=20)
    await asyncio.sleep(1.0)  # the replica's RUNNING commit, refused, and its read after
    record = await store.job(job_id)
    assert record is not None and record.epoch == epoch, record


async def test_a_commit_refused_while_the_lease_held_is_not_counted(redis_url, monkeypatch):
    reader = install(monkeypatch, ws_server, PodMetrics, refresh_s=0.1)
    async with (
        pod_stack(
            redis_url,
            blocks=8,
            ocs_environ=slow_ocs(3000),
            ws_environ={"LIGHTPATH_WS_WIRING_TIMEOUT_S": str(LEASE_S)},
        ) as pod,
        aioredis.Redis.from_url(redis_url, decode_responses=True) as r,
    ):
        store = PodStore(r, POD)
        assert value(reader, REFUSED) == 0
        # another write to the job while the replica held its lease
        admitted = asyncio.ensure_future(pod.admit("moved", (4, 4, 4)))
        epoch = await _write_while_leased(store, "moved")
        await _refused_commit(pod, store, "moved", epoch)
        # a wiring ended by a cancel
        cancelled = asyncio.ensure_future(pod.admit("ended", (4, 4, 4)))
        await until(lambda: _wiring(store, "ended"), "ended WIRING", timeout=20)
        await pod.ws.CancelJob(ws.CancelJobRequest(job_id="ended"))
        assert (await pod.job("ended")).state == common_pb2.JOB_STATE_CANCELLED
        await asyncio.sleep(LEASE_S + 3.0)  # its WireSlice ends, its commit is refused
        assert value(reader, REFUSED) == 0
        for call in (admitted, cancelled):
            call.cancel()  # its answer is not what this test is about
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
                await call
