"""CS-2, CS-3: which superpod gets a job — the pure planner over the registry."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from lightpath_services.cell_scheduler.choice import (
    FITS,
    PREEMPTS,
    JobDemand,
    PodCapacityView,
    chips_key,
    choose,
    plan_queue,
    shielded_blocks,
)


def pod(pod_id: str, free: dict[str, int], preemptible=None, **kw) -> PodCapacityView:
    return PodCapacityView(pod_id, Counter(free), preemptible or {}, **kw)


def job(job_id: str, needs: dict[str, dict[str, int]], priority: int = 50, **kw) -> JobDemand:
    return JobDemand(job_id, priority, {p: Counter(n) for p, n in needs.items()}, **kw)


def on_all(pods, need: dict[str, int]) -> dict[str, dict[str, int]]:
    return {p.pod_id: need for p in pods}


def test_seed_cell_of_four_superpods_picks_the_one_with_the_most_healthy_free_blocks():
    # ¶43: a cell of superpods 152-158 with 64 blocks each; ¶54: among pods that can
    # host the job, the one with the most available healthy blocks.
    pods = [
        pod("sp-152", {"tpu": 20}),
        pod("sp-154", {"tpu": 50}),
        pod("sp-156", {"tpu": 64}),
        pod("sp-158", {"tpu": 3}),
    ]
    choice = choose(job("j", on_all(pods, {"tpu": 4})), pods)
    assert [c.pod_id for c in choice.candidates] == ["sp-156", "sp-154", "sp-152"]
    assert all(c.how == FITS for c in choice.candidates)
    assert "most free healthy tpu blocks (64) of 3 pods" in choice.candidates[0].reason
    assert "sp-158" in choice.not_now and "3 free" in choice.not_now["sp-158"]


def test_a_node_type_goes_where_that_type_is_free_not_where_most_blocks_are():
    # ¶47: superpod 154 has 60 TPU blocks and 4 blocks of another type; ¶52: a request
    # naming a node type needs enough healthy free blocks of that type.
    pods = [pod("sp-152", {"tpu": 64}), pod("sp-154", {"tpu": 10, "gpu": 4})]
    gpu_job = job("g", {"sp-154": {"gpu": 2}})  # sp-152 cannot host gpu at all
    assert [c.pod_id for c in choose(gpu_job, pods).candidates] == ["sp-154"]
    both = [pod("a", {"tpu": 60, "gpu": 1}), pod("b", {"tpu": 5, "gpu": 3})]
    mixed = job("m", on_all(both, {"tpu": 1, "gpu": 1}))
    # a: 61 free of the job's types, b: 8
    assert [c.pod_id for c in choose(mixed, both).candidates] == ["a", "b"]
    gpu_only = job("g2", on_all(both, {"gpu": 1}))
    assert [c.pod_id for c in choose(gpu_only, both).candidates] == ["b", "a"]


def test_ties_go_to_more_free_blocks_in_all_then_the_pod_id():
    pods = [pod("b", {"tpu": 8, "gpu": 4}), pod("a", {"tpu": 8}), pod("c", {"tpu": 8})]
    choice = choose(job("j", on_all(pods, {"tpu": 8})), pods)
    assert [c.pod_id for c in choice.candidates] == ["b", "a", "c"]


def test_preemption_only_of_lower_priority_and_only_when_nothing_fits():
    pods = [
        pod("p1", {"tpu": 4}, {"tpu": {20: 8, 50: 16}}),
        pod("p2", {"tpu": 2}, {"tpu": {60: 32}}),
    ]
    j = job("urgent", on_all(pods, {"tpu": 12}), priority=60)
    choice = choose(j, pods)
    # p1: 4 free + 8 (p20) + 16 (p50) below 60; p2's work has priority 60: never preempted.
    assert [(c.pod_id, c.how) for c in choice.candidates] == [("p1", PREEMPTS)]
    assert "8 tpu" in choice.candidates[0].reason
    assert "0 held by lower-priority work" in choice.not_now["p2"]
    # At priority 50 only the p20 work may go: 4 + 8 = 12 covers it exactly.
    assert [c.pod_id for c in choose(job("x", on_all(pods, {"tpu": 12}), 50), pods).candidates]
    assert not choose(job("y", on_all(pods, {"tpu": 13}), 50), pods).candidates
    # A pod that fits without preemption always comes first.
    pods.append(pod("p3", {"tpu": 12}))
    assert [
        (c.pod_id, c.how) for c in choose(job("z", on_all(pods, {"tpu": 12}), 60), pods).candidates
    ] == [
        ("p3", FITS),
        ("p1", PREEMPTS),
    ]


def test_blocks_of_a_job_that_reclaimed_from_this_one_are_never_counted_for_it():
    """Issue 35: `own` (priority 10) reclaimed quota from `back` (60): on p1 its 2 blocks
    are all lower priorities give up, so p1 would refuse `back`; p2's 2 blocks of other
    work at 10 still count. Another job at 60 counts own's blocks as ever."""
    pods = [
        pod("p1", {"tpu": 0}, {"tpu": {10: 2}}),
        pod("p2", {"tpu": 0}, {"tpu": {10: 2}}),
    ]
    holders = [("p1", ["back"], 10, {"tpu": 2}), ("p2", ["someone"], 10, {"tpu": 2})]
    shielded = shielded_blocks("back", 60, holders)
    assert shielded == {"p1": {"tpu": 2}}
    choice = choose(job("back", on_all(pods, {"tpu": 2}), 60, shielded=shielded), pods)
    assert [(c.pod_id, c.how) for c in choice.candidates] == [("p2", PREEMPTS)]
    assert "0 held by lower-priority work" in choice.not_now["p1"]
    assert "2 by lower-priority jobs that reclaimed quota from it" in choice.not_now["p1"]
    other = choose(job("other", on_all(pods, {"tpu": 2}), 60), pods)
    assert [c.pod_id for c in other.candidates] == ["p1", "p2"]
    # a shield counts only below the job's priority (the pod never preempts upwards)
    assert shielded_blocks("back", 10, holders) == {}


