"""Issue 35 through the real cell: quotas set over gRPC (TLS), stored in Redis with the
cell's state, honoured by admission, raced by two replicas, seen only by their tenant.

Pods have blocks of 4x4x4 = 64 tpu chips; a job of shape 4x4x4 holds one block.
"""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
import redis.asyncio as aioredis

from lightpath.client import channel
from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import cell_scheduler_pb2_grpc, common_pb2
from lightpath.v1 import workload_scheduler_pb2 as ws
from lightpath_services.cell_scheduler import server as cell_server
from lightpath_services.cell_scheduler.metrics import CellMetrics
from lightpath_services.cell_scheduler.store import QUOTA, CellStore, Conflict
from lightpath_services.common.keys import cell_key
from tests.cell_scheduler.conftest import Cell, cell_stack, rpc_error
from tests.helpers import credentials
from tests.metrics_reader import assert_listed, install, points

PENDING = common_pb2.JOB_STATE_PENDING
RUNNING = common_pb2.JOB_STATE_RUNNING


async def set_quota(cell: Cell, tenant: str, replica: int = 0, **kw) -> cs.TenantQuota:
    return await cell.cells[replica].SetQuota(
        cs.SetQuotaRequest(quota=cs.Quota(tenant=tenant, **kw))
    )


async def quotas(cell: Cell, tenant: str = "") -> dict[str, cs.TenantQuota]:
    resp = await cell.cell.ListQuotas(cs.ListQuotasRequest(tenant=tenant))
    return {q.tenant: q for q in resp.quotas}


def violations(err) -> dict[str, str]:
    return dict(err.field_violations)


@pytest.fixture
async def cell1(redis_url):
    async with cell_stack(redis_url, pods=(("pod-a", 8, "tpu"),)) as c:
        yield c


async def test_bad_quotas_are_refused_naming_the_field_and_leave_nothing(cell1: Cell):
    await set_quota(cell1, "beta", nominal_chips={"tpu": 128}, cohort="team")
    cases = [
        (dict(nominal_chips={"tpu": -1}), "quota.nominal_chips[tpu]", "0 to"),
        (dict(nominal_chips={"gpu": 8}), "quota.nominal_chips[gpu]", "unknown node type"),
        (dict(nominal_chips={"tpu": 1 << 30}), "quota.nominal_chips[tpu]", "0 to"),
        (
            dict(nominal_chips={"tpu": 64}, cohort="team", borrowing_limit={"tpu": 129}),
            "quota.borrowing_limit[tpu]",
            "above the 128 tpu chips",
        ),
        (dict(nominal_chips={"tpu": 64}, borrowing_limit={"tpu": 8}), "quota.borrowing_limit", ""),
        (dict(nominal_chips={"tpu": 64}, weight=-2.0), "quota.weight", ""),
        (dict(nominal_chips={"tpu": 64}, cohort="no good"), "quota.cohort", ""),
    ]
    for kw, field, rule in cases:
        err = await rpc_error(set_quota(cell1, "acme", **kw))
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT, kw
        got = violations(err)
        assert field in got and rule in got[field], (kw, got)
    for name in ("default", "", "a/b"):
        err = await rpc_error(set_quota(cell1, name, nominal_chips={"tpu": 64}))
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "quota.tenant" in violations(err)
    assert set(await quotas(cell1)) == {"beta"}  # nothing of the refused ones was kept
    err = await rpc_error(cell1.cell.DeleteQuota(cs.DeleteQuotaRequest(tenant="acme")))
    assert err.code == grpc.StatusCode.NOT_FOUND


async def test_a_job_over_its_quota_waits_saying_so_and_goes_when_the_quota_allows(cell1: Cell):
    q = await set_quota(cell1, "acme", nominal_chips={"tpu": 128}, no_borrowing=True)
    assert q.quota.no_borrowing and q.quota.nominal_chips["tpu"] == 128
    for i in (1, 2):
        sub = await cell1.submit(f"a{i}", tenant="acme")
        assert sub.job.pod_id == "pod-a"
    third = await cell1.submit("a3", tenant="acme")
    assert third.job.state == PENDING and not third.job.pod_id
    assert "waiting for quota" in third.job.reason, third.job.reason
    assert "over its quota of 128" in third.job.reason and "may not borrow" in third.job.reason
    # another tenant (no quota) is not held back by acme's waiting job
    assert (await cell1.submit("b1", tenant="beta")).job.pod_id == "pod-a"
    row = (await quotas(cell1, "acme"))["acme"]
    assert row.used_chips["tpu"] == 128 and row.waiting_jobs == 1 and row.waiting_for_quota == 1
    assert not row.borrowed_chips
    # one ends: its chips go back to the quota, and the waiting job is admitted
    await cell1.cell.CompleteJob(cs.CompleteCellJobRequest(job_id="a1"))
    await cell1.wait_for(
        lambda: _placed(cell1, "a3"), what="a3 admitted once a1 gave its quota back"
    )
    # a quota raised applies at once, without a restart
    blocked = await cell1.submit("a4", tenant="acme")
    assert "waiting for quota" in blocked.job.reason
    await set_quota(cell1, "acme", nominal_chips={"tpu": 256}, no_borrowing=True)
    await cell1.wait_for(lambda: _placed(cell1, "a4"), what="a4 admitted under the new quota")
    row = (await quotas(cell1, "acme"))["acme"]
    assert row.used_chips["tpu"] == 192
    # a job larger than the quota can ever allow says so
    big = await cell1.submit("a5", (8, 8, 8), tenant="acme")  # 512 chips
    assert "cannot be admitted under its tenant's quota" in big.job.reason
    deleted = await cell1.cell.DeleteQuota(cs.DeleteQuotaRequest(tenant="acme"))
    assert deleted.deleted.quota.nominal_chips["tpu"] == 256
    assert "acme" in await quotas(cell1)  # still listed: it holds chips
    assert not (await quotas(cell1))["acme"].HasField("quota")

    # no longer held back by a quota, the big job waits for room and says so
    async def says_room() -> bool:
        return "quota allows it now; waiting for room" in (await cell1.job("a5")).reason

    await cell1.wait_for(says_room, what="a5's reason: waiting for room")


