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
* Shared memory (`lightpath.aggregation.shm`, `transport.Buffers`): partials are
  computed into this switch's pooled shared buffers; to a peer that proved
  it shares the host's memory (the ShmHello handshake of a Relay stream or a
  Results call) a chunk goes as a reference to its buffer, to anyone else as
  bytes. RELEASE messages hand RESULT buffers back.
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

from lightpath.aggregation import wire
from lightpath.aggregation.maths import DType, Kind, Packet
from lightpath.aggregation.shm import DISCARD_AFTER_S, Hello, ShmDomain, ShmError
from lightpath.errors import Aborted, FailedPrecondition, LightpathError
from lightpath.security.identity import service_principal
from lightpath.v1 import agg_switch_pb2 as pb
from lightpath_services.agg_switch.command import CommandPlan, CommandState, plan_command
from lightpath_services.agg_switch.metrics import AggMetrics
from lightpath_services.agg_switch.store import AggStore
from lightpath_services.agg_switch.switch import (
    ABORTED,
    DEADLINE,
    CommandReport,
    Effects,
    Failure,
    SwitchCore,
    TimerKey,
)
from lightpath_services.agg_switch.topology import Topology
from lightpath_services.agg_switch.transport import Buffers

log = logging.getLogger("lightpath.agg_switch.dataplane")

_END = object()
OUTBOX_LINGER_S = 60.0
RECENT_REPORTS = 64
FAILURE_GATHER_S = 2.0


def command_failed(command_id: str, failure: str, code: str) -> LightpathError:
    """The error of a call about a command that failed: ABORTED with its reason code
    when it failed before its deadline (AbortCommand, a chunk not corrected), else
    FAILED_PRECONDITION."""
    if code and code != DEADLINE:
        return Aborted(
            f"command {command_id} failed: {failure}",
            reason=code,
            metadata={"command_id": command_id},
        )
    return FailedPrecondition(
        f"command {command_id}", f"failed: {failure}", reason="COMMAND_FAILED"
    )


class Outbox:
    """What one compute node's Results stream will read for one command."""

    def __init__(self, chunks: int):
        self.chunks = chunks
        self.results = 0
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.ended_at: float | None = None
        self.reader = False
        # The node proved it shares this host's memory (ShmHello on Results).
        self.by_ref = False

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


@dataclass
class _Outgoing:
    """A packet waiting for its Relay stream; encoded when its turn comes (by
    reference or as bytes, as the link turned out)."""

    command_id: str
    pkt: Packet | None = None
    dtype: DType | None = None
    raw: bytes | None = None
    # A RESULT buffer pinned for the peer until it answers RELEASE (or until
    # it goes as bytes after all).
    pinned: bool = False


class PeerLink:
    """One long-lived Relay stream to a neighbouring switch; packets queue while it (re)connects.

    At each (re)connection the two switches exchange ShmHello offers; the
    link carries references to shared buffers when both proved they share
    this host's memory, bytes otherwise. A packet whose write failed is sent
    again after reconnecting (receivers count every chunk once, so a repeat
    is harmless); packets of commands that ended meanwhile (their deadline
    failed them) are dropped instead.
    """

    def __init__(self, plane: DataPlane, peer: str):
        self.plane = plane
        self.peer = peer
        self.queue: asyncio.Queue[_Outgoing] = asyncio.Queue()
        self.task: asyncio.Task | None = None
        self.call: Any = None  # the Relay stream, once opened
        # The packet being written: kept here, not in _run, so a restarted run sends it.
        self.pending: _Outgoing | None = None
        self.sent = 0
        self.by_ref = False

    def send(self, item: _Outgoing) -> None:
        self.queue.put_nowait(item)
        if self.task is None or self.task.done():
            # Supervised, not needed: one peer's link failing leaves the switch serving
            # the others; its packets wait in the queue for the restarted run.
            self.task = self.plane.runtime.supervise(
                self._run, f"relay to {self.peer}", needed=False, forever=True
            )

    @property
    def idle(self) -> bool:
        """Nothing waits to be sent."""
        return self.pending is None and self.queue.empty()

    async def close(self) -> None:
        """End the stream (the neighbour's Relay call returns) and its task."""
        task, self.task = self.task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        call, self.call = self.call, None
        if call is not None:
            try:
                await call.done_writing()
            except (grpc.aio.AioRpcError, grpc.aio.UsageError, OSError, RuntimeError):
                call.cancel()

    def _live(self, item: _Outgoing | None) -> _Outgoing | None:
        if item is not None and self.plane.core.ended(item.command_id):
            self.plane.unpin(item, self.peer)
            return None  # the command failed here: nobody waits for this any more
        return item

    async def _handshake(self, call: Any) -> bool:
        if self.plane.domain is None:
            return False
        peer = wire.hello_from_metadata(await call.initial_metadata())
        return self.plane.verify(peer)

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            try:
                address = await self.plane.address_of(self.peer)
                call = self.call = self.plane.relay_stub(address, self.peer)(
                    metadata=(
                        (wire.FROM_METADATA, self.plane.switch_id),
                        *wire.hello_metadata(self.plane.hello()),
                    )
                )
                self.by_ref = await self._handshake(call)
                while True:
                    if self.pending is None:
                        self.pending = await self.queue.get()
                    item = self.pending
                    if item.raw is None:
                        item.raw = self.plane.encode_for_link(item, self.peer, self.by_ref)
                    await call.write(item.raw)
                    self.pending = None
                    self.sent += 1
                    backoff = 0.05
                    self.plane.settled()
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
                self.pending = self._live(self.pending)
                kept = [i for i in iter_queue(self.queue) if self._live(i)]
                for kept_item in kept:
                    self.queue.put_nowait(kept_item)


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
    # How it failed (AggCommand.failure_reason): DEADLINE_EXCEEDED, ABORTED, ...
    failure_code: str = ""


