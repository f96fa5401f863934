"""Ring validity in the style of NCCL's ring builder, checked against the
networkx graph of the fabric (not the router's own adjacency lists):

* each ring closes: hop k runs from processor k to processor k+1, the last hop back to the first;
* each ring visits every processor of its axis line exactly once, and each axis has one ring per line;
* each hop is a path of real links, each channel used in its direction;
* a path enters only processors of its two end groups or of the job's own whole
  groups (which forward, ¶60), never another job's processors;
* no channel (link direction) is in two rings, or twice in one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from lightpath.domain.switched import SwitchedFabric
from lightpath.domain.switched_rings import RingPlan


def expected_lines(plan: RingPlan) -> dict[tuple[str, tuple[int, int]], set[int]]:
    D, P, L = plan.degrees.as_tuple()
    A = plan.assignment
    idx = lambda d, p, l: A[(d * P + p) * L + l]  # noqa: E731, E741
    lines: dict[tuple[str, tuple[int, int]], set[int]] = {}
    if D > 1:
        for p in range(P):
            for l in range(L):  # noqa: E741
                lines[("data", (p, l))] = {idx(d, p, l) for d in range(D)}
    if P > 1:
        for d in range(D):
            for l in range(L):  # noqa: E741
                lines[("pipeline", (d, l))] = {idx(d, p, l) for p in range(P)}
    if L > 1:
        for d in range(D):
            for p in range(P):
                lines[("layer", (d, p))] = {idx(d, p, x) for x in range(L)}
    return lines


def plan_violations(
    fabric: SwitchedFabric, plan: RingPlan, forbidden: Iterable[int] = ()
) -> list[str]:
    bad: list[str] = []
    forbidden = set(forbidden)
    g = fabric.graph
    gs = fabric.group_size
    tile_procs = {p for t in plan.tiles for p in t.processors(fabric)}
    own_groups = {t.group for t in plan.tiles if t.size == gs}
    if len(plan.assignment) != plan.degrees.total or len(set(plan.assignment)) != len(
        plan.assignment
    ):
        bad.append("assignment is not one distinct processor per logical index")
    if not set(plan.assignment) <= tile_procs:
        bad.append("assignment leaves the job's tiles")
    lines = expected_lines(plan)
    got = {(r.axis, r.key) for r in plan.rings}
    if got != set(lines):
        bad.append(f"rings {sorted(got ^ set(lines))[:3]} missing or extra")
    for ring in plan.rings:
        procs = ring.processors
        n = len(procs)
        if len(set(procs)) != n:
            bad.append(f"{ring.name} visits a processor twice")
        if set(procs) != lines.get((ring.axis, ring.key), set()):
            bad.append(f"{ring.name} does not visit exactly its line's processors")
        if len(ring.hops) != n:
            bad.append(f"{ring.name} has {len(ring.hops)} hops for {n} processors (does not close)")
            continue
        for k, hop in enumerate(ring.hops):
            a, b = procs[k], procs[(k + 1) % n]
            if hop.nodes[0] != a or hop.nodes[-1] != b:
                bad.append(
                    f"{ring.name} hop {k} runs {hop.nodes[0]}->{hop.nodes[-1]}, not {a}->{b}"
                )
            if len(hop.channels) != len(hop.nodes) - 1 or len(hop.nodes) < 2:
                bad.append(
                    f"{ring.name} hop {k} has {len(hop.channels)} channels for {len(hop.nodes)} nodes"
                )
                continue
            ends = {a // gs, b // gs}
            for u, v, c in zip(hop.nodes[:-1], hop.nodes[1:], hop.channels, strict=True):
                if not g.has_edge(u, v) or (c >> 1) not in g.edges[u, v]["links"]:
                    bad.append(f"{ring.name} hop {k}: channel {c} is not a link {u}-{v}")
                elif fabric.channel_ends(c) != (u, v):
                    bad.append(f"{ring.name} hop {k}: channel {c} runs the other way")
            for x in hop.nodes[1:-1]:
                if x < fabric.processor_count:
                    if x // gs not in ends and x // gs not in own_groups:
                        bad.append(f"{ring.name} hop {k} crosses a third group's processor {x}")
                    if x in forbidden:
                        bad.append(f"{ring.name} hop {k} crosses another job's processor {x}")
    counts = Counter(plan.channels())
    twice = [c for c, k in counts.items() if k > 1]
    if twice:
        bad.append(f"{len(twice)} channels in two rings (first {twice[0]})")
    return bad


def assert_valid(fabric: SwitchedFabric, plan: RingPlan, forbidden: Iterable[int] = ()) -> None:
    bad = plan_violations(fabric, plan, forbidden)
    assert not bad, bad[:5]


def assert_disjoint(plans: Iterable[RingPlan]) -> None:
    counts = Counter(c for p in plans for c in p.channels())
    twice = [c for c, k in counts.items() if k > 1]
    assert not twice, f"{len(twice)} channels held by two rings"
