"""The pod's ocs_manager as the workload scheduler uses it (its gRPC contract,
protos/lightpath/v1/ocs_manager.proto): fabric, wire, release, replace, wiring.

`fabric()` learns the pod's kind from GetInfo; the pod is set up with the client of
that kind: OcsManagerClient (slices) or its RingsClient (a SWITCHED pod's rings).

gRPC errors become `OcsError` with `transient` telling the scheduler whether
to retry later (the ocs_manager is down or busy) or to give up on that wiring
(the ocs_manager refused it), and `busy` marking the expected race of two calls
changing one slice (ABORTED, reason SLICE_BUSY: "... in progress in another call").

Every call has a deadline, LIGHTPATH_WS_OCS_TIMEOUT_S by default (`timeout_s`);
WireSlice may be given a longer one (see WorkloadScheduler._wire_at_ocs).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from lightpath.client import error_report
from lightpath.domain.slices import Grid, SliceJob, grid_positions
from lightpath.v1 import common_pb2, ocs_manager_pb2, ocs_manager_pb2_grpc

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


# The ocs_manager's default lease is 30 s and it bounds programming the switches by half
# of it, and a rollback by as long again: a change ends within ~30 s, even on a slow switch.
DEFAULT_TIMEOUT_S = 45.0


class OcsError(Exception):
    def __init__(self, call: str, code: grpc.StatusCode, detail: str, reason: str = ""):
        self.call = call
        self.code = code
        self.detail = detail
        self.reason = reason  # google.rpc.ErrorInfo reason, when the ocs_manager gave one
        self.transient = code in TRANSIENT
        super().__init__(f"ocs_manager {call}: {code.name}: {detail}")

    @property
    def busy(self) -> bool:
        """Another call is changing the slice (a release or wiring in progress): an
        expected race, resolved by asking again once it ended or by leaving it to that call."""
        return self.code == grpc.StatusCode.ABORTED and (
            self.reason == "SLICE_BUSY" or "in progress in another call" in self.detail
        )

    @property
    def deadline(self) -> bool:
        return self.code == grpc.StatusCode.DEADLINE_EXCEEDED


@dataclass(frozen=True)
class FabricInfo:
    block_shape: tuple[int, ...]
    block_count: int
    ocs_per_axis: int
    first_end_group: tuple[int, ...]  # per block: K index of its first ends' OCS
    kind: str = "OCS_TORUS"
    # SWITCHED pods: the fabric's one-line spec (SwitchedFabricConfig.spec()).
    switched_spec: str = ""


def job_lease(job: SliceJob) -> tuple[str, int]:
    """This replica's hold on `job` as the ocs_manager fences it (issue 32): the job's
    submission (its id and admission seq: a job id submitted again is a new lease) and
    its epoch, which every take-over by another replica raises. A replica paused past
    the wiring deadline wakes holding an older epoch than the one that took over: its
    WireSlice or ReplaceBlock is refused (STALE_LEASE) instead of wiring a stale view."""
    return f"{job.job_id}#{job.seq}", job.epoch


def _lease_fields(lease: tuple[str, int] | None) -> dict[str, Any]:
    return {} if lease is None else {"lease_id": lease[0], "lease_token": lease[1]}


@dataclass(frozen=True)
class Wiring:
    job_id: str
    grid: Grid
    blocks: tuple[int, ...]  # per position, row-major x fastest
    cross_connects: int
    # False while the ocs_manager is still programming the switches for it.
    committed: bool = True
    # SWITCHED pods: what was reserved, for the job's history.
    detail: str = ""
    # Wired as a twisted torus (WireSliceRequest.twisted).
    twisted: bool = False

    def describe(self) -> str:
        twist = ", twisted torus" if self.twisted else ""
        return self.detail or f"{self.cross_connects} cross-connects{twist}"


@dataclass(frozen=True)
class ReplaceResult:
    moved: int
    untouched: int
    # What moved: OCS cross-connects, or a SWITCHED pod's rings.
    unit: str = "cross-connects"


_OCS_ID = re.compile(r"^ocs-[a-z0-9]+-\d+-(\d+)$")


class OcsManagerClient:
    """The ocs_manager of an OCS_TORUS pod: slices wired by cross-connects."""

    # ListSlices pages come in job id order (reconcile sweeps them page by page).
    pages_in_order = True

    def __init__(self, channel: grpc.aio.Channel, *, timeout_s: float = DEFAULT_TIMEOUT_S):
        self._channel = channel
        self._stub = ocs_manager_pb2_grpc.OcsManagerStub(channel)
        self.timeout_s = timeout_s

    def for_rings(self) -> RingsClient:
        """The same ocs_manager as the client of a SWITCHED pod's rings."""
        return RingsClient(self._channel, timeout_s=self.timeout_s)

    async def _call(self, name: str, request, *, timeout_s: float | None = None):
        try:
            return await getattr(self._stub, name)(request, timeout=timeout_s or self.timeout_s)
        except grpc.aio.AioRpcError as err:
            raise OcsError(
                name, err.code(), err.details() or "", error_report(err).reason
            ) from None

    async def _unless_missing(self, name: str, request):
        """The call's answer, or None when the ocs_manager has no such slice (rings)."""
        try:
            return await self._call(name, request)
        except OcsError as err:
            if err.code == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    async def fabric(self) -> FabricInfo:
        info = await self._call("GetInfo", common_pb2.GetInfoRequest())
        if info.attributes.get("fabric_kind") == "SWITCHED":
            sw = await self._call("GetSwitchedFabric", ocs_manager_pb2.GetSwitchedFabricRequest())
            return FabricInfo(
                tuple(sw.config.group_shape.dims),
                sw.groups,
                1,
                (0,) * sw.groups,
                kind="SWITCHED",
                switched_spec=sw.spec,
            )
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

    async def wire_job(self, job: SliceJob, *, timeout_s: float | None = None) -> Wiring:
        """Wire the job's slice on its placement."""
        assert job.placement is not None
        # A shrunk slice's demand is no longer twisted (SliceDemand.shrunk): wired regular.
        return await self.wire(
            job.job_id,
            job.demand.grid,
            job.placement,
            job.demand.wrap,
            twisted=job.demand.twisted,
            timeout_s=timeout_s,
            lease=job_lease(job),
        )

    async def replace_job(self, job: SliceJob, failed: int, new: int) -> ReplaceResult:
        return await self.replace(job.job_id, failed, new, lease=job_lease(job))

    async def wire(
        self,
        job_id: str,
        grid: Grid,
        blocks: Sequence[int],
        wrap: Sequence[bool],
        *,
        twisted: bool = False,
        timeout_s: float | None = None,
        lease: tuple[str, int] | None = None,
    ) -> Wiring:
        """WireSlice; `twisted` asks for the twisted torus (the ocs_manager checks the grid).
        A ReplaceBlock needs nothing more: the ocs_manager keeps the slice's twist. `lease`:
        (lease id, token) of this caller's hold on the job (job_lease), for fencing."""
        request = ocs_manager_pb2.WireSliceRequest(
            job_id=job_id,
            grid=common_pb2.Shape(dims=grid),
            blocks=[
                ocs_manager_pb2.BlockPlacement(position=common_pb2.Coordinate(coords=p), block_id=b)
                for p, b in zip(grid_positions(grid), blocks, strict=True)
            ],
            wrap=list(wrap),
            view=ocs_manager_pb2.WIRING_VIEW_COUNTS,  # the count is all the scheduler needs
            twisted=twisted,
            **_lease_fields(lease),
        )
        return _wiring(await self._call("WireSlice", request, timeout_s=timeout_s))

    async def release(self, job_id: str, *, lease: tuple[str, int] | None = None) -> bool:
        """Release the job's slice; False when the ocs_manager had none (already released).
        `lease`: this caller's hold on the job (job_lease), fenced as WireSlice's is: a
        replica that lost the job to a take-over is refused (STALE_LEASE) rather than
        tearing down the new holder's wiring."""
        request = ocs_manager_pb2.ReleaseSliceRequest(job_id=job_id, **_lease_fields(lease))
        return await self._unless_missing("ReleaseSlice", request) is not None

    async def replace(
        self, job_id: str, failed: int, new: int, *, lease: tuple[str, int] | None = None
    ) -> ReplaceResult:
        resp = await self._call(
            "ReplaceBlock",
            ocs_manager_pb2.ReplaceBlockRequest(
                job_id=job_id,
                failed_block_id=failed,
                new_block_id=new,
                view=ocs_manager_pb2.WIRING_VIEW_COUNTS,
                **_lease_fields(lease),
            ),
        )
        return ReplaceResult(moved=len(resp.added), untouched=resp.untouched)

    async def _all(self, name: str, request_type, field: str) -> list:
        """Every item of a listing, page after page."""
        out: list = []
        token = ""
        while True:
            page = await self._call(name, request_type(page_size=1000, page_token=token))
            out.extend(getattr(page, field))
            token = page.next_page_token
            if not token:
                return out

    async def slices(self) -> dict[str, tuple[int, ...]]:
        """Every slice the ocs_manager holds, by job."""
        listed = await self._all("ListSlices", ocs_manager_pb2.ListSlicesRequest, "slices")
        return {s.job_id: tuple(s.block_ids) for s in listed}

    async def slices_page(
        self, page_token: str, page_size: int
    ) -> tuple[dict[str, tuple[int, ...]], str]:
        """One page of ListSlices: slices by job, and the next token ("" after the last)."""
        page = await self._call(
            "ListSlices",
            ocs_manager_pb2.ListSlicesRequest(page_size=page_size, page_token=page_token),
        )
        return {s.job_id: tuple(s.block_ids) for s in page.slices}, page.next_page_token

    async def wiring(self, job_id: str) -> Wiring | None:
        request = ocs_manager_pb2.GetSliceWiringRequest(
            job_id=job_id, view=ocs_manager_pb2.WIRING_VIEW_COUNTS
        )
        w = await self._unless_missing("GetSliceWiring", request)
        return None if w is None else _wiring(w)


