"""Each part of the workload scheduler used alone, given its collaborators (a real Redis
and ocs_manager, the other parts it calls) and an injected clock: no WorkloadScheduler."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from lightpath.client import channel
from lightpath.domain.jobs import normalize
from lightpath.domain.slices import PENDING, RUNNING, WIRING
from lightpath.v1 import common_pb2
from lightpath.v1 import workload_scheduler_pb2 as ws
from lightpath_services.common.txn import STALE_LEASE
from lightpath_services.workload_scheduler.admission import Admission
from lightpath_services.workload_scheduler.core import QUIET_HORIZON_MS, PodContext
from lightpath_services.workload_scheduler.ocs import OcsError, OcsManagerClient, job_lease
from lightpath_services.workload_scheduler.reconcile import Reconcile
from lightpath_services.workload_scheduler.swap import Swap
from lightpath_services.workload_scheduler.wiring import Wirer
from tests.helpers import serve
from tests.workload_scheduler.conftest import ocs_env
from tests.workload_scheduler.podfixtures import fabric
from tests.workload_scheduler.test_reconcile_quiet import CountingStore

T0 = 1_700_000_000.0  # the injected clock's start, s


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def context(
    redis_url: str, clock: Callable[[], float] | None = None
) -> AsyncIterator[PodContext]:
    """The collaborators of a 16-block pod, on the injected clock (a Clock by default)."""
    async with (
        serve("ocs_manager", redis_url, ocs_env(16)) as ocs_svc,
        channel(ocs_svc.address, max_attempts=1) as ch,
        aioredis.Redis.from_url(redis_url, decode_responses=True) as r,
    ):
        fab = fabric(blocks=16)
        store = CountingStore(r, fab.pod_id)
        await store.rebuild_indexes(fab)
        yield PodContext(store=store, ocs=OcsManagerClient(ch), fabric=fab, clock=clock or Clock())


def _no_pass() -> None:
    raise AssertionError("this part asked for a pass over the queue")


async def test_the_wirer_releases_leftover_wiring_under_a_claim(redis_url):
    async with context(redis_url) as pod:
        wirer = Wirer(pod, schedule_soon=_no_pass)
        txn = pod.store.txn()
        txn.hset(pod.store.keys.wired, {7: "gone"})  # a job that ended, its release lost
        await pod.store.commit(txn)
        assert await wirer.release_claimed("gone", wait_s=0)
        assert await pod.store.wired_jobs() == set()
        done = asyncio.Event()
        task = wirer.track("w", done.wait())
        assert wirer.tasks == {"w": task}
        done.set()
        await task
        await asyncio.sleep(0)  # the done callback
        assert wirer.tasks == {}


class PausedBeforeRelease(OcsManagerClient):
    """The ocs_manager as a replica paused between its release claim and its
    ReleaseSlice sees it: `meanwhile` (what other replicas did) runs first."""

    def __init__(self, real: OcsManagerClient, meanwhile: Callable):
        super().__init__(real._channel, timeout_s=real.timeout_s)
        self.meanwhile = meanwhile

    async def release(self, job_id: str, *, lease: tuple[str, int] | None = None) -> bool:
        await self.meanwhile()
        return await super().release(job_id, lease=lease)


async def test_a_late_release_of_leftover_wiring_is_refused_once_the_job_was_wired_again(
    redis_url,
):
    """release_claimed carries the job's lease as its claim read it (issue 32): a
    replica that claimed a queued job's leftover wiring and paused past the claim, while
    another replica placed the job and wired it again, is refused (STALE_LEASE) and the
    new wiring stays; a release under the job's current lease goes through."""
    async with context(redis_url) as pod:
        wirer = Wirer(pod, schedule_soon=lambda: None)
        spec = ws.JobSpec(job_id="j", shape=common_pb2.Shape(dims=[4, 4, 4]))
        admitted = await Admission(pod, wirer).admit(
            spec, normalize(spec, pod.fabric), validate_only=False
        )
        running = admitted.record.summary
        assert running.state == RUNNING and running.placement is not None
        (first,) = running.placement

        async def write(job, old_state: str) -> None:
            txn = pod.store.txn()
            txn.expect_job("j", [old_state])
            txn.write_job(job, old_state=old_state, reason="test", now_ms=pod.now_ms())
            await pod.store.commit(txn)

        # back in the queue (a swap gave up, say), its wiring left at the ocs_manager
        queued = running.with_(state=PENDING, epoch=running.epoch + 1, placement=None)
        txn = pod.store.txn()
        txn.release_held(running, pod.fabric.block_shape)
        await pod.store.commit(txn)
        await write(queued, RUNNING)

        async def another_replica_wires_it_again() -> None:
            again = queued.with_(state=WIRING, epoch=queued.epoch + 2, placement=(first + 1,))
            await pod.ocs.release("j", lease=job_lease(again))  # making room, as its own
            await pod.ocs.wire_job(again)
            await write(again, PENDING)

        paused = PodContext(
            store=pod.store,
            ocs=PausedBeforeRelease(pod.ocs, another_replica_wires_it_again),
            fabric=pod.fabric,
            clock=pod.clock,
        )
        with pytest.raises(OcsError) as err:
            await Wirer(paused, schedule_soon=lambda: None).release_claimed("j", wait_s=0)
        assert err.value.reason == STALE_LEASE, err.value
        assert await pod.ocs.slices() == {"j": (first + 1,)}  # the new wiring stays
        assert not await pod.store.redis.exists(pod.store.keys.releasing("j"))
        # queued again later: a release under the job's lease as it is now goes through
        record = await pod.store.job("j")
        assert record is not None
        await write(record.summary.with_(state=PENDING, epoch=record.epoch + 1), WIRING)
        assert await wirer.release_claimed("j", wait_s=0)
        assert await pod.ocs.slices() == {}


