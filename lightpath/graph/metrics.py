"""Per-component and per-flow usage of a graph run, folded or not (GF-6).

`aggregate` combines the reports of every process of a run into one
`RunMetrics`: flows summed over instances (each counted by the process that
produced it), each process's CPU split among its members (monitor.split_cpu),
records and bytes in and out of each component taken from its flows. The
numbers describe the graph's logical components whichever way it ran (seed
§3: "similar running characteristics" folded or one process per component).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from lightpath.graph.executor import ExecutorReport
from lightpath.graph.expand import FlatGraph
from lightpath.graph.fold import GraphPlan
from lightpath.graph.monitor import split_cpu
from lightpath.graph.spec import Endpoint, FlowKind, flow_name

if TYPE_CHECKING:
    from lightpath.v1 import graph_pb2


@dataclass
class ComponentUsage:
    component: str
    folded_set: str
    records_in: int = 0
    records_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    cpu_seconds: float = 0.0
    cpu_seconds_sampled: float = 0.0
    cpu_seconds_timed: float = 0.0
    cpu_method: str = ""
    calls: int = 0
    timed_calls: int = 0
    samples: int = 0


@dataclass
class FlowUsage:
    source: Endpoint
    target: Endpoint
    kind: FlowKind
    partition_key: str
    records: int = 0
    bytes: int = 0
    crosses_processes: bool = False

    @property
    def name(self) -> str:
        return flow_name(self.source, self.target, self.kind)


@dataclass
class ProcessUsage:
    folded_set: str
    instance: int
    cpu_seconds: float
    peak_rss_mb: float
    channel_bytes: int
    samples: int


@dataclass
class RunMetrics:
    graph_id: str
    run_id: str
    folded: bool
    components: list[ComponentUsage] = field(default_factory=list)
    flows: list[FlowUsage] = field(default_factory=list)
    processes: list[ProcessUsage] = field(default_factory=list)
    wall_seconds: float = 0.0
    startup_seconds: float = 0.0
    records_read: int = 0

    def component(self, component_id: str) -> ComponentUsage:
        return next(c for c in self.components if c.component == component_id)

    @property
    def peak_rss_mb(self) -> float:
        """The run's memory footprint: the peak RSS of its processes, summed."""
        return sum(p.peak_rss_mb for p in self.processes)


def aggregate(
    graph: FlatGraph,
    plan: GraphPlan,
    reports: Iterable[ExecutorReport],
    *,
    run_id: str,
    folded: bool,
    wall_seconds: float = 0.0,
    startup_seconds: float = 0.0,
) -> RunMetrics:
    reports = list(reports)
    flows = [FlowUsage(f.source, f.target, f.kind, f.partition_key) for f in graph.flows]
    usage = {c: ComponentUsage(c, plan.set_of(c).id) for c in graph.order}
    processes = []
    for r in reports:
        for i, fr in r.flows.items():
            flows[i].records += fr["records"]
            flows[i].bytes += fr["bytes"]
            flows[i].crosses_processes = flows[i].crosses_processes or fr["crosses"]
        split = split_cpu(
            r.cpu_seconds,
            {m: v["samples"] for m, v in r.members.items()},
            {m: v["estimate_ns"] for m, v in r.members.items()},
            r.members,
        )
        for m, v in r.members.items():
            u = usage[m]
            u.calls += v["calls"]
            u.timed_calls += v["timed_calls"]
            u.samples += v["samples"]
            u.cpu_seconds += split[m].chosen
            u.cpu_seconds_sampled += split[m].sampled
            u.cpu_seconds_timed += split[m].timed
            u.cpu_method = _merge_method(u.cpu_method, split[m].method)
        processes.append(
            ProcessUsage(
                r.set_id, r.instance, r.cpu_seconds, r.peak_rss_mb, r.channel_bytes, r.samples
            )
        )
    # A flow between sets is seen by its producer only, so crossing flows of
    # sets that produced nothing stay marked by the plan.
    for f, fu in zip(graph.flows, flows, strict=True):
        s, t = f.source.node, f.target.node
        if s in graph.components and t in graph.components:
            fu.crosses_processes = plan.set_of(s).id != plan.set_of(t).id
        if s in usage:
            usage[s].records_out += fu.records
            usage[s].bytes_out += fu.bytes
        if t in usage:
            usage[t].records_in += fu.records
            usage[t].bytes_in += fu.bytes
    return RunMetrics(
        graph_id=graph.graph_id,
        run_id=run_id,
        folded=folded,
        components=list(usage.values()),
        flows=flows,
        processes=sorted(processes, key=lambda p: (p.folded_set, p.instance)),
        wall_seconds=wall_seconds,
        startup_seconds=startup_seconds,
        records_read=sum(
            fu.records
            for f, fu in zip(graph.flows, flows, strict=True)
            if f.source.node in graph.datasets
        ),
    )


