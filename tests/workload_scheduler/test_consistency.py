"""The pure comparison of the pod's jobs with the ocs_manager's slices (issue 14)."""

from __future__ import annotations

from lightpath.domain.slices import SUSPENDED, WIRING
from lightpath_services.workload_scheduler.consistency import MISSING, ORPHANED, wiring_differences
from tests.workload_scheduler.podfixtures import job, pod, running


def test_agreeing_pod_and_ocs_have_no_difference():
    state = pod(jobs=[running("a", [0, 1]), job("w", (1, 1, 1), state=WIRING, placement=[2])])
    # A wiring job may or may not have its slice yet: neither is a difference.
    assert wiring_differences(state, {"a": (0, 1)}) == []
    assert wiring_differences(state, {"a": (0, 1), "w": (2,)}) == []


def test_a_running_job_without_a_slice_is_missing():
    state = pod(jobs=[running("a", [0, 1]), running("b", [2])])
    (diff,) = wiring_differences(state, {"b": (2,)})
    assert (diff.job_id, diff.kind) == ("a", MISSING)
    assert "blocks 0,1" in diff.detail


def test_a_job_swapping_a_block_is_not_missing():
    swapping = running("a", [0, 1]).with_(replacing=(1, 5))
    assert wiring_differences(pod(jobs=[swapping]), {}) == []


def test_a_slice_of_no_live_job_or_of_a_queued_one_is_orphaned():
    state = pod(jobs=[running("a", [0]), job("q", (1, 1, 1), state=SUSPENDED)])
    diffs = wiring_differences(state, {"a": (0,), "gone": (3,), "q": (4,)})
    assert [(d.job_id, d.kind) for d in diffs] == [("gone", ORPHANED), ("q", ORPHANED)]
    assert "not live" in diffs[0].detail and SUSPENDED in diffs[1].detail
