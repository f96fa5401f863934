"""Quotas and fair share in the simulator (issue 35): the cell's quota model decides
admission, order and reclaim; the pods' invariants and the quota accounting hold."""

from __future__ import annotations

import json

import pytest

from lightpath_services.cell_scheduler.quota import Quota
from lightpath_services.sim import engine
from lightpath_services.sim.engine import ENDED, Failures, SimConfig, pod_fabric, simulate
from lightpath_services.sim.quotas import load_quotas
from lightpath_services.sim.workload import Generator, parse_trace
from tests.sim.test_sim import check_pod

FABRIC = pod_fabric("pod-0")
LAB = (
    Quota("acme", {"tpu": 3072}, cohort="lab"),
    Quota("beta", {"tpu": 1024}, cohort="lab"),
)

# beta fills the idle pod by borrowing acme's quota; then acme asks for its own.
BURST = """arrival,tenant,shape,twisted,duration,priority,preemption
0,beta,8x8x16,false,36000,50,delay
1,beta,8x8x16,false,36000,50,delay
2,beta,8x8x16,false,36000,50,delay
3,beta,8x8x16,false,36000,50,delay
100,acme,8x16x16,false,3600,50,delay
"""


def test_idle_quota_is_lent_and_reclaimed_for_its_owner_at_once():
    jobs, bad = parse_trace(BURST, FABRIC)
    assert not bad
    r = simulate(jobs, SimConfig(quotas=LAB, restart_s=300))
    runs = {j.trace.job_id: j for j in r.jobs}
    # beta borrowed: all four of its jobs started at once on the idle pod
    assert [runs[f"j{i}"].first_start for i in (2, 3, 4, 5)] == [0, 1, 2, 3]
    # acme's job, within its nominal, started the moment it arrived: the two youngest
    # borrowed beta jobs were reclaimed (delayed, waiting in the pod's queue)
    assert runs["j6"].first_start == 100
    assert [runs[f"j{i}"].preemptions for i in (2, 3, 4, 5)] == [0, 0, 1, 1]
    assert r.stats["counters"]["reclaims"] == 2
    # the reclaimed jobs paid their checkpoint-restart and ran again after acme's
    assert runs["j5"].lost_preemption == pytest.approx(300 * 1024)
    assert all(runs[j].state == "COMPLETED" for j in runs)
    tenants = r.stats["quotas"]["tenants"]
    assert tenants["acme"]["denied_within_nominal"] == 0
    assert tenants["beta"]["nominal_chips"] == 1024


def test_a_job_a_reclaim_delayed_goes_back_to_the_cell_queue_uncharged(monkeypatch):
    trace = "\n".join(
        line.replace(",50,", ",90,") if ",beta," in line else line for line in BURST.splitlines()
    )
    jobs, bad = parse_trace(trace + "\n", FABRIC)
    assert not bad
    seen: dict[str, object] = {}
    real_record = engine.Sim._record

    def record(self):
        real_record(self)
        if self.now == 100:  # right after the reclaim
            pod = self.model.pods[0]
            seen["pod_queue"] = sorted(pod.waiting)
            seen["cell"] = sorted(self.model.jobs)
            seen["beta_charged"] = self.quota.book.usage("beta", "tpu")
            seen["beta_placed"] = sum(
                self.model._chips(j) for j in pod.state.jobs.values() if j.job_id != "j6"
            )

    monkeypatch.setattr(engine.Sim, "_record", record)
    r = simulate(jobs, SimConfig(quotas=LAB, restart_s=300))
    runs = {j.trace.job_id: j for j in r.jobs}
    # as the service's pod lets them go: in the cell queue, not the pod's, uncharged
    assert seen == {
        "pod_queue": [],
        "cell": ["j4", "j5"],
        "beta_charged": 2 * 1024,
        "beta_placed": 2 * 1024,
    }
    # priority does not undo a reclaim (acme's job is within its nominal, and beta may
    # not borrow what acme holds): they go again when acme's job ends
    assert runs["j6"].preemptions == 0 and runs["j6"].end == pytest.approx(3700)
    for job_id, arrival in (("j4", 2), ("j5", 3)):
        left = 36000 - (100 - arrival) + 300  # what it had left, and its restart
        assert runs[job_id].end == pytest.approx(3700 + left)
    # chips were free only while beta's first jobs arrived, with nothing waiting
    assert {k for k, v in r.stats["idle_by_cause"].items() if v} == {"queue_empty"}


