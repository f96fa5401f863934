"""Issue 28: sub-block slices packed into blocks at chip granularity, and host-level
health. Pure planning over snapshots (no I/O); the service side is in
test_subblock_service.py."""

from __future__ import annotations

import pytest

from lightpath.domain.jobs import normalize
from lightpath.domain.slices import (
    DELAY,
    PENDING,
    RUNNING,
    SHRINK,
    SUB_BLOCK_OWNER,
    TERMINATE,
    SliceDemand,
    SliceJob,
    box_chips,
)
from lightpath.errors import InvalidArgument
from lightpath.v1 import common_pb2, workload_scheduler_pb2
from lightpath_services.workload_scheduler.box_placement import (
    BoxPlacement,
    aligned_offsets,
    largest_free_box,
    place_box,
)
from lightpath_services.workload_scheduler.placement import PodState
from lightpath_services.workload_scheduler.planner import (
    Allocation,
    apply_allocation,
    boxes_on_failed_chips,
    plan_admission,
    plan_box_move,
    plan_pass,
    plan_replacement,
    running_with_failed_blocks,
)
from tests.workload_scheduler.podfixtures import fabric as _fabric
from tests.workload_scheduler.podfixtures import job

_n = iter(range(1, 10**9))


def fabric(blocks: int = 64):
    """4x4x4 blocks of 16 hosts of 2x2x1 chips, as TPU v4's."""
    return _fabric(blocks=blocks, hosts=(2, 2, 1))


def box_job(job_id, box, *, priority=50, policy=DELAY, shrink_to=(), state=PENDING, types="tpu"):
    return SliceJob(
        job_id=job_id,
        state=state,
        epoch=1,
        priority=priority,
        seq=next(_n),
        demand=SliceDemand((1, 1, 1), (types,), (False,) * 3, box=tuple(box)),
        preemption=policy,
        shrink_to=tuple(tuple(g) for g in shrink_to),
    )


def hosted(state: PodState, j: SliceJob, block: int, offset) -> SliceJob:
    """`j` RUNNING on chips `offset` of `block` (as committed)."""
    placed = j.with_(state=RUNNING, placement=(block,), offset=tuple(offset))
    state.assume_allocated(placed)
    return placed


def place_all(state: PodState, jobs) -> list[Allocation]:
    out = []
    for j in jobs:
        state.jobs[j.job_id] = j
        found = plan_admission(state, j)
        assert isinstance(found, Allocation), (j.job_id, found)
        apply_allocation(state, found)
        out.append(found)
    return out


def test_aligned_offsets_are_multiples_of_the_box():
    assert aligned_offsets((4, 4, 4), (2, 2, 1)) == [
        (x, y, z) for z in range(4) for y in (0, 2) for x in (0, 2)
    ]
    assert aligned_offsets((4, 4, 4), (4, 4, 4)) == [(0, 0, 0)]
    assert aligned_offsets((4, 4, 4), (3, 1, 1)) == [(0, y, z) for z in range(4) for y in range(4)]


def test_sub_block_slices_share_a_block_with_disjoint_aligned_boxes():
    state = PodState(fabric(blocks=4))
    jobs = [box_job(f"s{i}", (2, 2, 2)) for i in range(8)]
    allocs = place_all(state, jobs)
    assert {a.placement for a in allocs} == {(3,)}  # the highest free block, all eight
    chips = [set(box_chips(a.offset, (2, 2, 2))) for a in allocs]
    assert sum(len(c) for c in chips) == 64 and len(set().union(*chips)) == 64
    assert all(all(o % 2 == 0 for o in a.offset) for a in allocs)
    assert state.owner[3] == SUB_BLOCK_OWNER
    # The ninth opens the next block down; block slices still take the lowest ids.
    (ninth,) = place_all(state, [box_job("s8", (1, 1, 1))])
    assert ninth.placement == (2,)
    (big,) = place_all(state, [job("big", (2, 1, 1))])
    assert big.placement == (0, 1)


def test_best_fit_prefers_the_partly_used_block_with_fewest_free_chips():
    state = PodState(fabric(blocks=4))
    hosted(state, box_job("a", (2, 4, 4)), 3, (0, 0, 0))  # block 3: 32 free
    hosted(state, box_job("b", (2, 4, 4)), 2, (0, 0, 0))
    hosted(state, box_job("c", (2, 2, 4)), 2, (2, 0, 0))  # block 2: 16 free
    found = place_box(state, box_job("d", (2, 2, 2)))
    assert found == BoxPlacement(2, (2, 2, 0))
    # Too big for block 2's hole, fits block 3's.
    assert place_box(state, box_job("e", (2, 4, 4))) == BoxPlacement(3, (2, 0, 0))


