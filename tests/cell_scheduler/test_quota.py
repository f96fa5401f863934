"""The quota model: admission within nominal and borrowing, reclaim, fair-share order."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from lightpath.v1 import common_pb2
from lightpath.v1 import workload_scheduler_pb2 as ws
from lightpath_services.cell_scheduler.jobs import gives_up
from lightpath_services.cell_scheduler.quota import (
    Hold,
    Quota,
    QuotaBook,
    RunningJob,
    Waiting,
    check_quota,
    decay,
    dominant_share,
    fair_order,
)
from lightpath_services.cell_scheduler.quotas import QuotaState, plan_reclaim, reclaimers
from lightpath_services.cell_scheduler.request import Resolved


def book(*quotas: Quota, **used: dict[str, int]) -> QuotaBook:
    return QuotaBook(quotas, used)


A = Quota("acme", {"tpu": 512}, cohort="lab")
B = Quota("beta", {"tpu": 1024}, cohort="lab")
C = Quota("solo", {"tpu": 256})


def test_within_nominal_is_admitted_and_borrows_nothing():
    got = book(A, B).check("acme", {"tpu": 512})
    assert got.ok and got.within_nominal and got.borrowed == {"tpu": 0}


def test_a_tenant_without_quota_is_not_limited():
    got = book(A).check("nobody", {"tpu": 1 << 20})
    assert got.ok and got.reason == ""


def test_borrows_what_the_cohort_lends():
    b = book(A, B, beta={"tpu": 768})  # beta lends its 256 unused
    assert b.cohort_lends("acme", "tpu") == 256
    ok = b.check("acme", {"tpu": 768})
    assert ok.ok and not ok.within_nominal and ok.borrowed == {"tpu": 256}
    no = b.check("acme", {"tpu": 769})
    assert not no.ok
    assert "acme would hold 769 tpu chips, 257 over its quota of 512" in no.reason
    assert "cohort 'lab' can lend it 256 tpu chips now" in no.reason


def test_alone_never_borrows():
    got = book(C).check("solo", {"tpu": 257})
    assert not got.ok and "no cohort" in got.reason


def test_borrowing_limit_and_no_borrowing():
    limited = Quota("acme", {"tpu": 512}, cohort="lab", borrowing_limit={"tpu": 64})
    assert book(limited, B).check("acme", {"tpu": 576}).ok
    got = book(limited, B).check("acme", {"tpu": 577})
    assert not got.ok and "may borrow at most 64" in got.reason
    none = Quota("acme", {"tpu": 512}, cohort="lab", borrowing_limit={"tpu": 0})
    got = book(none, B).check("acme", {"tpu": 513})
    assert not got.ok and "may not borrow tpu chips" in got.reason


def test_lending_limit_keeps_part_of_the_nominal():
    keeps = Quota("beta", {"tpu": 1024}, cohort="lab", lending_limit={"tpu": 128})
    b = book(A, keeps)
    assert b.cohort_lends("acme", "tpu") == 128
    assert b.check("acme", {"tpu": 640}).ok
    assert not b.check("acme", {"tpu": 641}).ok


def test_what_others_borrow_is_not_lent_twice():
    third = Quota("gamma", {"tpu": 0}, cohort="lab")
    b = book(A, B, third, gamma={"tpu": 1000})  # gamma borrows 1000 of beta's 1024 and acme's
    assert b.cohort_lends("acme", "tpu") == 1024 - 1000
    assert not b.check("acme", {"tpu": 512 + 25}).ok
    assert b.check("acme", {"tpu": 512 + 24}).ok


def test_a_type_missing_from_the_nominal_must_be_borrowed():
    b = book(A, Quota("beta", {"gpu": 64}, cohort="lab"))
    assert b.check("acme", {"gpu": 64}).ok
    assert not b.check("acme", {"gpu": 65}).ok


# Property: admissions that borrow never take more than the cohort lends at that moment,
# so the sum of what members borrow stays within the sum of what the others lend.
quota_st = st.builds(
    lambda n, lend, cap: (n, lend, cap),
    st.integers(0, 600),
    st.one_of(st.none(), st.integers(0, 600)),
    st.one_of(st.none(), st.integers(0, 600)),
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(quota_st, min_size=2, max_size=4),
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 200)), max_size=40),
)
def test_borrowing_never_exceeds_what_is_lent(specs, asks):
    quotas = [
        Quota(
            f"t{i}",
            {"tpu": n},
            cohort="c",
            lending_limit=None if lend is None else {"tpu": lend},
            borrowing_limit=None if cap is None else {"tpu": cap},
        )
        for i, (n, lend, cap) in enumerate(specs)
    ]
    b = QuotaBook(quotas, {})
    for who, n in asks:
        tenant = f"t{who % len(quotas)}"
        before = {q.tenant: b.usage(q.tenant, "tpu") for q in quotas}
        got = b.check(tenant, {"tpu": n})
        if not got.ok:
            continue
        b.assume(tenant, {"tpu": n})
        q = b.quotas[tenant]
        cap = q.may_borrow("tpu")
        if cap is not None:
            assert b.borrowed(tenant, "tpu") <= cap
        if got.within_nominal:
            assert b.usage(tenant, "tpu") <= q.nominal["tpu"]
            continue
        # what the borrower holds above nominal fits in what the others lent just before
        others = [x for x in quotas if x.tenant != tenant]
        lent = sum(
            max(0, min(x.lend_cap("tpu"), x.nominal["tpu"] - before[x.tenant])) for x in others
        )
        borrowed = sum(max(0, before[x.tenant] - x.nominal["tpu"]) for x in others)
        assert b.borrowed(tenant, "tpu") <= lent - borrowed


# -- reclaim ---------------------------------------------------------------------


def run(job_id, tenant, priority, seq, pod, chips):
    return RunningJob(job_id, tenant, priority, seq, pod, {"tpu": chips})


def test_reclaim_takes_borrowers_lowest_priority_youngest_first_on_one_pod():
    b = book(A, B, beta={"tpu": 1024 + 256})  # beta borrows 256 of acme's
    running = [
        run("b-hi", "beta", 90, 1, "pod-1", 128),
        run("b-lo-old", "beta", 10, 2, "pod-1", 128),
        run("b-lo-young", "beta", 10, 3, "pod-1", 128),
        run("b-other", "beta", 5, 4, "pod-2", 64),
    ]
    got = b.reclaim("acme", {"tpu": 128}, running, {"pod-1": {"tpu": 0}, "pod-2": {"tpu": 0}})
    assert got is not None
    assert got.pod == "pod-1" and [v.job_id for v in got.victims] == ["b-lo-young"]
    assert "reclaiming quota lent to beta" in got.reason


def test_reclaim_stops_when_the_borrower_is_back_within_nominal():
    b = book(A, B, beta={"tpu": 1024 + 128})  # beta borrows only 128
    running = [
        run("b1", "beta", 10, 3, "pod-1", 128),
        run("b2", "beta", 10, 2, "pod-1", 128),
    ]
    # acme needs 256 on pod-1: only one beta job is borrowed; the second is beta's own.
    assert b.reclaim("acme", {"tpu": 256}, running, {"pod-1": {"tpu": 0}}) is None
    got = b.reclaim("acme", {"tpu": 256}, running, {"pod-1": {"tpu": 128}})
    assert got is not None and [v.job_id for v in got.victims] == ["b1"]


def test_no_reclaim_beyond_nominal_or_outside_the_cohort():
    b = book(A, B, C, beta={"tpu": 2048}, solo={"tpu": 0})
    running = [run("b1", "beta", 1, 1, "pod-1", 1024)]
    assert b.reclaim("acme", {"tpu": 513}, running, {}) is None  # acme itself would borrow
    assert b.reclaim("solo", {"tpu": 64}, running, {}) is None  # not in lab


def test_reclaim_picks_the_pod_with_the_lowest_victims_then_the_fewest():
    b = book(A, B, beta={"tpu": 2048})
    running = [
        run("p1a", "beta", 1, 1, "pod-1", 64),
        run("p1b", "beta", 1, 2, "pod-1", 64),
        run("p2", "beta", 50, 3, "pod-2", 128),
        run("p3", "beta", 1, 4, "pod-3", 128),
    ]
    rooms = {"pod-1": {}, "pod-2": {}, "pod-3": {}}
    got = b.reclaim("acme", {"tpu": 128}, running, rooms)
    assert got is not None and got.pod == "pod-3" and [v.job_id for v in got.victims] == ["p3"]
    # without pod-3, lower priority beats fewer victims (as the pods' own preemption)
    got = b.reclaim("acme", {"tpu": 128}, running[:3], rooms)
    assert got is not None and got.pod == "pod-1" and len(got.victims) == 2


def test_reclaim_takes_the_smallest_job_that_frees_enough_alone():
    b = book(A, B, beta={"tpu": 2048})
    running = [
        run("big", "beta", 1, 9, "pod-1", 1024),
        run("fits", "beta", 1, 1, "pod-1", 64),
        run("tiny", "beta", 1, 8, "pod-1", 4),
    ]
    got = b.reclaim("acme", {"tpu": 8}, running, {"pod-1": {"tpu": 0}})
    assert got is not None and [v.job_id for v in got.victims] == ["fits"]


# -- validation ------------------------------------------------------------------


def test_bad_quotas_name_the_field():
    bad = Quota("acme", {"tpu": -1, "fpga": 8}, weight=0, borrowing_limit={"tpu": 5})
    got = {v.field: v.rule for v in check_quota(bad, known_types=["tpu", "gpu"], known_tenants=[])}
    assert got["tenant"] == "no tenant 'acme': create it first"
    assert "0 to" in got["nominal[tpu]"]
    assert got["nominal[fpga]"].startswith("unknown node type 'fpga'; the cell has gpu, tpu")
    assert "weight" in got
    assert got["borrowing_limit"] == "a tenant outside a cohort has nobody to borrow from"
    above = Quota("acme", {"tpu": 8}, cohort="lab", borrowing_limit={"tpu": 600})
    got = check_quota(above, known_types=["tpu"], cohort_nominal={"tpu": 512})
    assert [v.field for v in got] == ["borrowing_limit[tpu]"]
    assert "above the 512 tpu chips" in got[0].rule
    frac = Quota("acme", {"tpu": 1.5})  # type: ignore[dict-item]
    assert [v.rule for v in check_quota(frac, known_types=["tpu"])] == [
        "must be a whole number of chips"
    ]


# -- fair share ------------------------------------------------------------------


def test_decay_halves_in_a_half_life_and_integrates_constant_use():
    assert decay(100.0, 0, 3600, 3600) == 50.0
    # holding c chips forever converges to c * H / ln 2
    v = 0.0
    for _ in range(200):
        v = decay(v, 64, 600, 3600)
    assert math.isclose(v, 64 * 3600 / math.log(2), rel_tol=1e-6)
    # one step of 2h equals two steps of 1h
    assert math.isclose(decay(decay(7.0, 5, 3600, 3600), 5, 3600, 3600), decay(7.0, 5, 7200, 3600))


def test_dominant_share_takes_the_largest_type_over_weight():
    window = 3600 / math.log(2)
    usage = {"tpu": 0.5 * 4096 * window, "gpu": 0.25 * 256 * window}
    assert math.isclose(dominant_share(usage, {"tpu": 4096, "gpu": 256}, 1.0), 0.5)
    assert math.isclose(dominant_share(usage, {"tpu": 4096, "gpu": 256}, 2.0), 0.25)


def w(job_id, tenant, priority, seq, chips=64):
    return Waiting(job_id, tenant, priority, seq, {"tpu": chips})


def test_fair_order_serves_the_smaller_share_first_and_interleaves():
    queue = [w("a1", "acme", 50, 1), w("a2", "acme", 50, 2), w("b1", "beta", 50, 3)]
    got = fair_order(queue, {"acme": 0.0, "beta": 0.0}, {"tpu": 128}, {})
    assert [j.job_id for j in got] == ["a1", "b1", "a2"]  # ties: older head first
    got = fair_order(queue, {"acme": 0.9, "beta": 0.0}, {"tpu": 128}, {})
    assert [j.job_id for j in got] == ["b1", "a1", "a2"]


def test_priority_orders_within_a_tenant_and_weight_counts():
    queue = [w("lo", "acme", 10, 1), w("hi", "acme", 90, 2), w("b", "beta", 50, 0)]
    got = fair_order(queue, {"acme": 0.1, "beta": 0.1}, {"tpu": 64}, {"beta": 1.0})
    assert [j.job_id for j in got] == ["b", "hi", "lo"]
    got = fair_order(queue, {"acme": 0.1, "beta": 0.3}, {"tpu": 64}, {"beta": 4.0})
    assert got[0].job_id == "hi"


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 100), st.integers(1, 512)), max_size=30
    )
)
def test_fair_order_is_a_permutation_keeping_each_tenants_order(jobs):
    queue = [w(f"j{i}", t, p, i, c) for i, (t, p, c) in enumerate(jobs)]
    got = fair_order(queue, {}, {"tpu": 4096}, {})
    assert sorted(j.job_id for j in got) == sorted(j.job_id for j in queue)
    for tenant in "abc":
        mine = [j for j in got if j.tenant == tenant]
        assert mine == sorted(mine, key=lambda j: (-j.priority, j.seq))


def test_a_job_no_quota_can_ever_admit_says_why():
    limited = Quota("acme", {"tpu": 512}, cohort="lab", borrowing_limit={"tpu": 64})
    keeps = Quota("beta", {"tpu": 1024}, cohort="lab", lending_limit={"tpu": 128})
    b = book(limited, keeps, C)
    assert b.never_fits("acme", {"tpu": 576}) == ""
    assert b.never_fits("acme", {"tpu": 577}) == (
        "needs 577 tpu chips; acme's quota allows at most 576 (512 nominal + 64 it may borrow)"
    )
    assert b.never_fits("beta", {"tpu": 1024 + 128}) == ""  # acme lends all 512
    assert "at most 1536" in b.never_fits("beta", {"tpu": 1537})
    assert "at most 256" in b.never_fits("solo", {"tpu": 257})
    assert b.never_fits("nobody", {"tpu": 1 << 30}) == ""


# -- reclaim of sub-block slices (chips inside one block, not blocks) ----------------


def box(job_id, tenant, priority, seq, pod, chips, block):
    return RunningJob(job_id, tenant, priority, seq, pod, {"tpu": chips}, block=block)


BLOCK = {"pod-1": 64, "pod-2": 64}  # chips in one block of each pod


def test_boxes_spread_over_blocks_free_no_block_for_a_block_slice():
    """Eight 8-chip boxes hold 64 chips but in eight blocks, each shared with another
    tenant's box: freeing them frees no block. The borrower's block slice, though of
    higher priority, is what frees one."""
    b = book(A, B, beta={"tpu": 2048})
    boxes = [box(f"s{i}", "beta", 10, i, "pod-1", 8, block=i) for i in range(8)]
    shared = {("pod-1", i): {f"s{i}", f"other-{i}"} for i in range(8)}
    blk = run("blk", "beta", 50, 20, "pod-1", 64)
    running = [*boxes, blk]
    got = b.reclaim("acme", {"tpu": 64}, running, {"pod-1": {}}, block_chips=BLOCK, holders=shared)
    assert got is not None and [v.job_id for v in got.victims] == ["blk"]
    # a block that only the borrower's box holds is freed by it alone (the lowest first)
    del shared[("pod-1", 7)]
    got = b.reclaim("acme", {"tpu": 64}, running, {"pod-1": {}}, block_chips=BLOCK, holders=shared)
    assert got is not None and [v.job_id for v in got.victims] == ["s7"]


def test_a_block_whose_boxes_all_borrow_is_freed_whole_for_a_block_slice():
    b = book(A, B, beta={"tpu": 2048})
    boxes = [box(f"s{i}", "beta", 10, i, "pod-1", 16, block=3) for i in range(3)]
    blk = run("blk", "beta", 50, 20, "pod-1", 64)
    # three boxes of 48 chips, the rest of block 3 free: the block is the job's room
    got = b.reclaim("acme", {"tpu": 64}, [*boxes, blk], {"pod-1": {}}, block_chips=BLOCK)
    assert got is not None and sorted(v.job_id for v in got.victims) == ["s0", "s1", "s2"]
    # a box of someone else's in block 3 keeps it: the block slice goes instead
    got = b.reclaim(
        "acme",
        {"tpu": 64},
        [*boxes, blk],
        {"pod-1": {}},
        block_chips=BLOCK,
        holders={("pod-1", 3): {"s0", "s1", "s2", "other"}},
    )
    assert got is not None and [v.job_id for v in got.victims] == ["blk"]


def test_a_box_is_reclaimed_from_boxes_of_one_block_only():
    """An 8-chip box of the owner's: two 4-chip boxes in two blocks make no room for it
    (each leaves 4 chips); the borrower's 8 chips in one block do."""
    b = book(A, B, beta={"tpu": 2048})
    running = [
        box("a4", "beta", 5, 1, "pod-1", 4, block=0),
        box("b4", "beta", 5, 2, "pod-1", 4, block=1),
        box("c8", "beta", 20, 3, "pod-2", 8, block=0),
    ]
    got = b.reclaim(
        "acme", {"tpu": 8}, running, {"pod-1": {}, "pod-2": {}}, box=True, block_chips=BLOCK
    )
    assert got is not None and got.pod == "pod-2" and [v.job_id for v in got.victims] == ["c8"]
    # two of the borrower's 4-chip boxes in one block: both, lowest priority first
    running.append(box("d4", "beta", 5, 4, "pod-1", 4, block=0))
    got = b.reclaim(
        "acme", {"tpu": 8}, running, {"pod-1": {}, "pod-2": {}}, box=True, block_chips=BLOCK
    )
    assert got is not None and got.pod == "pod-1"
    assert sorted(v.job_id for v in got.victims) == ["a4", "d4"]


