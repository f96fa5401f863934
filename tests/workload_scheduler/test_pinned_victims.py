"""Victim choice (WS-4, seed 000 ¶104-105) at its edges: what the mutation bench
(bench/mutation.py, issue 17) found no test noticing. Pure: no Redis, no gRPC."""

from __future__ import annotations

from collections import Counter

from lightpath_services.workload_scheduler.preemption import choose_victims, max_freeable, shortfall
from tests.workload_scheduler.podfixtures import fabric, pod, running


def ids(victims):
    return [v.job_id for v in victims]


def test_the_shortfall_is_what_the_free_pool_lacks():
    state = pod(fabric(blocks=10), jobs=[running("a", range(6), priority=20)])
    assert shortfall(state, Counter(tpu=6)) == Counter(tpu=2)  # 4 free
    assert shortfall(state, Counter(tpu=4)) == Counter()


def test_only_as_many_victims_as_the_shortfall_needs():
    jobs = [running(f"v{i}", (2 * i, 2 * i + 1), priority=20, seq=i) for i in range(3)]
    state = pod(fabric(blocks=10), jobs=jobs)  # blocks 6..9 free
    assert len(choose_victims(state, Counter(tpu=6), 80)) == 1
    assert len(choose_victims(state, Counter(tpu=8), 80)) == 2


def test_a_shortfall_of_one_block_and_a_victim_of_one_block():
    state = pod(
        fabric(blocks=4),
        jobs=[running("one", [0], priority=20), running("three", [1, 2, 3], priority=30)],
    )
    (v,) = choose_victims(state, Counter(tpu=1), 80)
    assert v.job_id == "one"


def test_a_shrinking_job_with_no_arrangement_gives_nothing_and_is_passed_over():
    stuck = running("stuck", range(4), grid=(4, 1, 1), priority=10, policy="SHRINK")
    other = running("other", range(4, 8), grid=(4, 1, 1), priority=20)
    state = pod(fabric(blocks=8), jobs=[stuck, other])
    assert max_freeable(state, stuck) == Counter()
    assert ids(choose_victims(state, Counter(tpu=4), 80)) == ["other"]


def test_a_victim_made_unnecessary_by_later_ones_is_dropped():
    """x2 y2 missing: `both` (x1 y1) is most useful... equal; once `xs` and `ys` are
    in, `both` is not needed any more and is spared."""
    fab = fabric("x:4,y:4", blocks=8)
    state = pod(
        fab,
        jobs=[
            running("both", [0, 4], priority=20, seq=9, types=("x", "y")),
            running("xs", [1, 2], priority=20, seq=1, types="x"),
            running("ys", [5, 6], priority=20, seq=2, types="y"),
            running("rest", [3, 7], priority=60, types=("x", "y")),
        ],
    )
    assert sorted(ids(choose_victims(state, Counter(x=2, y=2), 80))) == ["xs", "ys"]


def test_whole_victims_first_then_a_shrinking_one_gives_only_what_is_left():
    delay = running("delay", range(0, 2), priority=20, seq=1, policy="DELAY")
    shrink = running(
        "shrink",
        range(2, 10),
        grid=(2, 2, 2),
        priority=20,
        seq=2,
        policy="SHRINK",
        shrink_to=[(2, 2, 1), (2, 1, 1), (1, 1, 1)],
    )
    state = pod(fabric(blocks=10), jobs=[shrink, delay])
    victims = choose_victims(state, Counter(tpu=8), 80)
    assert [(v.job_id, v.action) for v in victims] == [("delay", "DELAY"), ("shrink", "SHRINK")]
    # 2 from the delayed job, so the shrinking one gives 6 (keeps 2x1x1), not 7
    assert victims[1].shrink_grid == (2, 1, 1) and len(victims[1].freed) == 6


