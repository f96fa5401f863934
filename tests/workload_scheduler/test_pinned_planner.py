"""The planner's decisions (WS-2 … WS-6) as pure functions, at their edges: what the
mutation bench (bench/mutation.py, issue 17) found only the server tests noticing,
or none. No Redis, no gRPC."""

from __future__ import annotations

from lightpath.domain.blocks import PodFabric
from lightpath.domain.switched import SwitchedFabricConfig, build_fabric
from lightpath_services.workload_scheduler.placement import PodState, Unplaceable
from lightpath_services.workload_scheduler.planner import (
    Allocation,
    apply_allocation,
    apply_victims,
    plan_admission,
    plan_pass,
    plan_replacement,
    plan_switched_admission,
    plan_switched_replacement,
    running_with_failed_blocks,
)
from lightpath_services.workload_scheduler.preemption import VictimAction
from tests.workload_scheduler.podfixtures import fabric, job, pod, running


def test_admission_on_free_blocks_needs_no_victims():
    state = pod(fabric(blocks=8), jobs=[running("a", range(4), priority=90)])
    new = job("new", (2, 2, 1), priority=10)
    alloc = plan_admission(state, new)
    assert isinstance(alloc, Allocation)
    assert sorted(alloc.placement) == [4, 5, 6, 7] and alloc.victims == ()
    assert alloc.release_first == ()


def test_a_block_still_wired_for_a_finished_job_is_released_first():
    state = pod(fabric(blocks=4))
    state.wired[2] = "gone"  # its slice finished; the release is pending
    alloc = plan_admission(state, job("new", (4, 1, 1)))
    assert isinstance(alloc, Allocation)
    assert alloc.release_first == ("gone",)


def test_an_earlier_attempt_of_the_job_is_released_first():
    state = pod(fabric(blocks=4))
    state.wired[0] = "new"
    alloc = plan_admission(state, job("new", (2, 1, 1)))
    assert isinstance(alloc, Allocation) and alloc.release_first == ("new",)


def test_without_preemption_a_full_pod_leaves_the_job_waiting():
    state = pod(fabric(blocks=4), jobs=[running("low", range(4), priority=10)])
    hi = job("hi", (2, 1, 1), priority=90)
    assert isinstance(plan_admission(state, hi, preempt=False), Unplaceable)
    alloc = plan_admission(state, hi)
    assert isinstance(alloc, Allocation) and [v.job_id for v in alloc.victims] == ["low"]
    assert alloc.release_first == ("low",)


def test_no_lower_priority_work_means_no_admission():
    state = pod(fabric(blocks=4), jobs=[running("peer", range(4), priority=50)])
    assert isinstance(plan_admission(state, job("same", (1, 1, 1), priority=50)), Unplaceable)


def test_victims_are_assumed_gone_in_their_own_way():
    state = pod(
        fabric(blocks=12),
        jobs=[
            running("t", range(0, 4), priority=10, policy="TERMINATE"),
            running("d", range(4, 8), priority=10, policy="DELAY"),
            running(
                "s",
                range(8, 12),
                grid=(2, 2, 1),
                priority=10,
                policy="SHRINK",
                shrink_to=[(2, 1, 1)],
            ),
        ],
    )
    apply_victims(
        state,
        [
            VictimAction("t", "TERMINATE", (0, 1, 2, 3)),
            VictimAction("d", "DELAY", (4, 5, 6, 7)),
            VictimAction("s", "SHRINK", (10, 11), (2, 1, 1), (8, 9)),
        ],
    )
    assert "t" not in state.jobs
    assert state.jobs["d"].state == "SUSPENDED" and state.jobs["d"].placement is None
    s = state.jobs["s"]
    assert s.state == "WIRING" and s.placement == (8, 9) and s.demand.grid == (2, 1, 1)
    assert sorted(state.owner) == [8, 9]


def test_an_allocation_is_assumed_wiring_on_its_blocks():
    state = pod(fabric(blocks=4))
    new = job("new", (2, 1, 1))
    state.jobs["new"] = new
    apply_allocation(state, Allocation(new, (1, 3)))
    assert state.jobs["new"].state == "WIRING" and state.jobs["new"].placement == (1, 3)
    assert state.owner == {1: "new", 3: "new"}


