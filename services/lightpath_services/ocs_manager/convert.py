"""Domain objects -> ocs_manager protobuf messages (and the few requests -> domain)."""

from __future__ import annotations

from lightpath.domain.torus import FIRST, SECOND, Fabric, FabricConfig, dim_name
from lightpath.errors import FieldViolation
from lightpath.v1 import common_pb2
from lightpath.v1 import ocs_manager_pb2 as pb
from lightpath_services.ocs_manager.encode import WiringEncoder
from lightpath_services.ocs_manager.store import SliceRecord
from lightpath_services.ocs_manager.wiring import (
    FabricChange,
    SlicePlacement,
    cross_connect_count,
    links,
)

FULL = (pb.WIRING_VIEW_UNSPECIFIED, pb.WIRING_VIEW_FULL)


def config_from_proto(msg: pb.FabricConfig) -> FabricConfig:
    return FabricConfig(
        tuple(msg.block_shape.dims), msg.block_count, msg.ocs_per_axis, msg.ocs_radix
    )


def fabric_to_proto(fabric: Fabric, pod_id: str) -> pb.Fabric:
    c = fabric.config
    return pb.Fabric(
        pod_id=pod_id,
        config=pb.FabricConfig(
            block_shape=common_pb2.Shape(dims=c.block_shape),
            block_count=c.block_count,
            ocs_per_axis=c.ocs_per_axis,
            ocs_radix=c.ocs_radix,
        ),
        axes_per_dim=max(fabric.axes),
        ocs_count=fabric.ocs_count,
        one_to_many_count=fabric.one_to_many_count,
        max_ports_used_per_ocs=fabric.max_ports_used_per_ocs,
        axes_by_dim=fabric.axes,
        dim_names=[dim_name(d) for d in range(fabric.dims)],
    )


def check_expected_fabric(fabric: Fabric, expect: pb.FabricConfig) -> list[FieldViolation]:
    """The fields of `expect_fabric` that are set and differ from this pod's fabric."""
    c = fabric.config
    out = []
    if expect.block_shape.dims and tuple(expect.block_shape.dims) != c.block_shape:
        out.append(
            FieldViolation(
                "expect_fabric.block_shape",
                f"expects {list(expect.block_shape.dims)}, this pod's blocks are {list(c.block_shape)}",
            )
        )
    for name, have in (
        ("block_count", c.block_count),
        ("ocs_per_axis", c.ocs_per_axis),
        ("ocs_radix", c.ocs_radix),
    ):
        want = getattr(expect, name)
        if want and want != have:
            out.append(
                FieldViolation(
                    f"expect_fabric.{name}", f"expects {want}, this pod's fabric has {have}"
                )
            )
    return out


def segment(block: int, dim: int, axis: int, end: int) -> pb.SegmentRef:
    return pb.SegmentRef(block_id=block, dim=dim, axis=axis, end=end)  # type: ignore[arg-type]


def change_one_to_many(out, fabric: Fabric, change: FabricChange, job: str) -> None:
    """Every 1xK switch a replacement moved, at its new output (or idle)."""
    add = out.add
    for g in change.one_to_many:
        for a in range(fabric.axes[g.dim]):
            seg = segment(g.block, g.dim, a, SECOND)
            sid = fabric.one_to_many_id(g.block, g.dim, a)
            if g.after is None:
                add(switch_id=sid, segment=seg, idle=True)
            else:
                ocs = fabric.ocs_ids[fabric.ocs_index(g.dim, a, g.after)]
                add(switch_id=sid, segment=seg, output=g.after, ocs_id=ocs, job_id=job)


def placement_blocks(placement: SlicePlacement) -> list[pb.BlockPlacement]:
    return [
        pb.BlockPlacement(position=common_pb2.Coordinate(coords=placement.position(i)), block_id=b)
        for i, b in enumerate(placement.blocks)
    ]


def slice_wiring(
    enc: WiringEncoder, record: SliceRecord, view: int, *, replayed: bool = False
) -> pb.SliceWiring:
    fabric = enc.fabric
    p = record.placement
    wiring = links(p)
    count = cross_connect_count(fabric, wiring)
    msg = pb.SliceWiring(
        job_id=p.job_id,
        grid=common_pb2.Shape(dims=p.grid),
        blocks=placement_blocks(p),
        wrap=p.wrap,
        cross_connect_count=count,
        one_to_many_count=count if fabric.k > 1 else 0,
        state=pb.SLICE_STATE_WIRED if record.wired else pb.SLICE_STATE_WIRING,
        replayed=replayed,
        twisted=p.twisted,
    )
    if record.wired_at_ms:
        msg.wired_at.FromMilliseconds(record.wired_at_ms)
    if view in FULL:
        msg.MergeFromString(
            enc.cross_connects(pb.SliceWiring.CROSS_CONNECTS_FIELD_NUMBER, wiring, p.job_id)
            + enc.one_to_many(pb.SliceWiring.ONE_TO_MANY_FIELD_NUMBER, wiring, p.job_id)
        )
    return msg


def routing_table(
    fabric: Fabric, ocs: int, table: dict[int, int], version: int, owners: dict[int, str]
) -> pb.RoutingTable:
    d, a, k = fabric.ocs_of_index(ocs)
    msg = pb.RoutingTable(ocs_id=fabric.ocs_ids[ocs], dim=d, axis=a, k=k, version=version)
    for p in sorted(table):
        q = table[p]
        if p > q and table.get(q) == p:
            continue  # each pair once
        e1, e2 = fabric.segment_at(k, p), fabric.segment_at(k, q)
        if e1 is not None and e2 is not None and e1[1] == FIRST and e2[1] == SECOND:
            p, q, e1, e2 = q, p, e2, e1
        msg.cross_connects.add(
            ocs_id=msg.ocs_id,
            port_a=p,
            port_b=q,
            a=segment(e1[0], d, a, e1[1]) if e1 else None,
            b=segment(e2[0], d, a, e2[1]) if e2 else None,
            job_id=owners.get(e1[0], "") if e1 else "",
        )
    return msg
