"""Issue 15: decisions on the lean snapshot (free blocks, the queue, the jobs marking free
blocks) are exactly those on the whole pod, and the indexes behind it follow every commit."""

from __future__ import annotations

import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightpath.domain.slices import (
    COMPLETED,
    PENDING,
    QUEUED_STATES,
    RUNNING,
    SUSPENDED,
    WIRING,
)
from lightpath_services.workload_scheduler.placement import PodState
from lightpath_services.workload_scheduler.planner import plan_pass, plan_replacement
from lightpath_services.workload_scheduler.store import PodStore
from tests.workload_scheduler.podfixtures import fabric, job, running
from tests.workload_scheduler.test_preemption import pods

POD = "pod-lean"


def partial_of(state: PodState) -> PodState:
    """The lean snapshot the store would answer for `state` (what _LEAN_LUA reads)."""
    free = {
        b for b in range(state.fabric.block_count) if b not in state.failed and b not in state.owner
    }
    wired = {b: j for b, j in state.wired.items() if b in free}
    named = set(wired.values())
    jobs = {
        j.job_id: j for j in state.jobs.values() if j.state in QUEUED_STATES or j.job_id in named
    }
    marked = frozenset(j for j in set(state.wired.values()) if j in jobs)
    return PodState(
        state.fabric, failed=set(state.failed), wired=wired, jobs=jobs, free=free, marked=marked
    )


@st.composite
def pods_with_leftovers(draw):
    """pods() plus wiring marks a release has not removed yet: of ended jobs, of queued
    jobs (an earlier attempt), on free blocks and on blocks someone holds now."""
    state = draw(pods())
    queued = [j.job_id for j in state.jobs.values() if j.state in QUEUED_STATES]
    for b in draw(st.sets(st.integers(0, state.fabric.block_count - 1), max_size=6)):
        if b in state.wired:
            continue
        state.wired[b] = draw(st.sampled_from(["gone", *queued]))
    return state


@settings(max_examples=300)
@given(state=pods_with_leftovers(), now=st.sampled_from([0, 10**12]))
def test_a_lean_pass_decides_exactly_as_the_whole_pod_or_not_at_all(state, now):
    full = plan_pass(state, now)
    lean = plan_pass(partial_of(state), now)
    assert full is not None
    if lean is not None:
        assert lean == full
    # It declines only when some job cannot be placed on free blocks alone.
    waiting = [j for j in state.queue() if j.not_before_ms <= now]
    if all(not d.victims for d in full) and len(full) == len(waiting):
        assert lean == full


@settings(max_examples=300)
@given(state=pods_with_leftovers(), data=st.data())
def test_a_lean_replacement_is_the_whole_pods_or_left_to_it(state, data):
    runs = [j for j in state.jobs.values() if j.state == RUNNING]
    if not runs:
        return
    job_ = data.draw(st.sampled_from(sorted(runs, key=lambda j: j.job_id)))
    failed = data.draw(st.sampled_from(job_.placement))
    state.failed.add(failed)
    lean_state = partial_of(state)
    lean_state.jobs[job_.job_id] = job_  # the lean snapshot names the failing job
    full = plan_replacement(state, job_, failed)
    lean = plan_replacement(lean_state, job_, failed)
    if lean is not None:
        assert lean == full
    elif full is not None:
        assert full.victims  # only a plan that takes blocks from other work needs them all


# -- the indexes in a real Redis ------------------------------------------------------------

FAB = fabric("tpu:12,gpu:4", blocks=16)
JOBS = ["a", "b", "c"]
ops = st.lists(
    st.one_of(
        st.tuples(st.just("own"), st.integers(0, 15), st.sampled_from(JOBS)),
        st.tuples(st.just("free"), st.integers(0, 15)),
        st.tuples(st.just("fail"), st.integers(0, 15)),
        st.tuples(st.just("heal"), st.integers(0, 15)),
        st.tuples(st.just("mark"), st.integers(0, 15), st.sampled_from(JOBS)),
        st.tuples(st.just("unmark"), st.integers(0, 15)),
        st.tuples(st.just("unwire"), st.sampled_from(JOBS)),
        st.tuples(
            st.just("state"),
            st.sampled_from(JOBS),
            st.sampled_from([PENDING, SUSPENDED, WIRING, RUNNING, COMPLETED]),
        ),
    ),
    max_size=25,
)


async def _index(r: aioredis.Redis, store: PodStore) -> tuple:
    k = store.keys
    return (
        [await r.getbit(k.free, b) for b in range(FAB.block_count)],
        await r.hgetall(k.freewired),
        {j: int(n) for j, n in (await r.hgetall(k.wired_count)).items()},
        await r.hgetall(k.queued),
    )


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=ops)
async def test_commits_keep_the_indexes_as_a_rebuild_derives_them(redis_url, steps):
    async with aioredis.Redis.from_url(redis_url, decode_responses=True) as r:
        await r.flushall()
        store = PodStore(r, POD)
        await store.rebuild_indexes(FAB)
        states: dict[str, str] = {}
        for step in steps:
            txn = store.txn()
            kind = step[0]
            if kind == "own":
                txn.hset(store.keys.owner, {step[1]: step[2]})
            elif kind == "free":
                txn.hdel(store.keys.owner, [step[1]])
            elif kind == "fail":
                txn.hset(store.keys.failed, {step[1]: "{}"})
            elif kind == "heal":
                txn.hdel(store.keys.failed, [step[1]])
            elif kind == "mark":
                txn.hset(store.keys.wired, {step[1]: step[2]})
            elif kind == "unmark":
                txn.hdel(store.keys.wired, [step[1]])
            elif kind == "unwire":
                txn.unwire(step[1])
            else:
                _, job_id, new_state = step
                j = job(job_id, (1, 1, 1), state=new_state, seq=JOBS.index(job_id) + 1)
                if new_state in (WIRING, RUNNING):
                    j = j.with_(placement=(0,))
                txn.write_job(j, old_state=states.get(job_id), reason="test", now_ms=1)
                states[job_id] = new_state
            await store.commit(txn)
        kept = await _index(r, store)
        await store.rebuild_indexes(FAB)
        assert kept == await _index(r, store)
        # And the lean snapshot reads what the whole one implies.
        full = await store.snapshot(FAB)
        lean, _ = await store.lean_snapshot(FAB)
        want = partial_of(full)
        assert (lean.free, lean.wired, lean.failed) == (want.free, want.wired, want.failed)
        assert lean.jobs == want.jobs and lean.marked == want.marked


async def test_a_lost_index_is_rebuilt_by_the_next_lean_snapshot(redis_client):
    store = PodStore(redis_client, POD)
    txn = store.txn()
    txn.hset(store.keys.owner, {0: "a", 1: "a"})
    txn.hset(store.keys.failed, {2: "{}"})
    txn.write_job(running("a", [0, 1]), old_state=None, reason="test", now_ms=1)
    await store.commit(txn)  # no index yet: the commit maintains none
    state, _ = await store.lean_snapshot(FAB)
    assert state.free == set(range(3, 16))
    await redis_client.delete(store.keys.free)  # as if Redis lost it
    state, _ = await store.lean_snapshot(FAB)
    assert state.free == set(range(3, 16)) and state.failed == {2}
