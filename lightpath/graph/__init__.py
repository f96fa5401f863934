"""Dataflow graphs folded into few processes (GF-1 … GF-7; seed 004).

The client SDK: describe a graph (`GraphSpec`, or JSON in the protobuf form),
plan it (`expand` validates, `fold` is process 400), run it (`run_graph`,
folded or one process per component) and read per-component metrics.

    from lightpath.graph import expand, fold, run_graph, load_spec
    plan = fold(expand(load_spec("graph.json")))
    result = run_graph(load_spec("graph.json"))
"""

from lightpath.graph.expand import FlatGraph, expand
from lightpath.graph.fold import FoldedSet, GraphPlan, fold, unfold
from lightpath.graph.runner import GraphRunError, RunResult, run_graph
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
    dump_spec,
    load_spec,
)

__all__ = [
    "ComponentSpec",
    "DatasetSpec",
    "Endpoint",
    "FlatGraph",
    "FlowKind",
    "FlowSpec",
    "FoldedSet",
    "Folding",
    "GraphPlan",
    "GraphRunError",
    "GraphSpec",
    "PinKind",
    "PinSpec",
    "RunResult",
    "dump_spec",
    "expand",
    "fold",
    "load_spec",
    "run_graph",
    "unfold",
]
