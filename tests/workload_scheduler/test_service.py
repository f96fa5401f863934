"""Contract tests: the real workload_scheduler driving the real ocs_manager, real Redis, gRPC."""

from __future__ import annotations

import asyncio

import grpc

from lightpath.v1 import common_pb2 as c
from lightpath.v1 import ocs_manager_pb2
from lightpath.v1 import workload_scheduler_pb2 as ws
from tests.workload_scheduler.conftest import POD, pod_stack, rpc_error

RUNNING, PENDING, SUSPENDED = c.JOB_STATE_RUNNING, c.JOB_STATE_PENDING, c.JOB_STATE_SUSPENDED


def _blocks(job: ws.Job) -> dict[tuple[int, ...], int]:
    return {tuple(b.position.coords): b.block_id for b in job.blocks}


# -- WS-2 admission, WS-6 completion ------------------------------------------------------


async def test_admit_wires_the_slice_and_completion_unwires_it(pod16):
    resp = await pod16.admit("fig2-a", (8, 8, 4), priority_class=c.PRIORITY_CLASS_HIGH)
    job = resp.job
    assert resp.created and job.state == RUNNING and job.priority == 80
    assert list(job.grid.dims) == [2, 2, 1] and list(job.chips.dims) == [8, 8, 4]
    assert len(job.blocks) == 4 and list(job.wrap) == [True, True, True]
    assert [e.to_state for e in job.history] == [PENDING, c.JOB_STATE_WIRING, RUNNING]
    wiring = await pod16.wiring("fig2-a")
    assert {tuple(p.position.coords): p.block_id for p in wiring.blocks} == _blocks(job)
    assert len(wiring.cross_connects) > 0
    view = await pod16.assert_consistent()
    assert sum(1 for b in view.blocks if b.job_id == "fig2-a") == 4

    done = await pod16.ws.CompleteJob(ws.CompleteJobRequest(job_id="fig2-a"))
    assert done.state == c.JOB_STATE_COMPLETED and not done.blocks
    assert await pod16.wiring("fig2-a") is None
    view = await pod16.assert_consistent()
    assert all(not b.job_id for b in view.blocks)
    assert view.jobs_by_state["COMPLETED"] == 1
    again = await pod16.ws.CompleteJob(ws.CompleteJobRequest(job_id="fig2-a"))
    assert again.state == c.JOB_STATE_COMPLETED


async def test_admission_is_idempotent_by_job_id(pod16):
    first = await pod16.admit("same", (4, 4, 8))
    second = await pod16.admit("same", (4, 4, 8))
    assert not second.created and _blocks(second.job) == _blocks(first.job)
    err = await rpc_error(pod16.admit("same", (8, 4, 4)))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and err.reason == "JOB_ID_REUSED"
    view = await pod16.assert_consistent()
    assert sum(1 for b in view.blocks if b.job_id == "same") == 2


async def test_tpu_and_gpu_blocks_two_by_two(redis_url):
    async with pod_stack(redis_url, blocks=8, types="tpu:6,gpu") as pod:
        resp = await pod.admit(
            "mixed",
            shape=c.Shape(dims=[2, 2, 1]),
            unit=c.SHAPE_UNIT_BLOCKS,
            node_type_counts={"tpu": 2, "gpu": 2},
        )
        assert resp.job.state == RUNNING
        by_type = sorted((b.node_type, b.block_id) for b in resp.job.blocks)
        assert [t for t, _ in by_type] == ["gpu", "gpu", "tpu", "tpu"]
        assert {b for t, b in by_type if t == "gpu"} <= {6, 7}
        await pod.assert_consistent()


