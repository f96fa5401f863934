"""gRPC servicer of agg_switch: protobuf ⇄ domain, errors → status (via the runtime).

Management calls read and write Redis through `AggStore` and decide with the
pure functions of `command` and `topology`; data-path calls hand packets to
the process's `DataPlane`. The three data-path methods use the raw AggChunk
codec of `lightpath.aggregation.wire` instead of protobuf objects (zero-copy
views in, one copy out); everything else is plain protobuf. Results and Relay
begin with the shared-memory handshake (ShmHello in the request, the answer
in the initial metadata); after it a peer on this host sends references to
shared buffers instead of bytes.

Who may do what (lightpath_services.common.policy has the roles; these are the
per-resource checks, all made before anything is written):
  * a compute node (`node:<id>`) joins, contributes and reads results only as
    itself (`node_id`, each chunk's `source`), only in commands it takes part
    in, reads only those commands, and reports only its own load;
  * a switch (`service:agg_switch/<id>`) relays only as itself (the
    `lightpath-from` metadata) and reports only its own load;
  * a tenant starts commands only for itself (the `tenant` field, filled from
    the credential when empty) and sees only its own commands and their
    history (another tenant's command is NOT_FOUND to it); operators see all;
  * AbortCommand: the command's tenant, an operator, or a compute node that
    takes part in it (anyone else: NOT_FOUND, as for a command it cannot see).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import ClassVar

import grpc
from opentelemetry import trace

from lightpath.aggregation import wire
from lightpath.aggregation.maths import Kind
from lightpath.aggregation.shm import ShmDomain, ShmError
from lightpath.errors import (
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from lightpath.security.identity import NODE, Principal
from lightpath.v1 import agg_switch_pb2 as pb
from lightpath.v1 import agg_switch_pb2_grpc, common_pb2
from lightpath_services.agg_switch import convert
from lightpath_services.agg_switch.command import (
    DEFAULT_HISTORY_WINDOW,
    CommandSpec,
    CommandState,
    TaStrategy,
    choose_timeout_aggregator,
    combine_at_switch,
    new_command,
    participation_bitmaps,
    predict_stragglers,
    worst_lateness,
)
from lightpath_services.agg_switch.dataplane import DataPlane, command_failed
from lightpath_services.agg_switch.metrics import AggMetrics
from lightpath_services.agg_switch.settings import AggSwitchSettings
from lightpath_services.agg_switch.store import AggStore, report_json
from lightpath_services.agg_switch.switch import ABORTED
from lightpath_services.agg_switch.topology import Topology, validate_topology
from lightpath_services.common import paging, redis_store
from lightpath_services.common.auth import (
    caller,
    require_service_scope,
    require_tenant_field,
    tenant_scope,
)
from lightpath_services.common.keys import ID_RULE, is_valid_id
from lightpath_services.common.server import Runtime, ServiceDefinition

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["AggSwitch"].full_name


def annotate(**attributes: str | int) -> None:
    """Facts an operator looks for, on the RPC's span (`lightpath.command_id`, …)."""
    span = trace.get_current_span()
    for key, value in attributes.items():
        span.set_attribute(f"lightpath.{key}", value)


MAX_PAGE = paging.MAX_PAGE
CONTRIBUTE_KINDS = {Kind.CONTRIBUTION, Kind.LATE, Kind.FINAL}
MAX_JOINS = 256
MAX_REASON = 500


def _mismatch(principal: Principal, field: str, value: str) -> PermissionDenied:
    return PermissionDenied(
        f"{field} {value!r} is not this credential's node: it acts for node {principal.name!r}",
        reason="NODE_MISMATCH",
        metadata={"principal": str(principal), "field": field},
    )


def _own_node(field: str, value: str) -> None:
    """A compute node acts only as itself; other callers as their role allows."""
    principal = caller()
    if principal is not None and principal.kind == NODE and value != principal.name:
        raise _mismatch(principal, field, value)


def _node_name() -> str | None:
    """The node a compute-node caller is (None for any other caller)."""
    principal = caller()
    return principal.name if principal is not None and principal.kind == NODE else None


@dataclass
class _Join:
    """A running command as JoinCommand answers it."""

    spec: CommandSpec
    topology: Topology
    command: pb.AggCommand
    endpoints: dict[str, str]


