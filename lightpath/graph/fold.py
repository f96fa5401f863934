"""Folding: which components run together in one process (GF-2, GF-3, GF-4).

`fold(graph)` is the seed's process 400 (Fig. 4) as a pure, deterministic
function of the expanded graph:

- every component starts unassigned (402);
- the next root is the first unassigned component in topological order, so it
  is fed by an input dataset, by nothing, or only by assigned components (404);
- a non-foldable root is a set of its own (406);
- a foldable root's set grows, depth first from its members along their flows
  in declaration order, by every unassigned component that (408-412)
    * is foldable and may be interior (not ROOT_ONLY),
    * has the set's degree of parallelism and phase,
    * is fed by straight flows only, all of them from members of the set, so
      a multi-input component joins only once all its upstream components are
      members (seed claim 8), and
    * is not pinned apart from a member;
- until no unassigned component is left (414, 416).

Pins (GF-3): a TOGETHER pin contracts its components into one unit that is
assigned as a whole; it is refused (INVALID_ARGUMENT naming the pin) unless
the components could share a process: all foldable, one degree and phase,
straight flows between them, connected, and no path that leaves the group and
comes back. The two halves of a component that calls an external service are
such a unit by construction, the response half becoming a second root.
APART pins are honoured by never adding a component next to one it is
pinned apart from.

Where this differs from Flink's operator chaining: Flink chains an operator
to its predecessor only when it has exactly one input (in-degree 1) and the
predecessor one output edge; it never chains into a multi-input operator and
breaks the chain at every fan-out. Process 400 folds fan-out (replicate,
filter with two outputs: seed Fig. 2B puts 204A's both branches in one set)
and folds a multi-input component once all its upstream components are in
the set (the folded process buffers each input until all have data, GF-5).
Like Flink it needs equal parallelism and no repartitioning between members,
and like Flink's slot-sharing groups, phases keep sets apart.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from lightpath.errors import InvalidArgument
from lightpath.graph.expand import FlatGraph
from lightpath.graph.spec import Folding, PinKind


@dataclass(frozen=True)
class FoldedSet:
    """Components that run as one process per degree (seed Fig. 2B: 210, 211, 212)."""

    id: str
    members: tuple[str, ...]  # in the order process 400 added them
    roots: tuple[str, ...]
    degree: int
    phase: int
    foldable: bool

    @property
    def processes(self) -> int:
        return self.degree


@dataclass(frozen=True)
class GraphPlan:
    graph_id: str
    folded_sets: tuple[FoldedSet, ...]
    processes_before: int
    processes_after: int
    topological_order: tuple[str, ...]
    _by_component: dict[str, FoldedSet] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for s in self.folded_sets:
            for m in s.members:
                self._by_component[m] = s

    def set_of(self, component: str) -> FoldedSet:
        return self._by_component[component]

    @property
    def phases(self) -> list[int]:
        return sorted({s.phase for s in self.folded_sets})


@dataclass
class _Unit:
    """A component, or a TOGETHER group contracted into one node."""

    members: list[str]  # topological order
    foldable: bool
    degree: int
    phase: int
    # Flows from outside the unit into it.
    entry_flows: list
    # Every member fed from outside may be called by an upstream member.
    may_be_interior: bool
    first: int  # declaration index of its first member, for tie-breaks


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _units(g: FlatGraph) -> tuple[dict[str, _Unit], dict[str, str]]:
    """Contract TOGETHER pins and split halves; return units by key and component -> unit key."""
    uf = _UnionFind()
    pin_of: dict[str, str] = {}  # component -> path of the first TOGETHER pin naming it
    for req, resp in g.halves.items():
        uf.union(req, resp)
    for pin in g.pins:
        if pin.kind is PinKind.TOGETHER:
            for c in pin.components:
                pin_of.setdefault(c, pin.path)
                uf.union(pin.components[0], c)
    apart = _apart_pairs(g)
    position = {c: i for i, c in enumerate(g.order)}
    declared = {c: i for i, c in enumerate(g.components)}
    groups: dict[str, list[str]] = defaultdict(list)
    for c in g.order:
        groups[uf.find(c)].append(c)
    units: dict[str, _Unit] = {}
    unit_of: dict[str, str] = {}
    for key, members in groups.items():
        members.sort(key=position.__getitem__)
        where = next((pin_of[m] for m in members if m in pin_of), "")
        unit = _make_unit(g, members, where, apart)
        units[key] = unit
        for m in members:
            unit_of[m] = key
        unit.first = min(declared[m] for m in members)
    return units, unit_of


def _apart_pairs(g: FlatGraph) -> set[frozenset[str]]:
    pairs: set[frozenset[str]] = set()
    for pin in g.pins:
        if pin.kind is PinKind.APART:
            cs = list(dict.fromkeys(pin.components))
            for i, a in enumerate(cs):
                for b in cs[i + 1 :]:
                    pairs.add(frozenset((a, b)))
    return pairs


def _make_unit(
    g: FlatGraph, members: list[str], pin_path: str, apart: set[frozenset[str]]
) -> _Unit:
    inside = set(members)
    nodes = [g.components[m] for m in members]
    entry = [f for m in members for f in g.in_flows[m] if f.source.node not in inside]
    unit = _Unit(
        members=members,
        foldable=all(n.foldable for n in nodes),
        degree=nodes[0].degree,
        phase=nodes[0].phase,
        entry_flows=entry,
        may_be_interior=all(
            g.components[f.target.node].folding is Folding.ROOT_OR_INTERIOR for f in entry
        ),
        first=0,
    )
    if len(members) == 1:
        return unit
    split_pair = not pin_path  # only the halves of one split component, no user pin
    if split_pair:
        return unit
    at = f"{pin_path}.components"

    def refuse(rule: str) -> InvalidArgument:
        return InvalidArgument(at, f"{', '.join(members)} cannot fold together: {rule}")

    for n in nodes:
        if not n.foldable:
            raise refuse(f"{n.id} is not foldable")
        if n.degree != unit.degree:
            raise refuse(f"{n.id} has degree {n.degree}, {members[0]} degree {unit.degree}")
        if n.phase != unit.phase:
            raise refuse(f"{n.id} runs in phase {n.phase}, {members[0]} in phase {unit.phase}")
    for a in members:
        for b in members:
            if a < b and frozenset((a, b)) in apart:
                raise refuse(f"{a} and {b} are also pinned apart")
    for m in members:
        for f in g.in_flows[m]:
            if f.source.node in inside:
                if not f.straight:
                    raise refuse(f"the flow {f.name} repartitions")
                if g.components[m].folding is Folding.ROOT_ONLY:
                    raise refuse(f"{m} may only be a root but is fed by {f.source.node}")
    # Connected (ignoring direction) through flows and split halves.
    adjacency: dict[str, set[str]] = defaultdict(set)
    for m in members:
        for s in [*g.successors(m), *g.upstream(m)]:
            if s in inside:
                adjacency[m].add(s)
                adjacency[s].add(m)
    seen = {members[0]}
    stack = [members[0]]
    while stack:
        for nxt in adjacency[stack.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    if seen != inside:
        raise refuse(f"{', '.join(sorted(inside - seen))} not joined to the others by flows")
    # Convex: nothing downstream of the group leads back into it.
    outside_reach: set[str] = set()
    stack = [s for m in members for s in g.successors(m) if s not in inside]
    while stack:
        c = stack.pop()
        if c in inside:
            raise refuse(f"a path leaves the group and comes back into it at {c}")
        if c not in outside_reach:
            outside_reach.add(c)
            stack.extend(g.successors(c))
    return unit


def _unit_order(g: FlatGraph, units: dict[str, _Unit], unit_of: dict[str, str]) -> list[str]:
    """Topological order of the contracted graph; ties by declaration order."""
    import heapq

    indegree = dict.fromkeys(units, 0)
    succ: dict[str, set[str]] = defaultdict(set)
    for c in g.order:
        for s in g.successors(c):
            a, b = unit_of[c], unit_of[s]
            if a != b and b not in succ[a]:
                succ[a].add(b)
                indegree[b] += 1
    ready = [(units[k].first, k) for k, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    out: list[str] = []
    while ready:
        _, k = heapq.heappop(ready)
        out.append(k)
        for s in succ[k]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(ready, (units[s].first, s))
    assert len(out) == len(units), "contracted graph has a cycle: pins were not validated"
    return out


def fold(graph: FlatGraph) -> GraphPlan:
    """Process 400: greedy folding in topological order, honouring pins (GF-2, GF-3, GF-4)."""
    units, unit_of = _units(graph)
    apart = _apart_pairs(graph)
    assigned: dict[str, int] = {}  # unit key -> set index
    sets: list[FoldedSet] = []
    for key in _unit_order(graph, units, unit_of):
        if key in assigned:
            continue
        root = units[key]
        index = len(sets)
        members: list[str] = []
        member_set: set[str] = set()

        def add(k: str) -> None:
            assigned[k] = index  # noqa: B023 - the current set, on purpose
            members.extend(units[k].members)  # noqa: B023
            member_set.update(units[k].members)  # noqa: B023

        def addable(k: str) -> bool:
            u = units[k]
            return (
                k not in assigned
                and u.foldable
                and u.may_be_interior
                and u.degree == root.degree  # noqa: B023
                and u.phase == root.phase  # noqa: B023
                and all(f.straight and f.source.node in member_set for f in u.entry_flows)  # noqa: B023
                and not any(
                    frozenset((a, b)) in apart
                    for a in u.members
                    for b in member_set  # noqa: B023
                )
            )

        def grow(member: str) -> None:
            for f in graph.out_flows[member]:
                target = f.target.node
                if target in graph.components:
                    k = unit_of[target]
                    if addable(k):
                        add(k)
                        for m in units[k].members:
                            grow(m)

        add(key)
        if root.foldable:
            for m in list(root.members):
                grow(m)
        sets.append(
            FoldedSet(
                id=f"set-{index}",
                members=tuple(members),
                roots=tuple(
                    m
                    for m in members
                    if not any(f.source.node in member_set for f in graph.in_flows[m])
                ),
                degree=root.degree,
                phase=root.phase,
                foldable=root.foldable,
            )
        )
    return _plan(graph, sets)


def _plan(graph: FlatGraph, sets: list[FoldedSet]) -> GraphPlan:
    return GraphPlan(
        graph_id=graph.graph_id,
        folded_sets=tuple(sets),
        processes_before=processes_unfolded(graph),
        processes_after=sum(s.processes for s in sets),
        topological_order=graph.order,
    )


def processes_unfolded(graph: FlatGraph) -> int:
    """One process per component instance as declared (a split component is one component)."""
    return sum(n.degree for n in graph.components.values() if n.half != "response")


def unfold(graph: FlatGraph) -> GraphPlan:
    """The baseline the seed contrasts (§2.1): one process per component instance.

    The halves of a split component stay in one process: they are one
    component. Pins do not apply.
    """
    sets: list[FoldedSet] = []
    for c in graph.order:
        node = graph.components[c]
        if node.half == "response":
            continue
        members = (c, graph.halves[c]) if c in graph.halves else (c,)
        sets.append(
            FoldedSet(
                id=f"set-{len(sets)}",
                members=members,
                roots=members,
                degree=node.degree,
                phase=node.phase,
                foldable=node.foldable,
            )
        )
    return _plan(graph, sets)


_SET_FIELDS = ("id", "members", "roots", "degree", "phase", "foldable")


def plan_to_proto(plan: GraphPlan):  # -> graph_pb2.GraphPlan
    from lightpath.v1 import graph_pb2

    return graph_pb2.GraphPlan(
        graph_id=plan.graph_id,
        folded_sets=[
            graph_pb2.FoldedSet(processes=s.processes, **{f: getattr(s, f) for f in _SET_FIELDS})
            for s in plan.folded_sets
        ],
        processes_before=plan.processes_before,
        processes_after=plan.processes_after,
        topological_order=list(plan.topological_order),
    )


def plan_from_proto(pb) -> GraphPlan:  # pb: graph_pb2.GraphPlan
    def value(s, f: str):
        v = getattr(s, f)
        return tuple(v) if f in ("members", "roots") else v

    return GraphPlan(
        graph_id=pb.graph_id,
        folded_sets=tuple(
            FoldedSet(**{f: value(s, f) for f in _SET_FIELDS}) for s in pb.folded_sets
        ),
        processes_before=pb.processes_before,
        processes_after=pb.processes_after,
        topological_order=tuple(pb.topological_order),
    )
