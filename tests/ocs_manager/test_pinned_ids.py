"""The OCS fabric's index and id arithmetic (OCS-1, OCS-7) round-trips in every
dimension, and its storage strides: found untested by bench/mutation.py (issue 17). Pure."""

from __future__ import annotations

from lightpath.domain.torus import Fabric, FabricConfig


def test_ocs_and_1xk_indices_round_trip_in_every_dimension():
    f = Fabric.build(FabricConfig((2, 3, 4), 6, 2, 12))
    seen = set()
    for d in range(3):
        for a in range(f.axes[d]):
            for k in range(2):
                i = f.ocs_index(d, a, k)
                assert f.ocs_of_index(i) == (d, a, k)
                seen.add(i)
    assert seen == set(range(f.ocs_count))
    for b in range(6):
        for d in range(3):
            for a in range(f.axes[d]):
                i = f.one_to_many_index(b, d, a)
                assert f.one_to_many_of_index(i) == (b, d, a)
                assert f.parse_one_to_many_id(f.one_to_many_id(b, d, a)) == (b, d, a)
    assert f.one_to_many_count == 6 * f.total_axes


def test_1xk_ids_that_name_nothing():
    f = Fabric.build(FabricConfig((2, 2), 4, 2, 8))
    assert f.parse_one_to_many_id("otm-3-y-1") == (3, 1, 1)
    for bad in ("otm-4-x-0", "otm-0-z-0", "otm-0-x-2", "ocs-x-0-0", "otm-0-x", ""):
        assert f.parse_one_to_many_id(bad) is None, bad
    k1 = Fabric.build(FabricConfig((2, 2), 4, 1, 8))
    assert k1.parse_one_to_many_id("otm-3-y-1") is None  # K = 1 has no 1xK switches


def test_storage_strides_are_the_next_power_of_ten():
    def stride(radix):
        return Fabric.build(FabricConfig((1,), 1, 1, radix)).port_stride

    assert [stride(r) for r in (2, 10, 11, 100, 101, 136, 1000, 1001)] == [
        10,
        10,
        100,
        100,
        1000,
        1000,
        1000,
        10000,
    ]

    def axis_stride(shape):
        return Fabric.build(FabricConfig(shape, 2, 1, 4)).axis_stride

    assert axis_stride((1,)) == 10  # one axis
    assert axis_stride((10, 1)) == 10  # axes (1, 10): at most 10 -> fields 0..9
    assert axis_stride((11, 1)) == 100
    assert axis_stride((4, 4, 4)) == 100  # 16 axes


def test_port_map_filters_and_k1_has_no_1xk():
    f = Fabric.build(FabricConfig((2, 2), 3, 1, 6))
    entries = list(f.port_map())
    assert len(entries) == 3 * 2 * 2 * 2  # blocks × dims × axes × ends
    only_b = list(f.port_map(block=2))
    assert len(only_b) == 8 and {e.block for e in only_b} == {2}
    only_d = list(f.port_map(dim=1))
    assert len(only_d) == 12 and {e.dim for e in only_d} == {1}
    assert all(e.one_to_many is None for e in entries)
    k2 = Fabric.build(FabricConfig((2, 2), 4, 2, 8))
    ocs = k2.ocs_index(1, 0, 1)
    on_ocs = list(k2.port_map(ocs=ocs))
    # second ends of all 4 blocks, first ends only of blocks whose first end lands on k = 1
    assert sorted((e.block, e.end) for e in on_ocs) == [
        (0, 2),
        (1, 1),
        (1, 2),
        (2, 2),
        (3, 1),
        (3, 2),
    ]
    assert all(e.one_to_many is not None for e in on_ocs if e.end == 2)
