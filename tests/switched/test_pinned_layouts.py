"""How the ring planner lays a job's logical indices onto a tile (SW-4, seed 002
Fig. 10-11) and orders a large job's groups (SW-3), pinned on exact outputs: the
validity checks elsewhere accept any valid layout, so without these a change of
preference went unnoticed (bench/mutation.py, issue 17). Pure."""

from __future__ import annotations

import pytest

from lightpath.domain.switched import SwitchedFabricConfig, build_fabric
from lightpath.domain.switched_rings import (
    Degrees,
    Tile,
    _divisors,
    _inner_order,
    _layouts,
    _score,
    layouts,
    order_tiles,
)

G33 = build_fabric(
    SwitchedFabricConfig.parse("group=3x3 cluster=3x4 planes=9 ports=48/16 tier1=2x64")
)


def test_divisors_largest_first():
    assert [_divisors(n) for n in (1, 6, 12)] == [[1], [6, 3, 2, 1], [12, 6, 4, 3, 2, 1]]


def test_inner_orders_of_a_block():
    assert _inner_order(2, 3, "col") == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert _inner_order(2, 3, "row") == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert _inner_order(3, 2, "snake") == [(0, 0), (0, 1), (1, 1), (1, 0), (2, 0), (2, 1)]
    # a Hamiltonian cycle along neighbours: only with an even count and both sides >= 2
    assert _inner_order(2, 3, "cycle") == [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0)]
    assert _inner_order(3, 2, "cycle") == [(0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (0, 1)]
    assert _inner_order(4, 4, "cycle") == [
        (0, 0),
        (0, 1),
        (0, 2),
        (0, 3),
        (1, 3),
        (1, 2),
        (1, 1),
        (2, 1),
        (2, 2),
        (2, 3),
        (3, 3),
        (3, 2),
        (3, 1),
        (3, 0),
        (2, 0),
        (1, 0),
    ]
    assert _inner_order(2, 2, "cycle") == [(0, 0), (0, 1), (1, 1), (1, 0)]
    assert _inner_order(3, 3, "cycle") is None
    assert _inner_order(1, 4, "cycle") is None
    assert _inner_order(4, 1, "cycle") is None


def test_score_counts_neighbour_hops():
    square = ((0, 0), (0, 1), (1, 1), (1, 0))
    assert _score(square, 4, (4, 1, 1), 4) == 12  # a 4-ring of neighbours: 4 × 3
    assert _score(((0, 0), (1, 1), (0, 1), (1, 0)), 4, (4, 1, 1), 4) == 6
    assert _score(square, 4, (1, 2, 2), 4) == 12
    # two tiles of two: hops between tiles score 1 when at the same place in each
    assert _score(((0, 0), (0, 1)), 2, (4, 1, 1), 4) == 6


@pytest.mark.parametrize(
    "h, w, degrees, tiles, names, first",
    [
        (2, 2, (2, 2, 1), 1, ["col2x2", "row2x2", "cycle2x2"], ((0, 0), (1, 0), (0, 1), (1, 1))),
        (
            3,
            3,
            (9, 1, 1),
            1,
            ["snake3x3", "col3x3", "row3x3"],
            ((0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0), (2, 0), (2, 1), (2, 2)),
        ),
        (
            2,
            3,
            (1, 2, 3),
            1,
            ["row2x3", "cycle2x3", "col2x3"],
            ((0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)),
        ),
        (1, 4, (4, 1, 1), 1, ["col1x4"], ((0, 0), (0, 1), (0, 2), (0, 3))),
        (
            3,
            3,
            (3, 3, 1),
            2,
            ["col3x3", "row3x3", "snake3x3"],
            ((0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (0, 2), (1, 2), (2, 2)),
        ),
    ],
)
def test_layouts_best_first(h, w, degrees, tiles, names, first):
    got = _layouts(h, w, degrees, tiles)
    assert [n for n, _ in got] == names
    assert got[0][1] == first


@pytest.mark.parametrize(
    "degrees, tiles, names",
    [
        ((2, 2, 4), 1, ["col4x4", "row4x4", "snake4x2", "cycle2x2", "snake4x4", "row4x2"]),
        ((4, 2, 2), 1, ["col2x2", "row2x2", "col4x4", "row4x4", "row4x2", "col2x4"]),
        ((2, 4, 4), 2, ["col4x4", "row4x4", "cycle2x2", "snake4x2", "cycle4x4", "snake4x4"]),
        ((1, 1, 16), 1, ["cycle4x4", "snake4x4", "cycle4x2", "snake4x2", "cycle2x2", "col4x4"]),
    ],
)
def test_layouts_of_a_4x4_tile(degrees, tiles, names):
    assert [n for n, _ in _layouts(4, 4, degrees, tiles)][:6] == names


def test_blocks_of_a_tile_are_visited_in_a_snake():
    (_, pos) = _layouts(4, 4, (4, 2, 2), 1)[0]  # col2x2: 2x2 blocks, snake over blocks
    assert pos == (
        (0, 0),
        (1, 0),
        (0, 1),
        (1, 1),
        (0, 2),
        (1, 2),
        (0, 3),
        (1, 3),
        (2, 2),
        (3, 2),
        (2, 3),
        (3, 3),
        (2, 0),
        (3, 0),
        (2, 1),
        (3, 1),
    )


def test_layouts_map_positions_to_processors_tile_after_tile():
    assert layouts(G33, Degrees(2, 3, 1), [Tile(0, 0, 0, 2, 3)], 2) == [
        ("row2x3", [0, 1, 2, 3, 4, 5]),
        ("cycle2x3", [0, 1, 2, 5, 4, 3]),
    ]
    assert layouts(G33, Degrees(2, 3, 3), [Tile.whole(G33, 0), Tile.whole(G33, 1)], 1) == [
        ("col3x3", [0, 3, 6, 1, 4, 7, 2, 5, 8, 9, 12, 15, 10, 13, 16, 11, 14, 17])
    ]
    # tiles of different shapes: their processors in order
    assert layouts(G33, Degrees(3, 1, 1), [Tile(0, 0, 0, 1, 2), Tile(1, 0, 0, 2, 1)]) == [
        ("row-mixed", [0, 1, 9])
    ]


@pytest.mark.parametrize(
    "groups, order",
    [
        ((0, 1, 2, 3), [0, 1, 2, 3]),
        ((0, 1, 4, 5), [0, 1, 5, 4]),  # leave row 0 in the column row 1 is entered
        ((0, 5, 10), [0, 5, 10]),
        ((1, 2, 4, 7, 8, 11), [1, 2, 7, 4, 8, 11]),
        ((3, 0, 8, 9), [0, 3, 9, 8]),
        ((0, 4, 8), [0, 4, 8]),
    ],
)
def test_groups_of_a_large_job_in_a_cycle_under_shared_switches(groups, order):
    tiles = [Tile.whole(G33, g) for g in groups]
    assert [t.group for t in order_tiles(G33, tiles)] == order


def test_1d_groups_rows_in_turn():
    f = build_fabric(SwitchedFabricConfig.parse("group=4 cluster=2x3 planes=1 ports=6/2 tier1=1x8"))
    tiles = [Tile.whole(f, g) for g in (5, 0, 4, 1)]
    assert [t.group for t in order_tiles(f, tiles)] == [0, 1, 4, 5]
    assert order_tiles(f, tiles[:1]) == tiles[:1]
