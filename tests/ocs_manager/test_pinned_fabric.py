"""Pinned (issue 17): a dark port — one above the ports an OCS needs, when the
radix leaves some — maps to no segment, and a cross-connect on it is an
AXIS_MISMATCH (OCS-1, OCS-6)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lightpath.domain.torus import FIRST, SECOND, Fabric, FabricConfig
from lightpath_services.ocs_manager.invariants import check
from tests.ocs_manager.model import placement, state_of


def test_ports_above_the_cabled_ones_are_dark_k1():
    f = Fabric.build(FabricConfig((2, 2, 2), 8, 1, 20))  # 16 cabled, 16..19 dark
    assert f.segment_at(0, 15) == (7, SECOND)
    assert [f.segment_at(0, p) for p in range(16, 20)] == [None] * 4


def test_ports_above_the_cabled_ones_are_dark_k2_uneven():
    # N=5, K=2: OCS k=0 holds first ends of 0, 2, 4 (3 ports), k=1 of 1, 3 (2 ports).
    f = Fabric.build(FabricConfig((2, 2, 2), 5, 2, 10))
    assert f.first_ends == (3, 2)
    assert f.segment_at(0, 7) == (4, SECOND) and f.segment_at(0, 8) is None
    assert f.segment_at(1, 6) == (4, SECOND) and f.segment_at(1, 7) is None


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 12), st.integers(1, 4), st.integers(1, 5))
def test_every_port_maps_back_exactly_and_the_rest_are_dark(n, k, spare):
    k = min(k, n)
    radix = n + -(-n // k) + spare
    f = Fabric.build(FabricConfig((2, 1), n, k, radix))
    for ocs_k in range(k):
        expected = {}
        for b in range(n):
            if f.first_ocs(b) == ocs_k:
                expected[f.first_port(b)] = (b, FIRST)
            expected[f.second_port(b, ocs_k)] = (b, SECOND)
        got = {p: f.segment_at(ocs_k, p) for p in range(radix)}
        assert {p: s for p, s in got.items() if s is not None} == expected
        assert sum(s is None for s in got.values()) == radix - f.ports_cabled(ocs_k) >= spare


def test_a_cross_connect_to_a_dark_port_is_an_axis_mismatch_only():
    f = Fabric.build(FabricConfig((2, 2, 2), 8, 1, 20))
    a = placement(f, "a", (2, 1, 1), [0, 1])
    s = state_of(f, a)
    table = s.tables[f.ocs_index(0, 0, 0)]
    free_first = f.first_port(7)  # block 7 is in no slice
    assert free_first not in table
    table[16], table[free_first] = free_first, 16  # dark port 16 to block 7's first end
    violations = check(f, s)
    assert [v.rule for v in violations] == ["AXIS_MISMATCH"]
    assert "port 16 is not cabled" in violations[0].detail
