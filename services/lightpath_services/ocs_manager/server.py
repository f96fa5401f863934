"""gRPC servicer of ocs_manager: protobuf <-> domain, errors -> status (via the runtime).

The seed's behaviour lives in lightpath/domain/torus.py (port map), wiring.py
(OCS-2/4/5), invariants.py (OCS-6); the steps of a change in manager.py; Redis in store.py;
the switches behind driver.py. This file only translates.
"""

from __future__ import annotations

from opentelemetry import trace

from lightpath.domain.torus import SECOND, Fabric, FabricConfig, validate_config
from lightpath.errors import Aborted, FailedPrecondition, InvalidArgument, NotFound
from lightpath.v1 import common_pb2, ocs_manager_pb2, ocs_manager_pb2_grpc
from lightpath.v1 import ocs_manager_pb2 as pb
from lightpath_services.common import paging
from lightpath_services.common.keys import require_id
from lightpath_services.common.server import Runtime, ServiceDefinition
from lightpath_services.ocs_manager import convert
from lightpath_services.ocs_manager.agent_driver import AgentSwitchDriver
from lightpath_services.ocs_manager.driver import (
    RedisSwitchDriver,
    SwitchDriver,
    caller_lease,
)
from lightpath_services.ocs_manager.encode import WiringEncoder
from lightpath_services.ocs_manager.invariants import RULES, FabricState, Violation, check
from lightpath_services.ocs_manager.manager import FabricManager
from lightpath_services.ocs_manager.metrics import OcsMetrics
from lightpath_services.ocs_manager.reconcile import REPAIR_REASONS, SwitchReconciler
from lightpath_services.ocs_manager.settings import OcsManagerSettings
from lightpath_services.ocs_manager.store import OcsStore
from lightpath_services.ocs_manager.switch_drivers import switch_driver
from lightpath_services.ocs_manager.switched.server import (
    SWITCHED_RPCS,
    build_switched,
    refuse_calls,
)
from lightpath_services.ocs_manager.wiring import cross_connect_count, links, validate_placement

SERVICE_NAME = ocs_manager_pb2.DESCRIPTOR.services_by_name["OcsManager"].full_name


def _annotate(**attributes: object) -> None:
    span = trace.get_current_span()
    for k, v in attributes.items():
        span.set_attribute(f"lightpath.{k}", v)  # type: ignore[arg-type]


def switch_health(mismatched: dict[str, str], unreachable: list[str]) -> str:
    """GetInfo `health` (issue 34): "ok", or why switches are not programmed, each named:
    one that does not match the fabric (never programmed: changes needing it are refused)
    and those that do not answer (changes needing them fail; the reconcile loop retries)."""
    why = [
        f"switch {sid} does not match the fabric ({reason}): never programmed, changes "
        "needing it are refused"
        for sid, reason in sorted(mismatched.items())
    ]
    if unreachable:
        down = sorted(unreachable)
        why.append(
            f"switch {down[0]} does not answer"
            + (f" (and {len(down) - 1} more: {', '.join(down[1:8])})" if len(down) > 1 else "")
        )
    return "degraded: " + "; ".join(why) if why else "ok"


class FabricMismatchError(RuntimeError):
    """The pod's stored fabric differs from this instance's while slices are wired."""