def _merge_method(a: str, b: str) -> str:
    if not a or a == b:
        return b
    return "mixed"


# ---------------------------------------------------------------- protobuf


def _plain(obj: Any) -> dict[str, Any]:
    """A flat dataclass's fields by name: ComponentUsage and ProcessUsage name theirs as the proto does."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _from(cls: type, pb: Any) -> Any:
    return cls(**{f.name: getattr(pb, f.name) for f in fields(cls)})


def to_proto(m: RunMetrics) -> graph_pb2.GraphRunMetrics:
    from lightpath.v1 import graph_pb2

    def endpoint(e: Endpoint) -> graph_pb2.GraphEndpoint:
        return graph_pb2.GraphEndpoint(node=e.node, port=e.port)

    return graph_pb2.GraphRunMetrics(
        graph_id=m.graph_id,
        run_id=m.run_id,
        folded=m.folded,
        components=[graph_pb2.ComponentMetrics(**_plain(c)) for c in m.components],
        flows=[
            graph_pb2.FlowMetrics(
                flow=graph_pb2.Flow(
                    source=endpoint(f.source),
                    target=endpoint(f.target),
                    kind=int(f.kind),  # type: ignore[arg-type]
                    partition_key=f.partition_key,
                ),
                records=f.records,
                bytes=f.bytes,
                crosses_processes=f.crosses_processes,
            )
            for f in m.flows
        ],
        processes=[graph_pb2.ProcessMetrics(**_plain(p)) for p in m.processes],
        wall_seconds=m.wall_seconds,
        startup_seconds=m.startup_seconds,
        records_read=m.records_read,
    )


def from_proto(pb: graph_pb2.GraphRunMetrics) -> RunMetrics:
    return RunMetrics(
        graph_id=pb.graph_id,
        run_id=pb.run_id,
        folded=pb.folded,
        components=[_from(ComponentUsage, c) for c in pb.components],
        flows=[
            FlowUsage(
                Endpoint(f.flow.source.node, f.flow.source.port),
                Endpoint(f.flow.target.node, f.flow.target.port),
                FlowKind(f.flow.kind or FlowKind.STRAIGHT),
                f.flow.partition_key,
                f.records,
                f.bytes,
                f.crosses_processes,
            )
            for f in pb.flows
        ],
        processes=[_from(ProcessUsage, p) for p in pb.processes],
        wall_seconds=pb.wall_seconds,
        startup_seconds=pb.startup_seconds,
        records_read=pb.records_read,
    )


def component_rows(m: RunMetrics) -> Sequence[tuple]:
    """Rows for a table: component, set, records in/out, bytes in/out, CPU s, method."""
    return [
        (
            c.component,
            c.folded_set,
            c.records_in,
            c.records_out,
            c.bytes_in,
            c.bytes_out,
            f"{c.cpu_seconds:.3f}",
            c.cpu_method,
        )
        for c in m.components
    ]


COMPONENT_HEADERS = (
    "component",
    "set",
    "rec in",
    "rec out",
    "bytes in",
    "bytes out",
    "cpu s",
    "split by",
)
