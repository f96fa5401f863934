"""The OCS fabric's configuration (OCS-1) at its bounds: shapes, the canonical JSON,
every limit of validate_config on both sides. Found untested by bench/mutation.py
(issue 17). Pure."""

from __future__ import annotations

import pytest

from lightpath.domain.torus import (
    MAX_BLOCKS,
    MAX_CHIPS_PER_BLOCK,
    MAX_DIMS,
    MAX_OCS_PER_AXIS,
    MAX_RADIX,
    Fabric,
    FabricConfig,
    dim_name,
    format_shape,
    parse_shape,
    ports_needed,
    validate_config,
)
from lightpath.errors import InvalidArgument


def test_limits():
    assert (MAX_DIMS, MAX_BLOCKS, MAX_CHIPS_PER_BLOCK, MAX_OCS_PER_AXIS, MAX_RADIX) == (
        6,
        65536,
        65536,
        64,
        1_000_000,
    )


def test_dimension_names():
    assert [dim_name(d) for d in range(5)] == ["x", "y", "z", "d3", "d4"]


def test_shapes_parse_and_format():
    assert parse_shape(" 4X2×3 ") == (4, 2, 3)
    assert parse_shape("1") == (1,)
    assert parse_shape("1x1x1x1x1x1") == (1,) * 6
    for bad in ("", "4x", "0x4", "4x-1", "1x1x1x1x1x1x1", "a"):
        with pytest.raises(ValueError):
            parse_shape(bad)
    assert format_shape((4, 2, 3)) == "4x2x3" and format_shape([1]) == "1"


def test_config_defaults_json_and_description():
    c = FabricConfig((4, 4, 4), 64)
    assert (c.ocs_per_axis, c.ocs_radix) == (1, 136)
    raw = FabricConfig((2, 3), 5, 2, 10).to_json()
    assert raw == '{"block_count":5,"block_shape":[2,3],"ocs_per_axis":2,"ocs_radix":10}'
    assert FabricConfig.from_json(raw) == FabricConfig((2, 3), 5, 2, 10)
    assert FabricConfig((2, 3), 5, 2, 10).describe() == "2x3 blocks × 5, K=2, radix 10"


def test_ports_needed():
    assert ports_needed(64, 1) == 128
    assert ports_needed(4, 2) == 6
    assert ports_needed(5, 2) == 8  # ceil(5 / 2) first ends


def fields(config: FabricConfig, prefix: str = "") -> list[str]:
    try:
        validate_config(config, prefix)
    except InvalidArgument as e:
        return [v.field for v in e.violations]
    return []


def test_every_bound_on_both_sides():
    ok = FabricConfig((2, 2), 4, 1, 8)
    assert fields(ok) == []
    assert fields(FabricConfig((1,) * 6, 1, 1, 2)) == []
    assert fields(FabricConfig((1,) * 7, 1, 1, 2)) == ["block_shape"]
    assert fields(FabricConfig((), 1, 1, 2)) == ["block_shape"]
    assert fields(FabricConfig((2, 0), 1, 1, 2)) == ["block_shape"]
    assert fields(FabricConfig((256, 256), 1, 1, 2)) == []  # 65536 chips
    assert fields(FabricConfig((256, 257), 1, 1, 2)) == ["block_shape"]
    assert fields(FabricConfig((1,), 0, 1, 2)) == ["block_count"]
    assert fields(FabricConfig((1,), MAX_BLOCKS, 1, 2 * MAX_BLOCKS)) == []
    assert fields(FabricConfig((1,), MAX_BLOCKS + 1, 1, MAX_RADIX)) == ["block_count"]
    assert fields(FabricConfig((1,), 64, 64, 65)) == []
    assert fields(FabricConfig((1,), 65, 65, 66)) == ["ocs_per_axis"]
    assert fields(FabricConfig((1,), 4, 0, 8)) == ["ocs_per_axis"]
    assert fields(FabricConfig((1,), 4, 1, MAX_RADIX + 1)) == ["ocs_radix"]
    assert fields(FabricConfig((1,), 2, 3, 8)) == ["ocs_per_axis"]  # K above N
    assert fields(FabricConfig((1,), 3, 3, 8)) == []  # K = N


def test_the_radix_must_hold_the_busiest_ocs_and_the_error_says_why():
    assert fields(FabricConfig((1,), 4, 1, 8)) == []
    with pytest.raises(InvalidArgument) as e:
        validate_config(FabricConfig((1,), 4, 1, 7), "fabric.")
    (v,) = e.value.violations
    assert v.field == "fabric.ocs_radix"
    assert "7 ports are too few: 4 blocks with K=1 need 8 ports" in v.rule
    assert "4 first ends + 4 second ends" in v.rule
    with pytest.raises(InvalidArgument) as e:
        validate_config(FabricConfig((1,), 5, 2, 7))
    assert "need 8 ports per OCS (3 first ends + 5 outputs of 1x2 switches)" in (
        e.value.violations[0].rule
    )
    assert e.value.reason == "FABRIC_IMPOSSIBLE"


def test_several_broken_rules_at_once_with_the_prefix():
    assert fields(FabricConfig((0,), 0, 0, MAX_RADIX + 1), "p.") == [
        "p.block_shape",
        "p.block_count",
        "p.ocs_per_axis",
        "p.ocs_radix",
    ]


def test_build_refuses_what_validate_refuses():
    with pytest.raises(InvalidArgument):
        Fabric.build(FabricConfig((1,), 4, 1, 7))


def test_more_ocs_per_axis_than_blocks_at_the_ends_of_the_block_range():
    assert fields(FabricConfig((1,), 1, 2, 4)) == ["ocs_per_axis"]
    big = FabricConfig((1,), MAX_BLOCKS, MAX_BLOCKS + 1, MAX_RADIX)
    assert fields(big) == ["ocs_per_axis", "ocs_per_axis"]  # K above 64, and above N