def test_a_pass_skips_jobs_in_backoff_until_their_time():
    state = pod(fabric(blocks=8))
    state.jobs["later"] = job("later", (2, 1, 1), seq=1).with_(not_before_ms=1000)
    state.jobs["now"] = job("now", (2, 1, 1), seq=2)
    assert [a.job.job_id for a in plan_pass(state, now_ms=999)] == ["now"]
    assert [a.job.job_id for a in plan_pass(state, now_ms=1000)] == ["later", "now"]


def test_a_pass_assumes_each_decision_before_the_next():
    state = pod(fabric(blocks=4))
    state.jobs["a"] = job("a", (2, 1, 1), seq=1)
    state.jobs["b"] = job("b", (2, 1, 1), seq=2)
    state.jobs["c"] = job("c", (2, 1, 1), seq=3)
    decisions = plan_pass(state)
    assert [a.job.job_id for a in decisions] == ["a", "b"]
    assert set(decisions[0].placement).isdisjoint(decisions[1].placement)
    assert state.owner == {}  # the snapshot itself is untouched


def test_a_partial_pass_gives_up_when_a_job_does_not_fit_on_free_blocks():
    fab = fabric(blocks=4)
    state = PodState(fab, free={0, 1})
    state.jobs["small"] = job("small", (2, 1, 1), seq=1)
    decisions = plan_pass(state)
    assert [a.job.job_id for a in decisions] == ["small"]
    state.jobs["big"] = job("big", (4, 1, 1), seq=2)
    assert plan_pass(state) is None


def test_replacement_prefers_an_unwired_spare_then_the_lowest_id():
    j = running("s", [4, 5], grid=(2, 1, 1))
    state = pod(fabric(blocks=8), failed={5}, jobs=[j])
    state.wired[0] = "gone"
    rep = plan_replacement(state, j, 5)
    assert rep is not None and (rep.spare, rep.position_index, rep.release_first) == (1, 1, ())
    state.wired.update({b: "gone" for b in (1, 2, 3, 6, 7)})
    rep = plan_replacement(state, j, 5)
    assert rep is not None and rep.spare == 0 and rep.release_first == ("gone",)


def test_replacement_from_lower_priority_work():
    j = running("hi", [0, 1], grid=(2, 1, 1), priority=80)
    low = running("low", [2, 3], grid=(2, 1, 1), priority=10)
    state = pod(fabric(blocks=4), failed={1}, jobs=[j, low])
    rep = plan_replacement(state, j, 1)
    assert rep is not None
    assert rep.spare == 2 and [v.job_id for v in rep.victims] == ["low"]
    assert rep.release_first == ("low",)
    # a partial snapshot cannot find victims: it answers None and the caller takes a full one
    partial = PodState(state.fabric, failed={1}, free=set(), jobs=dict(state.jobs))
    assert plan_replacement(partial, j, 1) is None


def test_replacement_from_a_victim_keeps_the_first_end_group():
    fab = fabric(blocks=8, k=2)
    j = running("hi", [0, 1], grid=(2, 1, 1), priority=80)
    low = running("low", range(2, 8), grid=(6, 1, 1), priority=10)
    state = pod(fab, failed={1}, jobs=[j, low])
    rep = plan_replacement(state, j, 1)
    assert rep is not None and rep.spare == 3  # odd: block 1's group, lowest such id


def test_no_replacement_when_nothing_lower_can_give_a_block():
    j = running("s", [0, 1], grid=(2, 1, 1), priority=10)
    other = running("o", [2, 3], grid=(2, 1, 1), priority=10)
    state = pod(fabric(blocks=4), failed={1}, jobs=[j, other])
    assert plan_replacement(state, j, 1) is None


def test_running_slices_still_holding_a_failed_block_in_queue_order():
    a = running("a", [0, 1], priority=10, seq=1)
    b = running("b", [2, 3], priority=90, seq=2)
    c = running("c", [4, 5], priority=90, seq=3).with_(replacing=(5, 6))
    w = job("w", (2, 1, 1), state="WIRING", placement=[6, 7])
    state = pod(fabric(blocks=8), failed={1, 3, 5, 7}, jobs=[a, b, c, w])
    assert [(j.job_id, blk) for j, blk in running_with_failed_blocks(state)] == [
        ("b", 3),
        ("a", 1),
    ]


# -- SWITCHED pods (SW-2 … SW-5) --------------------------------------------------------

SWITCHED_SPEC = "group=3x3 cluster=2x4 planes=9 ports=48/16 tier1=2x64"


def switched_pod(types=("npu",) * 8, small=frozenset({6, 7})) -> PodState:
    sf = build_fabric(SwitchedFabricConfig.parse(SWITCHED_SPEC))
    return PodState(PodFabric("pod-s", (3, 3), tuple(types), switched=sf, small_groups=small))


