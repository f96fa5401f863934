"""SW-4: Hamiltonian rings with reserved channels, on the seed's examples."""

from __future__ import annotations

import re

import pytest

from lightpath.domain.switched import SwitchedFabricConfig
from lightpath.domain.switched_rings import (
    Degrees,
    RingPlan,
    Tile,
    channel_kinds,
    plan_rings,
    release,
    reserve,
)
from lightpath.errors import InvalidArgument, ResourceExhausted
from lightpath_services.workload_scheduler.switched_placement import SwitchedPodState, place
from tests.switched.fabrics import FIG6, FIG7, FIG11, FIG15, FIG18, fabric
from tests.switched.ringcheck import assert_disjoint, assert_valid


def names(f, nodes):
    return [f.node_name(n) for n in nodes]


def free_state(f):
    return bytearray(f.channel_count)


def test_fig6_four_groups_of_four_on_one_switch_form_a_16_processor_ring():
    """¶34: group 620's last processor reaches group 630's first through the
    switch, and so on: up to 16 processors in sequence, closed into a loop."""
    f = fabric(FIG6)
    plan = plan_rings(
        f, free_state(f), "fig6", Degrees(16, 1, 1), [Tile.whole(f, g) for g in range(4)]
    )
    assert_valid(f, plan)
    (ring,) = plan.rings
    assert len(ring.processors) == 16
    through_switch = [names(f, h.nodes) for h in ring.hops if len(h.nodes) > 2]
    assert through_switch == [
        ["g0.0/pr4", "r0/p0", "g0.1/pr1"],
        ["g0.1/pr4", "r0/p0", "g0.2/pr1"],
        ["g0.2/pr4", "r0/p0", "g0.3/pr1"],
        ["g0.3/pr4", "r0/p0", "g0.0/pr1"],
    ]
    assert sum(len(h.nodes) == 2 for h in ring.hops) == 12  # the rest are neighbours


def test_fig7_groups_of_five_on_two_coupled_switches_form_a_20_processor_ring():
    """¶35: groups 711-713 on switch 701 and 721 on switch 702 form a sequence
    of twenty, closed back to 701 through the directly coupled switches."""
    f = fabric(FIG7)
    state = SwitchedPodState()
    placement = place(f, state, "fig7", Degrees(20, 1, 1))
    assert [f.group_name(g) for g in placement.groups] == ["g0.0", "g0.1", "g0.2", "g1.0"]
    plan = plan_rings(f, free_state(f), "fig7", Degrees(20, 1, 1), placement.tiles)
    assert_valid(f, plan)
    (ring,) = plan.rings
    assert len(ring.processors) == 20
    crossing = [names(f, h.nodes) for h in ring.hops if any(f.is_switch(n) for n in h.nodes)]
    assert ["g0.2/pr5", "r0/p0", "r1/p0", "g1.0/pr1"] in crossing
    assert ["g1.0/pr5", "r1/p0", "r0/p0", "g0.0/pr1"] in crossing
    assert channel_kinds(f, plan.channels())["mesh"] == 2


def test_fig7_topology_holds_up_to_sixty_processors_in_one_sequence():
    """¶35: "up to sixty (60) processors can be configured in a sequence"."""
    f = fabric(FIG7)
    plan = plan_rings(
        f, free_state(f), "sixty", Degrees(60, 1, 1), [Tile.whole(f, g) for g in range(12)]
    )
    assert_valid(f, plan)
    assert len(plan.rings[0].processors) == 60


