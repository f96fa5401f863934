"""The queue's age bound (planner.plan_pass): the first job that cannot be placed and
has been in the pod `age_bound_ms` may preempt the jobs of its own priority admitted
after it, so later jobs that fit cannot starve a large one."""

from __future__ import annotations

from collections import Counter

import pytest

from lightpath.domain.slices import DELAY, PENDING, RUNNING, TERMINATE, SliceDemand
from lightpath_services.common.settings import SettingsError, load
from lightpath_services.workload_scheduler.planner import (
    plan_pass,
    plan_replacement,
    waited_past,
)
from lightpath_services.workload_scheduler.preemption import choose_victims
from lightpath_services.workload_scheduler.settings import WorkloadSchedulerSettings
from tests.workload_scheduler.podfixtures import fabric, job, pod, running

HOUR = 3_600_000


def _waiting(job_id, grid, submitted_ms, **kw):
    return job(job_id, grid, **kw).with_(submitted_ms=submitted_ms)


def _starving(**big):
    """16 blocks: `old` (admitted first, 4 blocks) and `young` (admitted after `big`,
    12 blocks) run at big's priority; `big` (8 blocks, admitted at 0) waits."""
    return pod(
        fabric(blocks=16),
        jobs=[
            running("old", range(4), seq=1),
            _waiting("big", (8, 1, 1), 0, seq=2, **big),
            running("young", range(4, 16), seq=3),
        ],
    )


def _placed(decisions):
    return {
        a.job.job_id: (a.placement, [(v.job_id, v.action) for v in a.victims]) for a in decisions
    }


def test_before_the_bound_a_job_never_preempts_its_own_priority():
    state = _starving()
    assert plan_pass(state, 10 * HOUR) == []  # no bound
    assert plan_pass(state, 10 * HOUR, 11 * HOUR) == []  # not yet
    assert not waited_past(state.jobs["big"], 10 * HOUR, 11 * HOUR)


def test_past_the_bound_it_takes_the_blocks_of_younger_jobs_of_its_priority():
    state = _starving()
    for now in (HOUR, 10 * HOUR):  # at the bound and past it
        (alloc,) = plan_pass(state, now, HOUR)
        assert alloc.job.job_id == "big"
        assert [(v.job_id, v.action) for v in alloc.victims] == [("young", DELAY)]
        assert set(alloc.placement) <= set(range(4, 16))


def test_a_swap_past_the_bound_takes_one_block_of_a_younger_slice_of_its_priority():
    """No free block and no lower priority: an older slice past the bound takes a block
    of a younger one of its priority rather than giving up all it holds (suspended, it
    would take them back from the younger ones as the first job past the bound)."""
    old = running("old", range(8), seq=1)
    others = [
        running("older", range(8, 10), seq=0),
        running("young", range(10, 12), seq=5),
        running("youngest", range(12, 16), seq=6, policy=TERMINATE),
    ]
    state = pod(fabric(blocks=16), failed={3}, jobs=[old, *others])
    assert plan_replacement(state, old, 3) is None  # before the bound: suspended
    rep = plan_replacement(state, old, 3, take_younger=True)
    assert rep is not None and rep.position_index == 3
    # delaying before terminating, then the youngest (preemption's order)
    assert [(v.job_id, v.action) for v in rep.victims] == [("young", DELAY)]
    assert rep.spare in (10, 11)
    # a lower priority still goes first
    low = running("low", range(16, 18), priority=10, seq=9)
    state = pod(fabric(blocks=18), failed={3}, jobs=[old, *others, low])
    rep = plan_replacement(state, old, 3, take_younger=True)
    assert rep is not None and [v.job_id for v in rep.victims] == ["low"]
    # never an older slice of its priority
    state = pod(fabric(blocks=10), failed={3}, jobs=[old, others[0]])
    assert plan_replacement(state, old, 3, take_younger=True) is None


def test_never_older_jobs_nor_higher_priorities():
    state = pod(
        fabric(blocks=16),
        jobs=[
            running("old", range(8), seq=1),
            running("high", range(8, 16), seq=3, priority=60),
            _waiting("big", (8, 1, 1), 0, seq=2),
        ],
    )
    assert plan_pass(state, 10 * HOUR, HOUR) == []