async def _placed(cell: Cell, job_id: str) -> bool:
    return bool((await cell.job(job_id)).pod_id)


async def test_idle_quota_is_lent_within_a_cohort_and_limits_hold(cell1: Cell):
    await set_quota(cell1, "owner", nominal_chips={"tpu": 256}, cohort="lab")
    await set_quota(
        cell1, "guest", nominal_chips={"tpu": 64}, cohort="lab", borrowing_limit={"tpu": 128}
    )
    for i in range(3):  # 64 nominal + 128 borrowed from the owner's idle quota
        assert (await cell1.submit(f"g{i}", tenant="guest")).job.pod_id == "pod-a"
    over = await cell1.submit("g3", tenant="guest")
    assert "may borrow at most 128" in over.job.reason, over.job.reason
    row = (await quotas(cell1, "guest"))["guest"]
    assert row.used_chips["tpu"] == 192 and row.borrowed_chips["tpu"] == 128
    # the owner still gets its nominal share when it asks: 256 - 128 lent = 128 free
    for i in range(2):
        assert (await cell1.submit(f"o{i}", tenant="owner")).job.pod_id == "pod-a"


async def test_two_replicas_racing_never_admit_beyond_a_quota(redis_url):
    """Each round, one job per replica of a tenant with room for one: exactly one goes."""
    async with cell_stack(redis_url, pods=(("pod-a", 8, "tpu"),), replicas=2) as cell:
        await set_quota(cell, "acme", nominal_chips={"tpu": 64}, no_borrowing=True)
        for r in range(4):
            a, b = await asyncio.gather(
                cell.submit(f"r{r}-0", tenant="acme", replica=0),
                cell.submit(f"r{r}-1", tenant="acme", replica=1),
            )
            placed = [j for j in (a.job, b.job) if j.pod_id]
            assert len(placed) == 1, (a.job.reason, b.job.reason)
            row = (await quotas(cell, "acme"))["acme"]
            assert row.used_chips["tpu"] == 64
            waiting = b.job if a.job.pod_id else a.job
            assert "waiting for quota" in waiting.reason
            for j in (a.job, b.job):
                await cell.cell.CancelJob(cs.CancelCellJobRequest(job_id=j.job_id))
            await cell.wait_for(lambda: _used(cell, "acme", 0), what="acme's chips given back")


async def _used(cell: Cell, tenant: str, chips: int) -> bool:
    row = (await quotas(cell, tenant)).get(tenant)
    return row is not None and row.used_chips.get("tpu", 0) == chips


async def test_a_tenant_sees_its_own_quota_and_usage_only(cell1: Cell):
    await set_quota(cell1, "acme", nominal_chips={"tpu": 128})
    await set_quota(cell1, "secret-co", nominal_chips={"tpu": 256})
    await cell1.submit("s1", tenant="secret-co")
    address = cell1.cell_addresses[0]
    async with channel(address, credentials=credentials("tenant:acme")) as ch:
        acme = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)
        mine = await acme.ListQuotas(cs.ListQuotasRequest())
        assert [q.tenant for q in mine.quotas] == ["acme"]
        assert "secret-co" not in str(mine)
        err = await rpc_error(acme.ListQuotas(cs.ListQuotasRequest(tenant="secret-co")))
        assert err.code == grpc.StatusCode.PERMISSION_DENIED
        for call in (
            acme.SetQuota(cs.SetQuotaRequest(quota=cs.Quota(tenant="acme"))),
            acme.DeleteQuota(cs.DeleteQuotaRequest(tenant="acme")),
        ):
            assert (await rpc_error(call)).code == grpc.StatusCode.PERMISSION_DENIED
    assert (await quotas(cell1))["acme"].quota.nominal_chips["tpu"] == 128