def test_a_box_never_opens_a_block_still_wired_to_an_ended_slice():
    state = PodState(fabric(blocks=2))
    state.wired[1] = "ended"  # leftover OCS wiring of a finished slice
    assert place_box(state, box_job("s", (1, 1, 1))) == BoxPlacement(0, (0, 0, 0))


def test_failed_hosts_take_their_chips_out_but_not_the_rest_of_the_block():
    fab = fabric(blocks=2)
    state = PodState(fab, failed={1}, failed_hosts={1: frozenset({0})})
    # Host 0 of a 4x4x4 block of 2x2x1 hosts is chips x, y in 0..1 at z = 0.
    assert fab.hosts_per_block == 16 and fab.host_of((1, 1, 0)) == 0 and fab.host_of((2, 0, 0)) == 1
    found = place_box(state, box_job("s", (2, 2, 1)))
    assert found == BoxPlacement(1, (2, 0, 0))  # the degraded block, off its failed host
    # ... which no block slice may take.
    assert plan_admission(state, job("b", (2, 1, 1)), preempt=False).reason.startswith("needs 2")
    assert isinstance(plan_admission(state, job("one", (1, 1, 1))), Allocation)
    counts = state.counts_by_type()["tpu"]
    assert counts["failed"] == 1 and counts["chips_failed"] == 4
    assert counts["chips_free"] == 124 and counts["chips_used"] == 0


def test_a_whole_failed_block_takes_no_box():
    state = PodState(fabric(blocks=1), failed={0})
    assert not isinstance(place_box(state, box_job("s", (1, 1, 1))), BoxPlacement)


def test_the_last_box_leaving_gives_the_block_back_to_block_slices():
    state = PodState(fabric(blocks=1))
    a = hosted(state, box_job("a", (2, 2, 2)), 0, (0, 0, 0))
    b = hosted(state, box_job("b", (2, 2, 2)), 0, (2, 0, 0))
    state.assume_released("a", a.held_keys())
    assert state.owner[0] == SUB_BLOCK_OWNER
    state.assume_released("b", b.held_keys())
    assert 0 not in state.owner and state.allocatable(0)


def test_a_higher_priority_box_preempts_the_least_important_boxes_only():
    state = PodState(fabric(blocks=1))
    low = hosted(state, box_job("low", (2, 4, 4), priority=20), 0, (0, 0, 0))
    hosted(state, box_job("mid", (2, 4, 4), priority=40), 0, (2, 0, 0))
    urgent = box_job("urgent", (2, 2, 2), priority=60)
    state.jobs["urgent"] = urgent
    alloc = plan_admission(state, urgent)
    assert isinstance(alloc, Allocation)
    assert [v.job_id for v in alloc.victims] == ["low"] and alloc.victims[0].action == DELAY
    assert set(box_chips(alloc.offset, (2, 2, 2))) <= set(box_chips(low.offset, (2, 4, 4)))
    # Equal priority takes nothing.
    peer = box_job("peer", (2, 2, 2), priority=20)
    state.jobs["peer"] = peer
    assert not isinstance(plan_admission(state, peer), Allocation)


def test_a_shrinking_box_victim_keeps_its_origin_sub_box():
    state = PodState(fabric(blocks=1))
    hosted(
        state,
        box_job("big", (4, 4, 4 - 1), priority=10, policy=SHRINK, shrink_to=[(4, 4, 1)]),
        0,
        (0, 0, 0),
    )
    hosted(state, box_job("top", (4, 4, 1), priority=90), 0, (0, 0, 3))
    new = box_job("new", (4, 4, 1), priority=50)
    state.jobs["new"] = new
    alloc = plan_admission(state, new)
    assert isinstance(alloc, Allocation)
    (v,) = alloc.victims
    # Shrinking (keeping z = 0) clears z = 1: preferred to delaying it for z = 0.
    assert v.action == SHRINK and v.shrink_grid == (4, 4, 1)
    assert alloc.offset == (0, 0, 1)
    trial = state.copy()
    apply_allocation(trial, alloc)
    assert trial.jobs["big"].demand.box == (4, 4, 1)
    assert len([k for k, j in trial.tile_owner.items() if j == "big"]) == 16


def test_a_box_may_take_a_whole_block_from_lower_priority_block_slices():
    state = PodState(fabric(blocks=1))
    state.assume_allocated(
        job("blk", (1, 1, 1), priority=10, state=RUNNING, placement=[0], policy=TERMINATE)
    )
    state.wired[0] = "blk"
    urgent = box_job("urgent", (1, 1, 1), priority=60)
    state.jobs["urgent"] = urgent
    alloc = plan_admission(state, urgent)
    assert isinstance(alloc, Allocation)
    assert [(v.job_id, v.action) for v in alloc.victims] == [("blk", TERMINATE)]
    assert alloc.placement == (0,) and alloc.release_first == ("blk",)