def test_para47_150_processors_across_two_tier0_switches_through_tier1():
    """¶47: 150 processors need groups of two tier-0 switches (24 groups × 4 ×
    2 > 150), joined through the tier-1 switch; the last group's two spare
    processors hold no ring position (¶56)."""
    f = fabric(FIG15)
    placement = place(f, SwitchedPodState(), "seq150", Degrees(150, 1, 1))
    assert len(placement.groups) == 38  # ceil(150 / 4): whole groups
    assert placement.locality == "tier1"
    plan = plan_rings(f, free_state(f), "seq150", Degrees(150, 1, 1), placement.tiles)
    assert_valid(f, plan)
    (ring,) = plan.rings
    assert len(ring.processors) == 150
    via_tier1 = [h for h in ring.hops if any(f.is_switch(n) and f.tier(n) == 1 for n in h.nodes)]
    assert len(via_tier1) == 2  # over to the second switch, and back
    kinds = channel_kinds(f, plan.channels())
    assert kinds["up"] == 4  # one up and one down channel at each tier-0 switch
    last = plan.tiles[-1].group
    idle = {f.processor(last, 0, 2), f.processor(last, 0, 3)}
    # the spare processors hold no ring position; they may only forward
    assert not idle & {p for r in plan.rings for p in r.processors}


