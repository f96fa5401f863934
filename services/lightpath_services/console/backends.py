"""The console's reads: the services' public gRPC API, nothing else (never Redis).

One channel per service address, over mTLS with the console's own certificate. A call
made for a viewer who signed in carries that viewer's bearer token, which the services
prefer to the certificate (lightpath_services.common.auth.Guard): their authorization decides what
the viewer sees (a tenant: only its own jobs). A call for a viewer who has not signed in
carries nothing extra, so it runs as the console itself: `service:console`, whose policy
rows are reads only.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import timestamp_pb2
from opentelemetry import trace

from lightpath.client import channel, rpc_error
from lightpath.errors import LightpathError, NotFound, Unavailable
from lightpath.security.credentials import Credentials
from lightpath.security.identity import Principal, service_principal
from lightpath.v1 import (
    agg_switch_pb2,
    agg_switch_pb2_grpc,
    cell_scheduler_pb2,
    cell_scheduler_pb2_grpc,
    core_broker_pb2,
    core_broker_pb2_grpc,
    ocs_manager_pb2,
    ocs_manager_pb2_grpc,
)

_tracer = trace.get_tracer("lightpath.console")
MAX_JOBS = 500  # newest jobs a list shows
MAX_RESERVATIONS = 2000


@dataclass(frozen=True)
class Viewer:
    """Who a read is for: a signed-in principal's token, or the console itself (token "")."""

    token: str = ""
    name: str = ""  # what the page shows: "tenant:acme", or "" for the console's own view
    # What of the operators' views it may read (probed at sign-in; a tenant's token may
    # not): the superpods and their switches, the core broker, the aggregation switches.
    sees_pods: bool = True
    sees_cores: bool = True
    sees_switches: bool = True

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


CONSOLE = Viewer()


def trace_id() -> str:
    """The trace id of the span around the current read ("" outside one)."""
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""