def test_quota_changes_are_audited_naming_the_tenant():
    from lightpath_services.common.audit import resources_of
    from lightpath_services.common.policy import RULES

    for method in ("SetQuota", "DeleteQuota"):
        assert RULES[f"/lightpath.v1.CellScheduler/{method}"].audit
    assert not RULES["/lightpath.v1.CellScheduler/ListQuotas"].audit
    assert resources_of(cs.SetQuotaRequest(quota=cs.Quota(tenant="acme"))) == {
        "quota.tenant": "acme"
    }
    assert resources_of(cs.DeleteQuotaRequest(tenant="acme")) == {"tenant": "acme"}


async def _cli(capsys, *argv: str) -> tuple[int, str]:
    from lightpath.cli import main

    def one() -> int:
        try:
            return main(list(argv))
        except SystemExit as e:  # argparse refusing a flag's value
            return int(e.code or 0)

    capsys.readouterr()
    code = await asyncio.to_thread(one)
    out = capsys.readouterr()
    return code, out.out + out.err


async def test_quota_commands(cell1: Cell, capsys, monkeypatch):
    import json

    monkeypatch.setenv("LIGHTPATH_CELL_ADDR", cell1.cell_addresses[0])
    code, out = await _cli(capsys, "quota", "list")
    assert code == 0 and "no quotas yet" in out, out
    code, out = await _cli(capsys, "quota", "set", "acme", "--tpu-chips", "128", "--no-borrowing")
    assert code == 0 and "quota of acme set" in out and "128 tpu" in out, out
    code, out = await _cli(
        capsys, "quota", "set", "beta", "--tpu-chips", "256", "--cohort", "lab", "-o", "json"
    )
    assert code == 0 and json.loads(out)["quota"]["cohort"] == "lab", out
    await cell1.submit("q1", tenant="acme")
    code, out = await _cli(capsys, "quota", "usage", "-o", "json")
    rows = {r["tenant"]: r for r in json.loads(out)["quotas"]}
    assert rows["acme"]["used_chips"] == {"tpu": 64} and rows["acme"]["quota"]["no_borrowing"]
    assert rows["beta"]["used_chips"] == {} and rows["beta"]["waiting_jobs"] == 0
    code, out = await _cli(capsys, "quota", "list")
    assert "acme" in out and "none" in out and "lab" in out, out
    # mistakes name the flag: non-integer and negative locally, the cell's rules by the cell
    code, out = await _cli(capsys, "quota", "set", "acme", "--tpu-chips", "1.5")
    assert code == 2 and "--tpu-chips" in out and "whole number" in out, out
    code, out = await _cli(capsys, "quota", "set", "acme", "--tpu-chips", "-4")
    assert code == 2 and "--tpu-chips" in out, out
    code, out = await _cli(capsys, "quota", "set", "acme", "--gpu-chips", "8")
    assert code == 1 and "--gpu-chips" in out and "unknown node type" in out, out
    code, out = await _cli(
        capsys, "quota", "set", "acme", "--tpu-chips", "8", "--cohort", "lab", "--borrow", "tpu=999"
    )
    assert code == 1 and "--borrow" in out and "above the 256 tpu chips" in out, out
    code, out = await _cli(capsys, "quota", "delete", "acme", "-o", "json")
    assert code == 0 and json.loads(out)["quota"]["nominal_chips"] == {"tpu": 128}
    code, out = await _cli(capsys, "quota", "delete", "acme")
    assert code == 1 and "NOT_FOUND" in out, out


async def test_lent_quota_is_reclaimed_from_the_borrowers_lowest_priority_job_by_its_policy(
    cell1: Cell,
):
    """The owner's job is of lower priority than every borrower's: only reclaim frees
    room. The borrower's lowest-priority job goes (delayed: its policy — back in the
    cell queue, its quota given back, the pod no longer has it), then, for the next,
    the youngest of the rest (terminated: its policy); no job of the owner's."""
    await set_quota(cell1, "owner", nominal_chips={"tpu": 384}, cohort="lab")
    await set_quota(cell1, "guest", nominal_chips={"tpu": 128}, cohort="lab")
    for i in range(8):  # the whole pod: 128 nominal + 384 borrowed
        low = i == 5
        sub = await cell1.submit(
            f"g{i}",
            tenant="guest",
            priority=60 if low else 90,
            preemption_policy=common_pb2.PREEMPTION_POLICY_DELAY
            if low
            else common_pb2.PREEMPTION_POLICY_TERMINATE,
        )
        assert sub.job.pod_id == "pod-a", sub.job.reason
    assert (await quotas(cell1, "guest"))["guest"].borrowed_chips["tpu"] == 384
    first = await cell1.submit("own-1", tenant="owner", priority=10)
    assert first.job.state == PENDING and "waiting for quota" not in first.job.reason
    await cell1.wait_state("own-1", RUNNING)
    delayed = await cell1.wait_for(lambda: _in_cell_queue(cell1, "g5"), what="g5 requeued")
    # PENDING in the cell queue, saying so (the reclaim's words, or the quota it now waits
    # for, with what became of it)
    assert delayed.state == PENDING and delayed.pod_id == "", delayed
    assert "resumes from its checkpoint" in delayed.reason, delayed.reason
    assert await cell1.pods["pod-a"].job("g5") is None  # released: nothing held there
    await cell1.wait_for(lambda: _used(cell1, "guest", 7 * 64), what="g5's chips given back")
    await cell1.submit("own-2", tenant="owner", priority=10)
    await cell1.wait_state("own-2", RUNNING)
    assert (await cell1.job("g7")).state == common_pb2.JOB_STATE_PREEMPTED
    # the pod's report of g7's end gives its chips back
    await cell1.wait_for(lambda: _used(cell1, "guest", 6 * 64), what="g7's chips given back")
    assert (await quotas(cell1, "owner"))["owner"].used_chips["tpu"] == 128
    states = {f"g{i}": (await cell1.job(f"g{i}")).state for i in range(8)}
    assert [j for j, s in states.items() if s == RUNNING] == ["g0", "g1", "g2", "g3", "g4", "g6"]
    # g5 waits in the cell queue (the pod is full), and goes when room is back
    assert (await cell1.job("g5")).cell_queue_position == 1
    await cell1.cell.CompleteJob(cs.CompleteCellJobRequest(job_id="own-1"))
    back = await cell1.wait_state("g5", RUNNING)
    assert back.pod_id == "pod-a" and "reclaimed" not in back.reason, back


