"""Issue 35: a borrower's job that a reclaim delays goes back to the CELL queue (its quota
charge given back), through the real cell (two replicas), pods and Redis over gRPC/TLS.

The pod lets the job go in the commit that preempts it; the cell learns it from the pod's
event of it (the report) or, sooner, from the pod's answer about the job. The two are
split when the cell replica the pod reports to goes away in between: the pod no longer
has the job, the cell still has it placed — the job runs nowhere — and the pod's event
stream keeps the release until a cell acknowledges it, so the report that reaches a
replica again queues it. Either way it is queued once.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from google.protobuf import field_mask_pb2

from lightpath.embedded_redis import free_port
from lightpath.testing.relay import RelayProcess
from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import common_pb2
from lightpath.v1 import workload_scheduler_pb2 as ws
from lightpath_services.cell_scheduler.store import PLACED, QUEUED, CellStore, pad_id
from lightpath_services.common.keys import cell_key, pod_key
from tests.cell_scheduler.conftest import Cell, cell_stack

PENDING = common_pb2.JOB_STATE_PENDING
RUNNING = common_pb2.JOB_STATE_RUNNING
DELAY = common_pb2.PREEMPTION_POLICY_DELAY


async def _used(cell: Cell, tenant: str) -> int:
    resp = await cell.cells[1].ListQuotas(cs.ListQuotasRequest(tenant=tenant))
    return next((q.used_chips.get("tpu", 0) for q in resp.quotas if q.tenant == tenant), 0)


@pytest.mark.parametrize("learnt_from", ["report", "answer", "update"])
async def test_a_released_job_is_queued_once_when_its_report_is_held_up(
    redis_url, tmp_path, learnt_from
):
    listen = f"127.0.0.1:{free_port()}"
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    store = CellStore(r)
    relay = RelayProcess({listen: ""}, delay_ms=0, on=False)
    async with cell_stack(
        redis_url,
        pods=(("pod-a", 4, "tpu"), ("pod-b", 1, "tpu")),
        replicas=2,
        cell_env={"LIGHTPATH_CELL_POD_TIMEOUT_S": "60"},
    ) as cell:
        try:
            # the pod reports through a link the test cuts: to replica 0, later replica 1
            relay.routes = {listen: cell.cell_addresses[0]}
            relay.start(tmp_path / "relay.log")
            cell.pods["pod-a"].ws_env["LIGHTPATH_CELL_ADDR"] = listen
            await cell.stop_pod("pod-a")
            await cell.start_pod("pod-a")
            await cell.wait_ready()
            for tenant, chips in (("owner", 256), ("guest", 64)):
                await cell.cells[1].SetQuota(
                    cs.SetQuotaRequest(
                        quota=cs.Quota(tenant=tenant, nominal_chips={"tpu": chips}, cohort="lab")
                    )
                )
            # pod-b is full with a job of a tenant without a quota; pod-a will be the guest's
            await cell.submit("filler", tenant="third", priority=95, only_pod="pod-b", replica=1)
            # the whole of pod-a: 64 nominal + 192 borrowed; g3, of the lowest priority,
            # asked not to wait (it was placed at once: once back in the cell queue it
            # waits like any)
            for i in range(4):
                sub = await cell.submit(
                    f"g{i}",
                    tenant="guest",
                    priority=60 if i == 3 else 90,
                    preemption_policy=DELAY,
                    when_no_capacity=ws.WHEN_NO_CAPACITY_FAIL if i == 3 else 0,
                    replica=1,
                )
                assert sub.job.state == RUNNING and sub.job.pod_id == "pod-a", sub.job
            seen: list[common_pb2.JobEvent] = []  # g3 followed through the cell throughout

            async def watch():
                async for ev in cell.cells[1].WatchJob(cs.WatchCellJobRequest(job_id="g3")):
                    seen.append(ev)

            watcher = asyncio.ensure_future(watch())

            async def watching():  # the pod's events of g3 relayed
                return any(e.to_state == RUNNING for e in seen)

            await cell.wait_for(watching, what="g3's watch under way")
            relay.stop()  # replica 0 is gone for the pod: its reports fail from now on

            await cell.submit("own-1", tenant="owner", priority=10, replica=1)
            pod = cell.pods["pod-a"]

            async def reclaimed():
                job = await pod.job("own-1")
                return job is not None and job.state == RUNNING and await pod.job("g3") is None

            await cell.wait_for(reclaimed, what="own-1 running in g3's place")
            record = await store.job("g3")
            assert record is not None and record.phase == PLACED and record.pod == "pod-a"
            assert await _used(cell, "guest") == 256  # still charged: the cell does not know

            if learnt_from == "answer":  # asked about it, the pod says it let it go
                view = await cell.job("g3", replica=1)
                assert view.state == PENDING and view.cell_queue_position == 1, view
            if learnt_from == "update":  # so does its update, then made in the cell queue
                view = await cell.cells[1].UpdateJob(
                    cs.UpdateCellJobRequest(
                        spec=ws.JobSpec(job_id="g3", priority=61),
                        update_mask=field_mask_pb2.FieldMask(paths=["priority"]),
                    )
                )
                assert view.state == PENDING and view.priority == 61, view
            relay = RelayProcess({listen: cell.cell_addresses[1]}, delay_ms=0, on=False)
            relay.start(tmp_path / "relay.log")  # the pod reaches the other replica

            async def acknowledged():
                ack = await r.hget(cell_key("ack"), "pod-a")
                tip = await r.xrevrange(pod_key("pod-a", "ws", "events"), count=1)
                return ack and tip and ack == pad_id(tip[0][0])

            await cell.wait_for(acknowledged, what="the pod's events acknowledged")

            # Its quota allows it again, and the cell may try pod-a, where the owner's
            # job is of lower priority: the pod refuses (never a victim of the jobs it
            # reclaimed from), so it settles in the cell queue, its charge given back.
            # (A forward the pod then refuses takes it out of the queue for a moment: the
            # record and the queue are read until they agree.)
            async def settled():
                rec = await store.job("g3")
                queued = rec is not None and rec.phase == QUEUED
                in_queue = queued and await r.zrange(cell_key("queue"), 0, -1) == ["g3"]
                return rec if in_queue and await _used(cell, "guest") == 192 else None

            record = await cell.wait_for(settled, what="g3 back in the cell queue, uncharged")
            assert record.pod == "" and record.reclaimed == 1
            assert (await pod.job("own-1")).state == RUNNING
            back = [e for e in await store.history("g3") if "reclaimed on pod" in e["reason"]]
            assert len(back) == 1, back
            assert back[0]["to"] == "PENDING" and back[0]["pod"] == "pod-a"
            assert "resumes from its checkpoint" in back[0]["reason"]
            # it waits for room (both pods are full), then goes where there is some: the
            # other pod, and only there
            await cell.cells[1].CompleteJob(cs.CompleteCellJobRequest(job_id="filler"))
            placed = await cell.wait_state("g3", RUNNING)
            assert placed.pod_id == "pod-b"
            assert await pod.job("g3") is None and await _used(cell, "guest") == 256
            # its watcher saw it leave the pod, queued again, and run again from its
            # pod's first event (the pod numbers the job anew)
            await cell.wait_for(lambda: _ran_again(seen), what="g3's second run in its watch")
            watcher.cancel()
            names = [(_name(e.from_state), _name(e.to_state)) for e in seen]
            back_at = next(i for i, e in enumerate(seen) if "reclaimed on pod" in e.reason)
            assert ("RUNNING", "SUSPENDED") in names[:back_at], names
            assert names[back_at] == ("RUNNING", "PENDING"), names
            assert ("WIRING", "RUNNING") in names[back_at:], names
        finally:
            relay.stop()
            await r.aclose()


def _name(state: int) -> str:
    return common_pb2.JobState.Name(state).removeprefix("JOB_STATE_")  # type: ignore[arg-type]


async def _ran_again(seen: list[common_pb2.JobEvent]) -> bool:
    back = [i for i, e in enumerate(seen) if "reclaimed on pod" in e.reason]
    return bool(back) and any(e.to_state == RUNNING for e in seen[back[0] :])