async def test_bad_requests_name_the_field_and_the_rule(pod16):
    cases = [
        (
            dict(shape=c.Shape(dims=[6, 4, 4])),
            "spec.shape.dims[0]",
            "not a multiple of the block's 4",
        ),
        (dict(shape=c.Shape(dims=[4, 0, 4])), "spec.shape.dims[1]", "must be >= 1"),
        (dict(shape=c.Shape(dims=[4, 4])), "spec.shape.dims", "must have 3 extents"),
        (dict(shape=c.Shape(dims=[16, 16, 8])), "spec.shape", "needs 32 blocks; the pod has 16"),
        (dict(node_types=["tpu"] * 3), "spec.node_types", "one node type per block"),
        (
            dict(shape=c.Shape(dims=[4, 4, 4]), node_types=["xpu"]),
            "spec.node_types[0]",
            "unknown node type 'xpu'",
        ),
        (dict(priority=101), "spec.priority", "must be 1..100"),
        (dict(wrap=[True]), "spec.wrap", "must be empty (torus) or have 3 entries"),
        (
            dict(preemption_policy=c.PREEMPTION_POLICY_SHRINK),
            "spec.shrink_to",
            "needs at least one smaller arrangement",
        ),
        (
            dict(parallelism=c.ParallelismDegrees(data=3, pipeline=1, layer=1)),
            "spec.parallelism",
            "must equal the slice's 128 chips",
        ),
    ]
    for spec, field, rule in cases:
        spec.setdefault("shape", c.Shape(dims=[4, 4, 8]))
        err = await rpc_error(pod16.admit("bad", **spec))
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT, (spec, err)
        assert any(f == field and rule in r for f, r in err.field_violations), (field, err)
    err = await rpc_error(pod16.admit("bad:id"))
    assert err.field_violations[0][0] == "spec.job_id"
    # Nothing of any refused request was kept.
    assert (await rpc_error(pod16.job("bad"))).code == grpc.StatusCode.NOT_FOUND
    view = await pod16.assert_consistent()
    assert not view.jobs_by_state


async def test_unknown_ids_and_wrong_states(pod16):
    assert (await rpc_error(pod16.job("nope"))).code == grpc.StatusCode.NOT_FOUND
    err = await rpc_error(pod16.ws.CompleteJob(ws.CompleteJobRequest(job_id="nope")))
    assert err.code == grpc.StatusCode.NOT_FOUND
    err = await rpc_error(pod16.fail(16))
    assert err.code == grpc.StatusCode.NOT_FOUND and "blocks 0..15" in err.message
    err = await rpc_error(pod16.ws.ReportBlockHealth(ws.ReportBlockHealthRequest(block_id=1)))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    await pod16.admit("big", (16, 16, 4))  # all 16 blocks
    queued = await pod16.admit("waits", (4, 4, 4))
    assert queued.job.state == PENDING and queued.job.queue_position == 1
    err = await rpc_error(pod16.ws.CompleteJob(ws.CompleteJobRequest(job_id="waits")))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and "only a RUNNING job" in err.message
    cancelled = await pod16.ws.CancelJob(ws.CancelJobRequest(job_id="waits", reason="changed mind"))
    assert cancelled.state == c.JOB_STATE_CANCELLED and "changed mind" in cancelled.reason
    err = await rpc_error(pod16.ws.CompleteJob(ws.CompleteJobRequest(job_id="waits")))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION
    await pod16.ws.CompleteJob(ws.CompleteJobRequest(job_id="big"))
    err = await rpc_error(pod16.ws.CancelJob(ws.CancelJobRequest(job_id="big")))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and err.reason == "JOB_ENDED"


# -- WS-4 queue and preemption ---------------------------------------------------------


