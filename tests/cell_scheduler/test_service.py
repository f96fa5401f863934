"""End to end through the cell: real cell_scheduler, workload_schedulers and ocs_managers
over gRPC on a real Redis (CS-1 … CS-6)."""

from __future__ import annotations

import grpc

from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import workload_scheduler_pb2 as ws
from tests.cell_scheduler.conftest import rpc_error

RUNNING, PENDING = c.JOB_STATE_RUNNING, c.JOB_STATE_PENDING


async def test_pods_register_with_their_fabric_and_capacity(cell2):
    pods = await cell2.pods_view()
    assert set(pods) == {"pod-a", "pod-b"}
    a = pods["pod-a"]
    assert a.status == cs.POD_STATUS_READY
    assert a.registration.fabric_kind == c.FABRIC_KIND_OCS_TORUS
    assert list(a.registration.block_shape.dims) == [4, 4, 4]
    assert [(t.node_type, t.blocks) for t in a.registration.node_types] == [("tpu", 8)]
    assert a.registration.endpoint == cell2.pods["pod-a"].ws_address
    (tpu,) = a.capacity.types
    assert (tpu.node_type, tpu.total, tpu.free, tpu.failed) == ("tpu", 8, 8, 0)


async def test_submit_runs_the_job_on_the_pod_with_the_most_free_blocks_wired(cell2):
    # pod-a and pod-b both have 8 free: the tie goes to the pod id; then the other.
    first = await cell2.submit("j1", (8, 8, 4))
    assert first.created and first.job.state == RUNNING and first.job.pod_id == "pod-a"
    assert first.outcome.startswith("placed on pod pod-a")
    blocks = {b.block_id for b in first.job.pod_job.blocks}
    assert len(blocks) == 4 and list(first.job.chips.dims) == [8, 8, 4]
    wiring = await cell2.pods["pod-a"].wiring("j1")
    assert wiring is not None and {p.block_id for p in wiring.blocks} == blocks
    assert wiring.cross_connects
    second = await cell2.submit("j2", (8, 8, 4))
    assert (
        second.job.pod_id == "pod-b"
        and "most free healthy tpu blocks (8)" in second.job.placement_reason
    )
    assert await cell2.pods["pod-b"].wiring("j2") is not None
    assert await cell2.pods["pod-a"].job("j2") is None


async def test_load_spreads_over_the_two_pods(cell2):
    placed = []
    for i in range(6):
        resp = await cell2.submit(f"s{i}", (4, 4, 8))  # 2 blocks each
        assert resp.job.state == RUNNING
        placed.append(resp.job.pod_id)
    assert placed.count("pod-a") == 3 and placed.count("pod-b") == 3
    # 2 free blocks left on each; the registry says so once the pods report.
    await cell2.wait_free("pod-a", "tpu", 2)
    await cell2.wait_free("pod-b", "tpu", 2)


async def test_the_cell_queue_drains_in_priority_order_as_pods_free_blocks(cell2):
    # Both pods full of work nobody may preempt (priority 90).
    for pod in ("a", "b"):
        resp = await cell2.submit(f"full-{pod}", (8, 8, 8), priority=90)
        assert resp.job.state == RUNNING
    waiting = {}
    for name, priority in (("low", 20), ("mid", 50), ("high", 80)):
        resp = await cell2.submit(name, (8, 8, 8), priority=priority)
        assert resp.job.state == PENDING and resp.job.pod_id == ""
        assert resp.outcome.startswith("queued in the cell")
        waiting[name] = resp
    assert (await cell2.job("high")).cell_queue_position == 1
    assert (await cell2.job("mid")).cell_queue_position == 2
    assert (await cell2.job("low")).cell_queue_position == 3
    assert "needs 8 tpu blocks: 0 free" in (await cell2.job("low")).reason

    await cell2.cell.CompleteJob(cs.CompleteCellJobRequest(job_id="full-a"))
    high = await cell2.wait_state("high", RUNNING)
    assert high.pod_id == "pod-a"
    assert (await cell2.job("mid")).state == PENDING
    assert (await cell2.job("mid")).cell_queue_position == 1

    await cell2.cell.CancelJob(cs.CancelCellJobRequest(job_id="full-b", reason="make room"))
    mid = await cell2.wait_state("mid", RUNNING)
    assert mid.pod_id == "pod-b"
    low = await cell2.job("low")
    assert low.state == PENDING and low.cell_queue_position == 1

    await cell2.cell.CompleteJob(cs.CompleteCellJobRequest(job_id="high"))
    assert (await cell2.wait_state("low", RUNNING)).pod_id == "pod-a"


