"""A Redis restart under a running cell and pod (issue 14): the services come back
to full function by themselves — the pod reports to the cell again, its jobs leave
UNKNOWN, a new job is placed — and while a needed background task was down the
pod's scheduler said NOT_SERVING on health, then SERVING again.

Twice: redis-server stopped for longer than a client's retries last, and
restarted over a large AOF, so that it answers LOADING for seconds (the failure
seen in the field: BusyLoadingError in the heartbeat's XREAD ended the task).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.exceptions import BusyLoadingError

from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import common_pb2 as c
from tests.cell_scheduler.conftest import Cell, cell_stack
from tests.restarts import (
    DOWN_S,
    FILLER_COPIES,
    NOT_SERVING,
    SERVING,
    HealthLog,
    caused_by,
    fill,
    restart,
)

pytestmark = pytest.mark.slow  # runs for many seconds: handed out first


async def back_to_full_function(cell: Cell, restarted_at: float, jobs: list[str]) -> None:
    async def reporting_again():
        pod = (await cell.pods_view()).get("pod-a")
        return (
            pod is not None
            and pod.status == cs.POD_STATUS_READY
            and pod.last_heartbeat.ToMilliseconds() / 1000 > restarted_at + 0.5
        )

    await cell.wait_for(reporting_again, timeout=20, what="pod-a reporting to the cell again")
    for job_id in jobs:
        job = await cell.wait_state(job_id, c.JOB_STATE_RUNNING, timeout=15)
        assert job.pod_id == "pod-a"


async def test_the_cell_and_pod_recover_from_redis_restarts_by_themselves(
    restartable_redis, caplog
):
    server = restartable_redis
    async with cell_stack(server.url, pods=(("pod-a", 8, "tpu"),)) as cell:
        pod = cell.pods["pod-a"]
        first = await cell.submit("before-restart", (4, 4, 4))
        assert first.job.state == c.JOB_STATE_RUNNING

        # 1. Redis gone for longer than the clients retry.
        with HealthLog(pod.ws_address) as ws_health, HealthLog(cell.cell_addresses[0]) as cs_h:
            await asyncio.sleep(0.1)
            await restart(server, down_s=DOWN_S)
            restarted_at = time.time()
            await back_to_full_function(cell, restarted_at, ["before-restart"])
            await cell.wait_for(
                lambda: _async(ws_health.seen[-1] == SERVING and cs_h.seen[-1] == SERVING),
                what="health SERVING again",
            )
        # The pod's scheduler said NOT_SERVING while its heartbeat was down, and recovered.
        assert ws_health.seen[0] == SERVING and NOT_SERVING in ws_health.seen, ws_health.seen
        assert ws_health.seen[-1] == SERVING
        second = await cell.submit("after-restart", (4, 4, 4))
        assert second.job.state == c.JOB_STATE_RUNNING

        # 2. Restarted over a large AOF: LOADING for seconds.
        await asyncio.to_thread(fill, server.port)
        caplog.clear()
        with HealthLog(pod.ws_address) as ws_health:
            heard = await restart(server, down_s=0, copies=FILLER_COPIES)
            restarted_at = time.time()
            assert "LOADING" in heard, heard
            await back_to_full_function(cell, restarted_at, ["before-restart", "after-restart"])
            await cell.wait_for(
                lambda: _async(ws_health.seen[-1] == SERVING), what="health SERVING again"
            )
        # Not only the probe: a task of the services failed on LOADING, and was restarted.
        loading_failures = [
            r.getMessage()
            for r in caplog.records
            if r.exc_info and caused_by(r.exc_info[1], BusyLoadingError)
        ]
        assert loading_failures, [r.getMessage() for r in caplog.records]
        assert NOT_SERVING in ws_health.seen and ws_health.seen[-1] == SERVING, ws_health.seen
        third = await cell.submit("after-loading", (4, 4, 4))
        assert third.job.state == c.JOB_STATE_RUNNING
        # Watching works again (the cell's event stream reader runs under the supervisor).
        events = []

        async def follow():
            async for e in cell.cell.WatchJob(cs.WatchCellJobRequest(job_id="after-loading")):
                events.append(e.to_state)

        watcher = asyncio.ensure_future(follow())
        await cell.wait_for(lambda: _async(bool(events)), what="the watcher's history")
        await cell.cell.CompleteJob(cs.CompleteCellJobRequest(job_id="after-loading"))
        await asyncio.wait_for(watcher, 10)
        assert events[-1] == c.JOB_STATE_COMPLETED, events


async def _async(value):
    return value
