"""WS-5, issue 15: several failed blocks of one slice are swapped back to back by the calls
that report them, not left to a reconcile round (which these tests push an hour away)."""

from __future__ import annotations

import asyncio

from lightpath.v1 import common_pb2 as c
from tests.workload_scheduler.conftest import pod_stack

RUNNING, SUSPENDED = c.JOB_STATE_RUNNING, c.JOB_STATE_SUSPENDED
NO_RECONCILE = {"LIGHTPATH_WS_RECONCILE_S": "3600"}


def _blocks(job) -> dict[tuple[int, ...], int]:
    return {tuple(b.position.coords): b.block_id for b in job.blocks}


async def test_four_simultaneous_failures_of_one_slice_are_all_swapped(redis_url):
    async with pod_stack(redis_url, ws_environ=NO_RECONCILE) as pod:
        await pod.admit("bystander", (4, 4, 4))
        job = (await pod.admit("train", (8, 8, 4), priority=60)).job  # 2x2x1 blocks
        before = _blocks(job)
        failed = sorted(before.values())
        replies = await asyncio.gather(*(pod.fail(b, "ECC errors") for b in failed))
        # Each report answers with its own block's swap.
        swapped = {}
        for block, reply in zip(failed, replies, strict=True):
            assert reply.HasField("replacement"), reply.action
            assert reply.replacement.job_id == "train"
            assert reply.replacement.failed_block_id == block
            swapped[block] = reply.replacement.new_block_id
        after = await pod.job("train")
        assert after.state == RUNNING
        new_blocks = set(swapped.values())
        assert len(new_blocks) == 4 and not new_blocks & set(failed)
        position = {b: p for p, b in before.items()}
        assert _blocks(after) == {position[f]: n for f, n in swapped.items()}
        # The events say which block was swapped for which.
        reasons = [e.reason for e in after.history]
        for f, n in swapped.items():
            assert any(
                r.startswith(f"block {f} replaced by block {n} at position") for r in reasons
            )
        bystander = await pod.job("bystander")
        assert bystander.state == RUNNING and len(bystander.history) == 3  # untouched
        await pod.assert_consistent()


async def test_failures_past_the_last_spare_suspend_the_slice_and_every_report_says_so(
    redis_url,
):
    async with pod_stack(redis_url, blocks=8, ws_environ=NO_RECONCILE) as pod:
        job = (await pod.admit("train", (8, 8, 4), priority=60)).job  # 4 of 8 blocks
        await pod.admit("peer", (8, 4, 4), priority=60)  # 2 more: 2 spares are left
        failed = sorted(b.block_id for b in job.blocks)
        replies = await asyncio.gather(*(pod.fail(b) for b in failed))
        replaced = [r for r in replies if r.HasField("replacement")]
        assert len(replaced) <= 2
        lost = [r for r in replies if not r.HasField("replacement")]
        assert lost and all("train suspended" in r.action for r in lost), [r.action for r in lost]
        assert (await pod.job("train")).state == SUSPENDED
        assert (await pod.job("peer")).state == RUNNING  # equal priority: never a victim
        await pod.assert_consistent()


async def test_a_reports_block_view_is_the_pods(redis_url):
    async with pod_stack(redis_url, ws_environ=NO_RECONCILE) as pod:
        job = (await pod.admit("train", (8, 4, 4))).job
        held = job.blocks[1].block_id
        reply = await pod.fail(held)  # swapped: the block is failed and free now
        view = await pod.pod()
        assert reply.block == view.blocks[held]
        new = reply.replacement.new_block_id
        reply = await pod.fail(new)  # swapped again
        assert reply.block == (await pod.pod()).blocks[new]
        for b in (held, new):
            reply = await pod.recover(b)
            assert reply.block == (await pod.pod()).blocks[b]
        other = next(b.block_id for b in (await pod.job("train")).blocks)
        reply = await pod.recover(other)  # healthy already: nothing changes
        assert reply.block == (await pod.pod()).blocks[other] and reply.block.job_id == "train"
        assert reply.block.HasField("position")
