"""WS-3 placement, with the seed's worked examples (seed 000 Fig. 2, ¶58-64, ¶101-103, ¶131)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightpath.domain.blocks import block_types_for, parse_block_types
from lightpath.domain.slices import RUNNING, grid_positions
from lightpath_services.workload_scheduler.placement import (
    Placement,
    Unplaceable,
    capacity_for,
    place,
)
from lightpath_services.workload_scheduler.planner import plan_replacement
from tests.workload_scheduler.podfixtures import demand, fabric, job, pod, running

# Seed Fig. 2: a 64-block superpod of 4x4x4 blocks; black blocks are failed,
# hatched ones already hold other workloads, scattered over the pod.
FIG2_FAILED = {5, 17, 42, 58}
FIG2_BUSY = {0, 1, 8, 9, 30, 31, 50}


def _fig2_pod():
    return pod(
        failed=FIG2_FAILED,
        jobs=[running("other", sorted(FIG2_BUSY), grid=(len(FIG2_BUSY), 1, 1))],
    )


def _take(state, job_id, placement):
    for b in placement.blocks:
        state.owner[b] = job_id


@pytest.mark.parametrize(
    "chips, grid",
    [((8, 8, 4), (2, 2, 1)), ((8, 8, 8), (2, 2, 2)), ((16, 8, 16), (4, 2, 4))],
)
def test_fig2_each_slice_from_scattered_healthy_free_blocks(chips, grid):
    state = _fig2_pod()
    assert tuple(c // 4 for c in chips) == grid
    got = place(state, demand(grid))
    assert isinstance(got, Placement)
    n = grid[0] * grid[1] * grid[2]
    assert len(got.blocks) == len(set(got.blocks)) == n
    assert not set(got.blocks) & (FIG2_FAILED | FIG2_BUSY)
    # The blocks need not be physically adjacent (¶59, ¶63): with blocks 0, 1, 8, 9 busy
    # and 5 failed, the first slice is made of ids that are not one contiguous run.
    ids = sorted(got.blocks)
    assert ids != list(range(ids[0], ids[0] + n))


def test_fig2_all_three_slices_together_share_no_block():
    state = _fig2_pod()
    taken: list[int] = []
    for i, grid in enumerate([(2, 2, 1), (2, 2, 2), (4, 2, 4)]):
        got = place(state, demand(grid))
        assert isinstance(got, Placement), got
        _take(state, f"slice-{i}", got)
        taken += got.blocks
    assert len(taken) == len(set(taken)) == 4 + 8 + 32
    assert not set(taken) & (FIG2_FAILED | FIG2_BUSY)
    # 64 - 4 failed - 7 busy - 44 = 9 healthy blocks left, so a 16-block slice cannot fit ...
    left = place(state, demand((4, 4, 1)))
    assert isinstance(left, Unplaceable)
    (short,) = left.shortfalls
    assert (short.needed, short.free, short.failed, short.allocated) == (16, 9, 4, 51)
    assert "needs 16 tpu blocks: 9 free and healthy, 51 allocated, 4 failed" == left.reason


def test_logical_shape_is_free_of_the_physical_one():
    """¶64: blocks laid out 8x8x1 can still form a slice 4 blocks long in z."""
    got = place(pod(), demand((1, 1, 4)))
    assert isinstance(got, Placement) and len(got.blocks) == 4


def test_placement_is_deterministic_and_prefers_blocks_without_leftover_wiring():
    state = pod(failed={3})
    state.wired[0] = "finished-job"  # a released slice whose unwiring is pending
    first = place(state, demand((2, 1, 1)))
    assert first == place(state.copy(), demand((2, 1, 1)))
    assert isinstance(first, Placement)
    assert first.blocks == (1, 2)  # 0 awaits a release, 3 failed


def test_blocks_still_wired_to_a_live_slice_are_not_free():
    state = pod(jobs=[running("live", [7])])
    del state.owner[7]  # e.g. a recovered block its slice has not yet been re-wired off
    got = place(state, demand((64, 1, 1)))
    assert isinstance(got, Unplaceable)


def test_tpu_plus_gpu_two_by_two_request():
    """¶103: a 2x2 arrangement of two TPU blocks and two GPU blocks."""
    fab = fabric("tpu:60,gpu:4")
    types = ("tpu", "gpu", "tpu", "gpu")  # per position, x fastest
    got = place(pod(fab), demand((2, 2, 1), types))
    assert isinstance(got, Placement)
    assert [fab.node_types[b] for b in got.blocks] == list(types)
    assert set(got.blocks[1::2]) <= {60, 61, 62, 63}


def test_scarce_types_stay_free_for_requests_that_name_them():
    fab = fabric("tpu:60,gpu:4")
    state = pod(fab, jobs=[running("big", range(59), grid=(59, 1, 1))])
    got = place(state, demand((2, 1, 1)))  # names tpu (the primary type): 1 tpu left
    assert isinstance(got, Unplaceable)
    assert got.shortfalls[0].node_type == "tpu"
    gpu = place(state, demand((2, 1, 1), "gpu"))
    assert isinstance(gpu, Placement) and set(gpu.blocks) <= {60, 61, 62, 63}


def test_with_k2_a_slice_spreads_over_both_first_end_ocs():
    fab = fabric(k=2)  # block b's first ends on OCS k = b % 2
    got = place(pod(fab), demand((2, 2, 1)))
    assert isinstance(got, Placement)
    assert Counter(b % 2 for b in got.blocks) == {0: 2, 1: 2}
    # Neighbours along x alternate between the two OCS.
    assert got.blocks[0] % 2 != got.blocks[1] % 2


def test_failed_block_replaced_at_the_same_logical_position():
    """¶131: the new block takes the failed block's logical point in the slice."""
    placement = [10, 11, 12, 13]
    j = running("victim-of-failure", placement, grid=(2, 2, 1))
    state = pod(failed={12}, jobs=[j])
    rep = plan_replacement(state, j, 12)
    assert rep is not None
    assert rep.position_index == 2 and grid_positions((2, 2, 1))[2] == (0, 1, 0)
    assert rep.spare not in placement and state.allocatable(rep.spare)
    assert rep.victims == ()