class OcsManagerServicer(
    refuse_calls(SWITCHED_RPCS, "OCS_TORUS"),  # type: ignore[misc]
    ocs_manager_pb2_grpc.OcsManagerServicer,
):
    def __init__(
        self,
        runtime: Runtime[OcsManagerSettings],
        manager: FabricManager,
        reconciler: SwitchReconciler | None = None,
    ):
        self._rt = runtime
        self._reconciler = reconciler
        self._pod = runtime.settings.pod_id
        self._m = manager
        self._fabric = manager.fabric
        self._store = manager.store
        self._enc = WiringEncoder(manager.fabric)

    async def GetInfo(self, request: common_pb2.GetInfoRequest, context) -> common_pb2.ServiceInfo:
        c = self._fabric.config
        more = {}
        r = self._reconciler
        if r is not None:
            more = {
                "health": switch_health(r.driver.mismatched, r.last.unreachable if r.last else []),
                "switch_reconcile_passes": str(r.passes),
                "switch_reconcile_deferrals": str(r.deferrals),
                "switches_unreachable": str(len(r.last.unreachable) if r.last else 0),
                "switches_mismatched": ", ".join(
                    f"{sid} ({why})" for sid, why in sorted(r.driver.mismatched.items())
                ),
            }
        return self._rt.info(
            SERVICE_NAME,
            pod_id=self._pod,
            fabric_kind="OCS_TORUS",
            fabric=c.describe(),
            ocs=str(self._fabric.ocs_count),
            switch_driver=(
                self._m.driver.kinds if isinstance(self._m.driver, AgentSwitchDriver) else "redis"
            ),
            **more,
        )

    # -- fabric (OCS-1) ----------------------------------------------------------

    async def GetFabric(self, request: pb.GetFabricRequest, context) -> pb.Fabric:
        return convert.fabric_to_proto(self._fabric, self._pod)

    async def PlanFabric(self, request: pb.PlanFabricRequest, context) -> pb.Fabric:
        config = convert.config_from_proto(request.config)
        validate_config(config, prefix="config.")
        return convert.fabric_to_proto(Fabric(config), "")

    async def GetPortMap(self, request: pb.GetPortMapRequest, context) -> pb.PortMap:
        f = self._fabric
        block = request.block_id if request.HasField("block_id") else None
        dim = request.dim if request.HasField("dim") else None
        if block is not None and block >= f.block_count:
            raise NotFound("block", str(block), hint=f"pod has blocks 0..{f.block_count - 1}")
        if dim is not None and dim >= f.dims:
            raise InvalidArgument("dim", f"must be < {f.dims}: the blocks have {f.dims} dimensions")
        ocs = self._ocs(request.ocs_id) if request.ocs_id else None
        out = pb.PortMap()
        for e in f.port_map(block, dim, ocs):
            out.entries.add(
                segment=convert.segment(e.block, e.dim, e.axis, e.end),
                ports=[pb.PortRef(ocs_id=f.ocs_ids[o], port=p) for o, p in e.ports],
                one_to_many_id=(
                    f.one_to_many_id(e.block, e.dim, e.axis) if e.one_to_many is not None else ""
                ),
            )
        return out

    def _ocs(self, ocs_id: str) -> int:
        index = self._fabric.parse_ocs_id(ocs_id)
        if index is None:
            f = self._fabric
            raise NotFound(
                "ocs",
                ocs_id,
                hint=f"ids are ocs-<dim>-<axis>-<k> with k < K={f.k}, e.g. {f.ocs_ids[0]}",
            )
        return index

    # -- changes (OCS-2 … OCS-5) ---------------------------------------------------

    async def WireSlice(self, request: pb.WireSliceRequest, context) -> pb.SliceWiring:
        _annotate(job_id=request.job_id, blocks=len(request.blocks), twisted=request.twisted)
        placement = validate_placement(
            self._fabric,
            request.job_id,
            list(request.grid.dims),
            [(list(b.position.coords), b.block_id) for b in request.blocks],
            list(request.wrap),
            request.twisted,
        )
        if request.HasField("expect_fabric"):
            bad = convert.check_expected_fabric(self._fabric, request.expect_fabric)
            if bad:
                raise FailedPrecondition(
                    "fabric",
                    "; ".join(f"{v.field}: {v.rule}" for v in bad),
                    reason="FABRIC_MISMATCH",
                )
        outcome = await self._m.wire(placement, caller_lease(request, placement.job_id))
        msg = convert.slice_wiring(
            self._enc, outcome.record, request.view, replayed=outcome.replayed
        )
        _annotate(cross_connects=msg.cross_connect_count, replayed=outcome.replayed)
        self._rt.log.info(
            "slice %s %s: %d blocks%s, %d cross-connects",
            placement.job_id,
            "already wired" if outcome.replayed else "wired",
            len(placement.blocks),
            " (twisted torus)" if placement.twisted else "",
            msg.cross_connect_count,
        )
        return msg

    async def ReleaseSlice(
        self, request: pb.ReleaseSliceRequest, context
    ) -> pb.ReleaseSliceResponse:
        _annotate(job_id=request.job_id)
        job = require_id(request.job_id, "job_id")
        out = await self._m.release(job, caller_lease(request, job))
        removed = cross_connect_count(self._fabric, out.change.disconnect)
        cleared = removed if self._fabric.k > 1 else 0
        _annotate(cross_connects=removed)
        self._rt.log.info("slice %s released: %d cross-connects removed", request.job_id, removed)
        return pb.ReleaseSliceResponse(
            job_id=request.job_id, cross_connects_removed=removed, one_to_many_cleared=cleared
        )

    async def ReplaceBlock(
        self, request: pb.ReplaceBlockRequest, context
    ) -> pb.ReplaceBlockResponse:
        job = require_id(request.job_id, "job_id")
        _annotate(job_id=job, failed_block=request.failed_block_id, new_block=request.new_block_id)
        out = await self._m.replace(
            job, request.failed_block_id, request.new_block_id, caller_lease(request, job)
        )
        rep = out.replacement
        msg = pb.ReplaceBlockResponse(
            wiring=convert.slice_wiring(self._enc, out.record, request.view, replayed=out.replayed),
            untouched=cross_connect_count(self._fabric, rep.untouched),
        )
        msg.MergeFromString(
            self._enc.cross_connects(msg.REMOVED_FIELD_NUMBER, rep.change.disconnect, job)
            + self._enc.cross_connects(msg.ADDED_FIELD_NUMBER, rep.change.connect, job)
        )
        convert.change_one_to_many(msg.one_to_many_changed, self._fabric, rep.change, job)
        _annotate(moved=len(msg.added), untouched=msg.untouched)
        self._rt.log.info(
            "slice %s: block %d replaced by %d, %d cross-connects moved, %d untouched",
            job,
            request.failed_block_id,
            request.new_block_id,
            len(msg.added),
            msg.untouched,
        )
        return msg

    # -- queries (OCS-7) -----------------------------------------------------------

    async def GetSliceWiring(self, request: pb.GetSliceWiringRequest, context) -> pb.SliceWiring:
        record = await self._store.get_slice(require_id(request.job_id, "job_id"))
        if record is None:
            raise NotFound("slice", request.job_id)
        return convert.slice_wiring(self._enc, record, request.view)

    async def ListSlices(self, request: pb.ListSlicesRequest, context) -> pb.ListSlicesResponse:
        limit = paging.page_size(request.page_size)
        after = paging.token_id(request.page_token)
        records, more = await self._store.list_slices(after or "", limit)
        out = pb.ListSlicesResponse()
        for r in records:
            out.slices.add(
                job_id=r.placement.job_id,
                grid=common_pb2.Shape(dims=r.placement.grid),
                block_ids=r.placement.blocks,
                cross_connects=cross_connect_count(self._fabric, links(r.placement)),
                twisted=r.placement.twisted,
            )
        if more and records:
            out.next_page_token = paging.page_token(records[-1].placement.job_id)
        return out

    async def GetRoutingTable(self, request: pb.GetRoutingTableRequest, context) -> pb.RoutingTable:
        ocs = self._ocs(request.ocs_id)
        table, version, owners = await self._store.routing_table(ocs)
        return convert.routing_table(self._fabric, ocs, table, version, owners)

    async def ListSwitches(
        self, request: pb.ListSwitchesRequest, context
    ) -> pb.ListSwitchesResponse:
        f = self._fabric
        limit = paging.page_size(request.page_size)
        start = paging.token_int(request.page_token, maximum=f.ocs_count) or 0
        indices = range(start, min(start + limit, f.ocs_count))
        use = await self._store.switch_use(indices)
        out = pb.ListSwitchesResponse()
        for i, (in_use, version) in zip(indices, use, strict=True):
            d, a, k = f.ocs_of_index(i)
            out.switches.add(
                ocs_id=f.ocs_ids[i],
                dim=d,
                axis=a,
                k=k,
                radix=f.config.ocs_radix,
                ports_cabled=f.ports_cabled(k),
                ports_in_use=in_use,
                version=version,
            )
        if indices.stop < f.ocs_count:
            out.next_page_token = paging.page_token(indices.stop)
        return out

    async def GetOneToManyStates(
        self, request: pb.GetOneToManyStatesRequest, context
    ) -> pb.GetOneToManyStatesResponse:
        f = self._fabric
        blocks = list(range(f.block_count))
        if request.HasField("block_id"):
            if request.block_id >= f.block_count:
                raise NotFound("block", str(request.block_id))
            blocks = [request.block_id]
        if request.job_id:
            record = await self._store.get_slice(require_id(request.job_id, "job_id"))
            if record is None:
                raise NotFound("slice", request.job_id)
            blocks = [b for b in blocks if b in record.placement.blocks]
        out = pb.GetOneToManyStatesResponse()
        if f.k == 1:
            return out  # no 1xK switches in this fabric
        states = await self._store.one_to_many(blocks)
        owners = await self._store.owners()
        for b in blocks:
            for d in range(f.dims):
                for a in range(f.axes[d]):
                    selected = states[b].get((d, a), -1)
                    out.states.add(
                        switch_id=f.one_to_many_id(b, d, a),
                        segment=convert.segment(b, d, a, SECOND),
                        outputs=[
                            pb.PortRef(
                                ocs_id=f.ocs_ids[f.ocs_index(d, a, k)], port=f.second_port(b, k)
                            )
                            for k in range(f.k)
                        ],
                        selected_output=selected,
                        job_id=owners.get(b, "") if selected >= 0 else "",
                    )
        return out

    # -- invariants (OCS-6) ----------------------------------------------------------

    async def CheckInvariants(
        self, request: pb.CheckInvariantsRequest, context
    ) -> pb.InvariantReport:
        state = await self._store.snapshot()
        violations = check(self._fabric, state)
        if request.compare_switches:
            violations += await self._compare_switches(state)
        self._m.metrics.violations(self._pod, violations)
        _annotate(violations=len(violations), slices=len(state.slices))
        if violations:
            self._rt.log.error(
                "invariant check found %d violations, first: %s %s",
                len(violations),
                violations[0].rule,
                violations[0].detail,
            )
        return pb.InvariantReport(
            ok=not violations,
            violations=[pb.InvariantViolation(rule=v.rule, detail=v.detail) for v in violations],
            slices_checked=len(state.slices),
            cross_connects_checked=state.cross_connect_count,
        )

    async def _compare_switches(self, state: FabricState):
        """Switches vs committed tables; blocks with a change in flight are skipped."""
        for _ in range(5):
            devices = await self._m.driver.read()
            again = await self._store.snapshot()
            if again.tables == state.tables and again.one_to_many == state.one_to_many:
                break
            state = again
        else:
            raise Aborted("the fabric kept changing while comparing switches; retry")
        if devices is None:
            return [Violation("SWITCH_STATE_DISAGREES", "the switch driver cannot read state")]
        f = self._fabric
        busy = {
            b
            for s in state.slices.values()
            if s.changing
            for b in (*s.placement.blocks, *s.reserved)
        }
        out = []
        for ocs in sorted(set(state.tables) | set(devices.tables)):
            _, _, k = f.ocs_of_index(ocs)
            want, have = state.tables.get(ocs, {}), devices.tables.get(ocs, {})
            for p in sorted(set(want) | set(have)):
                seg = f.segment_at(k, p)
                if want.get(p) != have.get(p) and (seg is None or seg[0] not in busy):
                    out.append(
                        Violation(
                            "SWITCH_STATE_DISAGREES",
                            f"{f.ocs_ids[ocs]} port {p}: committed {want.get(p)}, "
                            f"switch {have.get(p)}",
                        )
                    )
        for i in sorted(set(state.one_to_many) | set(devices.one_to_many)):
            b, d, a = f.one_to_many_of_index(i)
            if state.one_to_many.get(i) != devices.one_to_many.get(i) and b not in busy:
                out.append(
                    Violation(
                        "SWITCH_STATE_DISAGREES",
                        f"{f.one_to_many_id(b, d, a)}: committed {state.one_to_many.get(i)}, "
                        f"switch {devices.one_to_many.get(i)}",
                    )
                )
        return out[:200]


