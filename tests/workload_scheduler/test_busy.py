"""Issue 30: under overload the workload scheduler answers rather than holds. An
admission that asked not to wait is refused at once (POD_BUSY, nothing stored) when
the passes ahead of it would hold it too long; a call ending work never waits for a
pass over the queue."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from lightpath.domain.jobs import normalize
from lightpath.errors import ResourceExhausted
from lightpath.v1 import common_pb2
from lightpath.v1 import workload_scheduler_pb2 as ws
from lightpath_services.workload_scheduler.core import BUSY_WAIT_S, PassTimes
from lightpath_services.workload_scheduler.scheduler import WorkloadScheduler
from lightpath_services.workload_scheduler.store import PodStore
from tests.workload_scheduler.test_parts import Clock, context


def test_the_wait_for_the_pass_lock_is_the_passes_ahead_times_a_recent_pass():
    clock = Clock(0.0)
    passes = PassTimes(clock, weight=0.5)
    assert passes.wait_s(running=True) == 0.0  # nothing measured yet: never busy
    for took in (1.0, 3.0):
        with passes.timed():
            clock.now += took
    assert passes.mean_s == pytest.approx(0.5 * (0.5 * 1.0) + 0.5 * 3.0)
    passes.waiting = 2
    assert passes.wait_s(running=True) == pytest.approx(3 * passes.mean_s)
    assert passes.wait_s(running=False) == pytest.approx(2 * passes.mean_s)


def _spec(job_id: str, *, fail: bool = True) -> ws.JobSpec:
    return ws.JobSpec(
        job_id=job_id,
        shape=common_pb2.Shape(dims=[4, 4, 4]),
        when_no_capacity=ws.WHEN_NO_CAPACITY_FAIL if fail else ws.WHEN_NO_CAPACITY_QUEUE,
    )


@contextlib.asynccontextmanager
async def scheduler(redis_url: str) -> AsyncIterator[tuple[WorkloadScheduler, PodStore]]:
    """One replica in this process (its pass lock at hand) over a 16-block pod."""
    async with context(redis_url, time.time) as pod:
        yield WorkloadScheduler(pod), pod.store


async def test_a_job_that_asked_not_to_wait_is_refused_at_once_when_the_pod_is_busy(redis_url):
    async with scheduler(redis_url) as (sched, store):
        fab = sched.fabric
        first = _spec("first")
        assert (await sched.admit(first, normalize(first, fab), validate_only=False)).record
        # Passes have lately taken 1 s each, and one is running: a new job would wait ~1 s.
        clock = Clock(0.0)
        sched.admission._passes = PassTimes(clock, weight=1.0)
        with sched.admission._passes.timed():
            clock.now += 4 * BUSY_WAIT_S
        await sched.admission._pass_lock.acquire()
        try:
            late = _spec("late")
            with pytest.raises(ResourceExhausted) as caught:
                await sched.admit(late, normalize(late, fab), validate_only=False)
            assert caught.value.reason == "POD_BUSY"
            assert caught.value.retry_delay_s >= 4 * BUSY_WAIT_S
            assert "nothing was kept" in caught.value.message
            assert await store.job("late") is None
            # A job the pod has already is answered as it stands, not refused as busy;
            # nor is one that may wait (it waits its turn).
            again = asyncio.ensure_future(
                sched.admit(first, normalize(first, fab), validate_only=False)
            )
            patient = _spec("patient", fail=False)
            waiting = asyncio.ensure_future(
                sched.admit(patient, normalize(patient, fab), validate_only=False)
            )
            while sched.admission._passes.waiting < 2:
                await asyncio.sleep(0.01)
            assert not again.done() and not waiting.done()
        finally:
            sched.admission._pass_lock.release()
        assert (await again).record.state == "RUNNING"
        assert (await waiting).record.state == "RUNNING"


async def test_completing_a_job_does_not_wait_for_the_pass_over_the_queue(redis_url):
    async with scheduler(redis_url) as (sched, store):
        fab = sched.fabric
        whole = ws.JobSpec(job_id="whole", shape=common_pb2.Shape(dims=[16, 16, 4]))
        assert (await sched.admit(whole, normalize(whole, fab), validate_only=False)).record
        queued = ws.JobSpec(job_id="queued", shape=common_pb2.Shape(dims=[4, 4, 4]))
        result = await sched.admit(queued, normalize(queued, fab), validate_only=False)
        assert result.record.state == "PENDING"
        await sched.admission._pass_lock.acquire()  # a pass (another admission's) runs meanwhile
        try:
            # Before issue 30 the complete waited here until the pass lock came free.
            ended = await asyncio.wait_for(sched.complete("whole"), timeout=30)
            assert ended.state == "COMPLETED"
        finally:
            sched.admission._pass_lock.release()
        # The pass it asked for, in the background, starts the queued job.
        while (await store.job("queued")).state != "RUNNING":
            await asyncio.sleep(0.02)


async def test_a_job_that_asked_not_to_wait_is_never_answered_pending(redis_url, monkeypatch):
    """Issue 30: a no-wait job found PENDING after its pass, and not refused the first
    time (another replica's pass had placed it, its wiring failed, it was back in the
    queue), is refused again, not answered PENDING and left to hold blocks later."""
    async with scheduler(redis_url) as (sched, store):
        fab = sched.fabric
        for i in range(16):  # the pod full
            spec = _spec(f"filler-{i}")
            assert (await sched.admit(spec, normalize(spec, fab), validate_only=False)).record
        refuse = sched.admission._refuse
        tries: list[str] = []

        async def first_missed(record):
            tries.append(record.state)
            if len(tries) > 1:
                await refuse(record)

        monkeypatch.setattr(sched.admission, "_refuse", first_missed)
        late = _spec("late")
        with pytest.raises(ResourceExhausted) as caught:
            await sched.admit(late, normalize(late, fab), validate_only=False)
        assert caught.value.reason == "NO_CAPACITY"
        assert tries == ["PENDING", "PENDING"]
        assert await store.job("late") is None
