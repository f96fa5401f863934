"""The switched fabric manager on a real Redis: reservations committed in one
script, replicas racing on one Redis, release, swap, queries (SW-4 … SW-6)."""

from __future__ import annotations

import asyncio

import pytest

from lightpath.domain.switched import SwitchedFabricConfig, build_fabric
from lightpath.domain.switched_rings import Degrees, Tile
from lightpath.errors import Aborted, FailedPrecondition, NotFound, ResourceExhausted
from lightpath_services.common.redis_store import connect
from lightpath_services.ocs_manager.switched.manager import SwitchedFabricManager
from lightpath_services.ocs_manager.switched.store import SwitchedStore, pack, unpack
from tests.switched.fabrics import FIG11, FIG15, fabric
from tests.switched.ringcheck import assert_valid


@pytest.fixture
async def binary_redis(redis_url):
    client = connect(redis_url, decode_responses=False)
    yield client
    await client.aclose()


async def manager(client, config, pod="pod-s"):
    f = build_fabric(config)
    store = SwitchedStore(client, pod, f)
    await store.ensure_fabric()
    return SwitchedFabricManager(f, store)


async def stored_union(m: SwitchedFabricManager) -> tuple[set[int], set[int]]:
    ids = await m.store.job_ids(limit=1000)
    chans: list[int] = []
    procs: list[int] = []
    for j in ids:
        plan = (await m.get(j)).plan
        chans += plan.channels()
        procs += [p for t in plan.tiles for p in t.processors(m.fabric)]
    assert len(chans) == len(set(chans)), "a channel is stored for two rings"
    assert len(procs) == len(set(procs)), "a processor is in two jobs"
    return set(chans), set(procs)


async def check_state(m: SwitchedFabricManager) -> None:
    m.store._cache = None
    snap = await m.snapshot()
    chans, procs = await stored_union(m)
    assert {i for i, x in enumerate(snap.used) if x} == chans
    assert {i for i, x in enumerate(snap.procs) if x} == procs


def test_bitmaps_round_trip_in_redis_bit_order():
    data = pack([0, 9, 17], 20)
    assert data == bytes([0b10000000, 0b01000000, 0b01000000])
    assert {i for i, x in enumerate(unpack(data, 20)) if x} == {0, 9, 17}


async def test_reserve_commits_the_plan_and_replays_by_job_id(binary_redis):
    m = await manager(binary_redis, FIG11)
    f = m.fabric
    tiles = [Tile.whole(f, g) for g in range(4)]
    first = await m.reserve("demo", Degrees(4, 3, 3), tiles)
    assert not first.replayed
    assert_valid(f, first.plan)
    again = await m.reserve("demo", Degrees(4, 3, 3), list(reversed(tiles)))
    assert again.replayed and again.plan == first.plan
    with pytest.raises(FailedPrecondition) as e:
        await m.reserve("demo", Degrees(2, 3, 3), tiles[:2])
    assert e.value.reason == "JOB_EXISTS"
    await check_state(m)
    # a bit in Redis for exactly the plan's channels
    raw = await binary_redis.get(m.store.k_used)
    assert {i for i, x in enumerate(unpack(raw, f.channel_count)) if x} == set(
        first.plan.channels()
    )


async def test_a_second_job_on_taken_processors_is_failed_precondition(binary_redis):
    m = await manager(binary_redis, FIG11)
    f = m.fabric
    await m.reserve("a", Degrees(1, 3, 3), [Tile.whole(f, 0)])
    with pytest.raises(FailedPrecondition) as e:
        await m.reserve("b", Degrees(1, 3, 3), [Tile.whole(f, 0)])
    assert e.value.reason == "PROCESSORS_IN_USE" and "held by a" in e.value.message
    await check_state(m)


