"""Issue 28 through the real workload_scheduler and ocs_manager (real Redis, gRPC):
sub-block slices share blocks with no OCS change, complete and free their chips, and
move off failed hosts; a failed host under a block slice swaps its block."""

from __future__ import annotations

import grpc
import pytest

from lightpath.v1 import common_pb2 as c
from lightpath.v1 import ocs_manager_pb2
from lightpath.v1 import workload_scheduler_pb2 as ws
from tests.workload_scheduler.conftest import pod_stack

NO_RECONCILE = {"LIGHTPATH_WS_RECONCILE_S": "3600"}


def _chips(box: ws.ChipBox) -> set[tuple[int, int, int]]:
    (ox, oy, oz), (ex, ey, ez) = box.offset.coords, box.chips.dims
    return {(ox + x, oy + y, oz + z) for x in range(ex) for y in range(ey) for z in range(ez)}


def _host(chip) -> int:  # 2x2x1 hosts of a 4x4x4 block: a 2x2x4 grid of hosts
    x, y, z = chip
    return x // 2 + 2 * (y // 2) + 4 * z


async def test_sub_block_slices_share_a_block_and_need_no_ocs_change(redis_url):
    async with pod_stack(redis_url, blocks=4, ws_environ=NO_RECONCILE) as pod:
        jobs = {}
        for name, shape in [("one", (1, 1, 1)), ("pair", (1, 1, 2)), ("host", (2, 2, 1))]:
            reply = await pod.admit(name, shape)
            jobs[name] = reply.job
            assert reply.job.state == c.JOB_STATE_RUNNING, reply.job.reason
            assert "no OCS change" in reply.job.reason
            assert list(reply.job.wrap) == [False, False, False]  # a mesh
            assert list(reply.job.chips.dims) == list(shape)
            assert await pod.wiring(name) is None  # nothing at the ocs_manager
        blocks = {j.box.block_id for j in jobs.values()}
        assert blocks == {3}  # packed together, on the highest block
        taken = [_chips(j.box) for j in jobs.values()]
        assert sum(map(len, taken)) == len(set().union(*taken)) == 7
        big = (await pod.admit("big", (8, 4, 4))).job  # block slices keep the low ids
        assert {b.block_id for b in big.blocks} == {0, 1}
        view = await pod.assert_consistent()
        block = view.blocks[3]
        assert block.chips_free == 57 and not block.job_id
        summaries = {j.job_id: j for j in view.live_jobs}
        assert all(summaries[name].box == job.box for name, job in jobs.items())
        assert not summaries["big"].HasField("box") and not summaries["big"].twisted
        assert {b.job_id for b in block.boxes} == set(jobs)
        (tpu,) = view.types
        assert (tpu.chips_total, tpu.chips_used, tpu.chips_free) == (256, 135, 121)
        assert (tpu.free, tpu.allocated) == (1, 3)
        for name in jobs:
            done = await pod.ws.CompleteJob(ws.CompleteJobRequest(job_id=name))
            assert done.state == c.JOB_STATE_COMPLETED
        view = await pod.assert_consistent()
        assert view.blocks[3].availability == c.BLOCK_AVAILABILITY_FREE
        assert view.blocks[3].chips_free == 64 and not view.blocks[3].boxes


async def test_a_failed_host_moves_the_sub_block_slices_on_it_and_only_them(redis_url):
    async with pod_stack(redis_url, blocks=2, ws_environ=NO_RECONCILE) as pod:
        first = (await pod.admit("first", (2, 2, 1))).job
        second = (await pod.admit("second", (2, 2, 1))).job
        host = _host(next(iter(_chips(first.box))))
        assert all(_host(ch) == host for ch in _chips(first.box))
        reply = await pod.host(first.box.block_id, host, reason="PCIe errors")
        assert reply.affected_jobs == ["first"]
        (move,) = reply.moved
        assert move.job_id == "first" and getattr(move, "from") == first.box
        assert all(_host(ch) != host for ch in _chips(move.to))
        assert reply.block.failed_hosts == [host]
        after = await pod.job("first")
        assert after.state == c.JOB_STATE_RUNNING and after.box == move.to
        assert "moved off failed chips" in after.reason
        assert (await pod.job("second")).box == second.box  # untouched
        view = await pod.assert_consistent()
        degraded = view.blocks[first.box.block_id]
        assert degraded.health == c.BLOCK_HEALTH_FAILED and degraded.chips_free == 64 - 4 - 8
        # A block slice cannot use the degraded block; the other block is still free.
        whole = (await pod.admit("whole", (4, 4, 4))).job
        assert [b.block_id for b in whole.blocks] == [1 - first.box.block_id]
        # Recovery: the host is back, the block is healthy again.
        reply = await pod.host(first.box.block_id, host, failed=False)
        assert not reply.block.failed_hosts and reply.block.health == c.BLOCK_HEALTH_HEALTHY
        await pod.assert_consistent()


async def test_a_failed_host_under_a_block_slice_swaps_the_block(redis_url):
    async with pod_stack(redis_url, blocks=3, ws_environ=NO_RECONCILE) as pod:
        job = (await pod.admit("train", (4, 4, 4))).job
        (held,) = [b.block_id for b in job.blocks]
        reply = await pod.host(held, 5, reason="host down")
        assert reply.HasField("replacement"), reply.action
        assert reply.replacement.failed_block_id == held
        new = reply.replacement.new_block_id
        assert [b.block_id for b in (await pod.job("train")).blocks] == [new]
        # The degraded block serves sub-block slices on its 15 healthy hosts.
        small = (await pod.admit("small", (2, 4, 4))).job
        assert small.box.block_id == held and all(_host(ch) != 5 for ch in _chips(small.box))
        await pod.assert_consistent()