def test_a_box_takes_a_borrowed_block_slice_when_no_box_frees_enough():
    b = book(A, B, beta={"tpu": 2048})
    running = [
        box("tiny", "beta", 1, 1, "pod-1", 4, block=0),
        run("blk", "beta", 30, 2, "pod-1", 64),
    ]
    got = b.reclaim("acme", {"tpu": 8}, running, {"pod-1": {}}, box=True, block_chips=BLOCK)
    assert got is not None and [v.job_id for v in got.victims] == ["blk"]


def test_reclaim_of_boxes_takes_only_borrowed_chips():
    """beta borrows 8 chips only: of its three 8-chip boxes in one block, one goes; a
    block slice of acme's needs the block whole, which beta's own chips keep."""
    b = book(A, B, beta={"tpu": 1024 + 8})
    running = [box(f"s{i}", "beta", 10, i, "pod-1", 8, block=0) for i in range(3)]
    got = b.reclaim("acme", {"tpu": 8}, running, {"pod-1": {}}, box=True, block_chips=BLOCK)
    assert got is not None and [v.job_id for v in got.victims] == ["s2"]  # the youngest
    assert b.reclaim("acme", {"tpu": 64}, running, {"pod-1": {}}, block_chips=BLOCK) is None


def test_plan_reclaim_reads_boxes_and_their_blocks_from_the_stored_fields():
    """The cell's rows (store.live_fields): a job's `box` names its block; every live job
    there holds the block, whatever its state; a small job without one is not named."""
    state = QuotaState("7", {"acme": A, "beta": B}, {"beta": {"tpu": 2048}}, {})

    def row(job, tenant, chips, box="", state="RUNNING", priority=10, seq=1):
        f = {"tenant": tenant, "priority": str(priority), "seq": str(seq), "state": state}
        f |= {"phase": "PLACED", "qc": f'{{"tpu": {chips}}}', "box": box}
        return ("pod-1", job, f)

    live = [
        row("s1", "beta", 32, box="3", seq=1),
        row("s2", "beta", 32, box="3", seq=2),
        row("blk", "beta", 64, priority=90, seq=3),
    ]
    room, size = {"pod-1": {}}, {"pod-1": 64}
    got = plan_reclaim("own", "acme", {"tpu": 64}, state, live, room, block_chips=size)
    assert got is not None and sorted(v.job_id for v in got.victims) == ["s1", "s2"]
    # a third box there, still wiring (never a victim), keeps block 3 whole
    wiring = [*live, row("s3", "gamma", 8, box="3", state="WIRING")]
    got = plan_reclaim("own", "acme", {"tpu": 64}, state, wiring, room, block_chips=size)
    assert got is not None and [v.job_id for v in got.victims] == ["blk"]
    # a box with no stored block is not named: the box reclaims from one that has one
    legacy = [row("old", "beta", 8, priority=1, seq=9), row("s1", "beta", 32, box="3")]
    got = plan_reclaim("own", "acme", {"tpu": 8}, state, legacy, room, box=True, block_chips=size)
    assert got is not None and [v.job_id for v in got.victims] == ["s1"]
    # ... and, running somewhere, it may be in block 3: no block of boxes is freed whole
    got = plan_reclaim(
        "own", "acme", {"tpu": 64}, state, [*live, legacy[0]], room, block_chips=size
    )
    assert got is not None and [v.job_id for v in got.victims] == ["blk"]
    # delayed (holding nothing), it is in no block
    delayed = row("old", "beta", 8, state="SUSPENDED")
    got = plan_reclaim("own", "acme", {"tpu": 64}, state, [*live, delayed], room, block_chips=size)
    assert got is not None and sorted(v.job_id for v in got.victims) == ["s1", "s2"]