async def test_cancel_frees_the_blocks_and_unwires_the_slice(cell2):
    resp = await cell2.submit("c1", (8, 8, 4))
    pod = cell2.pods[resp.job.pod_id]
    assert await pod.wiring("c1") is not None
    done = await cell2.cell.CancelJob(cs.CancelCellJobRequest(job_id="c1", reason="user"))
    assert done.state == c.JOB_STATE_CANCELLED and done.pod_job.state == c.JOB_STATE_CANCELLED
    assert await pod.wiring("c1") is None
    view = await pod.view()
    assert all(not b.job_id for b in view.blocks)
    # Cancelling again answers the cancelled job; completing it is refused.
    again = await cell2.cell.CancelJob(cs.CancelCellJobRequest(job_id="c1"))
    assert again.state == c.JOB_STATE_CANCELLED
    err = await rpc_error(cell2.cell.CompleteJob(cs.CompleteCellJobRequest(job_id="c1")))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION
    # The cell's own record follows (no pod is asked for a list).
    listed = await cell2.cell.ListJobs(cs.ListCellJobsRequest(states=[c.JOB_STATE_CANCELLED]))
    assert [j.job_id for j in listed.jobs] == ["c1"]


async def test_a_job_cancelled_in_the_cell_queue_never_reaches_a_pod(cell2):
    for pod in ("a", "b"):
        await cell2.submit(f"full-{pod}", (8, 8, 8), priority=90)
    await cell2.submit("waiting", (8, 8, 8), priority=10)
    done = await cell2.cell.CancelJob(cs.CancelCellJobRequest(job_id="waiting"))
    assert done.state == c.JOB_STATE_CANCELLED and done.pod_id == ""
    await cell2.cell.CompleteJob(cs.CompleteCellJobRequest(job_id="full-a"))
    await cell2.wait_free("pod-a", "tpu", 8)
    assert (await cell2.job("waiting")).state == c.JOB_STATE_CANCELLED
    assert await cell2.pods["pod-a"].job("waiting") is None
    assert await cell2.pods["pod-b"].job("waiting") is None


async def test_the_same_job_id_submitted_twice_gives_one_job(cell2):
    first = await cell2.submit("once", (8, 8, 4), tenant="acme")
    again = await cell2.submit("once", (8, 8, 4), tenant="acme")
    assert first.created and not again.created
    assert again.job.pod_id == first.job.pod_id and again.job.state == RUNNING
    assert again.outcome.startswith("already submitted: RUNNING")
    holders = [p for p in cell2.pods.values() if await p.job("once") is not None]
    assert [p.pod_id for p in holders] == [first.job.pod_id]
    err = await rpc_error(cell2.submit("once", (8, 8, 8), tenant="acme"))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and err.reason == "JOB_ID_REUSED"