async def test_a_failed_block_under_sub_block_slices_moves_them_all(redis_url):
    async with pod_stack(redis_url, blocks=3, ws_environ=NO_RECONCILE) as pod:
        a = (await pod.admit("a", (2, 2, 2))).job
        b = (await pod.admit("b", (1, 2, 2))).job
        assert a.box.block_id == b.box.block_id
        reply = await pod.fail(a.box.block_id, "power")
        assert sorted(reply.affected_jobs) == ["a", "b"]
        for name in ("a", "b"):
            now = await pod.job(name)
            assert now.state == c.JOB_STATE_RUNNING and now.box.block_id != a.box.block_id
        await pod.assert_consistent()


async def test_a_host_outside_the_block_is_refused_naming_host(redis_url):
    async with pod_stack(redis_url, blocks=1, ws_environ=NO_RECONCILE) as pod:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pod.host(0, 16)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "host" in err.value.details() and "0..15" in err.value.details()
        slices = await pod.ocs.ListSlices(ocs_manager_pb2.ListSlicesRequest())
        assert not slices.slices
        view = await pod.pod()
        assert not view.blocks[0].failed_hosts


async def test_a_block_slice_preempts_the_lower_priority_sub_block_slices_of_a_block(redis_url):
    async with pod_stack(redis_url, blocks=1, ws_environ=NO_RECONCILE) as pod:
        await pod.admit("a", (2, 2, 2), priority=10)
        await pod.admit(
            "b", (2, 2, 2), priority=20, preemption_policy=c.PREEMPTION_POLICY_TERMINATE
        )
        reply = await pod.admit("whole", (4, 4, 4), priority=70)
        assert reply.job.state == c.JOB_STATE_RUNNING, reply.job.reason
        assert {p.job_id: p.action for p in reply.preempted} == {
            "a": c.PREEMPTION_POLICY_DELAY,
            "b": c.PREEMPTION_POLICY_TERMINATE,
        }
        assert {p.job_id: list(p.blocks_taken) for p in reply.preempted} == {"a": [0], "b": [0]}
        assert (await pod.job("a")).state == c.JOB_STATE_SUSPENDED
        assert (await pod.job("b")).state == c.JOB_STATE_PREEMPTED
        view = await pod.assert_consistent()
        assert view.blocks[0].job_id == "whole" and not view.blocks[0].boxes


async def test_cancel_update_and_a_dry_run_work_for_sub_block_slices(redis_url):
    async with pod_stack(redis_url, blocks=1, ws_environ=NO_RECONCILE) as pod:
        dry = await pod.ws.AdmitJob(
            ws.AdmitJobRequest(
                spec=ws.JobSpec(job_id="x", shape=c.Shape(dims=[1, 2, 2])), validate_only=True
            )
        )
        assert dry.outcome == "placed on chips 1x2x2 at (0,0,0) of block 0", dry.outcome
        assert (await pod.pod()).blocks[0].chips_free == 64  # nothing kept
        await pod.admit("x", (1, 2, 2), priority=30)
        updated = await pod.ws.UpdateJob(
            ws.UpdateJobRequest(
                spec=ws.JobSpec(job_id="x", priority=90),
                update_mask={"paths": ["priority"]},
            )
        )
        assert updated.priority == 90 and updated.state == c.JOB_STATE_RUNNING
        assert updated.HasField("box")
        cancelled = await pod.ws.CancelJob(ws.CancelJobRequest(job_id="x", reason="done early"))
        assert cancelled.state == c.JOB_STATE_CANCELLED and not cancelled.HasField("box")
        view = await pod.assert_consistent()
        assert view.blocks[0].availability == c.BLOCK_AVAILABILITY_FREE


async def test_two_replicas_packing_and_freeing_at_once_never_share_a_chip(redis_url):
    """Replicas race to place, complete and move sub-block slices on the same blocks:
    each commit re-checks the chips, the block's owner and the hosts it assumed."""
    import asyncio
    import random

    rng = random.Random(7)
    shapes = [(1, 1, 1), (1, 1, 2), (1, 2, 2), (2, 2, 2), (2, 2, 4), (2, 4, 4)]
    async with pod_stack(redis_url, blocks=4, replicas=2) as pod:

        async def one(i: int) -> None:
            name = f"s{i}"
            reply = await pod.admit(name, rng.choice(shapes), replica=i % 2)
            if reply.job.state == c.JOB_STATE_RUNNING and i % 3 == 0:
                await pod.schedulers[(i + 1) % 2].CompleteJob(ws.CompleteJobRequest(job_id=name))

        await asyncio.gather(*(one(i) for i in range(40)))
        await pod.host(3, 0)
        await pod.settle()
        view = await pod.assert_consistent()  # chips disjoint, boxes where the jobs say
        held = sum(b.chips_free for b in view.blocks)
        (tpu,) = view.types
        assert tpu.chips_free == held and tpu.chips_used + tpu.chips_free + tpu.chips_failed == 256
