"""The demo step runs against the real services, shows the story, and cleans up."""

from __future__ import annotations

import contextlib

from lightpath.demo import DemoContext
from lightpath.demo import cell as demo
from lightpath.v1 import cell_scheduler_pb2 as cs
from tests.cell_scheduler.conftest import cell_stack
from tests.helpers import PATENT_REFERENCE


async def test_demo_step_places_preempts_replaces_queues_and_cleans_up(
    redis_url, capsys, spans_factory
):
    async with cell_stack(
        redis_url, pods=(("pod-1", 64, "tpu"), ("pod-2", 64, "tpu:60,gpu"))
    ) as cell:
        ocs = {}
        for pod_id, pod in cell.pods.items():
            ocs[f"ocs-{pod_id}"] = pod
        endpoints = {"cell-scheduler": cell.cell_addresses[0], **cell.ocs_addresses}
        ctx = DemoContext(endpoints, spans_factory("demo").provider)
        try:
            await demo.run(ctx)
        finally:
            await ctx.close()
        out = capsys.readouterr().out
        with contextlib.suppress(Exception):
            print(out)
        assert not PATENT_REFERENCE.search(out)  # figures and paragraphs stay in the docs
        lines = {
            line.split()[0]: line
            for line in out.splitlines()
            if "-> " in line and "chips p" in line
        }
        placed = {k.rsplit("-", 1)[0]: v for k, v in lines.items()}
        assert "RUNNING on pod-1" in placed["train"] and "RUNNING on pod-2" in placed["prod"]
        assert "RUNNING on pod-1" in placed["eval"] and "RUNNING on pod-1" in placed["batch"]
        assert "RUNNING on pod-2" in placed["render"] and "RUNNING on pod-2" in placed["finetune"]
        assert "4x8x8 chips" in placed["finetune"]
        assert "RUNNING on pod-1" in placed["urgent"] and "in the cell queue" in placed["late"]
        assert "gave way: delay" in out and "gave way: terminate" in out
        assert "gave way: shrink to 4x4x1 blocks" in out
        assert "replaced by block" in out
        assert "trace of the urgent submission: " in out
        # Everything it started has ended; the failed block is healthy again.
        jobs = await cell.cell.ListJobs(cs.ListCellJobsRequest(tenant="demo"))
        assert jobs.jobs and all(
            j.state in (5, 4, 6)
            for j in jobs.jobs  # CANCELLED, COMPLETED, PREEMPTED
        ), [(j.job_id, j.state) for j in jobs.jobs]
        for pod in cell.pods.values():
            view = await pod.view()
            assert all(b.health == 1 and not b.job_id for b in view.blocks)