async def test_admission_places_and_stamps_a_job_with_the_injected_clock(redis_url):
    async with context(redis_url) as pod:
        admission = Admission(pod, Wirer(pod, schedule_soon=lambda: None))
        spec = ws.JobSpec(job_id="a", shape=common_pb2.Shape(dims=[8, 4, 4]))
        result = await admission.admit(spec, normalize(spec, pod.fabric), validate_only=False)
        assert result.created and result.record.state == RUNNING
        assert result.record.summary.submitted_ms == int(T0 * 1000)
        assert result.record.created_ms == int(T0 * 1000)
        assert len(result.record.summary.placement or ()) == 2


async def test_swap_marks_an_idle_block_failed_and_back_at_the_injected_time(redis_url):
    async with context(redis_url) as pod:
        wirer = Wirer(pod, schedule_soon=_no_pass)
        swap = Swap(pod, wirer, Admission(pod, wirer))
        failed = await swap.report_health(5, healthy=False, reason="fan")
        assert failed.action == "block marked failed; it held no slice"
        assert (await pod.store.failed_entry(5) or {})["at"] == int(T0 * 1000)
        assert isinstance(pod.clock, Clock)
        pod.clock.now += 60
        back = await swap.report_health(5, healthy=True, reason="fan replaced")
        assert back.action == "block is healthy and back in the pool"
        assert await pod.store.failed_entry(5) is None


async def test_reconcile_rounds_read_a_quiet_pod_again_past_the_horizon(redis_url):
    async with context(redis_url) as pod:
        wirer = Wirer(pod, schedule_soon=lambda: None)
        admission = Admission(pod, wirer)
        rounds = Reconcile(pod, wirer, admission, Swap(pod, wirer, admission))
        store = pod.store
        assert isinstance(store, CountingStore)
        await rounds.reconcile()
        read = store.whole
        await rounds.reconcile()
        assert store.whole == read  # quiet: the pod is not read
        assert isinstance(pod.clock, Clock)
        pod.clock.now += QUIET_HORIZON_MS / 1000
        await rounds.reconcile()
        assert store.whole == read + 1  # past the horizon: read once more