async def test_an_unreachable_pod_is_avoided_its_jobs_show_unknown_and_reconcile(cell2):
    a_job = await cell2.submit("a-job", (8, 8, 4))  # 4 blocks: pod-a by the tie
    b_job = await cell2.submit("b-job", (4, 4, 8))  # 2 blocks: pod-b (8 free > 4)
    assert (a_job.job.pod_id, b_job.job.pod_id) == ("pod-a", "pod-b")
    await cell2.wait_free("pod-b", "tpu", 6)
    await cell2.stop_pod("pod-b")
    # Right away (before the pod timeout) pod-b (6 free) is still the first choice: the
    # forward fails, the pod becomes suspect, and the job goes to the pod that answers.
    moved = await cell2.submit("moved", (8, 8, 4))
    assert moved.job.state == RUNNING and moved.job.pod_id == "pod-a"
    pods = await cell2.pods_view()
    assert pods["pod-b"].status in (cs.POD_STATUS_SUSPECT, cs.POD_STATUS_SILENT)
    cell_events = []
    async for e in cell2.cell.WatchJob(cs.WatchCellJobRequest(job_id="moved")):
        cell_events.append(e)
        if e.to_state == RUNNING:
            break
    reasons = " | ".join(e.reason for e in cell_events)
    assert "pod pod-b did not answer" in reasons, reasons
    # After the timeout: shown silent, never chosen, its job UNKNOWN.
    pods = await cell2.wait_for(lambda: _silent(cell2, "pod-b"), what="pod-b silent")
    assert "no heartbeat" in pods["pod-b"].status_reason
    unknown = await cell2.wait_state("b-job", c.JOB_STATE_UNKNOWN)
    assert "pod pod-b has not answered" in unknown.reason and "RUNNING" in unknown.reason
    listed = await cell2.cell.ListJobs(cs.ListCellJobsRequest(states=[c.JOB_STATE_UNKNOWN]))
    assert [j.job_id for j in listed.jobs] == ["b-job"]
    await cell2.cell.CompleteJob(cs.CompleteCellJobRequest(job_id="a-job"))
    await cell2.wait_free("pod-a", "tpu", 4)
    late = await cell2.submit("late", (4, 4, 4))  # pod-b "has" 6 free, but it is silent
    assert late.job.pod_id == "pod-a"
    # The pod returns (a new process, a new address): registers, its job RUNNING again.
    await cell2.start_pod("pod-b")
    back = await cell2.wait_state("b-job", RUNNING)
    assert back.pod_id == "pod-b" and back.pod_job.state == RUNNING
    pods = await cell2.pods_view()
    assert pods["pod-b"].status == cs.POD_STATUS_READY
    assert pods["pod-b"].registration.endpoint == cell2.pods["pod-b"].ws_address
    # And it is used again: pod-a has 3 free, pod-b 6.
    again = await cell2.submit("again", (4, 4, 4))
    assert again.job.pod_id == "pod-b"


async def _silent(cell, pod_id):
    pods = await cell.pods_view()
    return pods if pods[pod_id].status == cs.POD_STATUS_SILENT else None


async def test_a_higher_priority_goes_where_lower_priority_work_can_give_way(cell2):
    # pod-a: low-priority work; pod-b: work of priority 90. Nothing is free anywhere.
    low = await cell2.submit(
        "low", (8, 8, 8), priority=20, preemption_policy=c.PREEMPTION_POLICY_TERMINATE
    )
    high = await cell2.submit("prod", (8, 8, 8), priority=90)
    assert (low.job.pod_id, high.job.pod_id) == ("pod-a", "pod-b")
    reported = await cell2.wait_capacity(
        "pod-a", lambda cap: cap.types[0].preemptible_by_priority, "pod-a's running work"
    )
    assert dict(reported.capacity.types[0].preemptible_by_priority) == {20: 8}
    prod = await cell2.wait_capacity(
        "pod-b", lambda cap: cap.types[0].preemptible_by_priority, "pod-b's running work"
    )
    assert dict(prod.capacity.types[0].preemptible_by_priority) == {90: 8}
    assert reported.capacity.types[0].free == prod.capacity.types[0].free == 0
    urgent = await cell2.submit("urgent", (8, 8, 4), priority_class=c.PRIORITY_CLASS_HIGH)
    assert urgent.job.state == RUNNING and urgent.job.pod_id == "pod-a"
    assert "lower-priority work there can give up 4 tpu" in urgent.job.placement_reason
    assert [(v.job_id, v.action) for v in urgent.preempted] == [
        ("low", c.PREEMPTION_POLICY_TERMINATE)
    ]
    victim = await cell2.wait_state("low", c.JOB_STATE_PREEMPTED)
    assert "urgent" in victim.reason
    # Nobody may take prod's blocks, nor urgent's at its own priority: a job waits.
    await cell2.wait_capacity(
        "pod-a",
        lambda cap: dict(cap.types[0].preemptible_by_priority) == {80: 4},
        "pod-a reporting urgent's blocks",
    )
    waits = await cell2.submit("waits", (8, 8, 8), priority=80)
    assert waits.job.state == PENDING and "0 held by lower-priority work" in waits.job.reason


