"""The hand-encoded repeated fields parse to exactly the messages built field by field."""

from __future__ import annotations

import pytest

from lightpath.domain.torus import FIRST, SECOND, Fabric, FabricConfig
from lightpath.v1 import ocs_manager_pb2 as pb
from lightpath_services.ocs_manager.encode import WiringEncoder, varint
from lightpath_services.ocs_manager.wiring import cross_connects, links, one_to_many_settings
from tests.ocs_manager.model import placement


def reference(fabric: Fabric, wiring, job: str) -> pb.SliceWiring:
    msg = pb.SliceWiring()
    for x in cross_connects(fabric, wiring):
        msg.cross_connects.add(
            ocs_id=fabric.ocs_ids[x.ocs],
            port_a=x.port_a,
            port_b=x.port_b,
            a=pb.SegmentRef(block_id=x.src, dim=x.dim, axis=x.axis, end=SECOND),
            b=pb.SegmentRef(block_id=x.dst, dim=x.dim, axis=x.axis, end=FIRST),
            job_id=job,
        )
    for g in one_to_many_settings(fabric, wiring):
        for a in range(fabric.axes[g.dim]):
            msg.one_to_many.add(
                switch_id=fabric.one_to_many_id(g.block, g.dim, a),
                segment=pb.SegmentRef(block_id=g.block, dim=g.dim, axis=a, end=SECOND),
                output=g.after,
                ocs_id=fabric.ocs_ids[fabric.ocs_index(g.dim, a, g.after)],
                job_id=job,
            )
    return msg


@pytest.mark.parametrize(("k", "blocks"), [(1, 64), (2, 64), (3, 300)])
def test_encoded_wiring_equals_the_reference(k, blocks):
    f = Fabric.build(FabricConfig((4, 4, 4), blocks, k, 1000))
    p = placement(
        f,
        "job-x",
        (4, 2, 2),
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, blocks - 1, blocks // 2 + 1],
    )
    enc = WiringEncoder(f)
    got = pb.SliceWiring()
    got.MergeFromString(
        enc.cross_connects(5, links(p), "job-x") + enc.one_to_many(6, links(p), "job-x")
    )
    assert got == reference(f, links(p), "job-x")
    assert len(got.cross_connects) == 16 * 3 * 16


def test_varint():
    assert [varint(n) for n in (0, 1, 127, 128, 300, 70000)] == [
        b"\x00",
        b"\x01",
        b"\x7f",
        b"\x80\x01",
        b"\xac\x02",
        b"\xf0\xa2\x04",
    ]
