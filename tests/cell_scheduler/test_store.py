"""The cell's Redis scripts on a real Redis: heartbeats apply each transition once and in
order, capacity never goes back to an older report, holds are counted exactly, a silent
pod's jobs turn UNKNOWN and back (CS-1, CS-6, X-5)."""

from __future__ import annotations

import asyncio

import pytest

from lightpath_services.cell_scheduler.store import (
    CHANGED,
    STALE,
    UNKNOWN_POD,
    CellStore,
    Conflict,
    pad_id,
    unpad_id,
)
from lightpath_services.common.keys import cell_key

POD = "pod-s"


@pytest.fixture
def store(redis_client) -> CellStore:
    return CellStore(redis_client)


def tr(stream_id: str, job: str, seq: int, to: str, frm: str = "") -> list:
    return [stream_id, job, seq, frm, to, 1000 + seq, f"{frm}->{to}"]


async def report(
    store: CellStore,
    *,
    after="0-0",
    until="0-0",
    trs=(),
    free=8,
    version="5-0",
    now_ms=10_000,
    assume_ms=60_000,
):
    return await store.report(
        POD,
        endpoint="127.0.0.1:1",
        now_ms=now_ms,
        capacity_b64="cap-" + version,
        version=version,
        free={"tpu": free},
        after=after,
        until=until,
        transitions=list(trs),
        assume_ms=assume_ms,
    )


async def place(
    store: CellStore,
    job: str,
    pod: str = POD,
    needs=None,
    *,
    state: str = "RUNNING",
    shown: str = "",
    n: int = 3,
    fields=None,
    now_ms: int = 1,
) -> None:
    """Forward `job` to `pod` and place it there in the pod's `state`; the cell then shows
    `shown` (default: that state)."""
    needs = needs or {"tpu": 2}
    await store.claim_new(
        job,
        fields={"req": "r", "priority": 50},
        tenant="t",
        pod=pod,
        needs=needs,
        token="tok",
        until_ms=99_999,
        now_ms=now_ms,
        check_free=False,
        reason="forwarding",
    )
    placed = await store.placed(
        job,
        token="tok",
        pod=pod,
        state=state,
        n=n,
        reason="wired",
        fields=fields or {},
        now_ms=now_ms + 1,
    )
    assert placed is not None and placed.phase == "PLACED" and placed.state == (shown or state)


def test_stream_ids_compare_as_ids_once_padded():
    assert pad_id("9-1") < pad_id("10-0") < pad_id("10-2") and pad_id("") == pad_id("0-0")
    assert unpad_id(pad_id("1700000000000-42")) == "1700000000000-42"


async def test_an_unknown_pod_must_register_first(store):
    with pytest.raises(Conflict) as err:
        await report(store)
    assert err.value.reason == UNKNOWN_POD
    await store.register(POD, "reg", "127.0.0.1:1", 5, "3-0")
    assert (
        await report(store, after="3-0")
    ).ack == "3-0"  # registration set where transitions start


async def test_transitions_apply_once_in_order_and_a_gap_is_refused(store):
    await store.register(POD, "reg", "127.0.0.1:1", 5, "0-0")
    await place(store, "j")
    # A report that starts after what the cell acknowledged would skip transitions: refused.
    ack = (await report(store, after="7-0", until="9-0", trs=[tr("8-0", "j", 4, "COMPLETED")])).ack
    assert ack == "0-0" and (await store.job("j")).state == "RUNNING"
    # From the acknowledged id: applied; older or repeated numbers change nothing.
    trs = [tr("6-0", "j", 2, "WIRING"), tr("8-0", "j", 4, "SUSPENDED", "RUNNING")]
    ack = (await report(store, after="0-0", until="8-0", trs=trs)).ack
    rec = await store.job("j")
    assert ack == "8-0" and (rec.state, rec.n) == ("SUSPENDED", 4)
    ack = (await report(store, after="0-0", until="8-0", trs=[tr("6-0", "j", 2, "WIRING")])).ack
    assert ack == "8-0" and (await store.job("j")).state == "SUSPENDED"
    # The end of the job takes it off the pod's live set.
    await report(store, after="8-0", until="9-0", trs=[tr("9-0", "j", 5, "CANCELLED", "SUSPENDED")])
    assert (await store.job("j")).state == "CANCELLED" and await store.live_jobs(POD) == []


