"""Graph spec validation (GF-1) and folding (GF-2, GF-3, GF-4) on the seed's figures."""

from __future__ import annotations

import itertools
import json

import pytest

from lightpath.errors import InvalidArgument
from lightpath.graph.examples import fig2a, fig3a
from lightpath.graph.expand import expand
from lightpath.graph.fold import fold, unfold
from lightpath.graph.spec import (
    ComponentSpec,
    DatasetSpec,
    Endpoint,
    FlowKind,
    Folding,
    GraphSpec,
    PinKind,
    PinSpec,
    PortBinding,
    SubGraphSpec,
    dump_spec,
    flow,
    from_proto,
    load_spec,
    to_proto,
)

CUSTOM = "tests.graph.kinds:Pass"


def comp(id: str, kind: str = "reformat", **kw) -> ComponentSpec:
    return ComponentSpec(id=id, kind=kind, **kw)


def plan_sets(spec: GraphSpec) -> list[tuple[str, ...]]:
    return [s.members for s in fold(expand(spec)).folded_sets]


# ---------------------------------------------------------------- the seed's figures


def test_fig_2a_folds_into_the_three_sets_of_fig_2b():
    plan = fold(expand(fig2a("in.tsv", "out")))
    assert [set(s.members) for s in plan.folded_sets] == [
        {"204A", "204B", "204E", "204F", "204G", "204C", "204D"},
        {"204H"},
        {"204I", "204J"},
    ]
    # In the order the seed's narrative adds them: B, E, F, G, then (H refused) C, D.
    assert plan.folded_sets[0].members == ("204A", "204B", "204E", "204F", "204G", "204C", "204D")
    assert [s.roots for s in plan.folded_sets] == [("204A",), ("204H",), ("204I",)]
    assert [s.foldable for s in plan.folded_sets] == [True, False, True]
    assert (plan.processes_before, plan.processes_after) == (10, 3)


def test_fig_2a_gather_stays_out_of_the_first_set_because_an_input_comes_from_outside():
    # 204I is foldable, serial, same phase and fed straight by 204D (a member),
    # but its other input 204H is not in the set (seed claim 8).
    graph = expand(fig2a("in.tsv", "out"))
    assert graph.components["204I"].foldable
    assert {f.source.node for f in graph.in_flows["204I"]} == {"204D", "204H"}
    assert "204I" not in fold(graph).folded_sets[0].members


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_fig_3a_three_n_way_components_fold_into_one_set_of_n_processes(n):
    plan = fold(expand(fig3a("in.{part}", "out.{part}", n)))
    (only,) = plan.folded_sets
    assert only.members == ("304A", "304B", "304C")
    assert (only.degree, only.processes) == (n, n)
    assert (plan.processes_before, plan.processes_after) == (3 * n, n)


def test_unfolded_plan_is_one_process_per_component_instance():
    plan = unfold(expand(fig3a("in.{part}", "out.{part}", 4)))
    assert [s.members for s in plan.folded_sets] == [("304A",), ("304B",), ("304C",)]
    assert plan.processes_after == plan.processes_before == 12


def test_folding_is_deterministic_and_survives_the_protobuf_round_trip():
    spec = fig2a("in.tsv", "out")
    again = from_proto(to_proto(spec))
    assert again == spec
    assert fold(expand(spec)) == fold(expand(again))


def test_json_spec_file_round_trips(tmp_path):
    spec = fig2a("in.tsv", "out")
    path = tmp_path / "g.json"
    path.write_text(dump_spec(spec))
    assert load_spec(path) == spec
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"graph_id": "x", "components": [{"idd": "a"}]}))
    with pytest.raises(InvalidArgument) as err:
        load_spec(bad)
    assert "bad.json" in err.value.violations[0].field


# ---------------------------------------------------------------- constraints


def _chain(*components: ComponentSpec, flows=None, **kw) -> GraphSpec:
    ids = [c.id for c in components]
    return GraphSpec(
        "g",
        components=components,
        datasets=(DatasetSpec("in", "in.{part}.tsv", components[0].degree or 1),),
        flows=flows or (flow("in", ids[0]), *(flow(a, b) for a, b in itertools.pairwise(ids))),
        **kw,
    )


def test_a_different_degree_starts_a_new_set_across_a_repartitioning_flow():
    spec = _chain(
        comp("a"),
        comp("b", degree=4),
        comp("c", degree=4),
        flows=(
            flow("in", "a"),
            flow("a", "b", FlowKind.REPARTITION, "id"),
            flow("b", "c"),
        ),
    )
    assert plan_sets(spec) == [("a",), ("b", "c")]


