"""The one supervisor of background tasks (issue 14): a failure is logged with its
trace and the task restarted with capped exponential backoff; a needed task that
is down takes the service's health to NOT_SERVING, and back by itself."""

from __future__ import annotations

import asyncio
import itertools
import logging

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lightpath.client import channel
from lightpath_services.common import supervisor
from lightpath_services.common.server import running
from lightpath_services.common.supervisor import Supervisor, TaskState
from tests.common.test_server import PROBE, _probe_definition, _settings

log = logging.getLogger("test.supervisor")


class Health:
    """What the supervisor told the server, in order."""

    def __init__(self) -> None:
        self.changes: list[bool] = []

    async def __call__(self, serving: bool) -> None:
        self.changes.append(serving)


async def wait_until(predicate, timeout: float = 5.0, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


class ManualClock:
    """Time that moves only when the test says: `sleep` waits for `advance`."""

    def __init__(self) -> None:
        self.t = 0.0
        self._sleepers: list[tuple[float, asyncio.Future]] = []

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.t + seconds, fut))
        await fut

    async def next_wake(self) -> float:
        """Move time to the earliest sleeper's wake-up and wake every one due."""
        await _yield()
        live = [(t, f) for t, f in self._sleepers if not f.done()]
        assert live, "nobody is sleeping"
        self.t = max(self.t, min(t for t, _ in live))
        self._sleepers = []
        for t, f in live:
            if t <= self.t:
                f.set_result(None)
            else:
                self._sleepers.append((t, f))
        await _yield()
        return self.t


async def _yield() -> None:
    for _ in range(20):  # let the woken tasks run to their next wait
        await asyncio.sleep(0)


async def stop(task: asyncio.Task) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_failing_task_restarts_with_capped_exponential_backoff(caplog):
    clock = ManualClock()
    sup = Supervisor(
        log,
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
        healthy_after_s=10,
        clock=clock.now,
        sleep=clock.sleep,
    )
    starts: list[float] = []

    async def flaky() -> None:
        starts.append(clock.now())
        if len(starts) < 6:
            raise RuntimeError(f"boom {len(starts)}")
        await asyncio.sleep(3600)

    with caplog.at_level(logging.INFO, logger="test.supervisor"):
        task = sup.supervise(flaky, "flaky")
        while len(starts) < 6:
            await clock.next_wake()
    entry = sup.tasks["flaky"]
    assert (entry.failures, entry.restarts) == (5, 5)
    assert entry.state is TaskState.RECOVERING
    assert sup.counts()["flaky"] == {"state": "recovering", "failures": 5, "restarts": 5}
    gaps = [round(b - a, 9) for a, b in itertools.pairwise(starts)]
    assert gaps == [0.05, 0.1, 0.2, 0.2, 0.2]  # doubling, then capped at 0.2
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failed) == 5
    assert all(r.levelno == logging.ERROR and r.exc_info for r in failed)
    assert failed[0].exc_info[1].args == ("boom 1",)
    assert failed[-1].task == "flaky" and failed[-1].failures == 5
    await stop(task)
    assert entry.state is TaskState.STOPPED


async def test_backoff_starts_again_after_a_healthy_run():
    clock = ManualClock()
    sup = Supervisor(
        log,
        backoff_initial_s=0.05,
        backoff_max_s=1.0,
        healthy_after_s=0.01,
        reset_after_s=0.05,
        clock=clock.now,
        sleep=clock.sleep,
    )
    starts: list[float] = []

    async def fails_late_once() -> None:
        starts.append(clock.now())
        if len(starts) <= 3:
            raise RuntimeError("early")
        if len(starts) == 4:
            await clock.sleep(0.1)  # longer than reset_after_s
            raise RuntimeError("late")
        await asyncio.sleep(3600)

    task = sup.supervise(fails_late_once, "t")
    while len(starts) < 5:
        await clock.next_wake()
    # waits 0.05, 0.1, 0.2 (growing), then after the long run 0.05 again, not 0.4
    gaps = [round(b - a, 9) for a, b in itertools.pairwise(starts)]
    assert gaps == [0.05, 0.1, 0.2, 0.15]  # the 0.1 s run, then 0.05 again
    await stop(task)


async def test_a_task_that_returns_is_done_unless_forever():
    sup = Supervisor(log, backoff_initial_s=0.01)
    runs = {"once": 0, "again": 0}

    async def once() -> None:
        runs["once"] += 1

    async def again() -> None:
        runs["again"] += 1
        if runs["again"] >= 3:
            await asyncio.sleep(3600)

    done = sup.supervise(once, "once")
    await done
    assert runs["once"] == 1 and sup.tasks["once"].state is TaskState.DONE
    forever = sup.supervise(again, "again", forever=True)
    await wait_until(lambda: runs["again"] == 3)
    assert sup.tasks["again"].restarts == 2 and not forever.done()
    await stop(forever)


