"""The SDK's cell client against a real cell (cell_scheduler and two pods over TLS on
a real Redis): async and blocking forms, paging, waits, typed errors."""

from __future__ import annotations

import asyncio

import pytest

from lightpath.embedded_redis import free_port
from lightpath.errors import FieldViolation
from lightpath.sdk import (
    AsyncCell,
    Cell,
    InvalidArgument,
    JobEnded,
    LightpathError,
    NotFound,
    ResourceExhausted,
    Unavailable,
    WaitTimeout,
    state_name,
)
from lightpath.sdk.cell import job_state
from lightpath.v1 import common_pb2 as c
from tests.cell_scheduler.conftest import cell_stack


async def test_submit_get_wait_complete_with_the_async_client(cell2):
    async with AsyncCell(cell2.cell_addresses[0]) as cell:
        resp = await cell.submit("sdk-1", "8x8x4", priority_class="high", tenant="acme")
        assert resp.created and resp.job.tenant == "acme" and resp.job.priority == 80
        again = await cell.submit("sdk-1", "8x8x4", priority_class="high", tenant="acme")
        assert not again.created and again.job.job_id == "sdk-1"

        job = await cell.wait_running("sdk-1", timeout=30)
        assert state_name(job.state) == "RUNNING" and job.pod_id in {"pod-a", "pod-b"}
        assert (await cell.get("sdk-1")).block_count == 4

        seen = []
        async for event in cell.watch("sdk-1"):  # history first, then live: leave early
            seen.append(state_name(event.to_state))
            if event.to_state == c.JOB_STATE_RUNNING:
                break
        assert seen[0] == "PENDING" and seen[-1] == "RUNNING"


async def test_wait_ended_follows_the_job_to_its_end(cell2):
    async with AsyncCell(cell2.cell_addresses[0]) as cell:
        await cell.submit("sdk-2", (4, 4, 4))
        await cell.wait_running("sdk-2", timeout=30)
        waiter = asyncio.create_task(cell.wait_ended("sdk-2", timeout=30))
        await asyncio.sleep(0)  # the waiter follows the job's transitions
        done = await cell.complete("sdk-2")
        ended = await waiter
        assert state_name(ended.state) == "COMPLETED" == state_name(done.state)
        history = [state_name(e.to_state) async for e in cell.watch("sdk-2")]
        assert history[-1] == "COMPLETED" and "RUNNING" in history

        with pytest.raises(JobEnded) as ended_err:
            await cell.wait_running("sdk-2", timeout=5)
        assert ended_err.value.job.state == c.JOB_STATE_COMPLETED
        assert "ended COMPLETED before it was RUNNING" in str(ended_err.value)


async def test_a_wait_that_runs_out_of_time_is_a_timeout(cell2):
    async with AsyncCell(cell2.cell_addresses[0]) as cell:
        await cell.submit("big", "8x8x8", blocks=False)  # all 8 blocks of one pod
        await cell.wait_running("big", timeout=30)
        await cell.submit("big-2", "8x8x8")
        await cell.wait_running("big-2", timeout=30)
        await cell.submit("queued", "4x4x4")  # both pods full: it waits in a queue
        with pytest.raises(WaitTimeout) as err:
            await cell.wait_running("queued", timeout=0.5)
        assert isinstance(err.value, TimeoutError)
        assert state_name(err.value.job.state) == "PENDING"
        assert "was not RUNNING within 0.5 s (it is PENDING)" in str(err.value)
        with pytest.raises(ResourceExhausted):
            await cell.submit("no-wait", "4x4x4", wait=False)


# Paging and filters, not pods going silent: the pods run in this process, and a stall of
# it past cell2's 1.5 s pod timeout had the cell mark them down, their jobs UNKNOWN until
# the next heartbeat (once in a loaded full run: the RUNNING filter missed those jobs). A
# pod timeout beyond the test's own (pytest-timeout, 300 s) puts that out of its reach.
PATIENT_CELL = {"LIGHTPATH_CELL_POD_TIMEOUT_S": "3600"}


async def test_list_jobs_pages_through_every_job(redis_url):
    async with (
        cell_stack(redis_url, cell_env=PATIENT_CELL) as stack,
        AsyncCell(stack.cell_addresses[0]) as cell,
    ):
        for i in range(7):
            await cell.submit(f"p-{i}", (1, 1, 1), blocks=True, tenant="paged")
        ids = [j.job_id async for j in cell.list_jobs(tenant="paged", page_size=3)]
        assert ids == [f"p-{i}" for i in reversed(range(7))]
        first = await cell.list_jobs_page(tenant="paged", page_size=3)
        assert len(first.jobs) == 3 and first.next_page_token
        rest = [
            j.job_id
            async for j in cell.list_jobs(
                tenant="paged", page_size=3, page_token=first.next_page_token
            )
        ]
        assert rest == ids[3:]
        assert len([j async for j in cell.list_jobs(tenant="paged", limit=4, page_size=3)]) == 4
        running = [j.job_id async for j in cell.list_jobs(tenant="paged", states=["running"])]
        assert sorted(running) == sorted(ids)
        assert [j async for j in cell.list_jobs(tenant="paged", states=["cancelled"])] == []


