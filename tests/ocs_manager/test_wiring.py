"""OCS-2, OCS-4, OCS-5 on the seed's worked examples (¶70-74, ¶110-111, ¶141-149, Fig. 13)."""

from __future__ import annotations

import pytest

from lightpath.domain.torus import Fabric, FabricConfig
from lightpath.errors import InvalidArgument, NotFound
from lightpath_services.ocs_manager.invariants import check
from lightpath_services.ocs_manager.wiring import (
    Link,
    cross_connect_count,
    cross_connects,
    links,
    one_to_many_settings,
    release_change,
    replace_block,
    validate_placement,
    wire_change,
)
from tests.ocs_manager.model import placement, state_of, xc_set

X, Y, Z = 0, 1, 2


def pod(k: int = 1, n: int = 64) -> Fabric:
    return Fabric.build(FabricConfig((4, 4, 4), n, k, 136))


# -- ¶70-72: one block made a torus by the OCS (workload cluster 320) ------------


def test_single_block_torus_is_one_self_loop_per_segment():
    f = pod()
    p = placement(f, "j320", (1, 1, 1), [7])
    assert links(p) == (Link(X, 7, 7), Link(Y, 7, 7), Link(Z, 7, 7))
    xcs = list(cross_connects(f, links(p)))
    assert len(xcs) == 48  # every segment's one end to its other end (¶71)
    for xc in xcs:
        # on the OCS of the segment's own axis: second end (port N+b) to first end (port b)
        assert f.ocs_of_index(xc.ocs) == (xc.dim, xc.axis, 0)
        assert (xc.port_a, xc.port_b) == (64 + 7, 7)
    assert not check(f, state_of(f, p))


def test_single_block_without_wrap_needs_no_cross_connect():
    f = pod()
    assert links(placement(f, "mesh", (1, 1, 1), [7], wrap=(False, False, False))) == ()


# -- ¶110-111: a 2x1 arrangement's x-axis cross-connects ---------------------------


@pytest.mark.parametrize("wrap_x", [True, False])
def test_2x1_slice_cross_connects_every_x_segment(wrap_x):
    f = pod()
    first, second = 10, 3  # the first block sits left of the second (¶110)
    p = placement(f, "j2x1", (2, 1, 1), [first, second], wrap=(wrap_x, True, True))
    x_xcs = [xc for xc in cross_connects(f, links(p)) if xc.dim == X]
    # every one of the 16 x-dimension OCS gets updated (¶110) ...
    assert {f.ocs_of_index(xc.ocs)[1] for xc in x_xcs} == set(range(16))
    per_ocs = {}
    for xc in x_xcs:
        per_ocs.setdefault(xc.ocs, set()).add((xc.port_a, xc.port_b))
    # ... with the first block's output to the second's input, and (closing the ring)
    # the second's output to the first's input (¶111)
    expected = {(64 + first, second)} | ({(64 + second, first)} if wrap_x else set())
    assert all(pairs == expected for pairs in per_ocs.values())
    # y and z have one block each: self-loops with wrap
    assert sum(1 for xc in cross_connects(f, links(p)) if xc.dim != X) == 2 * 2 * 16


# -- ¶73-74: two blocks along y (workload cluster 330, 4x8x4) -----------------------


def test_two_blocks_along_y_wrap_into_a_ring():
    f = pod()
    p = placement(f, "j330", (1, 2, 1), [38, 39])
    assert [lk for lk in links(p) if lk.dim == Y] == [Link(Y, 38, 39), Link(Y, 39, 38)]
    assert cross_connect_count(f, links(p)) == 2 * 16 * 3


# -- ¶141-149: the 2-block ring with 1x2 switches, for both OCS choices ---------------

B1211, B1212, B1213, B1214 = 0, 1, 2, 3
OCS1271, OCS1272 = 0, 1
O1, O2 = 0, 1


