"""Through the cell (issue 19): UpdateJob of a job in the cell queue and on a pod, and a
preferred (or required) pod at submit. Real cell, workload schedulers and ocs_managers
over gRPC on a real Redis."""

from __future__ import annotations

import asyncio

import grpc

from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import workload_scheduler_pb2 as ws
from tests.cell_scheduler.conftest import cell_stack, rpc_error

RUNNING, PENDING = c.JOB_STATE_RUNNING, c.JOB_STATE_PENDING


def _update(job_id: str, paths: list[str], **spec) -> cs.UpdateCellJobRequest:
    req = cs.UpdateCellJobRequest(spec=ws.JobSpec(job_id=job_id, **spec))
    req.update_mask.paths.extend(paths)
    return req


async def _events_until(cell, job_id: str, predicate) -> list[c.JobEvent]:
    """The job's events (history first) up to the first one `predicate` accepts."""
    seen: list[c.JobEvent] = []

    async def read():
        async for e in cell.cell.WatchJob(cs.WatchCellJobRequest(job_id=job_id)):
            seen.append(e)
            if predicate(e):
                return

    await asyncio.wait_for(read(), 10)
    return seen


# -- UpdateJob --------------------------------------------------------------------------


async def test_a_job_in_the_cell_queue_takes_its_new_place(cell2):
    for pod in ("a", "b"):
        assert (await cell2.submit(f"full-{pod}", (8, 8, 8), priority=90)).job.state == RUNNING
    for name, priority in (("low", 20), ("mid", 50)):
        assert (await cell2.submit(name, (8, 8, 8), priority=priority)).job.pod_id == ""
    assert (await cell2.job("low")).cell_queue_position == 2

    up = await cell2.cell.UpdateJob(_update("low", ["priority"], priority=70))
    assert (up.priority, up.spec.priority, up.cell_queue_position) == (70, 70, 1)
    assert (await cell2.job("mid")).cell_queue_position == 2
    events = await _events_until(cell2, "low", lambda e: e.reason.startswith("updated"))
    assert events[-1].reason == "updated: priority 20 → 70"
    assert (events[-1].from_state, events[-1].to_state) == (PENDING, PENDING)

    await cell2.cell.CompleteJob(cs.CompleteCellJobRequest(job_id="full-a"))
    placed = await cell2.wait_state("low", RUNNING)
    assert placed.pod_id == "pod-a" and placed.pod_job.spec.priority == 70
    assert (await cell2.job("mid")).state == PENDING


async def test_a_job_on_a_pod_changes_there_and_in_the_cell(cell2):
    first = await cell2.submit("on-pod", (8, 8, 4), priority=40, tenant="acme", labels={"a": "1"})
    pod = cell2.pods[first.job.pod_id]
    up = await cell2.cell.UpdateJob(
        _update("on-pod", ["priority", "labels.b", "labels.a"], priority=75, labels={"b": "2"})
    )
    assert up.state == RUNNING and up.priority == 75
    assert dict(up.spec.labels) == {"b": "2"}  # the request as the cell keeps it
    assert dict(up.pod_job.spec.labels) == {"b": "2", "tenant": "acme"}
    on_pod = await pod.job("on-pod")
    assert on_pod.priority == 75 and on_pod.spec.labels["tenant"] == "acme"
    assert (
        on_pod.history[-1].reason == "updated: priority 40 → 75; labels set b=2; labels removed a"
    )
    # the whole map: the pod keeps the tenant label
    up = await cell2.cell.UpdateJob(_update("on-pod", ["labels"], labels={"c": "3"}))
    assert dict((await pod.job("on-pod")).spec.labels) == {"c": "3", "tenant": "acme"}
    # the first request submitted again is the same job, as it is now
    again = await cell2.submit("on-pod", (8, 8, 4), priority=40, tenant="acme", labels={"a": "1"})
    assert not again.created and again.job.priority == 75
    listed = await cell2.cell.ListJobs(cs.ListCellJobsRequest(tenant="acme"))
    assert [(j.job_id, j.priority) for j in listed.jobs] == [("on-pod", 75)]