async def test_a_shape_derived_from_compute_demand_comes_back_with_the_placement(cell2):
    from google.protobuf.timestamp_pb2 import Timestamp

    deadline = Timestamp()
    deadline.GetCurrentTime()
    deadline.FromSeconds(deadline.seconds + 2 * 3600)
    # 384 TPU v4 chips at 275 TFLOP/s for two hours: 6 blocks of 64 chips.
    demand = cs.ComputeDemand(flops=384 * 275e12 * 7000, deadline=deadline, node_type="tpu")
    resp = await cell2.submit("derived", None, demand=demand, priority=60)
    job = resp.job
    assert job.state == RUNNING and job.shape_derived and job.block_count == 6
    assert list(job.chips.dims) == [4, 8, 12] and list(job.pod_job.chips.dims) == [4, 8, 12]
    assert "derived 4x8x12 tpu chips (6 blocks)" in resp.outcome
    assert job.demand.flops == demand.flops and not job.spec.HasField("shape")
    # The same request again is the same job (the deadline is absolute).
    again = await cell2.submit("derived", None, demand=demand, priority=60)
    assert not again.created and again.job.pod_id == job.pod_id
    # Too much work for the deadline on any pod: the field and the rule.
    big = cs.ComputeDemand(chip_hours=64 * 8 * 2 * 10, deadline=deadline)
    err = await rpc_error(cell2.submit("too-big", None, demand=big))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.field_violations[0][0] == "demand.deadline" and "has 8" in err.field_violations[0][1]


async def test_bad_requests_name_the_field_and_keep_nothing(cell2):
    cases = [
        (dict(chips=None), "spec.shape", "is required"),
        (dict(chips=(6, 4, 4)), "spec.shape.dims[0]", "not a multiple of the block's 4"),
        (dict(chips=(4, 4, 4), node_types=["gpu"]), "spec.node_types[0]", "unknown node type"),
        (dict(chips=(64, 4, 4)), "spec.shape", "needs 16 blocks; the pod has 8"),
        (dict(chips=(4, 4, 4), tenant="no/slash"), "tenant", "must be 1-64 characters"),
        (
            dict(chips=(4, 4, 4), demand=cs.ComputeDemand(chip_hours=1)),
            "spec.shape",
            "must be empty with a demand",
        ),
    ]
    for i, (kw, field, rule) in enumerate(cases):
        err = await rpc_error(cell2.submit(f"bad-{i}", **kw))
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT, (kw, err)
        assert (field, True) in [(f, rule in r) for f, r in err.field_violations], (kw, err)
        assert (await rpc_error(cell2.job(f"bad-{i}"))).code == grpc.StatusCode.NOT_FOUND


async def test_no_capacity_and_asked_not_to_wait_is_resource_exhausted_with_nothing_kept(cell2):
    for pod in ("a", "b"):
        await cell2.submit(f"full-{pod}", (8, 8, 8), priority=90)
    err = await rpc_error(
        cell2.submit(
            "impatient",
            (4, 4, 4),
            when_no_capacity=2,  # WHEN_NO_CAPACITY_FAIL
        )
    )
    assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED and err.reason == "NO_CAPACITY"
    assert "pod-a: needs 1 tpu blocks: 0 free" in err.message
    assert (await rpc_error(cell2.job("impatient"))).code == grpc.StatusCode.NOT_FOUND
    listed = await cell2.cell.ListJobs(cs.ListCellJobsRequest())
    assert "impatient" not in [j.job_id for j in listed.jobs]


