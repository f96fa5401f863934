"""OCS-6: the checker accepts every valid state and names each broken rule."""

from __future__ import annotations

import dataclasses

from lightpath.domain.torus import Fabric, FabricConfig
from lightpath_services.ocs_manager.invariants import StoredSlice, check
from tests.ocs_manager.model import placement, state_of


def fabric(k=2) -> Fabric:
    return Fabric.build(FabricConfig((2, 2, 2), 8, k, 16))


def two_slices(f):
    """Slice a: blocks 0, 1 along x; slice b: blocks 2, 5 along y."""
    a = placement(f, "a", (2, 1, 1), [0, 1])
    b = placement(f, "b", (1, 2, 1), [2, 5])
    return state_of(f, a, b)


def rules(f, state) -> set[str]:
    return {v.rule for v in check(f, state)}


def test_valid_states_pass():
    for k in (1, 2, 3):
        f = fabric(k)
        assert check(f, two_slices(f)) == []


def test_port_in_two_cross_connects():
    f = fabric()
    s = two_slices(f)
    table = next(iter(s.tables.values()))
    p = next(iter(table))
    free_port = next(q for q in range(f.ports_cabled(0)) if q not in table)
    table[free_port] = p  # a second cross-connect claims port p
    assert "PORT_IN_TWO_CROSS_CONNECTS" in rules(f, s)


def test_axis_mismatch_dark_port_and_same_kind_ends():
    f = fabric(k=1)
    s = two_slices(f)
    table = s.tables.setdefault(f.ocs_index(0, 0, 0), {})
    table[15], table[14] = 14, 15  # ports beyond the 16 cabled
    assert "AXIS_MISMATCH" in rules(f, s)
    s2 = two_slices(f)
    t2 = s2.tables[f.ocs_index(0, 0, 0)]
    t2[6], t2[7] = 7, 6  # first ends of blocks 6 and 7: first to first
    assert "AXIS_MISMATCH" in rules(f, s2)


def test_slices_joined():
    f = fabric(k=1)
    s = two_slices(f)
    t = s.tables[f.ocs_index(0, 0, 0)]  # an x OCS: a's 0 -> 1, b's self-loops 2 -> 2
    for src, dst in ((0, 1), (2, 2)):
        del t[f.second_port(src, 0)], t[f.first_port(dst)]
    for src, dst in ((0, 2), (2, 1)):  # cross the two slices over
        t[f.second_port(src, 0)], t[f.first_port(dst)] = f.first_port(dst), f.second_port(src, 0)
    assert "SLICES_JOINED" in rules(f, s)


def test_one_to_many_disagrees():
    f = fabric(k=2)
    s = two_slices(f)
    index = next(iter(s.one_to_many))
    s.one_to_many[index] = 1 - s.one_to_many[index]
    assert "ONE_TO_MANY_DISAGREES" in rules(f, s)


def test_unwired_block_connected():
    f = fabric(k=2)
    s = two_slices(f)
    lone = placement(f, "ghost", (1, 1, 1), [7])
    ghost = state_of(f, lone)
    for ocs, t in ghost.tables.items():
        s.tables.setdefault(ocs, {}).update(t)
    s.one_to_many.update(ghost.one_to_many)  # block 7 belongs to no slice
    assert "UNWIRED_BLOCK_CONNECTED" in rules(f, s)


def test_half_wired_slice_is_a_wiring_mismatch():
    f = fabric(k=1)
    s = two_slices(f)
    t = s.tables[f.ocs_index(1, 0, 0)]
    p = f.second_port(2, 0)
    del t[t.pop(p)]  # one cross-connect of slice b missing
    assert rules(f, s) == {"SLICE_WIRING_MISMATCH"}


def test_owner_mismatch():
    f = fabric()
    s = two_slices(f)
    s.owners[3] = "a"  # claimed by a, in no placement
    assert "OWNER_MISMATCH" in rules(f, s)
    s2 = two_slices(f)
    del s2.owners[0]
    assert "OWNER_MISMATCH" in rules(f, s2)


def test_a_wire_in_flight_holds_its_blocks_without_cross_connects():
    f = fabric()
    a = placement(f, "a", (2, 1, 1), [0, 1])
    s = state_of(f)
    s.owners.update({0: "a", 1: "a"})
    s.slices["a"] = StoredSlice(a, wired=False)
    assert check(f, s) == []
    s.slices["a"] = dataclasses.replace(s.slices["a"], wired=True)
    assert rules(f, s) == {"SLICE_WIRING_MISMATCH"}