def test_a_repartitioning_flow_between_equal_degrees_still_breaks_the_set():
    spec = _chain(
        comp("a", degree=2),
        comp("b", degree=2),
        flows=(flow("in", "a"), flow("a", "b", FlowKind.REPARTITION, "region")),
    )
    assert plan_sets(spec) == [("a",), ("b",)]


def test_phases_are_never_folded_together():
    spec = _chain(comp("a"), comp("b"), comp("c", phase=1), comp("d", phase=1))
    plan = fold(expand(spec))
    assert [s.members for s in plan.folded_sets] == [("a", "b"), ("c", "d")]
    assert [s.phase for s in plan.folded_sets] == [0, 1]


def test_a_root_only_component_starts_its_own_set():
    spec = _chain(comp("a"), comp("b", folding=Folding.ROOT_ONLY), comp("c"))
    assert plan_sets(spec) == [("a",), ("b", "c")]


def test_a_non_foldable_component_is_a_set_of_its_own_and_does_not_grow():
    spec = _chain(comp("a"), comp("b", "interface", params={"command": "cat"}), comp("c"))
    plan = fold(expand(spec))
    assert [s.members for s in plan.folded_sets] == [("a",), ("b",), ("c",)]
    assert [s.foldable for s in plan.folded_sets] == [True, False, True]


def test_a_multi_input_component_joins_once_all_its_upstream_are_members():
    # a fans out to b and c; d joins both: everything folds, d after b and c.
    spec = GraphSpec(
        "g",
        datasets=(DatasetSpec("in", "in.tsv"),),
        components=(comp("a", "replicate"), comp("b"), comp("c"), comp("d", "gather")),
        flows=(
            flow("in", "a"),
            flow("a", "b"),
            flow("a", "c"),
            flow("b", "d"),
            flow("c", "d"),
        ),
    )
    assert plan_sets(spec) == [("a", "b", "c", "d")]


# ---------------------------------------------------------------- pins (GF-3)


def test_an_apart_pin_splits_the_fig_2a_set():
    base = fig2a("in.tsv", "out")
    spec = GraphSpec(
        base.graph_id,
        base.components,
        base.flows,
        base.datasets,
        pins=(PinSpec(PinKind.APART, ("204A", "204C")),),
    )
    sets = [set(s) for s in plan_sets(spec)]
    assert {"204A", "204B", "204E", "204F", "204G"} in sets
    assert {"204C", "204D"} in sets
    assert not any({"204A", "204C"} <= s for s in sets)


def test_a_together_pin_keeps_a_root_only_component_with_its_upstream():
    spec = _chain(
        comp("a"),
        comp("b", folding=Folding.ROOT_ONLY),
        comp("c"),
    )
    assert plan_sets(spec) == [("a",), ("b", "c")]
    # b may not be interior (ROOT_ONLY): pinning it to a is refused, naming the pin.
    pinned = GraphSpec(**{**spec.__dict__, "pins": (PinSpec(PinKind.TOGETHER, ("a", "b")),)})
    with pytest.raises(InvalidArgument) as err:
        fold(expand(pinned))
    assert err.value.violations[0].field == "pins[0].components"
    assert "b may only be a root" in err.value.message


def test_a_together_pin_merges_two_roots_into_one_set():
    spec = GraphSpec(
        "g",
        datasets=(DatasetSpec("in1", "a.tsv"), DatasetSpec("in2", "b.tsv")),
        components=(comp("a"), comp("b"), comp("j", "gather")),
        flows=(flow("in1", "a"), flow("in2", "b"), flow("a", "j"), flow("b", "j")),
    )
    # Unpinned, neither root can grow into j: j's other input is always outside.
    assert plan_sets(spec) == [("a",), ("b",), ("j",)]
    pinned = GraphSpec(**{**spec.__dict__, "pins": (PinSpec(PinKind.TOGETHER, ("a", "b", "j")),)})
    (only,) = fold(expand(pinned)).folded_sets
    assert set(only.members) == {"a", "b", "j"}
    assert only.roots == ("a", "b")
    # A set is a connected sub-graph (seed §2.2): two roots alone are refused.
    alone = GraphSpec(**{**spec.__dict__, "pins": (PinSpec(PinKind.TOGETHER, ("a", "b")),)})
    with pytest.raises(InvalidArgument, match="b not joined to the others by flows"):
        fold(expand(alone))