async def test_watch_follows_a_job_from_the_cell_queue_to_its_pod_and_its_end(cell2):
    for pod in ("a", "b"):
        await cell2.submit(f"full-{pod}", (8, 8, 8), priority=90)
    await cell2.submit("watched", (8, 8, 4), priority=40)
    events = []

    async def follow():
        async for e in cell2.cell.WatchJob(cs.WatchCellJobRequest(job_id="watched")):
            events.append(e)

    import asyncio

    task = asyncio.ensure_future(follow())
    await cell2.wait_for(lambda: _n(events, 1), what="the first event")
    await cell2.cell.CompleteJob(cs.CompleteCellJobRequest(job_id="full-b"))
    await cell2.wait_state("watched", RUNNING)
    await cell2.cell.CompleteJob(cs.CompleteCellJobRequest(job_id="watched"))
    await asyncio.wait_for(task, 10)
    flow = [(e.pod_id, c.JobState.Name(e.to_state).removeprefix("JOB_STATE_")) for e in events]
    assert flow[0] == ("", "PENDING") and "queued in the cell" in events[0].reason
    assert ("pod-b", "PENDING") in flow  # leaving the cell queue for pod-b
    assert flow[-3:] == [("pod-b", "WIRING"), ("pod-b", "RUNNING"), ("pod-b", "COMPLETED")]


async def _n(events, n):
    return len(events) >= n


async def test_list_by_tenant_state_and_pod_with_pages(cell2):
    for i in range(5):
        await cell2.submit(f"acme-{i}", (4, 4, 4), tenant="acme")
    for i in range(3):
        await cell2.submit(f"zeta-{i}", (4, 4, 4), tenant="zeta")
    await cell2.cell.CompleteJob(cs.CompleteCellJobRequest(job_id="acme-1"))
    seen, token = [], ""
    while True:
        page = await cell2.cell.ListJobs(
            cs.ListCellJobsRequest(tenant="acme", page_size=2, page_token=token)
        )
        assert len(page.jobs) <= 2
        seen += [j.job_id for j in page.jobs]
        token = page.next_page_token
        if not token:
            break
    assert seen == [f"acme-{i}" for i in (4, 3, 2, 1, 0)]  # newest first
    running = await cell2.cell.ListJobs(cs.ListCellJobsRequest(tenant="acme", states=[RUNNING]))
    assert [j.job_id for j in running.jobs] == ["acme-4", "acme-3", "acme-2", "acme-0"]
    assert all(j.tenant == "acme" for j in running.jobs)
    on_b = await cell2.cell.ListJobs(cs.ListCellJobsRequest(pod_id="pod-b"))
    expect = {
        j for j in [*seen, "zeta-0", "zeta-1", "zeta-2"] if (await cell2.job(j)).pod_id == "pod-b"
    }
    assert {j.job_id for j in on_b.jobs} == expect and expect
    err = await rpc_error(cell2.cell.ListJobs(cs.ListCellJobsRequest(page_token="nope")))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_failed_block_reported_through_the_cell_is_replaced_while_the_job_runs(cell2):
    job = (await cell2.submit("resilient", (8, 8, 4))).job
    pod = job.pod_id
    failed = job.pod_job.blocks[1]
    resp = await cell2.cell.ReportBlockHealth(
        cs.ReportCellBlockHealthRequest(
            pod_id=pod, block_id=failed.block_id, health=c.BLOCK_HEALTH_FAILED, reason="ECC"
        )
    )
    assert resp.replacement.job_id == "resilient"
    assert resp.replacement.failed_block_id == failed.block_id
    after = await cell2.job("resilient")
    assert after.state == RUNNING
    by_pos = {tuple(b.position.coords): b.block_id for b in after.pod_job.blocks}
    assert by_pos[tuple(failed.position.coords)] == resp.replacement.new_block_id
    wiring = await cell2.pods[pod].wiring("resilient")
    assert {p.block_id for p in wiring.blocks} == set(by_pos.values())
    await cell2.wait_free(pod, "tpu", 3)  # 8 - 4 held - 1 failed
    err = await rpc_error(
        cell2.cell.ReportBlockHealth(
            cs.ReportCellBlockHealthRequest(
                pod_id="pod-x", block_id=1, health=c.BLOCK_HEALTH_FAILED
            )
        )
    )
    assert err.code == grpc.StatusCode.NOT_FOUND
    err = await rpc_error(
        cell2.cell.ReportBlockHealth(
            cs.ReportCellBlockHealthRequest(pod_id=pod, block_id=99, health=c.BLOCK_HEALTH_FAILED)
        )
    )
    assert err.code == grpc.StatusCode.NOT_FOUND and "0..7" in err.message


