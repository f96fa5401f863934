"""From a graph spec to the flat, validated graph that folding and execution use (GF-1).

`expand(spec)` does, in order:

1. expands components that are graphs into their inner components, named
   "<outer>.<inner>" (so a folded set may cross the sub-graph's boundary, as the
   seed's process 400 allows);
2. splits each component that calls an external service (kind metadata
   `split`) into "<id>.request" and "<id>.response" halves (GF-5): the request
   half takes the component's inputs, the response half its outputs, and the
   two always share a process;
3. validates: ids, kinds, ports (no flow to a port that does not exist, no
   input port without a flow), straight flows only between equal degrees,
   phases never going backwards, no cycles. Every refusal is InvalidArgument
   naming the offending component or flow by its field path in the spec.

The result's `order` is a deterministic topological order: Kahn's algorithm,
ties broken by declaration order.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from lightpath.errors import InvalidArgument
from lightpath.graph.kinds import (
    GRAPH_KIND,
    LIBRARY,
    REQUEST_HALF,
    RESPONSE_HALF,
    is_custom_kind,
)
from lightpath.graph.spec import (
    ComponentSpec,
    DatasetSpec,
    Endpoint,
    FlowKind,
    FlowSpec,
    Folding,
    GraphSpec,
    PinKind,
    flow_name,
)

_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_GRAPH_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
ID_RULE = "must be 1-64 characters of A-Z a-z 0-9 _ - ('.' joins sub-graph ids)"


@dataclass(frozen=True)
class Node:
    """One component of the expanded graph."""

    id: str
    kind: str
    folding: Folding  # resolved: never UNSPECIFIED
    degree: int
    phase: int
    params: Mapping[str, str]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    # "", or which half of a split component this is (REQUEST_HALF / RESPONSE_HALF).
    half: str = ""
    # The component as the user declared it: its id before the split.
    origin: str = ""
    # Field path of the declaration in the spec, for error messages.
    path: str = ""

    @property
    def foldable(self) -> bool:
        return self.folding is not Folding.NOT_FOLDABLE


@dataclass(frozen=True)
class Flow:
    """One flow of the expanded graph; `index` is its position in `FlatGraph.flows`."""

    index: int
    source: Endpoint
    target: Endpoint
    kind: FlowKind
    partition_key: str
    path: str

    @property
    def straight(self) -> bool:
        return self.kind is FlowKind.STRAIGHT

    @property
    def name(self) -> str:
        return flow_name(self.source, self.target, self.kind)


@dataclass(frozen=True)
class Pin:
    kind: PinKind
    components: tuple[str, ...]
    path: str


@dataclass
class FlatGraph:
    graph_id: str
    components: dict[str, Node]
    datasets: dict[str, DatasetSpec]
    flows: tuple[Flow, ...]
    pins: tuple[Pin, ...]
    # request half id -> response half id.
    halves: dict[str, str]
    order: tuple[str, ...] = ()
    in_flows: dict[str, list[Flow]] = field(default_factory=dict)
    out_flows: dict[str, list[Flow]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for node in (*self.components, *self.datasets):
            self.in_flows.setdefault(node, [])
            self.out_flows.setdefault(node, [])
        for f in self.flows:  # unknown nodes are refused by validation, not here
            self.out_flows.setdefault(f.source.node, []).append(f)
            self.in_flows.setdefault(f.target.node, []).append(f)

    def degree_of(self, node: str) -> int:
        if node in self.components:
            return self.components[node].degree
        return self.datasets[node].partitions

    def upstream(self, component: str) -> list[str]:
        """Components and datasets feeding `component`, plus the request half of a response half."""
        ups = [f.source.node for f in self.in_flows[component]]
        ups.extend(r for r, resp in self.halves.items() if resp == component)
        return ups

    def successors(self, component: str) -> list[str]:
        """Components fed by `component` (flows, then the response half of a request half)."""
        succ = [
            f.target.node for f in self.out_flows[component] if f.target.node in self.components
        ]
        if component in self.halves:
            succ.append(self.halves[component])
        return succ


# ---------------------------------------------------------------- expansion


@dataclass
class _Builder:
    components: dict[str, Node] = field(default_factory=dict)
    datasets: dict[str, tuple[DatasetSpec, str]] = field(default_factory=dict)
    flows: list[tuple[FlowSpec, str]] = field(default_factory=list)
    pins: list[Pin] = field(default_factory=list)
    halves: dict[str, str] = field(default_factory=dict)
    # For split components: original id -> (request id, response id).
    split: dict[str, tuple[str, str]] = field(default_factory=dict)


def _ports(c: ComponentSpec, path: str) -> tuple[tuple[str, ...], tuple[str, ...], Folding]:
    if c.kind == GRAPH_KIND:
        raise AssertionError("graph components have no ports of their own")
    info = LIBRARY.get(c.kind)
    if info is None:
        if not is_custom_kind(c.kind):
            known = ", ".join(sorted([*LIBRARY, GRAPH_KIND]))
            raise InvalidArgument(
                f"{path}.kind",
                f'"{c.kind}" is not a library kind ({known}) nor user code named "module:Class"',
            )
        if c.folding is Folding.UNSPECIFIED:
            raise InvalidArgument(
                f"{path}.folding", f'must be set for "{c.kind}", a kind outside the library'
            )
        return c.input_ports, c.output_ports, c.folding
    inputs = c.input_ports or info.inputs
    outputs = c.output_ports or info.outputs
    folding = c.folding if c.folding is not Folding.UNSPECIFIED else info.folding
    return inputs, outputs, folding


def _check_ports(ports: tuple[str, ...], path: str) -> None:
    if len(set(ports)) != len(ports):
        raise InvalidArgument(path, "names a port twice")
    for p in ports:
        if not _ID.match(p):
            raise InvalidArgument(path, f'port "{p}" {ID_RULE}')


def _expand_into(
    b: _Builder,
    spec: GraphSpec,
    prefix: str,
    path: str,
    outer_degree: int,
    outer_phase: int,
) -> dict[str, ComponentSpec]:
    """Add `spec`'s nodes and flows to `b` with ids prefixed; return its graph components by local id."""
    local_ids: set[str] = set()
    graphs: dict[str, ComponentSpec] = {}

    def claim(local: str, at: str) -> str:
        if not _ID.match(local):
            raise InvalidArgument(at, f'"{local}" {ID_RULE}')
        if local in local_ids:
            raise InvalidArgument(at, f'"{local}" is declared twice')
        local_ids.add(local)
        full = prefix + local
        if full in b.components or full in b.datasets:
            raise InvalidArgument(at, f'"{full}" collides with another expanded id')
        return full

    for i, d in enumerate(spec.datasets):
        at = f"{path}datasets[{i}]"
        full = claim(d.id, f"{at}.id")
        if not d.path:
            raise InvalidArgument(f"{at}.path", "must name a file")
        if d.partitions > 1 and "{part}" not in d.path:
            raise InvalidArgument(
                f"{at}.path", f"must hold {{part}} for a dataset of {d.partitions} partitions"
            )
        b.datasets[full] = (DatasetSpec(full, d.path, d.partitions), at)

    for i, c in enumerate(spec.components):
        at = f"{path}components[{i}]"
        full = claim(c.id, f"{at}.id")
        if c.degree < 0:
            raise InvalidArgument(f"{at}.degree", "must be 0 (serial) or more")
        degree = c.degree or outer_degree
        phase = c.phase + outer_phase
        if c.kind == GRAPH_KIND:
            if c.subgraph is None:
                raise InvalidArgument(f"{at}.subgraph", 'must be set for kind "graph"')
            graphs[c.id] = c
            _expand_into(b, c.subgraph.graph, full + ".", f"{at}.subgraph.graph.", degree, phase)
            continue
        if c.subgraph is not None:
            raise InvalidArgument(f"{at}.subgraph", f'is only for kind "graph", not "{c.kind}"')
        inputs, outputs, folding = _ports(c, at)
        _check_ports(inputs, f"{at}.input_ports")
        _check_ports(outputs, f"{at}.output_ports")
        info = LIBRARY.get(c.kind)
        if info is not None and info.split:
            req, resp = f"{full}.{REQUEST_HALF}", f"{full}.{RESPONSE_HALF}"
            b.components[req] = Node(
                req, c.kind, folding, degree, phase, dict(c.params), inputs, (),
                REQUEST_HALF, full, at,
            )  # fmt: skip
            resp_folding = Folding.ROOT_ONLY if folding is not Folding.NOT_FOLDABLE else folding
            b.components[resp] = Node(
                resp, c.kind, resp_folding, degree, phase, dict(c.params), (), outputs,
                RESPONSE_HALF, full, at,
            )  # fmt: skip
            b.halves[req] = resp
            b.split[full] = (req, resp)
        else:
            b.components[full] = Node(
                full, c.kind, folding, degree, phase, dict(c.params), inputs, outputs, "", full, at
            )

    # Ports of graph components: their bindings.
    def graph_ports(c: ComponentSpec) -> tuple[set[str], set[str]]:
        assert c.subgraph is not None
        return {x.port for x in c.subgraph.inputs}, {x.port for x in c.subgraph.outputs}

    for i, c in enumerate(spec.components):
        if c.kind != GRAPH_KIND or c.subgraph is None:
            continue
        at = f"{path}components[{i}].subgraph"
        seen_out: set[str] = set()
        for j, x in enumerate(c.subgraph.outputs):
            if x.port in seen_out:
                raise InvalidArgument(f"{at}.outputs[{j}].port", f'"{x.port}" is bound twice')
            seen_out.add(x.port)

    for i, f in enumerate(spec.flows):
        at = f"{path}flows[{i}]"
        sources = _resolve(b, graphs, prefix, f.source, "source", at, graph_ports)
        targets = _resolve(b, graphs, prefix, f.target, "target", at, graph_ports)
        for s in sources:
            for t in targets:
                b.flows.append((FlowSpec(s, t, f.kind, f.partition_key), at))

    for i, p in enumerate(spec.pins):
        at = f"{path}pins[{i}]"
        b.pins.append(Pin(p.kind, tuple(prefix + c for c in p.components), at))
    return graphs


