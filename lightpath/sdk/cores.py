"""Accelerator cores as a service through the core broker (CB-1 … CB-9).

    from lightpath.sdk import Cores

    with Cores(token=app_token) as cores:       # an application's token
        r = cores.reserve("r-1", cores=50, duration=600, accept=["partial"])
        cores.extend("r-1", by=300)
        cores.release("r-1")

Credentials: an application's `token` (else $LIGHTPATH_CB_TOKEN) with your
certificate; without one, the operator's (the certificate `Credentials.default()`
finds, else $LIGHTPATH_CB_OPERATOR_TOKEN). Address: $LIGHTPATH_CORE_BROKER_ADDR,
else the local stack's. Answers are lightpath.v1.core_broker_pb2 messages.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from lightpath.client import DEFAULT_TIMEOUT_S
from lightpath.sdk._base import AsyncClient, SyncClient, blocking, blocking_iter
from lightpath.security.credentials import Credentials
from lightpath.security.identity import OPERATOR
from lightpath.v1 import common_pb2, core_broker_pb2_grpc, graph_pb2
from lightpath.v1 import core_broker_pb2 as pb

if TYPE_CHECKING:
    from lightpath.graph.metrics import RunMetrics
    from lightpath.graph.spec import GraphSpec

Seconds = float | timedelta
When = float | datetime | timedelta  # seconds since the epoch, a time, or from now


def operator_credentials(base: Credentials | None = None) -> Credentials:
    """The operator's credentials for the broker: `base` (default `Credentials.default()`)
    as it is when it holds an operator's certificate, else with $LIGHTPATH_CB_OPERATOR_TOKEN
    as its token if that is set, else as it is (the broker then says what it lacks)."""
    base = Credentials.default() if base is None else base
    presented = base.certificate_principal()
    if presented is not None and presented.kind == OPERATOR:
        return base
    token = os.environ.get("LIGHTPATH_CB_OPERATOR_TOKEN", "").strip()
    return base.with_token(token) if token else base


def operator_metadata(base: Credentials | None = None) -> tuple[tuple[str, str], ...]:
    """Per-call metadata that makes a call on a channel of `base` (default
    `Credentials.default()`, what `lightpath.client.channel` uses) the operator's:
    nothing when the channel already presents the operator's certificate."""
    base = Credentials.default() if base is None else base
    creds = operator_credentials(base)
    return creds.metadata() if creds.token != base.token else ()


def broker_credentials(token: str = "", *, operator: bool = False) -> Credentials:
    """What a client presents to the broker: an application's `token` (else
    $LIGHTPATH_CB_TOKEN, unless `operator`) with your certificate, else the operator's."""
    base = Credentials.default()
    token = token or ("" if operator else os.environ.get("LIGHTPATH_CB_TOKEN", "").strip())
    if token:
        return base.with_token(token)
    return operator_credentials(base)


