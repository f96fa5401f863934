"""What the planner knows of the component library: ports and folding per kind.

The metadata the seed keeps beside each component (§2.2.1: foldable or not,
may be a root and/or an interior member), held apart from the code that runs
the components (lightpath.graph.components) so the core broker can plan a
graph without importing it. Kinds outside the library ("package.module:Class",
user code) must give their ports and folding in the spec.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightpath.graph.spec import Folding

GRAPH_KIND = "graph"


@dataclass(frozen=True)
class KindInfo:
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    folding: Folding
    # Calls an external service: expands into "<id>.request" and "<id>.response"
    # halves, the response half being another root of the folded set (GF-5).
    split: bool = False
    summary: str = ""


LIBRARY: dict[str, KindInfo] = {
    "file_input": KindInfo(
        (), ("out",), Folding.ROOT_ONLY, summary="reads a tab-separated file (params: path)"
    ),
    "file_output": KindInfo(
        ("in",), (), Folding.ROOT_OR_INTERIOR, summary="writes a tab-separated file (params: path)"
    ),
    "filter": KindInfo(
        ("in",),
        ("out", "reject"),
        Folding.ROOT_OR_INTERIOR,
        summary="selects records (params: where='field op value'); the others go to reject",
    ),
    "reformat": KindInfo(
        ("in",),
        ("out",),
        Folding.ROOT_OR_INTERIOR,
        summary="keeps, renames, sets and case-maps fields (params: keep, rename, set, upper, lower)",
    ),
    "replicate": KindInfo(
        ("in",), ("out",), Folding.ROOT_OR_INTERIOR, summary="copies each record to every flow"
    ),
    "gather": KindInfo(
        ("in",), ("out",), Folding.ROOT_OR_INTERIOR, summary="merges the records of its flows"
    ),
    "hash_rollup": KindInfo(
        ("in",),
        ("out",),
        Folding.ROOT_OR_INTERIOR,
        summary="counts and sums per key, emitted at shutdown (params: key, sum)",
    ),
    "sort": KindInfo(
        ("in",),
        ("out",),
        Folding.ROOT_OR_INTERIOR,
        summary="sorts by key fields, emitted at shutdown (params: key, numeric, reverse)",
    ),
    "interface": KindInfo(
        ("in",),
        ("out",),
        Folding.NOT_FOLDABLE,
        summary="pipes records through an external program (params: command, fields)",
    ),
    "kv_lookup": KindInfo(
        ("in",),
        ("out",),
        Folding.ROOT_OR_INTERIOR,
        split=True,
        summary="adds a value fetched from a Redis server per record "
        "(params: redis_url, key_field, key_prefix, into, connections)",
    ),
}

REQUEST_HALF = "request"
RESPONSE_HALF = "response"


def is_custom_kind(kind: str) -> bool:
    """User code named as "package.module:Class"."""
    return ":" in kind