async def test_queue_starts_in_priority_then_age_order(pod16):
    await pod16.admit("holder", (16, 8, 4), priority=90)  # 8 blocks
    await pod16.admit("holder2", (16, 8, 4), priority=90)  # the other 8
    for job_id, prio in [("low-old", 20), ("mid", 50), ("low-new", 20)]:
        r = await pod16.admit(job_id, (16, 8, 4), priority=prio)  # 8 blocks each
        assert r.job.state == PENDING
    assert [(await pod16.job(j)).queue_position for j in ("mid", "low-old", "low-new")] == [1, 2, 3]
    await pod16.ws.CompleteJob(ws.CompleteJobRequest(job_id="holder"))
    await pod16.settle()  # CompleteJob answers once queued work is placed; wiring follows
    assert (await pod16.job("mid")).state == RUNNING
    assert (await pod16.job("low-old")).state == PENDING
    await pod16.ws.CompleteJob(ws.CompleteJobRequest(job_id="holder2"))
    await pod16.settle()
    assert (await pod16.job("low-old")).state == RUNNING
    assert (await pod16.job("low-new")).state == PENDING
    await pod16.assert_consistent()


async def test_preemption_by_each_policy(pod16):
    await pod16.admit(
        "term", (8, 8, 4), priority=10, preemption_policy=c.PREEMPTION_POLICY_TERMINATE
    )
    await pod16.admit("delay", (8, 8, 4), priority=20, preemption_policy=c.PREEMPTION_POLICY_DELAY)
    shrink = await pod16.admit(
        "shrink",
        (8, 8, 8),  # 8 blocks
        priority=30,
        preemption_policy=c.PREEMPTION_POLICY_SHRINK,
        shrink_to=[c.Shape(dims=[8, 8, 4]), c.Shape(dims=[4, 4, 4])],
    )
    kept = {p: b for p, b in _blocks(shrink.job).items() if p[2] == 0}
    assert (await pod16.pod()).types[0].free == 0

    # 4 blocks at priority 40: the lowest priority goes first (terminate).
    r = await pod16.admit("hi1", (8, 8, 4), priority=40)
    assert r.job.state == RUNNING
    assert [(v.job_id, v.action) for v in r.preempted] == [("term", c.PREEMPTION_POLICY_TERMINATE)]
    assert (await pod16.job("term")).state == c.JOB_STATE_PREEMPTED
    # Then delay: the victim is suspended and requeued.
    r = await pod16.admit("hi2", (8, 8, 4), priority=40)
    assert [(v.job_id, v.action) for v in r.preempted] == [("delay", c.PREEMPTION_POLICY_DELAY)]
    delayed = await pod16.job("delay")
    assert delayed.state == SUSPENDED and "requeued" in delayed.reason
    # Then shrink: to the largest declared sub-box that frees enough, rewired.
    r = await pod16.admit("hi3", (8, 8, 4), priority=40)
    assert [(v.job_id, list(v.shrunk_to.dims)) for v in r.preempted] == [("shrink", [2, 2, 1])]
    shrunk = await pod16.job("shrink")
    assert shrunk.state == RUNNING and list(shrunk.grid.dims) == [2, 2, 1]
    assert _blocks(shrunk) == kept  # the z = 0 layer kept its blocks and positions
    wiring = await pod16.wiring("shrink")
    assert list(wiring.grid.dims) == [2, 2, 1]
    # Equal priority is never preempted, and the shrunk slice can give only 3 more: it waits.
    r = await pod16.admit("hi4", (8, 8, 4), priority=40)
    assert r.job.state == PENDING and not r.preempted
    await pod16.assert_consistent()
    # The delayed job resumes, rewired, when capacity returns.
    await pod16.ws.CompleteJob(ws.CompleteJobRequest(job_id="hi1"))
    await pod16.settle()
    assert (await pod16.job("hi4")).state == RUNNING  # priority 40 first
    await pod16.ws.CompleteJob(ws.CompleteJobRequest(job_id="hi2"))
    await pod16.settle()
    resumed = await pod16.job("delay")
    assert resumed.state == RUNNING
    assert [e.to_state for e in resumed.history][-3:] == [SUSPENDED, c.JOB_STATE_WIRING, RUNNING]
    await pod16.assert_consistent()


