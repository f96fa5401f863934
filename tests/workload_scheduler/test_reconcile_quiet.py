"""Issue 15: a reconcile round over a pod that did not change since the last one reads
nothing more than the newest event id; a change, or a full round, reads everything."""

from __future__ import annotations

import redis.asyncio as aioredis

from lightpath.client import channel
from services.workload_scheduler.ocs import OcsManagerClient
from services.workload_scheduler.scheduler import WorkloadScheduler
from services.workload_scheduler.store import PodStore
from tests.helpers import serve
from tests.workload_scheduler.conftest import ocs_env
from tests.workload_scheduler.podfixtures import fabric


class CountingOcs(OcsManagerClient):
    """The real client, counting how often a round lists the ocs_manager's slices."""

    listed = 0

    async def slices(self):
        self.listed += 1
        return await super().slices()


async def test_a_quiet_pod_is_not_read_again_until_it_changes(redis_url):
    async with (
        serve("ocs_manager", redis_url, ocs_env(16)) as ocs_svc,
        channel(ocs_svc.address, max_attempts=1) as ch,
        aioredis.Redis.from_url(redis_url, decode_responses=True) as r,
    ):
        ocs = CountingOcs(ch)
        fab = fabric(blocks=16)
        store = PodStore(r, fab.pod_id)
        await store.rebuild_indexes(fab)
        sched = WorkloadScheduler(store=store, ocs=ocs, fabric=fab)
        sched.full_every_ms = 3_600_000
        await sched.reconcile()
        assert ocs.listed == 1
        await sched.reconcile()
        await sched.reconcile()
        assert ocs.listed == 1  # nothing changed: nothing read
        await sched.report_health(3, healthy=False, reason="test")  # appends an event
        await sched.reconcile()
        assert ocs.listed == 2
        await sched.reconcile()
        assert ocs.listed == 2
        await sched.reconcile(full=True)
        assert ocs.listed == 3
        sched.full_every_ms = 0  # a full round is due at once
        await sched.reconcile()
        assert ocs.listed == 4
