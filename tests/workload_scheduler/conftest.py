"""The real workload_scheduler and the real ocs_manager on a real Redis, over gRPC."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import pytest

from lightpath.client import ErrorReport, channel, error_report
from lightpath.v1 import (
    common_pb2,
    ocs_manager_pb2,
    ocs_manager_pb2_grpc,
    workload_scheduler_pb2_grpc,
)
from lightpath.v1 import workload_scheduler_pb2 as ws
from tests.helpers import serve

POD = "pod-w"


@dataclass
class PodStack:
    """One ocs_manager and one or more workload_scheduler replicas of pod POD."""

    ocs: ocs_manager_pb2_grpc.OcsManagerStub
    schedulers: list[workload_scheduler_pb2_grpc.WorkloadSchedulerStub]
    addresses: list[str] = field(default_factory=list)

    @property
    def ws(self) -> workload_scheduler_pb2_grpc.WorkloadSchedulerStub:
        return self.schedulers[0]

    async def admit(self, job_id: str, chips=(4, 4, 4), *, replica: int = 0, **spec):
        spec.setdefault("shape", common_pb2.Shape(dims=list(chips)))
        return await self.schedulers[replica].AdmitJob(
            ws.AdmitJobRequest(spec=ws.JobSpec(job_id=job_id, **spec))
        )

    async def job(self, job_id: str) -> ws.Job:
        return await self.ws.GetJob(ws.GetJobRequest(job_id=job_id))

    async def pod(self) -> ws.PodView:
        return await self.ws.GetPod(ws.GetPodRequest())

    async def fail(self, block: int, reason: str = "test"):
        return await self.ws.ReportBlockHealth(
            ws.ReportBlockHealthRequest(
                block_id=block, health=common_pb2.BLOCK_HEALTH_FAILED, reason=reason
            )
        )

    async def recover(self, block: int):
        return await self.ws.ReportBlockHealth(
            ws.ReportBlockHealthRequest(block_id=block, health=common_pb2.BLOCK_HEALTH_HEALTHY)
        )

    async def host(self, block: int, host: int, *, failed: bool = True, reason: str = "test"):
        health = common_pb2.BLOCK_HEALTH_FAILED if failed else common_pb2.BLOCK_HEALTH_HEALTHY
        return await self.ws.ReportBlockHealth(
            ws.ReportBlockHealthRequest(block_id=block, health=health, reason=reason, host=host)
        )

    async def wiring(self, job_id: str) -> ocs_manager_pb2.SliceWiring | None:
        try:
            return await self.ocs.GetSliceWiring(
                ocs_manager_pb2.GetSliceWiringRequest(job_id=job_id)
            )
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    async def settle(self, timeout: float = 15.0, quiet: float = 0.3) -> None:
        """Wait until no slice is being wired and the live jobs stopped changing for `quiet`
        seconds — longer than one reconcile round (0.2 s here), since follow-up passes a
        wiring spawns, or a pass that lost a race to another replica, run in the background."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last, since = None, loop.time()
        while loop.time() < deadline:
            view = await self.pod()
            now = [(j.job_id, j.state) for j in view.live_jobs]
            if now != last or any(s == common_pb2.JOB_STATE_WIRING for _, s in now):
                last, since = now, loop.time()
            elif loop.time() - since >= quiet:
                return
            await asyncio.sleep(0.03)
        raise AssertionError(f"pod did not settle: {last}")

    async def assert_consistent(self) -> ws.PodView:
        """The invariants of the issue, checked against both services' own answers:
        each block in at most one slice, failed blocks host nothing, every RUNNING slice
        wired exactly as the ocs_manager reports (and nothing else wired), OCS-6 holds."""
        view = await self.pod()
        holders: dict[int, str] = {}
        chips: dict[tuple[int, ...], str] = {}  # (block, x, y, z) of sub-block slices
        running = {}
        for summary in view.live_jobs:
            job = await self.job(summary.job_id)
            if job.HasField("box"):  # a sub-block slice: chips of a block, no OCS slice
                box = job.box
                bv = view.blocks[box.block_id]
                assert not bv.job_id and box in bv.boxes, (job.job_id, bv)
                for dx in range(box.chips.dims[0]):
                    for dy in range(box.chips.dims[1]):
                        for dz in range(box.chips.dims[2]):
                            at = tuple(
                                o + d for o, d in zip(box.offset.coords, (dx, dy, dz), strict=True)
                            )
                            key = (box.block_id, *at)
                            assert key not in chips, (key, chips.get(key), job.job_id)
                            chips[key] = job.job_id
                continue
            if job.state in (common_pb2.JOB_STATE_RUNNING, common_pb2.JOB_STATE_WIRING):
                for b in job.blocks:
                    assert b.block_id not in holders, (b.block_id, holders[b.block_id], job.job_id)
                    holders[b.block_id] = job.job_id
            if job.state == common_pb2.JOB_STATE_RUNNING:
                running[job.job_id] = job
        for b in view.blocks:
            assert (b.job_id or None) == holders.get(b.block_id), b
            if b.health == common_pb2.BLOCK_HEALTH_FAILED:
                assert not b.job_id, f"failed block {b.block_id} hosts {b.job_id}"
            if b.boxes:
                assert not b.job_id and b.availability == common_pb2.BLOCK_AVAILABILITY_ALLOCATED
        slices = await self.ocs.ListSlices(ocs_manager_pb2.ListSlicesRequest(page_size=1000))
        assert {s.job_id for s in slices.slices} == set(running)
        for job_id, job in running.items():
            wiring = await self.wiring(job_id)
            assert wiring is not None
            assert list(wiring.grid.dims) == list(job.grid.dims)
            assert list(wiring.wrap) in ([], list(job.wrap))
            ocs_blocks = {tuple(p.position.coords): p.block_id for p in wiring.blocks}
            assert ocs_blocks == {tuple(b.position.coords): b.block_id for b in job.blocks}
        report = await self.ocs.CheckInvariants(ocs_manager_pb2.CheckInvariantsRequest())
        assert report.ok, list(report.violations)
        return view


