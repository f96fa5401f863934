"""Fixtures of the ocs_manager contract tests: the real service on a real Redis."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from lightpath.client import ErrorReport, channel, error_report
from lightpath.v1 import common_pb2, ocs_manager_pb2_grpc
from lightpath.v1 import ocs_manager_pb2 as pb
from tests.helpers import serve

POD = "pod-t"


def fabric_env(k: int = 1, blocks: int = 64, pod: str = POD, **extra: str) -> dict[str, str]:
    return {
        "LIGHTPATH_POD_ID": pod,
        "LIGHTPATH_FABRIC_BLOCK_SHAPE": "4x4x4",
        "LIGHTPATH_FABRIC_BLOCKS": str(blocks),
        "LIGHTPATH_FABRIC_OCS_PER_AXIS": str(k),
        **extra,
    }


@contextlib.asynccontextmanager
async def ocs_stub(redis_url: str, **env) -> AsyncIterator[ocs_manager_pb2_grpc.OcsManagerStub]:
    async with (
        serve("ocs_manager", redis_url, fabric_env(**env)) as svc,
        channel(svc.address, max_attempts=1) as ch,
    ):
        yield ocs_manager_pb2_grpc.OcsManagerStub(ch)


@pytest.fixture
async def ocs(redis_url):
    async with ocs_stub(redis_url) as stub:
        yield stub


@pytest.fixture
async def ocs_k2(redis_url):
    async with ocs_stub(redis_url, k=2) as stub:
        yield stub


def wire_request(job: str, grid, blocks, wrap=(), **kw) -> pb.WireSliceRequest:
    """`blocks` in row-major position order (x fastest)."""
    positions = []
    for i in range(len(blocks)):
        coords, rest = [], i
        for e in grid:
            rest, c = divmod(rest, e)
            coords.append(c)
        positions.append(coords)
    return pb.WireSliceRequest(
        job_id=job,
        grid=common_pb2.Shape(dims=grid),
        blocks=[
            pb.BlockPlacement(position=common_pb2.Coordinate(coords=c), block_id=b)
            for c, b in zip(positions, blocks, strict=True)
        ],
        wrap=wrap,
        **kw,
    )


async def rpc_error(call) -> ErrorReport:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return error_report(err.value)
