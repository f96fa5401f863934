"""A pod's domain metrics move with what happens on the pod (issue 18): the real
workload_scheduler and ocs_manager on a real Redis, read through an in-memory reader of
the test's own provider."""

from __future__ import annotations

import asyncio
import functools

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from lightpath.v1 import common_pb2 as c
from services.common.metric_names import BY_OTEL
from services.workload_scheduler import server as ws_server
from services.workload_scheduler.metrics import PodMetrics
from tests.workload_scheduler.conftest import POD, pod_stack


def assert_listed(reader: InMemoryMetricReader) -> None:
    """Every point collected is of an instrument services.common.metric_names lists,
    with exactly its attributes (the dashboards and alert rules are written against it)."""
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                listed = BY_OTEL[m.name]
                for p in m.data.data_points:
                    assert sorted(p.attributes) == sorted(listed.labels), (m.name, p.attributes)


def value(reader: InMemoryMetricReader, name: str, **attrs) -> float:
    """The sum of the points of `name` whose attributes include `attrs` (a histogram: its count)."""
    total = 0.0
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name != name:
                    continue
                for p in m.data.data_points:
                    if all(p.attributes.get(k) == v for k, v in attrs.items()):
                        total += p.count if hasattr(p, "bucket_counts") else p.value
    return total


async def until(check, what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.fixture
def reader(monkeypatch) -> InMemoryMetricReader:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    monkeypatch.setattr(
        ws_server,
        "build",
        functools.partial(ws_server.build, metrics=PodMetrics(meter, refresh_s=0.1)),
    )
    return reader


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