@pytest.mark.parametrize(
    ("pins", "rule"),
    [
        ((PinSpec(PinKind.TOGETHER, ("a", "h")),), "h is not foldable"),
        ((PinSpec(PinKind.TOGETHER, ("a", "w")),), "degree"),
        ((PinSpec(PinKind.TOGETHER, ("a", "z")),), "not joined"),
        (
            (PinSpec(PinKind.TOGETHER, ("a", "b")), PinSpec(PinKind.APART, ("a", "b"))),
            "pinned apart",
        ),
    ],
)
def test_invalid_together_pins_are_refused_naming_the_pin(pins, rule):
    spec = GraphSpec(
        "g",
        datasets=(DatasetSpec("in", "in.tsv"), DatasetSpec("in2", "z.tsv")),
        components=(
            comp("a"),
            comp("b"),
            comp("h", "interface", params={"command": "cat"}),
            comp("c"),
            comp("w", degree=2),
            comp("z"),
        ),
        flows=(
            flow("in", "a"),
            flow("a", "b"),
            flow("b", "h"),
            flow("h", "c"),
            flow("a", "w", FlowKind.REPARTITION),
            flow("in2", "z"),
        ),
        pins=pins,
    )
    with pytest.raises(InvalidArgument) as err:
        fold(expand(spec))
    assert err.value.violations[0].field.startswith("pins[")
    assert rule in err.value.message


def test_a_together_pin_with_a_path_leaving_and_reentering_the_group_is_refused():
    # a -> b -> d and a -> x -> d: {a, b, d} is connected, but x would have to
    # run both before and after the folded set.
    spec = GraphSpec(
        "g",
        datasets=(DatasetSpec("in", "in.tsv"),),
        components=(comp("a", "replicate"), comp("b"), comp("x", degree=1), comp("d", "gather")),
        flows=(
            flow("in", "a"),
            flow("a", "b"),
            flow("a", "x"),
            flow("x", "d"),
            flow("b", "d"),
        ),
        pins=(PinSpec(PinKind.APART, ("a", "x")), PinSpec(PinKind.TOGETHER, ("a", "b", "d"))),
    )
    with pytest.raises(InvalidArgument) as err:
        fold(expand(spec))
    assert err.value.violations[0].field == "pins[1].components"
    assert "a path leaves the group and comes back into it at d" in err.value.message


def test_a_pin_naming_an_unknown_component_is_refused():
    spec = _chain(comp("a"), comp("b"), pins=(PinSpec(PinKind.APART, ("a", "nope")),))
    with pytest.raises(InvalidArgument) as err:
        expand(spec)
    assert err.value.violations[0].field == "pins[0].components"
    assert '"nope" is no component' in err.value.message


# ---------------------------------------------------------------- sub-graphs, split halves


def test_a_sub_graph_expands_and_its_components_fold_across_its_boundary():
    inner = GraphSpec(
        "inner",
        components=(comp("clean", "filter", params={"where": "amount > 0"}), comp("shape")),
        flows=(flow("clean:out", "shape"),),
    )
    spec = GraphSpec(
        "g",
        datasets=(DatasetSpec("in", "in.tsv"), DatasetSpec("out", "out.tsv")),
        components=(
            comp("first"),
            ComponentSpec(
                "prep",
                "graph",
                subgraph=SubGraphSpec(
                    inner,
                    inputs=(PortBinding("in", Endpoint("clean", "in")),),
                    outputs=(PortBinding("out", Endpoint("shape", "out")),),
                ),
            ),
            comp("last"),
        ),
        flows=(
            flow("in", "first"),
            flow("first", "prep:in"),
            flow("prep:out", "last"),
            flow("last", "out"),
        ),
    )
    graph = expand(spec)
    assert list(graph.components) == ["first", "prep.clean", "prep.shape", "last"]
    assert plan_sets(spec) == [("first", "prep.clean", "prep.shape", "last")]


def test_an_inner_component_of_a_sub_graph_with_an_error_is_named_by_its_path():
    inner = GraphSpec("inner", components=(comp("x", "no-such-kind"),))
    spec = GraphSpec(
        "g",
        components=(ComponentSpec("sub", "graph", subgraph=SubGraphSpec(inner)),),
    )
    with pytest.raises(InvalidArgument) as err:
        expand(spec)
    assert err.value.violations[0].field == "components[0].subgraph.graph.components[0].kind"


