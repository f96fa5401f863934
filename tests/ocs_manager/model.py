"""Test helpers: the committed state a set of wired slices implies (pure, no Redis)."""

from __future__ import annotations

from lightpath.domain.torus import Fabric
from lightpath_services.ocs_manager.invariants import FabricState, StoredSlice
from lightpath_services.ocs_manager.wiring import (
    SlicePlacement,
    cross_connects,
    links,
    one_to_many_settings,
    validate_placement,
)


def placement(fabric: Fabric, job: str, grid, blocks_in_order, wrap=()) -> SlicePlacement:
    """A placement from blocks listed in row-major position order (x fastest)."""
    probe = SlicePlacement(job, tuple(grid), (), ())
    return validate_placement(
        fabric,
        job,
        list(grid),
        [(probe.position(i), b) for i, b in enumerate(blocks_in_order)],
        list(wrap),
    )


def state_of(fabric: Fabric, *slices: SlicePlacement) -> FabricState:
    """What the store holds once `slices` are wired (OCS-2 applied by hand)."""
    state = FabricState()
    for p in slices:
        wiring = links(p)
        for xc in cross_connects(fabric, wiring):
            table = state.tables.setdefault(xc.ocs, {})
            table[xc.port_a] = xc.port_b
            table[xc.port_b] = xc.port_a
        for g in one_to_many_settings(fabric, wiring):
            assert g.after is not None
            for a in range(fabric.axes[g.dim]):
                state.one_to_many[fabric.one_to_many_index(g.block, g.dim, a)] = g.after
        for b in p.blocks:
            state.owners[b] = p.job_id
        state.slices[p.job_id] = StoredSlice(p, wired=True)
    return state


def xc_set(fabric: Fabric, p: SlicePlacement) -> set[tuple[str, int, int]]:
    return {(fabric.ocs_ids[x.ocs], x.port_a, x.port_b) for x in cross_connects(fabric, links(p))}