# acme takes back less than a borrowed job holds: the rest of it is free, a small job of
# the borrower's comes, and (the end of the arrivals, what utilisation counts) acme's last
HOLE = (
    BURST.replace("100,acme,8x16x16", "100,acme,8x8x8")
    + "150,beta,8x8x8,false,3600,50,delay\n3000,acme,4x4x4,false,60,50,delay\n"
)


def test_the_chips_a_reclaim_leaves_beyond_the_owners_job_go_to_a_borrower_at_once():
    jobs, _ = parse_trace(HOLE, FABRIC)
    r = simulate(jobs, SimConfig(quotas=LAB))
    runs = {j.trace.job_id: j for j in r.jobs}
    assert runs["j6"].first_start == 100
    # the delayed job gave its quota back at the cell: beta's small job takes the 512
    # chips it left beside acme's at once, and the delayed one waits for room at the cell
    assert runs["j7"].first_start == 150
    assert runs["j5"].preemptions == 1 and runs["j5"].end > runs["j6"].end
    # ... and the small one, borrowed, goes back in its turn for acme's last (within
    # its nominal): two reclaims
    assert runs["j8"].first_start == 3000 and runs["j7"].preemptions == 1
    assert r.stats["counters"]["reclaims"] == 2
    # free chips by why: nothing waited (0-3 s), then only j5, too big for them (100-150 s)
    idle = r.stats["idle_by_cause"]
    assert {k for k, v in idle.items() if v} == {"queue_empty", "blocks_too_few"}
    # without quotas, the pod was full once beta's jobs came
    plain = simulate(jobs, SimConfig()).stats["idle_by_cause"]
    assert {k for k, v in plain.items() if v} == {"queue_empty"}


# acme and beta share a cohort; solo has 64 chips and nobody to borrow from.
SHARERS = (
    Quota("acme", {"tpu": 2048}, cohort="lab"),
    Quota("beta", {"tpu": 2048}, cohort="lab"),
    Quota("solo", {"tpu": 64}),
)
# All three start at once (15 blocks left free); acme then asks for 3,072 chips (above
# its nominal, more than it may borrow while it holds 2,048) and solo for a second block.
REFUSED = """arrival,tenant,shape,twisted,duration,priority,preemption
0,beta,8x8x16,false,1000,50,delay
0,acme,8x16x16,false,1000,50,delay
0,solo,4x4x4,false,1000,50,delay
100,acme,12x16x16,false,1000,50,delay
200,solo,4x4x4,false,1000,50,delay
1500,beta,4x4x4,false,10,50,delay
"""


def test_idle_chip_seconds_the_quotas_leave_free_are_what_a_hand_count_gives():
    jobs, bad = parse_trace(REFUSED, FABRIC)
    assert not bad
    r = simulate(jobs, SimConfig(quotas=SHARERS))
    starts = {j.trace.job_id: j.first_start for j in r.jobs}
    assert starts == {"j2": 0, "j3": 0, "j4": 0, "j5": 1000, "j6": 1000, "j7": 1500}
    free = 15 * 64  # chips of the whole free blocks while the first three run
    expected = {
        "queue_empty": free * 100 + free * 500,  # 0-100 s, and 1000-1500 s
        # 100-200 s: acme's job waits, needs 48 blocks, and is larger than acme's nominal
        "jobs_above_nominal": free * 100,
        # 200-1000 s: a free block would hold solo's job, which its quota refuses
        "quota": free * 800,
    }
    healthy = 4096 * 1500
    got = {k: round(v * healthy) for k, v in r.stats["idle_by_cause"].items() if v}
    assert got == expected
    # without quotas acme's job waits 100-1000 s for blocks, and solo's second starts at
    # once (and ends at 1200 s)
    plain = simulate(jobs, SimConfig()).stats["idle_by_cause"]
    got = {k: round(v * healthy) for k, v in plain.items() if v}
    assert got == {
        "queue_empty": free * 100 + free * 200 + (free + 64) * 300,
        "blocks_too_few": free * 100 + (free - 64) * 800,
    }