def _resolve(
    b: _Builder,
    graphs: dict[str, ComponentSpec],
    prefix: str,
    end: Endpoint,
    side: str,
    at: str,
    graph_ports,
) -> list[Endpoint]:
    """The expanded endpoint(s) a flow end names: through sub-graph bindings and split halves."""
    local = end.node
    if local in graphs:
        c = graphs[local]
        assert c.subgraph is not None
        ins, outs = graph_ports(c)
        bindings = c.subgraph.inputs if side == "target" else c.subgraph.outputs
        ports = ins if side == "target" else outs
        if end.port not in ports:
            raise InvalidArgument(
                f"{at}.{side}.port",
                f"{prefix}{local} has no {'input' if side == 'target' else 'output'} port "
                f'"{end.port}" (it has: {", ".join(sorted(ports)) or "none"})',
            )
        inner_prefix = f"{prefix}{local}."
        inner_graphs = {
            x.id: x for x in c.subgraph.graph.components if x.kind == GRAPH_KIND and x.subgraph
        }
        found: list[Endpoint] = []
        for x in bindings:
            if x.port == end.port:
                found.extend(
                    _resolve(b, inner_graphs, inner_prefix, x.inner, side, at, graph_ports)
                )
        return found
    full = prefix + local
    if full in b.split:
        req, resp = b.split[full]
        full = req if side == "target" else resp
    return [Endpoint(full, end.port)]


