"""Wiring a slice into its logical torus, releasing it, replacing a block (OCS-2, OCS-4, OCS-5).

Pure: functions of a `Fabric` and a `SlicePlacement`, no I/O.

The unit of wiring is a `Link`: along dimension d, block P sits just before
block Q (or is the last block and wraps to the first, or is alone and wraps
onto itself, ¶70-74). A link means, for EVERY logical axis a of d, "P's second
end cross-connected to Q's first end on the OCS of (d, a) where Q's first end
lands", and with K >= 2 "P's 1xK switch of (d, a) set to that OCS" (OCS-2,
¶141-149, ¶169). The ports are the same on every axis of d, so a full 64-block
pod (3,072 cross-connects) is 192 links; the store, the driver and the
responses expand links only where they must.

A twisted slice (issue 28, lightpath/domain/twist.py) differs only in its
wraparounds: along a short dimension the last block links to the first one
shifted k blocks along each long dimension. Still one link per block and
dimension, on the same logical axes, so everything downstream is unchanged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from lightpath.domain.torus import Fabric, format_shape
from lightpath.domain.twist import Skews, skews
from lightpath.errors import FieldViolation, InvalidArgument, NotFound
from lightpath_services.common.keys import ID_RULE, is_valid_id


@dataclass(frozen=True)
class SlicePlacement:
    """A slice (workload cluster): which block sits at which logical position (WS-8, ¶106-107).

    `blocks[i]` is the block at grid position i, positions in row-major order
    with x fastest. `wrap[d]` closes dimension d into a ring. `twisted`: the
    wraparounds of the short dimensions are twisted (`twist_skews`).
    """

    job_id: str
    grid: tuple[int, ...]
    blocks: tuple[int, ...]
    wrap: tuple[bool, ...]
    twisted: bool = False

    def position(self, index: int) -> tuple[int, ...]:
        out = []
        for extent in self.grid:
            index, c = divmod(index, extent)
            out.append(c)
        return tuple(out)

    def index_of(self, coords: Sequence[int]) -> int:
        index = 0
        for c, extent in zip(reversed(coords), reversed(self.grid), strict=True):
            index = index * extent + c
        return index

    def index_of_block(self, block: int) -> int | None:
        try:
            return self.blocks.index(block)
        except ValueError:
            return None

    def with_block(self, index: int, block: int) -> SlicePlacement:
        blocks = list(self.blocks)
        blocks[index] = block
        return replace(self, blocks=tuple(blocks))  # keeps wrap and twist

    def spec(self) -> str:
        """Canonical JSON of grid, blocks, wrap (and the twist, only when twisted, so a
        spec stored before twists existed reads the same): equal placements give equal
        strings."""
        d: dict[str, object] = {
            "grid": list(self.grid),
            "blocks": list(self.blocks),
            "wrap": [int(w) for w in self.wrap],
        }
        if self.twisted:
            d["twisted"] = 1
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_spec(cls, job_id: str, spec: str) -> SlicePlacement:
        d = json.loads(spec)
        return cls(
            job_id,
            tuple(d["grid"]),
            tuple(d["blocks"]),
            tuple(bool(w) for w in d["wrap"]),
            bool(d.get("twisted", 0)),
        )


def twist_skews(grid: Sequence[int]) -> Skews:
    """{short dimension: {long dimension: shift in blocks}} of a twisted `grid`.

    The grid must be twistable (`validate_placement` checked it)."""
    found = skews(grid)
    if found is None:
        raise ValueError(f"a {format_shape(tuple(grid))} grid cannot be twisted")
    return found


def twist_refusal(
    grid: Sequence[int], block_shape: Sequence[int], wrap: Sequence[bool]
) -> str | None:
    """Why a slice of `grid` blocks cannot be wired twisted, or None when it can.

    The twist is whole blocks: the grid must be k x k x 2k or k x 2k x 2k blocks, and
    in chips (grid x block shape) the same shape twisted by the same amount, which it
    is whenever the blocks are cubes (4x4x4)."""
    grid_s = format_shape(tuple(grid))
    chips = tuple(g * b for g, b in zip(grid, block_shape, strict=True))
    twist = skews(grid)
    if twist is None:
        return (
            f"a {grid_s} grid of blocks ({format_shape(chips)} chips) cannot be twisted: a "
            "twisted torus needs k x k x 2k or k x 2k x 2k blocks, in any axis order "
            "(e.g. 1x1x2, 1x2x2, 2x2x4)"
        )
    in_chips = {s: {e: n * block_shape[e] for e, n in longs.items()} for s, longs in twist.items()}
    if skews(chips) != in_chips:
        return (
            f"a {grid_s} grid of {format_shape(tuple(block_shape))} blocks is "
            f"{format_shape(chips)} chips, whose twisted torus is not made of whole blocks"
        )
    if wrap and not all(wrap):
        return "a twisted torus wraps in every dimension: leave wrap empty or all true"
    return None


def validate_placement(
    fabric: Fabric,
    job_id: str,
    grid: Sequence[int],
    blocks: Sequence[tuple[Sequence[int], int]],
    wrap: Sequence[bool],
    twisted: bool = False,
) -> SlicePlacement:
    """Check a WireSlice request (X-3) and return its placement.

    INVALID_ARGUMENT for a bad id, a dimension mismatch, a logical arrangement
    that is not a full grid (a position missing, given twice or outside), a
    block given twice, a twist the grid or wrap does not allow (`twist_refusal`);
    NOT_FOUND for a block id the pod does not have.
    """
    bad: list[FieldViolation] = []
    if not is_valid_id(job_id):
        bad.append(FieldViolation("job_id", ID_RULE))
    m = fabric.dims
    grid_ok = len(grid) == m and all(e >= 1 for e in grid)
    if len(grid) != m:
        bad.append(
            FieldViolation(
                "grid.dims",
                f"has {len(grid)} extents; the blocks of this pod have {m} dimensions "
                f"({format_shape(fabric.config.block_shape)})",
            )
        )
    else:
        for i, e in enumerate(grid):
            if e < 1:
                bad.append(FieldViolation(f"grid.dims[{i}]", "must be >= 1"))
    if grid_ok and math.prod(grid) > fabric.block_count:
        bad.append(
            FieldViolation(
                "grid",
                f"{format_shape(tuple(grid))} needs {math.prod(grid)} blocks; "
                f"the pod has {fabric.block_count}",
            )
        )
        grid_ok = False
    if len(wrap) not in (0, m):
        bad.append(
            FieldViolation("wrap", f"give one flag per dimension ({m}) or none for a full torus")
        )
    if twisted and grid_ok:
        why = twist_refusal(grid, fabric.config.block_shape, wrap)
        if why:
            bad.append(FieldViolation("twisted", why))
    if grid_ok:
        size = math.prod(grid)
        if len(blocks) != size:
            bad.append(
                FieldViolation(
                    "blocks",
                    f"{len(blocks)} placements for a {format_shape(tuple(grid))} grid of {size} "
                    "positions: the logical arrangement must be a full grid, one block per position",
                )
            )
    by_index: dict[int, int] = {}
    seen_block: dict[int, int] = {}
    unknown: list[int] = []
    probe = SlicePlacement(job_id, tuple(grid), (), ())
    for i, (coords, block) in enumerate(blocks):
        if grid_ok:
            if len(coords) != m:
                bad.append(
                    FieldViolation(
                        f"blocks[{i}].position", f"has {len(coords)} coordinates; the grid has {m}"
                    )
                )
            elif any(not 0 <= c < e for c, e in zip(coords, grid, strict=True)):
                bad.append(
                    FieldViolation(
                        f"blocks[{i}].position",
                        f"{tuple(coords)} is outside the {format_shape(tuple(grid))} grid",
                    )
                )
            else:
                index = probe.index_of(coords)
                if index in by_index:
                    bad.append(
                        FieldViolation(
                            f"blocks[{i}].position",
                            f"{tuple(coords)} is given twice: one block per position",
                        )
                    )
                by_index[index] = block
        if block in seen_block:
            bad.append(
                FieldViolation(
                    f"blocks[{i}].block_id",
                    f"block {block} is given twice (also blocks[{seen_block[block]}])",
                )
            )
        else:
            seen_block[block] = i
        if block >= fabric.block_count:
            unknown.append(block)
    if bad:
        raise InvalidArgument.of(bad, reason="INVALID_PLACEMENT")
    if unknown:
        raise NotFound(
            "block",
            str(unknown[0]),
            hint=f"pod has blocks 0..{fabric.block_count - 1}",
        )
    ordered = tuple(by_index[i] for i in range(len(by_index)))
    return SlicePlacement(
        job_id, tuple(grid), ordered, tuple(wrap) if wrap else tuple([True] * m), twisted
    )


@dataclass(frozen=True, order=True, slots=True)
class Link:
    """Along `dim`, block `src` (P) feeds block `dst` (Q): P's second ends to Q's first ends
    on every logical axis of `dim` (OCS-2). src == dst is a self-loop (¶70-72)."""

    dim: int
    src: int
    dst: int


def links(placement: SlicePlacement) -> tuple[Link, ...]:
    """Every link of a slice, by dimension then position (OCS-2).

    Twisted: the wraparound of a short dimension d from position p lands on the
    position at 0 along d with each long dimension e moved on by the shift
    (`twist_skews`), modulo its extent. A block keeps exactly one outgoing and one
    incoming link per dimension: the shift maps the last face along d onto the first
    one by a bijection. With a short extent of 1 (1x1x2 blocks) that replaces the
    regular torus' self-loop by a link to the other block."""
    out: list[Link] = []
    grid, blocks = placement.grid, placement.blocks
    twist = twist_skews(grid) if placement.twisted else {}
    strides = [math.prod(grid[:d]) for d in range(len(grid))]
    for d, extent in enumerate(grid):
        wrap = placement.wrap[d]
        stride = strides[d]  # positions are row-major, x fastest: one step along d
        shifts = twist.get(d, {})
        for i in range(len(blocks)):
            c = (i // stride) % extent
            if c + 1 < extent:
                j = i + stride
            elif wrap:
                j = i - c * stride
                for e, shift in shifts.items():
                    ce = (j // strides[e]) % grid[e]
                    j += ((ce + shift) % grid[e] - ce) * strides[e]
            else:
                continue
            out.append(Link(d, blocks[i], blocks[j]))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class CrossConnect:
    """One bidirectional cross-connect of an OCS routing table (¶108, ¶111)."""

    ocs: int  # OCS index in the fabric
    port_a: int  # P's second end (through its 1xK output when K >= 2)
    port_b: int  # Q's first end
    dim: int
    axis: int
    src: int  # P
    dst: int  # Q


def link_ports(fabric: Fabric, link: Link) -> tuple[int, int, int]:
    """(k, port_a, port_b): the OCS (of every axis of link.dim) where Q's first end lands and
    the two ports there (¶143-149)."""
    k = fabric.first_ocs(link.dst)
    return k, fabric.second_port(link.src, k), fabric.first_port(link.dst)


def cross_connects(fabric: Fabric, wiring: Iterable[Link]) -> Iterator[CrossConnect]:
    """Expand links to cross-connects, axis by axis."""
    for link in wiring:
        k, pa, pb = link_ports(fabric, link)
        d = link.dim
        for a in range(fabric.axes[d]):
            yield CrossConnect(fabric.ocs_index(d, a, k), pa, pb, d, a, link.src, link.dst)


def cross_connect_count(fabric: Fabric, wiring: Iterable[Link]) -> int:
    return sum(fabric.axes[link.dim] for link in wiring)


@dataclass(frozen=True, slots=True)
class OneToManyGroup:
    """The 1xK switches of `block`'s second ends along `dim` (one per logical axis), all moved
    from output `before` to output `after` (None = idle). K >= 2 only (¶141-149)."""

    block: int
    dim: int
    before: int | None
    after: int | None


@dataclass(frozen=True)
class FabricChange:
    """A delta of switch state: what a wire, release or replace does to the switches.

    Applied in this order: disconnect, 1xK moves, connect. `inverse()` undoes it.
    """

    disconnect: tuple[Link, ...] = ()
    connect: tuple[Link, ...] = ()
    one_to_many: tuple[OneToManyGroup, ...] = ()

    def inverse(self) -> FabricChange:
        return FabricChange(
            disconnect=self.connect,
            connect=self.disconnect,
            one_to_many=tuple(
                OneToManyGroup(g.block, g.dim, g.after, g.before) for g in self.one_to_many
            ),
        )

    @property
    def empty(self) -> bool:
        return not (self.disconnect or self.connect or self.one_to_many)

    def ocs_ops(
        self, fabric: Fabric
    ) -> dict[int, tuple[list[tuple[int, int]], list[tuple[int, int]]]]:
        """Per OCS index: (port pairs to disconnect, port pairs to connect): a driver's view."""
        ops: dict[int, tuple[list[tuple[int, int]], list[tuple[int, int]]]] = {}
        for which, group in ((0, self.disconnect), (1, self.connect)):
            for xc in cross_connects(fabric, group):
                ops.setdefault(xc.ocs, ([], []))[which].append((xc.port_a, xc.port_b))
        return ops

    def one_to_many_ops(self, fabric: Fabric) -> Iterator[tuple[int, int | None]]:
        """(1xK switch index, output or None for idle) for every switch that moves."""
        for g in self.one_to_many:
            for a in range(fabric.axes[g.dim]):
                yield fabric.one_to_many_index(g.block, g.dim, a), g.after


def one_to_many_settings(fabric: Fabric, wiring: Iterable[Link]) -> tuple[OneToManyGroup, ...]:
    """The 1xK settings a set of links needs: P's switches of (d, *) to the OCS of Q's first end."""
    if fabric.k == 1:
        return ()
    return tuple(OneToManyGroup(lk.src, lk.dim, None, fabric.first_ocs(lk.dst)) for lk in wiring)


def wire_change(fabric: Fabric, placement: SlicePlacement) -> FabricChange:
    """OCS-2: everything a slice needs, from nothing."""
    wiring = links(placement)
    return FabricChange(connect=wiring, one_to_many=one_to_many_settings(fabric, wiring))


def release_change(fabric: Fabric, placement: SlicePlacement) -> FabricChange:
    """OCS-4: exactly the slice's cross-connects and 1xK settings, removed."""
    return wire_change(fabric, placement).inverse()


@dataclass(frozen=True)
class Replacement:
    """OCS-5: the new block at the failed block's logical position, and the delta."""

    before: SlicePlacement
    after: SlicePlacement
    change: FabricChange
    untouched: tuple[Link, ...]


def replace_block(fabric: Fabric, placement: SlicePlacement, failed: int, new: int) -> Replacement:
    """Move only the links (so only the cross-connects) that touched `failed` onto `new` (¶130-132).

    With K >= 2 the 1xK switches of `failed` go idle, those of `new` are set,
    and a predecessor's switches move when `new`'s first ends land on another
    OCS than `failed`'s did.
    """
    index = placement.index_of_block(failed)
    if index is None:
        raise ValueError(f"block {failed} is not in slice {placement.job_id}")
    after = placement.with_block(index, new)
    old = links(placement)
    touched = tuple(lk for lk in old if failed in (lk.src, lk.dst))
    untouched = tuple(lk for lk in old if failed not in (lk.src, lk.dst))

    def swap(b: int) -> int:
        return new if b == failed else b

    added = tuple(Link(lk.dim, swap(lk.src), swap(lk.dst)) for lk in touched)
    otm: list[OneToManyGroup] = []
    if fabric.k > 1:
        for lk, nk in zip(touched, added, strict=True):
            before_k, after_k = fabric.first_ocs(lk.dst), fabric.first_ocs(nk.dst)
            if lk.src == failed:
                otm.append(OneToManyGroup(failed, lk.dim, before_k, None))
                otm.append(OneToManyGroup(new, lk.dim, None, after_k))
            elif before_k != after_k:
                otm.append(OneToManyGroup(lk.src, lk.dim, before_k, after_k))
    return Replacement(placement, after, FabricChange(touched, added, tuple(otm)), untouched)
