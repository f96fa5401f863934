"""Switched placement (SW-2, SW-3) pinned on exact candidates: the tile shapes a
small job may take, the order of candidate groups for large jobs, the reserved
small groups. Found untested by bench/mutation.py (issue 17). Pure."""

from __future__ import annotations

from itertools import islice

import pytest

from lightpath.domain.switched import SwitchedFabricConfig, build_fabric
from lightpath.domain.switched_rings import Degrees, Tile
from lightpath.errors import InvalidArgument, ResourceExhausted
from lightpath_services.workload_scheduler.switched_placement import (
    SwitchedPodState,
    _tile_shapes,
    placements,
    reserved_small_groups,
)

G44 = build_fabric(
    SwitchedFabricConfig.parse("group=4x4 cluster=2x4 planes=16 ports=48/16 tier1=2x64")
)
G33 = build_fabric(
    SwitchedFabricConfig.parse("group=3x3 cluster=3x4 planes=9 ports=48/16 tier1=2x64")
)


@pytest.mark.parametrize(
    "degrees, shapes",
    [
        ((1, 1, 1), [(1, 1)]),
        ((2, 1, 1), [(1, 2), (2, 1)]),
        ((1, 1, 2), [(2, 1), (1, 2)]),  # the layer axis down a column first (Fig. 10-11)
        ((3, 1, 1), [(1, 3), (3, 1), (2, 2)]),
        ((2, 2, 1), [(2, 2), (1, 4), (4, 1)]),
        ((1, 2, 3), [(3, 2), (2, 3)]),
        ((5, 1, 1), [(2, 3), (3, 2)]),
        ((1, 1, 4), [(4, 1), (2, 2), (1, 4)]),
        ((2, 3, 2), [(4, 3), (3, 4)]),
        ((16, 1, 1), [(4, 4)]),
    ],
)
def test_tile_shapes_smallest_first_then_the_layer_down_a_column_then_squarer(degrees, shapes):
    assert _tile_shapes(G44, Degrees(*degrees)) == shapes


def large_state() -> SwitchedPodState:
    # 3x4 groups: 10, 11 reserved for small jobs, 5 failed, 0 and 6 held
    return SwitchedPodState(frozenset({10, 11}), frozenset({5}), {0: "x", 6: "y"}, {})


@pytest.mark.parametrize(
    "degrees, candidates",
    [
        (
            (2, 3, 3),
            [
                ((4, 7), "tier0"),  # best fit: a cluster row with exactly two free
                ((8, 9), "tier0"),
                ((4, 8), "tier0"),  # then cluster columns (2-D groups)
                ((1, 9), "tier0"),
                ((3, 7), "tier0"),
                ((1, 2), "tier0"),  # the row with three free last
            ],
        ),
        ((4, 3, 3), [((1, 2, 3, 7), "tier1"), ((4, 7, 8, 9), "tier1")]),
        ((6, 3, 3), [((1, 2, 3, 4, 7, 8), "tier1")]),
        ((7, 3, 3), [((1, 2, 3, 4, 7, 8, 9), "tier1")]),
    ],
)
def test_large_job_candidates_in_order(degrees, candidates):
    got = islice(placements(G33, large_state(), "j", Degrees(*degrees)), 10)
    assert [(p.groups, p.locality) for p in got] == candidates


def test_a_large_job_larger_than_the_free_groups_is_refused():
    with pytest.raises(ResourceExhausted) as e:
        list(placements(G33, large_state(), "j", Degrees(8, 3, 3)))
    assert "needs 8 whole groups" in e.value.message and "7 are free" in e.value.message


def small_state() -> SwitchedPodState:
    return SwitchedPodState(
        frozenset({10, 11}),
        frozenset(),
        {},
        {"a": Tile(10, 0, 0, 2, 2), "b": Tile(11, 0, 0, 1, 1)},
    )


def test_small_jobs_pack_into_the_fullest_group_with_room():
    got = [p.tiles[0] for p in islice(placements(G33, small_state(), "s", Degrees(1, 1, 1)), 3)]
    assert got == [Tile(10, 0, 2, 1, 1), Tile(10, 1, 2, 1, 1), Tile(10, 2, 0, 1, 1)]
    first = next(placements(G33, small_state(), "s", Degrees(1, 1, 1)))
    assert first.forbidden == frozenset({90, 91, 93, 94})  # a's processors


def test_small_jobs_go_where_their_rectangle_fits():
    got = [p.tiles[0] for p in islice(placements(G33, small_state(), "s", Degrees(2, 2, 1)), 3)]
    assert got == [Tile(11, 0, 1, 2, 2), Tile(11, 1, 0, 2, 2), Tile(11, 1, 1, 2, 2)]
    got = [p.tiles[0] for p in islice(placements(G33, small_state(), "s", Degrees(1, 1, 3)), 2)]
    assert got == [Tile(10, 0, 2, 3, 1), Tile(10, 2, 0, 1, 3)]


def test_reserved_small_groups_are_the_last_ones_and_bounded():
    assert reserved_small_groups(G33, 0) == frozenset()
    assert reserved_small_groups(G33, 2) == frozenset({10, 11})
    assert reserved_small_groups(G33, 12) == frozenset(range(12))
    for bad in (-1, 13):
        with pytest.raises(InvalidArgument):
            reserved_small_groups(G33, bad)


def test_a_small_job_takes_the_last_free_processor_of_a_group():
    taken = {f"t{i}": Tile(10, i // 3, i % 3, 1, 1) for i in range(9) if i != 4}
    state = SwitchedPodState(frozenset({10}), frozenset(), {}, taken)
    (only,) = list(placements(G33, state, "s", Degrees(1, 1, 1)))
    assert only.tiles == (Tile(10, 1, 1, 1, 1),)
    with pytest.raises(ResourceExhausted) as e:
        list(placements(G33, state, "s", Degrees(2, 1, 1)))
    assert e.value.reason == "SMALL_GROUPS_FULL" and "the emptiest has 1 free" in e.value.message


def test_every_small_candidate_can_be_drawn_without_an_error():
    got = list(placements(G33, small_state(), "s", Degrees(2, 2, 1)))
    assert [p.tiles[0] for p in got] == [
        Tile(11, 0, 1, 2, 2),
        Tile(11, 1, 0, 2, 2),
        Tile(11, 1, 1, 2, 2),
    ]


def test_2d_groups_without_tier1_join_rows_through_column_switches():
    f = build_fabric(SwitchedFabricConfig.parse("group=2x2 cluster=2x2 planes=4 ports=4/0"))
    state = SwitchedPodState(frozenset(), frozenset({1}), {}, {})
    got = [(p.groups, p.locality) for p in placements(f, state, "j", Degrees(3, 2, 2))]
    assert got == [((0, 2, 3), "tier0")]