async def test_a_reclaimed_job_is_never_forwarded_where_only_its_reclaimer_would_give_way(
    redis_url,
):
    """The pod's rule (lightpath.domain.slices.shields): a job is never the victim of a job
    it reclaimed quota from. The cell applies it too: the guest's g3 (priority 60) a
    reclaim sent back to the cell queue is not forwarded to pod-a, where only the owner's
    job that reclaimed from it (priority 10) would give way — that forward was refused and
    tried again at each change of pod-a's capacity — but to pod-b once work of lower
    priority runs there, with no refusal on the way."""
    async with cell_stack(redis_url, pods=(("pod-a", 4, "tpu"), ("pod-b", 4, "tpu"))) as cell:
        await set_quota(cell, "owner", nominal_chips={"tpu": 384}, cohort="lab")
        await set_quota(cell, "guest", nominal_chips={"tpu": 128}, cohort="lab")
        for i in range(4):  # pod-a: the guest's, 128 nominal + 128 borrowed
            low = i == 3
            sub = await cell.submit(
                f"g{i}",
                tenant="guest",
                prefer_pod="pod-a",
                priority=60 if low else 90,
                preemption_policy=common_pb2.PREEMPTION_POLICY_DELAY
                if low
                else common_pb2.PREEMPTION_POLICY_TERMINATE,
            )
            assert sub.job.pod_id == "pod-a", sub.job.reason
        for i in range(4):  # pod-b: a tenant without a quota, above the guest's priority
            sub = await cell.submit(f"x{i}", tenant="other", priority=95)
            assert sub.job.pod_id == "pod-b", sub.job.reason
        await cell.submit("own-1", tenant="owner", priority=10)
        await cell.wait_state("own-1", RUNNING)
        assert (await cell.job("own-1")).pod_id == "pod-a"
        await cell.wait_for(lambda: _in_cell_queue(cell, "g3"), what="g3 reclaimed")
        # pod-a reports own-1 running: the work of lower priority than g3's there
        await cell.wait_capacity(
            "pod-a",
            lambda cap: dict(cap.types[0].preemptible_by_priority).get(10) == 1,
            what="pod-a reporting own-1 as preemptible at priority 10",
        )
        redis = aioredis.from_url(redis_url, decode_responses=True)
        try:
            # lower priority work on pod-b: g3 goes there (preempting x3), not to pod-a
            await cell.cell.UpdateJob(_update_priority("x3", 20))
            placed = await cell.wait_state("g3", RUNNING)
            assert placed.pod_id == "pod-b", placed
            assert (await cell.job("x3")).state != RUNNING
            assert not await redis.hget(cell_key("job", "g3"), "refused")  # no forward refused
            assert (await cell.job("own-1")).state == RUNNING
        finally:
            await redis.aclose()


