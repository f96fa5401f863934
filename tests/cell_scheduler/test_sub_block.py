"""Issue 28 through the cell: slices smaller than a block counted in chips, twisted tori,
host reports — real cell_scheduler, workload_schedulers and ocs_managers on real Redis."""

from __future__ import annotations

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import common_pb2 as c
from tests.cell_scheduler.conftest import cell_stack, rpc_error

RUNNING, PENDING = c.JOB_STATE_RUNNING, c.JOB_STATE_PENDING


async def test_a_sub_block_slice_goes_through_the_cell_and_holds_a_box_of_chips(cell2):
    resp = await cell2.submit("small", (2, 2, 1))
    job = resp.job
    assert job.state == RUNNING and job.pod_id == "pod-a"
    assert list(job.chips.dims) == [2, 2, 1] and job.block_count == 0
    assert "free healthy tpu chips" in job.placement_reason
    box = job.pod_job.box
    assert list(box.chips.dims) == [2, 2, 1] and box.job_id == "small"
    assert [b.block_id for b in job.pod_job.blocks] == [box.block_id]
    # The pod reports the 4 chips gone, and the block given over to boxes not free.
    pod = await cell2.wait_capacity(
        "pod-a",
        lambda cap: (cap.types[0].chips_free, cap.types[0].free) == (508, 7),
        "pod-a reporting 508 chips and 7 blocks free",
    )
    assert pod.capacity.types[0].chips_total == 512
    assert pod.capacity.types[0].largest_free_box == 64  # a free block takes any box


async def test_the_cell_counts_a_sub_block_slice_as_chips_not_a_whole_block(redis_url):
    # Two pods of one block each. Boxes of half a block go two to a block: had the cell
    # counted each as a block, the third and fourth would wait in the cell queue.
    async with cell_stack(redis_url, pods=(("pod-a", 1, "tpu"), ("pod-b", 1, "tpu"))) as cell:
        placed = []
        for i in range(4):
            resp = await cell.submit(f"half-{i}", (2, 4, 4))
            assert resp.job.state == RUNNING, resp.outcome
            placed.append(resp.job.pod_id)
        assert sorted(placed) == ["pod-a", "pod-a", "pod-b", "pod-b"]
        # Both blocks are full now: the next box waits in the cell queue ...
        waiting = await cell.submit("half-4", (2, 4, 4))
        assert waiting.job.state == PENDING and waiting.job.cell_queue_position == 1
        assert "largest free holds 0" in waiting.job.reason
        # ... until one ends: then the cell sends it where chips came free.
        await cell.cell.CompleteJob(cs.CompleteCellJobRequest(job_id="half-1"))
        job = await cell.wait_state("half-4", RUNNING)
        assert job.pod_id == placed[1]


async def test_a_small_compute_demand_runs_as_a_box_of_chips(cell2):
    deadline = Timestamp()
    deadline.GetCurrentTime()
    deadline.FromSeconds(deadline.seconds + 3600 + 60)
    # 3 chip-hours by the deadline: 3 chips, as a 1x2x2 box (not a 64-chip block).
    demand = cs.ComputeDemand(chip_hours=3, deadline=deadline, node_type="tpu")
    resp = await cell2.submit("tiny", None, demand=demand)
    job = resp.job
    assert job.state == RUNNING and job.shape_derived, resp.outcome
    assert list(job.chips.dims) == [1, 2, 2] and job.block_count == 0
    assert list(job.pod_job.box.chips.dims) == [1, 2, 2]


async def test_a_twisted_torus_is_forwarded_and_bad_twists_are_refused_naming_the_field(cell2):
    resp = await cell2.submit("tw", (4, 4, 8), twisted=True)
    assert resp.job.state == RUNNING and resp.job.spec.twisted
    assert resp.job.pod_job.spec.twisted and resp.job.block_count == 2
    err = await rpc_error(cell2.submit("tw-bad", (4, 8, 12), twisted=True))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in err.field_violations] == ["spec.twisted"]
    err = await rpc_error(cell2.submit("tw-small", (2, 2, 1), twisted=True))
    assert [f for f, _ in err.field_violations] == ["spec.twisted"]


async def test_a_host_report_goes_through_the_cell_to_the_pod(cell2):
    resp = await cell2.submit("small", (2, 2, 1))
    block = resp.job.pod_job.box.block_id
    report = await cell2.cell.ReportBlockHealth(
        cs.ReportCellBlockHealthRequest(
            pod_id="pod-a", block_id=block, health=c.BLOCK_HEALTH_FAILED, host=15, reason="PSU"
        )
    )
    assert list(report.block.failed_hosts) == [15]
    view = await cell2.pods["pod-a"].view()
    (b,) = [b for b in view.blocks if b.block_id == block]
    assert list(b.failed_hosts) == [15]
    back = await cell2.cell.ReportBlockHealth(
        cs.ReportCellBlockHealthRequest(
            pod_id="pod-a", block_id=block, health=c.BLOCK_HEALTH_HEALTHY, host=15
        )
    )
    assert not back.block.failed_hosts
    # A host the block does not have: the pod's INVALID_ARGUMENT, naming `host`.
    err = await rpc_error(
        cell2.cell.ReportBlockHealth(
            cs.ReportCellBlockHealthRequest(
                pod_id="pod-a", block_id=block, health=c.BLOCK_HEALTH_FAILED, host=16
            )
        )
    )
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in err.field_violations] == ["host"]
