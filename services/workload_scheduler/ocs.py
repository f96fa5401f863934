"""The pod's ocs_manager as the workload scheduler uses it (its gRPC contract,
protos/lightpath/v1/ocs_manager.proto): fabric, wire, release, replace, wiring.

gRPC errors become `OcsError` with `transient` telling the scheduler whether
to retry later (the ocs_manager is down or busy) or to give up on that wiring
(the ocs_manager refused it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from lightpath.v1 import common_pb2, ocs_manager_pb2, ocs_manager_pb2_grpc
from services.workload_scheduler.model import Grid, grid_positions

TRANSIENT = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
    }
)


class OcsError(Exception):
    def __init__(self, call: str, code: grpc.StatusCode, detail: str):
        self.call = call
        self.code = code
        self.detail = detail
        self.transient = code in TRANSIENT
        super().__init__(f"ocs_manager {call}: {code.name}: {detail}")


@dataclass(frozen=True)
class FabricInfo:
    block_shape: tuple[int, ...]
    block_count: int
    ocs_per_axis: int
    first_end_group: tuple[int, ...]  # per block: K index of its first ends' OCS


@dataclass(frozen=True)
class Wiring:
    job_id: str
    grid: Grid
    blocks: tuple[int, ...]  # per position, row-major x fastest
    cross_connects: int
    # False while the ocs_manager is still programming the switches for it.
    committed: bool = True


@dataclass(frozen=True)
class ReplaceResult:
    moved: int
    untouched: int


_OCS_ID = re.compile(r"^ocs-[a-z0-9]+-\d+-(\d+)$")


class OcsManagerClient:
    def __init__(self, channel: grpc.aio.Channel, *, timeout_s: float = 10.0):
        self._stub = ocs_manager_pb2_grpc.OcsManagerStub(channel)
        self._timeout = timeout_s

    async def _call(self, name: str, request):
        try:
            return await getattr(self._stub, name)(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as err:
            raise OcsError(name, err.code(), err.details() or "") from None

    async def fabric(self) -> FabricInfo:
        fabric = await self._call("GetFabric", ocs_manager_pb2.GetFabricRequest())
        cfg = fabric.config
        k = max(1, cfg.ocs_per_axis)
        groups = [0] * cfg.block_count
        if k > 1:
            # Where each block's first ends land (dim 0, axis 0 stands for every axis).
            port_map = await self._call("GetPortMap", ocs_manager_pb2.GetPortMapRequest(dim=0))
            for entry in port_map.entries:
                seg = entry.segment
                if (
                    seg.axis == 0
                    and seg.end == ocs_manager_pb2.SEGMENT_END_FIRST
                    and entry.ports
                    and seg.block_id < cfg.block_count
                ):
                    m = _OCS_ID.match(entry.ports[0].ocs_id)
                    groups[seg.block_id] = int(m.group(1)) if m else 0
        return FabricInfo(tuple(cfg.block_shape.dims), cfg.block_count, k, tuple(groups))

    async def wire(
        self, job_id: str, grid: Grid, blocks: Sequence[int], wrap: Sequence[bool]
    ) -> Wiring:
        request = ocs_manager_pb2.WireSliceRequest(
            job_id=job_id,
            grid=common_pb2.Shape(dims=grid),
            blocks=[
                ocs_manager_pb2.BlockPlacement(position=common_pb2.Coordinate(coords=p), block_id=b)
                for p, b in zip(grid_positions(grid), blocks, strict=True)
            ],
            wrap=list(wrap),
            view=ocs_manager_pb2.WIRING_VIEW_COUNTS,  # the count is all the scheduler needs
        )
        return _wiring(await self._call("WireSlice", request))

    async def release(self, job_id: str) -> bool:
        """Release the job's slice; False when the ocs_manager had none (already released)."""
        try:
            await self._call("ReleaseSlice", ocs_manager_pb2.ReleaseSliceRequest(job_id=job_id))
        except OcsError as err:
            if err.code == grpc.StatusCode.NOT_FOUND:
                return False
            raise
        return True

    async def replace(self, job_id: str, failed: int, new: int) -> ReplaceResult:
        resp = await self._call(
            "ReplaceBlock",
            ocs_manager_pb2.ReplaceBlockRequest(
                job_id=job_id,
                failed_block_id=failed,
                new_block_id=new,
                view=ocs_manager_pb2.WIRING_VIEW_COUNTS,
            ),
        )
        return ReplaceResult(moved=len(resp.added), untouched=resp.untouched)

    async def wiring(self, job_id: str) -> Wiring | None:
        try:
            w = await self._call(
                "GetSliceWiring",
                ocs_manager_pb2.GetSliceWiringRequest(
                    job_id=job_id, view=ocs_manager_pb2.WIRING_VIEW_COUNTS
                ),
            )
        except OcsError as err:
            if err.code == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        return _wiring(w)


def _wiring(w: ocs_manager_pb2.SliceWiring) -> Wiring:
    grid = tuple(w.grid.dims)
    by_pos = {tuple(b.position.coords): b.block_id for b in w.blocks}
    blocks = tuple(by_pos.get(p, -1) for p in grid_positions(grid))
    return Wiring(
        w.job_id,
        grid,
        blocks,
        w.cross_connect_count or len(w.cross_connects),
        w.state != ocs_manager_pb2.SLICE_STATE_WIRING,
    )
