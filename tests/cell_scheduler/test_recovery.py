"""CS-6 and X-5 when things break half-way: a forward whose replica died, and a forward
whose pod never answered but got the job after all. The cell's background work finds out
from the pods and leaves exactly one live job."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import workload_scheduler_pb2 as ws
from lightpath_services.cell_scheduler.request import PodModel, resolve
from lightpath_services.cell_scheduler.store import CellStore, b64

RUNNING = c.JOB_STATE_RUNNING


async def _forward_spec(cell, job_id: str, pod_id: str) -> tuple[str, ws.JobSpec]:
    """What the cell stores and forwards for a 1-block job (request b64, pod spec)."""
    req = cs.SubmitJobRequest(spec=ws.JobSpec(job_id=job_id, shape=c.Shape(dims=[4, 4, 4])))
    pods = await cell.pods_view()
    model = PodModel.of(pods[pod_id].registration)
    spec = resolve(req, model, now_ms=0, node_flops={}).spec
    return b64(req.SerializeToString(deterministic=True)), spec


async def _claim_dead(store: CellStore, job_id: str, pod: str, req_b64: str, spec) -> None:
    now = int(time.time() * 1000)
    assert await store.claim_new(
        job_id,
        fields={"req": req_b64, "priority": 50, "spec": b64(spec.SerializeToString())},
        tenant="default",
        pod=pod,
        needs={"tpu": 1},
        token="dead-replica:1",
        until_ms=now - 1,  # its deadline passed: the replica forwarding it is gone
        now_ms=now,
        check_free=False,
        reason=f"forwarding to pod {pod}",
    )


async def _live_holders(cell, job_id: str) -> list[str]:
    out = []
    for pod in cell.pods.values():
        job = await pod.job(job_id)
        if job is not None and job.state not in (c.JOB_STATE_CANCELLED, c.JOB_STATE_COMPLETED):
            out.append(pod.pod_id)
    return out


async def test_a_forward_left_by_a_dead_replica_is_finished_from_what_the_pod_says(
    cell2, redis_url
):
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    store = CellStore(r)
    try:
        # 1. The dead replica's AdmitJob reached pod-a: the cell adopts the pod's job.
        req_b64, spec = await _forward_spec(cell2, "reached", "pod-a")
        await _claim_dead(store, "reached", "pod-a", req_b64, spec)
        admitted = await cell2.pods["pod-a"].ws.AdmitJob(ws.AdmitJobRequest(spec=spec))
        assert admitted.job.state == RUNNING
        job = await cell2.wait_state("reached", RUNNING)
        assert job.pod_id == "pod-a" and job.pod_job.blocks == admitted.job.blocks
        # A client retry of the same submission answers that job.
        again = await cell2.submit("reached", (4, 4, 4))
        assert not again.created and again.job.pod_id == "pod-a"

        # 2. It never arrived: back to the cell queue, and placed like any other job.
        req_b64, spec = await _forward_spec(cell2, "lost", "pod-b")
        await _claim_dead(store, "lost", "pod-b", req_b64, spec)
        job = await cell2.wait_state("lost", RUNNING)
        assert await _live_holders(cell2, "lost") == [job.pod_id]
        reasons = [e["reason"] for e in await store.history("lost")]
        assert any("the forward to pod pod-b was lost" in x for x in reasons), reasons
    finally:
        await r.aclose()


async def test_a_job_a_silent_pod_got_after_all_ends_up_live_once(cell2, redis_url):
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    store = CellStore(r)
    try:
        req_b64, spec = await _forward_spec(cell2, "maybe", "pod-b")
        now = int(time.time() * 1000)
        assert await store.claim_new(
            "maybe",
            fields={"req": req_b64, "priority": 50, "spec": b64(spec.SerializeToString())},
            tenant="default",
            pod="pod-b",
            needs={"tpu": 1},
            token="t1",
            until_ms=now + 60_000,
            now_ms=now,
            check_free=False,
            reason="forwarding to pod pod-b",
        )
        # pod-b got the AdmitJob, but its answer never came back to the cell ...
        await cell2.pods["pod-b"].ws.AdmitJob(ws.AdmitJobRequest(spec=spec))
        assert await store.unbind(
            "maybe",
            token="t1",
            pod="pod-b",
            uncertain=True,
            version="",
            reason="pod pod-b did not answer (UNAVAILABLE)",
            now_ms=now,
        )
        # ... so the job went back to the cell queue. Whether the cell places it anew or
        # finds it on pod-b first, one live job remains, and the cell knows where.
        job = await cell2.wait_state("maybe", RUNNING)

        async def settled():
            holders = await _live_holders(cell2, "maybe")
            rec = await store.job("maybe")
            return holders == [job.pod_id] and not rec.maybe and holders

        await cell2.wait_for(settled, what="one live copy of the job")
        assert not await store.maybe_jobs()
    finally:
        await r.aclose()


async def test_a_job_ended_in_the_cell_that_a_pod_runs_after_all_is_cancelled_there(
    cell2, redis_url
):
    """The chaos bench once left a job cancelled in the cell queue RUNNING and wired on its
    pod: a forward that got no answer, then found nothing when the cell asked, arrived
    after all. The pod's report of the job makes the cell ask again, and the duplicate is
    cancelled; the cell's record stays as it was."""
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    store = CellStore(r)
    try:
        req_b64, spec = await _forward_spec(cell2, "late", "pod-b")
        now = int(time.time() * 1000)
        await store.claim_new(
            "late",
            fields={"req": req_b64, "priority": 50, "spec": b64(spec.SerializeToString())},
            tenant="default",
            pod="",
            needs={"tpu": 10_000},  # no pod of the cell's is that large: it stays queued
            token="",
            until_ms=0,
            now_ms=now,
            check_free=False,
            reason="queued",
        )
        await store.end_queued("late", "CANCELLED", "cancelled in the cell queue", now)
        assert not (await store.job("late")).maybe
        admitted = await cell2.pods["pod-b"].ws.AdmitJob(ws.AdmitJobRequest(spec=spec))
        assert admitted.job.state == RUNNING

        async def cancelled_there():
            job = await cell2.pods["pod-b"].job("late")
            return job is not None and job.state == c.JOB_STATE_CANCELLED and job

        job = await cell2.wait_for(cancelled_there, what="the duplicate on pod-b cancelled")
        assert "duplicate: the cell has this job on the cell" in job.reason
        record = await store.job("late")
        assert (record.phase, record.state) == ("ENDED", "CANCELLED")
        await cell2.wait_for(
            lambda: _no_maybe(store, "late"), what="the cell forgets it asked pod-b"
        )
    finally:
        await r.aclose()


async def _no_maybe(store: CellStore, job_id: str) -> bool:
    return not (await store.job(job_id)).maybe and job_id not in await store.maybe_jobs()