def test_demo_job_4_3_3_on_3x3_groups_like_fig_9_to_11():
    """¶38-39: layers flow down a column (pr11-pr21-pr31), pipeline stages
    along a row (pr11-pr12-pr13), and four model instances a-d form the data
    rings across four groups."""
    f = fabric(FIG11)
    tiles = [Tile.whole(f, g) for g in range(4)]
    plan = plan_rings(f, free_state(f), "demo", Degrees(4, 3, 3), tiles)
    assert_valid(f, plan)
    by_axis = {a: [r for r in plan.rings if r.axis == a] for a in ("data", "pipeline", "layer")}
    assert {a: len(rs) for a, rs in by_axis.items()} == {"data": 9, "pipeline": 12, "layer": 12}
    first = plan.groups[0]
    layer = plan.ring("layer(d=0,p=0)")
    assert names(f, layer.processors) == [f"{f.group_name(first)}/pr{i}1" for i in (1, 2, 3)]
    pipeline = plan.ring("pipeline(d=0,l=0)")
    assert names(f, pipeline.processors) == [f"{f.group_name(first)}/pr1{j}" for j in (1, 2, 3)]
    data = plan.ring("data(p=1,l=1)")
    assert {n.split("/")[1] for n in names(f, data.processors)} == {"pr22"}
    assert len({p // f.group_size for p in data.processors}) == 4
    # a chain of three closes through its row / column switch (¶34)
    assert f.is_switch(layer.hops[-1].nodes[1]) and f.node_name(layer.hops[-1].nodes[1]).startswith(
        "c"
    )
    assert f.is_switch(pipeline.hops[-1].nodes[1]) and f.node_name(
        pipeline.hops[-1].nodes[1]
    ).startswith("r")
    # the four groups of a 2x2 cluster meet under row and column switches: no uplinks
    assert channel_kinds(f, plan.channels())["up"] == 0


def test_demo_job_needs_more_than_one_port_per_edge():
    """With one port per processor edge (Fig. 11's ports 1101-1106) the data
    rings find no free ports left after the layer and pipeline rings close."""
    f = fabric(SwitchedFabricConfig(**{**FIG11.to_dict(), "group_shape": (3, 3), "planes": 3}))
    with pytest.raises(ResourceExhausted) as e:
        plan_rings(f, free_state(f), "demo", Degrees(4, 3, 3), [Tile.whole(f, g) for g in range(4)])
    assert "no free path" in e.value.message and "ring data(" in e.value.message


def test_a_2d_group_of_even_size_has_a_hamiltonian_cycle_along_neighbours():
    f = fabric(FIG18)
    plan = plan_rings(f, free_state(f), "one", Degrees(1, 1, 16), [Tile.whole(f, 0)])
    assert_valid(f, plan)
    (ring,) = plan.rings
    assert all(len(h.nodes) == 2 for h in ring.hops)
    assert channel_kinds(f, plan.channels())["down"] == 0


def test_an_odd_group_closes_its_ring_through_a_switch():
    f = fabric(FIG11)
    plan = plan_rings(f, free_state(f), "odd", Degrees(9, 1, 1), [Tile.whole(f, 0)])
    assert_valid(f, plan)
    assert channel_kinds(f, plan.channels())["down"] >= 2


def test_bench_shapes_on_the_fig18_fabric_use_no_uplinks_under_one_row():
    f = fabric(FIG18)
    tiles = [Tile.whole(f, g) for g in range(16)]
    plan = plan_rings(f, free_state(f), "j256", Degrees(16, 4, 4), tiles)
    assert_valid(f, plan)
    assert channel_kinds(f, plan.channels())["up"] == 0


def test_a_2048_processor_job_spans_rows_through_column_switches():
    f = fabric(FIG18)
    state = SwitchedPodState()
    placement = place(f, state, "big", Degrees(128, 4, 4))
    plan = plan_rings(f, free_state(f), "big", Degrees(128, 4, 4), placement.tiles)
    assert_valid(f, plan)
    assert len(plan.groups) == 128
    # rows meet under shared column switches: the data rings need no tier-1
    assert channel_kinds(f, plan.channels())["up"] == 0


def two_jobs():
    """Two (2, 3, 3) jobs on the four groups of FIG11, reserved one after the other."""
    f = fabric(FIG11)
    used = free_state(f)
    a = plan_rings(f, used, "a", Degrees(2, 3, 3), [Tile.whole(f, 0), Tile.whole(f, 1)])
    reserve(used, a.channels())
    b = plan_rings(f, used, "b", Degrees(2, 3, 3), [Tile.whole(f, 2), Tile.whole(f, 3)])
    reserve(used, b.channels())
    return f, used, a, b


def test_two_jobs_never_share_a_channel_and_release_frees_exactly_one():
    _, used, a, b = two_jobs()
    assert_disjoint([a, b])
    before = bytes(used)
    release(used, a.channels())
    assert {i for i, x in enumerate(used) if x} == set(b.channels())
    reserve(used, a.channels())
    assert bytes(used) == before


def test_uplinks_running_out_is_resource_exhausted_naming_the_switch():
    """SW-4: "tier-0 switch r3/p7 has 2 free uplinks, ring needs 4"."""
    f = fabric(FIG15)
    used = free_state(f)
    s = f.switch_id("r0/p0")
    for c in f.up_channels(s):
        used[c] = 1
    with pytest.raises(ResourceExhausted) as e:
        plan_rings(
            f,
            used,
            "x",
            Degrees(100, 1, 1),
            [Tile.whole(f, g) for g in range(13)] + [Tile.whole(f, 24 + g) for g in range(12)],
        )
    assert re.search(
        r"tier-0 switch r[01]/p0 has 0 free uplinks, ring data\(p=0,l=0\) needs 1", e.value.message
    ), e.value.message
    assert e.value.metadata["free_uplinks"] == "0"
    assert e.value.reason == "UPLINKS_EXHAUSTED"


def test_a_refused_plan_leaves_the_snapshot_untouched():
    f = fabric(FIG15)
    used = free_state(f)
    for c in f.up_channels(f.switch_id("r1/p0")):
        used[c] = 1
    before = bytes(used)
    with pytest.raises(ResourceExhausted):
        plan_rings(f, used, "x", Degrees(100, 1, 1), [Tile.whole(f, g) for g in range(25)])
    assert bytes(used) == before


@pytest.mark.parametrize(
    ("degrees", "tiles", "field"),
    [
        (Degrees(0, 3, 3), [Tile(0, 0, 0, 3, 3)], "degrees.data"),
        (Degrees(2, 3, 3), [Tile(0, 0, 0, 3, 3)], "degrees"),
        (Degrees(1, 1, 2), [Tile(0, 2, 2, 2, 2)], "tiles[0]"),
        (Degrees(1, 1, 2), [Tile(9, 0, 0, 1, 2)], "tiles[0].group"),
        (Degrees(1, 1, 4), [Tile(0, 0, 0, 1, 2), Tile(0, 0, 1, 1, 2)], "tiles"),
        (Degrees(1, 1, 4), [], "tiles"),
    ],
)
def test_bad_requests_are_invalid_argument(degrees, tiles, field):
    f = fabric(FIG11)
    with pytest.raises(InvalidArgument) as e:
        plan_rings(f, free_state(f), "x", degrees, tiles)
    assert e.value.violations[0].field == field


def test_a_plan_round_trips_through_a_dict():
    f = fabric(FIG11)
    plan = plan_rings(
        f, free_state(f), "demo", Degrees(4, 3, 3), [Tile.whole(f, g) for g in range(4)]
    )
    assert RingPlan.from_dict(plan.to_dict()) == plan


def test_small_jobs_route_around_their_neighbours_processors():
    f = fabric(FIG18)
    used = free_state(f)
    other = Tile(0, 0, 0, 2, 2)
    forbidden = set(other.processors(f))
    a = plan_rings(f, used, "o", Degrees(1, 2, 2), [other])
    reserve(used, a.channels())
    b = plan_rings(f, used, "s", Degrees(2, 2, 1), [Tile(0, 0, 2, 2, 2)], forbidden=forbidden)
    assert_valid(f, b, forbidden)
    assert_disjoint([a, b])


def test_when_uplinks_run_out_the_jobs_own_corner_group_forwards():
    """¶60: processors forward traffic. With every uplink taken, the hop between
    g0.0 and g1.1 (no shared switch) runs through the job's group g0.1."""
    f = fabric(FIG11)
    used = free_state(f)
    for s in f.switches():
        if f.tier(s) == 0:
            for c in f.up_channels(s):
                used[c] = used[c ^ 1] = 1
    tiles = [Tile.whole(f, g) for g in (0, 1, 3)]  # g0.0, g0.1, g1.1
    plan = plan_rings(f, used, "corner", Degrees(3, 3, 3), tiles)
    assert_valid(f, plan)
    assert channel_kinds(f, plan.channels())["up"] == 0
    crossing = [
        h
        for r in plan.rings
        for h in r.hops
        if {h.nodes[0] // f.group_size, h.nodes[-1] // f.group_size} == {0, 3}
    ]
    assert crossing
    assert all(
        any(n < f.processor_count and n // f.group_size == 1 for n in h.nodes) for h in crossing
    )


def test_downlinks_running_out_names_the_receiving_switch():
    f = fabric(FIG15)
    used = free_state(f)
    for c in f.up_channels(f.switch_id("r1/p0")):
        used[c ^ 1] = 1  # every channel from tier 1 down to r1/p0
    with pytest.raises(ResourceExhausted) as e:
        plan_rings(f, used, "x", Degrees(100, 1, 1), [Tile.whole(f, g) for g in range(25)])
    assert "tier-0 switch r1/p0 has 0 free downlinks from tier 1" in e.value.message


def test_the_domain_invariant_check_agrees_and_catches_a_shared_channel():
    from lightpath_services.ocs_manager.switched.invariants import pod_violations, ring_violations

    f, used, a, b = two_jobs()
    procs = bytearray(f.processor_count)
    for p in (*a.assignment, *b.assignment):
        procs[p] = 1
    assert ring_violations(f, a) == []
    assert pod_violations(f, {"a": a, "b": b}, used, procs) == []
    # b claims one of a's channels: caught
    ring = b.rings[0]
    hop = ring.hops[0]
    forged = RingPlan(
        "b",
        b.degrees,
        b.tiles,
        b.assignment,
        (
            type(ring)(
                ring.axis,
                ring.key,
                ring.processors,
                (type(hop)(hop.nodes, (a.channels()[0], *hop.channels[1:])), *ring.hops[1:]),
            ),
            *b.rings[1:],
        ),
        b.layout,
    )
    rules = {v.rule for v in pod_violations(f, {"a": a, "b": forged}, used, procs)}
    assert {"CHANNEL_IN_TWO_JOBS", "HOP_NOT_A_LINK", "BITMAP_DISAGREES"} <= rules