def test_plan_reclaim_never_names_a_job_that_reclaimed_from_the_reclaiming_one():
    """beta's `back` reclaimed quota from acme's `own` (its row's "rcl"): the pod would
    refuse it as own's victim (lightpath.domain.slices.shields), so the cell names the
    next borrowed job instead, or none when only `back` would do."""
    state = QuotaState("7", {"acme": A, "beta": B}, {"beta": {"tpu": 2048}}, {})

    def row(job, priority, seq, rcl=""):
        f = {"tenant": "beta", "priority": str(priority), "seq": str(seq), "state": "RUNNING"}
        f |= {"phase": "PLACED", "qc": '{"tpu": 64}', "rcl": rcl, "rcb": ""}
        return ("pod-1", job, f)

    live = [row("back", 5, 2, rcl='["own"]'), row("other", 50, 1)]
    room, size = {"pod-1": {}}, {"pod-1": 64}
    got = plan_reclaim("own", "acme", {"tpu": 64}, state, live, room, block_chips=size)
    assert got is not None and [v.job_id for v in got.victims] == ["other"]
    # any other job of acme's may take `back` (it reclaimed from `own` only)
    got = plan_reclaim("own-2", "acme", {"tpu": 64}, state, live, room, block_chips=size)
    assert got is not None and [v.job_id for v in got.victims] == ["back"]
    assert plan_reclaim("own", "acme", {"tpu": 64}, state, live[:1], room, block_chips=size) is None
    assert reclaimers(live) == [("pod-1", ["own"], 5, {})]