def test_plan_pass_packs_the_real_mix_of_box_and_block_jobs_in_queue_order():
    state = PodState(fabric(blocks=3))
    for j in [
        box_job("s1", (1, 2, 2), priority=70),
        job("b1", (2, 1, 1), priority=60),
        box_job("s2", (2, 2, 4), priority=50),
        job("b2", (1, 1, 1), priority=40),  # no block left: waits
    ]:
        state.jobs[j.job_id] = j
    decided = {a.job.job_id: a for a in plan_pass(state) or []}
    assert set(decided) == {"s1", "b1", "s2"}
    assert decided["s1"].placement == decided["s2"].placement == (2,)
    assert decided["b1"].placement == (0, 1)


def test_a_partial_snapshot_defers_sub_block_slices_to_a_full_one():
    state = PodState(fabric(blocks=2), free={0, 1})
    state.jobs["s"] = box_job("s", (1, 1, 1))
    assert plan_pass(state) is None


def test_moving_a_box_off_a_failed_host():
    fab = fabric(blocks=2)
    state = PodState(fab)
    victim = hosted(state, box_job("s", (2, 2, 1)), 1, (0, 0, 0))
    hosted(state, box_job("t", (2, 2, 1)), 1, (2, 0, 0))
    state.failed.add(1)
    state.failed_hosts[1] = frozenset({0})
    assert boxes_on_failed_chips(state) == [victim]
    assert running_with_failed_blocks(state) == []  # boxes are not block-swapped
    assert plan_box_move(state, victim) == BoxPlacement(1, (0, 2, 0))  # same block, healthy chips


def test_largest_free_box_counts_what_a_sub_block_slice_can_get_now():
    state = PodState(fabric(blocks=1))
    assert largest_free_box(state, "tpu") == 64
    hosted(state, box_job("a", (2, 4, 4)), 0, (0, 0, 0))
    assert largest_free_box(state, "tpu") == 32
    hosted(state, box_job("b", (2, 4, 2)), 0, (2, 0, 0))
    assert largest_free_box(state, "tpu") == 16


def test_slice_job_json_keeps_box_offset_and_twist():
    j = box_job("s", (1, 2, 2)).with_(state=RUNNING, placement=(5,), offset=(0, 2, 2))
    back = SliceJob.from_json(j.to_json())
    assert back == j and back.held_keys() == j.held_keys()
    assert back.held_keys() == ["c5.0.2.2", "c5.0.3.2", "c5.0.2.3", "c5.0.3.3"]
    t = job("t", (1, 1, 2))
    t = t.with_(demand=SliceDemand(t.demand.grid, t.demand.node_types, t.demand.wrap, twisted=True))
    assert SliceJob.from_json(t.to_json()).demand.twisted


def _spec(dims, **kw):
    return workload_scheduler_pb2.JobSpec(job_id="j", shape=common_pb2.Shape(dims=dims), **kw)


def test_normalize_makes_a_box_of_a_shape_inside_one_block():
    norm = normalize(_spec([2, 2, 1]), fabric())
    assert norm.demand.box == (2, 2, 1) and norm.demand.grid == (1, 1, 1)
    assert norm.demand.wrap == (False, False, False) and norm.chips == (2, 2, 1)
    # A whole block is a block slice, as before.
    assert normalize(_spec([4, 4, 4]), fabric()).demand.box is None


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        (_spec([2, 2, 1], wrap=[True, True, True]), "spec.wrap", "mesh"),
        (_spec([2, 2, 1], twisted=True), "spec.twisted", "inside one block"),
        (_spec([4, 4, 4], twisted=True), "spec.twisted", "cannot be twisted"),
        (_spec([4, 4, 8], twisted=True, wrap=[True, False, True]), "spec.twisted", "wraps"),
        (_spec([6, 8, 8]), "spec.shape.dims[0]", "8x8x8 or 4x8x8"),
        (
            _spec(
                [2, 2, 2],
                preemption_policy=common_pb2.PREEMPTION_POLICY_SHRINK,
                shrink_to=[common_pb2.Shape(dims=[2, 2, 4])],
            ),
            "spec.shrink_to[0]",
            "sub-box",
        ),
    ],
)
def test_bad_sub_block_and_twisted_specs_name_the_field_and_rule(spec, field, words):
    with pytest.raises(InvalidArgument) as err:
        normalize(spec, fabric())
    found = {v.field: v.rule for v in err.value.violations}
    assert field in found and words in found[field], found


def test_twisted_shapes_are_accepted_in_any_axis_order():
    for dims in ([4, 4, 8], [8, 4, 4], [4, 8, 8], [16, 8, 16]):
        assert normalize(_spec(dims, twisted=True), fabric()).demand.twisted