async def test_a_pod_is_held_for_an_owners_job_no_pod_can_make_room_for(
    redis_url, capsys, monkeypatch
):
    """quota.Hold, with two replicas: acme's a3 (3 blocks, within its nominal) finds
    no pod with 3 blocks free and nobody borrowing. One replica holds pod-b, the closest
    (2 free), for it — one hold in Redis, both replicas keep to it: gamma's jobs, which
    would borrow, go to pod-a or wait, through either replica; when a2 leaves pod-b, a3
    starts there, the hold ends, and the waiting gamma job takes pod-b's last block.
    Operators see the hold in ListQuotas, `lightpath quota` and lightpath.cell.pod.held."""
    reader = install(monkeypatch, cell_server, CellMetrics, refresh_s=0.1)
    async with cell_stack(
        redis_url, pods=(("pod-a", 4, "tpu"), ("pod-b", 4, "tpu")), replicas=2
    ) as cell:
        await _before_a_hold(cell)
        await cell.submit("a3", (12, 4, 4), tenant="acme")
        redis = aioredis.from_url(redis_url, decode_responses=True)
        hold_key = cell_key("hold")
        try:

            async def held() -> list[str]:
                got = await redis.hmget(hold_key, ["job", "pod", "tenant"])
                return got if any(got) else []

            assert await cell.wait_for(held, what="a pod held for a3") == ["a3", "pod-b", "acme"]
            await _the_hold_is_seen(cell, capsys, monkeypatch)

            def held_series() -> list[dict[str, str]]:
                return [p.attributes for p in points(reader, "lightpath.cell.pod.held")]

            async def shown() -> bool:
                return held_series() == [{"pod": "pod-b", "tenant": "acme"}]

            await cell.wait_for(shown, what="lightpath.cell.pod.held for pod-b, acme's job")
            g1 = await cell.submit("g1", tenant="gamma", replica=1)
            assert g1.job.pod_id == "pod-a", g1.job.reason  # borrowing: not pod-b
            g2 = await cell.submit("g2", tenant="gamma", replica=0)
            assert not g2.job.pod_id and "pod-b: held for a tenant's job" in g2.job.reason
            # a2 ends: pod-b has a3's room; a3 starts there and the hold ends
            await cell.cell.CompleteJob(cs.CompleteCellJobRequest(job_id="a2"))
            assert (await cell.wait_state("a3", RUNNING)).pod_id == "pod-b"
            await cell.wait_for(lambda: _not(held()), what="the hold ended")
            # pod-b is anyone's again: g2 takes its last free block
            assert (await cell.wait_state("g2", RUNNING)).pod_id == "pod-b"
            assert not (await cell.cell.ListQuotas(cs.ListQuotasRequest())).HasField("hold")

            async def gone() -> bool:
                return not held_series()

            await cell.wait_for(gone, what="lightpath.cell.pod.held gone with the hold")
            assert_listed(reader)
            code, out = await _cli(capsys, "quota", "list", "-o", "json")
            assert code == 0 and json.loads(out)["hold"] is None, out
        finally:
            await redis.aclose()


def test_a_tenant_is_told_of_another_tenants_hold_and_what_it_means_for_it():
    """`lightpath quota` as a tenant whose job the pod is not held for (the cell left
    whose job out): what it means for its own jobs, and for how long."""
    from lightpath.cli.quota import held_pod_text

    hold = cs.PodHold(pod="pod-b")
    hold.since.FromSeconds(1_000)
    text = held_pod_text(hold, now=1_300)
    assert text.startswith("pod pod-b is held for 5m for another tenant's job"), text
    assert "your jobs that would borrow quota go to other pods or wait" in text, text


async def _the_hold_is_seen(cell: Cell, capsys, monkeypatch) -> None:
    """ListQuotas' hold: operators and acme (whose job it is) see for whom; gamma sees
    that pod-b is held, since when, and nothing of acme. The CLI says what it means."""
    hold = (await cell.cell.ListQuotas(cs.ListQuotasRequest())).hold
    assert (hold.pod, hold.job_id, hold.tenant) == ("pod-b", "a3", "acme")
    assert hold.since.seconds > 0
    for tenant, names in (("gamma", ("", "")), ("acme", ("a3", "acme"))):
        async with channel(
            cell.cell_addresses[0], credentials=credentials(f"tenant:{tenant}")
        ) as ch:
            seen = await cell_scheduler_pb2_grpc.CellSchedulerStub(ch).ListQuotas(
                cs.ListQuotasRequest()
            )
        assert (seen.hold.pod, seen.hold.job_id, seen.hold.tenant) == ("pod-b", *names)
        assert seen.hold.since == hold.since
        if tenant == "gamma":
            assert "acme" not in str(seen) and "a3" not in str(seen)
    monkeypatch.setenv("LIGHTPATH_CELL_ADDR", cell.cell_addresses[0])
    code, out = await _cli(capsys, "quota", "list")
    assert code == 0 and "pod pod-b is held for" in out and "for acme's job a3" in out, out
    assert "`lightpath cancel a3` ends the hold" in out, out
    code, out = await _cli(capsys, "quota", "usage", "-o", "json")
    got = json.loads(out)["hold"]
    assert (got["pod"], got["job_id"], got["tenant"]) == ("pod-b", "a3", "acme"), got
    assert got["since"].endswith("Z"), got


async def _before_a_hold(cell: Cell) -> None:
    """acme (6 blocks' nominal), beta (2) and gamma (none) in one cohort; acme's a1 and
    beta's b1 on pod-a (1 block free), acme's a2 on pod-b (2 free)."""
    await set_quota(cell, "acme", nominal_chips={"tpu": 384}, cohort="lab")
    await set_quota(cell, "beta", nominal_chips={"tpu": 128}, cohort="lab")
    await set_quota(cell, "gamma", nominal_chips={"tpu": 0}, cohort="lab")
    for job_id, tenant, chips, pod in (
        ("a1", "acme", (4, 4, 4), "pod-a"),
        ("a2", "acme", (8, 4, 4), "pod-b"),
        ("b1", "beta", (8, 4, 4), "pod-a"),
    ):
        sub = await cell.submit(job_id, chips, tenant=tenant)
        assert sub.job.pod_id == pod, (job_id, sub.job.reason)


