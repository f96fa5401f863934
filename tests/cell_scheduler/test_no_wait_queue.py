"""Issue 30: a job that asked not to wait (WHEN_NO_CAPACITY_FAIL) is in the cell queue
only between a pod's refusal and its own submit's next try or refusal. The dispatcher
never forwards it from there (it did: the job was placed while its caller was told
"not placed, nothing kept", and held blocks nobody would end); one left there by a
forward that never finished is refused and forgotten."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import workload_scheduler_pb2 as ws
from lightpath_services.cell_scheduler.request import PodModel, resolve
from lightpath_services.cell_scheduler.store import CellStore, b64
from tests.cell_scheduler.test_recovery import _live_holders


async def _refused_once(cell, store: CellStore, job_id: str, *, back_at_ms: int) -> None:
    """The job as a pod's refusal leaves it: claimed for pod-a, then back in the queue."""
    req = cs.SubmitJobRequest(
        spec=ws.JobSpec(
            job_id=job_id,
            shape=c.Shape(dims=[4, 4, 4]),
            when_no_capacity=ws.WHEN_NO_CAPACITY_FAIL,
        )
    )
    model = PodModel.of((await cell.pods_view())["pod-a"].registration)
    spec = resolve(req, model, now_ms=0, node_flops={}).spec
    now = int(time.time() * 1000)
    token = f"live-replica:{job_id}"
    assert await store.claim_new(
        job_id,
        fields={
            "req": b64(req.SerializeToString(deterministic=True)),
            "priority": 50,
            "spec": b64(spec.SerializeToString()),
        },
        tenant="default",
        pod="pod-a",
        needs={"tpu": 1},
        token=token,
        until_ms=now + 60_000,  # its replica is alive and forwarding it
        now_ms=now,
        check_free=False,
        reason="forwarding to pod pod-a",
    )
    assert await store.unbind(
        job_id,
        token=token,
        pod="pod-a",
        uncertain=False,
        version="",
        reason="pod pod-a refused it: busy",
        now_ms=back_at_ms,
    )


async def test_the_dispatcher_leaves_a_no_wait_job_to_its_own_submit(cell2, redis_url):
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    store = CellStore(r)
    try:
        now = int(time.time() * 1000)
        await _refused_once(cell2, store, "deciding", back_at_ms=now)
        await _refused_once(cell2, store, "abandoned", back_at_ms=now - 3_600_000)
        # Another submit kicks the dispatcher; the pods have room for every job.
        done = await cell2.submit("other", (4, 4, 4))
        assert done.job.state == c.JOB_STATE_RUNNING

        async def abandoned_forgotten():
            return await store.job("abandoned") is None

        await cell2.wait_for(abandoned_forgotten, what="the abandoned no-wait job forgotten")
        # Passes over the queue came and went: the job still deciding was not forwarded.
        record = await store.job("deciding")
        assert record is not None and record.phase == "QUEUED", record
        for job_id in ("deciding", "abandoned"):
            assert await _live_holders(cell2, job_id) == []
    finally:
        await r.aclose()
