"""One aggregation switch as a pure state machine (AG-3 … AG-7, AG-11, AG-13, AG-14).

`SwitchCore` is fed packets and timer firings with the current time and
answers with `Effects`: packets to hand to neighbours (parent, child
switches, compute nodes), timers to arm or cancel, and what happened. It
does no I/O and reads no clock, so the same code runs in the gRPC service
(lightpath_services.agg_switch.dataplane) and in the discrete-event simulation the
tests drive through the seed's examples and random trees.

Per command and chunk (AG-14: a slot per chunk):

* The first arrival takes an aggregation slot from the bounded pool and
  starts the threshold timer (AG-3). With no free slot the arrival waits
  (first come, first served) or falls back (the chunk bypasses this switch:
  every child counts as a timeout node), as the command says (AG-13).
* All expected children arrived → the partial goes up (the root broadcasts
  the result, or sends its partial to the timeout aggregation node when it
  carries timeout ids), the slot is freed.
* Threshold passed → the partial goes up carrying the missing children's
  ids, one `BypassEntry` (command, chunk, node) per missing child is
  recorded, the slot is freed (AG-4).
* Late data matching an entry is flagged with its node's id, the entry is
  deleted, and the data is routed to the timeout aggregation node; flagged
  data passing through is forwarded, never aggregated (AG-5).
* The deadline fails the command here: slots freed, entries dropped,
  waiting arrivals refused, nothing left (AG-11).
* A failure before the deadline does the same (`abort`): AbortCommand, or a
  chunk this switch refused that its node owes and did not send again
  correctly within the correction grace (`refused` arms that timer; the
  chunk accepted disarms it). Such a failure is marked `spread`: the data
  plane tells every other switch of the tree, so nothing waits for the
  deadline.

Where partials are computed is injected (`alloc`: the data plane hands out
shared-memory buffers per command and chunk so they can travel by reference);
the arithmetic and its bits do not depend on it.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lightpath.aggregation.maths import (
    Alloc,
    ChunkAlloc,
    Fold,
    Kind,
    Packet,
    Reduction,
    TimeoutAggregator,
    chunk_bounds,
)
from lightpath.errors import (
    Aborted,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    LightpathError,
    NotFound,
)
from lightpath_services.agg_switch.command import CommandPlan, CommandSpec, SlotPolicy, SwitchPlan

if TYPE_CHECKING:
    import numpy as np

# ("chunk", command, index), ("deadline", command, -1) or ("correct", command, n): n
# numbers a (node, chunk) pair, node position × chunks + chunk.
TimerKey = tuple[str, str, int]
DEADLINE = "DEADLINE_EXCEEDED"
ABORTED = "ABORTED"
NOT_CORRECTED = "CHUNK_NOT_CORRECTED"
# (command, chunk, elements, dtype) → a new array for a partial of that chunk.
CommandAlloc = Callable[[str, int, int, "np.dtype"], "np.ndarray"]


@dataclass(frozen=True)
class BypassEntry:
    """AG-4 (seed 旁路表项): `node` was late for `chunk` of `command_id` at this switch."""

    command_id: str
    chunk: int
    node: str
    created_at: float


@dataclass(frozen=True)
class Event:
    """What happened, for logs, spans and the tests' step-by-step checks."""

    what: str
    command_id: str
    chunk: int = -1
    node: str = ""
    detail: str = ""


@dataclass
class Failure:
    command_id: str
    reason: str
    missing: list[str]
    # DEADLINE_EXCEEDED, ABORTED or CHUNK_NOT_CORRECTED (AggCommand.failure_reason).
    code: str = DEADLINE
    # Every other switch must hear of it now (it did not fail at the shared deadline).
    spread: bool = False

    def error(self, missing: Iterable[str] = ()) -> LightpathError:
        """What every node waiting on the command is told."""
        names = sorted({*self.missing, *missing})
        message = f"command {self.command_id} failed: {self.reason}" + (
            f" (missing: {', '.join(names)})" if names else ""
        )
        if self.code == DEADLINE:
            return DeadlineExceeded(message)
        return Aborted(message, reason=self.code, metadata={"command_id": self.command_id})


@dataclass
class CommandReport:
    """Everything one switch has to say about one command once it lets go of it."""

    command_id: str
    tenant: str
    switch_id: str
    holds_ms: list[float] = field(default_factory=list)
    timed_out_chunks: int = 0
    fallback_chunks: int = 0
    timeout_nodes: set[str] = field(default_factory=set)
    bypass_created: int = 0
    duplicates: int = 0
    waited_ms: float = 0.0
    lateness: dict[str, float] = field(default_factory=dict)
    failed: str = ""

    @property
    def max_ms(self) -> float:
        return max(self.holds_ms, default=0.0)

    @property
    def mean_ms(self) -> float:
        return sum(self.holds_ms) / len(self.holds_ms) if self.holds_ms else 0.0

    @property
    def total_ms(self) -> float:
        return sum(self.holds_ms)