def ocs_env(blocks: int, k: int = 1) -> dict[str, str]:
    return {
        "LIGHTPATH_POD_ID": POD,
        "LIGHTPATH_FABRIC_BLOCK_SHAPE": "4x4x4",
        "LIGHTPATH_FABRIC_BLOCKS": str(blocks),
        "LIGHTPATH_FABRIC_OCS_PER_AXIS": str(k),
    }


@contextlib.asynccontextmanager
async def pod_stack(
    redis_url: str,
    *,
    blocks: int = 16,
    k: int = 1,
    types: str = "tpu",
    replicas: int = 1,
    tracer_provider=None,
    ocs_environ: dict[str, str] | None = None,
    ws_environ: dict[str, str] | None = None,
) -> AsyncIterator[PodStack]:
    """`ocs_environ` replaces the ocs_manager's fabric settings (a SWITCHED pod, for
    one); `ws_environ` adds to every scheduler replica's."""
    async with contextlib.AsyncExitStack() as stack:
        ocs_svc = await stack.enter_async_context(
            serve("ocs_manager", redis_url, ocs_environ or ocs_env(blocks, k))
        )
        ocs_ch = await stack.enter_async_context(channel(ocs_svc.address, max_attempts=1))
        stubs, addresses = [], []
        for i in range(replicas):
            svc = await stack.enter_async_context(
                serve(
                    "workload_scheduler",
                    redis_url,
                    {
                        "LIGHTPATH_POD_ID": POD,
                        "LIGHTPATH_OCS_ADDR": ocs_svc.address,
                        "LIGHTPATH_BLOCK_TYPES": types,
                        "LIGHTPATH_INSTANCE_ID": f"ws-{i}",
                        "LIGHTPATH_WS_RECONCILE_S": "0.2",
                        **(ws_environ or {}),
                    },
                    tracer_provider=tracer_provider,
                )
            )
            ch = await stack.enter_async_context(channel(svc.address, max_attempts=1))
            stubs.append(workload_scheduler_pb2_grpc.WorkloadSchedulerStub(ch))
            addresses.append(svc.address)
        yield PodStack(ocs_manager_pb2_grpc.OcsManagerStub(ocs_ch), stubs, addresses)


@pytest.fixture
async def pod16(redis_url) -> AsyncIterator[PodStack]:
    async with pod_stack(redis_url) as p:
        yield p


async def rpc_error(awaitable) -> ErrorReport:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await awaitable
    return error_report(info.value)