async def test_a_borrowing_job_decided_before_a_hold_does_not_land_on_the_held_pod(
    redis_url, monkeypatch
):
    """The race the hold's commit check closes, with two replicas: acme's a3 waits in
    the cell queue; replica 0 decides gamma's g1 (2 blocks, borrowing) for pod-b, the
    only pod with room, and before its claim commits a dispatcher holds pod-b for a3.
    The claim fails (Conflict QUOTA: the store's not_held check) and the submit decides
    again over the hold: g1 waits, off pod-b."""
    conflicts: list[str] = []
    decided = asyncio.Event()  # g1's decision is made: the hold may be set now
    async with cell_stack(
        redis_url, pods=(("pod-a", 4, "tpu"), ("pod-b", 4, "tpu")), replicas=2
    ) as cell:
        await _before_a_hold(cell)
        redis = aioredis.from_url(redis_url, decode_responses=True)
        claim_new, hold_pod = CellStore.claim_new, CellStore.hold_pod

        async def held_after_the_decision(store: CellStore, *args, **kw):
            await decided.wait()
            return await hold_pod(store, *args, **kw)

        async def claim_after_the_hold(store: CellStore, job_id: str, **kw):
            # (a decision over a cached registry without a3 fails on the queue: WAITING)
            if job_id == "g1" and kw.get("pod") and not kw.get("expect_empty_queue"):
                assert kw["pod"] == "pod-b" and not decided.is_set()  # knowing a3, not the hold
                decided.set()
                hold = cell_key("hold")
                await cell.wait_for(lambda: redis.hget(hold, "pod"), what="pod-b held for a3")
                try:
                    return await claim_new(store, job_id, **kw)
                except Conflict as c:
                    conflicts.append(c.reason)
                    raise
            return await claim_new(store, job_id, **kw)

        monkeypatch.setattr(CellStore, "hold_pod", held_after_the_decision)
        monkeypatch.setattr(CellStore, "claim_new", claim_after_the_hold)
        try:
            await cell.submit("a3", (12, 4, 4), tenant="acme", replica=1)
            g1 = await cell.submit("g1", (8, 4, 4), tenant="gamma")
            assert conflicts == [QUOTA]
            assert await redis.hmget(cell_key("hold"), ["job", "pod"]) == ["a3", "pod-b"]
            assert not g1.job.pod_id, g1.job.pod_id
            assert "pod-b: held for a tenant's job" in g1.job.reason, g1.job.reason
            # both leave the cell queue: the hold ends, though no job is left to dispatch
            for job_id in ("g1", "a3"):
                await cell.cell.CancelJob(cs.CancelCellJobRequest(job_id=job_id))
            await cell.wait_for(lambda: _not(redis.exists(cell_key("hold"))), what="the hold ended")
        finally:
            await redis.aclose()


async def _not(value) -> bool:
    return not await value


def _update_priority(job_id: str, priority: int) -> cs.UpdateCellJobRequest:
    req = cs.UpdateCellJobRequest(spec=ws.JobSpec(job_id=job_id, priority=priority))
    req.update_mask.paths.append("priority")
    return req


async def _in_cell_queue(cell: Cell, job_id: str) -> cs.CellJob | None:
    job = await cell.job(job_id)
    return job if job.cell_queue_position > 0 else None