def test_what_a_job_that_reclaimed_gives_up_follows_its_policy():
    """jobs.gives_up: the blocks the cell never counts for the jobs a reclaim sent away
    (as the pod's preemption.max_freeable counts them)."""

    def resolved(policy, shrink=(), unit=0, sub_block=False):
        spec = ws.JobSpec(job_id="j", preemption_policy=policy, unit=unit)
        for dims in shrink:
            spec.shrink_to.add(dims=dims)
        needs = Counter({"tpu#chips": 8} if sub_block else {"tpu": 4})
        return Resolved(spec, needs, (2, 2, 1), (8, 8, 4), 10, sub_block=sub_block)

    assert gives_up(resolved(common_pb2.PREEMPTION_POLICY_DELAY)) == {"tpu": 4}
    assert gives_up(resolved(common_pb2.PREEMPTION_POLICY_TERMINATE)) == {"tpu": 4}
    # shrinking: all but the smallest arrangement it accepts (in chips or in blocks)
    shrink = common_pb2.PREEMPTION_POLICY_SHRINK
    assert gives_up(resolved(shrink, [(8, 4, 4), (4, 4, 4)])) == {"tpu": 3}
    assert gives_up(resolved(shrink, [(2, 1, 1)], unit=common_pb2.SHAPE_UNIT_BLOCKS)) == {"tpu": 2}
    assert gives_up(resolved(common_pb2.PREEMPTION_POLICY_DELAY, sub_block=True)) == {}


