"""Pinned (issue 17): among equal-priority victims of one policy, the youngest
slice gives way first (least work lost, WS-4 / seed 000 ¶104-105)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from lightpath.domain.slices import DELAY, TERMINATE
from lightpath_services.workload_scheduler.preemption import choose_victims
from tests.workload_scheduler.podfixtures import fabric, pod, running


def test_the_youngest_of_equal_victims_is_chosen_not_the_oldest():
    # Ids run against age so that neither the oldest nor the id order picks "young".
    state = pod(
        fabric(blocks=12),
        jobs=[
            running("young", range(0, 4), priority=20, seq=30),
            running("middle", range(4, 8), priority=20, seq=20),
            running("elder", range(8, 12), priority=20, seq=10),
        ],
    )
    (v,) = choose_victims(state, Counter(tpu=4), 80)
    assert (v.job_id, v.action, v.freed) == ("young", DELAY, (0, 1, 2, 3))


def test_two_victims_needed_are_the_two_youngest_in_youngest_first_order():
    state = pod(
        fabric(blocks=12),
        jobs=[
            running("a", range(0, 4), priority=20, seq=1, policy=TERMINATE),
            running("b", range(4, 8), priority=20, seq=3, policy=TERMINATE),
            running("c", range(8, 12), priority=20, seq=2, policy=TERMINATE),
        ],
    )
    victims = choose_victims(state, Counter(tpu=8), 80)
    assert [v.job_id for v in victims] == ["b", "c"]


@settings(max_examples=60, deadline=None)
@given(st.permutations(range(1, 6)), st.integers(1, 5))
def test_equal_victims_give_way_youngest_first(seqs, need):
    """n equal two-block victims, `need` of them needed: exactly the `need` youngest."""
    jobs = [running(f"j{i}", (2 * i, 2 * i + 1), priority=20, seq=s) for i, s in enumerate(seqs)]
    state = pod(fabric(blocks=10), jobs=jobs)
    victims = choose_victims(state, Counter(tpu=2 * need), 80)
    assert victims is not None
    by_age = sorted(jobs, key=lambda j: -j.seq)
    assert [v.job_id for v in victims] == [j.job_id for j in by_age[:need]]
