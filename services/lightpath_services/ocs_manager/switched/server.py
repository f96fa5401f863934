"""gRPC servicer of a SWITCHED pod's fabric manager (SW-1 … SW-6): protobuf <->
domain. The decisions are in `rings` (pure), the steps in `manager`, Redis in
`store`; this file only translates.

One ocs_manager process serves one pod of one fabric kind (LIGHTPATH_FABRIC_KIND):
the OCS calls answer FAILED_PRECONDITION here, as the switched calls do on an
OCS_TORUS pod (`refuse_calls`).
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf.timestamp_pb2 import Timestamp
from opentelemetry import trace

from lightpath.domain.switched import SwitchedFabric, build_fabric
from lightpath.domain.switched_rings import AXES, Degrees, RingPlan, Tile, channel_kinds
from lightpath.errors import Aborted, FailedPrecondition, FieldViolation, InvalidArgument, NotFound
from lightpath.v1 import common_pb2, ocs_manager_pb2, ocs_manager_pb2_grpc
from lightpath.v1 import ocs_manager_pb2 as pb
from lightpath_services.common import paging, redis_store
from lightpath_services.common.convert import fabric_to_proto, tile_to_proto
from lightpath_services.common.server import Runtime, ServiceDefinition
from lightpath_services.ocs_manager.driver import caller_lease
from lightpath_services.ocs_manager.metrics import OcsMetrics
from lightpath_services.ocs_manager.settings import OcsManagerSettings
from lightpath_services.ocs_manager.switched.invariants import RULES, pod_violations
from lightpath_services.ocs_manager.switched.manager import SwitchedFabricManager, check_job_id
from lightpath_services.ocs_manager.switched.queries import SwitchLinkUse, ring_path
from lightpath_services.ocs_manager.switched.store import SwitchedStore, unpack

SERVICE = ocs_manager_pb2.DESCRIPTOR.services_by_name["OcsManager"]
SERVICE_NAME = SERVICE.full_name

SWITCHED_RPCS = (
    "GetSwitchedFabric",
    "ReserveRings",
    "ReleaseRings",
    "SwapGroup",
    "GetRings",
    "ListRingReservations",
    "ListSwitchLinkUse",
    "GetFreeUplinks",
)


def refuse_calls(names: Iterable[str], kind: str) -> type:
    """A mixin whose methods answer FAILED_PRECONDITION: this pod's fabric is of
    another kind (one ocs_manager serves one pod of one kind). The class using
    it has `_pod`, the pod id."""

    def make(name: str):
        async def refuse(self, request, context):
            raise FailedPrecondition(
                f"pod {self._pod}",
                f"has fabric kind {kind}; {name} is for the other kind",
                reason="FABRIC_KIND",
            )

        refuse.__name__ = name
        return refuse

    return type(f"Refuse{name_of(kind)}Calls", (), {n: make(n) for n in names})


def name_of(kind: str) -> str:
    return "".join(w.capitalize() for w in kind.split("_"))


# The OCS calls a SWITCHED pod refuses (everything else than identity, invariants and its own).
OCS_RPCS = tuple(
    m.name for m in SERVICE.methods if m.name not in (*SWITCHED_RPCS, "GetInfo", "CheckInvariants")
)


def _annotate(**attributes: object) -> None:
    span = trace.get_current_span()
    for k, v in attributes.items():
        span.set_attribute(f"lightpath.{k}", v)  # type: ignore[arg-type]


def reserve_degrees(d: common_pb2.ParallelismDegrees) -> Degrees:
    """ReserveRings' degrees as given, each at least 1. Unlike a JobSpec's parallelism,
    an unset degree is not taken as 1: the workload scheduler always sends all three,
    and reading 0/0/0 as 1/1/1 stored a one-processor reservation nobody asked for."""
    bad = [
        FieldViolation(f"degrees.{axis}", "must be at least 1 (set all three degrees)")
        for axis in AXES
        if getattr(d, axis) < 1
    ]
    if bad:
        raise InvalidArgument.of(bad)
    return Degrees(d.data, d.pipeline, d.layer)


def tile_from_proto(f: SwitchedFabric, t: pb.GroupTile, field: str) -> Tile:
    group = t.group
    if t.group_name:
        try:
            named = f.group_id(t.group_name)
        except KeyError:
            raise NotFound("group", t.group_name) from None
        if t.group and t.group != named:
            raise InvalidArgument(
                f"{field}.group", f"is {t.group} but group_name {t.group_name!r} is {named}"
            )
        group = named
    if group >= f.group_count:
        raise NotFound("group", str(group), hint=f"the pod has groups 0..{f.group_count - 1}")
    # An unset size means the whole group (a large job's increment, SW-2).
    height = t.height or f.rows
    width = t.width or f.cols
    tile = Tile(group, t.row, t.col, height, width)
    tile.check(f, field)
    return tile


def use_to_proto(u: SwitchLinkUse) -> pb.SwitchLinkUse:
    return pb.SwitchLinkUse(
        switch=u.switch,
        tier=u.tier,
        dim=u.dim,
        plane=u.plane,
        index=u.index,
        down_links=u.down_links,
        down_in_use=u.down_in_use,
        up_links=u.up_links,
        up_in_use=u.up_in_use,
        free_uplinks=u.free_uplinks,
        up_out_free=u.up_out_free,
        up_in_free=u.up_in_free,
    )


def reservation_to_proto(
    f: SwitchedFabric,
    plan: RingPlan,
    *,
    view: int,
    version: int = 0,
    at_ms: int = 0,
    replayed: bool = False,
    only: set[str] | None = None,
) -> pb.RingReservation:
    full = view != pb.RING_VIEW_SUMMARY
    out = pb.RingReservation(
        job_id=plan.job_id,
        degrees=common_pb2.ParallelismDegrees(
            data=plan.degrees.data, pipeline=plan.degrees.pipeline, layer=plan.degrees.layer
        ),
        tiles=[tile_to_proto(f, t) for t in plan.tiles],
        channel_count=len(plan.channels()),
        channels_by_kind={k: v for k, v in channel_kinds(f, plan.channels()).items() if v},
        layout=plan.layout,
        version=version,
        replayed=replayed,
    )
    if at_ms:
        out.reserved_at.CopyFrom(Timestamp(seconds=at_ms // 1000, nanos=(at_ms % 1000) * 1_000_000))
    if full:
        out.assignment.extend(f.node_name(p) for p in plan.assignment)
    for ring in plan.rings:
        if only is not None and ring.name not in only:
            continue
        r = out.rings.add(
            name=ring.name,
            axis=ring.axis,
            processors=[f.node_name(p) for p in ring.processors],
            channel_count=len(ring.channels),
        )
        if full:
            for hop in ring_path(f, ring):
                r.hops.add(nodes=hop.nodes, channels=hop.channels, channel_ids=hop.channel_ids)
    return out


class SwitchedOcsManagerServicer(
    refuse_calls(OCS_RPCS, "SWITCHED"),  # type: ignore[misc]
    ocs_manager_pb2_grpc.OcsManagerServicer,
):
    """The fabric manager of a SWITCHED pod (SW-1 … SW-6)."""

    def __init__(self, runtime: Runtime[OcsManagerSettings], manager: SwitchedFabricManager):
        self._rt = runtime
        self._pod = runtime.settings.pod_id
        self._sw = manager

    async def GetInfo(self, request, context) -> common_pb2.ServiceInfo:
        f = self._sw.fabric
        d = f.describe()
        return self._rt.info(
            SERVICE_NAME,
            pod_id=self._pod,
            fabric_kind="SWITCHED",
            fabric=f.config.spec(),
            groups=str(d["groups"]),
            processors=str(d["processors"]),
        )

    async def CheckInvariants(
        self, request: pb.CheckInvariantsRequest, context
    ) -> pb.InvariantReport:
        """Every stored ring valid, no channel shared, bitmaps equal to the rings (SW-4)."""
        f = self._sw.fabric
        store = self._sw.store
        for _ in range(5):
            before = await store.redis.get(store.k_ver)
            ids = await store.job_ids(limit=1_000_000)
            plans = {}
            for job_id in ids:
                stored = await store.get(job_id)
                if stored is not None:
                    plans[job_id] = stored.plan
            async with store.redis.pipeline(transaction=True) as pipe:
                pipe.get(store.k_ver)
                pipe.get(store.k_used)
                pipe.get(store.k_procs)
                after, used, procs = await pipe.execute()
            if before == after:
                break
        else:
            raise Aborted("the reservations kept changing while checking; retry")
        violations = pod_violations(
            f, plans, unpack(used, f.channel_count), unpack(procs, f.processor_count)
        )
        self._sw.metrics.violations(self._pod, violations)
        channels = sum(len(p.channels()) for p in plans.values())
        rings = sum(len(p.rings) for p in plans.values())
        _annotate(violations=len(violations), jobs=len(plans))
        if violations:
            self._rt.log.error(
                "switched invariant check found %d violations, first: %s %s",
                len(violations),
                violations[0].rule,
                violations[0].detail,
            )
        return pb.InvariantReport(
            ok=not violations,
            violations=[
                pb.InvariantViolation(rule=v.rule, detail=v.detail) for v in violations[:200]
            ],
            slices_checked=len(plans),
            rings_checked=rings,
            channels_checked=channels,
        )

    async def GetSwitchedFabric(self, request, context) -> pb.SwitchedFabric:
        return fabric_to_proto(self._pod, self._sw.fabric)

    async def ReserveRings(self, request: pb.ReserveRingsRequest, context) -> pb.RingReservation:
        f = self._sw.fabric
        check_job_id(request.job_id)
        degrees = reserve_degrees(request.degrees)
        tiles = [tile_from_proto(f, t, f"tiles[{n}]") for n, t in enumerate(request.tiles)]
        _annotate(job_id=request.job_id, processors=degrees.total, groups=len(tiles))
        done = await self._sw.reserve(
            request.job_id, degrees, tiles, caller_lease(request, request.job_id)
        )
        stored = await self._sw.get(request.job_id)
        plan = done.plan
        _annotate(
            rings=len(plan.rings),
            channels=len(plan.channels()),
            attempts=done.attempts,
            replayed=done.replayed,
        )
        if not done.replayed:
            self._rt.log.info(
                "rings reserved for %s: %d rings, %d channels on %d groups",
                request.job_id,
                len(plan.rings),
                len(plan.channels()),
                len(plan.groups),
                extra={"job_id": request.job_id},
            )
        return reservation_to_proto(
            f,
            plan,
            view=request.view,
            version=stored.version,
            at_ms=stored.at_ms,
            replayed=done.replayed,
        )

    async def ReleaseRings(
        self, request: pb.ReleaseRingsRequest, context
    ) -> pb.ReleaseRingsResponse:
        check_job_id(request.job_id)
        _annotate(job_id=request.job_id)
        plan = await self._sw.release(request.job_id, caller_lease(request, request.job_id))
        self._rt.log.info(
            "rings released for %s: %d channels",
            request.job_id,
            len(plan.channels()),
            extra={"job_id": request.job_id},
        )
        return pb.ReleaseRingsResponse(
            job_id=request.job_id,
            rings_released=len(plan.rings),
            channels_released=len(plan.channels()),
        )

    async def SwapGroup(self, request: pb.SwapGroupRequest, context) -> pb.SwapGroupResponse:
        f = self._sw.fabric
        check_job_id(request.job_id)
        if request.failed_group >= f.group_count:
            raise NotFound(
                "group",
                str(request.failed_group),
                hint=f"the pod has groups 0..{f.group_count - 1}",
            )
        for n, g in enumerate(request.free_groups):
            if g >= f.group_count:
                raise InvalidArgument(
                    f"free_groups[{n}]", f"must be a group of this pod (0..{f.group_count - 1})"
                )
        new_tiles = [
            tile_from_proto(f, t, f"new_tiles[{n}]") for n, t in enumerate(request.new_tiles)
        ]
        _annotate(job_id=request.job_id, failed_group=f.group_name(request.failed_group))
        result = await self._sw.swap(
            request.job_id,
            request.failed_group,
            list(request.free_groups),
            new_tiles,
            caller_lease(request, request.job_id),
        )
        stored = await self._sw.get(request.job_id)
        self._rt.log.info(
            "job %s: group %s swapped for %s, %d rings re-routed",
            request.job_id,
            f.group_name(result.old_tile.group),
            f.group_name(result.new_tile.group),
            len(result.rerouted),
            extra={"job_id": request.job_id},
        )
        return pb.SwapGroupResponse(
            reservation=reservation_to_proto(
                f, result.plan, view=request.view, version=stored.version, at_ms=stored.at_ms
            ),
            old_tile=tile_to_proto(f, result.old_tile),
            new_tile=tile_to_proto(f, result.new_tile),
            rerouted=list(result.rerouted),
            channels_released=len(result.released),
            channels_reserved=len(result.reserved),
            rings_untouched=len(result.plan.rings) - len(result.rerouted),
        )

    async def GetRings(self, request: pb.GetRingsRequest, context) -> pb.RingReservation:
        check_job_id(request.job_id)
        stored = await self._sw.get(request.job_id)
        only = set(request.rings) or None
        if only:
            unknown = sorted(only - {r.name for r in stored.plan.rings})
            if unknown:
                raise NotFound(
                    "ring",
                    unknown[0],
                    hint=f"job {request.job_id} has rings like {stored.plan.rings[0].name}"
                    if stored.plan.rings
                    else "",
                )
        return reservation_to_proto(
            self._sw.fabric,
            stored.plan,
            view=request.view,
            version=stored.version,
            at_ms=stored.at_ms,
            only=only,
        )

    async def ListRingReservations(
        self, request: pb.ListRingReservationsRequest, context
    ) -> pb.ListRingReservationsResponse:
        limit = paging.page_size(request.page_size)
        after = paging.token_id(request.page_token)
        ids = await self._sw.store.job_ids(after=after or "", limit=limit + 1)
        out = pb.ListRingReservationsResponse()
        f = self._sw.fabric
        for job_id in ids[:limit]:
            stored = await self._sw.store.get(job_id)
            if stored is None:
                continue
            p = stored.plan
            out.reservations.add(
                job_id=job_id,
                degrees=common_pb2.ParallelismDegrees(
                    data=p.degrees.data, pipeline=p.degrees.pipeline, layer=p.degrees.layer
                ),
                tiles=[tile_to_proto(f, t) for t in p.tiles],
                rings=len(p.rings),
                channel_count=len(p.channels()),
            )
        if len(ids) > limit:
            out.next_page_token = paging.page_token(ids[limit - 1])
        return out

    async def ListSwitchLinkUse(
        self, request: pb.ListSwitchLinkUseRequest, context
    ) -> pb.ListSwitchLinkUseResponse:
        f = self._sw.fabric
        if request.HasField("tier") and request.tier > 1:
            raise InvalidArgument("tier", "must be 0 or 1")
        out = pb.ListSwitchLinkUseResponse()
        if request.switches:
            uses = await self._sw.switch_use(list(request.switches))
            out.switches.extend(use_to_proto(u) for u in uses)
            return out
        ids = [s for s in f.switches() if not request.HasField("tier") or f.tier(s) == request.tier]
        start = paging.token_int(request.page_token, maximum=len(ids)) or 0
        limit = paging.page_size(request.page_size)
        page = ids[start : start + limit]
        snap = await self._sw.snapshot()
        out.switches.extend(use_to_proto(u) for u in self._sw.index.use(snap.used, page))
        if start + limit < len(ids):
            out.next_page_token = paging.page_token(start + limit)
        return out

    async def GetFreeUplinks(
        self, request: pb.GetFreeUplinksRequest, context
    ) -> pb.GetFreeUplinksResponse:
        f = self._sw.fabric
        if request.switches:
            uses = await self._sw.switch_use(list(request.switches))
            for u in uses:
                if u.tier != 0:
                    raise InvalidArgument(
                        "switches", f"{u.switch} is a tier-1 switch; uplinks are counted at tier 0"
                    )
        else:
            snap = await self._sw.snapshot()
            uses = self._sw.index.use(snap.used, [s for s in f.switches() if f.tier(s) == 0])
        uses.sort(key=lambda u: (u.free_uplinks, u.switch))
        return pb.GetFreeUplinksResponse(
            switches=[use_to_proto(u) for u in uses],
            uplinks=sum(u.up_links for u in uses),
            free_uplinks=sum(u.free_uplinks for u in uses),
        )


async def build_switched(
    runtime: Runtime[OcsManagerSettings], *, metrics: OcsMetrics | None = None
) -> list[ServiceDefinition]:
    """The servicer of a SWITCHED pod: the fabric from LIGHTPATH_SWITCHED_FABRIC, the
    reservations in Redis (binary client: the bitmaps are bytes)."""
    s = runtime.settings
    fabric = build_fabric(s.switched_config)
    client = redis_store.connect_with(s, decode_responses=False)
    runtime.on_stop(client.aclose)
    store = SwitchedStore(client, s.pod_id, fabric)
    status = await store.ensure_fabric()
    if status == "CHANGED":
        runtime.log.warning(
            "pod %s switched fabric changed to %s (no job held rings)",
            s.pod_id,
            fabric.config.spec(),
        )
    manager = SwitchedFabricManager(fabric, store, metrics)
    if metrics is not None:
        metrics.serving(s.pod_id, RULES)
        runtime.supervise(lambda: metrics.run_switched(store), "ring metrics", needed=False)
    runtime.log.info(
        "pod %s switched fabric: %s (%d groups, %d processors, %d links)",
        s.pod_id,
        fabric.config.spec(),
        fabric.group_count,
        fabric.processor_count,
        fabric.link_count,
    )
    servicer = SwitchedOcsManagerServicer(runtime, manager)
    return [
        ServiceDefinition(
            SERVICE_NAME, servicer, ocs_manager_pb2_grpc.add_OcsManagerServicer_to_server
        )
    ]