async def test_transitions_of_other_pods_or_unplaced_jobs_are_ignored(store):
    await store.register(POD, "reg", "127.0.0.1:1", 5, "0-0")
    await store.register("other", "reg", "127.0.0.1:2", 5, "0-0")
    await place(store, "elsewhere", pod="other")
    await report(store, until="2-0", trs=[tr("2-0", "elsewhere", 9, "FAILED")])
    assert (await store.job("elsewhere")).state == "RUNNING"


async def test_a_pod_running_a_job_the_cell_has_elsewhere_is_asked_about_it(store):
    """A pod reporting a job the cell has queued, ended or on another pod (a forward whose
    answer was lost and which found nothing there when asked, then arrived after all; CI
    saw such a job cancelled in the cell queue stay RUNNING, wired, on its pod): the
    report applies nothing of it, and marks the pod as one that may have it, for the
    recovery to adopt the job there or cancel the duplicate. An end, or the pod's own
    release of a job to the cell queue, asks nothing."""
    await store.register(POD, "reg", "127.0.0.1:1", 5, "0-0")
    await store.register("other", "reg", "127.0.0.1:2", 5, "0-0")
    await place(store, "elsewhere", pod="other")
    await _queue(store, "queued", 50, 2_000)
    await _queue(store, "cancelled", 50, 2_000)
    await store.end_queued("cancelled", "CANCELLED", "cancelled in the cell queue", 2_100)
    await _queue(store, "ended-there", 50, 2_000)
    await report(
        store,
        until="5-0",
        trs=[
            tr("2-0", "elsewhere", 2, "WIRING", "PENDING"),
            tr("3-0", "queued", 2, "RUNNING", "WIRING"),
            tr("4-0", "cancelled", 1, "PENDING"),
            tr("5-0", "ended-there", 3, "COMPLETED", "RUNNING"),
        ],
    )
    assert sorted(await store.maybe_jobs()) == ["cancelled", "elsewhere", "queued"]
    for job in ("cancelled", "elsewhere", "queued"):
        assert (await store.job(job)).maybe == (POD,), job
    elsewhere = await store.job("elsewhere")
    assert (elsewhere.pod, elsewhere.state, elsewhere.phase) == ("other", "RUNNING", "PLACED")
    assert (await store.job("queued")).phase == "QUEUED"
    assert (await store.job("cancelled")).state == "CANCELLED"
    await report(store, after="5-0", until="6-0", trs=[released("6-0", "ended-there", 4)])
    assert (await store.job("ended-there")).maybe == ()


async def test_capacity_never_goes_back_to_an_older_report(store):
    await store.register(POD, "reg", "127.0.0.1:1", 5, "0-0")
    await report(store, free=6, version="20-0")
    await report(store, free=8, version="19-5")  # a slower replica's older snapshot
    snap = await store.snapshot()
    assert snap.free[f"{POD}|tpu"] == 6 and snap.capacities[POD] == "cap-20-0"
    await report(store, free=7, version="20-1")
    assert (await store.snapshot()).free[f"{POD}|tpu"] == 7