class RingsClient(OcsManagerClient):
    """The ocs_manager of a SWITCHED pod (seed 002): "wire" reserves the job's rings
    (ReserveRings), "release" frees them (ReleaseRings), "replace" swaps a failed group
    (SwapGroup) — the scheduler itself does not tell them apart."""

    # ListRingReservations promises no order: every sweep compares everything.
    pages_in_order = False

    async def wire_job(self, job: SliceJob, *, timeout_s: float | None = None) -> Wiring:
        """ReserveRings under the job's lease (job_lease), fenced as WireSlice is."""
        assert job.placement is not None
        return _rings_wiring(
            await self._call("ReserveRings", _reserve_request(job), timeout_s=timeout_s),
            job.placement,
        )

    async def replace_job(self, job: SliceJob, failed: int, new: int) -> ReplaceResult:
        resp = await self._call(
            "SwapGroup",
            ocs_manager_pb2.SwapGroupRequest(
                job_id=job.job_id,
                failed_group=failed,
                new_tiles=[ocs_manager_pb2.GroupTile(group=new)],
                view=ocs_manager_pb2.RING_VIEW_SUMMARY,
                **_lease_fields(job_lease(job)),
            ),
        )
        return ReplaceResult(len(resp.rerouted), resp.rings_untouched, "rings")

    async def release(self, job_id: str, *, lease: tuple[str, int] | None = None) -> bool:
        """ReleaseRings; `lease` fences it as ReleaseSlice's (a replica that lost the job
        is refused, STALE_LEASE, rather than freeing the new holder's rings)."""
        request = ocs_manager_pb2.ReleaseRingsRequest(job_id=job_id, **_lease_fields(lease))
        return await self._unless_missing("ReleaseRings", request) is not None

    async def slices(self) -> dict[str, tuple[int, ...]]:
        """Every ring reservation's groups, by job."""
        listed = await self._all(
            "ListRingReservations", ocs_manager_pb2.ListRingReservationsRequest, "reservations"
        )
        return {r.job_id: tuple(sorted({t.group for t in r.tiles})) for r in listed}

    async def wiring(self, job_id: str) -> Wiring | None:
        found = await self.rings(job_id)
        return None if found is None else _rings_wiring(found, None)

    async def rings(
        self, job_id: str, *, full: bool = False
    ) -> ocs_manager_pb2.RingReservation | None:
        """The job's reserved rings, or None."""
        view = ocs_manager_pb2.RING_VIEW_FULL if full else ocs_manager_pb2.RING_VIEW_SUMMARY
        return await self._unless_missing(
            "GetRings", ocs_manager_pb2.GetRingsRequest(job_id=job_id, view=view)
        )

    async def switch_use(self) -> list[ocs_manager_pb2.SwitchLinkUse]:
        """Link use of every switch (SW-6)."""
        request_type = ocs_manager_pb2.ListSwitchLinkUseRequest
        return await self._all("ListSwitchLinkUse", request_type, "switches")


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
        twisted=w.twisted,
    )