async def test_when_no_capacity_fail_refuses_and_keeps_nothing(pod16):
    await pod16.admit("all", (16, 16, 4), priority=90)
    err = await rpc_error(
        pod16.admit("impatient", when_no_capacity=ws.WHEN_NO_CAPACITY_FAIL, priority=50)
    )
    assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "needs 1 tpu block: 0 free and healthy, 16 allocated, 0 failed" in err.message
    assert (await rpc_error(pod16.job("impatient"))).code == grpc.StatusCode.NOT_FOUND
    assert "PENDING" not in (await pod16.pod()).jobs_by_state


async def test_validate_only_changes_nothing(pod16):
    await pod16.admit("low", (16, 16, 4), priority=10)
    r = await pod16.ws.AdmitJob(
        ws.AdmitJobRequest(
            spec=ws.JobSpec(job_id="probe", shape=c.Shape(dims=[4, 4, 4]), priority=60),
            validate_only=True,
        )
    )
    assert "by preempting low" in r.outcome and [v.job_id for v in r.preempted] == ["low"]
    assert (await rpc_error(pod16.job("probe"))).code == grpc.StatusCode.NOT_FOUND
    assert (await pod16.job("low")).state == RUNNING


# -- WS-5 failure and recovery ---------------------------------------------------------


async def test_failed_block_replaced_at_the_same_logical_position(pod16):
    job = (await pod16.admit("train", (8, 8, 8), priority=60)).job
    before = _blocks(job)
    position, failed = sorted(before.items())[3]
    wiring_before = await pod16.wiring("train")
    resp = await pod16.fail(failed, "ECC errors")
    rep = resp.replacement
    assert rep.job_id == "train" and rep.failed_block_id == failed
    assert tuple(rep.position.coords) == position
    assert rep.cross_connects_moved > 0 and rep.cross_connects_untouched > 0
    assert resp.block.health == c.BLOCK_HEALTH_FAILED and not resp.block.job_id
    after = await pod16.job("train")
    assert after.state == RUNNING
    assert _blocks(after) == {**before, position: rep.new_block_id}
    wiring = await pod16.wiring("train")
    assert {tuple(p.position.coords): p.block_id for p in wiring.blocks} == _blocks(after)
    assert len(wiring.cross_connects) == len(wiring_before.cross_connects)
    await pod16.assert_consistent()
    # Reports are idempotent; RECOVERED returns the block to the pool.
    again = await pod16.fail(failed)
    assert not again.HasField("replacement")
    back = await pod16.recover(failed)
    assert back.block.health == c.BLOCK_HEALTH_HEALTHY and not back.block.job_id
    await pod16.assert_consistent()


async def test_replacement_taken_from_lower_priority_work(pod16):
    await pod16.admit("important", (16, 8, 4), priority=80)  # 8 blocks
    await pod16.admit("filler", (16, 8, 4), priority=10)  # the other 8
    failed = (await pod16.job("important")).blocks[0].block_id
    resp = await pod16.fail(failed)
    assert [v.job_id for v in resp.replacement.preempted] == ["filler"]
    assert (await pod16.job("filler")).state == SUSPENDED
    assert (await pod16.job("important")).state == RUNNING
    await pod16.assert_consistent()


async def test_no_block_to_be_had_suspends_then_resumes_when_one_frees(pod16):
    await pod16.admit("a", (16, 8, 4), priority=50)
    await pod16.admit("b", (16, 8, 4), priority=50)
    victim = (await pod16.job("a")).blocks[2].block_id
    resp = await pod16.fail(victim)
    assert not resp.HasField("replacement") and "a suspended" in resp.action
    suspended = await pod16.job("a")
    assert suspended.state == SUSPENDED and f"block {victim} failed" in suspended.reason
    assert await pod16.wiring("a") is None
    await pod16.assert_consistent()
    await pod16.recover(victim)
    await pod16.settle()
    assert (await pod16.job("a")).state == RUNNING
    await pod16.assert_consistent()