class DataPlane:
    def __init__(
        self,
        runtime: Any,
        store: AggStore,
        *,
        switch_id: str,
        tree_id: str,
        slots: int,
        domain: ShmDomain | None = None,
        shm_min_bytes: int = 0,
        metrics: AggMetrics | None = None,
    ):
        self.metrics = metrics or AggMetrics.noop()
        self.runtime = runtime
        self.store = store
        self.switch_id = switch_id
        self.tree_id = tree_id
        self.domain = domain
        self.shm_min_bytes = shm_min_bytes
        self.buffers = Buffers(domain)
        self.core = SwitchCore(
            switch_id, slots, alloc=self.buffers.alloc if domain is not None else None
        )
        self._commands: OrderedDict[str, _Loaded] = OrderedDict()
        self._loading: dict[str, asyncio.Future[_Loaded]] = {}
        self._topologies: dict[int, Topology] = {}
        self._links: dict[str, PeerLink] = {}
        self._outboxes: dict[tuple[str, str], Outbox] = {}
        self._timers: dict[TimerKey, asyncio.TimerHandle] = {}
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._channels: dict[tuple[str, str], Any] = {}
        self.recent: deque[tuple[str, CommandReport]] = deque(maxlen=RECENT_REPORTS)
        self._aborts_after: str | None = None  # the last aborts-stream entry applied
        self._draining = False  # a graceful stop began: `drain` waits for quiet
        self._changed = asyncio.Event()
        self.bytes_in = 0
        self.transport_counters: dict[str, int] = {
            "chunks_in_shm": 0,
            "chunks_in_bytes": 0,
            "chunks_out_shm": 0,
            "chunks_out_bytes": 0,
            "shm_releases_in": 0,
        }

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
        loaded = _Loaded(
            plan, deadline_loop, record.state, record.failure, failure_code=record.failure_reason
        )
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
        """Raise what a call about a failed command gets: ABORTED (with the reason)
        when it failed before its deadline, as its waiting nodes were told, else
        FAILED_PRECONDITION."""
        cid = loaded.plan.spec.command_id
        ended = self.core.ended(cid)
        failure = loaded.failure or (ended or "")
        if loaded.state is CommandState.FAILED or ended:
            raise command_failed(cid, failure, loaded.failure_code)

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

    async def relayed(self, raw: bytes, hop_from: str, by_ref_ok: bool = False) -> None:
        """A packet from neighbouring switch `hop_from`; `by_ref_ok`: its stream's
        ShmHello was verified, so it may name shared buffers."""
        header, data = wire.decode(raw)
        if header.kind == wire.RELEASE:
            self.released(header.command_id, wire.released_chunks(header), hop_from)
            return
        loaded = await self.command(header.command_id)
        spec = loaded.plan.spec
        by_ref = header.HasField("shm")
        if by_ref:
            if not by_ref_ok:
                raise FailedPrecondition(
                    "shm", f"{hop_from} has not shown it shares this host's memory"
                )
            if time.time() > spec.deadline_at:
                return  # past its deadline the command fails here anyway: never read it
            data = self.resolve(header.shm)
        if data is not None:
            itemsize = 8 if header.fixed_point else spec.reduction.itemsize
            if len(data) != spec.chunk_len(header.index) * itemsize:
                raise FailedPrecondition("data", "length does not match the chunk")
            self.transport_counters["chunks_in_shm" if by_ref else "chunks_in_bytes"] += 1
        self.bytes_in += len(raw) if not by_ref else header.shm.nbytes
        pkt = wire.to_packet(header, data, raw)
        eff = self.core.receive(pkt, hop_from, asyncio.get_running_loop().time())
        self._apply(loaded.plan, eff)  # parked relayed packets wait in the core, not here
        if by_ref and header.kind == pb.AGG_CHUNK_KIND_RESULT:
            # Forwarded to our receivers by reference (they answer RELEASE), or
            # copied into bytes already: the parent's buffer may go once they are done.
            if self.buffers.settled(spec.command_id, header.index):
                self._release_upstream(spec.command_id, [header.index], hop_from)

    # -- shared memory ---------------------------------------------------------------

    def hello(self) -> Hello | None:
        return None if self.domain is None else self.domain.hello(self.shm_min_bytes)

    def verify(self, peer: Hello | None) -> bool:
        return self.domain is not None and peer is not None and self.domain.verify(peer)

    def resolve(self, ref: pb.ShmRef) -> memoryview:
        """The bytes a ShmRef names (raises ShmError)."""
        if self.domain is None:
            raise ShmError("this switch does not use shared memory")
        return self.domain.view(ref.segment, ref.offset, ref.nbytes)

    def _shareable(self, pkt: Packet) -> bool:
        return (
            self.domain is not None
            and pkt.data is not None
            and pkt.data.nbytes >= max(1, self.shm_min_bytes)
        )

    def _encode(self, pkt: Packet, dtype: DType, by_ref: bool) -> bytes:
        """By reference when the link allows it and the data is in a shared buffer."""
        if by_ref and self._shareable(pkt):
            assert self.domain is not None and pkt.data is not None
            found = self.domain.locate(pkt.data)
            if found is not None:
                self.transport_counters["chunks_out_shm"] += 1
                return wire.encode_ref(pkt, dtype, found[0].name, found[1])
        if pkt.data is not None:
            self.transport_counters["chunks_out_bytes"] += 1
        return wire.encode(pkt, dtype)

    def encode_for_link(self, item: _Outgoing, peer: str, by_ref: bool) -> bytes:
        """The bytes of a queued packet, now that its link's mode is known."""
        assert item.pkt is not None and item.dtype is not None
        raw = self._encode(item.pkt, item.dtype, by_ref)
        if item.pinned and raw is not item.pkt.raw_ref:
            self.unpin(item, peer)  # went as bytes after all: nothing to wait for
        return raw

    def unpin(self, item: _Outgoing, peer: str) -> None:
        if item.pinned and item.pkt is not None:
            item.pinned = False
            self.released(item.command_id, [item.pkt.chunk], peer)

    def released(self, command_id: str, chunks: list[int], receiver: str) -> None:
        """`receiver` is done with the RESULT buffers of `chunks` (RELEASE)."""
        self.transport_counters["shm_releases_in"] += len(chunks)
        self._release_all(
            command_id,
            [(c, up) for c in chunks if (up := self.buffers.released(command_id, c, receiver))],
        )

    def receiver_gone(self, command_id: str, receiver: str) -> None:
        """A compute node's stream ended: it reads none of its RESULT buffers any more."""
        self._release_all(command_id, self.buffers.receiver_gone(command_id, receiver))

    def _release_all(self, command_id: str, freed: list[tuple[int, str]]) -> None:
        """Tell each parent whose buffers nobody here reads any more: one message each."""
        by_upstream: dict[str, list[int]] = {}
        for chunk, upstream in freed:
            by_upstream.setdefault(upstream, []).append(chunk)
        for upstream, chunks in by_upstream.items():
            self._release_upstream(command_id, chunks, upstream)

    def _release_upstream(self, command_id: str, chunks: list[int], upstream: str) -> None:
        self.link(upstream).send(
            _Outgoing(command_id, raw=wire.encode_release(command_id, chunks, self.switch_id))
        )

    def _result_source(self, pkt: Packet) -> Packet:
        """A result made here goes out of a buffer of ours (receivers answer RELEASE
        to us): a result computed elsewhere (the timeout aggregation node's, the
        parameter server's, EXACT's conversion) is copied into one first."""
        data = pkt.data
        if pkt.source != self.switch_id or not self._shareable(pkt) or data is None:
            return pkt
        if self.buffers.owns(data):
            return pkt
        return pkt.but(data=self.buffers.own_copy(pkt.command_id, pkt.chunk, data))

    def _outgoing(
        self, pkt: Packet, dtype: DType, to: str, is_result: bool, upstream: str
    ) -> _Outgoing:
        """A packet for a link. One that may go by reference is encoded when its turn
        comes, as the link turns out (a RESULT's buffer pinned meanwhile); any other
        is encoded now, while the buffer it may sit in is surely still ours."""
        item = _Outgoing(pkt.command_id, pkt, dtype)
        if self._shareable(pkt) and self.domain is not None:
            assert pkt.data is not None
            if self.domain.locate(pkt.data) is not None:
                if is_result:
                    item.pinned = self.buffers.pin(
                        pkt.command_id, pkt.chunk, to, pkt.data, upstream
                    )
                return item
        item.raw = self._encode(pkt, dtype, by_ref=False)
        return item

    def _apply(self, plan: CommandPlan, eff: Effects) -> None:
        def plan_of(command_id: str) -> CommandPlan:
            # A freed slot may admit another command's waiting arrival: its own plan.
            if command_id == plan.spec.command_id:
                return plan
            return self._commands[command_id].plan

        self.metrics.applied(self.switch_id, eff, plan_of)
        results: dict[int, Packet] = {}  # id(original) → the packet to send
        passed: set[tuple[str, int]] = set()
        for to, pkt in eff.sends:
            owner = plan_of(pkt.command_id)
            dtype = owner.spec.dtype
            is_result = pkt.kind is Kind.RESULT
            if is_result:
                passed.add((pkt.command_id, pkt.chunk))
                if id(pkt) not in results:
                    results[id(pkt)] = self._result_source(pkt)
                pkt = results[id(pkt)]
            here = owner.switch(self.switch_id)
            upstream = here.parent if is_result and here is not None else None
            if owner.topology.is_compute(to):
                box = self.outbox(pkt.command_id, to)
                raw = self._encode(pkt, dtype, box.by_ref)
                if is_result and raw is pkt.raw_ref and pkt.data is not None:
                    self.buffers.pin(pkt.command_id, pkt.chunk, to, pkt.data, upstream or "")
                box.put(raw, is_result)
            else:
                self.link(to).send(self._outgoing(pkt, dtype, to, is_result, upstream or ""))
        for cid, chunk in passed:
            self.buffers.chunk_passed(cid, chunk)
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
                loaded.failure_code = failure.code
                self.runtime.spawn(self._failed(loaded, failure, now), f"fail {failure.command_id}")
        for report in eff.reports:
            loaded = self._commands.get(report.command_id)
            self._buffers_end(report, loaded)
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
        self.settled()

    def _buffers_end(self, report: CommandReport, loaded: _Loaded | None) -> None:
        """The command ended here: its shared buffers go (transport rules 3 and 4)."""
        cid = report.command_id
        if report.failed:
            self.buffers.fail(cid)
        elif self.buffers.complete(cid):
            deadline = loaded.plan.spec.deadline_at if loaded else time.time()
            delay = max(0.0, deadline + DISCARD_AFTER_S - time.time())
            asyncio.get_running_loop().call_later(delay, self.buffers.drop, cid)

    async def _failed(self, loaded: _Loaded, failure: Failure, now: float) -> None:
        """AG-11: record the failure, then tell this switch's waiting compute nodes.

        At the deadline every switch fails at once and names its own missing
        children in Redis; a switch that knows of none (its own children all
        came) waits up to FAILURE_GATHER_S for another to name them. A failure
        before the deadline (`spread`) is written together with an entry on the
        tree's aborts stream, which every other switch follows (`follow_aborts`)."""
        spec = loaded.plan.spec
        missing = set(failure.missing)
        try:
            await self.store.finish_command(
                spec,
                CommandState.FAILED,
                now,
                failure.reason,
                failure.missing,
                failure_reason=failure.code,
                spread=failure.spread,
                origin=self.switch_id,
            )
            loop = asyncio.get_running_loop()
            until = loop.time() + (FAILURE_GATHER_S if failure.code == DEADLINE else 0.0)
            while True:  # until some switch named who is missing (this one may not know)
                record = await self.store.command(spec.tree_id, spec.command_id)
                if record is not None:
                    missing.update(record.missing)
                if missing or loop.time() >= until:
                    break
                await asyncio.sleep(0.05)
        finally:
            error = failure.error(missing)
            sp = loaded.plan.switch(self.switch_id)
            for node in sp.compute_members if sp else ():
                self.outbox(spec.command_id, node).fail(error)

    # -- failing a command across the tree ---------------------------------------------

    def refused(self, pkt: Packet, hop_from: str, why: str, grace_s: float) -> None:
        """This switch refused `pkt` of compute node `hop_from`: when the node owes
        that chunk it has `grace_s` to send it again before the command fails."""
        loaded = self._commands.get(pkt.command_id)
        if loaded is None:
            return
        eff = self.core.refused(pkt, hop_from, why, asyncio.get_running_loop().time(), grace_s)
        self._apply(loaded.plan, eff)

    async def abort(self, command_id: str, reason: str, code: str) -> None:
        """Fail `command_id` here now, as another switch (or AbortCommand) did."""
        pending = self._loading.get(command_id)
        if pending is not None:
            # Loaded while the abort was written: let the load admit it, then fail it.
            with contextlib.suppress(Exception):
                await pending
        loaded = self._commands.get(command_id)
        if loaded is not None and loaded.state is CommandState.RUNNING:
            loaded.state, loaded.failure = CommandState.FAILED, reason
            loaded.failure_code = code
        eff = self.core.abort(command_id, reason, asyncio.get_running_loop().time(), code=code)
        for failure in eff.failures:
            failure.spread = False  # heard from the stream: it is written already
        if loaded is not None:
            self._apply(loaded.plan, eff)

    async def follow_aborts(self, block_ms: int = 1000) -> None:
        """Apply every failure another switch spread (supervised; restarts resume
        from the last entry read, so none is missed across a Redis blip)."""
        if self._aborts_after is None:
            self._aborts_after = await self.store.aborts_tail(self.tree_id)
        while True:
            got = await self.store.read_aborts(self.tree_id, self._aborts_after, block_ms)
            for entry_id, fields in got:
                self._aborts_after = entry_id
                log.info(
                    "command %s failed across the tree (from %s): %s",
                    fields.get("command", ""),
                    fields.get("origin", ""),
                    fields.get("reason", ""),
                    extra={"command_id": fields.get("command", ""), "event": "aborted"},
                )
                await self.abort(
                    fields.get("command", ""),
                    fields.get("reason", ""),
                    fields.get("code", ABORTED),
                )

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
        self.settled()

    # -- a graceful stop -------------------------------------------------------------

    def settled(self) -> None:
        """Something ended here or was sent: a drain waiting for quiet looks again."""
        if self._draining:
            self._changed.set()

    def quiet(self) -> bool:
        """No command is active here and every link has sent what it holds."""
        return not self.core.active and all(link.idle for link in self._links.values())

    async def drain(self) -> None:
        """A graceful stop (Runtime.on_drain): once the switch is quiet, end its Relay
        streams to the neighbours. A neighbour stopping too waits for the streams it
        serves to end, so without this every switch of a tree stopped together waited
        out its whole grace (5 s by default). A command still active keeps them until
        it ends here (or the grace runs out)."""
        self._draining = True
        while not self.quiet():
            self._changed.clear()
            await self._changed.wait()
        for link in list(self._links.values()):
            await link.close()

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

    def relay_stub(self, address: str, peer: str):
        """The Relay call to switch `peer` at `address`: the handshake refuses a server
        that is not `service:agg_switch/<peer>`."""
        ch = self._channels.get((address, peer))
        if ch is None:
            ch = self._channels[(address, peer)] = self.runtime.channel(
                address,
                default_timeout=None,
                max_attempts=1,
                expect=service_principal("agg_switch", peer),
            )
        return ch.stream_unary(
            wire.RELAY,
            request_serializer=wire.identity,
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
        """Forget results nobody came for, a while after their command ended; unlink
        shared buffers idle in the pool."""
        while True:
            await asyncio.sleep(every_s)
            now = time.monotonic()
            for key, box in list(self._outboxes.items()):
                if box.ended_at is not None and now - box.ended_at > OUTBOX_LINGER_S:
                    del self._outboxes[key]
            if self.domain is not None:
                self.domain.trim()

    @property
    def counters(self) -> dict[str, int]:
        """The core's counters and the transport's (GetSwitchState)."""
        out = {**self.core.counters, **self.transport_counters}
        if self.domain is not None:
            out["shm_buffers_leased"] = self.domain.leased
            out["shm_buffers_pooled"] = self.domain.pooled
        return out

    async def publish_load(self, every_s: float = 1.0) -> None:
        """This switch's network load (bytes/s in) for the least-load strategy (AG-10)."""
        last = self.bytes_in
        while True:
            await asyncio.sleep(every_s)
            rate, last = (self.bytes_in - last) / every_s, self.bytes_in
            with contextlib.suppress(Exception):
                await self.store.report_load(self.tree_id, self.switch_id, rate)
