"""End to end through the cell: real cell_scheduler, workload_schedulers and ocs_managers
over gRPC on a real Redis (CS-1 … CS-6)."""

from __future__ import annotations

from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import common_pb2 as c

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
