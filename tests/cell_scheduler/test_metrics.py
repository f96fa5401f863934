"""The cell's domain metrics move with what happens in the cell (issue 18): a real cell
with two pods on a real Redis, read through an in-memory reader of its own provider."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import common_pb2 as c
from lightpath_services.cell_scheduler import server as cell_server
from lightpath_services.cell_scheduler.metrics import CellMetrics
from tests.cell_scheduler.conftest import cell_stack
from tests.metrics_reader import assert_listed, install, points, value


@pytest.fixture
def reader(monkeypatch) -> CollectorRegistry:
    return install(monkeypatch, cell_server, CellMetrics, refresh_s=0.1)


async def test_a_job_through_the_cell_moves_jobs_queue_forwards_and_latency(redis_url, reader):
    async with cell_stack(redis_url, pods=(("pod-a", 2, "tpu"),)) as cell:

        async def pods_ready():
            return value(reader, "lightpath.cell.pods", status="ready") == 1

        await cell.wait_for(pods_ready, what="one pod ready in lightpath.cell.pods")
        assert value(reader, "lightpath.cell.jobs", state="RUNNING") == 0
        assert value(reader, "lightpath.cell.submit_to_running.duration") == 0
        ages = points(reader, "lightpath.cell.heartbeat.age")
        assert [p.attributes["pod"] for p in ages] == ["pod-a"]

        first = await cell.submit("m1", (4, 4, 8))  # both blocks
        assert first.job.state == c.JOB_STATE_RUNNING
        assert value(reader, "lightpath.cell.forwards", result="placed") == 1

        async def running():
            return (
                value(reader, "lightpath.cell.jobs", state="RUNNING", pod="pod-a") == 1
                and value(reader, "lightpath.cell.submit_to_running.duration") == 1
            )

        await cell.wait_for(running, what="m1 RUNNING on pod-a and its latency recorded")

        # No room left: the second waits in the cell queue.
        second = await cell.submit("m2", (4, 4, 8))
        assert second.job.state == c.JOB_STATE_PENDING and not second.job.pod_id

        async def queued():
            return (
                value(reader, "lightpath.cell.queue.depth") == 1
                and value(reader, "lightpath.cell.jobs", state="PENDING", pod="") == 1
            )

        await cell.wait_for(queued, what="m2 in the cell queue")

        await cell.cell.CompleteJob(cs.CompleteCellJobRequest(job_id="m1"))
        await cell.wait_state("m2", c.JOB_STATE_RUNNING)

        async def drained():
            return (
                value(reader, "lightpath.cell.queue.depth") == 0
                and value(reader, "lightpath.cell.jobs", state="RUNNING", pod="pod-a") == 1
                and value(reader, "lightpath.cell.submit_to_running.duration") == 2
            )

        await cell.wait_for(drained, what="m2 out of the queue and running")
        assert value(reader, "lightpath.cell.forwards", result="placed") == 2
        assert_listed(reader)


async def test_tenants_quota_usage_borrowing_and_waiting_are_shown(redis_url, reader):
    """Issue 35: per tenant and node type, its quota, what it holds and borrows; its
    jobs waiting for quota apart from those waiting for room."""
    async with cell_stack(redis_url, pods=(("pod-a", 4, "tpu"),)) as cell:
        await cell.cell.SetQuota(
            cs.SetQuotaRequest(quota=cs.Quota(tenant="own", nominal_chips={"tpu": 128}, cohort="c"))
        )
        await cell.cell.SetQuota(
            cs.SetQuotaRequest(
                quota=cs.Quota(
                    tenant="lab", nominal_chips={"tpu": 64}, cohort="c", borrowing_limit={"tpu": 64}
                )
            )
        )
        await cell.cell.SetQuota(  # and a quota on the pod: its own series, labelled so
            cs.SetQuotaRequest(
                quota=cs.Quota(tenant="lab", nominal_chips={"tpu": 192}, pod="pod-a")
            )
        )
        await cell.submit("l1", tenant="lab")
        await cell.submit("l2", tenant="lab")  # borrows 64 of own's idle quota
        held = await cell.submit("l3", tenant="lab")
        assert "waiting for quota" in held.job.reason

        def chips(tenant: str, kind: str, pod: str = "") -> float:
            return value(reader, "lightpath.cell.tenant.chips", tenant=tenant, kind=kind, pod=pod)

        async def shown():
            return (
                chips("lab", "used") == 128
                and chips("lab", "borrowed") == 64
                and chips("own", "quota") == 128
                and chips("lab", "quota", "pod-a") == 192
                and chips("lab", "used", "pod-a") == 128
                and value(reader, "lightpath.cell.tenant.waiting", tenant="lab", cause="quota") == 1
            )

        await cell.wait_for(shown, what="lab's usage, borrowing and waiting job")
        assert chips("own", "used") == 0
        assert chips("lab", "borrowed", "pod-a") == 0  # a pod's quota lends nothing
        assert not [
            p
            for p in points(reader, "lightpath.cell.tenant.chips")
            if p.attributes["pod"] and p.attributes["tenant"] != "lab"
        ]
        assert_listed(reader)