async def test_the_block_map_through_the_cell(cell2):
    await cell2.submit("mapped", (8, 8, 4))
    pod = await cell2.cell.GetPod(cs.GetCellPodRequest(pod_id="pod-a", include_view=True))
    assert pod.view.pod_id == "pod-a" and len(pod.view.blocks) == 8
    assert sum(1 for b in pod.view.blocks if b.job_id == "mapped") == 4
    assert pod.cell_jobs == 1 and pod.endpoints == [cell2.pods["pod-a"].ws_address]
    err = await rpc_error(cell2.cell.GetPod(cs.GetCellPodRequest(pod_id="pod-x")))
    assert err.code == grpc.StatusCode.NOT_FOUND
    # The pod's events, relayed: a job ending on pod-a reaches a watcher of pod-a.
    import asyncio

    stream = cell2.cell.WatchPod(cs.WatchCellPodRequest(pod_id="pod-a"))
    first = asyncio.ensure_future(stream.read())
    for i in range(100):  # until the relay follows the pod's stream (it starts "from now")
        await cell2.pods["pod-a"].ws.ReportBlockHealth(
            ws.ReportBlockHealthRequest(
                block_id=7, health=c.BLOCK_HEALTH_FAILED if i % 2 == 0 else c.BLOCK_HEALTH_HEALTHY
            )
        )
        done, _ = await asyncio.wait({first}, timeout=0.1)
        if done:
            break
    event = first.result()
    assert event.block.block_id == 7 and event.block.pod_id == "pod-a"
    stream.cancel()


async def test_the_same_submission_at_two_replicas_at_once_gives_one_job(redis_url):
    import asyncio

    from tests.cell_scheduler.conftest import cell_stack

    async with cell_stack(redis_url, replicas=2) as cell:
        a, b = await asyncio.gather(
            cell.submit("twice", (8, 8, 4), replica=0),
            cell.submit("twice", (8, 8, 4), replica=1),
        )
        assert sorted([a.created, b.created]) == [False, True]
        assert a.job.pod_id == b.job.pod_id and a.job.state == b.job.state == RUNNING
        holders = [p.pod_id for p in cell.pods.values() if await p.job("twice") is not None]
        assert holders == [a.job.pod_id]
        # A reply lost to a client deadline, retried at the other replica: still one job.
        try:
            await cell.cells[0].SubmitJob(
                cs.SubmitJobRequest(
                    spec=ws.JobSpec(job_id="lost-reply", shape=c.Shape(dims=[8, 8, 4]))
                ),
                timeout=0.02,
            )
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        retry = await cell.submit("lost-reply", (8, 8, 4), replica=1)
        assert retry.job.state == RUNNING
        holders = [p.pod_id for p in cell.pods.values() if await p.job("lost-reply") is not None]
        assert holders == [retry.job.pod_id]
        listed = await cell.cells[1].ListJobs(cs.ListCellJobsRequest())
        assert sorted(j.job_id for j in listed.jobs) == ["lost-reply", "twice"]


async def test_two_cell_replicas_place_concurrent_submissions_once_each(redis_url):
    import asyncio

    from tests.cell_scheduler.conftest import cell_stack

    async with cell_stack(redis_url, replicas=2) as cell:
        results = await asyncio.gather(
            *(cell.submit(f"many-{i}", (4, 4, 4), replica=i % 2) for i in range(20))
        )
        running = [r.job for r in results if r.job.state == RUNNING]
        waiting = [r.job for r in results if r.job.state == PENDING]
        assert len(running) == 16 and len(waiting) == 4  # two pods of 8 blocks
        assert all(j.pod_id == "" for j in waiting)
        for pod in cell.pods.values():
            view = await pod.view()
            holders = {b.job_id for b in view.blocks if b.job_id}
            assert holders == {j.job_id for j in running if j.pod_id == pod.pod_id}
        # Freeing four blocks places the four waiting jobs, each once.
        for j in running[:4]:
            await cell.cells[1].CompleteJob(cs.CompleteCellJobRequest(job_id=j.job_id))
        for j in waiting:
            placed = await cell.wait_state(j.job_id, RUNNING)
            others = [p for p in cell.pods.values() if p.pod_id != placed.pod_id]
            assert [await p.job(j.job_id) for p in others] == [None] * len(others)


