"""The graph specification as domain objects, and its protobuf form (GF-1).

A graph is components joined by flows; a flow goes from an output port of one
node to an input port of another, a node being a component or a dataset (the
graph's files, seed Fig. 2A: 202 in, 206A-C out). `GraphSpec` mirrors
`lightpath.v1.GraphSpec` field for field; `from_proto` / `to_proto` convert,
and `load_spec` reads the protobuf JSON form a user writes by hand.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightpath.v1 import graph_pb2


class Folding(enum.IntEnum):
    """How a component may take part in folding (seed 004 §2.2.1)."""

    UNSPECIFIED = 0  # the kind's default
    ROOT_OR_INTERIOR = 1
    ROOT_ONLY = 2
    NOT_FOLDABLE = 3


class FlowKind(enum.IntEnum):
    STRAIGHT = 1
    REPARTITION = 2


class PinKind(enum.IntEnum):
    TOGETHER = 1
    APART = 2


@dataclass(frozen=True)
class Endpoint:
    """A port of a component, or a dataset (`port` empty)."""

    node: str
    port: str = ""

    def __str__(self) -> str:
        return f"{self.node}.{self.port}" if self.port else self.node


@dataclass(frozen=True)
class FlowSpec:
    source: Endpoint
    target: Endpoint
    kind: FlowKind = FlowKind.STRAIGHT
    partition_key: str = ""

    def __str__(self) -> str:
        return flow_name(self.source, self.target, self.kind)


def flow_name(source: Endpoint, target: Endpoint, kind: FlowKind) -> str:
    """ "204A.out -> 204B.in"; "=>" marks a repartitioning flow."""
    return f"{source} {'=>' if kind is FlowKind.REPARTITION else '->'} {target}"


def flow(
    source: str, target: str, kind: FlowKind = FlowKind.STRAIGHT, partition_key: str = ""
) -> FlowSpec:
    """A flow from "node:port" to "node:port" (port optional): `flow("204A:reject", "204C")`."""

    def end(text: str) -> Endpoint:
        node, _, port = text.partition(":")
        return Endpoint(node, port)

    return FlowSpec(end(source), end(target), kind, partition_key)


@dataclass(frozen=True)
class DatasetSpec:
    """Tab-separated records with a header line; `{part}` in `path` numbers partitions."""

    id: str
    path: str
    partitions: int = 1

    def partition_path(self, part: int) -> str:
        return self.path.replace("{part}", str(part)) if self.partitions > 1 else self.path


@dataclass(frozen=True)
class PortBinding:
    port: str
    inner: Endpoint


@dataclass(frozen=True)
class SubGraphSpec:
    graph: GraphSpec
    inputs: tuple[PortBinding, ...] = ()
    outputs: tuple[PortBinding, ...] = ()


@dataclass(frozen=True)
class ComponentSpec:
    id: str
    kind: str
    folding: Folding = Folding.UNSPECIFIED
    # 0: serial at the top level, the enclosing graph component's degree inside a sub-graph.
    degree: int = 0
    phase: int = 0
    params: Mapping[str, str] = field(default_factory=dict)
    input_ports: tuple[str, ...] = ()
    output_ports: tuple[str, ...] = ()
    subgraph: SubGraphSpec | None = None


@dataclass(frozen=True)
class PinSpec:
    kind: PinKind
    components: tuple[str, ...]


@dataclass(frozen=True)
class GraphSpec:
    graph_id: str
    components: tuple[ComponentSpec, ...] = ()
    flows: tuple[FlowSpec, ...] = ()
    datasets: tuple[DatasetSpec, ...] = ()
    pins: tuple[PinSpec, ...] = ()


# ---------------------------------------------------------------- protobuf


def _enum(cls, value: int, path: str, default=None):
    if value == 0 and default is not None:
        return default
    try:
        return cls(value)
    except ValueError:
        from lightpath.errors import InvalidArgument

        raise InvalidArgument(path, f"{value} is not a known {cls.__name__}") from None


def _endpoint_from(pb: graph_pb2.GraphEndpoint) -> Endpoint:
    return Endpoint(pb.node, pb.port)


def _bindings(pbs) -> tuple[PortBinding, ...]:
    return tuple(PortBinding(b.port, _endpoint_from(b.inner)) for b in pbs)


def from_proto(pb: graph_pb2.GraphSpec, path: str = "") -> GraphSpec:
    """Domain form of a `lightpath.v1.GraphSpec`; an unknown enum number is
    INVALID_ARGUMENT here, every other rule is checked by `expand`."""
    components = []
    for i, c in enumerate(pb.components):
        at = f"{path}components[{i}]"
        components.append(
            ComponentSpec(
                id=c.id,
                kind=c.kind,
                folding=_enum(Folding, c.folding, f"{at}.folding", Folding.UNSPECIFIED),
                degree=c.degree,
                phase=c.phase,
                params=dict(c.params),
                input_ports=tuple(c.input_ports),
                output_ports=tuple(c.output_ports),
                subgraph=SubGraphSpec(
                    graph=from_proto(c.subgraph.graph, f"{at}.subgraph.graph."),
                    inputs=_bindings(c.subgraph.inputs),
                    outputs=_bindings(c.subgraph.outputs),
                )
                if c.HasField("subgraph")
                else None,
            )
        )
    return GraphSpec(
        graph_id=pb.graph_id,
        components=tuple(components),
        flows=tuple(
            FlowSpec(
                _endpoint_from(f.source),
                _endpoint_from(f.target),
                _enum(FlowKind, f.kind, f"{path}flows[{i}].kind", FlowKind.STRAIGHT),
                f.partition_key,
            )
            for i, f in enumerate(pb.flows)
        ),
        datasets=tuple(DatasetSpec(d.id, d.path, d.partitions or 1) for d in pb.datasets),
        pins=tuple(
            PinSpec(_enum(PinKind, p.kind, f"{path}pins[{i}].kind"), tuple(p.components))
            for i, p in enumerate(pb.pins)
        ),
    )


def to_proto(spec: GraphSpec) -> graph_pb2.GraphSpec:
    from lightpath.v1 import graph_pb2

    def endpoint(e: Endpoint) -> graph_pb2.GraphEndpoint:
        return graph_pb2.GraphEndpoint(node=e.node, port=e.port)

    def component(c: ComponentSpec) -> graph_pb2.Component:
        pb = graph_pb2.Component(
            id=c.id,
            kind=c.kind,
            folding=int(c.folding),  # type: ignore[arg-type]
            degree=c.degree,
            phase=c.phase,
            params=dict(c.params),
            input_ports=list(c.input_ports),
            output_ports=list(c.output_ports),
        )
        if c.subgraph is not None:
            pb.subgraph.graph.CopyFrom(to_proto(c.subgraph.graph))
            pb.subgraph.inputs.extend(
                graph_pb2.PortBinding(port=b.port, inner=endpoint(b.inner))
                for b in c.subgraph.inputs
            )
            pb.subgraph.outputs.extend(
                graph_pb2.PortBinding(port=b.port, inner=endpoint(b.inner))
                for b in c.subgraph.outputs
            )
        return pb

    return graph_pb2.GraphSpec(
        graph_id=spec.graph_id,
        components=[component(c) for c in spec.components],
        flows=[
            graph_pb2.Flow(
                source=endpoint(f.source),
                target=endpoint(f.target),
                kind=int(f.kind),  # type: ignore[arg-type]
                partition_key=f.partition_key,
            )
            for f in spec.flows
        ],
        datasets=[
            graph_pb2.Dataset(id=d.id, path=d.path, partitions=d.partitions) for d in spec.datasets
        ],
        pins=[
            graph_pb2.Pin(kind=int(p.kind), components=list(p.components))  # type: ignore[arg-type]
            for p in spec.pins
        ],
    )


def load_spec(path: str | Path) -> GraphSpec:
    """Read a graph from the protobuf JSON form (`lightpath.v1.GraphSpec`).

    A malformed file raises InvalidArgument naming the file and what the
    parser saw.
    """
    from google.protobuf import json_format

    from lightpath.errors import InvalidArgument
    from lightpath.v1 import graph_pb2

    text = Path(path).read_text()
    try:
        pb = json_format.Parse(text, graph_pb2.GraphSpec())
    except json_format.ParseError as exc:
        raise InvalidArgument(str(path), f"is not a lightpath.v1.GraphSpec in JSON: {exc}") from exc
    return from_proto(pb)


def dump_spec(spec: GraphSpec) -> str:
    """The protobuf JSON form `load_spec` reads."""
    from google.protobuf import json_format

    return json_format.MessageToJson(to_proto(spec), preserving_proto_field_name=True, indent=2)