def sjob(job_id, degrees, *, priority=50, seq=None, groups=None, tile=None, state="PENDING"):
    n = max(1, len(groups or ()) or 1)
    j = job(job_id, (n,), priority=priority, seq=seq, types="npu", state=state, placement=groups)
    return j.with_(degrees=tuple(degrees), tile=tile)


def hold(state: PodState, j) -> None:
    state.jobs[j.job_id] = j
    for key in j.held_keys():
        if isinstance(key, str):
            state.tile_owner[key] = j.job_id
            state.tile_wired[key] = j.job_id
        else:
            state.owner[key] = j.job_id
            state.wired[key] = j.job_id


def test_switched_small_job_gets_a_tile_in_a_small_group():
    state = switched_pod()
    j = sjob("small", (2, 2, 1))
    state.jobs["small"] = j
    alloc = plan_switched_admission(state, j)
    assert isinstance(alloc, Allocation)
    assert alloc.tile is not None and alloc.tile[0] in (6, 7)
    assert alloc.placement == (alloc.tile[0],) and alloc.tile[3] * alloc.tile[4] >= 4
    assert alloc.release_first == ()


def test_switched_large_job_takes_whole_groups_outside_the_small_ones():
    state = switched_pod()
    j = sjob("large", (2, 3, 3))
    state.jobs["large"] = j
    alloc = plan_switched_admission(state, j)
    assert isinstance(alloc, Allocation) and alloc.tile is None
    assert len(alloc.placement) == 2 and not set(alloc.placement) & {6, 7}
    assert list(alloc.placement) == sorted(alloc.placement)


def test_switched_groups_of_another_type_are_never_used():
    state = switched_pod(types=("gpu",) * 4 + ("npu",) * 4, small={7})
    j = sjob("large", (2, 3, 3))
    state.jobs["large"] = j
    alloc = plan_switched_admission(state, j)
    assert isinstance(alloc, Allocation) and set(alloc.placement) <= {4, 5, 6}


def test_switched_large_job_preempts_lower_priority_large_jobs_only():
    state = switched_pod(small=frozenset({6, 7}))
    low = sjob("low", (2, 3, 3), priority=10, groups=[0, 1], state="RUNNING")
    mid = sjob("mid", (4, 3, 3), priority=60, groups=[2, 3, 4, 5], state="RUNNING")
    hold(state, low)
    hold(state, mid)
    hi = sjob("hi", (2, 3, 3), priority=90)
    state.jobs["hi"] = hi
    assert isinstance(plan_switched_admission(state, hi, preempt=False), Unplaceable)
    alloc = plan_switched_admission(state, hi)
    assert isinstance(alloc, Allocation)
    assert [v.job_id for v in alloc.victims] == ["low"] and alloc.placement == (0, 1)
    assert alloc.release_first == ("low",)
    # a small job never preempts (it would take a tile, not groups)
    small = sjob("small9", (3, 3, 1), priority=99)
    full = switched_pod(small=frozenset({6, 7}))
    for g in (6, 7):
        hold(
            full,
            sjob(f"t{g}", (3, 3, 1), priority=1, groups=[g], tile=(g, 0, 0, 3, 3), state="RUNNING"),
        )
    assert isinstance(plan_switched_admission(full, small), Unplaceable)


def test_switched_replacement_prefers_a_free_unwired_group_and_requeues_small_jobs():
    state = switched_pod()
    big = sjob("big", (2, 3, 3), groups=[0, 1], state="RUNNING")
    hold(state, big)
    state.failed.add(1)
    rep = plan_switched_replacement(state, big, 1)
    assert rep is not None and rep.spare not in (0, 1, 6, 7) and rep.position_index == 1
    assert rep.release_first == ()
    spare = rep.spare
    state.wired[spare] = "gone"  # the best group still carries an old reservation
    rep2 = plan_switched_replacement(state, big, 1)
    assert rep2 is not None and rep2.spare != spare and rep2.release_first == ()
    tiny = sjob("tiny", (2, 1, 1), groups=[6], tile=(6, 0, 0, 1, 2), state="RUNNING")
    hold(state, tiny)
    assert plan_switched_replacement(state, tiny, 6) is None