# beta's j3 (priority 60) is reclaimed for acme's j4 (priority 10); j5's arrival makes
# the cell look at the queue again while j4 runs and only j4 would give way to j3.
SHIELD = """arrival,tenant,shape,twisted,duration,priority,preemption
0,beta,16x16x8,false,36000,90,terminate
1,beta,16x16x8,false,36000,60,delay
100,acme,16x16x8,false,3600,10,delay
200,other,4x4x4,false,60,5,delay
"""


def test_a_reclaimed_job_is_not_offered_where_only_its_reclaimer_would_give_way():
    """As the service's cell (lightpath.domain.slices.shields through choice.choose): the
    job a reclaim sent back is not forwarded to the pod where only the job that
    reclaimed from it has lower priority (the pod would refuse it), and runs again when
    that job ends."""
    jobs, bad = parse_trace(SHIELD, FABRIC)
    assert not bad
    quotas = (
        Quota("acme", {"tpu": 6144}, cohort="lab"),
        Quota("beta", {"tpu": 2048}, cohort="lab"),
    )
    r = simulate(jobs, SimConfig(quotas=quotas, restart_s=300))
    runs = {j.trace.job_id: j for j in r.jobs}
    assert runs["j4"].first_start == 100 and runs["j4"].preemptions == 0
    assert runs["j3"].preemptions == 1 and r.stats["counters"]["reclaims"] == 1
    assert r.stats["counters"].get("cell_refusals", 0) == 0
    assert runs["j3"].end > runs["j4"].end  # it ran again once j4 gave its blocks back
    assert all(j.state == "COMPLETED" for j in r.jobs)


# Two pods of 64 blocks. acme's j5 (48 blocks, within its nominal) finds no pod with
# room and nobody borrowing: pod-1 (32 blocks free, the closest) is held for it. gamma's
# j6 would borrow: it stays off pod-1 and waits for room on pod-0.
HOLD = """arrival,tenant,shape,twisted,duration,priority,preemption
0,acme,16x16x4,false,1000,50,delay
1,acme,16x16x8,false,5000,50,delay
2,beta,16x16x8,false,50000,50,delay
10,acme,16x16x12,false,3600,50,delay
20,gamma,16x16x8,false,20000,50,delay
"""


@pytest.mark.parametrize("holds", [True, False])
def test_a_pod_is_held_for_an_owners_job_no_pod_has_room_for(holds, monkeypatch):
    """quota.Hold, as the service's cell. Either way j5 starts when j3 leaves pod-1;
    without the hold, j6 borrows pod-1's free blocks meanwhile and is reclaimed then
    (its restart paid), with it j6 starts on pod-0 once j2 leaves it."""
    monkeypatch.setattr(engine, "HOLDS", holds)
    jobs, bad = parse_trace(HOLD, FABRIC)
    assert not bad
    quotas = (
        Quota("acme", {"tpu": 6144}, cohort="lab"),
        Quota("beta", {"tpu": 2048}, cohort="lab"),
        Quota("gamma", {"tpu": 0}, cohort="lab"),
    )
    r = simulate(jobs, SimConfig(quotas=quotas, pods=2, restart_s=300))
    runs = {j.trace.job_id: j for j in r.jobs}
    assert runs["j5"].first_start == 5001 and runs["j5"].preemptions == 0
    if holds:
        assert r.stats["counters"]["holds"] == 1
        assert runs["j6"].first_start == 1000 and runs["j6"].pod == 0
        assert runs["j6"].preemptions == 0 and not r.stats["counters"].get("reclaims")
    else:
        assert runs["j6"].first_start == 20 and runs["j6"].preemptions == 1
        assert r.stats["counters"]["reclaims"] == 1 and "holds" not in r.stats["counters"]
    assert all(j.state == "COMPLETED" for j in r.jobs)


