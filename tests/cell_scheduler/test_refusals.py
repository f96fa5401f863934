"""Issue 19 through a real cell (cell_scheduler, workload_schedulers, ocs_managers over
gRPC on a real Redis): what no pod can host is INVALID_ARGUMENT at submit, with the
reasons of the pods it applies to, grouped by pod; queued jobs show their 1-based
place; a job on a silent pod is answered at once, UNKNOWN with its last known state."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from opentelemetry.trace import SpanKind

from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import common_pb2 as c
from tests.cell_scheduler.conftest import Cell, cell_stack, rpc_error

RUNNING, PENDING, UNKNOWN = c.JOB_STATE_RUNNING, c.JOB_STATE_PENDING, c.JOB_STATE_UNKNOWN


@pytest.fixture
async def mixed(redis_url) -> AsyncIterator[Cell]:
    """The local stack's three kinds of pod: 8 tpu blocks, 14 tpu and 2 gpu, SWITCHED
    (with no group reserved for small jobs, a rule only the pod itself knows)."""
    async with cell_stack(
        redis_url,
        pods=(("pod-1", 8, "tpu"), ("pod-2", 16, "tpu:14,gpu"), ("pod-3", 0, "npu")),
        switched=("pod-3",),
        switched_small=0,
    ) as cell:
        yield cell


async def _kept_nothing(cell: Cell, job_id: str) -> None:
    assert (await rpc_error(cell.job(job_id))).code == grpc.StatusCode.NOT_FOUND
    listed = await cell.cell.ListJobs(cs.ListCellJobsRequest())
    assert job_id not in [j.job_id for j in listed.jobs]


async def test_what_no_pod_can_host_is_refused_at_submit_with_the_pods_reasons(mixed):
    # 8x8x4 chips split 3x1x1: the torus pods' product rule, the SWITCHED pod's
    # shape-agrees-with-the-degrees rule. It used to be OK, forwarded to pod-3,
    # refused there, and PENDING in the cell queue until cancelled.
    err = await rpc_error(
        mixed.submit("three", (8, 8, 4), parallelism=c.ParallelismDegrees(data=3, pipeline=1))
    )
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT, err
    fields = [f for f, _ in err.field_violations]
    assert sorted(fields) == ["spec.parallelism", "spec.shape"], err
    # The pods' specific reason passes through (pod-3's is the generic one).
    assert err.reason == "PARALLELISM_PRODUCT", err
    assert "pod pod-1: spec.parallelism" in err.message and "pod pod-3: spec.shape" in err.message
    await _kept_nothing(mixed, "three")
    # A rule only the SWITCHED pod knows (no group for small jobs): refused when the
    # pod refuses it, with the pod's own reason, and nothing is kept in the cell.
    err = await rpc_error(mixed.submit("tiny", None, parallelism=c.ParallelismDegrees(data=2)))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT, err
    assert err.reason == "NO_SMALL_JOB_GROUPS", err
    assert [f for f, _ in err.field_violations] == ["spec.parallelism"], err
    await _kept_nothing(mixed, "tiny")


async def test_cell_errors_leave_out_pods_that_do_not_apply_and_say_each_field_once(mixed):
    # A plain shape: the SWITCHED pod does not apply (no "parallelism is required").
    err = await rpc_error(mixed.submit("plain", (6, 8, 4)))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in err.field_violations] == ["spec.shape.dims[0]"], err
    assert "parallelism" not in err.message and "SWITCHED" not in err.message, err
    # 5 gpu blocks: only pod-2 has gpu blocks, so only its reason.
    err = await rpc_error(mixed.submit("gpus", (20, 4, 4), node_type_counts={"gpu": 5}))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.field_violations == [
        ("spec.node_type_counts", "needs 5 gpu blocks; the pod has 2")
    ], err
    assert "pod-1" not in err.message and "unknown node type" not in err.message, err
    # Too big for every torus pod, each saying so in its own words: one violation for
    # the field, the rule of each pod once, and the pods' reason (not INVALID_ARGUMENT).
    err = await rpc_error(mixed.submit("huge", (16, 16, 20)))
    assert err.reason == "MORE_BLOCKS_THAN_POD", err
    fields = [f for f, _ in err.field_violations]
    assert fields == ["spec.shape"], err
    (rule,) = [r for _, r in err.field_violations]
    assert rule == (
        "needs 80 blocks; the pod has 8 (pod pod-1); needs 80 blocks; the pod has 16 (pod pod-2)"
    ), err
    assert "SWITCHED" not in err.message and "pod-3" not in err.message, err
    # Degrees alone: only the SWITCHED pod applies.
    err = await rpc_error(
        mixed.submit("many", None, parallelism=c.ParallelismDegrees(data=8, pipeline=8, layer=8))
    )
    assert err.reason == "MORE_BLOCKS_THAN_POD", err
    assert [f for f, _ in err.field_violations] == ["spec.parallelism"], err
    assert "pod-1" not in err.message and "pod-2" not in err.message, err
    # Degrees alone are a request (for a SWITCHED pod): the cell takes one it can host.
    ok = await mixed.submit(
        "large", None, parallelism=c.ParallelismDegrees(data=4, pipeline=3, layer=3)
    )
    assert ok.job.pod_id == "pod-3" and ok.job.state == RUNNING


async def test_a_queued_job_shows_its_place_in_every_answer(cell2):
    for pod in ("a", "b"):
        await cell2.submit(f"full-{pod}", (8, 8, 8))  # all 8 blocks of one pod
    first = await cell2.submit("waits-1", (4, 4, 4))
    second = await cell2.submit("waits-2", (4, 4, 4))
    assert (first.job.state, first.job.cell_queue_position) == (PENDING, 1)
    assert second.job.cell_queue_position == 2
    assert (await cell2.job("waits-2")).cell_queue_position == 2
    listed = await cell2.cell.ListJobs(cs.ListCellJobsRequest(states=[PENDING]))
    assert {j.job_id: j.cell_queue_position for j in listed.jobs} == {"waits-1": 1, "waits-2": 2}
    running = await cell2.cell.ListJobs(cs.ListCellJobsRequest(states=[RUNNING]))
    assert [j.cell_queue_position for j in running.jobs] == [0, 0]


async def test_a_job_on_a_silent_pod_is_answered_at_once_unknown_with_its_last_state(
    redis_url, spans_factory
):
    spans = spans_factory("lightpath-cell_scheduler")
    async with cell_stack(
        redis_url,
        pods=(("pod-s", 4, "tpu"),),
        tracer_providers={"cell_scheduler": spans.provider},
    ) as cell:
        job = (await cell.submit("on-s", (4, 4, 4))).job
        assert job.state == RUNNING and job.last_known_state == c.JOB_STATE_UNSPECIFIED
        await cell.stop_pod("pod-s")

        async def silent():
            return (await cell.pods_view())["pod-s"].status == cs.POD_STATUS_SILENT

        await cell.wait_for(silent, what="pod-s silent")
        spans.exporter.clear()
        # From the first read after the pod turned SILENT on: UNKNOWN, last known RUNNING.
        for _ in range(3):
            got = await cell.job("on-s")
            assert got.state == UNKNOWN, got
            assert got.last_known_state == RUNNING and "last known: RUNNING" in got.reason
            assert not got.HasField("pod_job")

        async def marked():  # the cell's own pass marks the stored state too (CS-6)
            got = await cell.cell.ListJobs(cs.ListCellJobsRequest(states=[UNKNOWN]))
            return [(j.job_id, j.last_known_state) for j in got.jobs]

        assert await cell.wait_for(marked, what="on-s marked UNKNOWN") == [("on-s", RUNNING)]
        # The cell answered from what it knows: none of those reads asked the pod.
        finished = spans.finished()
        reads = {
            s.context.trace_id
            for s in finished
            if s.name.endswith("CellScheduler/GetJob") and s.kind == SpanKind.SERVER
        }
        assert len(reads) == 3
        asked = [
            s
            for s in finished
            if s.context.trace_id in reads and s.name.endswith("WorkloadScheduler/GetJob")
        ]
        assert asked == []
        # Back: its pod's state again, no last known state.
        await cell.start_pod("pod-s")
        back = await cell.wait_state("on-s", RUNNING)
        assert back.last_known_state == c.JOB_STATE_UNSPECIFIED