def test_lower_priorities_go_first_then_the_youngest():
    state = pod(
        fabric(blocks=16),
        jobs=[
            running("old", range(4), seq=1),
            _waiting("big", (8, 1, 1), 0, seq=2),
            running("y1", range(4, 8), seq=3),
            running("y2", range(8, 12), seq=4, policy=TERMINATE),
            running("low", range(12, 16), seq=5, priority=10),
        ],
    )
    (alloc,) = plan_pass(state, 10 * HOUR, HOUR)
    # low (lower priority) covers 4, then one of its own priority: the less disruptive
    assert [(v.job_id, v.action) for v in alloc.victims] == [("low", DELAY), ("y1", DELAY)]


def test_only_the_first_blocked_job_past_the_bound_has_the_turn():
    state = pod(
        fabric(blocks=16),
        jobs=[
            running("old", range(12), seq=1),
            _waiting("a", (16, 1, 1), 0, seq=2),  # first, but even the younger are too few
            _waiting("b", (4, 1, 1), 0, seq=3),
            running("young", range(12, 16), seq=4),
        ],
    )
    assert plan_pass(state, 10 * HOUR, HOUR) == []  # b would have freed young's 4
    state.jobs["a"] = state.jobs["a"].with_(submitted_ms=10 * HOUR)  # a is young now
    assert _placed(plan_pass(state, 10 * HOUR, HOUR)) == {
        "b": ((12, 13, 14, 15), [("young", DELAY)])
    }


def test_a_job_that_fits_is_placed_as_without_a_bound():
    state = pod(
        fabric(blocks=16),
        jobs=[running("young", range(8), seq=5), _waiting("big", (8, 1, 1), 0, seq=2)],
    )
    assert _placed(plan_pass(state, 10 * HOUR, HOUR)) == _placed(plan_pass(state, 10 * HOUR))


def test_sub_block_slices_of_a_block_count_as_younger_only_when_all_are():
    fab = fabric(blocks=2, hosts=(2, 2, 1))
    box = SliceDemand((1, 1, 1), ("tpu",), (False, False, False), (2, 2, 1))

    def boxed(job_id, seq, offset):
        return job(job_id, (1, 1, 1), state=RUNNING, placement=[1], seq=seq).with_(
            demand=box, offset=offset
        )

    state = pod(fab, jobs=[running("old", [0], seq=1)])
    state.assume_allocated(boxed("b1", 5, (0, 0, 0)))
    state.assume_allocated(boxed("b2", 6, (2, 0, 0)))
    assert choose_victims(state, Counter(tpu=1), 50, younger_than=2) is not None
    assert choose_victims(state, Counter(tpu=1), 50, younger_than=5) is None  # b1 is not
    assert choose_victims(state, Counter(tpu=1), 50) is None


def test_jobs_stored_without_an_admission_time_count_as_old():
    old = job("old", (2, 1, 1), state=PENDING)
    assert old.submitted_ms == 0
    assert type(old).from_json(old.to_json()).submitted_ms == 0
    new = old.with_(submitted_ms=123)
    assert type(new).from_json(new.to_json()).submitted_ms == 123
    assert waited_past(old, HOUR, HOUR) and not waited_past(new, HOUR, HOUR)


def test_the_setting_takes_seconds_or_off_and_names_itself_when_wrong():
    assert load(WorkloadSchedulerSettings, {}).age_bound_s == 3600.0
    assert load(WorkloadSchedulerSettings, {"LIGHTPATH_WS_AGE_BOUND_S": "off"}).age_bound_s is None
    assert load(WorkloadSchedulerSettings, {"LIGHTPATH_WS_AGE_BOUND_S": "0"}).age_bound_s == 0
    for bad in ("-1", "soon", "nan"):
        with pytest.raises(SettingsError, match="LIGHTPATH_WS_AGE_BOUND_S"):
            load(WorkloadSchedulerSettings, {"LIGHTPATH_WS_AGE_BOUND_S": bad})
