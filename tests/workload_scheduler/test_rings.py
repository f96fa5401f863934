"""WS-10 ring plans (seed 002 ¶28-31, ¶38), checked on networkx torus graphs."""

from __future__ import annotations

import itertools
import math

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightpath.domain.rings import AXES, hamiltonian_cycle, neighbours, plan_rings
from lightpath.errors import InvalidArgument


def slice_graph(chips, wrap) -> nx.Graph:
    """The slice's chips and links: a grid, with wraparound where the slice wraps.
    (grid_graph lists dimensions last-first, so its nodes are in chips' order.)"""
    g = nx.grid_graph(dim=list(reversed(chips)), periodic=list(reversed(wrap)))
    return nx.relabel_nodes(g, lambda v: v if isinstance(v, tuple) else (v,))


def assert_valid(plan, degrees):
    chips, wrap = plan.chips, plan.wrap
    g = slice_graph(chips, wrap)
    every = set(itertools.product(*(range(n) for n in chips)))
    assert [a.axis for a in plan.axes] == list(AXES)
    for axis in plan.axes:
        assert axis.degree == degrees[axis.axis]
        assert len(axis.rings) == math.prod(chips) // axis.degree
        seen: list[tuple[int, ...]] = []
        for ring in axis.rings:
            assert len(ring) == axis.degree == len(set(ring))
            if len(ring) > 1:  # consecutive chips, and last -> first, are linked
                for a, b in zip(ring, ring[1:] + ring[:1], strict=True):
                    assert g.has_edge(a, b), (axis.axis, a, b)
                    assert neighbours(a, b, chips, wrap)
                assert nx.is_simple_path(g, list(ring))
            seen.extend(ring)
        assert sorted(seen) == sorted(every)  # each chip in exactly one ring per axis


def test_seed_fig10_three_by_three_by_four():
    """¶38: layers l1-l3 x pipeline stages p1-p3 on a 3x3 array, 4 data-parallel models."""
    degrees = {"data": 4, "pipeline": 3, "layer": 3}
    plan = plan_rings((3, 3, 4), (True, True, True), degrees)
    assert_valid(plan, degrees)
    by_axis = {a.axis: a for a in plan.axes}
    assert len(by_axis["layer"].rings) == 12 and len(by_axis["data"].rings) == 9
    # 3 chips along a dimension form a ring only thanks to its wraparound link.
    (ring, *_) = by_axis["pipeline"].rings
    assert {ring[0], ring[-1]} in ({(0, 0, 0), (2, 0, 0)}, {(0, 0, 0), (0, 2, 0)})


def test_tpu_slice_8x8x4():
    degrees = {"data": 8, "pipeline": 4, "layer": 8}
    plan = plan_rings((8, 8, 4), (True,) * 3, degrees)
    assert_valid(plan, degrees)
    assert {a.axis: a.dims for a in plan.axes} == {"data": (0,), "pipeline": (2,), "layer": (1,)}


def test_an_axis_over_two_dimensions_without_wraparound_is_a_snake_with_a_return_path():
    degrees = {"data": 1, "pipeline": 1, "layer": 32}
    plan = plan_rings((4, 8, 1), (False, False, False), degrees)
    assert_valid(plan, degrees)


def test_odd_sizes_need_a_wrapping_dimension():
    assert_valid(
        plan_rings((3, 5, 1), (False, True, False), d := {"data": 15, "pipeline": 1, "layer": 1}), d
    )
    with pytest.raises(InvalidArgument, match="odd number of chips without wraparound"):
        plan_rings((3, 5, 1), (False, False, False), {"data": 15, "pipeline": 1, "layer": 1})


def test_product_must_equal_the_chip_count():
    with pytest.raises(InvalidArgument) as err:
        plan_rings((8, 8, 4), (True,) * 3, {"data": 8, "pipeline": 8, "layer": 3})
    assert "= 192 must equal the slice's 256 chips" in str(err.value)
    assert err.value.violations[0].field == "parallelism"


def test_a_degree_that_is_no_product_of_whole_dimensions():
    with pytest.raises(InvalidArgument, match="data=16"):
        plan_rings((8, 8, 4), (True,) * 3, {"data": 16, "pipeline": 4, "layer": 4})


def test_a_line_without_wraparound_is_no_ring():
    with pytest.raises(InvalidArgument, match="a line of 8 chips without wraparound is a path"):
        plan_rings((8, 8, 4), (False,) * 3, {"data": 8, "pipeline": 8, "layer": 4})


def test_splitting_one_ring_dimension_between_two_axes_is_refused():
    # An 8-chip ring holds no 4-chip ring: data=2 x pipeline=4 cannot share it.
    with pytest.raises(InvalidArgument):
        plan_rings((8, 1, 1), (True,) * 3, {"data": 2, "pipeline": 4, "layer": 1})


def test_degrees_must_be_positive():
    with pytest.raises(InvalidArgument, match="data: every degree must be >= 1"):
        plan_rings((4, 4, 4), (True,) * 3, {"data": 0, "pipeline": 8, "layer": 8})


@pytest.mark.parametrize("sizes", [(2,), (5,), (2, 3), (3, 3), (4, 3, 2), (3, 3, 3), (2, 2, 2, 2)])
def test_hamiltonian_cycle_of_grids(sizes):
    wraps = [True] * len(sizes)
    cycle = hamiltonian_cycle(sizes, wraps)
    g = slice_graph(sizes, wraps)
    assert len(cycle) == len(set(cycle)) == math.prod(sizes)
    if len(cycle) > 2:
        assert all(g.has_edge(a, b) for a, b in zip(cycle, cycle[1:] + cycle[:1], strict=True))


def _factorizations(n):
    for a in range(1, n + 1):
        if n % a:
            continue
        for b in range(1, n // a + 1):
            if (n // a) % b == 0:
                yield {"data": a, "pipeline": b, "layer": n // a // b}


@settings(max_examples=200)
@given(
    chips=st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(1, 4)),
    wrap=st.tuples(st.booleans(), st.booleans(), st.booleans()),
    pick=st.integers(0, 10_000),
)
def test_property_every_plan_is_valid_or_refused_with_a_reason(chips, wrap, pick):
    options = list(_factorizations(math.prod(chips)))
    degrees = options[pick % len(options)]
    try:
        plan = plan_rings(chips, wrap, degrees)
    except InvalidArgument as err:
        assert err.violations[0].field == "parallelism" and err.violations[0].rule
        return
    assert_valid(plan, degrees)


def test_every_whole_dimension_mapping_is_found_when_each_dimension_wraps():
    # With wraparound everywhere, any split of the dimensions among the axes is a valid plan.
    chips = (4, 3, 2)
    for owners in itertools.product(AXES, repeat=3):
        degrees = dict.fromkeys(AXES, 1)
        for n, axis in zip(chips, owners, strict=True):
            degrees[axis] *= n
        assert_valid(plan_rings(chips, (True,) * 3, degrees), degrees)