async def test_release_frees_exactly_the_job_and_unknown_jobs_are_not_found(binary_redis):
    m = await manager(binary_redis, FIG11)
    f = m.fabric
    a = (await m.reserve("a", Degrees(2, 3, 3), [Tile.whole(f, 0), Tile.whole(f, 1)])).plan
    b = (await m.reserve("b", Degrees(2, 3, 3), [Tile.whole(f, 2), Tile.whole(f, 3)])).plan
    released = await m.release("a")
    assert released == a
    snap = await m.snapshot()
    assert {i for i, x in enumerate(snap.used) if x} == set(b.channels())
    with pytest.raises(NotFound):
        await m.release("a")
    with pytest.raises(NotFound):
        await m.get("nobody")
    await check_state(m)


async def test_replicas_racing_for_scarce_uplinks_never_share_a_channel(binary_redis):
    """Five replicas (own stores, own caches) admit jobs that each need the one
    tier-1 path between two tier-0 switches; commits that lose a race plan again."""
    scarce = SwitchedFabricConfig(
        **{
            **FIG15.to_dict(),
            "group_shape": (4,),
            "tier0_up_ports": 3,
            "cluster_cols": 6,
            "tier0_down_ports": 12,
        }
    )
    replicas = [await manager(binary_redis, scarce) for _ in range(5)]
    f = replicas[0].fabric
    jobs = [(f"j{k}", [Tile.whole(f, k), Tile.whole(f, 6 + k)]) for k in range(6)]

    async def admit(k, job, tiles):
        try:
            return (await replicas[k % 5].reserve(job, Degrees(8, 1, 1), tiles)).plan
        except (ResourceExhausted, Aborted):
            return None

    plans = await asyncio.gather(*(admit(k, j, t) for k, (j, t) in enumerate(jobs)))
    won = [p for p in plans if p is not None]
    # 3 up links per tier-0 switch, each job needs one up and one down channel at both
    assert len(won) == 3
    for p in won:
        assert_valid(f, p)
    await check_state(replicas[0])


async def test_swap_moves_only_the_failed_groups_rings(binary_redis):
    m = await manager(binary_redis, FIG11)
    f = m.fabric
    plan = (await m.reserve("a", Degrees(2, 3, 3), [Tile.whole(f, 0), Tile.whole(f, 1)])).plan
    result = await m.swap("a", 1, free_groups=[3, 2])
    assert result.new_tile.group == 3  # g1.1 shares a column switch with g0.1
    stored = await m.get("a")
    assert stored.plan == result.plan and stored.version == 2
    assert 1 not in result.plan.groups
    for ring in plan.rings:
        if ring.name not in result.rerouted:
            assert result.plan.ring(ring.name) == ring
    await check_state(m)
    with pytest.raises(FailedPrecondition):
        await m.swap("a", 1, free_groups=[2])
    with pytest.raises(ResourceExhausted):
        await m.swap("a", 3, free_groups=[0])  # g0.0 is the job's own


async def test_switch_use_counts_the_reserved_links(binary_redis):
    m = await manager(binary_redis, FIG15)
    f = m.fabric
    tiles = [Tile.whole(f, g) for g in range(24)] + [Tile.whole(f, 24)]
    plan = (await m.reserve("x", Degrees(100, 1, 1), tiles)).plan
    (use,) = await m.switch_use(["r1/p0"])
    assert (use.down_links, use.up_links) == (48, 16)
    assert use.down_in_use == 2  # the one group's two ends
    assert use.up_in_use == 1 and use.free_uplinks == 15
    assert use.up_out_free == 15 and use.up_in_free == 15
    (t1,) = await m.switch_use(["t1r/p0/0"])
    assert t1.down_in_use == 2
    with pytest.raises(NotFound):
        await m.switch_use(["r9/p9"])
    assert plan.rings


async def test_a_replica_with_another_fabric_refuses_while_jobs_hold_links(binary_redis):
    m = await manager(binary_redis, FIG11)
    await m.reserve("a", Degrees(1, 3, 3), [Tile.whole(m.fabric, 0)])
    other = SwitchedStore(binary_redis, "pod-s", fabric(FIG15))
    with pytest.raises(FailedPrecondition) as e:
        await other.ensure_fabric()
    assert e.value.reason == "FABRIC_MISMATCH"
    await m.release("a")
    assert await other.ensure_fabric() == "CHANGED"