def test_switched_replacement_none_when_no_group_is_free():
    state = switched_pod()
    hold(state, sjob("big", (2, 3, 3), groups=[0, 1], state="RUNNING"))
    hold(state, sjob("rest", (4, 3, 3), groups=[2, 3, 4, 5], state="RUNNING"))
    state.failed.add(0)
    assert plan_switched_replacement(state, state.jobs["big"], 0) is None
    # only wired (released-pending) groups left: one of them, released first
    del state.owner[5], state.owner[4], state.owner[3], state.owner[2]
    del state.jobs["rest"]
    rep = plan_switched_replacement(state, state.jobs["big"], 0)
    assert rep is not None and rep.release_first == ("rest",)


def test_a_pass_at_time_zero_by_default():
    state = pod(fabric(blocks=4))
    state.jobs["soon"] = job("soon", (2, 1, 1)).with_(not_before_ms=1)
    assert plan_pass(state) == []


def test_a_replacement_takes_one_block_so_one_small_victim_is_enough():
    j = running("hi", [0, 1], grid=(2, 1, 1), priority=80)
    a = running("a", [2], priority=10, seq=1)
    b = running("b", [3], priority=10, seq=2)
    state = pod(fabric(blocks=4), failed={1}, jobs=[j, a, b])
    rep = plan_replacement(state, j, 1)
    assert rep is not None and len(rep.victims) == 1 and rep.spare in (2, 3)


def test_a_replacement_from_a_mixed_victim_is_of_the_failed_blocks_type():
    fab = fabric("gpu:1,tpu:3", blocks=4)  # block 0 is the gpu
    j = running("hi", [1, 2], grid=(2, 1, 1), priority=80, types="tpu")
    mixed = running("mixed", [0, 3], grid=(2, 1, 1), priority=10, types=("gpu", "tpu"))
    state = pod(fab, failed={2}, jobs=[j, mixed])
    rep = plan_replacement(state, j, 2)
    assert rep is not None and rep.spare == 3  # not the victim's gpu block 0


def test_a_victim_is_released_first_even_when_the_spare_carries_no_mark():
    j = running("hi", [0, 1], grid=(2, 1, 1), priority=80)
    low = running("low", [2, 3], grid=(2, 1, 1), priority=10)
    state = pod(fabric(blocks=4), failed={1}, jobs=[j, low])
    del state.wired[2], state.wired[3]
    rep = plan_replacement(state, j, 1)
    assert rep is not None and rep.release_first == ("low",)


def test_a_small_job_fits_in_the_one_processor_other_small_jobs_left():
    state = switched_pod()
    for g in (6, 7):
        for i in range(3):
            for j in range(3):
                if (g, i, j) != (7, 1, 0):
                    state.tile_owner[f"t{g}.{i}.{j}"] = "others"
    one = sjob("one", (1, 1, 1))
    state.jobs["one"] = one
    alloc = plan_switched_admission(state, one)
    assert isinstance(alloc, Allocation) and alloc.tile == (7, 1, 0, 1, 1)


def test_switched_admission_preempts_by_default_and_waits_without_victims():
    state = switched_pod()
    hold(state, sjob("low", (2, 3, 3), priority=10, groups=[0, 1], state="RUNNING"))
    hold(state, sjob("mid", (4, 3, 3), priority=60, groups=[2, 3, 4, 5], state="RUNNING"))
    hi = sjob("hi", (2, 3, 3), priority=90)
    alloc = plan_switched_admission(state, hi)
    assert isinstance(alloc, Allocation) and [v.job_id for v in alloc.victims] == ["low"]
    peer = sjob("peer", (2, 3, 3), priority=10)
    assert isinstance(plan_switched_admission(state, peer), Unplaceable)


def test_switched_admission_after_a_failed_reservation_takes_the_next_candidate():
    state = switched_pod()
    j = sjob("j", (2, 3, 3))
    state.jobs["j"] = j
    picks = [plan_switched_admission(state, j.with_(attempts=a)).placement for a in range(3)]
    assert picks[0] != picks[1]
    assert picks[2] not in (picks[0], picks[1]) or len({*picks}) == 2


def test_switched_replacement_is_the_first_of_the_replacement_order():
    from lightpath.domain.switched_rings import replacement_order

    state = switched_pod()
    big = sjob("big", (2, 3, 3), groups=[0, 1], state="RUNNING")
    hold(state, big)
    state.failed.add(1)
    free = [g for g in range(6) if g not in (0, 1)]
    order = replacement_order(state.fabric.switched, 1, free)
    rep = plan_switched_replacement(state, big, 1)
    assert rep is not None and rep.spare == order[0]