async def test_holds_count_forwards_in_flight_and_go_when_they_end(store):
    await store.register(POD, "reg", "127.0.0.1:1", 5, "0-0")
    await report(store, free=4)
    claim = dict(
        fields={"req": "r", "priority": 50},
        tenant="t",
        pod=POD,
        needs={"tpu": 3},
        until_ms=99_999,
        now_ms=1,
        check_free=True,
        reason="forwarding",
    )
    assert (await store.claim_new("a", token="ta", **claim)).seq >= 1
    # 4 free, 3 held: a second 3-block forward to the same pod is refused as stale.
    with pytest.raises(Conflict) as err:
        await store.claim_new("b", token="tb", **claim)
    assert err.value.reason == STALE
    assert (await store.snapshot()).held[f"{POD}|tpu"] == 3
    assert await store.unbind(
        "a", token="ta", pod=POD, uncertain=False, version="5-0", reason="refused", now_ms=2
    )
    snap = await store.snapshot()
    assert snap.held[f"{POD}|tpu"] == 0 and snap.queue == ["a"]
    rec = await store.job("a")
    assert rec.phase == "QUEUED" and rec.refused == {POD: "5-0"}
    assert (await store.claim_new("b", token="tb", **claim)).seq >= 1
    # Placing it: the hold goes, and the blocks count as taken until the pod reports.
    placed = await store.placed(
        "b", token="tb", pod=POD, state="RUNNING", n=3, reason="wired", fields={}, now_ms=3
    )
    assert placed.needs == {"tpu": 3}
    snap = await store.snapshot()
    assert snap.held[f"{POD}|tpu"] == 0 and snap.free[f"{POD}|tpu"] == 1
    # A token that no longer holds a job changes nothing.
    assert (
        await store.placed(
            "b", token="tb", pod=POD, state="RUNNING", n=3, reason="x", fields={}, now_ms=4
        )
        is None
    )
    # Completed through the cell: its blocks count as free again at once.
    m = await store.mirror(
        "b", pod=POD, state="COMPLETED", n=4, reason="done", now_ms=5, ended_here=True
    )
    assert m.applied and m.freed and m.queued == 1 and m.record.state == "COMPLETED"
    assert (await store.snapshot()).free[f"{POD}|tpu"] == 4
    # An older answer never overwrites a newer state.
    m = await store.mirror("b", pod=POD, state="RUNNING", n=3, reason="old", now_ms=6)
    assert not m.applied and m.record.state == "COMPLETED"
    assert (await store.job("b")).state == "COMPLETED"


async def free_now(store: CellStore) -> int:
    """Free blocks of POD as a claim counts them: reported (corrected), minus in flight."""
    snap = await store.snapshot()
    return snap.free[f"{POD}|tpu"] - snap.held.get(f"{POD}|tpu", 0)


async def test_a_report_read_before_a_placement_never_gives_its_blocks_back(store):
    # The pod's heartbeat reads its state (version 5-0: 8 free) just before it admits a
    # job; the cell records the placement (6 free) and only then gets that heartbeat.
    await store.register(POD, "reg", "127.0.0.1:1", 5, "0-0")
    await report(store, free=8, version="5-0")
    await place(store, "j")
    assert await free_now(store) == 6
    await report(store, free=8, version="5-0")  # the same state again, sent late
    assert await free_now(store) == 6
    await report(store, free=8, version="6-0")  # newer, but from before the admission
    assert await free_now(store) == 6
    # The report that carries the admission (its WIRING event, 7-0) and a state at or past
    # it shows the blocks taken: from then on the pod's word is the truth.
    await report(store, free=6, version="7-0", until="7-0", trs=[tr("7-0", "j", 2, "WIRING")])
    assert await free_now(store) == 6
    await report(store, free=7, version="8-0", after="7-0", until="7-0")
    assert await free_now(store) == 7


