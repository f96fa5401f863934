"""WS-4: victim choice and the queue pass (seed 000 ¶104-105)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from lightpath.domain.slices import (
    DELAY,
    PENDING,
    SHRINK,
    SUSPENDED,
    TERMINATE,
    WIRING,
)
from lightpath_services.workload_scheduler.placement import Placement, place
from lightpath_services.workload_scheduler.planner import (
    Allocation,
    apply_allocation,
    plan_admission,
    plan_pass,
)
from lightpath_services.workload_scheduler.preemption import choose_victims, max_freeable
from tests.workload_scheduler.podfixtures import fabric, job, pod, running


def _full_pod(*jobs):
    """A 16-block pod (tpu) held entirely by `jobs`."""
    return pod(fabric(blocks=16), jobs=list(jobs))


def test_no_victims_when_free_blocks_suffice():
    state = pod(fabric(blocks=16), jobs=[running("a", range(8), priority=20)])
    assert choose_victims(state, Counter(tpu=8), 80) == []


def test_lowest_priority_first():
    state = _full_pod(
        running("low", range(0, 8), priority=20), running("mid", range(8, 16), priority=50)
    )
    (v,) = choose_victims(state, Counter(tpu=4), 80)
    assert v.job_id == "low" and v.action == DELAY


def test_fewest_victims_at_the_lowest_priority_needed():
    state = _full_pod(
        running("a", [0, 1], priority=20),
        running("b", [2, 3], priority=20),
        running("c", [4, 5, 6, 7], priority=20),
        running("d", range(8, 16), priority=60),
    )
    victims = choose_victims(state, Counter(tpu=4), 80)
    assert [v.job_id for v in victims] == ["c"]


def test_never_equal_or_higher_priority():
    state = _full_pod(
        running("same", range(0, 8), priority=50), running("high", range(8, 16), priority=80)
    )
    assert choose_victims(state, Counter(tpu=1), 50) is None
    assert choose_victims(state, Counter(tpu=9), 51) is None  # only "same" is lower: 8 blocks
    (v,) = choose_victims(state, Counter(tpu=8), 51)
    assert v.job_id == "same"


def test_goes_up_in_priority_only_as_far_as_needed_then_prunes():
    state = _full_pod(
        running("p10", [0, 1], priority=10),
        running("p20", [2, 3, 4, 5, 6, 7], priority=20),
        running("p30", range(8, 16), priority=30),
    )
    victims = choose_victims(state, Counter(tpu=6), 90)
    # p10 alone is not enough; with priority <= 20, p20 alone covers 6: p10 is spared.
    assert [v.job_id for v in victims] == ["p20"]


def test_less_disruptive_policy_first_at_equal_priority():
    state = _full_pod(
        running("term", range(0, 8), priority=20, policy=TERMINATE),
        running("delay", range(8, 16), priority=20, policy=DELAY),
    )
    (v,) = choose_victims(state, Counter(tpu=8), 80)
    assert v.job_id == "delay" and v.action == DELAY


def test_shrink_to_the_largest_declared_arrangement_that_covers():
    big = running(
        "shrinker",
        range(8),
        grid=(2, 2, 2),
        priority=20,
        policy=SHRINK,
        shrink_to=[(2, 2, 1), (1, 1, 1)],
    )
    state = pod(fabric(blocks=8), jobs=[big])
    assert max_freeable(state, big) == Counter(tpu=7)
    (v,) = choose_victims(state, Counter(tpu=3), 80)
    assert v.action == SHRINK and v.shrink_grid == (2, 2, 1)
    # The sub-box z = 0 keeps its blocks at their positions; the z = 1 layer is given up.
    assert v.kept_placement == (0, 1, 2, 3) and v.freed == (4, 5, 6, 7)
    (v,) = choose_victims(state, Counter(tpu=6), 80)
    assert v.shrink_grid == (1, 1, 1) and v.kept_placement == (0,)
    assert choose_victims(state, Counter(tpu=8), 80) is None  # it keeps at least one block


def test_multi_type_shortfall():
    fab = fabric("tpu:12,gpu:4", blocks=16)
    state = pod(
        fab,
        jobs=[
            running("tpus", range(12), grid=(12, 1, 1), priority=20),
            running("gpus", [12, 13, 14, 15], priority=30, types="gpu"),
        ],
    )
    victims = choose_victims(state, Counter(tpu=2, gpu=2), 80)
    assert sorted(v.job_id for v in victims) == ["gpus", "tpus"]
    assert choose_victims(state, Counter(gpu=1), 25) is None


def test_failed_blocks_of_a_victim_do_not_count():
    state = _full_pod(running("v", range(16), grid=(16, 1, 1), priority=10))
    state.failed |= {0, 1, 2, 3}
    assert choose_victims(state, Counter(tpu=13), 80) is None
    assert choose_victims(state, Counter(tpu=12), 80)


def test_admission_by_preemption_places_on_the_victims_blocks():
    state = _full_pod(running("low", range(16), grid=(16, 1, 1), priority=20, policy=TERMINATE))
    hi = job("hi", (2, 2, 1), priority=80)
    state.jobs["hi"] = hi
    alloc = plan_admission(state, hi)
    assert isinstance(alloc, Allocation)
    assert [v.job_id for v in alloc.victims] == ["low"]
    assert set(alloc.placement) <= set(range(16))
    assert "low" in alloc.release_first


def test_pass_follows_priority_then_age_and_backfills():
    state = pod(fabric(blocks=8), jobs=[running("holder", range(4), priority=90)])
    state.jobs["old-mid"] = job("old-mid", (2, 1, 1), priority=50, seq=1)
    state.jobs["new-mid"] = job("new-mid", (2, 1, 1), priority=50, seq=2)
    state.jobs["big-hi"] = job("big-hi", (8, 1, 1), priority=80, seq=3)  # can never fit now
    state.jobs["low"] = job("low", (2, 1, 1), priority=20, seq=0)
    decisions = plan_pass(state)
    assert [d.job.job_id for d in decisions] == ["old-mid", "new-mid"]
    assert len({b for d in decisions for b in d.placement}) == 4


def test_pass_preempts_for_queued_work_and_never_reuses_a_block():
    state = pod(
        fabric(blocks=8),
        jobs=[running("low", range(8), grid=(8, 1, 1), priority=10, policy=DELAY)],
    )
    state.jobs["a"] = job("a", (4, 1, 1), priority=60, seq=1)
    state.jobs["b"] = job("b", (4, 1, 1), priority=50, seq=2)
    decisions = plan_pass(state)
    assert [d.job.job_id for d in decisions] == ["a", "b"]
    assert [v.job_id for v in decisions[0].victims] == ["low"]
    assert decisions[1].victims == ()  # the victim's other blocks are free by then
    assert not set(decisions[0].placement) & set(decisions[1].placement)


def test_backoff_skips_a_job_until_its_time():
    state = pod(fabric(blocks=4))
    state.jobs["later"] = job("later", (1, 1, 1)).with_(not_before_ms=5_000)
    assert plan_pass(state, now_ms=1_000) == []
    assert [d.job.job_id for d in plan_pass(state, now_ms=6_000)] == ["later"]


# -- property: a pass never breaks the invariants -----------------------------------------


@st.composite
def pods(draw):
    fab = fabric("tpu:24,gpu:8", blocks=32)
    state = pod(fab, failed=draw(st.sets(st.integers(0, 31), max_size=6)))
    seq = 0
    for i in range(draw(st.integers(0, 6))):
        seq += 1
        n = draw(st.integers(1, 6))
        gpu = draw(st.booleans())
        j = job(
            f"r{i}",
            (n, 1, 1),
            priority=draw(st.integers(1, 100)),
            types="gpu" if gpu else "tpu",
            policy=draw(st.sampled_from([TERMINATE, DELAY, SHRINK])),
            shrink_to=[(1, 1, 1)] if n > 1 else [],
            seq=seq,
        )
        if j.preemption == SHRINK and not j.shrink_to:
            j = j.with_(preemption=DELAY)
        found = place(state, j.demand)
        if isinstance(found, Placement):
            state.assume_allocated(j.with_(state="RUNNING", placement=found.blocks))
            for b in found.blocks:
                state.wired[b] = j.job_id
    for i in range(draw(st.integers(0, 6))):
        seq += 1
        n = draw(st.integers(1, 8))
        state.jobs[f"q{i}"] = job(
            f"q{i}",
            (n, 1, 1),
            priority=draw(st.integers(1, 100)),
            types=draw(st.sampled_from(["tpu", "gpu"])),
            state=draw(st.sampled_from([PENDING, SUSPENDED])),
            seq=seq,
        )
    return state


@settings(max_examples=150)
@given(state=pods())
def test_pass_property_one_slice_per_block_healthy_and_priority_respected(state):
    work = state.copy()
    for d in plan_pass(state):
        for v in d.victims:
            assert work.jobs[v.job_id].priority < d.job.priority  # never equal or higher
        apply_allocation(work, d)
    holders: dict[int, str] = {}
    for j in work.jobs.values():
        if j.state in ("RUNNING", WIRING) and j.placement:
            for b in j.placement:
                assert b not in holders, f"block {b} in {holders[b]} and {j.job_id}"
                holders[b] = j.job_id
                assert state.fabric.node_types[b] in j.demand.node_types
    newly = {b for d in plan_pass(state) for b in d.placement}
    assert not newly & state.failed
    # No waiting job could run by taking blocks that lower-priority work holds: with
    # everything placed counted as running (and so preemptible), every job still waiting
    # is unplaceable. A pass walks the queue as it was when it started, so a victim it
    # suspends waits for the next pass (the scheduler runs one after each wiring): the
    # check is made once passes stop placing anything.
    check = work.copy()
    for _ in range(len(check.jobs) + 1):
        for j in list(check.jobs.values()):
            if j.state == WIRING:
                check.jobs[j.job_id] = j.with_(state="RUNNING")
        decisions = plan_pass(check)
        if not decisions:
            break
        for d in decisions:
            apply_allocation(check, d)
    for waiting in check.queue():
        assert not isinstance(plan_admission(check, waiting), Allocation), waiting.job_id


def test_the_cell_reclaiming_quota_names_the_only_victims_whatever_their_priority():
    """Issue 35: lent quota taken back preempts the named slices, each by its own policy,
    and nothing else; back from the cell queue, the slice never preempts the owner's
    that reclaimed from it, whatever the priorities."""
    state = _full_pod(
        running("lender-low", range(0, 8), priority=5),
        running("borrower", range(8, 12), priority=90, policy=TERMINATE),
        running("borrower-2", range(12, 16), priority=90, policy=DELAY),
    )
    owner = job("owner", (4, 1, 1), priority=10)
    (v,) = choose_victims(state, Counter(tpu=4), 10, only=frozenset({"borrower", "borrower-2"}))
    assert v.job_id == "borrower-2" and v.action == DELAY  # less disruptive first
    (v,) = choose_victims(state, Counter(tpu=4), 10, only=frozenset({"borrower"}))
    assert v.job_id == "borrower" and v.action == TERMINATE
    # without a name, priority rules: only the lender's own low-priority slice
    (v,) = choose_victims(state, Counter(tpu=4), 10)
    assert v.job_id == "lender-low"
    found = plan_admission(state, owner, reclaim=frozenset({"borrower-2"}))
    assert isinstance(found, Allocation) and [x.job_id for x in found.victims] == ["borrower-2"]
    # the delayed borrower, forwarded again by the cell, never takes the owner's blocks
    # back: the owner's slice reclaimed from it (only its own lower priority would do)
    back = job("borrower-2", (4, 1, 1), priority=90)
    owner_running = running("owner", range(12, 16), priority=10)
    after = _full_pod(
        running("lender-high", range(0, 8), priority=95),
        running("borrower", range(8, 12), priority=90),
        owner_running.with_(reclaimed_from=("borrower-2",)),
        back,
    )
    assert not isinstance(plan_admission(after, back), Allocation)
    after.jobs["owner"] = owner_running
    found = plan_admission(after, back)
    assert isinstance(found, Allocation) and [x.job_id for x in found.victims] == ["owner"]