@dataclass
class Effects:
    sends: list[tuple[str, Packet]] = field(default_factory=list)
    timers: list[tuple[TimerKey, float]] = field(default_factory=list)
    cancels: list[TimerKey] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    parked: bool = False
    admitted: list[Packet] = field(default_factory=list)
    refused: list[tuple[Packet, Exception]] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    reports: list[CommandReport] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)
    duplicate: bool = False


class SlotPool:
    """AG-13: the switch's bounded aggregation slots, shared by every command."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("a switch needs at least one aggregation slot")
        self.capacity = capacity
        self.in_use = 0

    @property
    def free(self) -> int:
        return self.capacity - self.in_use

    def acquire(self) -> bool:
        if self.in_use >= self.capacity:
            return False
        self.in_use += 1
        return True

    def release(self) -> None:
        assert self.in_use > 0
        self.in_use -= 1


class ParameterServer:
    """AG-12 at the root: parameters ← parameters − learning_rate × aggregate,
    chunk by chunk; the new parameters are what the root broadcasts."""

    def __init__(self) -> None:
        self._params: dict[str, np.ndarray] = {}

    def load(self, command_id: str, params: np.ndarray) -> None:
        import numpy as np

        self._params[command_id] = np.array(params, copy=True)

    def loaded(self, command_id: str) -> bool:
        return command_id in self._params

    def apply(self, spec: CommandSpec, chunk: int, aggregate: np.ndarray) -> np.ndarray:
        params = self._params[spec.command_id]
        lo, hi = chunk_bounds(chunk, spec.length, spec.chunk_elems)
        segment = params[lo:hi]
        segment -= (spec.ps_learning_rate * aggregate).astype(params.dtype, copy=False)
        return segment.copy()

    def take(self, command_id: str) -> np.ndarray | None:
        return self._params.pop(command_id, None)


@dataclass
class _Slot:
    acquired_at: float
    fold: Fold
    arrived: set[str] = field(default_factory=set)
    carried: list[str] = field(default_factory=list)
    timer: bool = False


@dataclass
class _Parked:
    packet: Packet
    child: str
    parked_at: float


class _Command:
    """One command as this switch sees it."""

    def __init__(self, cplan: CommandPlan, plan: SwitchPlan | None, switch_id: str):
        self.cplan = cplan
        self.spec = cplan.spec
        self.plan = plan
        self.reduction: Reduction = cplan.spec.reduction
        n = cplan.spec.chunks
        self.slots: dict[int, _Slot] = {}
        self.done = bytearray(n)
        self.results = bytearray(n)
        self.finals = bytearray(n)
        self.results_count = 0
        members = plan.members if plan else ()
        self.received: dict[str, bytearray] = {m: bytearray(n) for m in members}
        self.bypass: dict[tuple[int, str], BypassEntry] = {}
        self.ta: TimeoutAggregator | None = None
        self.ta_done = 0
        self.arrival0: dict[str, float] = {}
        self.report = CommandReport(cplan.spec.command_id, cplan.spec.tenant, switch_id)
        self.released = 0
        # FINAL chunks of a compute-node timeout aggregation node taken here.
        self.finals_in = bytearray(n)
        # Refused chunks a node still owes: timer number → (node, chunk, why refused).
        self.corrections: dict[int, tuple[str, int, str]] = {}

    @property
    def chunks(self) -> int:
        return self.spec.chunks


class SwitchCore:
    """The behaviour of switch `switch_id` (pure; see the module docstring)."""

    def __init__(
        self,
        switch_id: str,
        slots: int,
        *,
        parameter_server: ParameterServer | None = None,
        remember: int = 4096,
        alloc: CommandAlloc | None = None,
    ):
        self.switch_id = switch_id
        self._alloc = alloc
        self.pool = SlotPool(slots)
        self.ps = parameter_server or ParameterServer()
        self._commands: dict[str, _Command] = {}
        self._parked: deque[_Parked] = deque()
        self._serving = False
        self._again = False
        self._ended: OrderedDict[str, str] = OrderedDict()  # command → "" (done) or failure
        self._remember = remember
        self.counters: dict[str, int] = {
            "aggregated": 0,
            "forwarded_flagged": 0,
            "flagged": 0,
            "duplicates": 0,
            "timeouts": 0,
            "fallbacks": 0,
            "partials_sent": 0,
            "results_forwarded": 0,
        }

    # -- views -------------------------------------------------------------------

    def knows(self, command_id: str) -> bool:
        return command_id in self._commands

    @property
    def active(self) -> int:
        """How many commands have not ended here."""
        return len(self._commands)

    def ended(self, command_id: str) -> str | None:
        """None: not ended here; "": completed; else the failure."""
        return self._ended.get(command_id)

    def bypass_entries(self) -> list[BypassEntry]:
        return [e for c in self._commands.values() for e in c.bypass.values()]

    def timeout_aggregator(self, command_id: str) -> TimeoutAggregator | None:
        """This node's timeout aggregation work for a live command, if any."""
        cmd = self._commands.get(command_id)
        return None if cmd is None else cmd.ta

    @property
    def parked(self) -> int:
        return len(self._parked)

    def live(self) -> list[tuple[CommandSpec, int, int, int]]:
        """(spec, slots held, chunks done, parked) per live command."""
        parked: dict[str, int] = {}
        for p in self._parked:
            parked[p.packet.command_id] = parked.get(p.packet.command_id, 0) + 1
        return [
            (c.spec, len(c.slots), sum(c.done), parked.get(cid, 0))
            for cid, c in self._commands.items()
        ]

    def holds(self, command_id: str) -> bool:
        """Whether anything of the command is still held here (slots, entries, parked)."""
        c = self._commands.get(command_id)
        return bool(
            c is not None
            and (
                c.slots or c.bypass or any(p.packet.command_id == command_id for p in self._parked)
            )
        )

    # -- admission -----------------------------------------------------------------

    def admit(self, cplan: CommandPlan, deadline_at: float) -> Effects:
        """Take `cplan` on (first packet of the command here); arms its deadline."""
        eff = Effects()
        cid = cplan.spec.command_id
        if cid in self._commands or cid in self._ended:
            return eff
        self._commands[cid] = _Command(cplan, cplan.switch(self.switch_id), self.switch_id)
        eff.timers.append((("deadline", cid, -1), deadline_at))
        return eff

    # -- packets -------------------------------------------------------------------

    def receive(self, pkt: Packet, hop_from: str, now: float) -> Effects:
        """A packet from neighbour `hop_from`. Raises a LightpathError (before
        changing anything) when the packet is not acceptable."""
        eff = Effects()
        cmd = self._commands.get(pkt.command_id)
        if cmd is None:
            ended = self._ended.get(pkt.command_id)
            if ended == "":
                if pkt.kind in (Kind.CONTRIBUTION, Kind.LATE):
                    eff.duplicate = True  # the result is out: this arrived before
                    self.counters["duplicates"] += 1
                return eff
            if ended is not None:
                raise FailedPrecondition(
                    f"command {pkt.command_id}", f"failed: {ended}", reason="COMMAND_FAILED"
                )
            raise NotFound("command", pkt.command_id)
        if not 0 <= pkt.chunk < cmd.chunks:
            raise InvalidArgument("index", f"must be within 0..{cmd.chunks - 1}")
        kind = pkt.kind
        if kind is Kind.CONTRIBUTION:
            self._contribution(cmd, pkt, hop_from, now, eff)
        elif kind is Kind.PARTIAL:
            self._partial(cmd, pkt, hop_from, now, eff)
        elif kind is Kind.LATE:
            self._late(cmd, pkt, hop_from, now, eff)
        elif kind in (Kind.ROOT_PARTIAL, Kind.FINAL):
            self._routed(cmd, pkt, hop_from, now, eff)
        elif kind is Kind.RESULT:
            if cmd.plan is None or hop_from != cmd.plan.parent:
                raise InvalidArgument("kind", "results come down from the parent switch")
            self._result_down(cmd, pkt, eff)
        else:
            raise InvalidArgument("kind", "must be a known AggChunkKind")
        return eff

    # -- failing before the deadline ---------------------------------------------

    def _correction_key(self, cmd: _Command, node: str, chunk: int) -> int:
        return cmd.cplan.position[node] * cmd.chunks + chunk

    def refused(self, pkt: Packet, hop_from: str, why: str, now: float, grace_s: float) -> Effects:
        """This switch refused `pkt` from compute node `hop_from` (`why`). When the
        node still owes that chunk — its data not yet taken, or, as the command's
        timeout aggregation node, its FINAL — nothing can complete without it, so a
        timer gives the node `grace_s` to send it again correctly (on a new stream)
        before the command fails across the tree. A chunk the node does not owe (a
        repeat, a FINAL from a node that is not the timeout aggregation node) only
        gets its refusal."""
        eff = Effects()
        cmd = self._commands.get(pkt.command_id)
        plan = cmd.plan if cmd is not None else None
        if (
            cmd is None
            or plan is None
            or hop_from not in plan.compute_members
            or pkt.source != hop_from
            or not 0 <= pkt.chunk < cmd.chunks
        ):
            return eff
        if pkt.kind is Kind.FINAL:
            owed = hop_from == cmd.spec.timeout_aggregator and not cmd.finals_in[pkt.chunk]
        elif pkt.kind in (Kind.CONTRIBUTION, Kind.LATE):
            owed = not cmd.received[hop_from][pkt.chunk]
        else:
            owed = False
        if not owed:
            return eff
        key = self._correction_key(cmd, hop_from, pkt.chunk)
        if key not in cmd.corrections:
            cmd.corrections[key] = (hop_from, pkt.chunk, why)
            eff.timers.append((("correct", cmd.spec.command_id, key), now + grace_s))
            eff.events.append(Event("refused_owed", cmd.spec.command_id, pkt.chunk, hop_from, why))
        return eff

    def _corrected(self, cmd: _Command, node: str, chunk: int, eff: Effects) -> None:
        if not cmd.corrections:
            return
        key = self._correction_key(cmd, node, chunk)
        if cmd.corrections.pop(key, None) is not None:
            eff.cancels.append(("correct", cmd.spec.command_id, key))
            eff.events.append(Event("corrected", cmd.spec.command_id, chunk, node))

    def abort(self, command_id: str, reason: str, now: float, *, code: str = ABORTED) -> Effects:
        """Fail the command here now (AbortCommand, or another switch's failure heard
        through the tree's aborts stream). A command this switch has not seen yet is
        remembered as failed, so its packets are refused from now on."""
        eff = Effects()
        cmd = self._commands.get(command_id)
        if cmd is None:
            if command_id not in self._ended:
                self._forget(command_id, reason)
            return eff
        self._fail(cmd, reason, now, eff, code=code)
        return eff

    def _member(self, cmd: _Command, child: str, what: str) -> SwitchPlan:
        plan = cmd.plan
        if plan is None or child not in plan.members:
            raise InvalidArgument(
                "source",
                f"{child!r} is not a {what} of command {cmd.spec.command_id} under switch {self.switch_id}",
                reason="NOT_A_PARTICIPANT",
            )
        return plan

    def _first_time(self, cmd: _Command, child: str, chunk: int, now: float, eff: Effects) -> bool:
        """Record an arrival; False when the child sent this chunk before (counted once)."""
        seen = cmd.received[child]
        if seen[chunk]:
            cmd.report.duplicates += 1
            self.counters["duplicates"] += 1
            eff.duplicate = True
            eff.events.append(Event("duplicate", cmd.spec.command_id, chunk, child))
            return False
        seen[chunk] = 1
        if chunk == 0:
            cmd.arrival0.setdefault(child, now)
        self._corrected(cmd, child, chunk, eff)
        return True

    def _contribution(
        self, cmd: _Command, pkt: Packet, child: str, now: float, eff: Effects
    ) -> None:
        plan = self._member(cmd, child, "participant")
        if child not in plan.compute_members or pkt.source != child:
            raise InvalidArgument("source", f"{child!r} is a switch; switches send partials")
        if not self._first_time(cmd, child, pkt.chunk, now, eff):
            return
        if child not in plan.expected:
            # The bitmap has this node's bit cleared (AG-9, S45): its data goes
            # around this switch even when it did not tag it itself.
            self._flag_and_route(cmd, pkt, child, eff, via_entry=False)
            return
        if cmd.done[pkt.chunk]:
            self._match_bypass(cmd, pkt, child, eff)
            return
        self._aggregate(cmd, pkt, child, now, eff)

    def _partial(self, cmd: _Command, pkt: Packet, child: str, now: float, eff: Effects) -> None:
        plan = self._member(cmd, child, "child switch")
        if child not in plan.expected or pkt.source != child:
            raise InvalidArgument("source", f"{child!r} does not aggregate for this command")
        if not self._first_time(cmd, child, pkt.chunk, now, eff):
            return
        if cmd.done[pkt.chunk]:
            self._match_bypass(cmd, pkt, child, eff)  # a late sub-switch (AG-11)
            return
        self._aggregate(cmd, pkt, child, now, eff)

    def _late(self, cmd: _Command, pkt: Packet, hop_from: str, now: float, eff: Effects) -> None:
        if cmd.cplan.topology.is_compute(hop_from):
            self._member(cmd, hop_from, "participant")
            # A predicted timeout node tagged its own data (AG-9, S43).
            if pkt.source != hop_from or hop_from not in cmd.spec.predicted:
                raise InvalidArgument(
                    "timeout_flag",
                    "only a predicted timeout node tags its own data; send a CONTRIBUTION",
                )
            if not self._first_time(cmd, hop_from, pkt.chunk, now, eff):
                return
            self._flag_and_route(cmd, pkt, hop_from, eff, via_entry=False)
            return
        self._to_ta(cmd, pkt, eff)  # flagged data passing through: forward only (AG-5)

    def _match_bypass(self, cmd: _Command, pkt: Packet, child: str, eff: Effects) -> None:
        entry = cmd.bypass.pop((pkt.chunk, child), None)
        if entry is None:  # pragma: no cover - a done chunk has an entry for every absent child
            eff.events.append(Event("unexpected_late", cmd.spec.command_id, pkt.chunk, child))
            return
        eff.events.append(Event("bypass_matched", cmd.spec.command_id, pkt.chunk, child))
        self._flag_and_route(cmd, pkt, child, eff, via_entry=True)

    def _flag_and_route(
        self, cmd: _Command, pkt: Packet, node: str, eff: Effects, via_entry: bool
    ) -> None:
        """AG-5: tag the data with its timeout node and send it to the timeout aggregation node."""
        ta = cmd.spec.timeout_aggregator
        if not (pkt.kind is Kind.LATE and pkt.timeout_flag and pkt.destination == ta):
            pkt = pkt.but(kind=Kind.LATE, timeout_flag=True, destination=ta)
        self.counters["flagged"] += 1
        eff.events.append(
            Event(
                "flagged",
                cmd.spec.command_id,
                pkt.chunk,
                node,
                "bypass entry" if via_entry else "participation bitmap",
            )
        )
        self._to_ta(cmd, pkt, eff)

    def _to_ta(self, cmd: _Command, pkt: Packet, eff: Effects) -> None:
        ta = cmd.spec.timeout_aggregator
        if ta == self.switch_id:
            self._ta_receive(cmd, pkt, eff)
            return
        hop = cmd.cplan.topology.next_hop(self.switch_id, ta)
        if pkt.kind is Kind.LATE:
            self.counters["forwarded_flagged"] += 1
        eff.sends.append((hop, pkt))
        eff.events.append(Event("forwarded", cmd.spec.command_id, pkt.chunk, pkt.source, hop))

    def _routed(self, cmd: _Command, pkt: Packet, hop_from: str, now: float, eff: Effects) -> None:
        topo = cmd.cplan.topology
        if pkt.kind is Kind.FINAL:
            pkt = self._check_final(cmd, pkt, hop_from)
            if topo.is_compute(hop_from):
                cmd.finals_in[pkt.chunk] = 1
                self._corrected(cmd, hop_from, pkt.chunk, eff)
        if pkt.destination != self.switch_id:
            hop = topo.next_hop(self.switch_id, pkt.destination)
            eff.sends.append((hop, pkt))
            eff.events.append(Event("forwarded", cmd.spec.command_id, pkt.chunk, pkt.source, hop))
            return
        if pkt.kind is Kind.ROOT_PARTIAL:
            self._ta_receive(cmd, pkt, eff)
        else:
            if cmd.finals[pkt.chunk]:
                return
            cmd.finals[pkt.chunk] = 1
            assert pkt.data is not None
            self._broadcast(cmd, pkt.chunk, pkt.data, eff)

    def _check_final(self, cmd: _Command, pkt: Packet, hop_from: str) -> Packet:
        """A FINAL comes from the timeout aggregation node and goes to the root; an
        empty `destination` means the root (it can go nowhere else). A refused FINAL
        changes nothing here: the same chunk, corrected, is taken afterwards."""
        topo = cmd.cplan.topology
        ta = cmd.spec.timeout_aggregator
        if pkt.source != ta or (topo.is_compute(hop_from) and hop_from != pkt.source):
            raise InvalidArgument(
                "source",
                f"only the timeout aggregation node ({ta!r}) sends FINAL chunks "
                f"of command {cmd.spec.command_id}; got {pkt.source!r}",
            )
        if not pkt.destination:
            return pkt.but(destination=topo.root)
        if pkt.destination != topo.root:
            raise InvalidArgument(
                "destination",
                f"a FINAL chunk goes to the root switch {topo.root!r} (or leave it empty); "
                f"got {pkt.destination!r}",
            )
        return pkt

    # -- aggregation ---------------------------------------------------------------

    def _aggregate(self, cmd: _Command, pkt: Packet, child: str, now: float, eff: Effects) -> None:
        slot = cmd.slots.get(pkt.chunk)
        if slot is None:
            if self._parked or not self.pool.acquire():
                if cmd.spec.slot_policy is SlotPolicy.FALLBACK:
                    self._fallback(cmd, pkt, child, now, eff)
                    return
                self._parked.append(_Parked(pkt, child, now))
                eff.parked = True
                eff.events.append(Event("parked", cmd.spec.command_id, pkt.chunk, child))
                return
            slot = self._open_slot(cmd, pkt.chunk, now, eff)
        self._add(cmd, slot, pkt, child, now, eff)

    def _open_slot(self, cmd: _Command, chunk: int, now: float, eff: Effects) -> _Slot:
        plan = cmd.plan
        assert plan is not None
        slot = _Slot(
            now,
            Fold(cmd.reduction, plan.expected, cmd.spec.incremental, self._fold_alloc(cmd, chunk)),
        )
        cmd.slots[chunk] = slot
        eff.events.append(Event("slot_acquired", cmd.spec.command_id, chunk))
        if not cmd.spec.wait_for_all:
            slot.timer = True
            eff.timers.append((("chunk", cmd.spec.command_id, chunk), now + plan.threshold_s))
        return slot

    def _add(
        self, cmd: _Command, slot: _Slot, pkt: Packet, child: str, now: float, eff: Effects
    ) -> None:
        plan = cmd.plan
        assert plan is not None
        data = (
            None
            if pkt.data is None
            else cmd.reduction.absorb(pkt.data, pkt.fixed_point, self._fold_alloc(cmd, pkt.chunk))
        )
        slot.fold.add(child, data)
        slot.arrived.add(child)
        slot.carried.extend(pkt.timeout_nodes)
        self.counters["aggregated"] += 1
        eff.events.append(Event("aggregated", cmd.spec.command_id, pkt.chunk, child))
        if len(slot.arrived) == len(plan.expected):
            self._complete(cmd, pkt.chunk, [], now, eff)

    def _complete(
        self, cmd: _Command, chunk: int, missing: list[str], now: float, eff: Effects
    ) -> None:
        """Send the chunk's (partial) aggregate on, record bypass entries for the
        missing children, free the slot (AG-3, AG-4)."""
        plan = cmd.plan
        assert plan is not None
        slot = cmd.slots.pop(chunk)
        data = slot.fold.finish()
        for node in missing:
            cmd.bypass[(chunk, node)] = BypassEntry(cmd.spec.command_id, chunk, node, now)
            cmd.report.bypass_created += 1
            eff.events.append(Event("bypass_created", cmd.spec.command_id, chunk, node))
        cmd.done[chunk] = 1
        self._release(cmd, slot, chunk, now, eff, cancel_timer=not missing)
        self._emit(cmd, chunk, data, [*slot.carried, *missing, *plan.carried], now, eff)
        self._serve_parked(now, eff)

    def _release(
        self, cmd: _Command, slot: _Slot, chunk: int, now: float, eff: Effects, cancel_timer: bool
    ) -> None:
        self.pool.release()
        cmd.released += 1
        hold = (now - slot.acquired_at) * 1000.0
        cmd.report.holds_ms.append(hold)
        eff.events.append(Event("slot_released", cmd.spec.command_id, chunk, detail=f"{hold:.3f}"))
        if slot.timer and cancel_timer:
            eff.cancels.append(("chunk", cmd.spec.command_id, chunk))

    def _emit(
        self,
        cmd: _Command,
        chunk: int,
        data: np.ndarray | None,
        carried: list[str],
        now: float,
        eff: Effects,
    ) -> None:
        plan = cmd.plan
        assert plan is not None
        pos = cmd.cplan.position
        ids = tuple(sorted(set(carried), key=pos.__getitem__))
        fixed = cmd.reduction.fixed_point
        if not plan.is_root:
            self.counters["partials_sent"] += 1
            eff.sends.append(
                (
                    plan.parent,  # type: ignore[arg-type]
                    Packet(
                        cmd.spec.command_id,
                        chunk,
                        Kind.PARTIAL,
                        self.switch_id,
                        data,
                        timeout_nodes=ids,
                        fixed_point=fixed,
                    ),
                )
            )
            eff.events.append(
                Event("partial_sent", cmd.spec.command_id, chunk, detail=",".join(ids))
            )
            return
        if not ids:
            assert data is not None
            self._broadcast(
                cmd, chunk, cmd.reduction.finish(data, self._fold_alloc(cmd, chunk)), eff
            )
            return
        # AG-6 / S301: the root's partial goes to the timeout aggregation node.
        eff.events.append(Event("root_partial", cmd.spec.command_id, chunk, detail=",".join(ids)))
        self._to_ta(
            cmd,
            Packet(
                cmd.spec.command_id,
                chunk,
                Kind.ROOT_PARTIAL,
                self.switch_id,
                data,
                destination=cmd.spec.timeout_aggregator,
                timeout_nodes=ids,
                fixed_point=fixed,
            ),
            eff,
        )

    def _fallback(self, cmd: _Command, pkt: Packet, child: str, now: float, eff: Effects) -> None:
        """AG-13 FALLBACK: no slot for this chunk, so it bypasses the switch —
        every expected child is a timeout node here and its data goes to the
        timeout aggregation node, which aggregates it in software."""
        plan = cmd.plan
        assert plan is not None
        chunk = pkt.chunk
        cmd.done[chunk] = 1
        cmd.report.fallback_chunks += 1
        self.counters["fallbacks"] += 1
        eff.events.append(Event("fallback", cmd.spec.command_id, chunk, child))
        for node in plan.expected:
            if node != child:
                cmd.bypass[(chunk, node)] = BypassEntry(cmd.spec.command_id, chunk, node, now)
                cmd.report.bypass_created += 1
                eff.events.append(Event("bypass_created", cmd.spec.command_id, chunk, node))
        self._emit(cmd, chunk, None, [*plan.expected, *plan.carried], now, eff)
        self._flag_and_route(cmd, pkt, child, eff, via_entry=False)
        cmd.released += 1  # the chunk is done here without having held a slot

    def _serve_parked(self, now: float, eff: Effects) -> None:
        """Slots freed: admit waiting arrivals, first come first served. An
        arrival may join its chunk's slot at once; only the oldest may take a
        new one. Not re-entrant: a slot freed by an admitted arrival starts
        another pass of the same loop."""
        if self._serving:
            self._again = True
            return
        self._serving = True
        try:
            self._again = True
            while self._again and self._parked:
                self._again = False
                keep: deque[_Parked] = deque()
                while self._parked:
                    p = self._parked.popleft()
                    cmd = self._commands.get(p.packet.command_id)
                    if cmd is None:  # pragma: no cover - failures remove their parked arrivals
                        continue
                    chunk = p.packet.chunk
                    if cmd.done[chunk]:
                        # Timed out (or fell back) while it waited: it is late now (AG-5).
                        self._admitted(cmd, p, now, eff)
                        self._match_bypass(cmd, p.packet, p.child, eff)
                        continue
                    slot = cmd.slots.get(chunk)
                    if slot is None and not keep and self.pool.acquire():
                        slot = self._open_slot(cmd, chunk, now, eff)
                    if slot is None:
                        keep.append(p)
                        continue
                    self._admitted(cmd, p, now, eff)
                    self._add(cmd, slot, p.packet, p.child, now, eff)
                self._parked = keep
        finally:
            self._serving = False

    def _admitted(self, cmd: _Command, p: _Parked, now: float, eff: Effects) -> None:
        cmd.report.waited_ms += (now - p.parked_at) * 1000.0
        eff.admitted.append(p.packet)
        eff.events.append(Event("admitted", cmd.spec.command_id, p.packet.chunk, p.child))

    # -- the timeout aggregation node (AG-7) -----------------------------------------

    def _fold_alloc(self, cmd: _Command, chunk: int) -> Alloc | None:
        """Partials of switches on the results' way down come from `alloc` (the data
        plane frees them when the chunk's result passes); elsewhere numpy's."""
        alloc, cid = self._alloc, cmd.spec.command_id
        if alloc is None or cmd.plan is None:
            return None
        return lambda n, dt: alloc(cid, chunk, n, dt)

    def _ta_alloc(self, cmd: _Command) -> ChunkAlloc | None:
        alloc, cid = self._alloc, cmd.spec.command_id
        if alloc is None or cmd.plan is None:
            return None
        return lambda chunk, n, dt: alloc(cid, chunk, n, dt)

    def _ta_receive(self, cmd: _Command, pkt: Packet, eff: Effects) -> None:
        if cmd.ta is None:
            cmd.ta = TimeoutAggregator(
                cmd.reduction,
                cmd.cplan.position,
                incremental=cmd.spec.incremental,
                alloc=self._ta_alloc(cmd),
            )
        if pkt.kind is Kind.ROOT_PARTIAL:
            eff.events.append(
                Event(
                    "ta_partial",
                    cmd.spec.command_id,
                    pkt.chunk,
                    detail=",".join(pkt.timeout_nodes),
                )
            )
            final = cmd.ta.on_partial(pkt.chunk, pkt.data, pkt.timeout_nodes, pkt.fixed_point)
        else:
            eff.events.append(Event("ta_late", cmd.spec.command_id, pkt.chunk, pkt.source))
            final = cmd.ta.on_late(
                pkt.chunk, pkt.source, pkt.data, pkt.timeout_nodes, pkt.fixed_point
            )
        if final is None:
            return
        cmd.ta_done += 1
        eff.events.append(Event("ta_final", cmd.spec.command_id, pkt.chunk))
        root = cmd.cplan.topology.root
        if root == self.switch_id:
            cmd.finals[pkt.chunk] = 1
            self._broadcast(cmd, pkt.chunk, final, eff)
        else:
            hop = cmd.cplan.topology.next_hop(self.switch_id, root)
            eff.sends.append(
                (
                    hop,
                    Packet(
                        cmd.spec.command_id,
                        pkt.chunk,
                        Kind.FINAL,
                        self.switch_id,
                        final,
                        destination=root,
                    ),
                )
            )
        if cmd.plan is None and cmd.ta_done == cmd.chunks:
            self._finish(cmd, eff)  # a dedicated node: nothing comes back down through it

    # -- results -------------------------------------------------------------------

    def _broadcast(self, cmd: _Command, chunk: int, final: np.ndarray, eff: Effects) -> None:
        """At the root: the final chunk (through the parameter server, AG-12) goes down."""
        params = bool(cmd.spec.ps_model)
        if params:
            final = self.ps.apply(cmd.spec, chunk, final)
        self._result_down(
            cmd,
            Packet(
                cmd.spec.command_id, chunk, Kind.RESULT, self.switch_id, final, parameters=params
            ),
            eff,
        )

    def _result_down(self, cmd: _Command, pkt: Packet, eff: Effects) -> None:
        plan = cmd.plan
        assert plan is not None
        if cmd.results[pkt.chunk]:
            return
        cmd.results[pkt.chunk] = 1
        cmd.results_count += 1
        for member in plan.members:
            eff.sends.append((member, pkt))
        self.counters["results_forwarded"] += 1
        if cmd.results_count == cmd.chunks:
            if plan.is_root:
                eff.completed.append(cmd.spec.command_id)
            self._finish(cmd, eff)

    # -- the end of a command here -------------------------------------------------

    def _finish(self, cmd: _Command, eff: Effects) -> None:
        cid = cmd.spec.command_id
        for entry in cmd.bypass.values():  # pragma: no cover - every entry is matched first
            eff.events.append(Event("bypass_leftover", cid, entry.chunk, entry.node))
        cmd.bypass.clear()
        plan = cmd.plan
        if plan is not None and cmd.arrival0:
            first = min(cmd.arrival0.values())
            cmd.report.lateness = {
                c: cmd.arrival0[c] - first for c in plan.compute_members if c in cmd.arrival0
            }
        eff.cancels.append(("deadline", cid, -1))
        eff.reports.append(cmd.report)
        self._forget(cid, "")

    def _forget(self, command_id: str, outcome: str) -> None:
        self._commands.pop(command_id, None)
        self._ended[command_id] = outcome
        while len(self._ended) > self._remember:
            self._ended.popitem(last=False)

    # -- timers --------------------------------------------------------------------

    def fire(self, key: TimerKey, now: float) -> Effects:
        eff = Effects()
        what, cid, chunk = key
        cmd = self._commands.get(cid)
        if cmd is None:
            return eff
        if what == "deadline":
            if cmd.plan is None and (cmd.ta is None or not cmd.ta.open_chunks):
                # Not on the results' way down: only routed packets passed here, or
                # the timeout aggregation work this node got is all done.
                self._forget(cid, "")
                eff.cancels.append(key)
                return eff
            self._fail(cmd, "the deadline passed before every contribution arrived", now, eff)
            return eff
        if what == "correct":
            owed = cmd.corrections.pop(chunk, None)
            if owed is not None:
                node, index, why = owed
                self._fail(
                    cmd,
                    f"node {node} did not send chunk {index} again correctly after it was "
                    f"refused ({why})",
                    now,
                    eff,
                    code=NOT_CORRECTED,
                    spread=True,
                    blame=(node,),
                )
            return eff
        slot = cmd.slots.get(chunk)
        if slot is None:
            return eff  # completed before the timer fired
        plan = cmd.plan
        assert plan is not None
        missing = [c for c in plan.expected if c not in slot.arrived]
        cmd.report.timed_out_chunks += 1
        cmd.report.timeout_nodes.update(missing)
        self.counters["timeouts"] += 1
        eff.events.append(Event("timeout", cid, chunk, detail=",".join(missing)))
        self._complete(cmd, chunk, missing, now, eff)
        return eff

    def _fail(
        self,
        cmd: _Command,
        reason: str,
        now: float,
        eff: Effects,
        *,
        code: str = DEADLINE,
        spread: bool = False,
        blame: Iterable[str] = (),
    ) -> None:
        """AG-11: free every slot, drop every bypass entry and waiting arrival.
        `blame`: the nodes the failure is down to, named as missing whatever else."""
        cid = cmd.spec.command_id
        missing: set[str] = set()
        plan = cmd.plan
        for chunk, slot in list(cmd.slots.items()):
            if plan is not None:
                missing.update(c for c in plan.expected if c not in slot.arrived)
            self._release(cmd, slot, chunk, now, eff, cancel_timer=True)
        cmd.slots.clear()
        for entry in cmd.bypass.values():
            missing.add(entry.node)
            eff.events.append(Event("bypass_dropped", cid, entry.chunk, entry.node))
        cmd.bypass.clear()
        if cmd.ta is not None:
            for chunk in cmd.ta.open_chunks:
                missing.update(cmd.ta.outstanding(chunk))
        if plan is not None:
            missing.update(c for c in plan.compute_members if not all(cmd.received[c]))
        missing.update(blame)
        failure = Failure(cid, reason, sorted(missing), code, spread)
        error = failure.error()
        keep: deque[_Parked] = deque()
        for p in self._parked:
            if p.packet.command_id == cid:
                eff.refused.append((p.packet, error))
            else:
                keep.append(p)
        self._parked = keep
        cmd.report.failed = reason
        eff.events.append(Event("failed", cid, detail=reason))
        for key in cmd.corrections:
            eff.cancels.append(("correct", cid, key))
        cmd.corrections.clear()
        eff.failures.append(failure)
        eff.reports.append(cmd.report)
        self._forget(cid, reason)
        self._serve_parked(now, eff)