async def test_a_report_that_shows_a_forward_in_flight_does_not_count_it_twice(store):
    await store.register(POD, "reg", "127.0.0.1:1", 5, "0-0")
    await report(store, free=8, version="5-0")
    claim = dict(
        fields={"req": "r", "priority": 50},
        tenant="t",
        pod=POD,
        until_ms=99_999,
        now_ms=1,
        check_free=True,
        reason="forwarding",
    )
    assert (await store.claim_new("a", token="ta", needs={"tpu": 2}, **claim)).seq >= 1
    assert await free_now(store) == 6
    # The pod admitted it and reported before the cell heard the answer: 6 free there,
    # and the forward still held by the cell. Six blocks are free, not four.
    await report(store, free=6, version="7-0", until="7-0", trs=[tr("7-0", "a", 2, "WIRING")])
    assert await free_now(store) == 6
    assert (await store.claim_new("b", token="tb", needs={"tpu": 6}, **claim)).seq >= 1
    assert await free_now(store) == 0
    placed = await store.placed(
        "a", token="ta", pod=POD, state="RUNNING", n=3, reason="wired", fields={}, now_ms=2
    )
    assert placed is not None and await free_now(store) == 0
    # Refused after all: its blocks are free again, and a later report needs no correction.
    assert await store.unbind(
        "b", token="tb", pod=POD, uncertain=False, version="7-0", reason="refused", now_ms=3
    )
    assert await free_now(store) == 6
    await report(store, free=6, version="8-0", after="7-0", until="7-0")
    assert await free_now(store) == 6


async def test_an_end_through_the_cell_stands_until_a_report_shows_it(store):
    await store.register(POD, "reg", "127.0.0.1:1", 5, "0-0")
    await report(store, free=8, version="5-0")
    await place(store, "j")
    await report(store, free=6, version="7-0", until="7-0", trs=[tr("7-0", "j", 2, "WIRING")])
    m = await store.mirror(
        "j", pod=POD, state="COMPLETED", n=4, reason="done", now_ms=5, ended_here=True
    )
    assert m.applied and m.freed and await free_now(store) == 8
    # A heartbeat read while the job still ran, arriving after the end: still 8 free.
    await report(store, free=6, version="8-0", after="7-0", until="7-0")
    assert await free_now(store) == 8
    await report(
        store,
        free=8,
        version="9-0",
        after="7-0",
        until="9-0",
        trs=[tr("9-0", "j", 4, "COMPLETED", "RUNNING")],
    )
    assert await free_now(store) == 8
    await report(store, free=5, version="10-0", after="9-0", until="9-0")
    assert await free_now(store) == 5  # nothing assumed any more: the report is the truth


async def test_an_assumption_no_report_shows_lasts_only_its_time(store):
    # (The pod lost the events that would show it, say: the report is the truth again.)
    await store.register(POD, "reg", "127.0.0.1:1", 5, "0-0")
    await report(store, free=8, version="5-0", now_ms=3)
    await place(store, "j")
    await report(store, free=8, version="6-0", now_ms=1_000, assume_ms=1_000)
    assert await free_now(store) == 6
    await report(store, free=8, version="7-0", now_ms=1_003, assume_ms=1_000)
    assert await free_now(store) == 8


async def test_a_silent_pod_s_jobs_show_unknown_and_come_back_when_it_reports(store):
    await store.register(POD, "reg", "127.0.0.1:1", 5, "0-0")
    await report(store)  # seen at 10 000
    await place(store, "live")
    assert await store.mark_down(POD, 12_000, 5_000) == -1  # not silent yet
    assert await store.mark_down(POD, 16_000, 5_000) == 1
    assert await store.mark_down(POD, 17_000, 5_000) == -1  # marked once
    rec = await store.job("live")
    assert rec.state == "UNKNOWN" and "last known: RUNNING" in rec.reason
    # Heard again: its jobs show their state again, then the transitions it reports apply.
    reported = await report(store, until="4-0", trs=[tr("4-0", "live", 4, "SUSPENDED")])
    rec = await store.job("live")
    assert reported.returned and rec.state == "SUSPENDED"
    history = [(e["from"], e["to"]) for e in await store.history("live")]
    assert ("RUNNING", "UNKNOWN") in history and ("UNKNOWN", "RUNNING") in history


