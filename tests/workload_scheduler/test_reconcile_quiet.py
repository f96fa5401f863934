"""Issue 15: a reconcile round over a pod that did not change since the last one reads
nothing more than the newest event id; a change, or a full round, reads everything."""

from __future__ import annotations

import redis.asyncio as aioredis

from lightpath.client import channel
from lightpath_services.workload_scheduler.ocs import OcsManagerClient
from lightpath_services.workload_scheduler.scheduler import PodContext, WorkloadScheduler
from lightpath_services.workload_scheduler.store import PodStore
from tests.helpers import serve
from tests.workload_scheduler.conftest import ocs_env
from tests.workload_scheduler.podfixtures import fabric


class CountingOcs(OcsManagerClient):
    """The real client, counting full listings of the ocs_manager's slices and pages of
    the quiet rounds' sweep."""

    listed = 0
    paged = 0

    async def slices(self):
        self.listed += 1
        return await super().slices()

    async def slices_page(self, page_token, page_size):
        self.paged += 1
        return await super().slices_page(page_token, page_size)


class CountingStore(PodStore):
    """The real store, counting reads of the whole pod."""

    whole = 0

    async def snapshot(self, fabric):
        self.whole += 1
        return await super().snapshot(fabric)


async def test_a_quiet_pod_is_not_read_again_until_it_changes(redis_url):
    async with (
        serve("ocs_manager", redis_url, ocs_env(16)) as ocs_svc,
        channel(ocs_svc.address, max_attempts=1) as ch,
        aioredis.Redis.from_url(redis_url, decode_responses=True) as r,
    ):
        ocs = CountingOcs(ch)
        fab = fabric(blocks=16)
        store = CountingStore(r, fab.pod_id)
        await store.rebuild_indexes(fab)
        sched = WorkloadScheduler(PodContext(store=store, ocs=ocs, fabric=fab))
        await sched.reconcile()  # the first round reads and compares everything
        assert (ocs.listed, ocs.paged) == (1, 0) and store.whole == 2
        await sched.reconcile()
        await sched.reconcile()
        # Nothing changed: a page of the sweep each, the pod is not read.
        assert (ocs.listed, ocs.paged, store.whole) == (1, 2, 2)
        await sched.report_health(3, healthy=False, reason="test")  # appends an event
        await sched.reconcile()
        assert (ocs.listed, ocs.paged, store.whole) == (1, 3, 3)  # the pod is read once
        await sched.reconcile()
        assert (ocs.listed, ocs.paged, store.whole) == (1, 4, 3)
        await sched.reconcile(full=True)
        assert (ocs.listed, store.whole) == (2, 5)
        # A slice wired behind the scheduler's back appends no event: the sweep finds it,
        # and the round after compares every slice, which reports it.
        await ocs.wire("stray", (2, 1, 1), [5, 6], (True, True, True))
        await sched.reconcile()
        assert ocs.listed == 2
        await sched.reconcile()
        assert ocs.listed == 3
        assert list(await store.wiring_report()) == ["ORPHANED:stray"]


async def test_a_mark_left_without_an_event_is_found_by_the_sweep(redis_url):
    async with (
        serve("ocs_manager", redis_url, ocs_env(16)) as ocs_svc,
        channel(ocs_svc.address, max_attempts=1) as ch,
        aioredis.Redis.from_url(redis_url, decode_responses=True) as r,
    ):
        fab = fabric(blocks=16)
        store = PodStore(r, fab.pod_id)
        sched = WorkloadScheduler(PodContext(store=store, ocs=OcsManagerClient(ch), fabric=fab))
        await sched.reconcile()
        await sched.reconcile()
        txn = store.txn()
        txn.hset(store.keys.wired, {7: "ghost"})  # as a replica that died would leave it
        await store.commit(txn)
        await sched.reconcile()  # quiet: the sweep sees the mark
        assert await r.hgetall(store.keys.wired) == {"7": "ghost"}
        await sched.reconcile()  # the whole pod: releases it
        assert await r.hgetall(store.keys.wired) == {}
