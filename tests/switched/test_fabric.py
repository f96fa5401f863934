"""SW-1: the fabric graph built from configuration, and its validation."""

from __future__ import annotations

import pytest

from lightpath.domain.switched import (
    DOWN,
    PROCESSOR,
    UP,
    SwitchedFabric,
    SwitchedFabricConfig,
)
from lightpath.errors import InvalidArgument
from tests.switched.fabrics import FIG6, FIG7, FIG11, FIG18, fabric


def test_fig18_counts_match_the_seed():
    """¶52: 24x24 groups (9,216 processors), 288 row and 288 column tier-0
    switches, 2 x 12 planes x 8 tier-1 switches = 192, each tier-1 using 48 of 64 ports."""
    f = fabric(FIG18)
    assert f.processor_count == 9216
    names = f.switch_names
    assert sum(1 for n in names if n.startswith("r")) == 288
    assert sum(1 for n in names if n.startswith("c")) == 288
    assert sum(1 for n in names if n.startswith("t1")) == 192
    g = f.graph
    for name in ("r3/p7", "c23/p11"):
        s = f.switch_id(name)
        kinds = [g.edges[s, v]["kind"] for v in g[s]]
        down = sum(g.edges[s, v]["capacity"] for v in g[s] if g.edges[s, v]["kind"] == "down")
        up = sum(g.edges[s, v]["capacity"] for v in g[s] if g.edges[s, v]["kind"] == "up")
        assert (down, up) == (48, 16), kinds
    t1 = f.switch_id("t1r/p7/3")
    assert sum(g.edges[t1, v]["capacity"] for v in g[t1]) == 48
    assert g.nodes[t1]["ports"] == 64


def test_ports_follow_rows_and_columns():
    """¶41-42, ¶46: row i's end processors of every group in a cluster row go to
    that row's switches (one per lane); column ports likewise."""
    f = fabric(FIG11)
    g = f.graph
    lanes = f.lanes
    assert lanes == 3
    for grp in range(f.group_count):
        cr, cc = f.group_position(grp)
        for i in range(3):
            west, east = f.processor(grp, i, 0), f.processor(grp, i, 2)
            for lane in range(lanes):
                s = f.switch_id(f"r{cr}/p{i * lanes + lane}")
                assert g.has_edge(west, s) and g.has_edge(east, s)
        for j in range(3):
            north, south = f.processor(grp, 0, j), f.processor(grp, 2, j)
            s = f.switch_id(f"c{cc}/p{j * lanes}")
            assert g.has_edge(north, s) and g.has_edge(south, s)
    center = f.processor(0, 1, 1)
    assert all(g.nodes[v]["kind"] == "processor" for v in g[center])
    assert all(g.edges[center, v]["capacity"] == lanes for v in g[center])


def test_one_d_chains_have_two_ends_on_the_row_switch():
    f = fabric(FIG6)
    g = f.graph
    s = f.switch_id("r0/p0")
    assert sorted(g[s]) == sorted(
        p for grp in range(4) for p in (f.processor(grp, 0, 0), f.processor(grp, 0, 3))
    )
    assert g.degree(f.processor(0, 0, 1)) == 2  # inner processors: neighbours only


def test_fig7_switches_are_coupled_directly():
    f = fabric(FIG7)
    a, b = f.switch_id("r0/p0"), f.switch_id("r1/p0")
    assert f.graph.edges[a, b]["kind"] == "mesh"
    assert len(f.uplinks(a)) == 3


def test_every_bundle_lists_its_links_and_channels_run_both_ways():
    f = fabric(FIG11)
    for u, v, data in f.graph.edges(data=True):
        assert data["capacity"] == len(data["links"]) >= 1
        for link in data["links"]:
            assert {f.link_a[link], f.link_b[link]} == {u, v}
            assert f.channel_ends(2 * link) == (f.link_a[link], f.link_b[link])
            assert f.channel_ends(2 * link + 1) == (f.link_b[link], f.link_a[link])
    kinds = {f.link_kind[lid] for lid in range(f.link_count)}
    assert kinds == {PROCESSOR, DOWN, UP}


def test_names_round_trip():
    f = fabric(FIG18)
    assert f.group_id(f.group_name(77)) == 77
    assert f.node_name(f.processor(5, 3, 2)) == "g0.5/pr43"
    assert f.tier0_switch("r", 3, 7) == f.switch_id("r3/p7")
    assert f.tier0_switch("c", 23, 11) == f.switch_id("c23/p11")
    with pytest.raises(KeyError):
        f.group_id("g24.0")


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"cluster_cols": 25}, "tier0_down_ports", "needs 50 down ports for the 25 groups"),
        ({"cluster_rows": 25}, "tier0_down_ports", "c0/p0 needs 50 down ports"),
        ({"planes": 10}, "planes", "multiple of the group's 4 processor rows"),
        ({"tier1_ports": 40}, "tier1_ports", "needs 48 ports"),
        ({"tier1_switches": 17}, "tier1_switches", "fewer than the 17 tier-1 switches"),
        ({"group_shape": (4, 4, 4)}, "group_shape", "(p,) or (r, c)"),
        ({"cluster_rows": 0}, "cluster_rows", "at least 1"),
        ({"tier0_mesh_links": 1}, "tier0_mesh_links", "needs 23 up ports"),
    ],
)
def test_bad_configuration_names_the_field_and_the_rule(change, field, words):
    cfg = SwitchedFabricConfig(**{**FIG18.to_dict(), "group_shape": (4, 4), **change})
    with pytest.raises(InvalidArgument) as e:
        SwitchedFabric(cfg)
    assert any(v.field == field and words in v.rule for v in e.value.violations), e.value.message


def test_config_round_trips_through_a_dict_and_rejects_unknown_keys():
    assert SwitchedFabricConfig.from_dict(FIG18.to_dict()) == FIG18
    with pytest.raises(InvalidArgument, match="colour"):
        SwitchedFabricConfig.from_dict({"colour": 3})


def test_the_one_line_spec_round_trips_and_names_bad_keys():
    assert SwitchedFabricConfig.parse(FIG18.spec()) == FIG18
    assert SwitchedFabricConfig.parse(FIG7.spec()) == FIG7
    cfg = SwitchedFabricConfig.parse("group=5, cluster=4x3, planes=1, ports=6/3, mesh=1")
    assert cfg == FIG7
    with pytest.raises(InvalidArgument) as e:
        SwitchedFabricConfig.parse("group=4x4 colour=blue")
    assert e.value.violations[0].field == "colour"
    with pytest.raises(InvalidArgument) as e:
        SwitchedFabricConfig.parse("ports=48")
    assert e.value.violations[0].field == "ports"
