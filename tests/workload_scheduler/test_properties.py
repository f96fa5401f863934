"""Property tests over gRPC: random admit / complete / cancel / fail / recover sequences
against the real workload_scheduler, ocs_manager and Redis keep the issue's invariants:

* each block is in at most one slice;
* failed blocks host nothing;
* every RUNNING slice is wired exactly as the ocs_manager reports (and nothing else is);
* no higher-priority job waits while lower-priority work holds blocks it could take.
"""

from __future__ import annotations

import grpc
import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightpath.v1 import common_pb2 as c
from lightpath.v1 import workload_scheduler_pb2 as ws
from lightpath_services.workload_scheduler.store import PodStore
from tests.workload_scheduler.conftest import POD, PodStack, pod_stack
from tests.workload_scheduler.podfixtures import fabric

pytestmark = pytest.mark.slow  # runs for many seconds: handed out first

BLOCKS = 8
POLICIES = [
    c.PREEMPTION_POLICY_TERMINATE,
    c.PREEMPTION_POLICY_DELAY,
    c.PREEMPTION_POLICY_SHRINK,
]
SHAPES = {1: (4, 4, 4), 2: (8, 4, 4), 4: (8, 8, 4)}

admit = st.tuples(
    st.just("admit"),
    st.sampled_from(sorted(SHAPES)),
    st.sampled_from([10, 30, 50, 70, 90]),
    st.sampled_from(POLICIES),
)
complete = st.tuples(st.just("complete"), st.integers(0, 30))
cancel = st.tuples(st.just("cancel"), st.integers(0, 30))
fail = st.tuples(st.just("fail"), st.integers(0, BLOCKS - 1))
recover = st.tuples(st.just("recover"), st.integers(0, BLOCKS - 1))
operations = st.lists(
    st.one_of(admit, admit, complete, cancel, fail, recover), min_size=4, max_size=14
)


async def _apply(pod: PodStack, op, jobs: list[str]) -> None:
    kind = op[0]
    try:
        if kind == "admit":
            _, blocks, priority, policy = op
            job_id = f"j{len(jobs)}"
            jobs.append(job_id)
            shrink = (
                [c.Shape(dims=[4, 4, 4])]
                if policy == c.PREEMPTION_POLICY_SHRINK and blocks > 1
                else []
            )
            await pod.admit(
                job_id,
                SHAPES[blocks],
                priority=priority,
                preemption_policy=policy
                if shrink or policy != c.PREEMPTION_POLICY_SHRINK
                else c.PREEMPTION_POLICY_DELAY,
                shrink_to=shrink,
            )
        elif kind in ("complete", "cancel") and jobs:
            job_id = jobs[op[1] % len(jobs)]
            if kind == "complete":
                await pod.ws.CompleteJob(ws.CompleteJobRequest(job_id=job_id))
            else:
                await pod.ws.CancelJob(ws.CancelJobRequest(job_id=job_id))
        elif kind == "fail":
            await pod.fail(op[1])
        elif kind == "recover":
            await pod.recover(op[1])
    except grpc.aio.AioRpcError as err:
        # Completing a job that is not running, cancelling an ended one: refused, harmless.
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err


async def _no_priority_inversion(pod: PodStack, view: ws.PodView) -> None:
    jobs = {j.job_id: await pod.job(j.job_id) for j in view.live_jobs}
    healthy_free = sum(
        1 for b in view.blocks if not b.job_id and b.health == c.BLOCK_HEALTH_HEALTHY
    )
    for waiting in jobs.values():
        if waiting.state not in (c.JOB_STATE_PENDING, c.JOB_STATE_SUSPENDED):
            continue
        takeable = healthy_free
        for other in jobs.values():
            if other.state == c.JOB_STATE_RUNNING and other.priority < waiting.priority:
                keep = 1 if other.spec.preemption_policy == c.PREEMPTION_POLICY_SHRINK else 0
                takeable += (
                    sum(
                        1
                        for b in other.blocks
                        if view.blocks[b.block_id].health == c.BLOCK_HEALTH_HEALTHY
                    )
                    - keep
                )
        need = (
            len(waiting.grid.dims)
            and waiting.grid.dims[0] * waiting.grid.dims[1] * waiting.grid.dims[2]
        )
        assert need > takeable, (
            f"{waiting.job_id} (priority {waiting.priority}, {need} blocks) waits while "
            f"{takeable} blocks are free or held by lower-priority work"
        )


async def _indexes_as_rebuilt(r: aioredis.Redis) -> None:
    """The indexes every commit keeps (issue 15) are what a rebuild derives."""
    store = PodStore(r, POD)
    k = store.keys

    async def read():
        return (
            [await r.getbit(k.free, b) for b in range(BLOCKS)],
            await r.hgetall(k.freewired),
            await r.hgetall(k.wired_count),
            await r.hgetall(k.queued),
            await r.zrange(k.running, 0, -1),
        )

    kept = await read()
    await store.rebuild_indexes(fabric(blocks=BLOCKS))
    assert kept == await read()


@settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
async def test_random_sequences_keep_the_invariants(redis_url, ops):
    async with aioredis.Redis.from_url(redis_url) as r:
        await r.flushall()
    async with (
        pod_stack(redis_url, blocks=BLOCKS) as pod,
        aioredis.Redis.from_url(redis_url, decode_responses=True) as r,
    ):
        jobs: list[str] = []
        for op in ops:
            await _apply(pod, op, jobs)
            await pod.settle()
            view = await pod.assert_consistent()
            await _no_priority_inversion(pod, view)
            await _indexes_as_rebuilt(r)