async def test_lent_quota_is_reclaimed_from_the_borrowers_sub_block_slices(redis_url):
    """Sub-block slices (boxes of chips inside one block) are reclaimed as chips of their
    block. Three blocks, all the guest's (128 of them borrowed): a block slice at 95 on
    block 0, 32-chip boxes at 60 on block 2 and at 70 on block 1. The owner's box (at
    10) takes the place of the lowest-priority box only; the owner's block slice then
    takes block 1 whole (its two boxes go) — not block 2, where the owner's own box
    stays, nor the guest's block slice, of higher priority."""
    delay, terminate = common_pb2.PREEMPTION_POLICY_DELAY, common_pb2.PREEMPTION_POLICY_TERMINATE
    async with cell_stack(redis_url, pods=(("pod-a", 3, "tpu"),)) as cell:
        await set_quota(cell, "owner", nominal_chips={"tpu": 128}, cohort="lab")
        await set_quota(cell, "guest", nominal_chips={"tpu": 64}, cohort="lab")
        guest = [
            ("g-blk", (4, 4, 4), 95, terminate),
            ("g-b1", (2, 4, 4), 60, terminate),
            ("g-b2", (2, 4, 4), 60, delay),
            ("g-b3", (2, 4, 4), 70, terminate),
            ("g-b4", (2, 4, 4), 70, delay),
        ]
        blocks = {}
        for job_id, shape, priority, policy in guest:
            sub = await cell.submit(
                job_id, shape, tenant="guest", priority=priority, preemption_policy=policy
            )
            assert sub.job.state == RUNNING, sub.job.reason
            blocks[job_id] = [b.block_id for b in sub.job.pod_job.blocks]
        assert blocks == {"g-blk": [0], "g-b1": [2], "g-b2": [2], "g-b3": [1], "g-b4": [1]}
        assert (await quotas(cell, "guest"))["guest"].borrowed_chips["tpu"] == 128

        box = await cell.submit("o-box", (2, 2, 2), tenant="owner", priority=10)
        assert box.job.state == PENDING and "waiting for quota" not in box.job.reason
        placed = await cell.wait_state("o-box", RUNNING)
        assert placed.pod_job.box.block_id == 2
        taken = await cell.job("g-b2")
        assert "resumes from its checkpoint" in taken.reason, taken.reason
        assert taken.state == PENDING and taken.cell_queue_position > 0, taken

        await cell.submit("o-blk", (4, 4, 4), tenant="owner", priority=10)
        placed = await cell.wait_state("o-blk", RUNNING)
        assert [b.block_id for b in placed.pod_job.blocks] == [1]
        assert (await cell.job("g-b3")).state == common_pb2.JOB_STATE_PREEMPTED
        delayed = await cell.job("g-b4")
        assert delayed.state == PENDING and delayed.cell_queue_position > 0, delayed
        assert await cell.pods["pod-a"].job("g-b4") is None
        for job_id in ("g-blk", "g-b1", "o-box"):
            assert (await cell.job(job_id)).state == RUNNING, job_id


async def test_waiting_tenants_are_served_by_fair_share_before_age(redis_url):
    """Room for one job: the tenant that has used less of the cell goes first, though
    the other's job waited longer."""
    async with cell_stack(redis_url, pods=(("pod-a", 4, "tpu"),)) as cell:
        for tenant in ("heavy", "light"):
            await set_quota(cell, tenant, nominal_chips={"tpu": 192}, no_borrowing=True)
        await cell.submit("h1", (4, 4, 8), tenant="heavy")  # 128 chips, accruing usage
        await cell.submit("f1", tenant="filler")
        await cell.submit("f2", tenant="filler")  # the pod is full
        older = await cell.submit("h2", tenant="heavy")
        newer = await cell.submit("l1", tenant="light")
        assert not older.job.pod_id and not newer.job.pod_id
        assert "waiting for quota" not in older.job.reason + newer.job.reason  # for room
        heavy = (await quotas(cell, "heavy"))["heavy"]
        assert heavy.share > (await quotas(cell, "light"))["light"].share == 0
        await cell.cell.CompleteJob(cs.CompleteCellJobRequest(job_id="f1"))
        await cell.wait_for(lambda: _placed(cell, "l1"), what="light's job given the room")
        assert not (await cell.job("h2")).pod_id


async def test_a_burst_of_one_tenants_submits_is_admitted_whole(redis_url):
    """Every claim of a tenant with a quota moves the version the others expect: the
    losers decide again (each loss is another's admission), none is refused as busy."""
    async with cell_stack(redis_url, pods=(("pod-a", 16, "tpu"),), replicas=2) as cell:
        await set_quota(cell, "acme", nominal_chips={"tpu": 1024})
        subs = await asyncio.gather(
            *(cell.submit(f"burst-{i}", tenant="acme", replica=i % 2) for i in range(16))
        )
        # (the gather raised had any been refused); a few may wait for the blocks the
        # others are being wired on, as without quotas, and go from the cell queue
        for s in subs:
            await cell.wait_for(lambda j=s.job.job_id: _placed(cell, j), what="all placed")
        assert (await quotas(cell, "acme"))["acme"].used_chips["tpu"] == 1024


