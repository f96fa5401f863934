"""Properties of folding on random DAGs (GF-2, GF-3).

The checker below restates process 400's constraints independently of
lightpath.graph.fold, and the greedy rule as "no later set holds a unit the
earlier set could still have taken".
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightpath.errors import InvalidArgument
from lightpath.graph.expand import FlatGraph, expand
from lightpath.graph.fold import GraphPlan, fold
from lightpath.graph.spec import (
    ComponentSpec,
    DatasetSpec,
    Endpoint,
    FlowKind,
    FlowSpec,
    Folding,
    GraphSpec,
    PinKind,
    PinSpec,
    from_proto,
    to_proto,
)

pytestmark = pytest.mark.slow  # runs for many seconds: handed out first

CUSTOM = "tests.graph.kinds:Pass"


@st.composite
def random_graphs(draw, *, together: bool = False) -> GraphSpec:
    n = draw(st.integers(1, 12))
    components: list[ComponentSpec] = []
    flows: list[FlowSpec] = []
    datasets: list[DatasetSpec] = []
    phase = 0
    for j in range(n):
        phase += draw(st.sampled_from([0] * 7 + [1]))
        degree = draw(st.sampled_from([1] * 5 + [2]))
        folding = draw(
            st.sampled_from(
                [Folding.ROOT_OR_INTERIOR] * 6 + [Folding.ROOT_ONLY, Folding.NOT_FOLDABLE]
            )
        )
        # Common cases first: hypothesis leans towards the first choice.
        fed = j and draw(st.sampled_from([True, True, True, False]))
        ups: list[int] = []
        if fed:
            width = draw(st.sampled_from([1, 1, 1, 2, 3]))
            ups = sorted(set(draw(st.lists(st.integers(0, j - 1), min_size=width, max_size=width))))
        split = (
            bool(ups)
            and folding is not Folding.ROOT_ONLY
            and draw(st.sampled_from([False, False, False, True]))
        )
        cid = f"c{j}"
        if split:
            components.append(
                ComponentSpec(
                    cid,
                    "kv_lookup",
                    folding=folding,
                    degree=degree,
                    phase=phase,
                    params={"redis_url": "redis://127.0.0.1:1/0"},
                )
            )
        else:
            components.append(
                ComponentSpec(
                    cid,
                    CUSTOM,
                    folding=folding,
                    degree=degree,
                    phase=phase,
                    input_ports=("in",) if ups or draw(st.sampled_from([True, False])) else (),
                    output_ports=("out",),
                )
            )
        has_input = split or components[-1].input_ports
        for i in ups:
            same = components[i].degree == degree
            kind = draw(st.sampled_from([FlowKind.STRAIGHT] * 5 + [FlowKind.REPARTITION]))
            kind = kind if same else FlowKind.REPARTITION
            flows.append(FlowSpec(Endpoint(f"c{i}", "out"), Endpoint(cid, "in"), kind))
        if has_input and not ups:
            path = "d{part}" if degree > 1 else f"d{j}"
            datasets.append(DatasetSpec(f"d{j}", path.replace("{part}", f"{j}.{{part}}"), degree))
            flows.append(FlowSpec(Endpoint(f"d{j}"), Endpoint(cid, "in")))
    pins: list[PinSpec] = []
    plain = [c.id for c in components if c.kind == CUSTOM]
    if len(plain) >= 2:
        for _ in range(draw(st.integers(0, 2))):
            pair = draw(st.lists(st.sampled_from(plain), min_size=2, max_size=2, unique=True))
            pins.append(PinSpec(PinKind.APART, tuple(pair)))
    if together:
        # Mostly a flow's two ends (often valid), sometimes any components (often not).
        edges = [
            (f.source.node, f.target.node)
            for f in flows
            if f.source.node in plain and f.target.node in plain
        ]
        if edges and draw(st.sampled_from([True, True, False])):
            pins.append(PinSpec(PinKind.TOGETHER, draw(st.sampled_from(edges))))
        elif len(plain) >= 2:
            group = draw(st.lists(st.sampled_from(plain), min_size=2, max_size=3, unique=True))
            pins.append(PinSpec(PinKind.TOGETHER, tuple(group)))
    return GraphSpec("random", tuple(components), tuple(flows), tuple(datasets), tuple(pins))


def _units(graph: FlatGraph) -> dict[str, frozenset[str]]:
    """Component -> the components it must share a set with (split halves, TOGETHER pins)."""
    groups = {c: {c} for c in graph.components}

    def merge(a: str, b: str) -> None:
        union = groups[a] | groups[b]
        for c in union:
            groups[c] = union

    for req, resp in graph.halves.items():
        merge(req, resp)
    for pin in graph.pins:
        if pin.kind is PinKind.TOGETHER:
            for c in pin.components[1:]:
                merge(pin.components[0], c)
    return {c: frozenset(g) for c, g in groups.items()}


def _apart(graph: FlatGraph) -> set[frozenset[str]]:
    return {
        frozenset((a, b))
        for pin in graph.pins
        if pin.kind is PinKind.APART
        for a in pin.components
        for b in pin.components
        if a != b
    }


def _could_join(graph: FlatGraph, unit: frozenset[str], members: set[str], degree, phase) -> bool:
    """Process 400's test for adding `unit` to a set holding `members` (step 408)."""
    nodes = [graph.components[c] for c in unit]
    entry = [f for c in unit for f in graph.in_flows[c] if f.source.node not in unit]
    return (
        bool(entry)
        and all(n.foldable for n in nodes)
        and all(n.degree == degree and n.phase == phase for n in nodes)
        and all(f.straight and f.source.node in members for f in entry)
        and all(graph.components[f.target.node].folding is Folding.ROOT_OR_INTERIOR for f in entry)
        and not any(frozenset((a, b)) in _apart(graph) for a in unit for b in members)
    )