async def build(
    runtime: Runtime[OcsManagerSettings],
    *,
    driver: SwitchDriver | None = None,
    metrics: OcsMetrics | None = None,
) -> list[ServiceDefinition]:
    """The servicer over this pod's fabric. `driver` replaces the default (Redis) switch driver.
    A pod of fabric kind SWITCHED gets the switched fabric manager (seed 002) instead."""
    s = runtime.settings
    metrics = metrics or OcsMetrics()
    if s.fabric_kind == "SWITCHED":
        return await build_switched(runtime, metrics=metrics)
    fabric = Fabric.build(s.fabric_config)
    store = OcsStore(runtime.redis, s.pod_id, fabric)
    status = await store.ensure_fabric()
    if status.status == "IN_USE":
        raise FabricMismatchError(
            f"pod {s.pod_id} is wired with another fabric ({_describe(status.old)}) and "
            f"{status.slices} slice(s) are wired on it; this instance is configured with "
            f"{fabric.config.describe()}. Restore the pod's configuration, or release its "
            "slices before changing the fabric."
        )
    if status.status == "CHANGED":
        runtime.log.warning(
            "pod %s fabric changed from %s to %s (no slice was wired)",
            s.pod_id,
            _describe(status.old),
            fabric.config.describe(),
        )
    reconciler: SwitchReconciler | None = None
    if driver is None and (s.switch_agents or s.switches):
        agents = agent_driver(runtime, fabric)
        await agents.check_inventory()
        reconciler = SwitchReconciler(
            fabric, store, agents, interval_s=s.reconcile_s, metrics=metrics
        )
        driver = agents
    elif driver is None:
        default = RedisSwitchDriver(
            runtime.redis, s.pod_id, fabric, settle_s=s.driver_settle_ms / 1000
        )
        await default.init()
        driver = default
    manager = FabricManager(fabric, store, driver, lease_s=s.change_lease_s, metrics=metrics)
    metrics.serving(s.pod_id, RULES, repairs=REPAIR_REASONS if reconciler else ())
    if reconciler is not None:
        # Fail-static: adopt what the switches hold, put back what a restarted one lost.
        runtime.supervise(reconciler.run, "switch reconcile")
        runtime.log.info(
            "pod %s: switches behind agents (%s), reconciled every %.1f s",
            s.pod_id,
            s.switch_agents,
            s.reconcile_s,
        )
    runtime.supervise(
        lambda: metrics.run(store, fabric, runtime.redis), "fabric metrics", needed=False
    )
    runtime.log.info(
        "pod %s fabric: %s, %d OCS", s.pod_id, fabric.config.describe(), fabric.ocs_count
    )
    servicer = OcsManagerServicer(runtime, manager, reconciler)
    return [
        ServiceDefinition(
            SERVICE_NAME, servicer, ocs_manager_pb2_grpc.add_OcsManagerServicer_to_server
        )
    ]


def agent_driver(runtime: Runtime[OcsManagerSettings], fabric: Fabric) -> AgentSwitchDriver:
    """The driver of switches behind agents or their own management interfaces
    (LIGHTPATH_OCS_SWITCHES / _SWITCH_AGENTS; switch_drivers.py)."""
    return switch_driver(runtime, fabric)


def _describe(raw: str) -> str:
    try:
        return FabricConfig.from_json(raw).describe()
    except (ValueError, KeyError, TypeError):
        return raw
