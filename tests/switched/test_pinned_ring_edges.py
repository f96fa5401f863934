"""The ring planner's small rules (SW-4, SW-5) at their edges: degrees, tiles,
reservations, ring membership. Found untested by bench/mutation.py (issue 17). Pure."""

from __future__ import annotations

import pytest

from lightpath.domain.switched_rings import (
    Degrees,
    Tile,
    is_small,
    release,
    reserve,
    ring_members,
)
from lightpath.errors import Aborted, FailedPrecondition, InvalidArgument
from tests.switched.fabrics import FIG11, fabric


def test_degrees_validate_returns_itself_and_names_the_first_bad_axis():
    d = Degrees(2, 3, 4)
    assert d.validate() is d and d.total == 24 and d.as_tuple() == (2, 3, 4)
    for bad, field in (((0, 1, 1), "x.data"), ((1, 0, 1), "x.pipeline"), ((1, 1, 0), "x.layer")):
        with pytest.raises(InvalidArgument) as e:
            Degrees(*bad).validate("x")
        assert e.value.violations[0].field == field


def test_a_job_of_exactly_one_group_is_small():
    f = fabric(FIG11)  # 3x3 groups
    assert is_small(f, Degrees(3, 3, 1))
    assert not is_small(f, Degrees(2, 5, 1))


@pytest.mark.parametrize(
    "tile, ok",
    [
        (Tile(0, 0, 0, 3, 3), True),
        (Tile(3, 2, 2, 1, 1), True),
        (Tile(-1, 0, 0, 1, 1), False),
        (Tile(4, 0, 0, 1, 1), False),
        (Tile(0, 0, 0, 0, 1), False),
        (Tile(0, 0, 0, 1, 0), False),
        (Tile(0, -1, 0, 1, 1), False),
        (Tile(0, 0, -1, 1, 1), False),
        (Tile(0, 1, 0, 3, 1), False),
        (Tile(0, 0, 1, 1, 3), False),
    ],
)
def test_a_tile_must_lie_inside_a_group_of_the_pod(tile, ok):
    f = fabric(FIG11)  # 4 groups of 3x3
    if ok:
        tile.check(f)
    else:
        with pytest.raises(InvalidArgument):
            tile.check(f)


def test_reserve_is_all_or_nothing_and_release_only_what_is_reserved():
    used = bytearray(6)
    reserve(used, [1, 3])
    assert list(used) == [0, 1, 0, 1, 0, 0]
    with pytest.raises(Aborted):
        reserve(used, [0, 3])
    assert list(used) == [0, 1, 0, 1, 0, 0]  # nothing taken
    with pytest.raises(FailedPrecondition):
        release(used, [1, 2])
    assert list(used) == [0, 1, 0, 1, 0, 0]
    assert release(used, [1, 3]) == 2 and list(used) == [0] * 6


def test_ring_members_follow_the_logical_index():
    """n = (d·P + p)·L + l; axes of degree 1 have no ring."""
    a = list(range(100, 112))  # D=2, P=3, L=2
    members = ring_members(a, Degrees(2, 3, 2))
    data = [(k, p) for axis, k, p in members if axis == "data"]
    pipe = [(k, p) for axis, k, p in members if axis == "pipeline"]
    layer = [(k, p) for axis, k, p in members if axis == "layer"]
    assert data[:2] == [((0, 0), [100, 106]), ((0, 1), [101, 107])] and len(data) == 6
    assert pipe[0] == ((0, 0), [100, 102, 104]) and pipe[-1] == ((1, 1), [107, 109, 111])
    assert layer[0] == ((0, 0), [100, 101]) and layer[-1] == ((1, 2), [110, 111])
    assert ring_members([5, 6], Degrees(1, 2, 1)) == [("pipeline", (0, 0), [5, 6])]
    assert ring_members([5], Degrees(1, 1, 1)) == []
