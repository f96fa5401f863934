"""CS-4: a slice shape from a compute demand (seed 000 ¶55).

"The cell scheduler may determine the target arrangement of building blocks
based on the estimated compute demand of the workload and the throughput of
one or more types of available compute nodes." A job gives its demand — total
FLOPs, or chip-hours of one node type — and a deadline; the cell sizes the
slice so the work is done by then:

    chips  = ceil(flops / (flops_per_chip × seconds))     (or chip_hours × 3600 / seconds)
    blocks = ceil(chips / chips per block)                 (at least one block)
    grid   = the most compact arrangement of exactly `blocks` blocks

unless fewer chips than a block's are needed (issue 28): then the slice is a box of
chips inside one block (a sub-block slice, packed with others into a block at chip
granularity) — the smallest box with at least `chips` chips whose every extent
divides the block's (so such boxes tile a block at aligned offsets and waste none of
it: 3 chips get 1x2x2 of a 4x4x4 block, not 1x1x3), the most compact of those
(smallest largest extent, then smallest sum), extents ascending where the block
allows it (1x1x2, 1x2x2, 2x2x4, as published slice shapes are written). A box as
large as the block is the whole block.

The time left is read when the job is placed (a job that waited gets a larger
slice). `flops_per_chip` is the node type's throughput, an operator setting
(LIGHTPATH_CELL_NODE_FLOPS: what one chip sustains on such work, not a
datasheet peak, if the operator knows better). The fewest blocks that meet
the deadline are taken, never more: an optical fabric wires any arrangement
of blocks into a torus (¶59, ¶63-64), so an odd count needs no rounding. Among
arrangements of that count the most compact wins — the smallest largest
extent, then the smallest sum of extents (shorter rings, more bisection) —
with extents ascending (1x2x2, as published slice shapes are written).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

Grid = tuple[int, ...]

# Above this many blocks no pod exists; it also bounds the factoring below.
MAX_DERIVED_BLOCKS = 1 << 20


@dataclass(frozen=True)
class DerivedShape:
    """The slice derived for one pod's block shape (CS-4)."""

    grid: Grid  # in blocks (1x1x1 for a sub-block slice)
    chips: tuple[int, ...]  # the slice in chips
    chips_needed: int  # what the demand asks for; chips >= chips_needed
    node_type: str
    # A box of chips inside one block (issue 28), not whole blocks.
    sub_block: bool = False

    @property
    def blocks(self) -> int:
        """Whole blocks the slice takes (0 for a sub-block slice)."""
        return 0 if self.sub_block else math.prod(self.grid)

    def describe(self) -> str:
        shape = "x".join(map(str, self.chips))
        held = (
            "a box inside one block"
            if self.sub_block
            else f"{self.blocks} block{'s' if self.blocks != 1 else ''}"
        )
        return f"{shape} {self.node_type} chips ({held}) for {self.chips_needed} chips of demand"


def chips_needed(
    *, flops: float, chip_hours: float, seconds: float, flops_per_chip: float | None
) -> int:
    """Chips that finish the demand within `seconds` (at least 1).

    Exactly one of `flops` and `chip_hours` is > 0; `flops` needs the node
    type's throughput `flops_per_chip`. ValueError names what is wrong.
    """
    if seconds <= 0:
        raise ValueError("the deadline has passed")
    if (flops > 0) == (chip_hours > 0):
        raise ValueError("give flops or chip_hours (one of them, > 0)")
    if flops > 0:
        if not flops_per_chip or flops_per_chip <= 0:
            raise ValueError("no throughput is configured for this node type")
        raw = flops / (flops_per_chip * seconds)
    else:
        raw = chip_hours * 3600.0 / seconds
    if not math.isfinite(raw) or raw > MAX_DERIVED_BLOCKS * 1_000_000:
        raise ValueError("the demand is too large for any cell")
    # A hair of float noise must not cost a whole extra chip.
    return max(1, math.ceil(raw * (1 - 1e-12)))


def compact_grid(blocks: int, dims: int) -> Grid:
    """The most compact arrangement of exactly `blocks` blocks in `dims` dimensions:
    smallest largest extent, then smallest sum of extents; extents ascending."""
    if blocks < 1 or dims < 1:
        raise ValueError("blocks and dims must be >= 1")
    if blocks > MAX_DERIVED_BLOCKS:
        raise ValueError(f"{blocks} blocks is more than any pod has")
    best: Grid | None = None
    for grid in _factorizations(blocks, dims, 1):
        key = (max(grid), sum(grid), grid)
        if best is None or key < (max(best), sum(best), best):
            best = grid
    assert best is not None
    return best


def _factorizations(n: int, dims: int, least: int):
    """Every ascending tuple of `dims` factors >= least whose product is n."""
    if dims == 1:
        if n >= least:
            yield (n,)
        return
    f = least
    while f**dims <= n:
        if n % f == 0:
            for rest in _factorizations(n // f, dims - 1, f):
                yield (f, *rest)
        f += 1


def sub_block_box(chips: int, block_shape: tuple[int, ...]) -> Grid | None:
    """The box of a sub-block slice for `chips` chips on blocks of `block_shape` (see the
    module's rule), or None when it would be the whole block (or more)."""
    per_block = math.prod(block_shape)
    if chips >= per_block:
        return None
    best: tuple[tuple, Grid] | None = None
    for box in itertools.product(*(_divisors(b) for b in block_shape)):
        n = math.prod(box)
        if n < chips or n >= per_block:
            continue
        key = (n, max(box), sum(box), box)
        if best is None or key < best[0]:
            best = (key, box)
    return None if best is None else best[1]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def derive_shape(
    *,
    flops: float,
    chip_hours: float,
    seconds: float,
    node_type: str,
    flops_per_chip: float | None,
    block_shape: tuple[int, ...],
) -> DerivedShape:
    """The slice for a demand on blocks of `block_shape` (CS-4); ValueError says why not."""
    needed = chips_needed(
        flops=flops, chip_hours=chip_hours, seconds=seconds, flops_per_chip=flops_per_chip
    )
    box = sub_block_box(needed, block_shape)
    if box is not None:
        return DerivedShape((1,) * len(block_shape), box, needed, node_type, sub_block=True)
    per_block = math.prod(block_shape)
    blocks = max(1, math.ceil(needed / per_block))
    grid = compact_grid(blocks, len(block_shape))
    chips = tuple(g * b for g, b in zip(grid, block_shape, strict=True))
    return DerivedShape(grid, chips, needed, node_type)