def check_plan(graph: FlatGraph, plan: GraphPlan) -> None:
    index = {}
    for k, s in enumerate(plan.folded_sets):
        for m in s.members:
            assert m not in index, f"{m} in two sets"
            index[m] = k
    assert set(index) == set(graph.components)
    units = _units(graph)
    apart = _apart(graph)
    for k, s in enumerate(plan.folded_sets):
        members = set(s.members)
        nodes = [graph.components[m] for m in s.members]
        assert {n.degree for n in nodes} == {s.degree}
        assert {n.phase for n in nodes} == {s.phase}
        assert s.processes == s.degree
        if not s.foldable:
            # A non-foldable component alone (or with its own other half).
            assert len({graph.components[m].origin for m in s.members}) == 1
        else:
            assert all(n.foldable for n in nodes)
        for m in s.members:
            assert units[m] <= members, f"{m} separated from {units[m]}"
            inside = [f for f in graph.in_flows[m] if f.source.node in members]
            if m in s.roots:
                assert not inside
            else:
                assert inside, f"{m} is no root but fed by no member"
                # Interior members: every input from the set, over straight flows.
                if units[m] == {m}:
                    assert len(inside) == len(graph.in_flows[m])
                assert all(f.straight for f in inside)
                assert graph.components[m].folding is Folding.ROOT_OR_INTERIOR
        for pair in apart:
            assert not pair <= members, f"apart {set(pair)} share {s.id}"
        # The set started at a unit all of whose upstream was assigned before (step 404).
        first = units[s.members[0]]
        for c in first:
            for up in graph.upstream(c):
                if up in graph.components and up not in first:
                    assert index[up] < k
        # Greedy (step 408): no unit of a later set could have joined this one
        # (a non-foldable root stays alone, step 406).
        for later in plan.folded_sets[k + 1 :] if s.foldable else ():
            for m in later.members:
                assert not _could_join(graph, units[m], members, s.degree, s.phase), (
                    f"{m} ({later.id}) could have joined {s.id}"
                )


@settings(max_examples=300)
@given(random_graphs())
def test_every_set_satisfies_every_constraint_and_the_greedy_rule(spec):
    graph = expand(spec)
    check_plan(graph, fold(graph))


@settings(max_examples=150)
@given(random_graphs())
def test_folding_is_deterministic(spec):
    first = fold(expand(spec))
    assert fold(expand(spec)) == first
    assert fold(expand(from_proto(to_proto(spec)))) == first


@settings(max_examples=300)
@given(random_graphs(together=True))
def test_together_pins_are_honoured_or_refused_naming_the_pin(spec):
    graph = expand(spec)
    try:
        plan = fold(graph)
    except InvalidArgument as err:
        assert err.violations[0].field.startswith("pins[")
        assert "cannot fold together" in err.message
        return
    check_plan(graph, plan)
    for pin in graph.pins:
        if pin.kind is PinKind.TOGETHER:
            assert len({plan.set_of(c).id for c in pin.components}) == 1


@settings(max_examples=150)
@given(random_graphs(), st.data())
def test_a_flow_back_upstream_is_refused_naming_a_flow_on_the_cycle(spec, data):
    graph = expand(spec)
    plain = [c.id for c in spec.components if c.kind == CUSTOM]
    fed = [c for c in plain if "in" in graph.components[c].inputs]
    if not fed:
        return
    u = data.draw(st.sampled_from(fed))
    reach, stack = set(), [u]
    while stack:
        c = stack.pop()
        if c not in reach:
            reach.add(c)
            stack.extend(graph.successors(c))
    same_phase = {c for c in plain if graph.components[c].phase == graph.components[u].phase}
    v = data.draw(st.sampled_from(sorted(reach & same_phase)))
    # Repartitioning and in one phase: the cycle is the only thing wrong with it.
    back = FlowSpec(Endpoint(v, "out"), Endpoint(u, "in"), FlowKind.REPARTITION)
    bad = GraphSpec(spec.graph_id, spec.components, (*spec.flows, back), spec.datasets, spec.pins)
    try:
        expand(bad)
    except InvalidArgument as err:
        field = err.violations[0].field
        assert field.startswith("flows[") and "closes a cycle" in err.message
        named = bad.flows[int(field[len("flows[") : -1])]
        # The named flow is on a cycle: its target leads back to its source.
        seen, stack = set(), [named.target.node]
        while stack:
            c = stack.pop()
            if c not in seen:
                seen.add(c)
                stack.extend(f.target.node for f in bad.flows if f.source.node == c)
        assert named.source.node in seen
    else:
        raise AssertionError(f"{back} closes a cycle but was accepted")