async def test_on_block_failure_fail(pod16):
    await pod16.admit("x", (16, 16, 4), on_block_failure=ws.ON_BLOCK_FAILURE_FAIL)
    resp = await pod16.fail((await pod16.job("x")).blocks[0].block_id)
    assert "x failed" in resp.action
    assert (await pod16.job("x")).state == c.JOB_STATE_FAILED
    await pod16.assert_consistent()


async def test_failure_of_a_free_block_only_changes_health(pod16):
    resp = await pod16.fail(3, "fan")
    assert resp.action == "block marked failed; it held no slice" and not resp.affected_jobs
    job = (await pod16.admit("avoids", (16, 16, 4), priority=50)).job
    assert job.state == PENDING  # 15 healthy blocks only
    await pod16.recover(3)
    await pod16.settle()
    assert (await pod16.job("avoids")).state == RUNNING


# -- WS-7 events, WS-9 view, WS-10 rings --------------------------------------------------


async def test_watch_job_and_pod(pod16):
    pod_events: list[ws.PodEvent] = []

    async def follow_pod():
        async for e in pod16.ws.WatchPod(ws.WatchPodRequest()):
            pod_events.append(e)
            if e.HasField("block"):
                return

    watcher = asyncio.create_task(follow_pod())
    await asyncio.sleep(0.2)  # let the pod watch start at the stream's tip
    await pod16.admit("w", (4, 4, 4))
    job_events: list = []

    async def follow_job():
        async for e in pod16.ws.WatchJob(ws.WatchJobRequest(job_id="w")):
            job_events.append(e)

    follower = asyncio.create_task(follow_job())
    await pod16.ws.CompleteJob(ws.CompleteJobRequest(job_id="w"))
    await asyncio.wait_for(follower, 10)  # the job watch ends with the job
    assert [e.to_state for e in job_events] == [
        PENDING,
        c.JOB_STATE_WIRING,
        RUNNING,
        c.JOB_STATE_COMPLETED,
    ]
    assert all(e.pod_id == POD and e.reason for e in job_events)
    await pod16.fail(9, "watch me")
    await asyncio.wait_for(watcher, 10)
    kinds = [
        (e.job.to_state if e.HasField("job") else ("block", e.block.block_id)) for e in pod_events
    ]
    assert kinds == [PENDING, c.JOB_STATE_WIRING, RUNNING, c.JOB_STATE_COMPLETED, ("block", 9)]
    err = await rpc_error(pod16.ws.WatchJob(ws.WatchJobRequest(job_id="nope")).read())
    assert err.code == grpc.StatusCode.NOT_FOUND


async def test_ring_plan_with_the_job_and_alone(pod16):
    r = await pod16.admit(
        "rings", (8, 8, 4), parallelism=c.ParallelismDegrees(data=8, pipeline=4, layer=8)
    )
    axes = {a.axis: a for a in r.job.rings.axes}
    assert {k: (a.degree, len(a.rings)) for k, a in axes.items()} == {
        "data": (8, 32),
        "pipeline": (4, 64),
        "layer": (8, 32),
    }
    again = await pod16.ws.GetJob(ws.GetJobRequest(job_id="rings", include_rings=True))
    assert again.rings == r.job.rings
    plan = await pod16.ws.PlanRings(
        ws.PlanRingsRequest(
            shape=c.Shape(dims=[12, 4, 4]),
            parallelism=c.ParallelismDegrees(data=12, pipeline=4, layer=4),
        )
    )
    assert [len(a.rings) for a in plan.axes] == [16, 48, 48]
    err = await rpc_error(
        pod16.ws.PlanRings(
            ws.PlanRingsRequest(
                shape=c.Shape(dims=[8, 8, 4]),
                wrap=[False, False, False],
                parallelism=c.ParallelismDegrees(data=8, pipeline=8, layer=4),
            )
        )
    )
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and "is a path, not a ring" in err.message