async def test_an_end_the_pod_answers_while_marked_silent_shows_at_once_and_stays(store):
    # The pod cannot report (cut off from its Redis, or from the cell's port) but answers
    # the cell's CompleteJob: the end is known for good, not UNKNOWN until a report (that
    # report would never show it again: the ended job is no longer live).
    await store.register(POD, "reg", "127.0.0.1:1", 5, "0-0")
    await report(store)  # seen at 10 000
    await place(store, "ended")
    await place(store, "running")
    assert await store.mark_down(POD, 16_000, 5_000) == 2
    m = await store.mirror(
        "ended", pod=POD, state="COMPLETED", n=4, reason="completed", now_ms=17_000
    )
    assert m.applied and m.record.state == "COMPLETED"
    # A newer state that is not an end waits for the pod's report, as CS-6 says.
    m = await store.mirror("running", pod=POD, state="SUSPENDED", n=4, reason="s", now_ms=17_001)
    assert m.applied and m.record.state == "UNKNOWN"
    history = [(e["from"], e["to"]) for e in await store.history("ended")]
    assert history[-1] == ("UNKNOWN", "COMPLETED")
    # Heard again: the ended job stays ended, the other shows what the pod last said.
    reported = await report(
        store, until="4-0", trs=[tr("4-0", "ended", 4, "COMPLETED", "RUNNING")], now_ms=18_000
    )
    assert reported.returned
    assert (await store.job("ended")).state == "COMPLETED"
    assert (await store.job("running")).state == "SUSPENDED"


async def test_a_forward_answered_ended_while_the_pod_is_marked_silent_shows_the_end(store):
    # (A take-over asking the pod about a forward finds the job already ended there.)
    await store.register(POD, "reg", "127.0.0.1:1", 5, "0-0")
    await report(store)
    assert await store.mark_down(POD, 16_000, 5_000) == 0
    await place(store, "done", state="COMPLETED", now_ms=16_001)
    await place(store, "on", shown="UNKNOWN", now_ms=16_001)
    await report(store, now_ms=18_000)
    assert [(await store.job(j)).state for j in ("done", "on")] == ["COMPLETED", "RUNNING"]


async def _queue(store: CellStore, job: str, priority: int, now_ms: int) -> None:
    await store.claim_new(
        job,
        fields={"req": f"req-{job}", "priority": priority},
        tenant="t",
        pod="",
        needs={},
        token="",
        until_ms=0,
        now_ms=now_ms,
        check_free=False,
        reason="queued",
    )


async def test_an_update_reorders_the_cell_queue_and_a_decision_on_the_old_request_fails(
    store,
):
    await _queue(store, "a", 50, 1)
    await _queue(store, "b", 40, 2)
    assert [await store.queue_position(j) for j in ("a", "b")] == [1, 2]
    after = await store.update(
        "b",
        phase="QUEUED",
        pod="",
        request="req-b2",
        priority=60,
        spec="",
        reason="updated: priority 40 → 60",
        now_ms=3,
    )
    assert after is not None and after.priority == 60 and after.request_b64 == "req-b2"
    assert after.submitted_b64 == "req-b" and after.first_request_b64 == "req-b"
    assert [await store.queue_position(j) for j in ("b", "a")] == [1, 2]
    events = await store.history("b")
    assert events[-1]["reason"] == "updated: priority 40 → 60" and events[-1]["to"] == "PENDING"
    # a second update keeps the first request as the submit's idempotency key
    again = await store.update(
        "b", phase="QUEUED", pod="", request="req-b3", priority=61, spec="", reason="r", now_ms=4
    )
    assert again is not None and again.submitted_b64 == "req-b"
    # a claim decided on the request before the update is refused; on the new one it holds
    claim = dict(pod=POD, needs={}, token="t1", until_ms=9, now_ms=5, check_free=False, reason="x")
    with pytest.raises(Conflict) as err:
        await store.claim_queued("b", request="req-b2", **claim)
    assert err.value.reason == CHANGED
    await store.claim_queued("b", request="req-b3", **claim)
    # placed (or forwarding) jobs are not changed as queued ones
    assert (
        await store.update(
            "b", phase="QUEUED", pod="", request="z", priority=1, spec="", reason="", now_ms=6
        )
        is None
    )


