"""Which links the ring router takes (SW-4), pinned on whole plans: the layout
chosen, how many channels of each kind, and a checksum of the channels. Validity
is checked elsewhere; these notice a change of route preference (a neighbour link
first, then one shared switch, then a search without uplinks, then with them,
then through the job's own corner group), which bench/mutation.py found nothing
noticing (issue 17). Pure."""

from __future__ import annotations

from lightpath.domain.switched_rings import Degrees, Tile, channel_kinds, plan_rings, reserve
from tests.switched.fabrics import FIG6, FIG7, FIG11, FIG15, SMALL, fabric
from tests.switched.ringcheck import assert_valid


def digest(f, plan):
    assert_valid(f, plan)
    ch = plan.channels()
    kinds = {k: n for k, n in channel_kinds(f, ch).items() if n}
    return plan.layout, len(ch), sum(ch), kinds


def free(f):
    return bytearray(f.channel_count)


def test_fig11_four_groups_inside_a_cluster():
    f = fabric(FIG11)
    plan = plan_rings(f, free(f), "a", Degrees(4, 3, 3), [Tile.whole(f, g) for g in range(4)])
    assert digest(f, plan) == ("col3x3", 192, 56484, {"processor": 72, "down": 120})


def test_a_small_tile_stays_on_processor_links():
    f = fabric(FIG11)
    plan = plan_rings(f, free(f), "b", Degrees(2, 2, 1), [Tile(0, 0, 0, 2, 2)])
    assert digest(f, plan) == ("col2x2", 8, 112, {"processor": 8})


def test_without_uplinks_through_the_corner_group():
    f = fabric(FIG11)
    used = free(f)
    for s in f.switches():
        if f.tier(s) == 0:
            for c in f.up_channels(s):
                used[c] = used[c ^ 1] = 1
    tiles = [Tile.whole(f, g) for g in (0, 1, 3)]
    plan = plan_rings(f, used, "corner", Degrees(3, 3, 3), tiles)
    assert digest(f, plan) == ("col3x3", 168, 45144, {"processor": 60, "down": 108})


def test_fig6_chain_closes_through_its_switch():
    f = fabric(FIG6)
    plan = plan_rings(f, free(f), "fig6", Degrees(16, 1, 1), [Tile.whole(f, g) for g in range(4)])
    assert digest(f, plan) == ("col1x4", 20, 384, {"processor": 12, "down": 8})


def test_fig7_between_switches_over_the_mesh():
    f = fabric(FIG7)
    plan = plan_rings(f, free(f), "fig7", Degrees(10, 1, 1), [Tile.whole(f, g) for g in (0, 5)])
    assert digest(f, plan) == ("col1x5", 14, 711, {"processor": 8, "down": 4, "mesh": 2})


def test_fig15_between_tier0_switches_over_tier1():
    f = fabric(FIG15)
    plan = plan_rings(f, free(f), "fig15", Degrees(8, 1, 1), [Tile.whole(f, g) for g in (0, 30)])
    assert digest(f, plan) == ("col1x4", 14, 3528, {"processor": 6, "down": 4, "up": 4})


def test_a_second_job_beside_the_first_takes_other_channels():
    f = fabric(SMALL)
    used = free(f)
    first = plan_rings(f, used, "x", Degrees(2, 2, 1), [Tile.whole(f, 0)])
    reserve(used, first.channels())
    second = plan_rings(f, used, "y", Degrees(2, 2, 2), [Tile.whole(f, 1), Tile.whole(f, 2)])
    assert digest(f, first) == ("col2x2", 8, 52, {"processor": 8})
    assert digest(f, second) == ("col2x2", 32, 2752, {"processor": 16, "down": 16})
    assert not set(first.channels()) & set(second.channels())
