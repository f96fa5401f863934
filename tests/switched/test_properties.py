"""Invariants over random job mixes (hypothesis): no channel is ever reserved
twice, releasing a job frees exactly its channels, swapping a failed group
keeps every ring valid and leaves other rings alone (SW-4, SW-5)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightpath.domain.switched_rings import Degrees
from lightpath.errors import ResourceExhausted
from lightpath_services.workload_scheduler.switched_placement import LARGE, reserved_small_groups
from tests.switched.fabrics import SMALL, fabric
from tests.switched.ringcheck import assert_valid
from tests.switched.sim import PodSim

degrees = st.builds(Degrees, st.integers(1, 6), st.integers(1, 3), st.integers(1, 3)).filter(
    lambda d: d.total <= 24
)


def new_pod() -> PodSim:
    f = fabric(SMALL)
    return PodSim(f, reserved_small_groups(f, 2))


def check_pod(pod: PodSim) -> None:
    f = pod.fabric
    counts = Counter(c for p in pod.plans.values() for c in p.channels())
    assert all(k == 1 for k in counts.values()), "a channel is reserved for two rings"
    assert {i for i, x in enumerate(pod.used) if x} == set(counts)
    for job, plan in pod.plans.items():
        assert_valid(f, plan, pod.forbidden_for(job))
        assert not set(plan.groups) & pod.failed


@settings(max_examples=40)
@given(st.lists(degrees, min_size=1, max_size=10))
def test_random_job_mixes_never_over_reserve(mix):
    pod = new_pod()
    for n, d in enumerate(mix):
        pod.admit(f"j{n}", d)
        check_pod(pod)
    # large jobs own whole groups: no group in two jobs
    owners = Counter(g for j, p in pod.plans.items() if pod.kinds[j] == LARGE for g in p.groups)
    assert all(k == 1 for k in owners.values())


@settings(max_examples=40)
@given(st.lists(degrees, min_size=2, max_size=8), st.data())
def test_releasing_a_job_frees_exactly_its_channels(mix, data):
    pod = new_pod()
    for n, d in enumerate(mix):
        pod.admit(f"j{n}", d)
    if not pod.plans:
        return
    job = data.draw(st.sampled_from(sorted(pod.plans)))
    before = {i for i, x in enumerate(pod.used) if x}
    plan = pod.finish(job)
    after = {i for i, x in enumerate(pod.used) if x}
    assert before - after == set(plan.channels())
    assert after == {c for p in pod.plans.values() for c in p.channels()}
    check_pod(pod)
    # the freed channels are usable again: the same job fits where it was
    again = pod.admit(job, plan.degrees)
    assert again is not None


@settings(max_examples=40)
@given(st.lists(degrees.filter(lambda d: d.total > 4), min_size=1, max_size=5), st.data())
def test_swapping_a_failed_group_keeps_all_rings_valid(mix, data):
    pod = new_pod()
    for n, d in enumerate(mix):
        pod.admit(f"j{n}", d)
    large = sorted(j for j in pod.plans if pod.kinds[j] == LARGE)
    if not large:
        return
    job = data.draw(st.sampled_from(large))
    group = data.draw(st.sampled_from(pod.plans[job].groups))
    others = {j: p for j, p in pod.plans.items() if j != job}
    old = pod.plans[job]
    try:
        result = pod.fail_group(job, group)
    except ResourceExhausted:
        # refused: nothing changed
        assert pod.plans[job] == old
        check_pod_without(pod, group)
        return
    check_pod(pod)
    new = pod.plans[job]
    assert group not in new.groups
    assert set(new.groups) - set(old.groups) == {result.new_tile.group}
    for j, p in others.items():
        assert pod.plans[j] == p
    untouched = [r for r in old.rings if r.name not in result.rerouted]
    assert all(new.ring(r.name) == r for r in untouched)
    assert set(result.rerouted) == {
        r.name for r in old.rings if any(p // pod.fabric.group_size == group for p in r.processors)
    }


def check_pod_without(pod: PodSim, group: int) -> None:
    pod.failed.discard(group)
    check_pod(pod)


def test_swap_prefers_a_group_under_the_same_tier0_switch():
    from tests.switched.fabrics import FIG18

    f = fabric(FIG18)
    pod = PodSim(f)
    plan = pod.admit("big", Degrees(4, 4, 4))
    assert plan is not None and plan.groups == (0, 1, 2, 3)
    result = pod.fail_group("big", 2)
    assert f.group_position(result.new_tile.group)[0] == 0  # same cluster row
    assert result.new_tile.group == 4
    assert_valid(f, pod.plans["big"])
    assert (
        len(result.rerouted) == 16 + 4 + 4
    )  # all data rings, the group's pipeline and layer rings
    assert all("d=2" in n or n.startswith("data") for n in result.rerouted)


def test_swap_without_a_free_group_is_resource_exhausted():
    from tests.switched.fabrics import FIG6

    f = fabric(FIG6)
    pod = PodSim(f)
    pod.admit("all", Degrees(16, 1, 1))
    with pytest.raises(ResourceExhausted, match="no free group"):
        pod.fail_group("all", 1)