async def _stored_copies(redis, text: str) -> int:
    """How many times `text` is stored in any of the cell's keys."""
    copies = 0
    async for key in redis.scan_iter("lp:{cell}:*"):
        kind = await redis.type(key)
        if kind == "hash":
            values = list((await redis.hgetall(key)).values())
        elif kind == "list":
            values = await redis.lrange(key, 0, -1)
        elif kind == "stream":
            values = [v for _, f in await redis.xrange(key) for v in f.values()]
        elif kind == "string":
            values = [await redis.get(key)]
        else:
            values = []
        copies += sum(v.count(text) for v in values)
    return copies


async def test_a_cancel_reason_is_stored_once_and_read_back_everywhere(store, redis_client):
    await _queue(store, "c", 50, 1)
    text = "stop " + "x" * 900
    assert await store.end_queued("c", "CANCELLED", text, 2) == "CANCELLED"
    assert await _stored_copies(redis_client, text) == 1
    assert (await store.job("c")).reason == text
    assert (await store.history("c"))[-1]["reason"] == text
    # The stream says which event of which job; the event itself is in the history.
    entries = await store.tail("0-0", block_ms=1)
    assert entries[-1][1] == {"job": "c", "n": "2"}
    assert [e["n"] for e in await store.history("c", 1)] == [2]


# -- quotas (issue 35) ---------------------------------------------------------------


async def _claim(store: CellStore, job: str, tenant: str, quota=None, chips=64) -> int:
    claimed = await store.claim_new(
        job,
        fields={"req": "r", "priority": 50},
        tenant=tenant,
        pod=POD,
        needs={"tpu": 1},
        token="tok",
        until_ms=99_999,
        now_ms=1_000,
        check_free=False,
        reason="forwarding",
        charge={"tpu": chips},
        quota=quota,
    )
    return claimed.seq


async def test_a_charge_holds_from_the_claim_to_the_end_on_every_path(store):
    from lightpath_services.cell_scheduler.quotas import QuotaState

    await _claim(store, "a", "acme")
    await _claim(store, "b", "acme")
    await _claim(store, "c", "acme")
    assert QuotaState.of(await store.quota_rows()).used == {"acme": {"tpu": 192}}
    # back to the queue (a refusal), a placement that ended at once, an end mirrored
    await store.unbind(
        "a", token="tok", pod=POD, uncertain=False, version="1-0", reason="no", now_ms=2_000
    )
    await store.placed(
        "b", token="tok", pod=POD, state="FAILED", n=2, reason="x", fields={}, now_ms=2_000
    )
    await store.placed(
        "c", token="tok", pod=POD, state="RUNNING", n=2, reason="x", fields={}, now_ms=2_000
    )
    assert QuotaState.of(await store.quota_rows()).used == {"acme": {"tpu": 64}}
    await store.mirror("c", pod=POD, state="COMPLETED", n=3, reason="done", now_ms=3_000)
    rows = await store.quota_rows()
    state = QuotaState.of(rows)
    assert state.used == {}
    # decayed usage integrated at each change: 192 chips for 1 s, then 64 for 1 s
    ((value, at),) = state.decayed["acme"].values()
    assert at == 3_000 and 250 < value < 257