def _seconds(value: Seconds) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def timestamp(when: When) -> Timestamp:
    """A Timestamp of seconds since the epoch, a datetime (naive: UTC), or a timedelta
    from now."""
    if isinstance(when, timedelta):
        when = time.time() + when.total_seconds()
    elif isinstance(when, datetime):
        when = (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()  # naive: UTC
    t = Timestamp()
    t.FromMilliseconds(int(when * 1000))
    return t


def _enum(enum: Any, prefix: str, value: str | int) -> int:
    """`"gpu"` → DEVICE_KIND_GPU's number (case-insensitive, - or _); numbers as they are."""
    if isinstance(value, int):
        return value
    try:
        return int(enum.Value(prefix + value.strip().upper().replace("-", "_")))
    except ValueError:
        names = [n.removeprefix(prefix).lower() for n in enum.keys()[1:]]
        raise ValueError(f"{value!r} is not one of {', '.join(names)}") from None


def _graph_proto(graph: GraphSpec | graph_pb2.GraphSpec) -> graph_pb2.GraphSpec:
    if isinstance(graph, graph_pb2.GraphSpec):
        return graph
    from lightpath.graph.spec import to_proto

    return to_proto(graph)


def reservation_request(
    reservation_id: str,
    cores: int,
    duration: Seconds,
    *,
    start: When | None = None,
    latest_end: When | None = None,
    within: Seconds | None = None,
    task_type: str = "",
    priority: int = 0,
    qos: str | int = 0,
    billing: str | int = 0,
    placement: str | int = 0,
    accept: Iterable[str | int] = (),
    kind: str | int = 0,
    devices: Iterable[str] = (),
    site: str = "",
    x_km: float = 0.0,
    y_km: float = 0.0,
) -> pb.ReservationRequest:
    """The ReservationRequest of `AsyncCores.reserve`'s arguments (see there)."""
    d = Duration()
    d.FromMilliseconds(int(_seconds(duration) * 1000))
    req = pb.ReservationRequest(
        reservation_id=reservation_id,
        cores=cores,
        duration=d,
        task_type=task_type,
        priority_hint=priority,
        device_ids=list(devices),
        qos_level=_enum(pb.QosLevel, "QOS_LEVEL_", qos),  # type: ignore[arg-type]
        billing_model=_enum(pb.BillingModel, "BILLING_MODEL_", billing),  # type: ignore[arg-type]
        placement=_enum(pb.PlacementPolicy, "PLACEMENT_POLICY_", placement),  # type: ignore[arg-type]
        accept=[_enum(pb.Outcome, "OUTCOME_", a) for a in accept],  # type: ignore[misc]
        device_kind=_enum(pb.DeviceKind, "DEVICE_KIND_", kind),  # type: ignore[arg-type]
    )
    if start is not None or latest_end is not None or within is not None:
        window = common_pb2.TimeWindow()
        if start is not None:
            window.earliest_start.CopyFrom(timestamp(start))
        if latest_end is not None:
            window.latest_end.CopyFrom(timestamp(latest_end))
        elif within is not None:
            begin = timestamp(start if start is not None else time.time())
            window.latest_end.FromMilliseconds(
                begin.ToMilliseconds() + int(_seconds(within) * 1000)
            )
        req.window.CopyFrom(window)
    if site or x_km or y_km:
        req.client_location.CopyFrom(pb.Location(site=site, x_km=x_km, y_km=y_km))
    return req


class AsyncCores(AsyncClient):
    """The core broker: reserve, read, list, extend, release and watch reservations;
    devices and capacity; the operator's registrations."""

    PROCESS = "core-broker"
    ADDR_ENV = "LIGHTPATH_CORE_BROKER_ADDR"
    STUB = core_broker_pb2_grpc.CoreBrokerStub

    def __init__(
        self,
        address: str | None = None,
        *,
        token: str = "",
        operator: bool = False,
        credentials: Credentials | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        max_attempts: int = 5,
    ):
        """`token`: an application's (else $LIGHTPATH_CB_TOKEN unless `operator`);
        `credentials` instead of `broker_credentials(token, operator=operator)`."""
        if credentials is None:
            credentials = broker_credentials(token, operator=operator)
        super().__init__(
            address, credentials=credentials, timeout=timeout, max_attempts=max_attempts
        )

    async def reserve(
        self,
        reservation_id: str,
        cores: int = 0,
        duration: Seconds = 0.0,
        *,
        request: pb.ReservationRequest | None = None,
        **options: Any,
    ) -> pb.Reservation:
        """Ask for `cores` cores for `duration` seconds (or a timedelta). The id is the
        idempotency key. Options (`reservation_request`): start / latest_end (seconds
        since the epoch, datetime, or timedelta from now), within (latest end = start +
        this), task_type, priority 1..100, qos "best_effort" | "standard" | "premium",
        billing "spot" | "on_demand" | "committed", placement "spread" | "pack" |
        "nearest" | "affinity" | "lowest_latency", accept ["partial", "deferred"] (or
        ["granted"] for nothing less), kind "gpu" | "tpu" | ..., devices, site, x_km,
        y_km. Or a complete `request`. A REJECTED decision is an answer, not an error:
        check `outcome`."""
        if request is None:
            request = reservation_request(reservation_id, cores, duration, **options)
        return await self._call(  # type: ignore[no-any-return]
            "Reserve", pb.ReserveRequest(request=request)
        )

    async def get(self, reservation_id: str) -> pb.Reservation:
        return await self._call(  # type: ignore[no-any-return]
            "GetReservation", pb.GetReservationRequest(reservation_id=reservation_id)
        )

    async def list_reservations_page(
        self, *, application: str = "", page_size: int = 100, page_token: str = ""
    ) -> pb.ListReservationsResponse:
        """One page of reservations (the operator's: everyone's, or `application`'s)."""
        return await self._call(  # type: ignore[no-any-return]
            "ListReservations",
            pb.ListReservationsRequest(
                page_size=page_size, page_token=page_token, application_id=application
            ),
        )

    async def list_reservations(
        self,
        *,
        application: str = "",
        limit: int | None = None,
        page_size: int = 100,
        page_token: str = "",
    ) -> AsyncIterator[pb.Reservation]:
        """Every reservation (at most `limit`), fetching pages as the loop goes."""
        first = page_token

        def make(token: str) -> pb.ListReservationsRequest:
            return pb.ListReservationsRequest(
                page_size=page_size, page_token=token or first, application_id=application
            )

        async for r in self._pages("ListReservations", make, lambda p: p.reservations, limit):
            first = ""
            yield r

    async def release(self, reservation_id: str) -> pb.Reservation:
        """Give the cores back early."""
        return await self._call(  # type: ignore[no-any-return]
            "ReleaseReservation", pb.ReleaseReservationRequest(reservation_id=reservation_id)
        )

    async def extend(
        self, reservation_id: str, *, until: When | None = None, by: Seconds | None = None
    ) -> pb.Reservation:
        """Make the reservation end later: at `until`, or `by` seconds (a timedelta) after
        its current end. ResourceExhausted when the cores are not free until then."""
        if (until is None) == (by is None):
            raise ValueError("extend takes one of until= and by=")
        if until is not None:
            new_end = timestamp(until)
        else:
            current = await self.get(reservation_id)
            new_end = Timestamp()
            new_end.FromMilliseconds(current.end.ToMilliseconds() + int(_seconds(by or 0.0) * 1000))
        return await self._call(  # type: ignore[no-any-return]
            "ExtendReservation",
            pb.ExtendReservationRequest(reservation_id=reservation_id, new_end=new_end),
        )

    async def watch(self, reservation_id: str = "") -> AsyncIterator[pb.ReservationEvent]:
        """Starts, changes and ends of one reservation, or of all of the caller's: the
        current state first, then live (until the loop stops)."""
        req = pb.WatchReservationsRequest(reservation_id=reservation_id)
        async for event in self._stream("WatchReservations", req):
            yield event

    async def devices(self, kind: str | int = 0) -> pb.ListDevicesResponse:
        """Devices with total, reserved and free cores now."""
        return await self._call(  # type: ignore[no-any-return]
            "ListDevices",
            pb.ListDevicesRequest(kind=_enum(pb.DeviceKind, "DEVICE_KIND_", kind)),  # type: ignore[arg-type]
        )

    async def capacity(
        self,
        *,
        start: When | None = None,
        end: When | None = None,
        kind: str | int = 0,
        devices: Iterable[str] = (),
        include_schedule: bool = False,
    ) -> pb.QueryCapacityResponse:
        """Free cores over [start, end) per device and kind (default: now, an instant)."""
        req = pb.QueryCapacityRequest(
            kind=_enum(pb.DeviceKind, "DEVICE_KIND_", kind),  # type: ignore[arg-type]
            device_ids=list(devices),
            include_schedule=include_schedule,
        )
        if start is not None:
            req.start.CopyFrom(timestamp(start))
        if end is not None:
            req.end.CopyFrom(timestamp(end))
        return await self._call("QueryCapacity", req)  # type: ignore[no-any-return]

    # -- folded dataflow graphs ---------------------------------------------------------
    # A graph is a lightpath.graph.spec.GraphSpec (load_spec reads one from JSON) or its
    # proto; it runs here with lightpath.graph.runner.run_graph, whose metrics
    # report_graph_metrics sends to the broker, or on the broker's host with run_graph.

    async def plan_graph(
        self, graph: GraphSpec | graph_pb2.GraphSpec, *, unfolded: bool = False
    ) -> graph_pb2.GraphPlan:
        """The broker's folded plan of `graph` (which components share a process);
        `unfolded`: one process per component instance."""
        return await self._call(  # type: ignore[no-any-return]
            "PlanGraph", pb.PlanGraphRequest(graph=_graph_proto(graph), unfolded=unfolded)
        )

    async def reserve_graph(
        self,
        graph: GraphSpec | graph_pb2.GraphSpec,
        reservation_id: str,
        cores: int = 0,
        duration: Seconds = 0.0,
        *,
        allow_partial: bool = False,
        unfolded: bool = False,
        per_process: pb.ReservationRequest | None = None,
        **options: Any,
    ) -> pb.GraphReservation:
        """Cores for every process of the graph's plan, all or nothing (`allow_partial`:
        each on its own); each process asks what `reserve` would (`cores`, `duration`,
        the same options) under "<reservation_id>.<set>.<instance>". Check `complete`."""
        if per_process is None:
            per_process = reservation_request(reservation_id, cores, duration, **options)
        return await self._call(  # type: ignore[no-any-return]
            "ReserveGraph",
            pb.ReserveGraphRequest(
                graph=_graph_proto(graph),
                per_process=per_process,
                allow_partial=allow_partial,
                unfolded=unfolded,
            ),
        )

    async def report_graph_metrics(
        self, metrics: RunMetrics | graph_pb2.GraphRunMetrics
    ) -> pb.ReportGraphMetricsResponse:
        """Send a run's metrics (run_graph's `result.metrics`) to the broker."""
        if not isinstance(metrics, graph_pb2.GraphRunMetrics):
            from lightpath.graph.metrics import to_proto

            metrics = to_proto(metrics)
        return await self._call(  # type: ignore[no-any-return]
            "ReportGraphMetrics", pb.ReportGraphMetricsRequest(metrics=metrics)
        )

    async def graph_metrics(
        self, graph_id: str, *, run_id: str = "", components: Iterable[str] = ()
    ) -> graph_pb2.GraphRunMetrics:
        """A reported run's metrics (default the latest); NotFound before any report."""
        return await self._call(  # type: ignore[no-any-return]
            "GetGraphMetrics",
            pb.GetGraphMetricsRequest(
                graph_id=graph_id, run_id=run_id, components=list(components)
            ),
        )

    async def run_graph(
        self,
        graph: GraphSpec | graph_pb2.GraphSpec,
        run_id: str,
        reservation_id: str,
        *,
        unfolded: bool = False,
        checkpoint_every: int = 0,
    ) -> pb.GraphRun:
        """Run the graph on the broker's host while its `reserve_graph` reservation
        (`reservation_id`, same `unfolded`) holds the cores; answers at once, RUNNING.
        `run_id` is the idempotency key. Component library kinds only (no user code,
        interface or kv_lookup, unless the broker allows them), files in the broker's
        graph data directory. Follow it with `graph_run` or `wait_graph_run`."""
        return await self._call(  # type: ignore[no-any-return]
            "RunGraph",
            pb.RunGraphRequest(
                graph=_graph_proto(graph),
                run_id=run_id,
                reservation_id=reservation_id,
                unfolded=unfolded,
                checkpoint_every=checkpoint_every,
            ),
        )

    async def graph_run(self, run_id: str) -> pb.GraphRun:
        """A broker run: state, and its metrics once SUCCEEDED or `failure` once not."""
        return await self._call(  # type: ignore[no-any-return]
            "GetGraphRun", pb.GetGraphRunRequest(run_id=run_id)
        )

    async def cancel_graph_run(self, run_id: str) -> pb.GraphRun:
        """Stop a broker run (its processes are killed; it ends CANCELLED)."""
        return await self._call(  # type: ignore[no-any-return]
            "CancelGraphRun", pb.CancelGraphRunRequest(run_id=run_id)
        )

    async def wait_graph_run(self, run_id: str, *, timeout: float | None = None) -> pb.GraphRun:
        """The run once it is no longer RUNNING (SUCCEEDED, FAILED or CANCELLED: check
        `state`), asking every 0.05 s growing to 1 s. TimeoutError after `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.05
        while True:
            run = await self.graph_run(run_id)
            if run.state != pb.GRAPH_RUN_STATE_RUNNING:
                return run
            if deadline is not None and time.monotonic() + pause > deadline:
                raise TimeoutError(f"graph run {run_id} still RUNNING after {timeout:g} s")
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)

    async def register_device(self, device: pb.Device) -> pb.Device:
        """Operator: register or update a device."""
        return await self._call(  # type: ignore[no-any-return]
            "RegisterDevice", pb.RegisterDeviceRequest(device=device)
        )

    async def register_application(
        self, application_id: str, *, qos: str | int = 0, billing: str | int = 0
    ) -> pb.RegisterApplicationResponse:
        """Operator: register an application (again: rotate its token); the answer holds
        its token, shown once."""
        return await self._call(  # type: ignore[no-any-return]
            "RegisterApplication",
            pb.RegisterApplicationRequest(
                application_id=application_id,
                qos_level=_enum(pb.QosLevel, "QOS_LEVEL_", qos),  # type: ignore[arg-type]
                billing_model=_enum(pb.BillingModel, "BILLING_MODEL_", billing),  # type: ignore[arg-type]
            ),
        )


class Cores(SyncClient[AsyncCores]):
    """`AsyncCores` with blocking methods (same arguments and answers)."""

    ASYNC = AsyncCores

    reserve = blocking(AsyncCores.reserve)
    get = blocking(AsyncCores.get)
    list_reservations_page = blocking(AsyncCores.list_reservations_page)
    list_reservations = blocking_iter(AsyncCores.list_reservations)
    release = blocking(AsyncCores.release)
    extend = blocking(AsyncCores.extend)
    watch = blocking_iter(AsyncCores.watch)
    devices = blocking(AsyncCores.devices)
    capacity = blocking(AsyncCores.capacity)
    plan_graph = blocking(AsyncCores.plan_graph)
    reserve_graph = blocking(AsyncCores.reserve_graph)
    report_graph_metrics = blocking(AsyncCores.report_graph_metrics)
    graph_metrics = blocking(AsyncCores.graph_metrics)
    run_graph = blocking(AsyncCores.run_graph)
    graph_run = blocking(AsyncCores.graph_run)
    cancel_graph_run = blocking(AsyncCores.cancel_graph_run)
    wait_graph_run = blocking(AsyncCores.wait_graph_run)
    register_device = blocking(AsyncCores.register_device)
    register_application = blocking(AsyncCores.register_application)
