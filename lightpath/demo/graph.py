"""Demo step of graph plans (seed 004, GF-1 … GF-7).

The core broker folds the seed's Fig. 2A graph (components 204A-204J) into the
three sets of Fig. 2B, so 10 processes become 3; it reserves a core for each
process, all or nothing, through its own reservation path; the SDK runs the
graph folded on this machine (an interface component pipes records through
`tr`); the run's per-component metrics go to the broker and come back, CPU
time split among the members of each folded process. The device, application
and reservations are removed at the end.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from pathlib import Path

from google.protobuf.duration_pb2 import Duration

from lightpath.cli._common import table
from lightpath.cli.cores import operator_metadata
from lightpath.cli.graph import PLAN_HEADERS, plan_rows
from lightpath.demo.context import DemoContext
from lightpath.graph.examples import fig2a, write_records
from lightpath.graph.metrics import COMPONENT_HEADERS, component_rows
from lightpath.graph.remote import GraphBroker
from lightpath.graph.runner import run_graph
from lightpath.v1 import core_broker_pb2 as pb
from lightpath.v1 import core_broker_pb2_grpc

PROCESS = "core-broker"
RECORDS = 50_000
APPLICATION = "graph-demo"


async def run(ctx: DemoContext) -> None:
    ch = ctx.channel(PROCESS)
    stub = core_broker_pb2_grpc.CoreBrokerStub(ch)
    # the operator: the channel's own certificate (the local stack's operator), else
    # LIGHTPATH_CB_OPERATOR_TOKEN; each application calls with its own token
    op = operator_metadata()
    tag = uuid.uuid4().hex[:6]
    device_id = f"npu-graphs-{tag}"
    held: pb.GraphReservation | None = None
    await stub.RegisterDevice(
        pb.RegisterDeviceRequest(
            device=pb.Device(device_id=device_id, kind=pb.DEVICE_KIND_NPU, cores=8)
        ),
        metadata=op,
    )
    token = (
        await stub.RegisterApplication(
            pb.RegisterApplicationRequest(application_id=APPLICATION), metadata=op
        )
    ).token
    broker = GraphBroker(ch, token)
    try:
        with tempfile.TemporaryDirectory(prefix="lightpath-demo-graph-") as tmp:
            spec = fig2a(Path(tmp) / "202.tsv", Path(tmp) / "out")

            ctx.section("graph plans: a ten-component graph folded by the core broker")
            plan = await broker.plan(spec)
            print(table(plan_rows(plan), PLAN_HEADERS))
            print(
                f"processes: {plan.processes_before} one per component -> "
                f"{plan.processes_after} folded (204H runs an external program: not foldable; "
                "204I has an input from outside the first set)"
            )

            duration = Duration()
            duration.FromSeconds(120)
            held = await broker.reserve(
                spec,
                pb.ReservationRequest(
                    reservation_id=f"fig-2a-{tag}",
                    cores=1,
                    duration=duration,
                    device_ids=[device_id],
                ),
            )
            print(f"\nReserveGraph, one core per process, all or nothing on {device_id} (8 cores):")
            rows = [
                (
                    f"{p.folded_set}[{p.instance}]",
                    p.reservation.reservation_id,
                    pb.Outcome.Name(p.reservation.outcome).removeprefix("OUTCOME_"),
                    " ".join(f"{a.device_id}:{a.cores}" for a in p.reservation.allocations),
                )
                for p in held.processes
            ]
            print(table(rows, ["process", "reservation", "decision", "cores"]))

            ctx.section(f"graph plans: the graph run folded here over {RECORDS} records")
            write_records(Path(tmp) / "202.tsv", RECORDS)
            result = await asyncio.to_thread(
                run_graph, spec, run_dir=Path(tmp) / "run", run_id=f"demo-{tag}"
            )
            m = result.metrics
            reply = await broker.report(m)
            back = await broker.metrics(spec.graph_id, reply.run_id)
            print(
                f"{m.records_read} records in {m.wall_seconds:.2f} s by {len(m.processes)} "
                f"processes (start-up {m.startup_seconds:.2f} s); per component, as the broker "
                "keeps it:"
            )
            print(table(component_rows(back), COMPONENT_HEADERS))
            print(
                "records and bytes per flow; CPU of each folded process split by sampling "
                "the active member (or by timing the first 100 calls, then 1 in 1000)"
            )
    finally:
        if held is not None:
            for p in held.processes:
                if p.reservation.outcome != pb.OUTCOME_REJECTED:
                    await stub.ReleaseReservation(
                        pb.ReleaseReservationRequest(reservation_id=p.reservation.reservation_id),
                        metadata=op,
                    )
        await stub.RemoveDevice(pb.RemoveDeviceRequest(device_id=device_id), metadata=op)
        await stub.RemoveApplication(
            pb.RemoveApplicationRequest(application_id=APPLICATION), metadata=op
        )