async def test_plan_rings_refuses_a_shape_the_pod_cannot_host(pod16):
    """Issue 19: PlanRings planned any chip shape, whatever the pod (16 blocks of 4x4x4)."""
    one = c.ParallelismDegrees(data=1)
    cases = [
        (c.Shape(dims=[20, 20, 4]), 0, "shape", "needs 25 blocks of 4x4x4 chips; pod pod-w has 16"),
        (c.Shape(dims=[5, 4, 1]), c.SHAPE_UNIT_BLOCKS, "shape", "needs 20 blocks"),
        (c.Shape(dims=[3, 3, 4]), 0, "shape.dims[0]", "not a multiple of the block's 4"),
        (c.Shape(dims=[20, 4]), 0, "shape.dims", "must have 3 extents"),
    ]
    for shape, unit, field, rule in cases:
        err = await rpc_error(
            pod16.ws.PlanRings(ws.PlanRingsRequest(shape=shape, unit=unit, parallelism=one))
        )
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT, (shape, err)
        assert any(f == field and rule in r for f, r in err.field_violations), (shape, err)
    # 20x4x4 chips is five whole blocks: this pod can host it, so it is planned.
    plan = await pod16.ws.PlanRings(
        ws.PlanRingsRequest(
            shape=c.Shape(dims=[20, 4, 4]),
            parallelism=c.ParallelismDegrees(data=20, pipeline=4, layer=4),
        )
    )
    assert list(plan.chips.dims) == [20, 4, 4]


async def test_a_failed_block_is_never_shown_free(pod16):
    """Issue 19: a FAILED block nobody holds showed availability FREE."""
    resp = await pod16.fail(15)
    assert resp.block.health == c.BLOCK_HEALTH_FAILED
    assert resp.block.availability == c.BLOCK_AVAILABILITY_UNAVAILABLE
    view = await pod16.assert_consistent()
    assert view.blocks[15].availability == c.BLOCK_AVAILABILITY_UNAVAILABLE
    assert view.blocks[14].availability == c.BLOCK_AVAILABILITY_FREE
    recovered = await pod16.recover(15)
    assert recovered.block.availability == c.BLOCK_AVAILABILITY_FREE


async def test_list_jobs_pages_and_filters(pod16):
    for i in range(5):
        await pod16.admit(f"j{i}", (4, 4, 4))
    await pod16.ws.CompleteJob(ws.CompleteJobRequest(job_id="j1"))
    page = await pod16.ws.ListJobs(ws.ListJobsRequest(page_size=2))
    assert [j.job_id for j in page.jobs] == ["j4", "j3"] and page.next_page_token
    rest = await pod16.ws.ListJobs(
        ws.ListJobsRequest(page_size=10, page_token=page.next_page_token)
    )
    assert [j.job_id for j in rest.jobs] == ["j2", "j1", "j0"] and not rest.next_page_token
    done = await pod16.ws.ListJobs(ws.ListJobsRequest(states=[c.JOB_STATE_COMPLETED]))
    assert [j.job_id for j in done.jobs] == ["j1"]
    err = await rpc_error(pod16.ws.ListJobs(ws.ListJobsRequest(page_token="garbage!")))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_info_names_the_fabric(pod16):
    info = await pod16.ws.GetInfo(c.GetInfoRequest())
    await pod16.pod()  # the fabric is known once the pod answers
    info = await pod16.ws.GetInfo(c.GetInfoRequest())
    assert info.pod_id == POD and info.attributes["fabric"].startswith("16 blocks of 4x4x4")


# -- several replicas (WS-1) -----------------------------------------------------------