async def test_validate_only_says_what_would_happen_and_keeps_nothing(cell2):
    resp = await cell2.cells[0].SubmitJob(
        cs.SubmitJobRequest(
            spec=ws.JobSpec(job_id="dry", shape=c.Shape(dims=[8, 8, 4])), validate_only=True
        )
    )
    assert resp.outcome.startswith("would go to pod pod-a") and "placed on blocks" in resp.outcome
    assert resp.job.pod_id == "pod-a" and resp.job.block_count == 4
    assert (await rpc_error(cell2.job("dry"))).code == grpc.StatusCode.NOT_FOUND
    assert await cell2.pods["pod-a"].job("dry") is None
    for pod in ("a", "b"):
        await cell2.submit(f"full-{pod}", (8, 8, 8), priority=90)
    await cell2.submit("waiting", (8, 8, 8), priority=60)
    resp = await cell2.cells[0].SubmitJob(
        cs.SubmitJobRequest(
            spec=ws.JobSpec(job_id="dry2", shape=c.Shape(dims=[8, 8, 8]), priority=70),
            validate_only=True,
        )
    )
    assert resp.outcome.startswith("would wait in the cell queue at position 1")
    assert (await cell2.job("waiting")).cell_queue_position == 1


async def test_registrations_and_reports_are_checked(cell2):
    err = await rpc_error(
        cell2.cell.RegisterPod(
            cs.RegisterPodRequest(
                pod=cs.PodRegistration(pod_id="bad/pod", endpoint="nowhere", node_types=[])
            )
        )
    )
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    fields = [f for f, _ in err.field_violations]
    assert fields[:4] == ["pod.pod_id", "pod.endpoint", "pod.block_shape", "pod.node_types"]
    err = await rpc_error(cell2.cell.ReportPodStatus(cs.ReportPodStatusRequest(pod_id="ghost")))
    assert err.code == grpc.StatusCode.NOT_FOUND and "register" in err.message
    err = await rpc_error(cell2.submit("t", (4, 4, 4), tenant="acme", labels={"tenant": "other"}))
    assert err.field_violations[0][0] == "spec.labels[tenant]"


async def test_malformed_ids_are_invalid_argument_on_every_call(cell2):
    bad = "x{y}"
    calls = [
        cell2.cell.GetJob(cs.GetCellJobRequest(job_id=bad)),
        cell2.cell.CompleteJob(cs.CompleteCellJobRequest(job_id=bad)),
        cell2.cell.CancelJob(cs.CancelCellJobRequest(job_id=bad)),
        cell2.cell.ListJobs(cs.ListCellJobsRequest(tenant=bad)),
        cell2.cell.ListJobs(cs.ListCellJobsRequest(pod_id=bad)),
        cell2.cell.GetPod(cs.GetCellPodRequest(pod_id=bad)),
        cell2.cell.ReportBlockHealth(
            cs.ReportCellBlockHealthRequest(pod_id=bad, block_id=1, health=c.BLOCK_HEALTH_FAILED)
        ),
        cell2.cell.ReportPodStatus(cs.ReportPodStatusRequest(pod_id=bad)),
    ]
    for call in calls:
        err = await rpc_error(call)
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT, err
    err = await rpc_error(_first(cell2.cell.WatchJob(cs.WatchCellJobRequest(job_id=bad))))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    err = await rpc_error(_first(cell2.cell.WatchJob(cs.WatchCellJobRequest(job_id="nope"))))
    assert err.code == grpc.StatusCode.NOT_FOUND


async def _first(stream):
    async for item in stream:
        return item
