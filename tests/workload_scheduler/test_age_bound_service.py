"""The queue's age bound through the real workload_scheduler and ocs_manager (real Redis,
gRPC): a large job that later, smaller jobs of its priority keep overtaking takes their
blocks once it has waited LIGHTPATH_WS_AGE_BOUND_S; with the bound off it starves."""

from __future__ import annotations

import pytest

from lightpath.v1 import common_pb2 as c
from lightpath.v1 import workload_scheduler_pb2 as ws
from tests.workload_scheduler.conftest import pod_stack


@pytest.mark.parametrize(("bound", "big_runs"), [("0", True), ("off", False), (None, False)])
async def test_a_large_job_past_the_age_bound_takes_the_blocks_of_younger_ones(
    redis_url, bound, big_runs
):
    # None: the default bound (an hour), which this test never reaches
    environ = {} if bound is None else {"LIGHTPATH_WS_AGE_BOUND_S": bound}
    async with pod_stack(redis_url, blocks=4, ws_environ=environ) as pod:
        assert (await pod.admit("first", (8, 4, 4))).job.state == c.JOB_STATE_RUNNING
        big = (await pod.admit("big", (16, 4, 4))).job  # all 4 blocks: 2 are held
        assert big.state == c.JOB_STATE_PENDING
        # a later job of the same priority fits in the 2 free blocks: it starts
        assert (await pod.admit("later", (8, 4, 4))).job.state == c.JOB_STATE_RUNNING
        await pod.settle()
        assert (await pod.job("big")).state == c.JOB_STATE_PENDING  # first is older: kept
        await pod.ws.CompleteJob(ws.CompleteJobRequest(job_id="first"))
        await pod.settle()
        big, later = await pod.job("big"), await pod.job("later")
        if big_runs:
            assert big.state == c.JOB_STATE_RUNNING
            assert sorted(b.block_id for b in big.blocks) == [0, 1, 2, 3]
            assert later.state == c.JOB_STATE_SUSPENDED  # preempted (DELAY), requeued
            assert "big" in later.reason
        else:
            assert big.state == c.JOB_STATE_PENDING
            assert later.state == c.JOB_STATE_RUNNING
            # and a third job takes the 2 blocks first freed: big would starve
            assert (await pod.admit("third", (8, 4, 4))).job.state == c.JOB_STATE_RUNNING
        await pod.assert_consistent()


@pytest.mark.parametrize(("bound", "swapped"), [("0", True), ("off", False)])
async def test_a_swap_past_the_age_bound_takes_a_block_of_a_younger_slice(
    redis_url, bound, swapped
):
    """No free block and no lower priority: past the bound the older slice swaps its
    failed block for one of the younger slice's (which is requeued) instead of being
    suspended itself."""
    environ = {"LIGHTPATH_WS_AGE_BOUND_S": bound}
    async with pod_stack(redis_url, ws_environ=environ) as pod:
        await pod.admit("older", (16, 8, 4))  # 8 of the 16 blocks
        await pod.admit("younger", (16, 8, 4))  # the other 8
        failed = (await pod.job("older")).blocks[2].block_id
        resp = await pod.fail(failed)
        older, younger = await pod.job("older"), await pod.job("younger")
        if swapped:
            assert [v.job_id for v in resp.replacement.preempted] == ["younger"]
            assert older.state == c.JOB_STATE_RUNNING
            assert failed not in {b.block_id for b in older.blocks}
            assert younger.state == c.JOB_STATE_SUSPENDED
            assert "older" in younger.reason and "age bound" in younger.reason
        else:
            assert not resp.HasField("replacement") and "older suspended" in resp.action
            assert older.state == c.JOB_STATE_SUSPENDED
            assert younger.state == c.JOB_STATE_RUNNING
        await pod.settle()
        await pod.assert_consistent()
