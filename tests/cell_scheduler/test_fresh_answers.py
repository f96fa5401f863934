"""Answers about a placed job are fresh (issue 30): the pod's state, even where the
cell's record has not followed it."""

from __future__ import annotations

import asyncio
import contextlib

import grpc

from lightpath.client import channel
from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import cell_scheduler_pb2_grpc
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import workload_scheduler_pb2 as ws
from tests.helpers import credentials


async def test_an_answer_about_a_placed_job_is_the_pods_even_where_the_cells_record_lags(
    redis_url,
):
    """Issue 30: an acknowledgement through the cell answered RUNNING for a job its pod
    had ended. Here the cell's record is made to lag (its event count ahead of the pod's,
    so it follows no answer of the pod): what the cell answers is still the pod's."""
    import redis.asyncio as aioredis

    from lightpath.v1 import workload_scheduler_pb2_grpc
    from tests.helpers import one_of_each

    async with contextlib.AsyncExitStack() as stack:
        svc = await one_of_each(stack, redis_url)
        async with channel(svc["cell"].address, max_attempts=1) as ch:
            cell = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while True:  # the pod registers and reports its capacity
                try:
                    sub = await cell.SubmitJob(
                        cs.SubmitJobRequest(
                            spec=ws.JobSpec(
                                job_id="lag-1",
                                shape=c.Shape(dims=[4, 4, 4]),
                                when_no_capacity=ws.WHEN_NO_CAPACITY_FAIL,
                            )
                        )
                    )
                    break
                except grpc.aio.AioRpcError as err:
                    assert loop.time() < deadline, err
                    await asyncio.sleep(0.1)
            assert sub.job.state == c.JOB_STATE_RUNNING, sub.job
            r = aioredis.from_url(redis_url)
            await r.hset("lp:{cell}:job:lag-1", "n", 999)
            await r.aclose()
            # the job ends at its pod (as the cell would end it)
            async with channel(
                svc["ws"].address,
                credentials=credentials("service:cell_scheduler"),
                max_attempts=1,
            ) as wch:
                await workload_scheduler_pb2_grpc.WorkloadSchedulerStub(wch).CompleteJob(
                    ws.CompleteJobRequest(job_id="lag-1")
                )
            got = await cell.GetJob(cs.GetCellJobRequest(job_id="lag-1"))
            assert got.state == c.JOB_STATE_COMPLETED, got
            again = await cell.SubmitJob(  # a retried submit: the acknowledgement
                cs.SubmitJobRequest(
                    spec=ws.JobSpec(
                        job_id="lag-1",
                        shape=c.Shape(dims=[4, 4, 4]),
                        when_no_capacity=ws.WHEN_NO_CAPACITY_FAIL,
                    )
                )
            )
            assert again.job.state == c.JOB_STATE_COMPLETED, again.job