def test_two_shrinking_victims_the_first_gives_most_the_second_only_the_rest():
    def shrinker(job_id, blocks, seq):
        return running(
            job_id,
            blocks,
            grid=(2, 2, 2),
            priority=20,
            seq=seq,
            policy="SHRINK",
            shrink_to=[(2, 2, 1), (2, 1, 1), (1, 1, 1)],
        )

    state = pod(
        fabric(blocks=16), jobs=[shrinker("a", range(8), 1), shrinker("b", range(8, 16), 2)]
    )
    victims = choose_victims(state, Counter(tpu=9), 80)
    got = {v.job_id: (v.shrink_grid, len(v.freed)) for v in victims}
    # one gives its most (7): the other then covers the last 2 with its least shrink (2x2x1: 4)
    assert sorted(got.values()) == [((1, 1, 1), 7), ((2, 2, 1), 4)]


def test_equal_shrinks_break_the_tie_on_the_arrangement():
    """2x2x1 to 2x1x1 or 1x2x1 keeps two blocks either way: the smaller grid tuple wins."""
    job = running(
        "s",
        range(4),
        grid=(2, 2, 1),
        priority=20,
        policy="SHRINK",
        shrink_to=[(2, 1, 1), (1, 2, 1)],
    )
    state = pod(fabric(blocks=4), jobs=[job])
    (v,) = choose_victims(state, Counter(tpu=2), 80)
    assert v.shrink_grid == (1, 2, 1) and v.kept_placement == (0, 2)


def test_the_most_useful_victim_first_so_one_is_enough():
    """One victim covering all 4 beats three small ones that also add up to 4."""
    jobs = [
        running("big", range(0, 4), priority=20, seq=1),
        running("one", [4], priority=20, seq=2),
        running("two", [5], priority=20, seq=3),
        running("pair", [6, 7], priority=20, seq=4),
    ]
    state = pod(fabric(blocks=8), jobs=jobs)
    assert ids(choose_victims(state, Counter(tpu=4), 80)) == ["big"]


def test_a_type_the_whole_victims_covered_asks_nothing_more_of_a_shrinking_one():
    """x2 y2 missing: the delayed job gives the two x; the shrinking one (x x y y)
    then only needs to give its two y (keep 2x1x1), not an x as well."""
    fab = fabric("x:4,y:4", blocks=8)
    state = pod(
        fab,
        jobs=[
            running("delay", [0, 1], priority=20, seq=1, policy="DELAY", types="x"),
            running(
                "shrink",
                [2, 3, 4, 5],
                grid=(2, 2, 1),
                priority=20,
                seq=2,
                policy="SHRINK",
                shrink_to=[(2, 1, 1), (1, 1, 1)],
                types=("x", "x", "y", "y"),
            ),
            running("keep", [6, 7], priority=90, types="y"),
        ],
    )
    victims = choose_victims(state, Counter(x=2, y=2), 80)
    assert [v.job_id for v in victims] == ["delay", "shrink"]
    assert victims[1].shrink_grid == (2, 1, 1) and victims[1].freed == (4, 5)


def test_after_one_shrinking_victim_covers_a_type_the_next_is_not_asked_for_it():
    """x1 y3 missing from two shrinking jobs (x x y y each): the first gives its most
    (x y y), the second then only the last y (keeps 2x1x1, frees y y), not an x too."""

    def shrinker(job_id, blocks, seq):
        return running(
            job_id,
            blocks,
            grid=(2, 2, 1),
            priority=20,
            seq=seq,
            policy="SHRINK",
            shrink_to=[(2, 1, 1), (1, 1, 1)],
            types=("x", "x", "y", "y"),
        )

    fab = fabric("x:4,y:4", blocks=8)
    state = pod(fab, jobs=[shrinker("a", [0, 1, 4, 5], 1), shrinker("b", [2, 3, 6, 7], 2)])
    victims = choose_victims(state, Counter(x=1, y=3), 80)
    assert [(v.job_id, v.shrink_grid, v.freed) for v in victims] == [
        ("b", (1, 1, 1), (3, 6, 7)),
        ("a", (2, 1, 1), (4, 5)),
    ]
