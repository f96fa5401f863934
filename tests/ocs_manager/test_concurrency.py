"""OCS-3: several ocs_manager replicas on one Redis, many clients, overlapping requests.
Afterwards no port is in two cross-connects, no slice is half-wired, and what each
client was told agrees with what is stored."""

from __future__ import annotations

import asyncio
import contextlib
import random

import grpc

from lightpath.client import channel
from lightpath.v1 import ocs_manager_pb2 as pb
from lightpath.v1 import ocs_manager_pb2_grpc
from tests.helpers import serve
from tests.ocs_manager.conftest import fabric_env, wire_request

REPLICAS = 3
POOL = 24  # blocks: few enough that requests collide often
CLIENTS = 12
OPS_PER_CLIENT = 25
SHAPES = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 1), (2, 2, 2)]
RETRYABLE = {
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
}


async def test_replicas_racing_on_one_redis_keep_every_invariant(redis_url):
    async with contextlib.AsyncExitStack() as stack:
        stubs = []
        for _ in range(REPLICAS):
            svc = await stack.enter_async_context(
                serve("ocs_manager", redis_url, fabric_env(k=2, blocks=POOL))
            )
            ch = await stack.enter_async_context(channel(svc.address, max_attempts=1))
            stubs.append(ocs_manager_pb2_grpc.OcsManagerStub(ch))
        told_wired: dict[str, tuple[int, ...]] = {}  # the last outcome each client saw per job
        unexpected: list[str] = []

        async def client(n: int) -> None:
            rng = random.Random(n)
            mine: list[str] = []
            for op in range(OPS_PER_CLIENT):
                stub = rng.choice(stubs)
                try:
                    roll = rng.random()
                    if roll < 0.55 or not mine:
                        shape = rng.choice(SHAPES)
                        size = shape[0] * shape[1] * shape[2]
                        blocks = rng.sample(range(POOL), size)  # overlaps other clients' often
                        job = f"c{n}-{op}"
                        w = await stub.WireSlice(
                            wire_request(job, shape, blocks, view=pb.WIRING_VIEW_COUNTS)
                        )
                        assert w.state == pb.SLICE_STATE_WIRED
                        told_wired[job] = tuple(b.block_id for b in w.blocks)
                        mine.append(job)
                    elif roll < 0.8:
                        job = mine.pop(rng.randrange(len(mine)))
                        await stub.ReleaseSlice(pb.ReleaseSliceRequest(job_id=job))
                        told_wired.pop(job, None)
                    else:
                        job = rng.choice(mine)
                        failed = rng.choice(told_wired[job])
                        new = rng.choice([b for b in range(POOL) if b != failed])
                        rep = await stub.ReplaceBlock(
                            pb.ReplaceBlockRequest(
                                job_id=job,
                                failed_block_id=failed,
                                new_block_id=new,
                                view=pb.WIRING_VIEW_COUNTS,
                            )
                        )
                        told_wired[job] = tuple(b.block_id for b in rep.wiring.blocks)
                except grpc.aio.AioRpcError as err:
                    if err.code() not in RETRYABLE:
                        unexpected.append(f"{err.code()}: {err.details()}")
            # the same job from several replicas at once: exactly one wires it
            job = f"c{n}-same"
            blocks = [n % POOL]
            results = await asyncio.gather(
                *(s.WireSlice(wire_request(job, [1, 1, 1], blocks)) for s in stubs),
                return_exceptions=True,
            )
            fresh = [r for r in results if isinstance(r, pb.SliceWiring) and not r.replayed]
            for r in results:
                if isinstance(r, grpc.aio.AioRpcError) and r.code() not in RETRYABLE:
                    unexpected.append(f"{r.code()}: {r.details()}")
            assert len(fresh) <= 1
            if any(isinstance(r, pb.SliceWiring) for r in results):
                told_wired[job] = tuple(blocks)

        await asyncio.gather(*(client(n) for n in range(CLIENTS)))
        assert not unexpected, unexpected[:5]

        for stub in stubs:
            report = await stub.CheckInvariants(pb.CheckInvariantsRequest(compare_switches=True))
            assert report.ok, [(v.rule, v.detail) for v in report.violations[:5]]
        stored = {
            s.job_id: tuple(s.block_ids)
            for s in (await stubs[0].ListSlices(pb.ListSlicesRequest(page_size=1000))).slices
        }
        assert stored == told_wired
        owners = [b for blocks in stored.values() for b in blocks]
        assert len(owners) == len(set(owners))
        assert report.slices_checked == len(stored)
