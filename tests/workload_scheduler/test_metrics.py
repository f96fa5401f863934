"""A pod's domain metrics move with what happens on the pod (issue 18): the real
workload_scheduler and ocs_manager on a real Redis, read through an in-memory reader of
the test's own provider."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from lightpath.v1 import common_pb2 as c
from lightpath_services.workload_scheduler import server as ws_server
from lightpath_services.workload_scheduler.metrics import PodMetrics
from tests.metrics_reader import assert_listed, install, until, value
from tests.workload_scheduler.conftest import POD, pod_stack


@pytest.fixture
def reader(monkeypatch) -> CollectorRegistry:
    return install(monkeypatch, ws_server, PodMetrics, refresh_s=0.1)


async def test_admission_preemption_and_a_failed_block_move_the_pod_metrics(redis_url, reader):
    async with pod_stack(redis_url) as pod:

        def blocks(state: str) -> float:
            return value(reader, "lightpath.pod.blocks", pod=POD, state=state, node_type="tpu")

        await until(lambda: blocks("free") == 16, "16 free blocks")
        assert blocks("allocated") == blocks("failed") == 0

        job = (await pod.admit("train", (8, 8, 8), priority=60)).job  # 8 blocks
        assert job.state == c.JOB_STATE_RUNNING
        assert value(reader, "lightpath.pod.admission.attempts", pod=POD, result="admitted") == 1
        assert value(reader, "lightpath.pod.admission.duration") == 1
        assert value(reader, "lightpath.pod.wiring.duration") == 1
        await until(
            lambda: (
                blocks("allocated") == 8
                and value(reader, "lightpath.pod.jobs", pod=POD, state="RUNNING") == 1
            ),
            "8 blocks allocated to the running job",
        )

        # A lower-priority job takes the other 8; a bigger one then waits in the queue.
        await pod.admit("filler", (16, 8, 4), priority=10)
        waiting = (await pod.admit("big", (16, 16, 4), priority=5)).job
        assert waiting.state == c.JOB_STATE_PENDING
        assert value(reader, "lightpath.pod.admission.attempts", pod=POD, result="queued") == 1
        await until(
            lambda: value(reader, "lightpath.pod.queue.depth", pod=POD) == 1,
            "one job in the pod's queue",
        )

        # A failed block of `train` is replaced by one taken from `filler` (suspended).
        failed = job.blocks[0].block_id
        resp = await pod.fail(failed, "ECC errors")
        assert resp.replacement.failed_block_id == failed
        assert value(reader, "lightpath.pod.block_replacements", pod=POD, result="replaced") == 1
        assert value(reader, "lightpath.pod.block_replacement.duration") == 1
        assert value(reader, "lightpath.pod.preemptions", pod=POD, action="delay") == 1
        await until(lambda: blocks("failed") == 1, "one failed block")
        await pod.settle()
        await until(
            lambda: blocks("failed") == 1 and blocks("free") + blocks("allocated") == 15,
            "the pod's blocks add up",
        )
        assert_listed(reader)
