"""The data path of one switch process: `SwitchCore` driven by gRPC streams,
asyncio timers and Redis-loaded commands (AG-3 … AG-7, AG-11, AG-13, AG-14).

* Packets arrive on Contribute streams (compute nodes) and Relay streams
  (neighbouring switches) and go through `SwitchCore.receive`; the effects
  are applied at once and in order: packets to neighbours go on one
  long-lived Relay stream per neighbour (`PeerLink`), packets to compute
  nodes into their `Outbox`, read by their Results stream.
* Timers (thresholds, deadlines) are `loop.call_at` handles that call
  `SwitchCore.fire`.
* Commands are loaded from Redis on their first packet and cached; reports
  (slot holds, lateness) and outcomes are written back in background tasks,
  never on the packet's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from lightpath import agg_wire
from lightpath.aggregation import Kind, Packet
from lightpath.errors import DeadlineExceeded, FailedPrecondition, LightpathError
from lightpath.v1 import agg_switch_pb2 as pb
from services.agg_switch.command import CommandPlan, CommandState, plan_command
from services.agg_switch.store import AggStore
from services.agg_switch.switch import CommandReport, Effects, Failure, SwitchCore, TimerKey
from services.agg_switch.topology import Topology

log = logging.getLogger("lightpath.agg_switch.dataplane")

_END = object()
OUTBOX_LINGER_S = 60.0
RECENT_REPORTS = 64
FAILURE_GATHER_S = 2.0


class Outbox:
    """What one compute node's Results stream will read for one command."""

    def __init__(self, chunks: int):
        self.chunks = chunks
        self.results = 0
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.ended_at: float | None = None
        self.reader = False

    def put(self, raw: bytes, is_result: bool) -> None:
        self.queue.put_nowait(raw)
        if is_result:
            self.results += 1
            if self.results == self.chunks:
                self.queue.put_nowait(_END)
                self.ended_at = time.monotonic()

    def fail(self, error: Exception) -> None:
        if self.ended_at is None:
            self.queue.put_nowait(error)
            self.ended_at = time.monotonic()

    async def drain(self) -> AsyncIterator[bytes]:
        while True:
            item = await self.queue.get()
            if item is _END:
                return
            if isinstance(item, Exception):
                raise item
            yield item


class PeerLink:
    """One long-lived Relay stream to a neighbouring switch; packets queue while it (re)connects.

    A packet whose write failed is sent again after reconnecting (receivers
    count every chunk once, so a repeat is harmless); packets of commands that
    ended meanwhile (their deadline failed them) are dropped instead.
    """

    def __init__(self, plane: DataPlane, peer: str):
        self.plane = plane
        self.peer = peer
        self.queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
        self.task: asyncio.Task | None = None
        self.sent = 0

    def send(self, command_id: str, raw: bytes) -> None:
        self.queue.put_nowait((command_id, raw))
        if self.task is None or self.task.done():
            self.task = self.plane.runtime.spawn(self._run(), f"relay to {self.peer}")

    def _live(self, item: tuple[str, bytes] | None) -> tuple[str, bytes] | None:
        if item is not None and self.plane.core.ended(item[0]):
            return None  # the command failed here: nobody waits for this any more
        return item

    async def _run(self) -> None:
        pending: tuple[str, bytes] | None = None
        backoff = 0.05
        while True:
            try:
                address = await self.plane.address_of(self.peer)
                call = self.plane.relay_stub(address)(
                    metadata=((agg_wire.FROM_METADATA, self.plane.switch_id),)
                )
                while True:
                    if pending is None:
                        pending = await self.queue.get()
                    await call.write(pending[1])
                    pending = None
                    self.sent += 1
                    backoff = 0.05
            except (grpc.aio.AioRpcError, grpc.aio.UsageError, LightpathError, OSError) as exc:
                log.warning(
                    "relay to %s broke (%s); reconnecting in %.2f s",
                    self.peer,
                    exc,
                    backoff,
                    extra={"peer": self.peer},
                )
                await asyncio.sleep(backoff)
                backoff = min(2.0, backoff * 2)
                pending = self._live(pending)
                kept = [i for i in iter_queue(self.queue) if self._live(i)]
                for item in kept:
                    self.queue.put_nowait(item)