async def test_a_needed_task_down_makes_the_service_not_serving_until_it_runs_again():
    sup = Supervisor(log, backoff_initial_s=0.05, healthy_after_s=0.1)
    health = Health()
    await sup.attach_health(health)
    fail = asyncio.Event()
    runs = 0

    async def heartbeat() -> None:
        nonlocal runs
        runs += 1
        await fail.wait()
        fail.clear()
        raise ConnectionError("Redis is loading the dataset in memory")

    task = sup.supervise(heartbeat, "heartbeat")
    await asyncio.sleep(0.02)
    assert sup.serving and health.changes == []
    fail.set()
    await wait_until(lambda: health.changes == [False], what="NOT_SERVING")
    assert not sup.serving and sup.tasks["heartbeat"].state is TaskState.BACKOFF
    await wait_until(lambda: runs == 2, what="the restart")
    assert health.changes == [False]  # restarted, not yet healthy
    await wait_until(lambda: health.changes == [False, True], what="SERVING again")
    assert sup.serving and sup.tasks["heartbeat"].state is TaskState.RUNNING
    await stop(task)


async def test_ready_ends_recovery_before_the_healthy_period():
    sup = Supervisor(log, backoff_initial_s=0.01, healthy_after_s=30)
    health = Health()
    await sup.attach_health(health)
    runs = 0
    go_ready = asyncio.Event()

    async def reporter() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise ConnectionError("first run fails")
        await go_ready.wait()
        supervisor.ready()
        await asyncio.sleep(3600)

    task = sup.supervise(reporter, "reporter")
    await wait_until(lambda: runs == 2)
    await asyncio.sleep(0.05)
    assert health.changes == [False]
    go_ready.set()
    await wait_until(lambda: health.changes == [False, True], timeout=1.0, what="SERVING")
    await stop(task)


async def test_a_task_that_is_not_needed_leaves_health_alone():
    sup = Supervisor(log, backoff_initial_s=0.01, healthy_after_s=0.01)
    health = Health()
    await sup.attach_health(health)
    runs = 0

    async def janitor() -> None:
        nonlocal runs
        runs += 1
        raise RuntimeError("janitor bug")

    task = sup.supervise(janitor, "janitor", needed=False)
    await wait_until(lambda: runs >= 3)
    assert health.changes == [] and sup.serving
    await stop(task)


async def test_cancellation_stops_without_restart_even_when_swallowed():
    """redis.asyncio can swallow a CancelledError (redis/redis-py#2028): the loop then
    ends (or fails) on its own, and that must not count as a failure to restart."""
    sup = Supervisor(log, backoff_initial_s=0.01)
    runs = 0

    async def swallows() -> None:
        nonlocal runs
        runs += 1
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass
        raise ConnectionError("connection closed by the cancellation")

    task = sup.supervise(swallows, "swallows")
    await asyncio.sleep(0.02)
    task.cancel()
    await asyncio.wait({task}, timeout=1)
    assert task.done() and runs == 1
    assert sup.tasks["swallows"].failures == 0
    assert sup.tasks["swallows"].state is TaskState.STOPPED


async def test_health_over_grpc_flips_for_every_name_and_back(redis_url):
    """Through the real runtime: Runtime.supervise, the health servicer, all names."""
    fail = asyncio.Event()
    runs = 0

    async def loop_task() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            await fail.wait()
            raise ConnectionError("Redis went away")
        await asyncio.sleep(3600)

    async def build(runtime):
        runtime.supervisor.backoff_initial_s = 0.3
        runtime.supervisor.healthy_after_s = 0.3
        runtime.supervise(loop_task, "watcher")
        return [_probe_definition([])]

    async def statuses(ch: grpc.aio.Channel) -> set[int]:
        stub = health_pb2_grpc.HealthStub(ch)
        out = set()
        for name in ("", PROBE):
            resp = await stub.Check(health_pb2.HealthCheckRequest(service=name))
            out.add(resp.status)
        return out

    serving = {health_pb2.HealthCheckResponse.SERVING}
    not_serving = {health_pb2.HealthCheckResponse.NOT_SERVING}
    async with (
        running("probe", _settings(redis_url), build) as svc,
        channel(svc.address) as ch,
    ):
        assert await statuses(ch) == serving
        seen = [serving]
        fail.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while loop.time() < deadline and (seen[-1] != serving or runs < 2):
            now = await statuses(ch)
            if len(now) == 1 and seen[-1] != now:  # (two answers: caught mid-change)
                seen.append(now)
            await asyncio.sleep(0.02)
        assert seen == [serving, not_serving, serving]
        assert svc.runtime.supervisor.counts()["watcher"]["restarts"] == 1
