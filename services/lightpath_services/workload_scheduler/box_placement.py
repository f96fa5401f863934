"""Sub-block slices (issue 28): packing boxes of chips into blocks, and whom to preempt
for one. Pure functions of a pod snapshot, like placement.py.

A sub-block slice asks for a box of chips that fits inside one block (1x1x1 …
4x4x2 with 4x4x4 blocks). Its links are the block's electrical ones: it needs no
OCS change and is a mesh. The rules:

* **Aligned offsets.** A box of extents e sits at chip offsets that are multiples
  of e along each dimension (a 2x2x1 box at x, y in {0, 2}). Boxes of the
  power-of-two shapes the TPU v4 mix asks for then pack a block without leaving
  holes that no later box fits (a buddy allocator's rule).
* **Best fit into partly used blocks first.** Among the blocks already given over
  to sub-block slices (and blocks with a failed host, which no block slice may use),
  the box goes to the one with the fewest free chips that still has an aligned
  place for it, lowest block id on a tie; inside the block, the first aligned
  offset in chip order (x fastest). Only when none has room does a box open a
  fresh block, and then the highest-numbered free block: block placement takes the
  lowest ids first, so whole blocks stay free, together, for large slices.
* **No wiring left behind.** A fresh block must carry no OCS wiring mark (an
  ended slice's wiring not yet released): the block would still be part of that
  slice at the ocs_manager.
* **Healthy hosts only.** No chip of the box may be on a failed host.

Preemption for a box (WS-4, as for block slices: only lower priorities, least
disturbance first): within one block, the aligned place whose chips are free or
held by RUNNING lower-priority sub-block slices, choosing the place whose victims
have the lowest highest priority, then the fewest victims, then the least
disruptive policies. A victim that may SHRINK gives up the chips outside the
largest sub-box it accepts (kept at its offset) when that clears the place;
otherwise it is delayed or terminated by its own policy. When no such place
exists, lower-priority block slices give up one whole block (choose_victims).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

from lightpath.domain.slices import (
    DISRUPTION,
    RUNNING,
    SHRINK,
    SUB_BLOCK_OWNER,
    Grid,
    Position,
    SliceJob,
    box_chips,
    chip_keys,
    grid_positions,
    shields,
)
from lightpath_services.workload_scheduler.placement import PodState, Unplaceable
from lightpath_services.workload_scheduler.preemption import VictimAction


@dataclass(frozen=True)
class BoxPlacement:
    block: int
    offset: Position


def aligned_offsets(block_shape: Grid, box: Grid) -> list[Position]:
    """Every aligned offset of `box` inside a block, in chip order (x fastest)."""
    return list(_aligned_offsets(tuple(block_shape), tuple(box)))


@cache
def _aligned_offsets(block_shape: Grid, box: Grid) -> tuple[Position, ...]:
    counts = tuple(b // e for b, e in zip(block_shape, box, strict=True))
    return tuple(
        tuple(i * e for i, e in zip(pos, box, strict=True)) for pos in grid_positions(counts)
    )


@cache
def _box_cells(offset: Position, box: Grid) -> tuple[Position, ...]:
    """box_chips, kept: placing one box tries the same few offsets again and again."""
    return tuple(box_chips(offset, box))


# (block shape, host shape, failed hosts) -> chips on healthy hosts: a handful of
# distinct keys in a pod's life (one per set of failed hosts a block has had).
_USABLE: dict[tuple, frozenset[Position]] = {}


def _usable_chips(state: PodState, block: int) -> frozenset[Position]:
    """Chips of `block` on healthy hosts."""
    fabric = state.fabric
    bad = state.failed_hosts.get(block, frozenset())
    key = (fabric.block_shape, fabric.host_shape, bad)
    got = _USABLE.get(key)
    if got is None:
        got = _USABLE[key] = frozenset(
            c for c in grid_positions(fabric.block_shape) if fabric.host_of(c) not in bad
        )
    return got


def _split_blocks(state: PodState, node_type: str) -> list[int]:
    """Blocks of `node_type` that take sub-block slices on their free chips: given over
    to sub-block slices, or with failed hosts and held by no block slice."""
    types = state.fabric.node_types
    out = []
    for b in sorted(
        set(state.failed_hosts) | {b for b, o in state.owner.items() if o == SUB_BLOCK_OWNER}
    ):
        if types[b] != node_type or state.whole_failed(b):
            continue
        owner = state.owner.get(b)
        if owner is None or owner == SUB_BLOCK_OWNER:
            out.append(b)
    return out


def _fresh_blocks(state: PodState, node_type: str, allow_wired: Iterable[str] = ()) -> list[int]:
    """Free healthy blocks with no wiring mark (of a job not in `allow_wired`), highest id first."""
    allow = set(allow_wired)
    types = state.fabric.node_types
    return sorted(
        (
            b
            for b in state.candidates()
            if types[b] == node_type
            and state.allocatable(b, allow)
            and (b not in state.wired or state.wired[b] in allow)
        ),
        reverse=True,
    )


def place_box(
    state: PodState, job: SliceJob, *, allow_wired: Iterable[str] = ()
) -> BoxPlacement | Unplaceable:
    """Where the sub-block slice `job` goes now, without preempting anything.
    `allow_wired`: victims whose blocks count as free although still marked wired."""
    box = job.demand.box
    assert box is not None
    node_type = job.demand.node_types[0]
    held = state.chips_held()
    offsets = _aligned_offsets(tuple(state.fabric.block_shape), tuple(box))
    best: tuple[int, int, Position] | None = None
    for b in _split_blocks(state, node_type):
        free = _usable_chips(state, b).difference(held.get(b, ()))
        for off in offsets:
            if all(c in free for c in _box_cells(off, box)):
                fit = (len(free), b, off)
                if best is None or fit < best:
                    best = fit
                break
    if best is not None:
        return BoxPlacement(best[1], best[2])
    fresh = _fresh_blocks(state, node_type, allow_wired)
    if fresh:
        return BoxPlacement(fresh[0], (0,) * len(box))
    return Unplaceable(
        (),
        note=(
            f"needs a {'x'.join(map(str, box))} box of {node_type} chips: no block given "
            "over to sub-block slices has an aligned place free for it, and no "
            f"{node_type} block is free"
        ),
    )


@dataclass(frozen=True)
class BoxPreemption:
    placement: BoxPlacement
    victims: tuple[VictimAction, ...]


def _shrink_keep(victim: SliceJob, wanted: set[Position]) -> Grid | None:
    """The largest box `victim` accepts to shrink to (kept at its offset) that leaves
    every chip of `wanted`, or None."""
    assert victim.offset is not None
    options = sorted(victim.shrink_to, key=lambda g: (-_chips(g), g))
    for grid in options:
        if not wanted & set(box_chips(victim.offset, grid)):
            return grid
    return None


@cache
def _box_shapes(block_shape: Grid) -> tuple[Grid, ...]:
    """Every box shape inside a block, the most chips first."""
    return tuple(
        sorted(
            {
                tuple(pos[d] + 1 for d in range(len(block_shape)))
                for pos in grid_positions(block_shape)
            },
            key=_chips,
            reverse=True,
        )
    )


def _chips(grid: Grid) -> int:
    n = 1
    for e in grid:
        n *= e
    return n


def choose_box_victims(
    state: PodState, job: SliceJob, *, only: frozenset[str] | None = None
) -> BoxPreemption | None:
    """Lower-priority sub-block slices that make room for the sub-block slice `job` in
    a block given over to them (see the module docstring), or None. The planner then
    tries lower-priority block slices (a whole block). With `only` (the cell reclaiming
    lent quota, issue 35): those slices alone, whatever their priority. A slice that
    reclaimed quota from `job` is never its victim."""
    box = job.demand.box
    assert box is not None
    node_type = job.demand.node_types[0]
    held = state.chips_held()
    best: tuple[tuple, BoxPreemption] | None = None
    for b in _split_blocks(state, node_type):
        usable = _usable_chips(state, b)
        owners = held.get(b, {})
        for off in _aligned_offsets(tuple(state.fabric.block_shape), tuple(box)):
            wanted = set(_box_cells(off, box))
            if not wanted <= usable:
                continue
            victims: dict[str, VictimAction] = {}
            ok = True
            for chip in sorted(wanted):
                holder = owners.get(chip)
                if holder is None or holder in victims:
                    continue
                v = state.jobs.get(holder)
                if v is None or v.state != RUNNING or not _may_take(v, job, only):
                    ok = False
                    break
                victims[holder] = _box_victim(v, wanted)
            if not ok:
                continue
            chosen = [state.jobs[j] for j in victims]
            cost = (
                max((v.priority for v in chosen), default=0),
                len(chosen),
                sum(DISRUPTION[victims[v.job_id].action] for v in chosen),
                b,
                off,
            )
            if best is None or cost < best[0]:
                best = (cost, BoxPreemption(BoxPlacement(b, off), tuple(victims.values())))
    return best[1] if best is not None else None


def _may_take(victim: SliceJob, job: SliceJob, only: frozenset[str] | None) -> bool:
    """Lower priority, or named by the cell; never a slice that reclaimed from `job`."""
    if shields(victim.reclaimed_from, job.job_id):
        return False
    return victim.priority < job.priority if only is None else victim.job_id in only


def _box_victim(victim: SliceJob, wanted: set[Position]) -> VictimAction:
    assert victim.placement is not None and victim.offset is not None
    assert victim.demand.box is not None
    block = victim.placement[0]
    mine = chip_keys(block, victim.offset, victim.demand.box)
    if victim.preemption == SHRINK:
        keep = _shrink_keep(victim, wanted)
        if keep is not None:
            kept = set(chip_keys(block, victim.offset, keep))
            return VictimAction(
                victim.job_id,
                SHRINK,
                tuple(k for k in mine if k not in kept),  # type: ignore[misc]
                keep,
                (block,),
            )
        # Shrinking would not clear the place: the slice is delayed instead.
        return VictimAction(victim.job_id, "DELAY", tuple(mine))  # type: ignore[arg-type]
    return VictimAction(victim.job_id, victim.preemption, tuple(mine))  # type: ignore[arg-type]


def largest_free_box(state: PodState, node_type: str) -> int:
    """The chip count of the largest box a sub-block slice of `node_type` could get now
    without preempting (a whole free block's chips when one is free): the cell compares
    a sub-block demand with it (NodeTypeCapacity.largest_free_box)."""
    fabric = state.fabric
    if _fresh_blocks(state, node_type):
        return fabric.chips_per_block
    held = state.chips_held()
    best = 0
    shapes = _box_shapes(tuple(fabric.block_shape))
    for b in _split_blocks(state, node_type):
        free = _usable_chips(state, b).difference(held.get(b, ()))
        if len(free) <= best:
            continue
        for shape in shapes:
            n = _chips(shape)
            if n <= best or n > len(free):
                continue
            if any(
                all(c in free for c in _box_cells(off, shape))
                for off in _aligned_offsets(tuple(fabric.block_shape), shape)
            ):
                best = n
                break
    return best
