"""gRPC servicers of switch_agent: the southbound (OpticalSwitch) and its fault injection
(OpticalSwitchAdmin, operators only). Protobuf <-> the simulated switches (switches.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from google.protobuf import duration_pb2

from lightpath.domain.southbound import devices, select
from lightpath.domain.torus import Fabric
from lightpath.errors import DeadlineExceeded, InvalidArgument, LightpathError
from lightpath.v1 import common_pb2, optical_switch_pb2_grpc
from lightpath.v1 import optical_switch_pb2 as pb
from lightpath_services.common.errors import to_status_proto
from lightpath_services.common.server import Runtime, ServiceDefinition
from lightpath_services.switch_agent.agent import Agent
from lightpath_services.switch_agent.faults import Faults
from lightpath_services.switch_agent.settings import SwitchAgentSettings
from lightpath_services.switch_agent.switches import Batch, SimulatedSwitch, power_dbm

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["OpticalSwitch"].full_name
ADMIN_SERVICE_NAME = pb.DESCRIPTOR.services_by_name["OpticalSwitchAdmin"].full_name
MAX_BATCHES = 4096
_KIND = {"OCS": pb.SWITCH_KIND_OCS, "ONE_TO_K": pb.SWITCH_KIND_ONE_TO_K}


def batch_deadline_s(call_remaining_s: float | None, batch: pb.ApplyBatchRequest) -> float | None:
    """How long one batch of an ApplyBatches call may take before its result answers
    DEADLINE_EXCEEDED (issue 34): its own `timeout`, within the call's deadline less what
    the answer needs to travel (5 %, at least 50 ms). None: no deadline at all."""
    own = batch.timeout.ToNanoseconds() / 1e9 if batch.HasField("timeout") else None
    call = None
    if call_remaining_s is not None:
        call = max(0.0, call_remaining_s - max(0.05, 0.05 * call_remaining_s))
    if own is None or own <= 0:
        return call
    return own if call is None else min(own, call)


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def describe(sw: SimulatedSwitch, settle_s: float) -> pb.SwitchDescription:
    return pb.SwitchDescription(
        switch_id=sw.id,
        kind=_KIND[sw.device.kind],
        ports=sw.device.ports,
        outputs=sw.device.outputs,
        boot_id=sw.boot_id,
        version=sw.version,
        settling_time=_duration(settle_s + sw.faults.extra_delay_s),
        vendor="Lightpath",
        model="reference agent (simulated MEMS)",
    )


class OpticalSwitchServicer(optical_switch_pb2_grpc.OpticalSwitchServicer):
    def __init__(self, agent: Agent):
        self._agent = agent

    def _reachable(self, switch_id: str) -> SimulatedSwitch:
        sw = self._agent.switch(switch_id)
        sw.check_reachable()
        return sw

    async def Describe(self, request: pb.DescribeSwitchRequest, context) -> pb.SwitchDescription:
        return describe(self._reachable(request.switch_id), self._agent.settle_s)

    async def GetCrossConnects(
        self, request: pb.GetCrossConnectsRequest, context
    ) -> pb.OpticalSwitchState:
        sw = self._reachable(request.switch_id)
        out = pb.OpticalSwitchState(switch_id=sw.id, boot_id=sw.boot_id, version=sw.version)
        for p, q in sw.pairs():
            out.cross_connects.add(port_a=p, port_b=q)
        for i, o in sorted(sw.outputs.items()):
            out.outputs.add(input=i, output=o)
        return out

    async def ApplyBatch(self, request: pb.ApplyBatchRequest, context) -> pb.ApplyBatchResponse:
        return await self._apply(request)

    async def ApplyBatches(
        self, request: pb.ApplyBatchesRequest, context
    ) -> pb.ApplyBatchesResponse:
        reqs = request.batches
        if not reqs:
            raise InvalidArgument("batches", "give at least one batch")
        if len(reqs) > MAX_BATCHES:
            raise InvalidArgument("batches", f"at most {MAX_BATCHES} batches in one call")
        first: dict[str, int] = {}
        for i, r in enumerate(reqs):
            if r.switch_id in first:
                raise InvalidArgument(
                    f"batches[{i}].switch_id",
                    f"{r.switch_id} is also in batches[{first[r.switch_id]}]: one batch per "
                    "switch per call (their order would be undefined)",
                )
            first[r.switch_id] = i

        remaining = context.time_remaining() if context is not None else None

        async def one(r: pb.ApplyBatchRequest) -> pb.ApplyBatchResult:
            # each switch answers by its own deadline: a slow one never makes the call
            # fail whole (the batch itself goes on: switches.py shields it)
            limit = batch_deadline_s(remaining, r)
            try:
                async with asyncio.timeout(limit):
                    return pb.ApplyBatchResult(applied=await self._apply(r))
            except LightpathError as err:
                return pb.ApplyBatchResult(error=to_status_proto(err))
            except TimeoutError:
                late = DeadlineExceeded(
                    f"switch {r.switch_id} did not settle within {limit:g} s (the batch goes "
                    "on; ask again with the same batch_id)",
                    metadata={"switch_id": r.switch_id},
                )
                return pb.ApplyBatchResult(error=to_status_proto(late))

        return pb.ApplyBatchesResponse(results=await asyncio.gather(*(one(r) for r in reqs)))

    async def _apply(self, request: pb.ApplyBatchRequest) -> pb.ApplyBatchResponse:
        sw = self._agent.switch(request.switch_id)
        batch = Batch(
            tuple((c.port_a, c.port_b) for c in request.disconnect),
            tuple(
                (o.input, o.output if o.HasField("output") else None) for o in request.set_outputs
            ),
            tuple((c.port_a, c.port_b) for c in request.connect),
        )
        outcome, replayed = await sw.apply(
            request.batch_id,
            batch,
            settle_s=self._agent.timing,
            persist=self._agent.persist,
            expect_boot_id=request.expect_boot_id,
            expect_version=request.expect_version if request.HasField("expect_version") else None,
            fence=(request.fence.lease_id, request.fence.token)
            if request.HasField("fence")
            else None,
        )
        p = outcome.progress
        return pb.ApplyBatchResponse(
            switch_id=sw.id,
            batch_id=request.batch_id,
            boot_id=outcome.boot_id,
            version=outcome.version,
            replayed=replayed,
            applied=pb.BatchProgress(
                disconnects=p.disconnects, outputs=p.outputs, connects=p.connects
            ),
        )

    async def GetPortStatus(self, request: pb.GetPortStatusRequest, context) -> pb.PortStatusList:
        sw = self._reachable(request.switch_id)
        out = pb.PortStatusList(switch_id=sw.id, boot_id=sw.boot_id, version=sw.version)
        state = sw.table if sw.is_ocs else sw.outputs
        for port in range(sw.device.ports):
            peer = state.get(port)
            if port in sw.settling:
                st = pb.PORT_STATE_SETTLING
            elif peer is None:
                st = pb.PORT_STATE_DARK
            else:
                st = pb.PORT_STATE_CONNECTED
            entry = out.ports.add(port=port, state=st)
            if peer is not None:
                entry.peer = peer
            if sw.is_ocs:
                entry.power_dbm = power_dbm(sw.id, port, peer, port in sw.settling)
        return out


class OpticalSwitchAdminServicer(optical_switch_pb2_grpc.OpticalSwitchAdminServicer):
    def __init__(self, runtime: Runtime[SwitchAgentSettings], agent: Agent):
        self._rt = runtime
        self._agent = agent

    async def GetInfo(self, request: common_pb2.GetInfoRequest, context) -> common_pb2.ServiceInfo:
        s = self._rt.settings
        return self._rt.info(
            ADMIN_SERVICE_NAME,
            pod_id=s.pod_id,
            switches=str(len(self._agent.switches)),
            settle_ms=f"{s.settle_ms:g}",
            state=s.state_file or "memory",
        )

    async def InjectFault(self, request: pb.InjectFaultRequest, context) -> pb.InjectFaultResponse:
        f = request.faults
        delay = f.extra_delay.ToNanoseconds() / 1e9
        if delay < 0 or delay > 3600:
            raise InvalidArgument("faults.extra_delay", "must be 0 .. 3600 s")
        faults = Faults(f.unreachable, delay, f.reject_batches, f.partial_batches)
        ids = self._agent.set_faults(request.switch_id, faults)
        self._rt.log.warning(
            "faults of %s set to %s",
            request.switch_id if request.switch_id == "*" else ids[0],
            faults if faults.any else "none",
        )
        return pb.InjectFaultResponse(switch_ids=ids, faults=request.faults)

    async def RestartSwitch(
        self, request: pb.RestartSwitchRequest, context
    ) -> pb.SwitchDescription:
        sw = await self._agent.restart(request.switch_id)
        return describe(sw, self._agent.settle_s)

    async def GetSwitchStats(self, request: pb.GetSwitchStatsRequest, context) -> pb.SwitchStats:
        targets = (
            self._agent.targets(request.switch_id)
            if request.switch_id
            else list(self._agent.switches.values())
        )
        out = pb.SwitchStats(switch_id=request.switch_id)
        for sw in targets:
            s = sw.stats
            out.apply_calls += s.apply_calls
            out.batches_applied += s.batches_applied
            out.batches_replayed += s.batches_replayed
            out.batches_failed += s.batches_failed
            out.operations_applied += s.operations_applied
            out.restarts += s.restarts
            out.stale_batches_refused += s.stale_batches_refused
        return out


async def build(runtime: Runtime[SwitchAgentSettings]) -> list[ServiceDefinition]:
    s = runtime.settings
    fabric = Fabric.build(s.fabric_config)
    served = select(devices(fabric), s.switches)  # not empty: the settings checked
    agent = Agent(
        served,
        settle_s=s.settle_ms / 1000,
        timing=s.switch_timing,
        state_file=Path(s.state_file) if s.state_file else None,
        faults=s.faults,
        keys_kept=s.idempotency_keys,
    )
    runtime.log.info(
        "pod %s: serving %d switches (%s), settling %s, state %s%s",
        s.pod_id,
        len(served),
        s.switches,
        agent.timing.describe(),
        s.state_file or "in memory",
        f", faults {s.faults}" if s.faults else "",
    )
    return [
        ServiceDefinition(
            SERVICE_NAME,
            OpticalSwitchServicer(agent),
            optical_switch_pb2_grpc.add_OpticalSwitchServicer_to_server,
        ),
        ServiceDefinition(
            ADMIN_SERVICE_NAME,
            OpticalSwitchAdminServicer(runtime, agent),
            optical_switch_pb2_grpc.add_OpticalSwitchAdminServicer_to_server,
        ),
    ]