async def test_a_pod_scoped_quota_holds_back_its_pod_only(redis_url):
    """acme may hold 64 tpu chips on pod-a: its second job there waits saying so, while
    the tenant still runs on pod-b; a pod name the cell does not know is refused."""
    async with cell_stack(redis_url, pods=(("pod-a", 8, "tpu"), ("pod-b", 8, "tpu"))) as cell:
        for kw, rule in (
            (dict(pod="pod-z"), "no pod 'pod-z' is registered; the cell has pod-a, pod-b"),
            (dict(pod="a/b"), "characters"),
            (dict(pod="pod-a", cohort="lab"), ""),
        ):
            err = await rpc_error(set_quota(cell, "acme", nominal_chips={"tpu": 64}, **kw))
            assert err.code == grpc.StatusCode.INVALID_ARGUMENT, kw
            got = violations(err)
            field = "quota.cohort" if "cohort" in kw else "quota.pod"
            assert field in got and rule in got[field], (kw, got)
        assert not (await cell.cell.ListQuotas(cs.ListQuotasRequest())).quotas  # nothing kept
        row = await set_quota(cell, "acme", nominal_chips={"tpu": 64}, pod="pod-a")
        assert row.pod == "pod-a" and row.quota.pod == "pod-a"
        first = await cell.submit("p1", tenant="acme", only_pod="pod-a")
        assert first.job.pod_id == "pod-a"
        held = await cell.submit("p2", tenant="acme", only_pod="pod-a")
        assert not held.job.pod_id and "waiting for quota" in held.job.reason, held.job
        assert "on pod pod-a, 64 over its quota there of 64" in held.job.reason
        # not held back elsewhere: the same tenant runs on pod-b, others on pod-a
        assert (await cell.submit("p3", tenant="acme", prefer_pod="pod-a")).job.pod_id == "pod-b"
        assert (await cell.submit("b1", tenant="beta", only_pod="pod-a")).job.pod_id == "pod-a"
        rows = (await cell.cell.ListQuotas(cs.ListQuotasRequest(tenant="acme"))).quotas
        assert [(r.pod, r.used_chips["tpu"]) for r in rows] == [("", 128), ("pod-a", 64)]
        # its chips on pod-a given back, the waiting job goes there
        await cell.cell.CompleteJob(cs.CompleteCellJobRequest(job_id="p1"))
        await cell.wait_for(lambda: _placed(cell, "p2"), what="p2 admitted on pod-a")
        assert (await cell.job("p2")).pod_id == "pod-a"
        gone = await cell.cell.DeleteQuota(cs.DeleteQuotaRequest(tenant="acme", pod="pod-a"))
        assert gone.deleted.pod == "pod-a"
        err = await rpc_error(cell.cell.DeleteQuota(cs.DeleteQuotaRequest(tenant="acme")))
        assert err.code == grpc.StatusCode.NOT_FOUND  # the cell-wide one never existed


async def test_quota_commands_with_a_pod_scope(cell1: Cell, capsys, monkeypatch):
    import json

    monkeypatch.setenv("LIGHTPATH_CELL_ADDR", cell1.cell_addresses[0])
    code, out = await _cli(capsys, "quota", "set", "acme", "--tpu-chips", "64", "--pod", "pod-z")
    assert code == 1 and "--pod" in out and "no pod 'pod-z' is registered" in out, out
    code, out = await _cli(
        capsys, "quota", "set", "acme", "--tpu-chips", "64", "--pod", "pod-a", "--cohort", "lab"
    )
    assert code == 1 and "--cohort" in out and "pod-scoped" in out, out
    code, out = await _cli(capsys, "quota", "set", "acme", "--tpu-chips", "256")
    code, out = await _cli(capsys, "quota", "set", "acme", "--tpu-chips", "64", "--pod", "pod-a")
    assert code == 0 and "quota of acme on pod pod-a set" in out and "pod pod-a" in out, out
    await cell1.submit("q1", tenant="acme")
    code, out = await _cli(capsys, "quota", "usage", "acme", "-o", "json")
    rows = [
        (r["pod"], r["quota"]["nominal_chips"], r["used_chips"]) for r in json.loads(out)["quotas"]
    ]
    assert rows == [("", {"tpu": 256}, {"tpu": 64}), ("pod-a", {"tpu": 64}, {"tpu": 64})], out
    code, out = await _cli(capsys, "quota", "list")
    lines = [line.split() for line in out.splitlines() if line.startswith("acme")]
    assert [line[1:3] for line in lines] == [["cell", "256"], ["pod", "pod-a"]], out
    code, out = await _cli(capsys, "quota", "delete", "acme", "--pod", "pod-a", "-o", "json")
    assert code == 0 and json.loads(out)["pod"] == "pod-a", out
    code, out = await _cli(capsys, "quota", "delete", "acme", "--pod", "pod-a")
    assert code == 1 and "NOT_FOUND" in out, out


async def test_one_dispatch_pass_keeps_a_tenant_within_its_pod_quota(cell1: Cell):
    """Three of acme's jobs wait for room on pod-a, where it may hold 128 chips; room
    for all three comes at once: the pass that plans them claims two."""
    await set_quota(cell1, "acme", nominal_chips={"tpu": 128}, pod="pod-a")
    big = await cell1.submit("b1", (8, 8, 8), tenant="beta", only_pod="pod-a")
    assert big.job.pod_id == "pod-a"
    for i in range(3):
        sub = await cell1.submit(f"a{i}", tenant="acme", only_pod="pod-a")
        assert not sub.job.pod_id and "quota" not in sub.job.reason, sub.job.reason
    await cell1.cell.CompleteJob(cs.CompleteCellJobRequest(job_id="b1"))

    async def settled() -> list[cs.CellJob] | None:
        jobs = [await cell1.job(f"a{i}") for i in range(3)]
        placed = [j for j in jobs if j.pod_id]
        if len(placed) == 2 and any("over its quota there" in j.reason for j in jobs):
            return jobs
        return None

    await cell1.wait_for(settled, what="two of acme's jobs on pod-a, the third held back")
    rows = (await cell1.cell.ListQuotas(cs.ListQuotasRequest(tenant="acme"))).quotas
    assert [(r.pod, r.used_chips["tpu"]) for r in rows] == [("", 128), ("pod-a", 128)]
