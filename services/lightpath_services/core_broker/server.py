"""gRPC servicer of core_broker: authentication, protobuf <-> domain, and the
calls into the broker (decisions, expiry, watch) and its store.

Every call is authenticated and authorized by the server's Guard (the one
mechanism of lightpath_services.common.auth, with the broker's application and operator
tokens as one of its verifiers, `auth.py`); every method but GetInfo then maps
the caller to the broker's principal (CB-2) for its own checks. The
reservation path lives in `broker.Broker` so other servicers (graph plans)
can reserve through it too.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator
from typing import Any

from opentelemetry import trace

from lightpath import limits
from lightpath.errors import (
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from lightpath.graph.fold import plan_to_proto
from lightpath.v1 import common_pb2, core_broker_pb2, core_broker_pb2_grpc, graph_pb2
from lightpath_services.common import paging, validate
from lightpath_services.common.auth import caller
from lightpath_services.common.keys import ID_RULE, is_valid_id, require_id
from lightpath_services.common.server import Runtime, ServiceDefinition
from lightpath_services.core_broker.auth import (
    Authenticator,
    Principal,
    require_application,
    require_operator,
)
from lightpath_services.core_broker.broker import (
    TERMINAL_EVENTS,
    Broker,
    BrokerConfig,
    Record,
    Ticket,
)
from lightpath_services.core_broker.capacity import MAX_SPAN_MS, CapacityMap
from lightpath_services.core_broker.convert import (
    EVENT_TYPES,
    agreement_in,
    core_request,
    device_in,
    device_out,
    kind_name,
    reservation_out,
    stored_request,
    timestamp,
)
from lightpath_services.core_broker.graph_runs import (
    GraphRunner,
    GraphRunStore,
    RunnerConfig,
    RunRecord,
    confine,
    holds_now,
    new_record,
    process_reservation_ids,
    run_out,
    same_request,
    settle,
)
from lightpath_services.core_broker.graphs import (
    GRAPH_ID,
    GRAPH_ID_RULE,
    GraphMetricsStore,
    check_metrics,
    graph_reservation,
    only_components,
    plan_graph,
    process_requests,
)
from lightpath_services.core_broker.metrics import BrokerMetrics
from lightpath_services.core_broker.settings import CoreBrokerSettings
from lightpath_services.core_broker.store import BrokerStore
from lightpath_services.core_broker.view import LiveView, device_doc

SERVICE_NAME = core_broker_pb2.DESCRIPTOR.services_by_name["CoreBroker"].full_name
pb = core_broker_pb2
MAX_BATCH_REQUESTS = limits.FIELDS["BatchReserveRequest.requests"]
DEFAULT_PAGE = 50
MAX_PAGE = paging.MAX_PAGE


def _annotate(**attributes: Any) -> None:
    span = trace.get_current_span()
    for k, v in attributes.items():
        span.set_attribute(f"lightpath.{k}", v)


def _annotate_batch(ticket: Ticket) -> None:
    _annotate(batch_size=ticket.batch_size, decision_rounds=ticket.rounds)


class CoreBrokerServicer(core_broker_pb2_grpc.CoreBrokerServicer):
    def __init__(
        self,
        runtime: Runtime[CoreBrokerSettings],
        store: BrokerStore,
        broker: Broker,
        auth: Authenticator,
        graph_metrics: GraphMetricsStore,
        graph_runs: GraphRunner | None = None,
    ):
        self._rt = runtime
        self._store = store
        self._broker = broker
        self._auth = auth
        self._graph_metrics = graph_metrics
        self._runs = graph_runs

    async def _who(self, context) -> Principal:
        """The broker's principal of the caller the Guard admitted (an application
        with its agreement, or the operator)."""
        principal = await self._auth.principal(caller())
        _annotate(principal=principal.name)
        return principal

    async def GetInfo(self, request: common_pb2.GetInfoRequest, context) -> common_pb2.ServiceInfo:
        view = self._broker.view
        return self._rt.info(
            SERVICE_NAME,
            devices=str(len(view.capacity.devices())),
            allocations=str(len(view.capacity)),
            version=str(view.version),
            watching=str(self._broker.hub.watching),
        )

    # -- operator -------------------------------------------------------------------

    async def RegisterDevice(self, request: pb.RegisterDeviceRequest, context) -> pb.Device:
        require_operator(await self._who(context))
        device = device_in(request.device)
        res = await self._store.upsert_device(device.device_id, device_doc(device))
        if res.status == "busy":
            raise FailedPrecondition(
                f'device "{device.device_id}"',
                f"has {res.detail[0]} cores reserved at some instant; cores must be at least that",
                reason="DEVICE_CORES_IN_USE",
            )
        _annotate(device_id=device.device_id, cores=device.cores)
        self._rt.log.info(
            "device %s registered: %s, %d cores", device.device_id, device.kind, device.cores
        )
        return device_out(device)

    async def RemoveDevice(
        self, request: pb.RemoveDeviceRequest, context
    ) -> pb.RemoveDeviceResponse:
        require_operator(await self._who(context))
        device_id = require_id(request.device_id, "device_id")
        res = await self._store.remove_device(device_id)
        if res.status == "missing":
            raise NotFound("device", device_id)
        if res.status == "busy":
            raise FailedPrecondition(
                f'device "{device_id}"',
                f"holds {res.detail[0]} live or future allocations; release them first",
                reason="DEVICE_IN_USE",
            )
        return pb.RemoveDeviceResponse()

    async def RegisterApplication(
        self, request: pb.RegisterApplicationRequest, context
    ) -> pb.RegisterApplicationResponse:
        require_operator(await self._who(context))
        app_id = require_id(request.application_id, "application_id")
        qos, billing = agreement_in(request)
        token, rotated = await self._store.register_application(
            app_id, qos, billing, self._broker.now_ms()
        )
        self._auth.forget(app_id)
        self._rt.log.info("application %s %s", app_id, "rotated" if rotated else "registered")
        return pb.RegisterApplicationResponse(application_id=app_id, token=token, rotated=rotated)

    async def RemoveApplication(
        self, request: pb.RemoveApplicationRequest, context
    ) -> pb.RemoveApplicationResponse:
        require_operator(await self._who(context))
        app_id = require_id(request.application_id, "application_id")
        if not await self._store.remove_application(app_id):
            raise NotFound("application", app_id)
        self._auth.forget(app_id)
        return pb.RemoveApplicationResponse()

    async def SetLatencies(
        self, request: pb.SetLatenciesRequest, context
    ) -> pb.SetLatenciesResponse:
        require_operator(await self._who(context))
        await self._broker.view.catch_up()
        cap = self._broker.view.capacity
        entries = []
        bad = []
        for i, e in enumerate(request.latencies):
            if not is_valid_id(e.site):
                bad.append(FieldViolation(f"latencies[{i}].site", "must be a site id"))
            if not math.isfinite(e.latency_ms):
                bad.append(FieldViolation(f"latencies[{i}].latency_ms", "must be finite"))
            entries.append((e.site, e.device_id, e.latency_ms if e.latency_ms >= 0 else -1.0))
        if not request.latencies:
            bad.append(FieldViolation("latencies", "must not be empty"))
        if bad:
            raise InvalidArgument.of(bad)
        for i, (_, device_id, _) in enumerate(entries):
            if cap.index_of(device_id) is None:
                raise NotFound("device", device_id, hint=f"latencies[{i}].device_id")
        return pb.SetLatenciesResponse(entries=await self._store.set_latencies(entries))

    # -- capacity (CB-1, CB-8) ---------------------------------------------------------

    async def _fresh(self) -> CapacityMap:
        await self._broker.view.catch_up()
        return self._broker.view.capacity

    async def ListDevices(self, request: pb.ListDevicesRequest, context) -> pb.ListDevicesResponse:
        await self._who(context)
        kind = _kind_filter(request.kind, "kind")
        cap = await self._fresh()
        now = self._broker.now_ms()
        used = cap.used_at(now)
        out = pb.ListDevicesResponse(at=timestamp(now))
        for d in sorted(cap.devices(), key=lambda d: d.device_id):
            if kind and d.kind != kind:
                continue
            i = cap.index_of(d.device_id)
            assert i is not None
            reserved = int(used[i])
            out.devices.append(
                pb.DeviceStatus(
                    device=device_out(d),
                    reserved_cores=reserved,
                    free_cores=max(0, d.cores - reserved),
                )
            )
        return out

    async def QueryCapacity(
        self, request: pb.QueryCapacityRequest, context
    ) -> pb.QueryCapacityResponse:
        principal = await self._who(context)
        kind = _kind_filter(request.kind, "kind")
        now = self._broker.now_ms()
        start = validate.timestamp_ms(validate.present(request, "start"), "start")
        if start is None:
            start = now
        end = validate.timestamp_ms(validate.present(request, "end"), "end")
        if end is None:
            end = start + 1
        if end <= start:
            raise InvalidArgument("end", "must be after start")
        if end - start > MAX_SPAN_MS:
            raise InvalidArgument("end", "the range is too long")
        for i, device_id in enumerate(request.device_ids):
            require_id(device_id, f"device_ids[{i}]")
        cap = await self._fresh()
        for device_id in request.device_ids:
            if cap.index_of(device_id) is None:
                raise NotFound("device", device_id)
        peak = cap.peak_used(start, end)
        schedules = cap.schedules(start, end) if request.include_schedule else {}
        mine = await self._own_ids(principal, schedules)
        wanted = set(request.device_ids)
        out = pb.QueryCapacityResponse(start=timestamp(start), end=timestamp(end))
        kinds: dict[str, list[int]] = {}
        for d in sorted(cap.devices(), key=lambda d: d.device_id):
            if (kind and d.kind != kind) or (wanted and d.device_id not in wanted):
                continue
            di = cap.index_of(d.device_id)
            assert di is not None
            free = max(0, d.cores - int(peak[di]))
            k = kinds.setdefault(d.kind, [0, 0, 0])
            k[0] += 1
            k[1] += d.cores
            k[2] += free
            out.devices.append(
                pb.DeviceCapacity(
                    device=device_out(d),
                    free_cores=free,
                    peak_reserved_cores=int(peak[di]),
                    schedule=[
                        pb.ScheduledCores(
                            start=timestamp(row.start),
                            end=timestamp(row.end),
                            cores=row.cores,
                            reservation_id=row.reservation_id
                            if principal.is_operator or row.reservation_id in mine
                            else "",
                        )
                        for row in schedules.get(d.device_id, ())
                    ],
                )
            )
        for name, (n, total, free) in sorted(kinds.items()):
            out.kinds.append(
                pb.KindCapacity(
                    kind=pb.DeviceKind.Value("DEVICE_KIND_" + name),  # type: ignore[arg-type]
                    devices=n,
                    total_cores=total,
                    free_cores=free,
                )
            )
        return out

    async def _own_ids(self, principal: Principal, schedules: dict[str, list[Any]]) -> set[str]:
        if principal.is_operator or not schedules:
            return set()
        ids = sorted({row.reservation_id for rows in schedules.values() for row in rows})
        records = await self._store.get_many(ids)
        return {
            rid
            for rid, rec in zip(ids, records, strict=True)
            if rec is not None and rec[0].get("app") == principal.application_id
        }

    # -- reservations (CB-3 … CB-7) -------------------------------------------------------

    async def Reserve(self, request: pb.ReserveRequest, context) -> pb.Reservation:
        principal = await self._who(context)
        app = require_application(principal)
        r = core_request(request.request, principal, "request")
        (record,) = await self._broker.reserve(
            app, [r], [stored_request(request.request)], ["request"], on_decided=_annotate_batch
        )
        _annotate(
            reservation_id=r.reservation_id,
            cores=r.cores,
            outcome=record[0]["outcome"],
        )
        return reservation_out(*record, request.request)

    async def BatchReserve(
        self, request: pb.BatchReserveRequest, context
    ) -> pb.BatchReserveResponse:
        principal = await self._who(context)
        app = require_application(principal)
        if not request.requests:
            raise InvalidArgument("requests", "must not be empty")
        if len(request.requests) > MAX_BATCH_REQUESTS:
            raise InvalidArgument("requests", f"must hold at most {MAX_BATCH_REQUESTS} requests")
        reqs = []
        seen: dict[str, int] = {}
        for i, m in enumerate(request.requests):
            if m.reservation_id in seen:
                raise InvalidArgument(
                    f"requests[{i}].reservation_id",
                    f"repeats requests[{seen[m.reservation_id]}].reservation_id",
                )
            seen[m.reservation_id] = i
            reqs.append(core_request(m, principal, f"requests[{i}]"))
        records = await self._broker.reserve(
            app,
            reqs,
            [stored_request(m) for m in request.requests],
            [f"requests[{i}]" for i in range(len(reqs))],
            all_or_nothing=request.all_or_nothing,
            on_decided=_annotate_batch,
        )
        _annotate(requests=len(reqs), all_or_nothing=request.all_or_nothing)
        return pb.BatchReserveResponse(
            reservations=[
                reservation_out(*r, m) for r, m in zip(records, request.requests, strict=True)
            ]
        )

    async def GetReservation(self, request: pb.GetReservationRequest, context) -> pb.Reservation:
        principal = await self._who(context)
        rid = require_id(request.reservation_id, "reservation_id")
        return reservation_out(*await self._broker.get(rid, principal.application_id))

    async def ListReservations(
        self, request: pb.ListReservationsRequest, context
    ) -> pb.ListReservationsResponse:
        principal = await self._who(context)
        app = principal.application_id
        if request.application_id:
            require_id(request.application_id, "application_id")
            if app is not None and request.application_id != app:
                raise PermissionDenied(
                    "an application lists only its own reservations",
                    reason="RESERVATION_OF_ANOTHER_APPLICATION",
                )
            app = request.application_id
        size = paging.page_size(request.page_size, default=DEFAULT_PAGE)
        offset = paging.token_int(request.page_token) or 0
        ids = await self._store.list_ids(app, offset, size + 1)
        more = len(ids) > size
        ids = ids[:size]
        records = await self._store.get_many(ids)
        gone = [rid for rid, rec in zip(ids, records, strict=True) if rec is None]
        if gone:
            await self._store.forget(app, gone)
        return pb.ListReservationsResponse(
            reservations=[reservation_out(*rec) for rec in records if rec is not None],
            next_page_token=paging.page_token(offset + size) if more else "",
        )

    async def ReleaseReservation(
        self, request: pb.ReleaseReservationRequest, context
    ) -> pb.Reservation:
        principal = await self._who(context)
        rid = require_id(request.reservation_id, "reservation_id")
        _annotate(reservation_id=rid)
        return reservation_out(*await self._broker.release(rid, principal.application_id))

    async def ExtendReservation(
        self, request: pb.ExtendReservationRequest, context
    ) -> pb.Reservation:
        principal = await self._who(context)
        rid = require_id(request.reservation_id, "reservation_id")
        new_end = validate.timestamp_ms(
            validate.present(request, "new_end"), "new_end", required=True
        )
        assert new_end is not None
        if new_end - self._broker.now_ms() > MAX_SPAN_MS // 2:
            raise InvalidArgument("new_end", "is too far in the future")
        _annotate(reservation_id=rid)
        return reservation_out(*await self._broker.extend(rid, principal.application_id, new_end))

    async def WatchReservations(
        self, request: pb.WatchReservationsRequest, context
    ) -> AsyncIterator[pb.ReservationEvent]:
        principal = await self._who(context)
        rid = request.reservation_id
        if rid:
            require_id(rid, "reservation_id")
        hub = self._broker.hub
        sub = hub.subscribe(principal.application_id, rid)
        try:
            current: list[Record] = []
            if rid:
                current = [await self._broker.get(rid, principal.application_id)]
            else:
                ids = await self._store.list_ids(principal.application_id, 0, MAX_PAGE)
                current = [
                    rec
                    for rec in await self._store.get_many(ids)
                    if rec is not None and rec[0]["state"] in {"SCHEDULED", "ACTIVE"}
                ]
            seen = {rec[0]["id"]: rec[1] for rec in current}
            now = self._broker.now_ms()
            for rec in reversed(current):
                yield pb.ReservationEvent(
                    type=EVENT_TYPES["CURRENT"],  # type: ignore[arg-type]
                    reservation=reservation_out(*rec),
                    at=timestamp(now),
                )
            if rid and current[0][0]["state"] in {"ENDED", "RELEASED"}:
                return
            while True:
                kind, record, version = await sub.next()
                if version <= seen.get(record["id"], 0):
                    continue  # already in the CURRENT state sent
                yield pb.ReservationEvent(
                    type=EVENT_TYPES[kind],  # type: ignore[arg-type]
                    reservation=reservation_out(record, version),
                    at=timestamp(self._broker.now_ms()),
                )
                if rid and kind in TERMINAL_EVENTS:
                    return
        finally:
            hub.unsubscribe(sub)

    # -- graph plans (GF-1 … GF-7) ------------------------------------------------------

    async def PlanGraph(self, request: pb.PlanGraphRequest, context) -> graph_pb2.GraphPlan:
        await self._who(context)
        plan = plan_graph(request.graph, unfolded=request.unfolded)
        _annotate(
            graph_id=plan.graph_id,
            folded_sets=len(plan.folded_sets),
            processes_before=plan.processes_before,
            processes_after=plan.processes_after,
        )
        return plan_to_proto(plan)

    async def ReserveGraph(self, request: pb.ReserveGraphRequest, context) -> pb.GraphReservation:
        principal = await self._who(context)
        app = require_application(principal)
        plan = plan_graph(request.graph, unfolded=request.unfolded)
        processes = process_requests(plan, request.per_process)
        if len(processes) > MAX_BATCH_REQUESTS:
            raise InvalidArgument(
                "graph",
                f"its plan has {len(processes)} processes; at most {MAX_BATCH_REQUESTS} "
                "can be reserved together",
            )
        # Each process's reservation goes through the broker's own path (GF-4),
        # as one all-or-nothing group unless the caller allows otherwise.
        records = await self._broker.reserve(
            app,
            [core_request(p.request, principal, "per_process") for p in processes],
            [stored_request(p.request) for p in processes],
            ["per_process"] * len(processes),
            all_or_nothing=not request.allow_partial,
            on_decided=_annotate_batch,
        )
        out = graph_reservation(
            request.per_process.reservation_id,
            plan,
            processes,
            [reservation_out(*r, p.request) for r, p in zip(records, processes, strict=True)],
        )
        _annotate(
            graph_id=plan.graph_id,
            reservation_id=out.reservation_id,
            processes=len(processes),
            complete=out.complete,
        )
        self._rt.log.info(
            "graph %s: %d processes for %s, %s",
            plan.graph_id,
            len(processes),
            app,
            "reserved" if out.complete else "not all reserved",
        )
        return out

    async def ReportGraphMetrics(
        self, request: pb.ReportGraphMetricsRequest, context
    ) -> pb.ReportGraphMetricsResponse:
        app = require_application(await self._who(context))
        check_metrics(request.metrics)
        m = request.metrics
        runs = await self._graph_metrics.put(app, m, self._broker.now_ms())
        _annotate(graph_id=m.graph_id, run_id=m.run_id, components=len(m.components))
        return pb.ReportGraphMetricsResponse(graph_id=m.graph_id, run_id=m.run_id, runs=runs)

    async def GetGraphMetrics(
        self, request: pb.GetGraphMetricsRequest, context
    ) -> graph_pb2.GraphRunMetrics:
        principal = await self._who(context)
        if not GRAPH_ID.match(request.graph_id):
            raise InvalidArgument("graph_id", GRAPH_ID_RULE)
        if request.run_id:
            require_id(request.run_id, "run_id")
        owner, metrics = await self._graph_metrics.get(request.graph_id, request.run_id)
        if not principal.is_operator and owner != principal.application_id:
            # Another application's graph is not there for this one (issue 30).
            raise NotFound("graph", request.graph_id)
        _annotate(graph_id=request.graph_id, run_id=metrics.run_id)
        return only_components(metrics, request.components)

    # -- graph runs (GF-5, GF-6) ---------------------------------------------------------

    def _runner(self) -> GraphRunner:
        if self._runs is None:  # pragma: no cover - build always makes one
            raise FailedPrecondition("this broker", "runs no graphs", reason="NO_GRAPH_RUNNER")
        return self._runs

    async def RunGraph(self, request: pb.RunGraphRequest, context) -> pb.GraphRun:
        principal = await self._who(context)
        app = require_application(principal)
        runner = self._runner()
        bad: list[FieldViolation] = []
        if not is_valid_id(request.run_id):
            bad.append(FieldViolation("run_id", ID_RULE))
        if not request.reservation_id:
            bad.append(
                FieldViolation(
                    "reservation_id", "is required: the ReserveGraph reservation the run uses"
                )
            )
        elif not is_valid_id(request.reservation_id):
            bad.append(FieldViolation("reservation_id", ID_RULE))
        if bad:
            raise InvalidArgument.of(bad)
        _annotate(run_id=request.run_id)
        existing = await runner.store.get(request.run_id)
        if existing is not None:
            same_request(existing, request, app)
            return await self._run_out(existing)
        # Planned first: `{part}` in a path is checked as each instance the plan runs.
        degree = max(
            (s.degree for s in plan_graph(request.graph, unfolded=request.unfolded).folded_sets),
            default=1,
        )
        spec = confine(
            request.graph, runner.config.data_dir, any_code=runner.config.any_code, parts=degree
        )
        plan = plan_graph(spec, unfolded=request.unfolded)
        owner = await self._graph_metrics.owner(plan.graph_id)
        if owner is not None and owner != app:
            raise PermissionDenied(
                f'graph id "{plan.graph_id}" cannot be used; choose another graph_id',
                reason="ID_UNAVAILABLE",
            )
        now = self._broker.now_ms()
        for rid in process_reservation_ids(request.reservation_id, plan):
            record, _ = await self._broker.get(rid, app)  # NotFound, PermissionDenied
            if why := holds_now(record, now):
                raise FailedPrecondition(
                    f'reservation "{rid}"',
                    f"{why}; a graph runs while every process's reservation holds its cores "
                    "(ReserveGraph with the same graph and unfolded)",
                    reason="RESERVATION_NOT_HELD",
                )
        runner.check_capacity()
        rec = new_record(request, app, plan, now)
        if not await runner.store.create(rec):
            raced = await runner.store.get(request.run_id)
            assert raced is not None
            same_request(raced, request, app)
            return await self._run_out(raced)
        rids = process_reservation_ids(request.reservation_id, plan)

        async def still_held() -> str:
            now_ms = self._broker.now_ms()
            for rid in rids:
                try:
                    record, _ = await self._broker.get(rid, app)
                except NotFound:
                    return f'reservation "{rid}" is gone'
                if why := holds_now(record, now_ms):
                    return f'reservation "{rid}" {why}'
            return ""

        runner.start(
            rec,
            spec,
            unfolded=request.unfolded,
            checkpoint_every=request.checkpoint_every,
            still_held=still_held,
        )
        _annotate(graph_id=plan.graph_id, processes=plan.processes_after)
        self._rt.log.info(
            "graph run %s of %s started for %s: %d processes",
            rec.run_id,
            plan.graph_id,
            app,
            plan.processes_after,
            extra={"run_id": rec.run_id, "graph_id": plan.graph_id, "application_id": app},
        )
        return run_out(rec, None)

    async def _visible_run(self, run_id: str, context) -> tuple[Principal, RunRecord]:
        principal = await self._who(context)
        rid = require_id(run_id, "run_id")
        _annotate(run_id=rid)
        rec = await self._runner().store.get(rid)
        if rec is None or (not principal.is_operator and rec.app != principal.application_id):
            raise NotFound("graph run", rid)  # another application's is not there for it
        return principal, rec

    async def _run_out(self, rec: RunRecord) -> pb.GraphRun:
        rec = await settle(self._runner().store, rec, self._broker.now_ms())
        metrics = None
        if rec.state == "succeeded":
            with contextlib.suppress(NotFound):  # no longer kept: the run stays readable
                _, metrics = await self._graph_metrics.get(rec.graph_id, rec.run_id)
        return run_out(rec, metrics)

    async def GetGraphRun(self, request: pb.GetGraphRunRequest, context) -> pb.GraphRun:
        _, rec = await self._visible_run(request.run_id, context)
        return await self._run_out(rec)

    async def CancelGraphRun(self, request: pb.CancelGraphRunRequest, context) -> pb.GraphRun:
        principal, rec = await self._visible_run(request.run_id, context)
        runner = self._runner()
        if rec.state == "running":
            await runner.store.request_cancel(rec.run_id, str(principal.name))
            runner.cancel_here(rec.run_id)  # else the replica running it reads the flag
            self._rt.log.info(
                "graph run %s: cancel asked by %s",
                rec.run_id,
                principal.name,
                extra={"run_id": rec.run_id},
            )
            rec = await runner.store.get(rec.run_id) or rec
        return await self._run_out(rec)


def _kind_filter(value: int, field: str) -> str:
    try:
        return kind_name(value)
    except ValueError:
        raise InvalidArgument(field, "unknown device kind") from None


async def build(
    runtime: Runtime[CoreBrokerSettings], *, metrics: BrokerMetrics | None = None
) -> list[ServiceDefinition]:
    s = runtime.settings
    metrics = metrics or BrokerMetrics()
    metrics.serving()
    store = BrokerStore(runtime.redis, retention_ms=int(s.retention_s * 1000))
    view = LiveView(store)
    await view.load()
    broker = Broker(
        store,
        view,
        BrokerConfig(
            priority=s.priority_function(),
            default_placement=s.placement,
            batch_window_s=s.batch_window_ms / 1000,
            max_batch=s.max_batch,
            max_duration_ms=int(s.max_duration_s * 1000),
            reaper_interval_s=s.reaper_interval_ms / 1000,
        ),
        metrics=metrics,
    )
    runtime.supervise(lambda: metrics.run(view), "core_broker.metrics", needed=False)
    runtime.supervise(broker.decide_forever, "core_broker.decide")
    runtime.supervise(broker.reap_forever, "core_broker.reap")
    runtime.supervise(broker.follow_forever, "core_broker.follow")
    auth = Authenticator(store, s.operator_token, s.auth_cache_s)
    runtime.guard.add_verifier(auth)
    if not s.operator_token:
        if not s.plaintext and s.tls_client_auth == "require":
            runtime.log.info(
                "LIGHTPATH_CB_OPERATOR_TOKEN is empty: the operator registers devices and "
                "applications with an operator certificate (spiffe://lightpath/operator/<name>) "
                "or a Lightpath token issued to an operator"
            )
        else:
            runtime.log.warning(
                "LIGHTPATH_CB_OPERATOR_TOKEN is empty and callers present no client certificates "
                "here: the operator can register devices and applications only with a Lightpath "
                "token issued to an operator (`lightpath token create operator:NAME`); use an "
                "operator certificate with LIGHTPATH_TLS_CLIENT_AUTH=require"
            )
    graph_metrics = GraphMetricsStore(runtime.redis, runs_kept=s.graph_runs_kept)

    async def save_metrics(app: str, m: graph_pb2.GraphRunMetrics) -> None:
        await graph_metrics.put(app, m, broker.now_ms())

    runner = GraphRunner(
        GraphRunStore(runtime.redis),
        RunnerConfig(
            data_dir=s.graph_data_path,
            run_dir=s.graph_run_path,
            max_runs=s.graph_max_runs,
            any_code=s.graph_code == "any",
        ),
        spawn=runtime.spawn,  # type: ignore[arg-type]
        save_metrics=save_metrics,
        now_ms=broker.now_ms,
    )
    servicer = CoreBrokerServicer(runtime, store, broker, auth, graph_metrics, runner)
    return [
        ServiceDefinition(
            SERVICE_NAME, servicer, core_broker_pb2_grpc.add_CoreBrokerServicer_to_server
        )
    ]