class AggSwitchServicer(agg_switch_pb2_grpc.AggSwitchServicer):
    def __init__(self, runtime: Runtime[AggSwitchSettings], store: AggStore, plane: DataPlane):
        self._rt = runtime
        self._settings = runtime.settings
        self._store = store
        self._plane = plane
        self._joins: OrderedDict[tuple[str, str], _Join] = OrderedDict()

    async def GetInfo(self, request: common_pb2.GetInfoRequest, context) -> common_pb2.ServiceInfo:
        domain = self._plane.domain
        return self._rt.info(
            SERVICE_NAME,
            switch_id=self._settings.switch_id,
            tree=self._settings.tree_id,
            slots=str(self._settings.slots),
            transport="shm+grpc" if domain is not None else "grpc",
            shm_prefix=domain.prefix if domain is not None else "",
        )

    # -- helpers -------------------------------------------------------------------

    def _tree(self, tree_id: str) -> str:
        tree = tree_id or self._settings.tree_id
        if not is_valid_id(tree):
            raise InvalidArgument("tree_id", ID_RULE)
        return tree

    async def _topology(self, tree: str) -> Topology:
        topo = await self._store.topology(tree)
        if topo is None:
            raise FailedPrecondition(
                f"tree {tree}", "has no topology; DefineTopology first", reason="NO_TOPOLOGY"
            )
        return topo

    async def _history(self, tree: str, window: int) -> list[tuple[str, float, dict[str, float]]]:
        """The history a caller may see: a tenant's own commands, everyone's for others."""
        return await self._store.history(
            tree, window or DEFAULT_HISTORY_WINDOW, tenant=tenant_scope()
        )

    async def _visible(self, tree: str, command_id: str):
        """The command's record if the caller may see it: a tenant its own commands, a
        compute node those it takes part in; NOT_FOUND (as for no command) otherwise."""
        own, node = tenant_scope(), _node_name()
        if own is None and node is None:
            return await self._store.require_command(tree, command_id)
        record = await self._store.command(tree, command_id, settle=False)
        if (
            record is None
            or (own is not None and record.spec.tenant != own)
            or (node is not None and node not in record.spec.participants)
        ):
            raise NotFound("command", command_id, hint=f"no such command in tree {tree}")
        return await self._store.settle(record)

    @staticmethod
    def _participants(topo: Topology, names: list[str]) -> list[str]:
        bad = [
            FieldViolation(
                f"participants[{i}]", f"{n!r} is not a compute node of tree {topo.tree_id}"
            )
            for i, n in enumerate(names)
            if not topo.is_compute(n)
        ]
        if bad:
            raise InvalidArgument.of(bad)
        return names or topo.compute_nodes

    # -- management: topology (AG-1) -----------------------------------------------

    async def DefineTopology(self, request: pb.DefineTopologyRequest, context) -> pb.AggTopology:
        t = request.topology
        tree = self._tree(t.tree_id)
        topo = validate_topology(tree, convert.node_specs(t), t.timeout_aggregator)
        version = await self._store.define_topology(topo, time.time())
        annotate(tree=tree, topology_version=version, nodes=len(topo.nodes))
        stored = await self._topology(tree)
        self._rt.log.info(
            "topology of %s defined: version %d, %d switches, %d compute nodes",
            tree,
            version,
            len(topo.switches),
            len(topo.compute_nodes),
            extra={"tree": tree, "version": version},
        )
        return convert.topology_to_pb(stored, await self._store.endpoints(tree))

    async def GetTopology(self, request: pb.GetTopologyRequest, context) -> pb.AggTopology:
        tree = self._tree(request.tree_id)
        topo = await self._store.topology(tree)
        if topo is None:
            raise NotFound("topology", tree)
        return convert.topology_to_pb(topo, await self._store.endpoints(tree))

    # -- management: commands (AG-2, AG-9, AG-10) ----------------------------------

    async def StartCommand(self, request: pb.StartCommandRequest, context) -> pb.AggCommand:
        tree = self._tree(request.tree_id)
        # The tenant comes from the credential; it is part of the request's digest,
        # so another tenant's command of the same id is never handed back as a retry.
        request.tenant = require_tenant_field(request.tenant)
        req = convert.command_request(request)
        topo = await self._topology(tree)
        loads = await self._store.loads(tree) if req.ta_strategy is TaStrategy.LEAST_LOAD else {}
        history: list[dict[str, float]] = []
        if req.predict_top_k or req.predict_threshold_s:
            history = [h for _, _, h in await self._history(tree, req.history_window)]
        spec = new_command(
            topo,
            req,
            now=time.time(),
            default_chunk_bytes=self._settings.chunk_bytes,
            loads=loads,
            history=history,
        )
        if spec.ps_model:
            own = tenant_scope()
            owner = await self._store.model_owner(tree, spec.ps_model)
            if own is not None and owner is not None and owner != own:
                raise PermissionDenied(
                    f"model id {spec.ps_model!r} cannot be used; choose another ps_model",
                    reason="ID_UNAVAILABLE",
                )
            found = await self._store.parameters(tree, spec.ps_model, include_data=False)
            if found is not None and (found[0] is not spec.dtype or found[1] != spec.length):
                raise FailedPrecondition(
                    f"model {spec.ps_model}",
                    f"holds {found[1]} {found[0]} parameters; the command has {spec.length} {spec.dtype}",
                    reason="MODEL_MISMATCH",
                )
        spec, created = await self._store.start_command(spec, convert.request_digest(request, tree))
        annotate(
            tree=tree,
            command_id=spec.command_id,
            tenant=spec.tenant,
            participants=len(spec.participants),
            timeout_aggregator=spec.timeout_aggregator,
            created=int(created),
        )
        if created:
            self._plane.metrics.started(spec.predicted)
            self._rt.log.info(
                "command %s started: %d participants, %s %s × %d, timeout aggregation node %s%s",
                spec.command_id,
                len(spec.participants),
                spec.dtype,
                spec.op,
                spec.length,
                spec.timeout_aggregator,
                f", predicted late {list(spec.predicted)}" if spec.predicted else "",
                extra={"command_id": spec.command_id, "tenant": spec.tenant, "tree": tree},
            )
        return convert.command_to_pb(spec, topo, await self._store.command(tree, spec.command_id))

    async def GetCommand(self, request: pb.GetCommandRequest, context) -> pb.AggCommand:
        tree = self._tree(request.tree_id)
        if not is_valid_id(request.command_id):
            raise InvalidArgument("command_id", ID_RULE)
        annotate(tree=tree, command_id=request.command_id)
        record = await self._visible(tree, request.command_id)
        return convert.command_to_pb(record.spec, await self._store.topology(tree), record)

    async def AbortCommand(self, request: pb.AbortCommandRequest, context) -> pb.AggCommand:
        """Fail a running command across the tree now (see the proto). Its tenant, an
        operator or one of its participants may; anyone else gets NOT_FOUND, as for
        a command it may not see."""
        tree = self._tree(request.tree_id)
        bad = []
        if not is_valid_id(request.command_id):
            bad.append(FieldViolation("command_id", ID_RULE))
        reason = request.reason.strip()
        if not reason or len(reason) > MAX_REASON or not reason.isprintable():
            bad.append(
                FieldViolation("reason", f"must say why, in 1..{MAX_REASON} printable characters")
            )
        if bad:
            raise InvalidArgument.of(bad)
        annotate(tree=tree, command_id=request.command_id)
        record = await self._visible(tree, request.command_id)
        if record.state is CommandState.COMPLETED:
            raise FailedPrecondition(
                f"command {request.command_id}",
                "completed already; there is nothing to abort",
                reason="COMMAND_COMPLETED",
            )
        if record.state is CommandState.RUNNING:
            principal = caller()
            text = f"aborted by {principal or 'an unauthenticated caller'}: {reason}"
            moved = await self._store.finish_command(
                record.spec,
                CommandState.FAILED,
                time.time(),
                text,
                failure_reason=ABORTED,
                spread=True,
                origin=self._settings.switch_id,
            )
            if moved:
                self._rt.log.info(
                    "command %s %s",
                    request.command_id,
                    text,
                    extra={"command_id": request.command_id, "tree": tree, "event": "aborted"},
                )
                if tree == self._settings.tree_id:
                    await self._plane.abort(request.command_id, text, ABORTED)
            record = await self._store.require_command(tree, request.command_id)
        return convert.command_to_pb(record.spec, await self._store.topology(tree), record)

    async def ListCommands(
        self, request: pb.ListCommandsRequest, context
    ) -> pb.ListCommandsResponse:
        tree = self._tree(request.tree_id)
        size = paging.page_size(request.page_size, default=50)
        offset = paging.token_int(request.page_token) or 0
        records, following = await self._store.list_commands(
            tree, offset, size, tenant=tenant_scope()
        )
        topo = await self._store.topology(tree)
        return pb.ListCommandsResponse(
            commands=[convert.command_to_pb(r.spec, topo, r) for r in records],
            next_page_token=paging.page_token(following) if following is not None else "",
        )

    async def ChooseTimeoutAggregator(
        self, request: pb.ChooseTimeoutAggregatorRequest, context
    ) -> pb.TimeoutAggregatorChoice:
        tree = self._tree(request.tree_id)
        sel = request.selection
        strategy = convert.enum_value(
            convert.PB_TO_STRATEGY,
            sel.strategy,
            "selection.strategy",
            "FIXED, RANDOM_BY_ID, LEAST_LOAD, FEWEST_HOPS or LOWEST_LINK_COST",
        )
        topo = await self._topology(tree)
        participants = self._participants(topo, list(request.participants))
        node, candidates = choose_timeout_aggregator(
            topo,
            participants,
            strategy,
            node=sel.node,
            candidates=list(sel.candidates),
            command_id=request.command_id,
            loads=await self._store.loads(tree),
        )
        combined_for = ""
        if sel.combine_at_switch:
            node, combined_for = combine_at_switch(topo, node)
        return pb.TimeoutAggregatorChoice(
            node=node,
            combined_for=combined_for,
            strategy=convert.STRATEGY_TO_PB[strategy],
            candidates=[
                pb.TimeoutAggregatorCandidate(
                    node=c.node,
                    kind=convert.KIND_TO_PB[c.kind],
                    hops=c.hops,
                    link_cost=c.link_cost,
                    load=c.load,
                    score=c.score,
                )
                for c in candidates
            ],
        )

    async def PredictStragglers(
        self, request: pb.PredictStragglersRequest, context
    ) -> pb.StragglerPrediction:
        tree = self._tree(request.tree_id)
        opts = request.options
        if opts.top_k and opts.threshold_s:
            raise InvalidArgument("options", "set top_k or threshold_s, not both")
        if opts.threshold_s < 0:
            raise InvalidArgument("options.threshold_s", "must be >= 0")
        topo = await self._topology(tree)
        participants = self._participants(topo, list(request.participants))
        entries = await self._history(tree, opts.history_window)
        window = [{n: v for n, v in h.items() if n in participants} for _, _, h in entries]
        predicted = predict_stragglers(
            window, top_k=opts.top_k, threshold_s=opts.threshold_s, order=topo.position
        )
        names = [n for n, _ in predicted]
        out = pb.StragglerPrediction(nodes=names, commands=[c for c, _, _ in entries])
        # Every participant the window saw, predicted or not (the proto's "each node's
        # worst lateness"), in topology order.
        worst = worst_lateness(window)
        for node in sorted(worst, key=lambda n: (topo.position.get(n, 0), n)):
            out.lateness.append(
                pb.NodeLateness(node=node, switch_id=topo.leaf_switch(node), lateness_s=worst[node])
            )
        if len(names) < len(participants):
            out.bitmaps.extend(
                convert.bitmaps_to_pb(participation_bitmaps(topo, participants, names))
            )
        return out

    async def GetHistory(self, request: pb.GetHistoryRequest, context) -> pb.AggHistory:
        tree = self._tree(request.tree_id)
        limit = request.limit or 20
        if limit > MAX_PAGE:
            raise InvalidArgument("limit", f"must be at most {MAX_PAGE}")
        topo = await self._store.topology(tree)
        out = pb.AggHistory()
        for cid, at, lateness in await self._store.history(tree, limit, tenant=tenant_scope()):
            entry = out.entries.add(command_id=cid)
            entry.finished_at.FromNanoseconds(int(at * 1e9))
            for node in sorted(lateness, key=lambda n: topo.position.get(n, 0) if topo else 0):
                leaf = topo.leaf_switch(node) if topo and topo.is_compute(node) else ""
                entry.lateness.add(node=node, switch_id=leaf, lateness_s=lateness[node])
        return out

    async def ReportLoad(self, request: pb.ReportLoadRequest, context) -> pb.ReportLoadResponse:
        tree = self._tree(request.tree_id)
        if not is_valid_id(request.node_id):
            raise InvalidArgument("node_id", ID_RULE)
        _own_node("node_id", request.node_id)  # a node reports its own load,
        require_service_scope("agg_switch", request.node_id, "node")  # a switch its own
        if not (math.isfinite(request.bytes_per_s) and request.bytes_per_s >= 0):
            raise InvalidArgument("bytes_per_s", "must be a finite number >= 0")
        topo = await self._topology(tree)
        if request.node_id not in topo.by_id:
            raise NotFound("node", request.node_id, hint=f"not in tree {tree}")
        await self._store.report_load(tree, request.node_id, request.bytes_per_s)
        return pb.ReportLoadResponse()

    # -- parameter server (AG-12) ----------------------------------------------------

    async def SetParameters(self, request: pb.SetParametersRequest, context) -> pb.ModelParameters:
        tree = self._tree(request.tree_id)
        if not is_valid_id(request.model_id):
            raise InvalidArgument("model_id", ID_RULE)
        dtype = convert.dtype_of(request.dtype, "dtype")
        if not dtype.is_float:
            raise InvalidArgument("dtype", "parameters are float32 or float64")
        if not request.data or len(request.data) % dtype.numpy.itemsize:
            raise InvalidArgument("data", f"must hold a whole number (≥ 1) of {dtype} elements")
        version = await self._store.set_parameters(
            tree, request.model_id, dtype, request.data, tenant=tenant_scope()
        )
        if version is None:
            raise PermissionDenied(
                f"model id {request.model_id!r} cannot be used; choose another model_id",
                reason="ID_UNAVAILABLE",
            )
        return pb.ModelParameters(
            model_id=request.model_id,
            dtype=request.dtype,
            length=len(request.data) // dtype.numpy.itemsize,
            version=version,
        )

    async def GetParameters(self, request: pb.GetParametersRequest, context) -> pb.ModelParameters:
        tree = self._tree(request.tree_id)
        if not is_valid_id(request.model_id):
            raise InvalidArgument("model_id", ID_RULE)
        own = tenant_scope()
        if own is not None and await self._store.model_owner(tree, request.model_id) != own:
            raise NotFound("model", request.model_id)  # another tenant's is not there for it
        found = await self._store.parameters(tree, request.model_id, request.include_data)
        if found is None:
            raise NotFound("model", request.model_id)
        dtype, length, version, data = found
        return pb.ModelParameters(
            model_id=request.model_id,
            dtype=wire.DTYPE_TO_PB[dtype],
            length=length,
            version=version,
            data=data,
        )

    # -- this switch ---------------------------------------------------------------

    async def GetSwitchState(self, request: pb.GetSwitchStateRequest, context) -> pb.SwitchState:
        core = self._plane.core
        out = pb.SwitchState(
            tree_id=self._settings.tree_id,
            switch_id=self._settings.switch_id,
            slots_total=core.pool.capacity,
            slots_in_use=core.pool.in_use,
            parked=core.parked,
            counters=self._plane.counters,
        )
        wall = time.time() - asyncio.get_running_loop().time()
        for e in core.bypass_entries():
            entry = out.bypass_entries.add(
                command_id=e.command_id, chunk=e.chunk, timeout_node=e.node
            )
            entry.created_at.FromNanoseconds(int((e.created_at + wall) * 1e9))
        for spec, held, done, parked in core.live():
            out.commands.add(
                command_id=spec.command_id,
                tenant=spec.tenant,
                slots_held=held,
                chunks_done=done,
                chunks=spec.chunks,
                parked=parked,
            )
        for cid, report in self._plane.recent:
            out.recent_commands.append(cid)
            out.recent_holds.append(
                convert.hold_to_pb(self._settings.switch_id, report_json(report))
            )
        return out

    # -- data path -------------------------------------------------------------------

    def _check_attached(self, spec: CommandSpec, topo: Topology, node: str, field: str) -> None:
        """`node` takes part in the command and hangs from this switch."""
        if node not in spec.participants:
            raise InvalidArgument(
                field,
                f"{node!r} is not a participant of command {spec.command_id}",
                reason="NOT_A_PARTICIPANT",
            )
        if topo.leaf_switch(node) != self._settings.switch_id:
            raise InvalidArgument(
                field,
                f"{node!r} attaches to switch {topo.leaf_switch(node)}, not {self._settings.switch_id}",
                reason="WRONG_SWITCH",
            )

    async def JoinCommand(self, request: pb.JoinCommandRequest, context) -> pb.Assignment:
        tree = self._tree(request.tree_id)
        if not is_valid_id(request.command_id):
            raise InvalidArgument("command_id", ID_RULE)
        annotate(command_id=request.command_id, node=request.node_id)
        _own_node("node_id", request.node_id)
        join, failure = await self._join(tree, request.command_id)
        spec, topo = join.spec, join.topology
        if request.node_id not in spec.participants:
            raise InvalidArgument(
                "node_id",
                f"{request.node_id!r} is not a participant of command {spec.command_id}",
                reason="NOT_A_PARTICIPANT",
            )
        if failure is not None:
            raise command_failed(spec.command_id, *failure)
        leaf = topo.leaf_switch(request.node_id)
        address = topo.by_id[leaf].endpoint or join.endpoints.get(leaf, "")
        if not address:
            join.endpoints = await self._store.endpoints(tree)  # a switch may have come since
            address = join.endpoints.get(leaf, "")
        if not address:
            raise FailedPrecondition(f"switch {leaf}", "has not registered an endpoint yet")
        return pb.Assignment(
            command=join.command,
            leaf_switch=leaf,
            leaf_endpoint=address,
            predicted_timeout=request.node_id in spec.predicted,
            timeout_aggregator=request.node_id == spec.timeout_aggregator,
            root_switch=topo.root,
        )

    async def _join(self, tree: str, command_id: str) -> tuple[_Join, tuple[str, str] | None]:
        """What JoinCommand answers from, and (failure, reason code) if the command failed.

        Every participant asks about a command at once, so a running command of
        this switch's tree is read from Redis once and kept until its deadline: a
        command fails only at its deadline (AG-11), and one that completed here is
        read again (its record then carries the slot holds)."""
        key = (tree, command_id)
        join = self._joins.pop(key, None)
        if (
            join is not None
            and time.time() <= join.spec.deadline_at
            and self._plane.core.ended(command_id) is None
        ):
            self._joins[key] = join
            return join, None
        record = await self._store.require_command(tree, command_id)
        spec = record.spec
        topo = (
            await self._plane.topology(spec.topology_version)
            if tree == self._settings.tree_id
            else await self._topology(tree)
        )
        join = _Join(
            spec,
            topo,
            convert.command_to_pb(spec, topo, record),
            await self._store.endpoints(tree),
        )
        if record.state is CommandState.RUNNING and tree == self._settings.tree_id:
            self._joins[key] = join
            while len(self._joins) > MAX_JOINS:
                self._joins.popitem(last=False)
        failed = record.state is CommandState.FAILED
        return join, (record.failure, record.failure_reason) if failed else None

    async def Contribute(  # type: ignore[override]
        self, request_iterator: AsyncIterator[bytes], context
    ) -> pb.ContributeSummary:
        accepted = duplicates = 0
        plane = self._plane
        seen: tuple[str, str] | None = None
        principal = caller()
        try:
            async for raw in request_iterator:
                seen, eff_dup = await self._contribution(raw, seen is None, principal)
                if eff_dup is None:
                    continue  # a RELEASE
                if eff_dup:
                    duplicates += 1
                else:
                    accepted += 1
        finally:
            # A node keeps its stream open until it has read every result it was
            # sent by reference: ended (or broken off), those buffers may go.
            if seen is not None:
                plane.receiver_gone(*seen)
        annotate(chunks_accepted=accepted, chunks_duplicate=duplicates)
        return pb.ContributeSummary(accepted=accepted, duplicates=duplicates)

    async def _contribution(
        self, raw: bytes, first: bool, principal: Principal | None
    ) -> tuple[tuple[str, str], bool | None]:
        """One message of a Contribute stream: ((command, node), duplicate?), or
        ((command, node), None) for a RELEASE. `principal`: the caller, whose own
        chunks (`source`) these must be when it is a compute node."""
        plane = self._plane
        try:
            header, data = wire.decode(raw)
        except wire.WireError as exc:
            raise InvalidArgument("chunk", str(exc)) from None
        node = header.source
        if principal is not None and principal.kind == NODE and node != principal.name:
            raise _mismatch(principal, "source", node)
        if not is_valid_id(header.command_id):
            raise InvalidArgument("command_id", ID_RULE)
        loaded = await plane.command(header.command_id)
        spec, topo = loaded.plan.spec, loaded.plan.topology
        if first:
            annotate(command_id=spec.command_id, node=node)
        self._check_attached(spec, topo, node, "source")
        seen = (spec.command_id, node)
        if header.kind == wire.RELEASE:
            plane.released(spec.command_id, wire.released_chunks(header), node)
            return seen, None
        by_ref = header.HasField("shm")
        if by_ref:
            if not (
                plane.has_outbox(spec.command_id, node)
                and plane.outbox(spec.command_id, node).by_ref
            ):
                raise InvalidArgument(
                    "shm",
                    f"{node!r} has not shown it shares this host's memory with switch "
                    f"{self._settings.switch_id} (ResultsRequest.shm); send the data as bytes",
                )
            try:
                data = plane.resolve(header.shm)
            except ShmError as exc:
                raise InvalidArgument("shm", str(exc)) from None
        try:
            kind = Kind(header.kind)
        except ValueError:
            kind = None  # type: ignore[assignment]
        if kind not in CONTRIBUTE_KINDS:
            raise InvalidArgument("kind", "a compute node sends CONTRIBUTION, LATE or FINAL")
        if header.index >= spec.chunks:
            raise InvalidArgument("index", f"must be within 0..{spec.chunks - 1}")
        want = spec.chunk_len(header.index) * spec.reduction.itemsize
        bad: InvalidArgument | None = None
        if header.dtype != wire.DTYPE_TO_PB[spec.dtype]:
            bad = InvalidArgument(
                "dtype", f"must be {spec.dtype}, the dtype of command {spec.command_id}"
            )
        elif header.fixed_point:
            bad = InvalidArgument("fixed_point", "compute nodes send plain elements")
        elif data is None or header.empty or len(data) != want:
            bad = InvalidArgument(
                "shm" if by_ref else "data",
                f"chunk {header.index} must hold {spec.chunk_len(header.index)} "
                f"{spec.dtype} elements ({want} bytes); got {0 if data is None else len(data)} bytes",
            )
        if bad is not None:
            plane.refused(
                wire.to_packet(header, None, raw),
                node,
                bad.message,
                self._settings.correction_grace_s,
            )
            raise bad
        pkt = wire.to_packet(header, data, raw)
        try:
            if kind is not Kind.FINAL:
                assert pkt.data is not None
                if rule := spec.reduction.check_input(pkt.data):
                    raise InvalidArgument("data", rule, reason="OUT_OF_EXACT_RANGE")
            if plane.core.ended(spec.command_id) != "":
                plane.check_running(loaded)
            plane.bytes_in += want
            plane.transport_counters["chunks_in_shm" if by_ref else "chunks_in_bytes"] += 1
            eff = await plane.deliver(pkt, node)
        except InvalidArgument as exc:
            # The node may send it again corrected; if it owes the chunk and does not
            # within the grace, the command fails across the tree.
            plane.refused(pkt, node, exc.message, self._settings.correction_grace_s)
            raise
        return seen, eff.duplicate

    async def Results(  # type: ignore[override]
        self, request: pb.ResultsRequest, context
    ) -> AsyncIterator[bytes]:
        if not is_valid_id(request.command_id):
            raise InvalidArgument("command_id", ID_RULE)
        _own_node("node_id", request.node_id)
        plane = self._plane
        loaded = await plane.command(request.command_id)
        spec, topo = loaded.plan.spec, loaded.plan.topology
        node = request.node_id
        annotate(command_id=spec.command_id, node=node)
        self._check_attached(spec, topo, node, "node_id")
        if not plane.has_outbox(spec.command_id, node):
            if loaded.state is CommandState.COMPLETED or plane.core.ended(spec.command_id) == "":
                raise FailedPrecondition(
                    f"command {spec.command_id}",
                    "completed; its results are no longer held here",
                    reason="RESULTS_GONE",
                )
            plane.check_running(loaded)
        box = plane.outbox(spec.command_id, node)
        # The shared-memory handshake: answer with our offer when the node's checks out.
        offer = wire.hello_from_pb(request.shm) if request.HasField("shm") else None
        box.by_ref = plane.verify(offer)
        annotate(shm=int(box.by_ref))
        await context.send_initial_metadata(
            wire.hello_metadata(plane.hello() if box.by_ref else None)
        )
        try:
            async for raw in box.drain():
                yield raw
        except asyncio.CancelledError:
            plane.receiver_gone(spec.command_id, node)
            raise
        plane.drop_outbox(spec.command_id, node)

    async def Relay(  # type: ignore[override]
        self, request_iterator: AsyncIterator[bytes], context
    ) -> pb.RelaySummary:
        invocation = context.invocation_metadata() or ()
        metadata = dict(invocation)
        peer = metadata.get(wire.FROM_METADATA, "")
        if not is_valid_id(peer):
            raise InvalidArgument(wire.FROM_METADATA, "metadata must name the sending switch")
        principal = caller()
        if principal is not None and not (
            principal.is_service("agg_switch") and principal.scope() == peer
        ):
            raise PermissionDenied(
                f"{principal} may not relay as switch {peer!r} ({wire.FROM_METADATA}): "
                "a switch relays only as itself",
                reason="SWITCH_MISMATCH",
                metadata={"principal": str(principal), "field": wire.FROM_METADATA},
            )
        by_ref_ok = self._plane.verify(wire.hello_from_metadata(invocation))
        annotate(peer=peer, shm=int(by_ref_ok))
        await context.send_initial_metadata(
            wire.hello_metadata(self._plane.hello() if by_ref_ok else None)
        )
        count = 0
        async for raw in request_iterator:
            count += 1
            try:
                await self._plane.relayed(raw, peer, by_ref_ok)
            except Exception as exc:  # one bad packet must not cut the link
                self._rt.log.warning(
                    "dropped a packet relayed by %s: %s", peer, exc, extra={"peer": peer}
                )
        annotate(chunks=count)
        return pb.RelaySummary(chunks=count)