def test_without_a_cohort_nothing_is_borrowed():
    jobs, _ = parse_trace(BURST, FABRIC)
    alone = (Quota("acme", {"tpu": 3072}), Quota("beta", {"tpu": 1024}))
    r = simulate(jobs, SimConfig(quotas=alone))
    runs = {j.trace.job_id: j for j in r.jobs}
    # beta's second job waits for its first: 1024 chips is all it may hold
    assert runs["j2"].first_start == 0
    assert runs["j3"].first_start == pytest.approx(36000)
    assert runs["j6"].first_start == 100
    assert r.stats["counters"].get("reclaims", 0) == 0


@pytest.mark.parametrize("pods", [1, 2])
def test_quota_accounting_and_pod_invariants_hold_with_failures(pods, monkeypatch):
    gen = Generator(load=0.95, jobs=100, seed=5, tenants=3, max_duration_s=6 * 3600)
    jobs = gen.generate(FABRIC)
    quotas = (
        Quota("t1", {"tpu": 2048}, cohort="c"),
        Quota("t2", {"tpu": 1024}, cohort="c", borrowing_limit={"tpu": 1024}),
        Quota("t3", {"tpu": 1024}, cohort="c", lending_limit={"tpu": 256}),
    )
    seen: list[engine.Sim] = []
    real_record = engine.Sim._record

    def record(self):
        real_record(self)
        q = self.quota
        for pod in self.model.pods:
            check_pod(pod.state)
        held: dict[str, int] = {}
        for tenant, chips in q.admitted.values():
            held[tenant] = held.get(tenant, 0) + chips
        for tenant in ("t1", "t2", "t3"):
            assert q.book.usage(tenant, "tpu") == held.get(tenant, 0)
        # a borrowing limit is never passed
        assert q.book.borrowed("t2", "tpu") <= 1024
        seen.append(self)

    monkeypatch.setattr(engine.Sim, "_record", record)
    cfg = SimConfig(
        quotas=quotas, pods=pods, failures=Failures.from_availability(0.995, 3600), seed=2
    )
    r = simulate(jobs, cfg)
    assert seen and all(j.state in ENDED for j in r.jobs)
    assert not seen[-1].quota.admitted  # every admitted job gave its quota back


def test_quota_files_are_checked_with_the_entry_and_field(tmp_path):
    good = tmp_path / "q.json"
    good.write_text(json.dumps([{"tenant": "acme", "tpu_chips": 512, "cohort": "lab"}]))
    assert load_quotas(good) == [Quota("acme", {"tpu": 512}, cohort="lab")]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"tenant": "acme", "tpu_chips": -1}]))
    with pytest.raises(ValueError, match=r"entry 1 \(acme\): nominal\[tpu\]: must be 0 to"):
        load_quotas(bad)
    bad.write_text(json.dumps([{"tenant": "acme", "gpus": 1}]))
    with pytest.raises(ValueError, match="unknown field"):
        load_quotas(bad)


def test_the_cli_takes_quotas_and_names_a_bad_file(tmp_path, capsys):
    from lightpath.cli import main as cli_main

    good = tmp_path / "q.json"
    good.write_text(json.dumps([{"tenant": "t1", "tpu_chips": 1024, "cohort": "c"}]))
    code = cli_main(["sim", "run", "--jobs", "30", "--quotas", str(good), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["runs"][0]["quotas"]["tenants"]["t1"]["nominal_chips"] == 1024
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(SystemExit) as stop:
        cli_main(["sim", "run", "--jobs", "5", "--quotas", str(bad)])
    assert stop.value.code == 2
    assert f"--quotas {bad}: Expecting property name" in capsys.readouterr().err