async def test_failures_are_typed_errors_with_their_details(cell2):
    async with AsyncCell(cell2.cell_addresses[0]) as cell:
        with pytest.raises(NotFound) as missing:
            await cell.get("nope")
        assert missing.value.code == "NOT_FOUND" and "nope" in str(missing.value)
        assert missing.value.address == cell2.cell_addresses[0]
        with pytest.raises(InvalidArgument) as bad:
            await cell.submit("bad", "6x4x4")
        assert any(v.field == "spec.shape.dims[0]" for v in bad.value.violations)
        assert all(isinstance(v, FieldViolation) for v in bad.value.violations)
        assert bad.value.reason and bad.value.reason != "LIGHTPATH_ERROR"
        with pytest.raises(ValueError, match="one of PENDING, WIRING, RUNNING"):
            job_state("runing")


async def test_nothing_listening_is_unavailable_naming_the_address():
    address = f"127.0.0.1:{free_port()}"
    async with AsyncCell(address, timeout=5, max_attempts=2) as cell:
        with pytest.raises(Unavailable) as err:
            await cell.get("x")
    assert err.value.address == address and err.value.address_source == "the address given"
    assert isinstance(err.value, LightpathError)


async def test_the_blocking_client_does_the_same_from_a_thread(redis_url):
    async with cell_stack(redis_url, pods=(("pod-a", 8, "tpu"),)) as stack:

        def job_system() -> tuple[str, list[str], str]:
            with Cell(stack.cell_addresses[0]) as cell:
                cell.submit("sync-1", "4x4x4", labels={"user": "ada"})
                running = cell.wait_running("sync-1", timeout=30)
                listed = [j.job_id for j in cell.list_jobs(page_size=1)]
                cell.cancel("sync-1", reason="done")
                try:
                    cell.get("missing")
                except NotFound as err:
                    missing = err.code
                return state_name(running.state), listed, missing

        state, listed, missing = await asyncio.to_thread(job_system)
        assert (state, listed, missing) == ("RUNNING", ["sync-1"], "NOT_FOUND")


async def test_update_priority_and_labels_and_prefer_a_pod(cell2):
    async with AsyncCell(cell2.cell_addresses[0]) as cell:
        resp = await cell.submit("sdk-u", "4x4x4", labels={"team": "ml", "env": "dev"}, pod="pod-b")
        assert resp.job.pod_id == "pod-b"  # preferred (the tie would go to pod-a)
        job = await cell.update("sdk-u", priority=70, labels={"env": "prod", "team": None})
        assert job.priority == 70 and dict(job.spec.labels) == {"env": "prod"}
        job = await cell.update("sdk-u", priority_class="low")
        assert job.priority == 20 and job.spec.priority == 0
        job = await cell.update("sdk-u", labels={"only": "this"}, replace_labels=True)
        assert dict(job.spec.labels) == {"only": "this"}
        with pytest.raises(InvalidArgument) as bad:
            await cell.update("sdk-u", priority=0)
        assert [v.field for v in bad.value.violations] == ["spec.priority"]
        with pytest.raises(InvalidArgument) as nothing:
            await cell.update("sdk-u")
        assert nothing.value.violations[0].field == "update_mask"
        with pytest.raises(InvalidArgument) as unknown:
            await cell.submit("sdk-v", "4x4x4", pod="pod-z", require_pod=True)
        assert unknown.value.violations[0].field == "preferred_pod"
        with pytest.raises(NotFound):
            await cell.update("sdk-missing", priority=5)
    # the blocking form wraps the same
    blocking = await asyncio.to_thread(_blocking_update, cell2.cell_addresses[0])
    assert blocking == 33


def _blocking_update(address: str) -> int:
    with Cell(address) as cell:
        return cell.update("sdk-u", priority=33).priority


async def test_sub_block_slices_twisted_tori_and_host_reports(cell2):
    # Issue 28: a box inside one block, a twisted torus, one host of a block.
    async with AsyncCell(cell2.cell_addresses[0]) as cell:
        small = (await cell.submit("sdk-box", "2x2x1", node_type="tpu")).job
        assert state_name(small.state) == "RUNNING" and small.block_count == 0
        assert list(small.spec.node_type_counts.items()) == [("tpu", 1)]
        box = small.pod_job.box
        assert list(box.chips.dims) == [2, 2, 1] and box.job_id == "sdk-box"

        twisted = (await cell.submit("sdk-tw", "4x4x8", twisted=True)).job
        assert twisted.spec.twisted and state_name(twisted.state) == "RUNNING"
        with pytest.raises(InvalidArgument) as bad:
            await cell.submit("sdk-tw-bad", "4x8x12", twisted=True)
        assert [v.field for v in bad.value.violations] == ["spec.twisted"]

        failed = await cell.report_block_health(
            small.pod_id, box.block_id, failed=True, host=15, reason="PSU"
        )
        assert list(failed.block.failed_hosts) == [15]
        healthy = await cell.report_block_health(small.pod_id, box.block_id, failed=False, host=15)
        assert not healthy.block.failed_hosts
        with pytest.raises(InvalidArgument) as bad:
            await cell.report_block_health(small.pod_id, box.block_id, failed=True, host=99)
        assert [v.field for v in bad.value.violations] == ["host"]
