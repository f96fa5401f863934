"""SW-2, SW-3: small jobs packed into groups reserved for them; large jobs in
whole groups, under one tier-0 switch when they fit, else across rows."""

from __future__ import annotations

import pytest

from lightpath.domain.switched_rings import Degrees, Tile, channel_kinds, plan_rings
from lightpath.errors import InvalidArgument, ResourceExhausted
from lightpath_services.workload_scheduler.switched_placement import (
    SwitchedPodState,
    place,
    placements,
    reserved_small_groups,
)
from tests.switched.fabrics import FIG6, FIG15, FIG18, fabric


def test_small_jobs_go_only_to_small_groups_and_pack():
    f = fabric(FIG18)
    small = reserved_small_groups(f, 2)
    assert small == {574, 575}
    state = SwitchedPodState(small_groups=small)
    a = place(f, state, "a", Degrees(1, 2, 2))
    assert a.kind == "small" and a.tiles[0].group in small and a.tiles[0].size == 4
    state = SwitchedPodState(small_groups=small, small={"a": a.tiles[0]})
    b = place(f, state, "b", Degrees(2, 2, 2))
    # packed into the group that already hosts a small job, beside it
    assert b.tiles[0].group == a.tiles[0].group
    assert set(b.tiles[0].processors(f)).isdisjoint(a.tiles[0].processors(f))
    assert b.forbidden == frozenset(a.tiles[0].processors(f))


def test_a_small_tile_holds_layers_down_a_column():
    f = fabric(FIG18)
    state = SwitchedPodState(small_groups=frozenset({0}))
    t = place(f, state, "a", Degrees(2, 2, 3)).tiles[0]
    assert (t.height, t.width) == (3, 4)


def test_small_jobs_never_take_free_large_groups():
    f = fabric(FIG18)
    full = {f"s{k}": Tile(575, 0, 0, 4, 4) for k in range(1)}
    state = SwitchedPodState(small_groups=frozenset({575}), small=full)
    with pytest.raises(ResourceExhausted) as e:
        place(f, state, "x", Degrees(1, 1, 2))
    assert e.value.reason == "SMALL_GROUPS_FULL"
    with pytest.raises(ResourceExhausted, match="reserves none"):
        place(f, SwitchedPodState(), "x", Degrees(1, 1, 2))


def test_large_jobs_take_whole_groups_never_small_ones():
    f = fabric(FIG18)
    small = reserved_small_groups(f, 24)
    state = SwitchedPodState(small_groups=small)
    p = place(f, state, "x", Degrees(17, 1, 1))  # 17 processors: two whole groups
    assert p.kind == "large"
    assert len(p.tiles) == 2 and all(t.size == 16 for t in p.tiles)
    assert not set(p.groups) & small


def test_locality_prefers_one_tier0_switch_best_fit():
    """SW-3: a row with just enough free groups beats an emptier one."""
    f = fabric(FIG18)
    C = f.config.cluster_cols
    # row 0 has 4 free groups, row 1 is empty, rows 2.. are taken
    large = {g: "busy" for g in range(4, C)} | {g: "busy" for g in range(2 * C, f.group_count)}
    state = SwitchedPodState(large=large)
    p = place(f, state, "x", Degrees(4, 4, 4))  # 64 processors = 4 groups
    assert p.locality == "tier0"
    assert p.groups == (0, 1, 2, 3)
    p = place(f, state, "y", Degrees(8, 4, 4))  # 8 groups: only row 1 holds them
    assert {f.group_position(g)[0] for g in p.groups} == {1}


def test_too_big_for_one_switch_spans_rows_sharing_columns():
    """Rows are joined under column switches where they share columns (¶41-42),
    so the second row contributes groups in the first row's columns."""
    f = fabric(FIG18)
    C = f.config.cluster_cols
    free = {(1, c) for c in range(8, 24)} | {(0, c) for c in (0, 1, 2, 20, 21)}
    large = {g: "busy" for g in range(f.group_count) if f.group_position(g) not in free}
    state = SwitchedPodState(large=large)
    p = place(f, state, "x", Degrees(18, 4, 4))
    assert p.locality == "tier1"
    assert sorted(f.group_position(g) for g in p.groups if g < C) == [(0, 20), (0, 21)]
    plan = plan_rings(f, bytearray(f.channel_count), "x", Degrees(18, 4, 4), p.tiles)
    assert channel_kinds(f, plan.channels())["up"] == 0


def test_failed_groups_are_never_chosen():
    f = fabric(FIG6)
    state = SwitchedPodState(failed=frozenset({1}))
    p = place(f, state, "x", Degrees(12, 1, 1))
    assert p.groups == (0, 2, 3)
    with pytest.raises(ResourceExhausted) as e:
        place(f, state, "y", Degrees(16, 1, 1))
    assert "needs 4 whole groups" in e.value.message and "3 are free" in e.value.message


def test_without_links_between_switches_a_job_must_fit_under_one():
    f = fabric(
        FIG15.__class__(
            **{**FIG15.to_dict(), "group_shape": (4,), "tier1_switches": 0, "tier0_up_ports": 0}
        )
    )
    with pytest.raises(ResourceExhausted) as e:
        place(f, SwitchedPodState(), "x", Degrees(100, 1, 1))
    assert e.value.reason == "NO_GROUPS_UNDER_ONE_SWITCH"


def test_candidates_are_distinct_and_best_first():
    f = fabric(FIG18)
    cands = list(placements(f, SwitchedPodState(), "x", Degrees(4, 4, 4)))
    assert cands[0].locality == "tier0"
    assert len({c.groups for c in cands}) == len(cands)


def test_bad_degrees_and_small_group_counts_are_invalid():
    f = fabric(FIG18)
    with pytest.raises(InvalidArgument):
        place(f, SwitchedPodState(), "x", Degrees(0, 1, 1))
    with pytest.raises(InvalidArgument):
        reserved_small_groups(f, 577)