def test_1211_left_of_1213_both_1x2_to_o1_and_ocs_1271():
    f = pod(k=2, n=4)
    p = placement(f, "fig12a", (2, 1, 1), [B1211, B1213])
    x = [lk for lk in links(p) if lk.dim == X]
    assert x == [Link(X, B1211, B1213), Link(X, B1213, B1211)]
    # ¶143: 1261 (1221's switch) to o1; ¶144: 1263 (1223's switch) to o1
    settings = {(g.block, g.after) for g in one_to_many_settings(f, x)}
    assert settings == {(B1211, O1), (B1213, O1)}
    # ¶145: on 1271, o1 of 1261 <-> 1223's left end, o1 of 1263 <-> 1221's left end
    for xc in cross_connects(f, x):
        assert f.ocs_of_index(xc.ocs)[2] == OCS1271
        assert f.segment_at(OCS1271, xc.port_b) == (xc.dst, 1)
        assert f.segment_at(OCS1271, xc.port_a) == (xc.src, 2)
    assert {(xc.src, xc.dst) for xc in cross_connects(f, x)} == {
        (B1211, B1213),
        (B1213, B1211),
    }
    assert not check(f, state_of(f, p))


def test_1211_left_of_1212_1261_to_o2_and_1262_to_o1():
    f = pod(k=2, n=4)
    p = placement(f, "fig12b", (2, 1, 1), [B1211, B1212])
    x = [lk for lk in links(p) if lk.dim == X]
    # ¶147: 1261 to o2 (1222's left end is on 1272); ¶148: 1262 to o1 (1221's on 1271)
    assert {(g.block, g.after) for g in one_to_many_settings(f, x)} == {
        (B1211, O2),
        (B1212, O1),
    }
    on = {}
    for xc in cross_connects(f, x):
        on.setdefault(f.ocs_of_index(xc.ocs)[2], set()).add((xc.src, xc.dst))
    # ¶149: 1272 carries 1221 -> 1222, 1271 carries 1222 -> 1221
    assert on == {OCS1272: {(B1211, B1212)}, OCS1271: {(B1212, B1211)}}
    assert not check(f, state_of(f, p))


# -- Fig. 13: an 8x8x8 slice of 8 blocks, K = 1 and K = 2 ------------------------------

# Block 13NN is block NN; 1318 stands for the block the figure does not show.
# 1312 below 1311 (¶152), 1311 left of 1313 (¶153), 1314 in front of 1317 (¶154).
FIG13 = {  # (x, y, z) -> block
    (0, 1, 0): 11,
    (0, 0, 0): 12,
    (1, 1, 0): 13,
    (1, 0, 0): 14,
    (0, 1, 1): 15,
    (1, 1, 1): 16,
    (1, 0, 1): 17,
    (0, 0, 1): 18,
}


def fig13(f: Fabric):
    return validate_placement(f, "fig13", [2, 2, 2], list(FIG13.items()), [])


@pytest.mark.parametrize("k", [1, 2])
def test_fig13_8x8x8_of_eight_blocks(k):
    f = pod(k=k)
    p = fig13(f)
    wiring = links(p)
    assert len(wiring) == 24  # each block has one successor per dimension (ring of 2)
    assert cross_connect_count(f, wiring) == 24 * 16 == 384
    assert len(one_to_many_settings(f, wiring)) * 16 == (384 if k == 2 else 0)
    got = xc_set(f, p)
    # ¶152 axis 1330 (y, leftmost front: x=0, z=0 -> axis 0): 1312's top to 1311's bottom
    ocs = f.ocs_ids[f.ocs_index(Y, 0, f.first_ocs(11))]
    assert (ocs, f.second_port(12, f.first_ocs(11)), f.first_port(11)) in got
    # ¶153 axis 1320 (x, top front: y=3, z=0 -> axis 3): 1311's right end to 1313's left end
    ocs = f.ocs_ids[f.ocs_index(X, 3, f.first_ocs(13))]
    assert (ocs, f.second_port(11, f.first_ocs(13)), f.first_port(13)) in got
    # ¶154 axis 1340 (z, top right: x=3, y=3 -> axis 15): 1314's rear end to 1317's front end
    ocs = f.ocs_ids[f.ocs_index(Z, 15, f.first_ocs(17))]
    assert (ocs, f.second_port(14, f.first_ocs(17)), f.first_port(17)) in got
    if k == 2:
        # ¶152-154: the 1x2 switches of 1312 (y), 1311 (x), 1314 (z) point at those OCS
        settings = {(g.block, g.dim): g.after for g in one_to_many_settings(f, wiring)}
        assert settings[(12, Y)] == 11 % 2
        assert settings[(11, X)] == 13 % 2
        assert settings[(14, Z)] == 17 % 2
    assert not check(f, state_of(f, p))


# -- OCS-4 release and OCS-5 replace ---------------------------------------------------


def test_release_is_the_exact_inverse_of_wire():
    f = pod(k=2)
    p = fig13(f)
    w, r = wire_change(f, p), release_change(f, p)
    assert r.disconnect == w.connect and not r.connect
    assert all(g.after is None for g in r.one_to_many)