async def test_two_replicas_admitting_concurrently_never_share_a_block(redis_url):
    async with pod_stack(redis_url, blocks=16, replicas=2) as pod:
        results = await asyncio.gather(
            *(pod.admit(f"r{i:02}", (8, 4, 4), replica=i % 2, priority=10 + i) for i in range(12))
        )
        assert all(r.created for r in results)
        await pod.settle()
        view = await pod.assert_consistent()
        jobs = [await pod.job(f"r{i:02}") for i in range(12)]
        running = {j.job_id for j in jobs if j.state == RUNNING}
        # 2-block slices on 16 blocks: the 8 most important run, the others wait (the
        # lower ones that ran first were delayed by the later, higher admissions).
        assert running == {f"r{i:02}" for i in range(4, 12)}
        assert {j.state for j in jobs if j.job_id not in running} <= {PENDING, SUSPENDED}
        assert len([b for b in view.blocks if b.job_id]) == 16
        # Completing everything on the other replica starts the queue, in priority order.
        for job_id in sorted(running):
            await pod.schedulers[1].CompleteJob(ws.CompleteJobRequest(job_id=job_id))
        await pod.settle()
        await pod.assert_consistent()
        final = {j.job_id: j.state for j in [await pod.job(f"r{i:02}") for i in range(12)]}
        assert {k for k, v in final.items() if v == RUNNING} == {f"r{i:02}" for i in range(4)}
        slices = await pod.ocs.ListSlices(ocs_manager_pb2.ListSlicesRequest())
        assert len(slices.slices) == 4


# -- configuration and observability --------------------------------------------------


async def test_with_k2_a_slice_spreads_over_the_ocs_of_each_axis(redis_url):
    """WS-3: the first ends of block b land on OCS b % 2 (read from the port map)."""
    async with pod_stack(redis_url, blocks=8, k=2) as pod:
        await pod.fail(1)
        await pod.fail(3)
        # Lowest ids alone would take 0, 2, 4, 5 (three on OCS 0); spread: 0, 5, 2, 7.
        job = (await pod.admit("spread", (8, 8, 4))).job
        assert sorted(b.block_id for b in job.blocks) == [0, 2, 5, 7]
        groups = [b.block_id % 2 for b in sorted(job.blocks, key=lambda b: list(b.position.coords))]
        assert sorted(groups) == [0, 0, 1, 1]
        await pod.assert_consistent()


async def test_block_types_that_do_not_fit_the_fabric_are_refused_clearly(redis_url):
    async with pod_stack(redis_url, blocks=8, types="tpu:6") as pod:
        err = await rpc_error(pod.admit("x"))
        assert err.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "LIGHTPATH_BLOCK_TYPES=tpu:6" in err.message and "has 8 blocks" in err.message


def test_a_malformed_block_types_setting_stops_the_start():
    import pytest

    from lightpath_services.common.settings import SettingsError, load
    from lightpath_services.workload_scheduler.settings import WorkloadSchedulerSettings

    with pytest.raises(SettingsError, match="LIGHTPATH_BLOCK_TYPES"):
        load(WorkloadSchedulerSettings, {"LIGHTPATH_BLOCK_TYPES": "tpu,gpu:4"})
    ok = load(WorkloadSchedulerSettings, {"LIGHTPATH_BLOCK_TYPES": "tpu:60,gpu"})
    assert ok.block_types == "tpu:60,gpu"


async def test_an_admission_is_one_trace_down_to_the_ocs_manager(redis_url, spans_factory):
    spans = spans_factory("workload_scheduler")
    async with pod_stack(redis_url, tracer_provider=spans.provider) as pod:
        await pod.admit("traced", (8, 4, 4), priority=70)
    finished = spans.finished()
    admit = next(s for s in finished if s.name.endswith("AdmitJob") and s.kind.name == "SERVER")
    assert admit.attributes["lightpath.job_id"] == "traced"
    assert admit.attributes["lightpath.priority"] == 70
    wire = next(s for s in finished if s.name.endswith("WireSlice") and s.kind.name == "CLIENT")
    assert wire.context.trace_id == admit.context.trace_id