def expand(spec: GraphSpec) -> FlatGraph:
    """Expand and validate `spec` (GF-1); InvalidArgument names what is wrong."""
    if not _GRAPH_ID.match(spec.graph_id):
        raise InvalidArgument("graph_id", "must be 1-64 characters of A-Z a-z 0-9 . _ -")
    b = _Builder()
    _expand_into(b, spec, "", "", 1, 0)
    if not b.components:
        raise InvalidArgument("components", "must hold at least one component")
    flows = tuple(
        Flow(i, f.source, f.target, f.kind, f.partition_key, at)
        for i, (f, at) in enumerate(b.flows)
    )
    graph = FlatGraph(
        graph_id=spec.graph_id,
        components=b.components,
        datasets={k: d for k, (d, _) in b.datasets.items()},
        flows=flows,
        pins=tuple(b.pins),
        halves=b.halves,
    )
    _validate_flows(graph, {k: at for k, (_, at) in b.datasets.items()})
    _validate_pins(graph)
    graph.order = _topological_order(graph)
    return graph


def _validate_flows(g: FlatGraph, dataset_paths: dict[str, str]) -> None:
    for f in g.flows:
        for side, end in (("source", f.source), ("target", f.target)):
            if end.node in g.datasets:
                if end.port:
                    raise InvalidArgument(
                        f"{f.path}.{side}.port", f'must be empty: "{end.node}" is a dataset'
                    )
                continue
            node = g.components.get(end.node)
            if node is None:
                raise InvalidArgument(
                    f"{f.path}.{side}.node", f'"{end.node}" is no component or dataset'
                )
            ports = node.outputs if side == "source" else node.inputs
            word = "output" if side == "source" else "input"
            if not end.port:
                if len(ports) != 1:
                    raise InvalidArgument(
                        f"{f.path}.{side}.port",
                        f"must name one of {end.node}'s {word} ports "
                        f"({', '.join(ports) or 'it has none'})",
                    )
                continue
            if end.port not in ports:
                raise InvalidArgument(
                    f"{f.path}.{side}.port",
                    f'{end.node} has no {word} port "{end.port}" '
                    f"(it has: {', '.join(ports) or 'none'})",
                )
    # Fill in the implied port names, so later stages see one spelling.
    g.flows = tuple(
        Flow(
            f.index,
            _full_port(g, f.source, "source"),
            _full_port(g, f.target, "target"),
            f.kind,
            f.partition_key,
            f.path,
        )
        for f in g.flows
    )
    g.in_flows.clear()
    g.out_flows.clear()
    g.__post_init__()

    for f in g.flows:
        s, t = f.source.node, f.target.node
        if s in g.datasets and t in g.datasets:
            raise InvalidArgument(
                f.path, f"joins two datasets ({s}, {t}); a flow needs a component"
            )
        if f.kind is FlowKind.REPARTITION:
            if s in g.datasets or t in g.datasets:
                raise InvalidArgument(
                    f"{f.path}.kind",
                    "a dataset is read and written by straight flows; "
                    "use a file_input or file_output component to repartition",
                )
        elif f.partition_key:
            raise InvalidArgument(f"{f.path}.partition_key", "is only for a REPARTITION flow")
        if f.straight and g.degree_of(s) != g.degree_of(t):
            raise InvalidArgument(
                f.path,
                f"straight flow {f.name} joins degree {g.degree_of(s)} to degree "
                f"{g.degree_of(t)}; a straight flow keeps the partitioning, so the degrees must "
                "match (or make it a REPARTITION flow)",
            )
        if s in g.components and t in g.components:
            ps, pt = g.components[s].phase, g.components[t].phase
            if pt < ps:
                raise InvalidArgument(
                    f.path, f"goes back from phase {ps} ({s}) to phase {pt} ({t})"
                )

    for d in g.datasets:
        if g.in_flows[d] and g.out_flows[d]:
            raise InvalidArgument(
                dataset_paths[d], f'"{d}" is both written and read; use two datasets'
            )
        if len(g.in_flows[d]) > 1:
            raise InvalidArgument(dataset_paths[d], f'"{d}" is written by more than one flow')

    for node in g.components.values():
        fed = {f.target.port for f in g.in_flows[node.id]}
        for port in node.inputs:
            if port not in fed:
                raise InvalidArgument(
                    node.path, f'{node.id}: input port "{port}" has no flow (dangling port)'
                )