def iter_queue(queue: asyncio.Queue) -> list[Any]:
    """Everything queued, removed from the queue."""
    out = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out


@dataclass
class _Loaded:
    plan: CommandPlan
    deadline_loop: float
    state: CommandState = CommandState.RUNNING
    failure: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class DataPlane:
    def __init__(
        self,
        runtime: Any,
        store: AggStore,
        *,
        switch_id: str,
        tree_id: str,
        slots: int,
    ):
        self.runtime = runtime
        self.store = store
        self.switch_id = switch_id
        self.tree_id = tree_id
        self.core = SwitchCore(switch_id, slots)
        self._commands: OrderedDict[str, _Loaded] = OrderedDict()
        self._loading: dict[str, asyncio.Future[_Loaded]] = {}
        self._topologies: dict[int, Topology] = {}
        self._links: dict[str, PeerLink] = {}
        self._outboxes: dict[tuple[str, str], Outbox] = {}
        self._timers: dict[TimerKey, asyncio.TimerHandle] = {}
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._channels: dict[str, Any] = {}
        self.recent: deque[tuple[str, CommandReport]] = deque(maxlen=RECENT_REPORTS)
        self.bytes_in = 0

    # -- commands --------------------------------------------------------------

    async def topology(self, version: int | None = None) -> Topology:
        if version is not None and version in self._topologies:
            return self._topologies[version]
        topo = await self.store.topology(self.tree_id)
        if topo is None:
            raise FailedPrecondition(
                f"tree {self.tree_id}",
                "has no topology; DefineTopology first",
                reason="NO_TOPOLOGY",
            )
        self._topologies = {topo.version: topo}
        return topo

    async def command(self, command_id: str) -> _Loaded:
        """The command's plan, loaded from Redis once and admitted to the core."""
        loaded = self._commands.get(command_id)
        if loaded is not None:
            return loaded
        fut = self._loading.get(command_id)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._loading[command_id] = fut
            try:
                fut.set_result(await self._load(command_id))
            except BaseException as exc:
                fut.set_exception(exc)
                fut.exception()  # retrieved: concurrent waiters re-raise it
                raise
            finally:
                del self._loading[command_id]
        return await fut

    async def _load(self, command_id: str) -> _Loaded:
        record = await self.store.require_command(self.tree_id, command_id)
        spec = record.spec
        topo = await self.topology(spec.topology_version)
        if topo.version != spec.topology_version:  # pragma: no cover - DefineTopology refuses
            raise FailedPrecondition(
                f"command {command_id}", "its topology was replaced", reason="TOPOLOGY_CHANGED"
            )
        plan = plan_command(topo, spec)
        loop = asyncio.get_running_loop()
        deadline_loop = loop.time() + (spec.deadline_at - time.time())
        loaded = _Loaded(plan, deadline_loop, record.state, record.failure)
        if record.state is CommandState.RUNNING:
            if (
                spec.ps_model
                and topo.root == self.switch_id
                and not self.core.ps.loaded(command_id)
            ):
                self.core.ps.load(command_id, await self.store.load_parameters(spec))
            if not self.core.knows(command_id) and self.core.ended(command_id) is None:
                self._apply(plan, self.core.admit(plan, deadline_loop))
        self._commands[command_id] = loaded
        while len(self._commands) > 4096:
            self._commands.popitem(last=False)
        return loaded

    def check_running(self, loaded: _Loaded) -> None:
        cid = loaded.plan.spec.command_id
        ended = self.core.ended(cid)
        failure = loaded.failure or (ended or "")
        if loaded.state is CommandState.FAILED or ended:
            raise FailedPrecondition(
                f"command {cid}", f"failed: {failure}", reason="COMMAND_FAILED"
            )

    # -- packets -----------------------------------------------------------------

    async def deliver(self, pkt: Packet, hop_from: str) -> Effects:
        """Hand `pkt` to the core; waits while it is parked for a slot (WAIT policy)."""
        loaded = await self.command(pkt.command_id)
        if loaded.state is CommandState.COMPLETED and not self.core.knows(pkt.command_id):
            return Effects(duplicate=True)  # finished before this process saw it: counted already
        eff = self.core.receive(pkt, hop_from, asyncio.get_running_loop().time())
        self._apply(loaded.plan, eff)
        if eff.parked:
            fut = asyncio.get_running_loop().create_future()
            self._waiters[id(pkt)] = fut
            try:
                await fut
            finally:
                self._waiters.pop(id(pkt), None)
        return eff

    async def relayed(self, raw: bytes, hop_from: str) -> None:
        header, data = agg_wire.decode(raw)
        loaded = await self.command(header.command_id)
        spec = loaded.plan.spec
        if data is not None:
            itemsize = 8 if header.fixed_point else spec.reduction.itemsize
            if len(data) != spec.chunk_len(header.index) * itemsize:
                raise FailedPrecondition("data", "length does not match the chunk")
        self.bytes_in += len(raw)
        pkt = agg_wire.to_packet(header, data, raw)
        eff = self.core.receive(pkt, hop_from, asyncio.get_running_loop().time())
        self._apply(loaded.plan, eff)  # parked relayed packets wait in the core, not here

    def _apply(self, plan: CommandPlan, eff: Effects) -> None:
        for to, pkt in eff.sends:
            # A freed slot may admit another command's waiting arrival: its own dtype.
            owner = (
                plan
                if pkt.command_id == plan.spec.command_id
                else self._commands[pkt.command_id].plan
            )
            raw = agg_wire.encode(pkt, owner.spec.dtype)
            if owner.topology.is_compute(to):
                self.outbox(pkt.command_id, to).put(raw, pkt.kind is Kind.RESULT)
            else:
                self.link(to).send(pkt.command_id, raw)
        loop = asyncio.get_running_loop()
        for key in eff.cancels:
            handle = self._timers.pop(key, None)
            if handle is not None:
                handle.cancel()
        for key, at in eff.timers:
            old = self._timers.pop(key, None)
            if old is not None:
                old.cancel()
            self._timers[key] = loop.call_at(at, self._fire, key)
        for pkt in eff.admitted:
            fut = self._waiters.get(id(pkt))
            if fut is not None and not fut.done():
                fut.set_result(None)
        for pkt, error in eff.refused:
            fut = self._waiters.get(id(pkt))
            if fut is not None and not fut.done():
                fut.set_exception(error)
        for ev in eff.events:
            if ev.what in ("timeout", "fallback", "failed"):
                log.info(
                    "%s %s chunk %d %s",
                    ev.what,
                    ev.command_id,
                    ev.chunk,
                    ev.detail,
                    extra={"command_id": ev.command_id, "event": ev.what},
                )
        now = time.time()
        for failure in eff.failures:
            loaded = self._commands.get(failure.command_id)
            if loaded is not None:
                loaded.state, loaded.failure = CommandState.FAILED, failure.reason
                self.runtime.spawn(self._failed(loaded, failure, now), f"fail {failure.command_id}")
        for report in eff.reports:
            loaded = self._commands.get(report.command_id)
            self.recent.appendleft((report.command_id, report))
            if loaded is not None:
                self.runtime.spawn(
                    self.store.add_report(loaded.plan.spec, report, now),
                    f"report {report.command_id}",
                )
                log.info(
                    "%s done here: %d slot holds, max %.1f ms, timeouts %s",
                    report.command_id,
                    len(report.holds_ms),
                    report.max_ms,
                    sorted(report.timeout_nodes) or "none",
                    extra={"command_id": report.command_id, "tenant": report.tenant},
                )
        for cid in eff.completed:
            self.runtime.spawn(self._completed(cid), f"complete {cid}")

    async def _failed(self, loaded: _Loaded, failure: Failure, now: float) -> None:
        """AG-11: record the failure, then tell this switch's waiting compute nodes
        who never arrived. Every switch fails at the same deadline and names its own
        missing children in Redis; a switch that knows of none (its own children
        all came) waits up to FAILURE_GATHER_S for another to name them."""
        spec = loaded.plan.spec
        missing = set(failure.missing)
        try:
            await self.store.finish_command(
                spec, CommandState.FAILED, now, failure.reason, failure.missing
            )
            loop = asyncio.get_running_loop()
            until = loop.time() + FAILURE_GATHER_S
            while True:  # until some switch named who is missing (this one may not know)
                record = await self.store.command(spec.tree_id, spec.command_id)
                if record is not None:
                    missing.update(record.missing)
                if missing or loop.time() >= until:
                    break
                await asyncio.sleep(0.05)
        finally:
            error = DeadlineExceeded(
                f"command {spec.command_id} failed: {failure.reason}"
                + (f" (missing: {', '.join(sorted(missing))})" if missing else "")
            )
            sp = loaded.plan.switch(self.switch_id)
            for node in sp.compute_members if sp else ():
                self.outbox(spec.command_id, node).fail(error)

    async def _completed(self, command_id: str) -> None:
        loaded = self._commands.get(command_id)
        if loaded is None:
            return
        spec = loaded.plan.spec
        if spec.ps_model:
            params = self.core.ps.take(command_id)
            if params is not None:
                await self.store.save_parameters(spec, params)
        loaded.state = CommandState.COMPLETED
        await self.store.finish_command(spec, CommandState.COMPLETED, time.time())

    def _fire(self, key: TimerKey) -> None:
        self._timers.pop(key, None)
        cid = key[1]
        loaded = self._commands.get(cid)
        eff = self.core.fire(key, asyncio.get_running_loop().time())
        if loaded is not None:
            self._apply(loaded.plan, eff)
        if key[0] == "deadline" and loaded is not None and loaded.plan.spec.ps_model:
            self.core.ps.take(cid)

    # -- neighbours and compute nodes ----------------------------------------------

    def link(self, peer: str) -> PeerLink:
        link = self._links.get(peer)
        if link is None:
            link = self._links[peer] = PeerLink(self, peer)
        return link

    async def address_of(self, node: str) -> str:
        topo = await self.topology()
        if node in topo.by_id and topo.by_id[node].endpoint:
            return topo.by_id[node].endpoint
        endpoints = await self.store.endpoints(self.tree_id)
        if node not in endpoints:
            raise FailedPrecondition(
                f"switch {node}", "has no endpoint: not in the topology, never registered"
            )
        return endpoints[node]

    def relay_stub(self, address: str):
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = self.runtime.channel(
                address, default_timeout=None, max_attempts=1
            )
        return ch.stream_unary(
            agg_wire.RELAY,
            request_serializer=agg_wire.identity,
            response_deserializer=pb.RelaySummary.FromString,
        )

    def outbox(self, command_id: str, node: str) -> Outbox:
        key = (command_id, node)
        box = self._outboxes.get(key)
        if box is None:
            loaded = self._commands[command_id]
            box = self._outboxes[key] = Outbox(loaded.plan.spec.chunks)
        return box

    def has_outbox(self, command_id: str, node: str) -> bool:
        return (command_id, node) in self._outboxes

    def drop_outbox(self, command_id: str, node: str) -> None:
        self._outboxes.pop((command_id, node), None)

    async def janitor(self, every_s: float = 5.0) -> None:
        """Forget results nobody came for, a while after their command ended."""
        while True:
            await asyncio.sleep(every_s)
            now = time.monotonic()
            for key, box in list(self._outboxes.items()):
                if box.ended_at is not None and now - box.ended_at > OUTBOX_LINGER_S:
                    del self._outboxes[key]

    async def publish_load(self, every_s: float = 1.0) -> None:
        """This switch's network load (bytes/s in) for the least-load strategy (AG-10)."""
        last = self.bytes_in
        while True:
            await asyncio.sleep(every_s)
            rate, last = (self.bytes_in - last) / every_s, self.bytes_in
            with contextlib.suppress(Exception):
                await self.store.report_load(self.tree_id, self.switch_id, rate)