def test_a_block_slice_takes_a_block_whose_sub_block_slices_are_all_lower_priority():
    state = PodState(fabric(blocks=2))
    state.assume_allocated(job("held", (1, 1, 1), priority=90, state=RUNNING, placement=[0]))
    hosted(state, box_job("a", (2, 2, 2), priority=10, policy=TERMINATE), 1, (0, 0, 0))
    hosted(state, box_job("b", (2, 2, 2), priority=30), 1, (2, 0, 0))
    urgent = job("urgent", (1, 1, 1), priority=60)
    state.jobs["urgent"] = urgent
    alloc = plan_admission(state, urgent)
    assert isinstance(alloc, Allocation) and alloc.placement == (1,)
    assert {(v.job_id, v.action) for v in alloc.victims} == {("a", TERMINATE), ("b", DELAY)}
    trial = state.copy()
    apply_allocation(trial, alloc)
    assert trial.owner[1] == "urgent" and not trial.chips_held()
    # The cell reclaiming lent quota (issue 35): the named boxes go whatever their
    # priority, the block only when all of them are named.
    owner = job("owner", (1, 1, 1), priority=5)
    found = plan_admission(state, owner, reclaim=frozenset({"a", "b"}))
    assert isinstance(found, Allocation) and found.placement == (1,)
    assert {v.job_id for v in found.victims} == {"a", "b"}
    assert not isinstance(plan_admission(state, owner, reclaim=frozenset({"a"})), Allocation)
    # One of them at the preemptor's priority protects the whole block.
    state.jobs["b"] = state.jobs["b"].with_(priority=60)
    assert not isinstance(plan_admission(state, urgent), Allocation)


def test_a_swap_whose_only_victims_are_a_blocks_sub_block_slices_is_no_swap():
    """Found by the simulator (issue 29): choose_victims may offer a block of lower-priority
    sub-block slices; they free chips, not a block plan_replacement can take, so the slice
    is lost as when no victim exists (it used to raise on an empty choice)."""
    state = PodState(fabric(blocks=2))
    held = job("held", (1, 1, 1), priority=90, state=RUNNING, placement=[0])
    state.assume_allocated(held)
    hosted(state, box_job("a", (2, 2, 2), priority=10), 1, (0, 0, 0))
    state.failed.add(0)
    assert plan_replacement(state, state.jobs["held"], 0) is None


def test_a_box_reclaiming_quota_takes_the_named_boxes_only_whatever_their_priority():
    """Issue 35: the cell names the borrowers' sub-block slices; the owner's box takes
    room from those alone, by their own policies, never from an unnamed one of lower
    priority (nor from one that reclaimed from it)."""
    state = PodState(fabric(blocks=1))
    hosted(state, box_job("stranger", (2, 4, 4), priority=5), 0, (0, 0, 0))
    hosted(state, box_job("borrowed", (2, 4, 4), priority=90, policy=TERMINATE), 0, (2, 0, 0))
    owner = box_job("owner", (2, 2, 2), priority=10)
    state.jobs["owner"] = owner
    alloc = plan_admission(state, owner, reclaim=frozenset({"borrowed"}))
    assert isinstance(alloc, Allocation)
    assert [(v.job_id, v.action) for v in alloc.victims] == [("borrowed", TERMINATE)]
    assert alloc.offset is not None and alloc.offset[0] == 2
    # without the name, its priority rules: the stranger's lower-priority box goes
    alloc = plan_admission(state, owner)
    assert isinstance(alloc, Allocation) and [v.job_id for v in alloc.victims] == ["stranger"]
    # a named box that reclaimed from the owner is never its victim
    state.jobs["borrowed"] = state.jobs["borrowed"].with_(reclaimed_from=("owner",))
    assert not isinstance(plan_admission(state, owner, reclaim=frozenset({"borrowed"})), Allocation)
    # a box that reclaimed from a delayed one (back from the cell queue) is never its
    # victim, whatever its priority
    back = box_job("back", (2, 4, 4), priority=90)
    after = PodState(fabric(blocks=1))
    hosted(after, box_job("high", (2, 4, 4), priority=95), 0, (0, 0, 0))
    mine = box_job("mine", (2, 4, 4), priority=10)
    hosted(after, mine.with_(reclaimed_from=("back",)), 0, (2, 0, 0))
    after.jobs["back"] = back
    assert not isinstance(plan_admission(after, back), Allocation)
    after.jobs["mine"] = after.jobs["mine"].with_(reclaimed_from=())
    alloc = plan_admission(after, back)
    assert isinstance(alloc, Allocation) and [v.job_id for v in alloc.victims] == ["mine"]
