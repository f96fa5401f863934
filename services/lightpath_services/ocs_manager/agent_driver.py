"""A switch driver that speaks the open southbound (optical_switch.proto) to switch agents.

`AgentSwitchDriver` turns a `FabricChange` into one `ApplyBatch` per switch it
touches (an OCS's disconnects and connects; a block's bank of 1xK switches'
output selections) and sends them all at once (asyncio.gather): the switches of
one change are programmed in parallel, so a full pod takes about one settling
time. Within a switch the order is the protocol's: disconnects, outputs, connects.

When some switches fail, `SwitchDriverError.applied` is a `ScopedChange`: the
change narrowed to the switches that may hold part of it (those that succeeded,
those whose error says something took effect, and those whose answer was lost:
unknown counts as touched). Switches whose error says nothing took effect are
left out, so the manager's rollback (the inverse, through this driver again)
never needs a switch that is down and untouched. Absolute semantics make the
inverse of a whole per-switch batch safe after any part of it.

Every batch carries the change's `fence` (the slice and its change lease's token): a
switch refuses a batch under an older token than one it has seen for that slice, and
such a refusal makes the `SwitchDriverError` `stale` (issue 32).

docs/ocs_southbound.md is the contract; services/lightpath_services/switch_agent the reference agent.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2

from lightpath.client import error_report, wrong_peer
from lightpath.domain.southbound import OCS, SouthboundDevice, bank_id, devices
from lightpath.domain.torus import Fabric
from lightpath.v1 import optical_switch_pb2 as pb
from lightpath.v1 import optical_switch_pb2_grpc
from lightpath_services.common.txn import STALE_LEASE
from lightpath_services.ocs_manager.driver import Fence, SwitchDriverError
from lightpath_services.ocs_manager.invariants import FabricState
from lightpath_services.ocs_manager.wiring import FabricChange, link_ports

log = logging.getLogger("lightpath.ocs_manager")

# Codes after which the same change may succeed later.
_TRANSIENT = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
}


@dataclass(frozen=True)
class ScopedChange(FabricChange):
    """A `FabricChange` on some switches only: OCS indices `ocs` and the 1xK banks of
    blocks `banks`. What this driver reports as `applied`; its inverse keeps the scope."""

    ocs: frozenset[int] = field(default_factory=frozenset)
    banks: frozenset[int] = field(default_factory=frozenset)

    def inverse(self) -> ScopedChange:
        base = FabricChange.inverse(self)
        return ScopedChange(base.disconnect, base.connect, base.one_to_many, self.ocs, self.banks)

    @property
    def empty(self) -> bool:
        return not (self.ocs or self.banks) or FabricChange.empty.fget(self)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class SwitchFailure:
    device: SouthboundDevice
    code: grpc.StatusCode
    message: str
    touched: bool  # something may have taken effect (known, or not known)
    reason: str = ""  # the switch's ErrorInfo reason (STALE_LEASE: fenced out)


def batches(fabric: Fabric, change: FabricChange) -> dict[str, pb.ApplyBatchRequest]:
    """One ApplyBatchRequest (without batch_id) per switch `change` touches, by switch id.

    A link's two ports are the same on every logical axis of its dimension (wiring.py), so
    the port pairs are gathered once per (dim, k) and each OCS's request is a copy of that
    template: a full pod is 6 templates, not 3,072 cross-connects built one by one."""
    scope = change if isinstance(change, ScopedChange) else None
    groups: dict[tuple[int, int], tuple[list[tuple[int, int]], list[tuple[int, int]]]] = {}
    for which, wiring in ((0, change.disconnect), (1, change.connect)):
        for link in wiring:
            k, pa, pb_ = link_ports(fabric, link)
            groups.setdefault((link.dim, k), ([], []))[which].append((pa, pb_))
    out: dict[str, pb.ApplyBatchRequest] = {}
    for (d, k), (disc, conn) in sorted(groups.items()):
        template = pb.ApplyBatchRequest(
            disconnect=[pb.PortPair(port_a=p, port_b=q) for p, q in disc],
            connect=[pb.PortPair(port_a=p, port_b=q) for p, q in conn],
        )
        for a in range(fabric.axes[d]):
            ocs = fabric.ocs_index(d, a, k)
            if scope is not None and ocs not in scope.ocs:
                continue
            req = pb.ApplyBatchRequest()
            req.CopyFrom(template)
            req.switch_id = fabric.ocs_ids[ocs]
            out[req.switch_id] = req
    total = fabric.total_axes
    for index, output in change.one_to_many_ops(fabric):
        block, inp = divmod(index, total)
        if scope is not None and block not in scope.banks:
            continue
        sid = bank_id(block)
        req = out.setdefault(sid, pb.ApplyBatchRequest(switch_id=sid))
        sel = req.set_outputs.add(input=inp)
        if output is not None:
            sel.output = output
    return out


class AgentSwitchDriver:
    """Switches behind switch agents (or vendors' adapters) speaking optical_switch.proto."""

    def __init__(
        self,
        fabric: Fabric,
        stubs: Mapping[str, optical_switch_pb2_grpc.OpticalSwitchStub],
        *,
        timeout_s: float = 5.0,
    ):
        self.fabric = fabric
        self.devices = {d.id: d for d in devices(fabric)}
        missing = [d for d in self.devices if d not in stubs]
        if missing:
            raise ValueError(f"no switch agent for {len(missing)} switches, e.g. {missing[0]}")
        self._stubs = dict(stubs)
        self.timeout_s = timeout_s
        self.apply_calls = 0  # ApplyBatch / ApplyBatches calls sent
        self._single_only: set[int] = set()  # endpoints (stubs) without ApplyBatches
        # switches whose Describe does not match the fabric: id -> why (never programmed)
        self.mismatched: dict[str, str] = {}
        # switches not yet Described (out of reach when asked): asked before they are
        # first programmed, and by the reconcile loop once they answer
        self.undescribed: set[str] = set(self.devices)

    @property
    def kinds(self) -> str:
        """What drives the switches: "agents", or e.g. "SONiC+agents" (GetInfo)."""
        names = sorted({getattr(s, "driver_name", "agents") for s in self._stubs.values()})
        return "+".join(names)

    # -- inventory (issue 34) ---------------------------------------------------------

    def expected(self, d: SouthboundDevice) -> tuple[int, int, int]:
        """(kind, ports needed, outputs) a switch must describe to serve device `d`."""
        if d.kind == OCS:
            k = self.fabric.ocs_of_index(d.index)[2]
            return pb.SWITCH_KIND_OCS, self.fabric.ports_cabled(k), 0
        return pb.SWITCH_KIND_ONE_TO_K, self.fabric.total_axes, self.fabric.k

    async def check_inventory(self, ids: list[str] | None = None) -> dict[str, str]:
        """Describe the switches (all, or `ids`) and keep those that do not match the fabric
        in `mismatched` (a wrong kind, too few ports, another K). A switch that does not
        answer is not judged and stays in `undescribed` (asked again before it is
        programmed, and when it comes back); one without Describe (UNIMPLEMENTED) is
        taken as it is. Answers the mismatches found now."""
        targets = [self.devices[i] for i in (ids or list(self.devices))]

        async def one(d: SouthboundDevice) -> tuple[str, str | None]:
            try:
                desc = await self._stubs[d.id].Describe(
                    pb.DescribeSwitchRequest(switch_id=d.id), timeout=self.timeout_s
                )
            except grpc.aio.AioRpcError as err:
                return d.id, "" if err.code() == grpc.StatusCode.UNIMPLEMENTED else None
            kind, ports, outputs = self.expected(d)
            if desc.kind != kind:
                want = pb.SwitchKind.Name(kind)  # type: ignore[arg-type]
                return d.id, f"it is {pb.SwitchKind.Name(desc.kind)}, the fabric needs {want}"
            if desc.ports < ports:
                return d.id, f"it has {desc.ports} ports, the fabric cables {ports}"
            if outputs and desc.outputs != outputs:
                return d.id, f"its 1xK switches have {desc.outputs} outputs, the fabric K={outputs}"
            return d.id, ""

        found = {}
        for sid, why in await asyncio.gather(*(one(d) for d in targets)):
            if why is None:
                continue
            self.undescribed.discard(sid)
            if why:
                if self.mismatched.get(sid) != why:
                    log.error("switch %s does not match the fabric: %s; not programmed", sid, why)
                self.mismatched[sid] = why
                found[sid] = why
            elif self.mismatched.pop(sid, None) is not None:
                log.info("switch %s matches the fabric again", sid)
        return found

    def reconnected(self, sid: str) -> None:
        """A switch came back (restarted or reachable again): a feature it lacked before
        (ApplyBatches) is tried again."""
        self._single_only.discard(id(self._stubs[sid]))

    # -- programming ------------------------------------------------------------------

    async def apply(self, change: FabricChange, fence: Fence | None = None) -> None:
        if change.empty:
            return
        reqs = batches(self.fabric, change)
        if fence is not None:
            for req in reqs.values():
                req.fence.lease_id, req.fence.token = fence.lease_id, fence.token
        unknown = [sid for sid in reqs if sid in self.undescribed]
        if unknown:  # never programmed before it is known to match (issue 34)
            await self.check_inventory(unknown)
        bad = sorted(sid for sid in reqs if sid in self.mismatched)
        if bad:
            raise SwitchDriverError(
                f"switch {bad[0]} does not match the fabric ({self.mismatched[bad[0]]}); "
                "nothing was programmed"
                + (f" (and {len(bad) - 1} more switches)" if len(bad) > 1 else ""),
                applied=ScopedChange(change.disconnect, change.connect, change.one_to_many),
                transient=False,
            )
        token = secrets.token_hex(8)
        ids = list(reqs)
        for sid in ids:
            reqs[sid].batch_id = f"{token}:{sid}"
        by_endpoint: dict[int, list[str]] = {}
        for sid in ids:
            by_endpoint.setdefault(id(self._stubs[sid]), []).append(sid)
        results = await asyncio.gather(
            *(self._send_endpoint([reqs[sid] for sid in group]) for group in by_endpoint.values())
        )
        failures = [f for group in results for f in group if f is not None]
        if not failures:
            return
        failed_untouched = {f.device.id for f in failures if not f.touched}
        touched = [self.devices[sid] for sid in ids if sid not in failed_untouched]
        applied = ScopedChange(
            change.disconnect,
            change.connect,
            change.one_to_many,
            frozenset(d.index for d in touched if d.kind == OCS),
            frozenset(d.index for d in touched if d.kind != OCS),
        )
        first = failures[0]
        more = f" (and {len(failures) - 1} more switches)" if len(failures) > 1 else ""
        raise SwitchDriverError(
            f"switch {first.device.id}: {first.code.name}: {first.message}{more}",
            applied=applied,
            transient=all(f.code in _TRANSIENT for f in failures),
            stale=any(f.reason == STALE_LEASE for f in failures),
        )

    async def _send_endpoint(self, reqs: list[pb.ApplyBatchRequest]) -> list[SwitchFailure | None]:
        """The batches of switches behind one endpoint: one ApplyBatches call (the gRPC cost
        of one call, not one per switch), or ApplyBatch per switch where it has no
        ApplyBatches (UNIMPLEMENTED: remembered)."""
        stub = self._stubs[reqs[0].switch_id]
        if len(reqs) == 1 or id(stub) in self._single_only:
            return list(await asyncio.gather(*(self._send(r) for r in reqs)))
        self.apply_calls += 1
        # each switch its own deadline inside the call (issue 34): the agent answers a slow
        # switch DEADLINE_EXCEEDED in its result, the others their outcomes, so one slow
        # switch never fails the call whole (and the rollback reaches every switch that
        # applied); the call's own deadline leaves the answer time to travel
        own = duration_pb2.Duration()
        own.FromNanoseconds(round(switch_deadline_s(self.timeout_s) * 1e9))
        for r in reqs:
            r.timeout.CopyFrom(own)
        try:
            reply = await stub.ApplyBatches(
                pb.ApplyBatchesRequest(batches=reqs), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                self._single_only.add(id(stub))
                return list(await asyncio.gather(*(self._send(r) for r in reqs)))
            # Lost or refused whole: each switch may hold any of it, unless the agent was
            # refused in the handshake (not this pod's agent): then nothing was sent.
            report = error_report(err)
            touched = not wrong_peer(err)
            return [
                SwitchFailure(self.devices[r.switch_id], report.code, report.message, touched)
                for r in reqs
            ]
        if len(reply.results) != len(reqs):
            return [
                SwitchFailure(
                    self.devices[r.switch_id],
                    grpc.StatusCode.UNKNOWN,
                    f"ApplyBatches answered {len(reply.results)} results for {len(reqs)} batches",
                    True,
                )
                for r in reqs
            ]
        out: list[SwitchFailure | None] = []
        for r, res in zip(reqs, reply.results, strict=True):
            if res.HasField("applied"):
                out.append(None)
                continue
            code = _CODES.get(res.error.code, grpc.StatusCode.UNKNOWN)
            reason, meta = _error_info(res.error)
            out.append(
                SwitchFailure(
                    self.devices[r.switch_id], code, res.error.message, _touched(meta), reason
                )
            )
        return out

    async def _send(self, req: pb.ApplyBatchRequest) -> SwitchFailure | None:
        sid = req.switch_id
        self.apply_calls += 1
        try:
            await self._stubs[sid].ApplyBatch(req, timeout=self.timeout_s)
            return None
        except grpc.aio.AioRpcError as err:
            report = error_report(err)
            touched = not wrong_peer(err) and _touched(report.metadata)
            return SwitchFailure(
                self.devices[sid], report.code, report.message, touched, report.reason
            )

    async def apply_batch(self, sid: str, req: pb.ApplyBatchRequest) -> pb.ApplyBatchResponse:
        """One batch on one switch (the reconcile loop's repairs); raises AioRpcError."""
        self.apply_calls += 1
        req.switch_id = sid
        if not req.batch_id:
            req.batch_id = f"{secrets.token_hex(8)}:{sid}"
        return await self._stubs[sid].ApplyBatch(req, timeout=self.timeout_s)

    # -- reading ------------------------------------------------------------------------

    async def read_switch(self, sid: str) -> pb.OpticalSwitchState:
        return await self._stubs[sid].GetCrossConnects(
            pb.GetCrossConnectsRequest(switch_id=sid), timeout=self.timeout_s
        )

    async def read_all(self) -> dict[str, pb.OpticalSwitchState | grpc.aio.AioRpcError]:
        ids = list(self.devices)

        async def one(sid: str) -> pb.OpticalSwitchState | grpc.aio.AioRpcError:
            try:
                return await self.read_switch(sid)
            except grpc.aio.AioRpcError as err:
                return err

        return dict(zip(ids, await asyncio.gather(*(one(s) for s in ids)), strict=True))

    async def read(self) -> FabricState | None:
        states = await self.read_all()
        if any(isinstance(s, grpc.aio.AioRpcError) for s in states.values()):
            return None
        return to_fabric_state(self.fabric, self.devices, states)  # type: ignore[arg-type]


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def switch_deadline_s(call_timeout_s: float) -> float:
    """Each switch's own deadline (ApplyBatchRequest.timeout) inside an ApplyBatches call
    with deadline `call_timeout_s`: 90 % of it less 50 ms, so the agent's answer of the
    switches that were done arrives before the call's deadline."""
    return max(0.5 * call_timeout_s, 0.9 * call_timeout_s - 0.05)


def _touched(meta: Mapping[str, str]) -> bool:
    """Whether a failed batch may have left something on its switch: what its ErrorInfo
    counts say; without them (the answer was lost) it may have applied any of it."""
    if "applied_disconnects" not in meta:
        return True
    return any(
        int(meta.get(k, "0") or 0) > 0
        for k in ("applied_disconnects", "applied_outputs", "applied_connects")
    )


def _error_info(status: status_pb2.Status) -> tuple[str, dict[str, str]]:
    """The reason and metadata of a result's google.rpc.ErrorInfo."""
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info.reason, dict(info.metadata)
    return "", {}


def to_fabric_state(
    fabric: Fabric,
    by_id: Mapping[str, SouthboundDevice],
    states: Mapping[str, pb.OpticalSwitchState],
) -> FabricState:
    """Switch states -> the tables and 1xK settings of a FabricState (as the store keeps them)."""
    out = FabricState()
    total = fabric.total_axes
    for sid, st in states.items():
        d = by_id[sid]
        if d.kind == OCS:
            table: dict[int, int] = {}
            for xc in st.cross_connects:
                table[xc.port_a] = xc.port_b
                table[xc.port_b] = xc.port_a
            if table:
                out.tables[d.index] = table
        else:
            for sel in st.outputs:
                if sel.HasField("output"):
                    out.one_to_many[d.index * total + sel.input] = sel.output
    return out