async def test_update_refusals_name_the_field_and_change_nothing(cell2):
    await cell2.submit("r1", (4, 4, 4), priority=40, tenant="acme")
    cases = [
        (_update("r1", []), grpc.StatusCode.INVALID_ARGUMENT, "update_mask.paths"),
        (_update("r1", ["spec.shape"]), grpc.StatusCode.INVALID_ARGUMENT, "update_mask.paths[0]"),
        (
            _update("r1", ["labels.tenant"]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "update_mask.paths[0]",
        ),
        (
            _update("r1", ["labels"], labels={"tenant": "beta"}),
            grpc.StatusCode.INVALID_ARGUMENT,
            "spec.labels[tenant]",
        ),
        (
            _update("r1", ["priority"], priority=0),
            grpc.StatusCode.INVALID_ARGUMENT,
            "spec.priority",
        ),
        (
            _update("no such", ["priority"], priority=9),
            grpc.StatusCode.INVALID_ARGUMENT,
            "spec.job_id",
        ),
    ]
    for req, code, field in cases:
        err = await rpc_error(cell2.cell.UpdateJob(req))
        assert err.code == code and field in [f for f, _ in err.field_violations], (req, err)
    job = await cell2.job("r1")
    assert job.priority == 40 and len(job.pod_job.history) == 3  # PENDING, WIRING, RUNNING
    err = await rpc_error(cell2.cell.UpdateJob(_update("ghost", ["priority"], priority=9)))
    assert err.code == grpc.StatusCode.NOT_FOUND
    await cell2.cell.CancelJob(cs.CancelCellJobRequest(job_id="r1"))
    err = await rpc_error(cell2.cell.UpdateJob(_update("r1", ["priority"], priority=9)))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and err.reason == "JOB_ENDED"


# -- a preferred pod ------------------------------------------------------------------------


async def test_a_preferred_pod_is_honoured_when_it_fits_and_otherwise_another_is_used(cell2):
    def submit(job_id: str, dims: list[int]):
        return cell2.cell.SubmitJob(
            cs.SubmitJobRequest(
                spec=ws.JobSpec(job_id=job_id, shape=c.Shape(dims=dims)), preferred_pod="pod-b"
            )
        )

    # both pods empty: without a preference the tie goes to pod-a
    b = await submit("want-b", [8, 8, 8])  # all 8 blocks
    assert b.job.pod_id == "pod-b" and "the pod asked for" in b.job.placement_reason
    assert (await cell2.pods["pod-b"].job("want-b")) is not None
    # pod-b is full: the preference cannot be honoured now, and the job goes elsewhere
    elsewhere = await submit("want-b-2", [4, 4, 4])
    assert elsewhere.job.pod_id == "pod-a", elsewhere
    assert "pod-b, the pod asked for, does not fit now" in elsewhere.job.placement_reason


async def test_a_required_pod_is_waited_for_and_bad_pod_names_are_refused(cell2):
    err = await rpc_error(
        cell2.cell.SubmitJob(
            cs.SubmitJobRequest(
                spec=ws.JobSpec(job_id="x1", shape=c.Shape(dims=[4, 4, 4])),
                preferred_pod="pod-z",
            )
        )
    )
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and err.reason == "UNKNOWN_POD"
    assert [f for f, _ in err.field_violations] == ["preferred_pod"]
    assert "pod-a, pod-b" in err.field_violations[0][1]
    err = await rpc_error(
        cell2.cell.SubmitJob(
            cs.SubmitJobRequest(
                spec=ws.JobSpec(job_id="x2", shape=c.Shape(dims=[4, 4, 4])),
                require_preferred_pod=True,
            )
        )
    )
    assert [f for f, _ in err.field_violations] == ["require_preferred_pod"]
    for job_id in ("x1", "x2"):
        assert (await rpc_error(cell2.job(job_id))).code == grpc.StatusCode.NOT_FOUND

    await cell2.submit("full-b", (8, 8, 8), priority=90)  # pod-a (the tie)
    await cell2.submit("full-b2", (8, 8, 8), priority=90)  # pod-b
    assert (await cell2.job("full-b2")).pod_id == "pod-b"
    await cell2.cell.CompleteJob(cs.CompleteCellJobRequest(job_id="full-b"))  # pod-a empty
    await cell2.wait_free("pod-a", "tpu", 8)
    waiting = await cell2.cell.SubmitJob(
        cs.SubmitJobRequest(
            spec=ws.JobSpec(job_id="only-b", shape=c.Shape(dims=[4, 4, 4])),
            preferred_pod="pod-b",
            require_preferred_pod=True,
        )
    )
    assert waiting.job.state == PENDING and waiting.job.pod_id == ""  # pod-a has room: not used
    await cell2.cell.CompleteJob(cs.CompleteCellJobRequest(job_id="full-b2"))
    assert (await cell2.wait_state("only-b", RUNNING)).pod_id == "pod-b"


async def test_a_required_pod_that_cannot_host_the_job_is_invalid_argument(redis_url):
    async with cell_stack(redis_url, pods=(("pod-a", 8, "tpu"), ("pod-b", 8, "gpu"))) as cell:
        gpu = {"shape": c.Shape(dims=[1, 1, 1]), "unit": c.SHAPE_UNIT_BLOCKS}
        err = await rpc_error(
            cell.cell.SubmitJob(
                cs.SubmitJobRequest(
                    spec=ws.JobSpec(job_id="g1", node_type_counts={"gpu": 1}, **gpu),
                    preferred_pod="pod-a",
                    require_preferred_pod=True,
                )
            )
        )
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT
        assert [f for f, _ in err.field_violations] == ["spec.node_type_counts[gpu]"]
        # preferred only: it goes where it can
        ok = await cell.cell.SubmitJob(
            cs.SubmitJobRequest(
                spec=ws.JobSpec(job_id="g2", node_type_counts={"gpu": 1}, **gpu),
                preferred_pod="pod-a",
            )
        )
        assert ok.job.pod_id == "pod-b"
        assert "pod-a, the pod asked for, cannot host it" in ok.job.placement_reason