def _register(servicer: AggSwitchServicer, server: grpc.aio.Server) -> None:
    """The generated registration, with the data-path methods on the raw codec."""

    class Capture:
        handlers: ClassVar[dict] = {}

        def add_generic_rpc_handlers(self, handlers) -> None:
            pass

        def add_registered_method_handlers(self, name, handlers) -> None:
            Capture.handlers = dict(handlers)

    agg_switch_pb2_grpc.add_AggSwitchServicer_to_server(servicer, Capture())
    handlers = Capture.handlers
    handlers["Contribute"] = grpc.stream_unary_rpc_method_handler(
        servicer.Contribute,
        request_deserializer=wire.identity,
        response_serializer=pb.ContributeSummary.SerializeToString,
    )
    handlers["Results"] = grpc.unary_stream_rpc_method_handler(
        servicer.Results,
        request_deserializer=pb.ResultsRequest.FromString,
        response_serializer=wire.identity,
    )
    handlers["Relay"] = grpc.stream_unary_rpc_method_handler(
        servicer.Relay,
        request_deserializer=wire.identity,
        response_serializer=pb.RelaySummary.SerializeToString,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


async def build(
    runtime: Runtime[AggSwitchSettings], *, metrics: AggMetrics | None = None
) -> list[ServiceDefinition]:
    settings = runtime.settings
    metrics = metrics or AggMetrics()
    binary = redis_store.connect_with(settings, decode_responses=False)

    async def close_binary() -> None:
        await binary.aclose()

    runtime.on_stop(close_binary)
    store = AggStore(runtime.redis, binary)
    domain = ShmDomain.create(idle_s=settings.shm_idle_s) if settings.transport == "auto" else None
    if domain is not None:

        async def close_domain() -> None:
            domain.close()

        runtime.on_stop(close_domain)
    plane = DataPlane(
        runtime,
        store,
        switch_id=settings.switch_id,
        tree_id=settings.tree_id,
        slots=settings.slots,
        domain=domain,
        shm_min_bytes=settings.shm_min_bytes,
        metrics=metrics,
    )
    runtime.supervise(lambda: metrics.run(plane.core), "switch metrics", needed=False)
    runtime.on_drain(plane.drain)  # its Relay streams end once nothing needs them

    async def register() -> None:
        await runtime.listening.wait()
        address = settings.advertise_addr or f"127.0.0.1:{runtime.port}"
        await store.register_endpoint(settings.tree_id, settings.switch_id, address)
        runtime.log.info(
            "switch %s of tree %s registered at %s",
            settings.switch_id,
            settings.tree_id,
            address,
            extra={"switch_id": settings.switch_id, "tree": settings.tree_id},
        )

    # Registering is one-shot, retried until it is written (peers find the switch by it).
    runtime.supervise(register, "register endpoint")
    # Housekeeping: a failure is retried, but the switch serves meanwhile.
    runtime.supervise(
        lambda: plane.janitor(min(5.0, settings.shm_idle_s)), "outbox janitor", needed=False
    )
    runtime.supervise(plane.publish_load, "publish load", needed=False)
    # Needed: without it this switch would keep a command another switch failed
    # until the deadline, and its nodes would wait that long.
    runtime.supervise(plane.follow_aborts, "follow aborts")
    servicer = AggSwitchServicer(runtime, store, plane)
    return [ServiceDefinition(SERVICE_NAME, servicer, _register)]