@pytest.mark.parametrize("k", [1, 2])
def test_replace_moves_only_the_failed_blocks_cross_connects(k):
    f = pod(k=k)
    p = fig13(f)
    rep = replace_block(f, p, failed=13, new=40)
    assert rep.after.blocks[p.index_of_block(13)] == 40  # same logical position (¶131)
    before, after = xc_set(f, p), xc_set(f, rep.after)
    removed = {
        (f.ocs_ids[x.ocs], x.port_a, x.port_b)
        for x in cross_connects(f, links(p))
        if 13 in (x.src, x.dst)
    }
    assert before - after == removed
    assert len(removed) == 6 * 16  # 13 has a predecessor and a successor in each of 3 dims
    assert after - before == xc_set_of(f, rep.change.connect)
    assert before & after == xc_set_of(f, rep.untouched)
    assert not check(f, state_of(f, rep.after))


def test_replace_with_k2_moves_predecessors_1x2_when_the_new_block_lands_elsewhere():
    f = pod(k=2)
    p = placement(f, "ring", (4, 1, 1), [0, 2, 4, 6])  # every first end on OCS k = 0
    rep = replace_block(f, p, failed=4, new=5)  # block 5's first ends are on k = 1
    moved = {(g.block, g.dim): (g.before, g.after) for g in rep.change.one_to_many}
    assert moved[(2, X)] == (0, 1)  # 2 -> 4 became 2 -> 5: 2's 1x2 moves to o2
    assert moved[(4, X)] == (0, None)  # the failed block's switches go idle
    assert moved[(5, X)] == (None, 0)  # 5 -> 6, on k = 0
    assert (0, X) not in moved and (6, X) not in moved


def test_replace_of_a_self_looped_block():
    f = pod()
    p = placement(f, "one", (1, 1, 1), [7])
    rep = replace_block(f, p, 7, 8)
    assert set(rep.change.disconnect) == {Link(d, 7, 7) for d in (X, Y, Z)}
    assert set(rep.change.connect) == {Link(d, 8, 8) for d in (X, Y, Z)}
    assert rep.untouched == ()


def xc_set_of(f, wiring):
    return {(f.ocs_ids[x.ocs], x.port_a, x.port_b) for x in cross_connects(f, wiring)}


# -- bad placements (X-3) -------------------------------------------------------------------


def rules(err) -> dict[str, str]:
    return {v.field: v.rule for v in err.value.violations}


def test_a_dimension_mismatch_is_refused():
    with pytest.raises(InvalidArgument) as err:
        validate_placement(pod(), "j", [2, 1], [((0, 0), 1), ((1, 0), 2)], [])
    assert "3 dimensions" in rules(err)["grid.dims"]


def test_an_arrangement_that_is_not_a_full_grid_is_refused():
    f = pod()
    with pytest.raises(InvalidArgument) as err:
        validate_placement(f, "j", [2, 2, 1], [((0, 0, 0), 1), ((1, 0, 0), 2)], [])
    assert "full grid" in rules(err)["blocks"]
    with pytest.raises(InvalidArgument) as err:
        validate_placement(f, "j", [2, 1, 1], [((0, 0, 0), 1), ((0, 0, 0), 2)], [])
    assert "twice" in rules(err)["blocks[1].position"]
    with pytest.raises(InvalidArgument) as err:
        validate_placement(f, "j", [2, 1, 1], [((0, 0, 0), 1), ((2, 0, 0), 2)], [])
    assert "outside" in rules(err)["blocks[1].position"]


def test_a_block_given_twice_is_refused():
    with pytest.raises(InvalidArgument) as err:
        validate_placement(pod(), "j", [2, 1, 1], [((0, 0, 0), 5), ((1, 0, 0), 5)], [])
    assert "given twice" in rules(err)["blocks[1].block_id"]


def test_an_unknown_block_is_not_found():
    with pytest.raises(NotFound) as err:
        validate_placement(pod(), "j", [2, 1, 1], [((0, 0, 0), 5), ((1, 0, 0), 64)], [])
    assert err.value.name == "64"


def test_bad_id_wrap_and_oversized_grid():
    with pytest.raises(InvalidArgument) as err:
        validate_placement(pod(n=4), "bad id!", [8, 1, 1], [], [True])
    assert set(rules(err)) == {"job_id", "grid", "wrap"}
