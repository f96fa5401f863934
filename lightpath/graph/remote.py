"""The SDK's side of the core broker's graph RPCs (GF-1 … GF-7).

    async with GraphBroker.connect(address, token) as broker:
        plan = await broker.plan(spec)                      # the broker folds it
        held = await broker.reserve(spec, per_process)      # one reservation per process
        result = await asyncio.to_thread(run_graph, spec)   # run it here
        await broker.report(result.metrics)                 # per-component usage (GF-6)
        usage = await broker.metrics(spec.graph_id)

`token` is an application's credential (`authorization: Bearer <token>`); it
goes over mTLS with the caller's certificate (`credentials`, by default what
`Credentials.default()` finds: LIGHTPATH_TLS_* or the local stack's).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

import grpc

from lightpath.graph.fold import GraphPlan, plan_from_proto
from lightpath.graph.metrics import RunMetrics, from_proto, to_proto
from lightpath.graph.spec import GraphSpec
from lightpath.graph.spec import to_proto as spec_to_proto
from lightpath.security.credentials import Credentials
from lightpath.v1 import core_broker_pb2 as pb
from lightpath.v1 import core_broker_pb2_grpc


class GraphBroker:
    """The graph RPCs on `channel`; with a `token`, every call sends it (else the
    channel's own credentials name the caller)."""

    def __init__(self, channel: grpc.aio.Channel, token: str = ""):
        self._stub = core_broker_pb2_grpc.CoreBrokerStub(channel)
        self._md = (("authorization", f"Bearer {token}"),) if token else ()

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls, address: str, token: str, *, credentials: Credentials | None = None, **kwargs
    ) -> AsyncIterator[GraphBroker]:
        """A channel to the broker at `address`: TLS with `credentials` (default
        `Credentials.default()`: your certificate), and `token` on every call."""
        from lightpath.client import channel

        creds = Credentials.default() if credentials is None else credentials
        ch = channel(address, credentials=creds.with_token(token) if token else creds, **kwargs)
        try:
            yield cls(ch)
        finally:
            await ch.close()

    async def plan(self, spec: GraphSpec, *, unfolded: bool = False) -> GraphPlan:
        """The broker's plan of `spec` (the same process 400 as lightpath.graph.fold)."""
        reply = await self._stub.PlanGraph(
            pb.PlanGraphRequest(graph=spec_to_proto(spec), unfolded=unfolded), metadata=self._md
        )
        return plan_from_proto(reply)

    async def reserve(
        self,
        spec: GraphSpec,
        per_process: pb.ReservationRequest,
        *,
        allow_partial: bool = False,
        unfolded: bool = False,
    ) -> pb.GraphReservation:
        """Cores for every process of the plan: all or nothing unless `allow_partial` (GF-4)."""
        return await self._stub.ReserveGraph(
            pb.ReserveGraphRequest(
                graph=spec_to_proto(spec),
                per_process=per_process,
                allow_partial=allow_partial,
                unfolded=unfolded,
            ),
            metadata=self._md,
        )

    async def report(self, metrics: RunMetrics) -> pb.ReportGraphMetricsResponse:
        """Send a run's per-component metrics to the broker (GF-6)."""
        return await self._stub.ReportGraphMetrics(
            pb.ReportGraphMetricsRequest(metrics=to_proto(metrics)), metadata=self._md
        )

    async def metrics(
        self, graph_id: str, run_id: str = "", components: Sequence[str] = ()
    ) -> RunMetrics:
        """A run's metrics as the broker keeps them (the latest run unless `run_id`)."""
        reply = await self._stub.GetGraphMetrics(
            pb.GetGraphMetricsRequest(
                graph_id=graph_id, run_id=run_id, components=list(components)
            ),
            metadata=self._md,
        )
        return from_proto(reply)