def test_among_preemption_candidates_the_fewest_blocks_taken_first():
    pods = [
        pod("few-free", {"tpu": 1}, {"tpu": {10: 40}}),
        pod("more-free", {"tpu": 6}, {"tpu": {10: 40}}),
    ]
    choice = choose(job("j", on_all(pods, {"tpu": 10}), 80), pods)
    assert [c.pod_id for c in choice.candidates] == ["more-free", "few-free"]


def test_silent_pods_and_fresh_refusals_are_not_chosen():
    pods = [
        pod("silent", {"tpu": 64}, usable=False, why_not="no heartbeat for 9.0 s"),
        pod("refusing", {"tpu": 32}, version="v7"),
        pod("ok", {"tpu": 8}, version="v3"),
    ]
    choice = choose(job("j", on_all(pods, {"tpu": 4}), refused={"refusing": "v7"}), pods)
    assert [c.pod_id for c in choice.candidates] == ["ok"]
    assert choice.not_now["silent"] == "no heartbeat for 9.0 s"
    assert "refused" in choice.not_now["refusing"]
    # Once its capacity changed, a pod that refused may be tried again.
    pods[1].version = "v8"
    choice = choose(job("j", on_all(pods, {"tpu": 4}), refused={"refusing": "v7"}), pods)
    assert [c.pod_id for c in choice.candidates] == ["refusing", "ok"]


def test_no_candidate_says_why_for_every_pod():
    pods = [pod("a", {"tpu": 2}), pod("b", {"tpu": 64}, usable=False, why_not="silent")]
    choice = choose(job("j", on_all(pods, {"tpu": 8})), pods)
    assert not choice.candidates
    assert (
        "a: needs 8 tpu blocks: 2 free" in choice.why_waiting and "b: silent" in choice.why_waiting
    )


def test_the_queue_drains_in_order_and_later_small_jobs_backfill():
    pods = [pod("a", {"tpu": 10}), pod("b", {"tpu": 6})]
    queue = [
        job("high-8", on_all(pods, {"tpu": 8}), 80),
        job("mid-8", on_all(pods, {"tpu": 8}), 50),
        job("mid-6", on_all(pods, {"tpu": 6}), 50),
        job("low-2", on_all(pods, {"tpu": 2}), 20),
        job("low-1", on_all(pods, {"tpu": 1}), 20),
    ]
    plan = {
        j.job_id: c.candidates[0].pod_id if c.candidates else None
        for j, c in plan_queue(queue, pods)
    }
    # high-8 takes a (10 free); mid-8 fits nowhere now (a: 2, b: 6) and waits, holding
    # nothing; mid-6 takes b; low-2 the rest of a; low-1 nothing is left for.
    assert plan == {"high-8": "a", "mid-8": None, "mid-6": "b", "low-2": "a", "low-1": None}
    # The registry itself is not changed by planning.
    assert pods[0].free["tpu"] == 10


