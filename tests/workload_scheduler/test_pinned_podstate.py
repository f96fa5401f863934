"""PodState's reading of a snapshot (WS-3, WS-9), pinned where the mutation bench
(bench/mutation.py, issue 17) found no pure test looking. No Redis, no gRPC."""

from __future__ import annotations

from lightpath_services.workload_scheduler.placement import PodState
from tests.workload_scheduler.podfixtures import fabric, job, pod, running


def test_counts_by_type_total_free_allocated_failed():
    fab = fabric("tpu:4,gpu:2", blocks=6)
    state = pod(
        fab, failed={1, 5}, jobs=[running("a", [0, 2], priority=20), running("g", [4], types="gpu")]
    )
    chips = {"tpu": (4 * 64, 2 * 64, 64, 64), "gpu": (2 * 64, 64, 64, 0)}
    assert state.counts_by_type() == {
        "tpu": {"total": 4, "free": 1, "allocated": 2, "failed": 1, **_chips(chips["tpu"])},
        "gpu": {"total": 2, "free": 0, "allocated": 1, "failed": 1, **_chips(chips["gpu"])},
    }


def _chips(counts: tuple[int, int, int, int]) -> dict[str, int]:
    return dict(
        zip(("chips_total", "chips_used", "chips_failed", "chips_free"), counts, strict=True)
    )


def test_a_group_hosting_small_jobs_counts_as_allocated():
    state = pod(fabric("tpu:2,gpu:1", blocks=3))
    state.tile_owner["t2.0.1"] = "small"
    assert state.counts_by_type() == {
        "tpu": {"total": 2, "free": 2, "allocated": 0, "failed": 0, **_chips((128, 0, 0, 128))},
        "gpu": {"total": 1, "free": 0, "allocated": 1, "failed": 0, **_chips((64, 64, 0, 0))},
    }


def test_a_partial_snapshot_allocates_only_its_free_blocks():
    state = PodState(fabric(blocks=4), free={1, 3})
    assert [b for b in range(4) if state.allocatable(b)] == [1, 3]
    assert list(state.candidates()) == [1, 3]
    state.wired[3] = "w"
    state.jobs["w"] = job("w", (1, 1, 1), state="WIRING", placement=[0])
    assert not state.allocatable(3) and state.allocatable(3, allow_wired=["w"])


def test_a_mark_of_a_finished_slice_does_not_block_a_block():
    state = pod(fabric(blocks=2))
    state.wired[0] = "done"  # not a live job: its release is pending
    assert state.allocatable(0)
    state.jobs["done"] = job("done", (1, 1, 1), state="SUCCEEDED")
    assert state.allocatable(0)
    state.jobs["done"] = job("done", (1, 1, 1), state="RUNNING", placement=[1])
    assert not state.allocatable(0)


def test_releasing_a_job_frees_only_its_own_blocks_and_processors():
    state = pod(fabric(blocks=4), jobs=[running("a", [0, 1]), running("b", [2])])
    state.tile_owner.update({"t3.0.0": "a", "t3.0.1": "b"})
    state.assume_released("a", [0, 1, 2, "t3.0.0", "t3.0.1"])
    assert state.owner == {2: "b"} and state.tile_owner == {"t3.0.1": "b"}
    partial = PodState(fabric(blocks=4), free={3})
    try:
        partial.assume_released("a", [0])
    except ValueError:
        pass
    else:
        raise AssertionError("a partial snapshot knows no owners to release")


def test_allocating_on_a_partial_snapshot_takes_the_blocks_out_of_the_free_set():
    state = PodState(fabric(blocks=4), free={0, 1, 2})
    state.assume_allocated(job("n", (2, 1, 1), state="WIRING", placement=[0, 2]))
    assert state.free == {1} and state.owner == {0: "n", 2: "n"}


def test_positions_take_the_chosen_blocks_in_order():
    from lightpath_services.workload_scheduler.placement import place
    from tests.workload_scheduler.podfixtures import demand

    got = place(pod(fabric(blocks=8)), demand((3, 1, 1)))
    assert got.blocks == (0, 1, 2)
    mixed = place(
        pod(fabric("tpu:4,gpu:4", blocks=8)), demand((4, 1, 1), ("tpu", "gpu", "tpu", "tpu"))
    )
    assert mixed.blocks == (0, 4, 1, 2)


def test_with_k2_a_slice_spreads_over_both_ocs_groups_even_when_the_lowest_ids_do_not():
    from lightpath_services.workload_scheduler.placement import place
    from tests.workload_scheduler.podfixtures import demand

    state = pod(fabric(blocks=8, k=2), jobs=[running("x", [0, 2])])  # group 0 loses 0 and 2
    got = place(state, demand((2, 1, 1)))
    assert got.blocks == (4, 1)  # group 0's first free, then group 1's


def test_with_k2_one_group_running_out_leaves_the_rest_to_the_other():
    from lightpath_services.workload_scheduler.placement import place
    from tests.workload_scheduler.podfixtures import demand

    state = pod(fabric(blocks=8, k=2), jobs=[running("x", [2, 4, 6])])  # group 0 keeps block 0
    assert place(state, demand((4, 1, 1))).blocks == (0, 1, 3, 5)


def test_blocks_by_job_in_block_order():
    from lightpath_services.workload_scheduler.placement import blocks_by_job

    assert blocks_by_job({5: "a", 1: "b", 0: "a"}) == {"a": [0, 5], "b": [1]}
