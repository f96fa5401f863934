"""Demo step of ocs_manager: a 2-block ring on pod-2 (K = 2, 1x2 switches, seed Fig. 12),
a failed block swapped by moving only its cross-connects, invariants, release."""

from __future__ import annotations

import grpc

from lightpath.cli._common import table
from lightpath.demo.context import DemoContext
from lightpath.v1 import common_pb2, ocs_manager_pb2_grpc
from lightpath.v1 import ocs_manager_pb2 as pb

JOB = "demo-ocs-ring"


def _request(blocks: list[int]) -> pb.WireSliceRequest:
    return pb.WireSliceRequest(
        job_id=JOB,
        grid=common_pb2.Shape(dims=[2, 1, 1]),
        blocks=[
            pb.BlockPlacement(position=common_pb2.Coordinate(coords=[i, 0, 0]), block_id=b)
            for i, b in enumerate(blocks)
        ],
        view=pb.WIRING_VIEW_COUNTS,
    )


async def run(ctx: DemoContext) -> None:
    ctx.section("ocs_manager: wire, replace and release a 2-block ring on pod-2 (K = 2)")
    ocs = ocs_manager_pb2_grpc.OcsManagerStub(ctx.channel("ocs-pod-2"))
    f = await ocs.GetFabric(pb.GetFabricRequest())
    c = f.config
    print(
        f"pod-2: {c.block_count} blocks of {'x'.join(map(str, c.block_shape.dims))}, "
        f"K={c.ocs_per_axis}: {f.ocs_count} OCS using {f.max_ports_used_per_ocs} of "
        f"{c.ocs_radix} ports (K=1 would need {2 * c.block_count}), "
        f"{f.one_to_many_count} 1x{c.ocs_per_axis} switches"
    )
    try:  # a previous demo run that was interrupted
        await ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id=JOB))
    except grpc.aio.AioRpcError as err:
        if err.code() != grpc.StatusCode.NOT_FOUND:
            raise
    used = {
        b
        for s in (await ocs.ListSlices(pb.ListSlicesRequest(page_size=1000))).slices
        for b in s.block_ids
    }
    free = [b for b in range(c.block_count - 1, -1, -1) if b not in used]
    # an even and an odd block: their first ends sit on different OCS of each axis
    first = next(b for b in free if b % 2 == 0)
    second = next(b for b in free if b % 2 == 1)
    spare = next(b for b in free if b % 2 == 0 and b != first)

    w = await ocs.WireSlice(_request([first, second]))
    print(
        f"wired {JOB}: blocks {first} | {second} as 2x1x1 with wrap -> "
        f"{w.cross_connect_count} cross-connects, {w.one_to_many_count} 1x2 settings"
    )
    states = (await ocs.GetOneToManyStates(pb.GetOneToManyStatesRequest(job_id=JOB))).states
    rows = [
        (s.switch_id, f"o{s.selected_output + 1}", s.outputs[s.selected_output].ocs_id)
        for s in states
        if s.segment.dim == 0 and s.segment.axis == 0
    ]
    print(table(rows, ["1x2 switch (x, axis 0)", "output", "reaches"]))
    xcs: list[tuple[str, str, str, str]] = []
    for ocs_id in ("ocs-x-0-0", "ocs-x-0-1"):
        t = await ocs.GetRoutingTable(pb.GetRoutingTableRequest(ocs_id=ocs_id))
        for x in t.cross_connects:
            xcs.append(
                (
                    ocs_id,
                    f"v{t.version}",
                    f"{x.port_a}-{x.port_b}",
                    f"{x.a.block_id} -> {x.b.block_id}",
                )
            )
    print(table(xcs, ["ocs", "version", "ports", "block -> block"]))

    rep = await ocs.ReplaceBlock(
        pb.ReplaceBlockRequest(
            job_id=JOB, failed_block_id=second, new_block_id=spare, view=pb.WIRING_VIEW_COUNTS
        )
    )
    moved = sorted({s.switch_id.rsplit("-", 1)[0] for s in rep.one_to_many_changed})
    print(
        f"block {second} failed -> block {spare} at its position: {len(rep.removed)} "
        f"cross-connects moved, {rep.untouched} untouched; 1x2 switches changed: "
        + ", ".join(f"{m}-*" for m in moved)
    )
    report = await ocs.CheckInvariants(pb.CheckInvariantsRequest(compare_switches=True))
    print(
        f"invariants: {'ok' if report.ok else 'VIOLATED'} over {report.slices_checked} slices, "
        f"{report.cross_connects_checked} cross-connects"
        + (", the switches agree with the tables" if report.ok else "")
    )
    rel = await ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id=JOB))
    print(
        f"released {JOB}: {rel.cross_connects_removed} cross-connects removed, "
        f"{rel.one_to_many_cleared} 1x2 switches idle"
    )