def _full_port(g: FlatGraph, end: Endpoint, side: str) -> Endpoint:
    if end.port or end.node in g.datasets:
        return end
    node = g.components[end.node]
    return Endpoint(end.node, (node.outputs if side == "source" else node.inputs)[0])


def _validate_pins(g: FlatGraph) -> None:
    for pin in g.pins:
        if len(set(pin.components)) < 2:
            raise InvalidArgument(
                f"{pin.path}.components", "must name at least two different components"
            )
        for c in pin.components:
            if c not in g.components:
                hint = ""
                if f"{c}.{REQUEST_HALF}" in g.components:
                    hint = f" (it is split: pin {c}.{REQUEST_HALF} or {c}.{RESPONSE_HALF})"
                raise InvalidArgument(f"{pin.path}.components", f'"{c}" is no component{hint}')


def _topological_order(g: FlatGraph) -> tuple[str, ...]:
    index = {c: i for i, c in enumerate(g.components)}
    indegree = {c: 0 for c in g.components}
    for c in g.components:
        for s in g.successors(c):
            indegree[s] += 1
    ready = [(index[c], c) for c, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, c = heapq.heappop(ready)
        order.append(c)
        for s in g.successors(c):
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(ready, (index[s], s))
    if len(order) == len(g.components):
        return tuple(order)
    raise _cycle_error(g, [c for c in g.components if indegree[c] > 0])


def _cycle_error(g: FlatGraph, stuck: list[str]) -> InvalidArgument:
    """Name one cycle among the components Kahn's algorithm could not order.

    Each of them still waits for an upstream component that is stuck too, so
    walking upstream from any of them must come back to a component seen.
    """
    stuck_set = set(stuck)
    path: list[str] = []
    on_path: dict[str, int] = {}
    node = stuck[0]
    while node not in on_path:
        on_path[node] = len(path)
        path.append(node)
        node = next(u for u in g.upstream(node) if u in stuck_set)
    ring = list(reversed(path[on_path[node] :]))  # each feeds the next, the last the first
    # Blame the cycle's last-declared flow: most likely the one just added.
    edges = []
    for i, a in enumerate(ring):
        b = ring[(i + 1) % len(ring)]
        f = max(
            (f for f in g.out_flows[a] if f.target.node == b), key=lambda f: f.index, default=None
        )
        edges.append((f.index if f else -1, i, f))
    _, i, closing = max(edges, key=lambda e: e[0])
    ring = ring[i + 1 :] + ring[: i + 1]  # ... -> source of the closing flow
    cycle = [*ring, ring[0]]
    where = closing.path if closing else g.components[ring[-1]].path
    return InvalidArgument(
        where, "closes a cycle " + " -> ".join(cycle) + "; a graph must be a DAG"
    )
