"""Pinned (issue 17): a ring's path never enters another job's processor, even
when the shortest path would (SW-2, SW-4: small jobs share a group)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lightpath.domain.switched import SwitchedFabricConfig, build_fabric
from lightpath.domain.switched_rings import Degrees, Tile, plan_rings
from lightpath.errors import ResourceExhausted
from tests.switched.ringcheck import assert_valid

# One 1-D group of four processors pr1-pr2-pr3-pr4; the chain ends hang off one switch.
CHAIN4 = SwitchedFabricConfig(
    group_shape=(4,), cluster_rows=1, cluster_cols=1, planes=1, tier0_down_ports=2, tier0_up_ports=0
)


def path_names(f, plan):
    return [[f.node_name(n) for n in hop.nodes] for ring in plan.rings for hop in ring.hops]


def test_the_ring_goes_around_a_neighbour_jobs_processor():
    """Job on pr1 and pr3, another job on pr2: pr1->pr2->pr3 is shortest, but
    the ring must go pr1 -> switch -> pr4 -> pr3 and back the same way."""
    f = build_fabric(CHAIN4)
    tiles = [Tile(0, 0, 0, 1, 1), Tile(0, 0, 2, 1, 1)]
    plan = plan_rings(f, bytearray(f.channel_count), "j", Degrees(2, 1, 1), tiles, forbidden={1})
    assert_valid(f, plan, {1})
    assert path_names(f, plan) == [
        ["g0.0/pr1", "r0/p0", "g0.0/pr4", "g0.0/pr3"],
        ["g0.0/pr3", "g0.0/pr4", "r0/p0", "g0.0/pr1"],
    ]


def test_without_a_way_around_the_ring_is_refused_not_routed_through_the_neighbour():
    f = build_fabric(CHAIN4)
    tiles = [Tile(0, 0, 0, 1, 1), Tile(0, 0, 2, 1, 1)]
    # pr4 belongs to a third job too: the only paths left cross other jobs
    try:
        plan = plan_rings(
            f, bytearray(f.channel_count), "j", Degrees(2, 1, 1), tiles, forbidden={1, 3}
        )
    except ResourceExhausted:
        return
    raise AssertionError(f"routed through another job: {path_names(f, plan)}")


# 2-D groups: a 3x3 group, small jobs on single-processor tiles, the rest of the group
# taken by neighbours; paths must keep to the job's own processors and the switches.
GRID = SwitchedFabricConfig(
    group_shape=(3, 3),
    cluster_rows=1,
    cluster_cols=1,
    planes=3,
    tier0_down_ports=2,
    tier0_up_ports=0,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 8), min_size=2, max_size=4, unique=True), st.data())
def test_rings_of_small_jobs_never_cross_a_neighbours_processor(cells, data):
    f = build_fabric(GRID)
    tiles = [Tile(0, c // 3, c % 3, 1, 1) for c in cells]
    own = {t.processor(f, 0, 0) for t in tiles}
    others = [p for p in range(f.group_size) if p not in own]
    forbidden = set(data.draw(st.lists(st.sampled_from(others), unique=True))) if others else set()
    try:
        plan = plan_rings(
            f,
            bytearray(f.channel_count),
            "j",
            Degrees(len(tiles), 1, 1),
            tiles,
            forbidden=forbidden,
        )
    except ResourceExhausted:
        return
    assert_valid(f, plan, forbidden)
    crossed = {n for ring in plan.rings for hop in ring.hops for n in hop.nodes}
    assert not crossed & forbidden
