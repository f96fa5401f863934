"""OCS-1: the fabric and its port map, with the seed's numbers (¶89-99, ¶133-139, ¶161-163)."""

from __future__ import annotations

import pytest

from lightpath.domain.torus import (
    FIRST,
    SECOND,
    Fabric,
    FabricConfig,
    parse_shape,
    ports_needed,
)
from lightpath.errors import InvalidArgument

# Fig. 12: building blocks 1211-1214 are blocks 0-3; OCS 1271 / 1272 are k = 0 / 1.
B1211, B1212, B1213, B1214 = 0, 1, 2, 3


def fig12() -> Fabric:
    return Fabric.build(FabricConfig((4, 4, 4), 4, ocs_per_axis=2, ocs_radix=8))


def test_fig8_a_64_block_pod_has_48_ocs_of_128_ports_with_k1():
    f = Fabric.build(FabricConfig((4, 4, 4), 64, 1, 136))
    assert f.axes == (16, 16, 16)  # 16 segments per dimension (¶89)
    assert f.ocs_count == 48  # 16 + 16 + 16 OCS (¶89, ¶133)
    assert f.max_ports_used_per_ocs == 128  # an input and an output per block (¶134)
    assert f.one_to_many_count == 0
    assert len(set(f.ocs_ids)) == 48 and f.ocs_ids[5] == "ocs-x-5-0"


def test_fig12_6_ports_per_ocs_with_k2_instead_of_8():
    f = fig12()
    assert [f.ports_cabled(k) for k in (0, 1)] == [6, 6]  # ¶139
    k1 = Fabric.build(FabricConfig((4, 4, 4), 4, ocs_per_axis=1, ocs_radix=8))
    assert k1.ports_cabled(0) == 8


def test_fig12_first_ends_split_evenly_second_ends_behind_a_1x2():
    f = fig12()
    # ¶139: segments 1221 and 1223 land on 1271, 1222 and 1224 on 1272.
    assert [f.first_ocs(b) for b in (B1211, B1212, B1213, B1214)] == [0, 1, 0, 1]
    for b in range(4):
        first = f.port_map_entry(b, 0, 0, FIRST)
        assert first.one_to_many is None and len(first.ports) == 1
        second = f.port_map_entry(b, 0, 0, SECOND)
        # ¶138: one 1x2 per segment, output 1 to 1271, output 2 to 1272.
        assert second.one_to_many is not None
        assert [f.ocs_of_index(o)[2] for o, _ in second.ports] == [0, 1]
    # every cabled port of one OCS is distinct and maps back to its segment end
    for k in (0, 1):
        ocs = f.ocs_index(0, 0, k)
        ports = [p for e in f.port_map(ocs=ocs) for o, p in e.ports if o == ocs]
        assert sorted(ports) == list(range(6))
        for e in f.port_map(ocs=ocs):
            for o, p in e.ports:
                if o == ocs:
                    assert f.segment_at(k, p) == (e.block, e.end)


def test_3072_one_to_two_switches_for_a_64_block_pod():
    f = Fabric.build(FabricConfig((4, 4, 4), 64, 2, 136))
    assert f.one_to_many_count == 3072  # ¶138
    assert f.ocs_count == 96
    assert f.max_ports_used_per_ocs == 96  # 32 first ends + 64 1x2 outputs


@pytest.mark.parametrize(
    ("n", "k", "need"), [(64, 1, 128), (64, 2, 96), (64, 3, 86), (4, 2, 6), (5, 2, 8)]
)
def test_ports_needed(n, k, need):
    assert ports_needed(n, k) == need


def test_a_radix_too_small_is_refused_with_the_ports_needed():
    with pytest.raises(InvalidArgument) as err:
        Fabric.build(FabricConfig((4, 4, 4), 64, 1, 127))
    (v,) = err.value.violations
    assert v.field == "ocs_radix"
    assert "128" in v.rule and "127" in v.rule
    with pytest.raises(InvalidArgument) as err:
        Fabric.build(FabricConfig((4, 4, 4), 64, 2, 95))
    assert "96" in err.value.violations[0].rule and "1x2" in err.value.violations[0].rule


def test_impossible_configs_name_every_field():
    with pytest.raises(InvalidArgument) as err:
        Fabric.build(FabricConfig((4, 0, 4), 0, 0, 1))
    fields = {v.field for v in err.value.violations}
    assert fields == {"block_shape", "block_count", "ocs_per_axis"}
    with pytest.raises(InvalidArgument) as err:
        Fabric.build(FabricConfig((4, 4, 4), 2, 3, 100))
    assert err.value.violations[0].field == "ocs_per_axis"
    with pytest.raises(InvalidArgument) as err:  # bounded: a typo must not exhaust memory
        Fabric.build(FabricConfig((1000, 1000), 10**9, 10**9, 10**12))
    fields = {v.field for v in err.value.violations}
    assert fields == {"block_shape", "block_count", "ocs_per_axis", "ocs_radix"}


def test_port_map_is_deterministic_and_one_to_one():
    f = Fabric.build(FabricConfig((4, 4, 2), 10, 3, 20))
    assert f.axes == (8, 8, 16)
    seen = {}
    for e in f.port_map():
        for o, p in e.ports:
            assert (o, p) not in seen, "two segment ends on one port"
            seen[(o, p)] = e
            assert f.segment_at(f.ocs_of_index(o)[2], p) == (e.block, e.end)
            assert f.ocs_of_index(o)[:2] == (e.dim, e.axis)
    assert list(f.port_map()) == list(Fabric.build(f.config).port_map())
    for i, oid in enumerate(f.ocs_ids):
        assert f.parse_ocs_id(oid) == i
    assert f.parse_ocs_id("ocs-x-0-3") is None  # K = 3: k is 0..2
    for idx in (0, 17, f.one_to_many_count - 1):
        b, d, a = f.one_to_many_of_index(idx)
        assert f.one_to_many_index(b, d, a) == idx
        assert f.parse_one_to_many_id(f.one_to_many_id(b, d, a)) == (b, d, a)


def test_logical_axis_is_row_major_in_the_other_dimensions():
    f = Fabric.build(FabricConfig((4, 4, 4), 1, 1, 2))
    assert f.segment_coords(0, 5) == (1, 1)  # x axis 5: y = 1, z = 1
    assert f.segment_coords(2, 15) == (3, 3)  # z axis 15: x = 3, y = 3


def test_parse_shape():
    assert parse_shape("4x4x4") == (4, 4, 4)
    assert parse_shape(" 2×3 ") == (2, 3)
    for bad in ("", "4x", "0x4", "4x4x4x4x4x4x4", "a"):
        with pytest.raises(ValueError):
            parse_shape(bad)