def test_a_planned_preemption_uses_the_free_blocks_first_then_the_lowest_priority():
    p = pod("a", {"tpu": 2}, {"tpu": {10: 4, 30: 4}})
    queue = [
        job("urgent", {"a": {"tpu": 6}}, 80),  # 2 free + 4 of p10
        job("next", {"a": {"tpu": 4}}, 40),  # only the p30 blocks are left below 40
        job("last", {"a": {"tpu": 1}}, 40),
    ]
    plan = [(j.job_id, [c.how for c in c.candidates]) for j, c in plan_queue(queue, [p])]
    assert plan == [("urgent", [PREEMPTS]), ("next", [PREEMPTS]), ("last", [])]


@st.composite
def cells(draw):
    n = draw(st.integers(1, 4))
    pods = [
        pod(
            f"p{i}",
            {"tpu": draw(st.integers(0, 64)), "gpu": draw(st.integers(0, 4))},
            {"tpu": {draw(st.integers(1, 100)): draw(st.integers(0, 32))}},
        )
        for i in range(n)
    ]
    jobs = [
        job(
            f"j{k}",
            {
                p.pod_id: {"tpu": draw(st.integers(1, 16)), "gpu": draw(st.integers(0, 2))}
                for p in pods
                if draw(st.booleans())
            },
            draw(st.integers(1, 100)),
        )
        for k in range(draw(st.integers(1, 12)))
    ]
    return pods, jobs


@given(cells())
def test_planning_never_gives_out_more_than_a_pod_has(cell):
    pods, queue = cell
    given_free: dict[str, Counter] = {p.pod_id: Counter() for p in pods}
    given_all: dict[str, Counter] = {p.pod_id: Counter() for p in pods}
    for j, choice in plan_queue(queue, pods):
        if not choice.candidates:
            continue
        first = choice.candidates[0]
        target = next(p for p in pods if p.pod_id == first.pod_id)
        need = j.needs[first.pod_id]
        given_all[first.pod_id].update(need)
        if first.how == FITS:
            given_free[first.pod_id].update(need)
        for t, n in need.items():
            # never more than free + what work of lower priority holds
            assert n <= target.free[t] + target.takeable(t, j.priority)
    for p in pods:
        # FITS decisions only ever use blocks that were free
        assert all(given_free[p.pod_id][t] <= p.free[t] for t in ("tpu", "gpu"))
        most = {t: p.free[t] + sum(p.preemptible.get(t, {}).values()) for t in ("tpu", "gpu")}
        for t in ("tpu", "gpu"):
            assert given_all[p.pod_id][t] <= most[t]


def test_the_preferred_pod_goes_first_within_its_class_and_only_there():
    pods = [pod("a", {"tpu": 8}), pod("b", {"tpu": 2}), pod("c", {"tpu": 0}, {"tpu": {10: 4}})]
    need = on_all(pods, {"tpu": 2})
    # b fits now with fewer free blocks than a: preferred, it goes first
    choice = choose(job("j", need, preferred="b"), pods)
    assert [x.pod_id for x in choice.candidates] == ["b", "a", "c"]
    assert choice.candidates[0].reason.startswith("the pod asked for")
    # c fits only by preemption: the pods that fit now still go first (no one preempted
    # for a preference), and c leads the preemption candidates
    choice = choose(job("j", need, preferred="c"), pods)
    assert [(x.pod_id, x.how) for x in choice.candidates] == [
        ("a", FITS),
        ("b", FITS),
        ("c", PREEMPTS),
    ]
    assert "c, the pod asked for, does not fit now" in choice.candidates[0].reason
    # a preferred pod that cannot host the job at all changes nothing but the reason
    only_ab = {"a": {"tpu": 2}, "b": {"tpu": 2}}
    choice = choose(job("j", only_ab, preferred="c"), pods)
    assert [x.pod_id for x in choice.candidates] == ["a", "b"]
    assert "c, the pod asked for, cannot host it" in choice.candidates[0].reason


