"""What the ring planner says when it cannot route (SW-4) and how a failed group is
replaced (SW-5), pinned on exact answers: found untested by bench/mutation.py
(issue 17). Pure."""

from __future__ import annotations

import pytest

from lightpath.domain.switched import SwitchedFabricConfig, build_fabric
from lightpath.domain.switched_rings import (
    Degrees,
    Tile,
    job_tile_in,
    plan_rings,
    replacement_order,
    reserve,
    swap_first,
)
from lightpath.errors import FailedPrecondition, ResourceExhausted
from tests.switched.fabrics import FIG11, FIG15, fabric

G33 = build_fabric(
    SwitchedFabricConfig.parse("group=3x3 cluster=3x4 planes=9 ports=48/16 tier1=2x64")
)


def test_replacement_order_same_row_then_same_column_then_nearest():
    # failed g1.1 (row 1, column 1): its row by distance, its column, then the rest
    assert replacement_order(G33, 5, range(12)) == [4, 6, 7, 1, 9, 0, 2, 8, 10, 3, 11]
    assert replacement_order(G33, 0, [11, 1, 4, 8, 2, 0]) == [1, 2, 4, 8, 11]
    # 1-D groups have no column switches: the row, then the nearest
    assert replacement_order(fabric(FIG15), 3, [0, 30, 25, 47, 24, 5]) == [5, 0, 25, 24, 30, 47]


def failure(f, used, degrees, tiles) -> ResourceExhausted:
    with pytest.raises(ResourceExhausted) as e:
        plan_rings(f, used, "j", degrees, tiles)
    return e.value


def tier0(f):
    return [s for s in f.switches() if f.tier(s) == 0]


def test_no_uplinks_left_names_the_switch_and_the_need():
    f = fabric(FIG15)
    used = bytearray(f.channel_count)
    for c in f.up_channels(tier0(f)[0]):
        used[c] = 1
    e = failure(f, used, Degrees(8, 1, 1), [Tile.whole(f, 0), Tile.whole(f, 30)])
    assert e.reason == "UPLINKS_EXHAUSTED"
    assert e.message == (
        "tier-0 switch r0/p0 has 0 free uplinks, ring data(p=0,l=0) needs 1 "
        "(no free path g0.0/pr4 -> g1.6/pr1)"
    )
    assert e.metadata["free_uplinks"] == "0" and e.metadata["needed"] == "1"


def test_no_downlinks_left_names_the_far_switch():
    f = fabric(FIG15)
    used = bytearray(f.channel_count)
    for s in tier0(f)[:2]:
        for c in f.up_channels(s):
            used[c ^ 1] = 1
    e = failure(f, used, Degrees(8, 1, 1), [Tile.whole(f, 0), Tile.whole(f, 30)])
    assert e.reason == "UPLINKS_EXHAUSTED"
    assert e.message.startswith("tier-0 switch r1/p0 has 0 free downlinks from tier 1")
    assert e.metadata["free_downlinks"] == "0" and e.metadata["switch"] == "r1/p0"


def test_no_links_left_in_the_groups():
    f = fabric(FIG11)
    full = bytearray(b"\x01" * f.channel_count)
    e = failure(f, full, Degrees(2, 1, 1), [Tile(0, 0, 0, 1, 2)])
    assert e.reason == "RING_LINKS_EXHAUSTED"
    assert e.message.endswith("of g0.0 are all reserved")
    e = failure(f, full, Degrees(2, 1, 1), [Tile(0, 0, 0, 1, 1), Tile(1, 0, 0, 1, 1)])
    assert e.message == (
        "ring data(p=0,l=0) has no free path g0.0/pr11 -> g0.1/pr11: the processor links "
        "and tier-0 ports of g0.0 and g0.1 are all reserved"
    )
    assert e.metadata == {"ring": "data(p=0,l=0)", "from": "g0.0/pr11", "to": "g0.1/pr11"}


def a_plan():
    f = fabric(FIG11)
    used = bytearray(f.channel_count)
    plan = plan_rings(f, used, "j", Degrees(2, 3, 3), [Tile.whole(f, 0), Tile.whole(f, 1)])
    reserve(used, plan.channels())
    return f, used, plan


def test_the_jobs_tile_in_a_group():
    f, _, plan = a_plan()
    assert job_tile_in(f, plan, 1) == Tile(1, 0, 0, 3, 3)
    with pytest.raises(FailedPrecondition) as e:
        job_tile_in(f, plan, 3)
    assert e.value.reason == "GROUP_NOT_IN_JOB"


def test_swap_takes_the_first_candidate_that_routes():
    f, used, plan = a_plan()
    r = swap_first(f, used, plan, Tile.whole(f, 1), [Tile.whole(f, 2), Tile.whole(f, 3)])
    assert (r.old_tile.group, r.new_tile.group) == (1, 2) and r.plan.groups == (0, 2)
    with pytest.raises(ResourceExhausted) as e:
        swap_first(f, used, plan, Tile.whole(f, 1), [])
    assert e.value.reason == "NO_FREE_GROUP"


def test_swap_failing_everywhere_says_how_many_were_tried():
    f, _, plan = a_plan()
    full = bytearray(b"\x01" * f.channel_count)
    with pytest.raises(ResourceExhausted) as e:
        swap_first(f, full, plan, Tile.whole(f, 1), [Tile.whole(f, 2), Tile.whole(f, 3)])
    assert e.value.message.startswith("none of 2 free groups can take the place of g0.1: ring ")
    with pytest.raises(ResourceExhausted) as e:
        swap_first(f, full, plan, Tile.whole(f, 1), [Tile.whole(f, 2)])
    assert e.value.message.startswith("ring ")  # one candidate: its own reason