def _reserve_request(job: SliceJob) -> ocs_manager_pb2.ReserveRingsRequest:
    assert job.degrees is not None and job.placement is not None
    d, p, l = job.degrees  # noqa: E741
    if job.tile is not None:
        g, r, c, h, w = job.tile
        tiles = [ocs_manager_pb2.GroupTile(group=g, row=r, col=c, height=h, width=w)]
    else:
        tiles = [ocs_manager_pb2.GroupTile(group=g) for g in job.placement]
    return ocs_manager_pb2.ReserveRingsRequest(
        job_id=job.job_id,
        degrees=common_pb2.ParallelismDegrees(data=d, pipeline=p, layer=l),
        tiles=tiles,
        view=ocs_manager_pb2.RING_VIEW_SUMMARY,
        **_lease_fields(job_lease(job)),
    )


def _rings_wiring(r: ocs_manager_pb2.RingReservation, placement: Sequence[int] | None) -> Wiring:
    groups = tuple(sorted({t.group for t in r.tiles}))
    up = r.channels_by_kind.get("up", 0)
    return Wiring(
        r.job_id,
        (len(groups),),
        tuple(placement) if placement is not None and set(placement) == set(groups) else groups,
        r.channel_count,
        True,
        f"{len(r.rings)} rings on {len(groups)} group{'s' if len(groups) != 1 else ''}, "
        f"{r.channel_count} link channels reserved ({up} through tier 1)",
    )