def test_a_component_calling_an_external_service_splits_and_its_response_half_is_a_second_root():
    spec = _chain(
        comp("a"),
        comp("k", "kv_lookup", params={"redis_url": "redis://127.0.0.1:1/0"}),
        comp("b"),
    )
    graph = expand(spec)
    assert list(graph.order) == ["a", "k.request", "k.response", "b"]
    (only,) = fold(graph).folded_sets
    assert only.members == ("a", "k.request", "k.response", "b")
    assert only.roots == ("a", "k.response")
    # Unfolded, the halves still share one process: they are one component.
    assert [s.members for s in unfold(graph).folded_sets] == [
        ("a",),
        ("k.request", "k.response"),
        ("b",),
    ]
    assert fold(graph).processes_before == 3


# ---------------------------------------------------------------- validation (GF-1)


def _refused(spec: GraphSpec) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as err:
        expand(spec)
    return err.value


def test_a_cycle_is_refused_naming_the_flow_that_closes_it():
    spec = GraphSpec(
        "g",
        components=(comp("a", "gather"), comp("b"), comp("c")),
        datasets=(DatasetSpec("in", "in.tsv"),),
        flows=(flow("in", "a"), flow("a", "b"), flow("b", "c"), flow("c", "a")),
    )
    err = _refused(spec)
    assert err.violations[0].field == "flows[3]"
    assert "cycle a -> b -> c -> a" in err.message


def test_a_flow_to_a_port_that_does_not_exist_is_refused():
    err = _refused(_chain(comp("a"), comp("b"), flows=(flow("in", "a"), flow("a:nope", "b"))))
    assert err.violations[0].field == "flows[1].source.port"
    assert 'a has no output port "nope" (it has: out)' in err.message


def test_an_input_port_without_a_flow_is_refused_as_dangling():
    err = _refused(_chain(comp("a"), comp("b"), flows=(flow("in", "a"),)))
    assert err.violations[0].field == "components[1]"
    assert 'b: input port "in" has no flow (dangling port)' in err.message


def test_a_flow_naming_an_unknown_component_is_refused():
    err = _refused(_chain(comp("a"), flows=(flow("in", "a"), flow("a", "ghost"))))
    assert err.violations[0].field == "flows[1].target.node"


def test_a_straight_flow_between_different_degrees_is_refused():
    err = _refused(_chain(comp("a"), comp("b", degree=3)))
    assert err.violations[0].field == "flows[1]"
    assert "a.out -> b.in joins degree 1 to degree 3" in err.message


def test_a_dataset_read_by_a_repartitioning_flow_is_refused():
    err = _refused(_chain(comp("a", degree=2), flows=(flow("in", "a", FlowKind.REPARTITION),)))
    assert err.violations[0].field == "flows[0].kind"


def test_a_flow_back_to_an_earlier_phase_is_refused():
    err = _refused(_chain(comp("a", phase=1), comp("b")))
    assert err.violations[0].field == "flows[1]"
    assert "goes back from phase 1" in err.message


@pytest.mark.parametrize(
    ("component", "field", "rule"),
    [
        (comp("a b"), "components[0].id", "must be 1-64"),
        (comp("a.b"), "components[0].id", "must be 1-64"),
        (comp("a", "mystery"), "components[0].kind", "not a library kind"),
        (comp("a", CUSTOM), "components[0].folding", "must be set"),
        (comp("a", "graph"), "components[0].subgraph", "must be set"),
    ],
)
def test_bad_components_are_refused_naming_the_field(component, field, rule):
    err = _refused(GraphSpec("g", components=(component,)))
    assert err.violations[0].field == field
    assert rule in err.message


def test_duplicate_ids_are_refused():
    err = _refused(GraphSpec("g", components=(comp("a", "file_input", params={}), comp("a"))))
    assert err.violations[0].field == "components[1].id"
    assert "declared twice" in err.message


def test_an_unknown_enum_number_from_the_wire_is_refused():
    pb = to_proto(_chain(comp("a")))
    pb.flows[0].kind = 7
    with pytest.raises(InvalidArgument) as err:
        from_proto(pb)
    assert err.value.violations[0].field == "flows[0].kind"


def test_custom_kinds_plan_with_their_declared_ports_and_folding():
    spec = _chain(
        comp(
            "a",
            CUSTOM,
            folding=Folding.ROOT_OR_INTERIOR,
            input_ports=("in",),
            output_ports=("out",),
        ),
        comp("b", CUSTOM, folding=Folding.NOT_FOLDABLE, input_ports=("in",), output_ports=("out",)),
    )
    assert plan_sets(spec) == [("a",), ("b",)]