async def test_claims_expect_what_their_decision_knew_of_the_quota(store):
    from lightpath_services.cell_scheduler.quota import Quota
    from lightpath_services.cell_scheduler.quotas import QuotaState, to_json
    from lightpath_services.cell_scheduler.store import QUOTA

    before = QuotaState.of(await store.quota_rows())
    await store.put_quota("acme", to_json(Quota("acme", {"tpu": 128})), before.version)
    # a decision from before the quota was set does not hold any more
    with pytest.raises(Conflict) as err:
        await _claim(store, "a", "acme", quota=before.guard("acme"))
    assert err.value.reason == QUOTA
    now = QuotaState.of(await store.quota_rows())
    await _claim(store, "a", "acme", quota=now.guard("acme"))
    # acme's charge moved the version: a second decision over `now` is made again ...
    with pytest.raises(Conflict):
        await _claim(store, "b", "acme", quota=now.guard("acme"))
    # ... but a tenant without a quota never conflicts over others' charges
    await _claim(store, "c", "beta", quota=now.guard("beta"))
    assert QuotaState.of(await store.quota_rows()).used == {
        "acme": {"tpu": 64},
        "beta": {"tpu": 64},
    }


async def test_a_boxs_block_is_kept_from_the_pods_answers_and_cleared_when_it_moves(store):
    """Issue 35: reclaim reads where a sub-block slice's box is (`box`). A placement and
    a followed answer set it; a heartbeat's WIRING -> RUNNING keeps it; any other change
    (delayed, resumed elsewhere) leaves it unknown until the next answer."""

    async def box() -> str:
        ((_, _, f),) = await store.live_fields([POD], ("box",))
        return f.get("box", "")

    await store.register(POD, "reg", "127.0.0.1:1", 5, "0-0")
    await place(store, "b", needs={"tpu#chips": 8}, state="WIRING", n=2, fields={"box": "5"})
    await report(store, until="3-0", trs=[tr("3-0", "b", 3, "RUNNING", "WIRING")])
    assert await box() == "5"
    await report(store, after="3-0", until="4-0", trs=[tr("4-0", "b", 4, "SUSPENDED", "RUNNING")])
    assert await box() == ""
    mirrored = await store.mirror("b", pod=POD, state="RUNNING", n=6, reason="", now_ms=3, box="2")
    assert mirrored.applied and await box() == "2"


def released(stream_id: str, job: str, seq: int) -> list:
    return [stream_id, job, seq, "RUNNING", "SUSPENDED", 1000 + seq, "reclaimed for own", 1]


async def test_a_job_its_pod_let_go_is_queued_again_once_whoever_delivers_it(store, redis_client):
    """Issue 35: the pod's `released` transition puts a placed job back in the cell queue
    at its first place, its charge given back — once: a retried report, the same report
    at two replicas at once, or the pod's answer about the job racing its report."""
    from lightpath_services.cell_scheduler.quotas import QuotaState

    await store.register(POD, "reg", "127.0.0.1:1", 5, "0-0")
    for job in ("a", "b"):
        await _claim(store, job, "acme")
        await store.placed(
            job, token="tok", pod=POD, state="RUNNING", n=2, reason="x", fields={}, now_ms=2_000
        )
    await _queue(store, "later", 50, 2_500)  # submitted after both: queued behind them
    assert QuotaState.of(await store.quota_rows()).used == {"acme": {"tpu": 128}}

    twice = [CellStore(redis_client), CellStore(redis_client)]  # two replicas, one report
    done = await asyncio.gather(
        *(
            s.report(
                POD,
                endpoint="127.0.0.1:1",
                now_ms=3_000,
                capacity_b64="cap",
                version="5-0",
                free={"tpu": 8},
                after="0-0",
                until="4-0",
                transitions=[released("4-0", "a", 3)],
                assume_ms=60_000,
            )
            for s in twice
        )
    )
    assert sorted(d.requeued for d in done) == [0, 1]
    ack = (await report(store, after="0-0", until="4-0", trs=[released("4-0", "a", 3)])).ack
    assert ack == "4-0"  # retried: acknowledged, nothing applied again
    rec = await store.job("a")
    assert (rec.phase, rec.state, rec.pod, rec.reclaimed) == ("QUEUED", "PENDING", "", 1)
    assert "reclaimed on pod pod-s: reclaimed for own" in rec.reason
    assert await redis_client.zrange(cell_key("queue"), 0, -1) == ["a", "later"]
    assert QuotaState.of(await store.quota_rows()).used == {"acme": {"tpu": 64}}
    assert await store.live_jobs(POD) == ["b"]
    back = [e for e in await store.history("a") if e["to"] == "PENDING" and e["from"]]
    assert [(e["from"], e["pod"]) for e in back] == [("RUNNING", POD)]

    # the pod's answer (RELEASED_TO_CELL) and its report, for the other job, in either
    # order: once
    assert await store.requeue_released("b", pod=POD, reason="reclaimed for own", now_ms=3_500)
    assert not await store.requeue_released("b", pod=POD, reason="again", now_ms=3_600)
    late = await report(store, after="4-0", until="5-0", trs=[released("5-0", "b", 3)])
    assert late.requeued == 0 and late.ack == "5-0"
    assert await redis_client.zrange(cell_key("queue"), 0, -1) == ["a", "b", "later"]
    assert QuotaState.of(await store.quota_rows()).used == {}
    assert (await store.job("b")).reclaimed == 1