class Backends:
    """Stubs of every service the console shows, and the reads the views need."""

    def __init__(
        self,
        credentials: Credentials,
        *,
        cell: str,
        ocs: dict[str, str],
        core_broker: str = "",
        agg: dict[str, str] | None = None,
        agg_tree: str = "tree-1",
    ):
        self._creds = credentials
        self._channels: dict[str, grpc.aio.Channel] = {}
        # Each channel expects the identity of what it shows: a server holding another
        # service's certificate fails the handshake (lightpath.client `expect`).
        self.cell = cell_scheduler_pb2_grpc.CellSchedulerStub(
            self._channel(cell, service_principal("cell_scheduler"))
        )
        self.ocs = {
            pod: ocs_manager_pb2_grpc.OcsManagerStub(
                self._channel(a, service_principal("ocs_manager", pod))
            )
            for pod, a in ocs.items()
        }
        self.broker = (
            core_broker_pb2_grpc.CoreBrokerStub(
                self._channel(core_broker, service_principal("core_broker"))
            )
            if core_broker
            else None
        )
        self.agg = {
            s: agg_switch_pb2_grpc.AggSwitchStub(
                self._channel(a, service_principal("agg_switch", s))
            )
            for s, a in (agg or {}).items()
        }
        self.agg_tree = agg_tree

    def _channel(self, address: str, expect: Principal) -> grpc.aio.Channel:
        key = f"{address} {expect}"
        if key not in self._channels:
            self._channels[key] = channel(
                address, credentials=self._creds, max_attempts=3, expect=expect
            )
        return self._channels[key]

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()

    @staticmethod
    async def _call(method: Any, request: Any, viewer: Viewer, timeout: float = 5.0) -> Any:
        try:
            return await method(request, metadata=viewer.metadata(), timeout=timeout)
        except grpc.aio.AioRpcError as err:
            raise rpc_error(err) from err

    @classmethod
    async def _all(
        cls,
        method: Any,
        make: Any,
        items: str,
        viewer: Viewer,
        limit: int,
    ) -> list[Any]:
        """The items (field `items`) of a paged list, page after page (`make(page_token)`
        builds the request), until no page follows or `limit` items are in."""
        out: list[Any] = []
        token = ""
        while len(out) < limit:
            resp = await cls._call(method, make(token), viewer)
            out.extend(getattr(resp, items))
            token = resp.next_page_token
            if not token:
                break
        return out

    def _ocs(self, pod_id: str) -> Any:
        stub = self.ocs.get(pod_id)
        if stub is None:
            raise NotFound(
                "pod",
                pod_id,
                hint="the console has no ocs_manager address for it (LIGHTPATH_CONSOLE_OCS_ADDRS)",
            )
        return stub

    # -- cell ------------------------------------------------------------------

    async def list_pods(self, viewer: Viewer) -> list[cell_scheduler_pb2.Pod]:
        resp = await self._call(self.cell.ListPods, cell_scheduler_pb2.ListPodsRequest(), viewer)
        return list(resp.pods)

    async def list_quotas(self, viewer: Viewer) -> cell_scheduler_pb2.ListQuotasResponse:
        """Tenants' quotas and usage, and the pod held for an owner's job (issue 35): a
        tenant's sign-in gets its own row only, and whose job a pod is held for only
        when it is its own (the cell answers so)."""
        return await self._call(  # type: ignore[no-any-return]
            self.cell.ListQuotas, cell_scheduler_pb2.ListQuotasRequest(), viewer
        )

    async def get_pod(self, viewer: Viewer, pod_id: str) -> cell_scheduler_pb2.Pod:
        return await self._call(
            self.cell.GetPod,
            cell_scheduler_pb2.GetCellPodRequest(pod_id=pod_id, include_view=True),
            viewer,
        )

    async def list_jobs(
        self, viewer: Viewer, pod_id: str = "", states: Sequence[int] = ()
    ) -> list[cell_scheduler_pb2.CellJob]:
        jobs = await self._all(
            self.cell.ListJobs,
            lambda token: cell_scheduler_pb2.ListCellJobsRequest(
                pod_id=pod_id,
                states=states,  # type: ignore[arg-type]
                page_size=200,
                page_token=token,
            ),
            "jobs",
            viewer,
            MAX_JOBS,
        )
        return jobs[:MAX_JOBS]

    async def list_jobs_probe(self, viewer: Viewer) -> None:
        """One page of one job: whether the services take this viewer's credential."""
        await self._call(
            self.cell.ListJobs, cell_scheduler_pb2.ListCellJobsRequest(page_size=1), viewer
        )

    async def get_job(self, viewer: Viewer, job_id: str) -> tuple[cell_scheduler_pb2.CellJob, str]:
        """The job (with its rings) and the trace id of this read."""
        with _tracer.start_as_current_span("console GetJob"):
            job = await self._call(
                self.cell.GetJob,
                cell_scheduler_pb2.GetCellJobRequest(job_id=job_id, include_rings=True),
                viewer,
            )
            return job, trace_id()

    def watch_pod(self, pod_id: str) -> Any:
        """The pod's job transitions and block health changes (as the console itself)."""
        return self.cell.WatchPod(cell_scheduler_pb2.WatchCellPodRequest(pod_id=pod_id))

    # -- a pod's fabric ----------------------------------------------------------

    async def switches(self, viewer: Viewer, pod_id: str) -> list[ocs_manager_pb2.SwitchUse]:
        return await self._all(
            self._ocs(pod_id).ListSwitches,
            lambda token: ocs_manager_pb2.ListSwitchesRequest(page_size=500, page_token=token),
            "switches",
            viewer,
            sys.maxsize,
        )

    async def slice_wiring(
        self, viewer: Viewer, pod_id: str, job_id: str, *, full: bool = True
    ) -> ocs_manager_pb2.SliceWiring:
        view = ocs_manager_pb2.WIRING_VIEW_FULL if full else ocs_manager_pb2.WIRING_VIEW_COUNTS
        return await self._call(
            self._ocs(pod_id).GetSliceWiring,
            ocs_manager_pb2.GetSliceWiringRequest(job_id=job_id, view=view),
            viewer,
        )

    async def one_to_many(
        self, viewer: Viewer, pod_id: str, job_id: str = ""
    ) -> list[ocs_manager_pb2.OneToManyState]:
        resp = await self._call(
            self._ocs(pod_id).GetOneToManyStates,
            ocs_manager_pb2.GetOneToManyStatesRequest(job_id=job_id),
            viewer,
        )
        return list(resp.states)

    async def block_ports(
        self, viewer: Viewer, pod_id: str, block_id: int
    ) -> list[ocs_manager_pb2.PortMapEntry]:
        resp = await self._call(
            self._ocs(pod_id).GetPortMap,
            ocs_manager_pb2.GetPortMapRequest(block_id=block_id),
            viewer,
        )
        return list(resp.entries)

    async def ring_reservations(
        self, viewer: Viewer, pod_id: str
    ) -> list[ocs_manager_pb2.RingReservationSummary]:
        return await self._all(
            self._ocs(pod_id).ListRingReservations,
            lambda token: ocs_manager_pb2.ListRingReservationsRequest(
                page_size=200, page_token=token
            ),
            "reservations",
            viewer,
            MAX_JOBS,
        )

    # -- core broker -------------------------------------------------------------

    def _broker(self) -> Any:
        if self.broker is None:
            raise Unavailable("no core broker is configured (LIGHTPATH_CORE_BROKER_ADDR)")
        return self.broker

    async def capacity(
        self, viewer: Viewer, start_s: float, end_s: float
    ) -> core_broker_pb2.QueryCapacityResponse:
        start, end = timestamp_pb2.Timestamp(), timestamp_pb2.Timestamp()
        start.FromNanoseconds(int(start_s * 1e9))
        end.FromNanoseconds(int(end_s * 1e9))
        return await self._call(
            self._broker().QueryCapacity,
            core_broker_pb2.QueryCapacityRequest(start=start, end=end, include_schedule=True),
            viewer,
        )

    async def reservations(self, viewer: Viewer) -> list[core_broker_pb2.Reservation]:
        return await self._all(
            self._broker().ListReservations,
            lambda token: core_broker_pb2.ListReservationsRequest(page_size=500, page_token=token),
            "reservations",
            viewer,
            MAX_RESERVATIONS,
        )

    def watch_reservations(self) -> Any:
        return self._broker().WatchReservations(core_broker_pb2.WatchReservationsRequest())

    # -- aggregation -------------------------------------------------------------

    async def agg_topology(self, viewer: Viewer) -> agg_switch_pb2.AggTopology | None:
        """The tree as defined (None: not defined yet, or no switch answers)."""
        for stub in self.agg.values():
            with contextlib.suppress(Unavailable, NotFound):
                return await self._call(
                    stub.GetTopology,
                    agg_switch_pb2.GetTopologyRequest(tree_id=self.agg_tree),
                    viewer,
                )
        return None

    async def switch_state(self, viewer: Viewer, name: str) -> agg_switch_pb2.SwitchState:
        return await self._call(
            self.agg[name].GetSwitchState, agg_switch_pb2.GetSwitchStateRequest(), viewer
        )

    async def switch_states(self, viewer: Viewer) -> dict[str, agg_switch_pb2.SwitchState | str]:
        """Each switch's state, or the error that kept it from answering."""
        out: dict[str, agg_switch_pb2.SwitchState | str] = {}
        for name in self.agg:
            try:
                out[name] = await self.switch_state(viewer, name)
            except LightpathError as exc:
                out[name] = str(exc)
        return out

    async def commands(self, viewer: Viewer) -> list[agg_switch_pb2.AggCommand]:
        for stub in self.agg.values():
            with contextlib.suppress(Unavailable):
                resp = await self._call(
                    stub.ListCommands,
                    agg_switch_pb2.ListCommandsRequest(tree_id=self.agg_tree, page_size=50),
                    viewer,
                )
                return list(resp.commands)
        return []


async def stream_items(call: Any) -> AsyncIterator[Any]:
    """The items of a server stream; its failure as the LightpathError of its status."""
    try:
        async for item in call:
            yield item
    except grpc.aio.AioRpcError as err:
        raise rpc_error(err) from err