def test_the_pod_held_for_an_owners_job_is_the_closest_to_its_room():
    """QuotaBook.pod_to_hold: free blocks' chips and chips of jobs of cohort members that
    borrow now, per pod; the most wins (ties: the first pod id). Hold.keeps_out: only
    jobs that would borrow stay off it, never the owner's own job."""
    b = book(A, B, beta={"tpu": 1024 + 64})  # beta borrows
    running = [
        run("b1", "beta", 10, 1, "pod-1", 512),
        run("b2", "beta", 10, 2, "pod-2", 64),
        run("a1", "acme", 10, 3, "pod-2", 1024),  # acme's own: not reach
    ]
    room = {"pod-1": {"tpu": 0}, "pod-2": {"tpu": 256}, "pod-3": {"tpu": 512}}
    assert b.reach("acme", "tpu", running, room) == {"pod-1": 512, "pod-2": 320, "pod-3": 512}
    assert b.pod_to_hold("acme", {"tpu": 2048}, running, room) == "pod-1"
    # beta no longer borrowing: its jobs are no one's reach
    idle = book(A, B, beta={"tpu": 1024})
    assert idle.pod_to_hold("acme", {"tpu": 2048}, running, room) == "pod-3"
    assert idle.pod_to_hold("acme", {"tpu": 2048}, running, {}) is None
    hold = Hold("own", "pod-1")
    assert hold.keeps_out("other", borrows=True) == "pod-1"
    assert hold.keeps_out("other", borrows=False) == ""
    assert hold.keeps_out("own", borrows=True) == ""
