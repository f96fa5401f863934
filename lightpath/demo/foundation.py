"""Demo step of the foundation: every service is healthy and answers one traced call."""

from __future__ import annotations

from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace

from lightpath.cli._common import table
from lightpath.client import service_stub
from lightpath.demo.context import DemoContext
from lightpath.stack import default_topology
from lightpath.v1 import common_pb2


async def run(ctx: DemoContext) -> None:
    ctx.section("every service: health and one traced GetInfo")
    services = {s.name: s.service for s in default_topology(switch_agents=True)}
    rows = []
    for name in ctx.endpoints:
        ch = ctx.channel(name)
        health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
        with ctx.tracer.start_as_current_span(f"demo {name}") as span:
            info = await service_stub(services[name], ch).GetInfo(common_pb2.GetInfoRequest())
            trace_id = trace.format_trace_id(span.get_span_context().trace_id)
        rows.append(
            (
                name,
                info.service,
                health_pb2.HealthCheckResponse.ServingStatus.Name(health.status),
                info.instance_id,
                trace_id,
            )
        )
    print(table(rows, ["process", "service", "health", "instance", "trace id of GetInfo"]))
