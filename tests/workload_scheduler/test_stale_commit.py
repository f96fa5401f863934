"""A replica's commit of a wiring whose lease it lost (issue 32): while its WireSlice is
held up past the wiring lease another replica takes the job over (a higher epoch);
the first replica's RUNNING commit is refused, and the refusal is counted
(lightpath.pod.stale_commits_refused). A cancel that ends a wiring is not counted."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from lightpath.domain.slices import WIRING
from lightpath.v1 import common_pb2
from lightpath.v1 import workload_scheduler_pb2 as ws
from lightpath_services.workload_scheduler import server as ws_server
from lightpath_services.workload_scheduler.metrics import PodMetrics
from lightpath_services.workload_scheduler.store import PodStore
from tests.metrics_reader import install, value
from tests.workload_scheduler.conftest import POD, pod_stack
from tests.workload_scheduler.test_fault_hardening import slow_ocs, until

REFUSED = "lightpath.pod.stale_commits_refused"
LEASE_S = 1.5  # the wiring lease; the switches settle for longer


async def _wiring(store: PodStore, job_id: str):
    record = await store.job(job_id)
    return record if record is not None and record.state == WIRING else None


async def _take_over(store: PodStore, job_id: str) -> int:
    """What a second replica's reconcile does to a wiring past its lease: the job under
    a higher epoch and a new lease, as its own (reconcile._take_over_wiring)."""
    record = await until(lambda: _wiring(store, job_id), f"{job_id} WIRING", timeout=20)
    job = record.summary
    now = int(time.time() * 1000)
    txn = store.txn()
    txn.expect_job(job_id, [WIRING], job.epoch)
    taken = job.with_(epoch=job.epoch + 1, wiring_deadline_ms=now + 60_000)
    txn.write_job(taken, old_state=WIRING, reason="wiring taken over after a timeout", now_ms=now)
    await store.commit(txn)
    return taken.epoch


async def test_a_commit_after_the_wiring_was_taken_over_is_refused_and_counted(
    redis_url, monkeypatch
):
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
        admitted = asyncio.ensure_future(pod.admit("held", (4, 4, 4)))
        epoch = await _take_over(store, "held")
        # the replica's WireSlice ends past its lease: its RUNNING commit is refused
        await until(lambda: _counted(reader), "the refusal to be counted", timeout=30)
        # nothing of the stale commit applied: the job is the taker's, as it left it
        record = await store.job("held")
        assert record is not None and (record.state, record.epoch) == (WIRING, epoch)
        admitted.cancel()

        # a wiring ended by a cancel: its commit is refused too, but not counted
        cancelled = asyncio.ensure_future(pod.admit("ended", (4, 4, 4)))
        await until(lambda: _wiring(store, "ended"), "ended WIRING", timeout=20)
        await pod.ws.CancelJob(ws.CancelJobRequest(job_id="ended"))
        await until(lambda: _state(pod, "ended", common_pb2.JOB_STATE_CANCELLED), "a cancel")
        await asyncio.sleep(LEASE_S + 3.0)  # its WireSlice ends, its commit is refused
        assert value(reader, REFUSED) == 1
        cancelled.cancel()


async def _counted(reader) -> bool:
    return value(reader, REFUSED) >= 1


async def _state(pod, job_id: str, state: int) -> bool:
    return (await pod.job(job_id)).state == state
