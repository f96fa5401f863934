"""WS-1: the pod's state in a real Redis, changed only by atomic, checked commits."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis.asyncio as aioredis

from lightpath.domain.slices import PENDING, RUNNING, WIRING
from lightpath_services.workload_scheduler.placement import Placement, place
from lightpath_services.workload_scheduler.store import Conflict, PodStore
from tests.workload_scheduler.podfixtures import fabric, job

POD = "pod-s"


async def _create(store: PodStore, j, now=1_000):
    txn = store.txn()
    txn.expect_no_job(j.job_id)
    txn.zadd(store.keys.jobs, j.seq, j.job_id)
    txn.write_job(j, old_state=None, reason="admitted", now_ms=now)
    await store.commit(txn)


async def test_a_failed_check_applies_nothing(redis_client):
    store = PodStore(redis_client, POD)
    j = job("j1", (2, 1, 1))
    await _create(store, j)
    txn = store.txn()
    txn.hset(store.keys.owner, {0: "j1", 1: "j1"})
    txn.expect_job("j1", [WIRING])  # it is PENDING: the whole commit is refused
    with pytest.raises(Conflict, match="job j1 is PENDING"):
        await store.commit(txn)
    assert await redis_client.hgetall(store.keys.owner) == {}
    with pytest.raises(Conflict, match="job j1 changed"):
        txn = store.txn()
        txn.expect_job("j1", [PENDING], epoch=7)
        await store.commit(txn)
    with pytest.raises(Conflict):
        await _create(store, j)  # the id is taken


async def test_transitions_are_recorded_with_time_reason_and_counts(redis_client):
    store = PodStore(redis_client, POD)
    j = job("j2", (1, 1, 1))
    await _create(store, j, now=5)
    placed = j.with_(state=WIRING, epoch=2, placement=(3,))
    txn = store.txn()
    txn.expect_job("j2", [PENDING], 1)
    txn.expect_owner(3, [""])
    txn.expect_health(3, "HEALTHY")
    txn.hset(store.keys.owner, {3: "j2"})
    txn.write_job(placed, old_state=PENDING, reason="placed on blocks 3", now_ms=9)
    await store.commit(txn)
    record = await store.job("j2", history=True)
    assert record is not None and record.state == WIRING and record.epoch == 2
    assert [(e["from"], e["to"], e["at"], e["n"]) for e in record.history] == [
        ("", PENDING, 5, 1),
        (PENDING, WIRING, 9, 2),
    ]
    assert record.history[1]["reason"] == "placed on blocks 3"
    assert await store.state_counts() == {WIRING: 1}
    state = await store.snapshot(fabric())
    assert state.owner == {3: "j2"} and state.jobs["j2"].placement == (3,)
    # The pod stream carries the same events, for watchers on any replica.
    entries = await redis_client.xrange(store.keys.events)
    assert [json.loads(f["e"])["to"] for _, f in entries] == [PENDING, WIRING]


async def test_block_checks(redis_client):
    store = PodStore(redis_client, POD)
    await redis_client.hset(store.keys.failed, "4", "{}")
    await redis_client.hset(store.keys.wired, "5", "old-job")
    for check, match in [
        (lambda t: t.expect_health(4, "HEALTHY"), "block 4 is not HEALTHY"),
        (lambda t: t.expect_wired_by(5, ["other"]), "block 5 is still wired to old-job"),
        (lambda t: t.expect_owner(6, ["someone"]), "block 6 is held by nobody"),
    ]:
        txn = store.txn()
        check(txn)
        with pytest.raises(Conflict, match=match):
            await store.commit(txn)
    txn = store.txn()
    txn.expect_wired_by(5, ["old-job"])
    txn.unwire("old-job")
    await store.commit(txn)
    assert await redis_client.hgetall(store.keys.wired) == {}


async def test_replicas_allocating_concurrently_never_share_a_block(redis_url):
    """Several deciders (each its own connection, like scheduler replicas) race for a
    16-block pod: snapshot → place → checked commit, retrying on Conflict."""
    fab = fabric(blocks=16)
    clients = [aioredis.Redis.from_url(redis_url, decode_responses=True) for _ in range(4)]
    stores = [PodStore(c, POD) for c in clients]
    jobs = [job(f"j{i}", (3, 1, 1), seq=i) for i in range(12)]
    for j in jobs:
        await _create(stores[0], j)
    conflicts = 0

    async def replica(store: PodStore, mine):
        nonlocal conflicts
        for j in mine:
            while True:
                state = await store.snapshot(fab)
                current = state.jobs[j.job_id]
                if current.state != PENDING:
                    break  # another replica placed it
                found = place(state, current.demand)
                if not isinstance(found, Placement):
                    break
                txn = store.txn()
                txn.expect_job(j.job_id, [PENDING], current.epoch)
                for b in found.blocks:
                    txn.expect_owner(b, [""])
                    txn.expect_health(b, "HEALTHY")
                txn.hset(store.keys.owner, {b: j.job_id for b in found.blocks})
                txn.write_job(
                    current.with_(state=RUNNING, epoch=current.epoch + 1, placement=found.blocks),
                    old_state=PENDING,
                    reason="placed",
                    now_ms=1,
                )
                try:
                    await store.commit(txn)
                    break
                except Conflict:
                    conflicts += 1
                    await asyncio.sleep(0)

    try:
        # Every replica tries every job, in a different order.
        await asyncio.gather(*(replica(s, jobs[i:] + jobs[:i]) for i, s in enumerate(stores)))
        state = await stores[0].snapshot(fab)
    finally:
        for c in clients:
            await c.aclose()
    running = [j for j in state.jobs.values() if j.state == RUNNING]
    assert len(running) == 5  # 16 blocks hold five 3-block slices
    held = [b for j in running for b in j.placement]
    assert len(held) == len(set(held)) == 15
    assert state.owner == {b: j.job_id for j in running for b in j.placement}
    assert conflicts > 0  # the race really happened and was refused


async def test_a_snapshot_comes_with_the_next_sequence_or_the_newest_event(redis_client):
    store = PodStore(redis_client, "pod-tip")
    f = fabric()
    _, first = await store.snapshot_and_seq(f)
    _, second = await store.snapshot_and_seq(f)
    assert second == first + 1
    state, tip = await store.snapshot_and_tip(f)
    assert tip == "0-0" and not state.jobs
    await _create(store, job("j-tip", (1, 1, 1)))
    state, tip = await store.snapshot_and_tip(f)
    assert tip == await store.tip() != "0-0" and set(state.jobs) == {"j-tip"}
    await store.rebuild_indexes(f)
    lean, lean_tip = await store.lean_snapshot(f, extra="tip")
    assert lean_tip == tip and set(lean.jobs) == {"j-tip"}
    _, seq = await store.lean_snapshot(f, extra="seq")
    assert seq == second + 1
