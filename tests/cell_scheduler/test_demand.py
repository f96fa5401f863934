"""CS-4: a slice shape from a compute demand (seed 000 ¶55) — the pure derivation."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightpath_services.cell_scheduler.demand import (
    chips_needed,
    compact_grid,
    derive_shape,
    sub_block_box,
)

TPU_V4_FLOPS = 275e12  # bf16 peak of one TPU v4 chip
HOUR = 3600.0


def test_flops_and_a_deadline_give_the_chips_that_finish_in_time():
    # 256 chips × 275 TFLOP/s × 1 h of work, due in one hour: exactly 256 chips.
    work = 256 * TPU_V4_FLOPS * HOUR
    assert chips_needed(flops=work, chip_hours=0, seconds=HOUR, flops_per_chip=TPU_V4_FLOPS) == 256
    # Half the time: twice the chips; a little more work: one chip more.
    assert (
        chips_needed(flops=work, chip_hours=0, seconds=HOUR / 2, flops_per_chip=TPU_V4_FLOPS) == 512
    )
    assert (
        chips_needed(flops=work * 1.001, chip_hours=0, seconds=HOUR, flops_per_chip=TPU_V4_FLOPS)
        == 257
    )


def test_chip_hours_need_no_throughput():
    assert chips_needed(flops=0, chip_hours=1000, seconds=10 * HOUR, flops_per_chip=None) == 100
    assert chips_needed(flops=0, chip_hours=0.01, seconds=10 * HOUR, flops_per_chip=None) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(flops=1e18, chip_hours=0, seconds=0, flops_per_chip=1e12), "deadline has passed"),
        (dict(flops=1e18, chip_hours=5, seconds=HOUR, flops_per_chip=1e12), "one of them"),
        (dict(flops=0, chip_hours=0, seconds=HOUR, flops_per_chip=1e12), "one of them"),
        (dict(flops=1e18, chip_hours=0, seconds=HOUR, flops_per_chip=None), "no throughput"),
        (dict(flops=1e300, chip_hours=0, seconds=1, flops_per_chip=1.0), "too large"),
    ],
)
def test_impossible_demands_say_why(kwargs, message):
    with pytest.raises(ValueError, match=message):
        chips_needed(**kwargs)


@pytest.mark.parametrize(
    ("blocks", "dims", "grid"),
    [
        (1, 3, (1, 1, 1)),
        (2, 3, (1, 1, 2)),
        (3, 3, (1, 1, 3)),
        (4, 3, (1, 2, 2)),
        (8, 3, (2, 2, 2)),
        (12, 3, (2, 2, 3)),
        (16, 3, (2, 2, 4)),
        (48, 3, (3, 4, 4)),
        (64, 3, (4, 4, 4)),
        (7, 3, (1, 1, 7)),  # any count can be wired (¶59): no rounding up to a nicer shape
        (6, 2, (2, 3)),
        (36, 2, (6, 6)),
    ],
)
def test_the_most_compact_arrangement_of_exactly_that_many_blocks(blocks, dims, grid):
    assert compact_grid(blocks, dims) == grid


def test_derived_slices_are_whole_blocks_in_chips():
    # TPU v4 published shapes: 256 chips = 4x8x8 chips = 1x2x2 blocks of 4x4x4.
    work = 231 * TPU_V4_FLOPS * HOUR
    d = derive_shape(
        flops=work,
        chip_hours=0,
        seconds=HOUR,
        node_type="tpu",
        flops_per_chip=TPU_V4_FLOPS,
        block_shape=(4, 4, 4),
    )
    assert d.chips_needed == 231 and d.grid == (1, 2, 2) and d.chips == (4, 8, 8)
    assert d.blocks == 4 and "231 chips" in d.describe()


@given(blocks=st.integers(1, 600), dims=st.integers(1, 4))
def test_compact_grid_is_exact_ascending_and_no_arrangement_is_more_compact(blocks, dims):
    grid = compact_grid(blocks, dims)
    assert len(grid) == dims and math.prod(grid) == blocks and list(grid) == sorted(grid)
    # No arrangement of `blocks` has a smaller largest extent.
    smallest_max = math.ceil(round(blocks ** (1 / dims), 9))
    assert max(grid) >= smallest_max
    for m in range(smallest_max, max(grid)):
        # every extent <= m cannot multiply to blocks with `dims` extents
        assert not _fits(blocks, dims, m)


def _fits(n: int, dims: int, m: int) -> bool:
    if dims == 1:
        return n <= m
    return any(n % f == 0 and _fits(n // f, dims - 1, m) for f in range(1, min(m, n) + 1))


@given(
    chips=st.integers(1, 5000),
    hours=st.floats(0.1, 100),
    block=st.sampled_from([(4, 4, 4), (2, 2, 2), (8, 8), (4, 4, 8)]),
)
def test_a_derived_slice_always_has_the_chips_the_demand_needs(chips, hours, block):
    d = derive_shape(
        flops=0,
        chip_hours=chips * hours,
        seconds=hours * HOUR,
        node_type="tpu",
        flops_per_chip=None,
        block_shape=block,
    )
    per_block = math.prod(block)
    assert math.prod(d.chips) >= d.chips_needed >= 1
    assert d.chips_needed == chips
    assert math.prod(d.chips) - d.chips_needed < per_block  # never a whole block more
    if d.sub_block:  # fewer chips than a block: a box whose extents divide the block's
        assert chips < per_block and math.prod(d.chips) < per_block and d.blocks == 0
        assert all(b % c == 0 for c, b in zip(d.chips, block, strict=True))
        assert d.grid == (1,) * len(block)
    else:
        assert all(c % b == 0 for c, b in zip(d.chips, block, strict=True))
        assert d.blocks == math.prod(d.grid) >= 1


@pytest.mark.parametrize(
    ("chips", "box"),
    [
        (1, (1, 1, 1)),
        (2, (1, 1, 2)),
        (3, (1, 2, 2)),  # extents that divide the block's: 1x1x3 would strand a chip per row
        (4, (1, 2, 2)),
        (5, (2, 2, 2)),
        (9, (2, 2, 4)),
        (17, (2, 4, 4)),
        (32, (2, 4, 4)),
        (33, None),  # more than the largest box smaller than the block: the whole block
        (64, None),
    ],
)
def test_a_small_demand_gets_a_box_inside_one_block_not_a_whole_block(chips, box):
    # Issue 28: a 3-chip demand would hold 64 chips if rounded up to a block.
    assert sub_block_box(chips, (4, 4, 4)) == box
    d = derive_shape(
        flops=0,
        chip_hours=chips,
        seconds=HOUR,
        node_type="tpu",
        flops_per_chip=None,
        block_shape=(4, 4, 4),
    )
    if box is None:
        assert not d.sub_block and d.grid == (1, 1, 1) and d.chips == (4, 4, 4)
    else:
        assert d.sub_block and d.chips == box and d.blocks == 0
        assert "a box inside one block" in d.describe()


def test_a_box_is_ascending_only_where_the_block_allows_it():
    assert sub_block_box(100, (8, 8, 4)) == (4, 8, 4)  # 4x4x8 does not fit a z of 4