async def test_a_borrowing_claim_expects_its_pod_not_held_for_another_job(store):
    """quota.Hold in the commit (store.lua's not_held): the claim of a job that would
    borrow fails on the pod held since its decision, not elsewhere; the held job's own
    claim and a claim within nominal go ahead."""
    from lightpath_services.cell_scheduler.store import QUOTA, QuotaGuard

    def guard(borrows: bool) -> QuotaGuard:
        return QuotaGuard("gamma", None, POD, borrows)

    assert await store.hold_pod("owner", POD, "acme", 1_000)
    with pytest.raises(Conflict) as err:
        await _claim(store, "g1", "gamma", quota=guard(True))
    assert err.value.reason == QUOTA and store.job_key("g1") not in await store.redis.keys()
    await _claim(store, "g2", "gamma", quota=guard(False))  # within its nominal: owed
    await _claim(store, "owner", "acme", quota=QuotaGuard("acme", None, POD, True))
    assert await store.release_pod("owner")
    await _claim(store, "g1", "gamma", quota=guard(True))
    assert not await store.release_pod("owner")  # once


async def test_a_job_adopted_after_a_lost_answer_keeps_whom_it_reclaimed_from(store):
    """Issue 35: the jobs a forward reclaims from go on the record with its claim, so a
    job the pod has after all (its answer lost, the job back in the queue) is adopted
    with them (choice.shielded_blocks then never offers those jobs where only it gives
    way)."""
    from lightpath_services.cell_scheduler.quotas import RECLAIM_FIELDS

    await store.claim_new(
        "j", fields={"req": "r", "priority": 10}, tenant="acme", pod="", needs={},
        token="", until_ms=0, now_ms=1_000, check_free=False, reason="queued",
    )  # fmt: skip
    reclaimed = {"rcl": '["b1"]', "rcb": '{"tpu": 2}'}

    async def claim(fields: dict[str, str]) -> None:
        await store.claim_queued(
            "j", pod=POD, needs={"tpu": 2}, token="tok", until_ms=9_000, now_ms=2_000,
            check_free=False, reason="reclaiming", fields=fields,
        )  # fmt: skip

    await claim(reclaimed)
    await store.unbind(
        "j", token="tok", pod=POD, uncertain=True, version="", reason="no answer", now_ms=3_000
    )
    assert await store.adopt(
        "j", pod=POD, state="RUNNING", n=2, reason="found", fields={"pod_state": "RUNNING"},
        now_ms=4_000,
    )  # fmt: skip
    ((_, _, got),) = await store.live_fields([POD], RECLAIM_FIELDS)
    assert {k: got[k] for k in ("rcl", "rcb", "phase")} == {**reclaimed, "phase": "PLACED"}