@given(
    st.lists(st.integers(0, 8), min_size=1, max_size=5),
    st.integers(0, 4),
    st.integers(1, 8),
)
def test_a_preference_only_reorders_the_candidates(frees, which, n):
    pods = [pod(f"p{i}", {"tpu": f}) for i, f in enumerate(frees)]
    preferred = f"p{which}"
    plain = choose(job("j", on_all(pods, {"tpu": n})), pods)
    asked = choose(job("j", on_all(pods, {"tpu": n}), preferred=preferred), pods)
    assert sorted(x.pod_id for x in asked.candidates) == sorted(x.pod_id for x in plain.candidates)
    ids = [x.pod_id for x in asked.candidates]
    if preferred in ids:
        assert ids[0] == preferred
        assert ids[1:] == [x.pod_id for x in plain.candidates if x.pod_id != preferred]
    else:
        assert ids == [x.pod_id for x in plain.candidates]


# -- sub-block slices (issue 28): counted in chips ------------------------------------


def chip_pod(
    pod_id: str, free_blocks: int, chips_free: int, largest: int, preemptible=None, **kw
) -> PodCapacityView:
    return PodCapacityView(
        pod_id,
        Counter({"tpu": free_blocks}),
        preemptible or {},
        chips_free=Counter({"tpu": chips_free}),
        largest_box=Counter({"tpu": largest}),
        block_chips=64,
        **kw,
    )


def box(chips: int) -> dict[str, int]:
    return {chips_key("tpu"): chips}


def test_a_sub_block_demand_fits_where_the_largest_free_box_holds_it_most_free_chips_first():
    pods = [
        chip_pod("full", 0, 0, 0),
        chip_pod("scattered", 0, 40, 4),  # 40 chips free, none in a box of 8
        chip_pod("some", 0, 24, 16),
        chip_pod("roomy", 2, 140, 64),
    ]
    choice = choose(job("s", on_all(pods, box(8))), pods)
    assert [c.pod_id for c in choice.candidates] == ["roomy", "some"]
    assert "most free healthy tpu chips (140) of 2 pods" in choice.candidates[0].reason
    assert "largest free holds 4 (40 chips free)" in choice.not_now["scattered"]
    # A pod with no free block still fits a small box: blocks do not count for it.
    one = choose(job("t", {"some": box(2)}), pods).candidates
    assert [c.pod_id for c in one] == ["some"] and "room for a box of 2 tpu chips" in one[0].reason


def test_a_sub_block_demand_preempts_only_a_lower_priority_block_when_no_box_is_free():
    p = chip_pod("p", 0, 0, 0, {"tpu": {20: 1}})
    assert choose(job("hi", {"p": box(4)}, priority=80), [p]).candidates[0].how == PREEMPTS
    assert not choose(job("lo", {"p": box(4)}, priority=20), [p]).candidates


def test_planning_takes_chips_for_sub_block_slices_and_blocks_take_their_chips_too():
    # One free block (64 chips) and a partly used one with 16 chips free in a box of 16.
    p = chip_pod("p", 1, 80, 64)
    queue = [job(f"s{i}", {"p": box(16)}) for i in range(5)] + [job("b", {"p": {"tpu": 1}})]
    plan = {j.job_id: bool(c.candidates) for j, c in plan_queue(queue, [p])}
    # 80 chips hold five boxes of 16; after them, no block is free for `b`.
    assert plan == {"s0": True, "s1": True, "s2": True, "s3": True, "s4": True, "b": False}
    # A block slice first: its 64 chips go, the boxes of 16 left fit one slice.
    queue = [job("b", {"p": {"tpu": 1}})] + [job(f"s{i}", {"p": box(16)}) for i in range(2)]
    plan = {j.job_id: bool(c.candidates) for j, c in plan_queue(queue, [p])}
    assert plan == {"b": True, "s0": True, "s1": False}


@given(
    boxes=st.lists(st.sampled_from([1, 2, 4, 8, 16, 32]), max_size=30),
    free_blocks=st.integers(0, 4),
    partial=st.integers(0, 63),
)
def test_planning_never_gives_out_more_chips_than_a_pod_has(boxes, free_blocks, partial):
    chips = free_blocks * 64 + partial
    p = chip_pod("p", free_blocks, chips, 64 if free_blocks else partial)
    queue = [job(f"j{i}", {"p": box(n)}) for i, n in enumerate(boxes)]
    placed = sum(n for n, (_, c) in zip(boxes, plan_queue(queue, [p]), strict=True) if c.candidates)
    assert placed <= chips