def test_replacement_keeps_the_failed_blocks_first_end_group_with_k2():
    fab = fabric(k=2)
    j = running("s", [10, 11], grid=(2, 1, 1))
    state = pod(fab, failed={11}, jobs=[j])
    rep = plan_replacement(state, j, 11)
    assert rep is not None and rep.spare % 2 == 1


def test_replacement_of_another_type_comes_from_that_type_only():
    fab = fabric("tpu:60,gpu:4")
    j = running("mixed", [0, 60], grid=(2, 1, 1), types=("tpu", "gpu"))
    others = running("gpus", [61, 62, 63], priority=90, types="gpu")
    state = pod(fab, failed={60}, jobs=[j, others])
    assert plan_replacement(state, j, 60) is None  # every other gpu is held by higher priority


def test_capacity_counts_slices_one_after_another():
    state = pod(failed={1, 2})
    assert capacity_for(state, demand((2, 2, 1))) == 15  # 62 healthy blocks // 4
    assert capacity_for(state, demand((4, 4, 4))) == 0


@given(
    failed=st.sets(st.integers(0, 63), max_size=20),
    busy=st.sets(st.integers(0, 63), max_size=30),
    grid=st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)),
    gpu=st.booleans(),
)
def test_placement_property_healthy_free_distinct_or_explained(failed, busy, grid, gpu):
    fab = fabric("tpu:48,gpu:16" if gpu else "tpu")
    busy = sorted(busy - failed)
    state = pod(fab, failed=failed, jobs=[running("x", busy)] if busy else [])
    n = grid[0] * grid[1] * grid[2]
    types = tuple("gpu" if gpu and i % 3 == 0 else "tpu" for i in range(n))
    got = place(state, demand(grid, types))
    free = Counter(fab.node_types[b] for b in range(64) if b not in failed and b not in set(busy))
    if isinstance(got, Placement):
        assert len(set(got.blocks)) == n
        assert all(b not in failed and b not in busy for b in got.blocks)
        assert [fab.node_types[b] for b in got.blocks] == list(types)
    else:
        need = Counter(types)
        assert any(need[t] > free[t] for t in need)
        assert {s.node_type for s in got.shortfalls} == {t for t in need if need[t] > free[t]}


def test_block_types_setting():
    assert block_types_for(parse_block_types("tpu:60,gpu:4"), 64)[59:61] == ("tpu", "gpu")
    assert block_types_for(parse_block_types("tpu:60,gpu"), 64).count("gpu") == 4
    assert set(block_types_for(parse_block_types("tpu"), 8)) == {"tpu"}
    for bad in ["", "tpu,gpu:4", "tpu:0", "TPU", "tpu:4,tpu:4", "tpu:x"]:
        with pytest.raises(ValueError):
            parse_block_types(bad)
    from lightpath.errors import FailedPrecondition

    with pytest.raises(FailedPrecondition, match="names 60 blocks"):
        block_types_for(parse_block_types("tpu:60"), 64)


def test_running_job_state_name_is_the_protos():
    from lightpath.v1 import common_pb2

    assert common_pb2.JobState.Value("JOB_STATE_" + RUNNING) == common_pb2.JOB_STATE_RUNNING
    assert job("j", (1, 1, 1)).state == "PENDING"
