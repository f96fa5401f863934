"""A discrete-event simulation of an aggregation tree built from the real
pure parts: one `SwitchCore` per switch (and dedicated node), one
`NodeCommand` per compute node, packets optionally round-tripped through the
real wire codec. Virtual time, so the seed's scenarios and random trees run
step by step, fast and deterministic."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from lightpath.aggregation import wire
from lightpath.aggregation.maths import Kind, NodeCommand, Packet, chunk_bounds
from lightpath_services.agg_switch.command import CommandPlan, CommandSpec, plan_command
from lightpath_services.agg_switch.switch import CommandReport, Effects, Event, Failure, SwitchCore
from lightpath_services.agg_switch.topology import NodeKind, Topology


@dataclass(frozen=True)
class Delivery:
    """A packet crossing one link."""

    at: float
    frm: str
    to: str
    command_id: str
    chunk: int
    kind: Kind
    source: str
    destination: str
    timeout_nodes: tuple[str, ...]
    timeout_flag: bool
    empty: bool
    data: np.ndarray | None = field(default=None, compare=False, repr=False)


@dataclass
class _Cmd:
    spec: CommandSpec
    plan: CommandPlan
    inputs: dict[str, np.ndarray]
    nodes: dict[str, NodeCommand]
    completed_at: float | None = None
    failures: list[Failure] = field(default_factory=list)
    notified_failure: set[str] = field(default_factory=set)


class Simulation:
    def __init__(
        self,
        topology: Topology,
        *,
        slots: int | Mapping[str, int] = 64,
        link_delay: float | Callable[[str, str], float] = 0.0,
        wire: bool = True,
    ):
        self.topology = topology
        self.cores: dict[str, SwitchCore] = {}
        for n in topology.nodes:
            if n.kind in (NodeKind.SWITCH, NodeKind.DEDICATED):
                cap = slots if isinstance(slots, int) else slots.get(n.id, 64)
                self.cores[n.id] = SwitchCore(n.id, cap)
        self._delay = link_delay if callable(link_delay) else (lambda a, b, d=link_delay: d)
        self.wire = wire
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._timers: dict[tuple[str, tuple[str, str, int]], int] = {}
        self.commands: dict[str, _Cmd] = {}
        self.events: list[tuple[float, str, Event]] = []
        self.deliveries: list[Delivery] = []
        self.reports: list[CommandReport] = []
        self.refused: list[tuple[str, Packet]] = []

    # -- set-up ----------------------------------------------------------------

    def add_command(
        self,
        spec: CommandSpec,
        inputs: Mapping[str, np.ndarray],
        *,
        start: Mapping[str, float] | None = None,
        chunk_gap: float = 0.0,
        never: Iterable[str] = (),
        duplicate: Iterable[str] = (),
    ) -> None:
        """Each participant sends its chunks from `start[node]` (default 0),
        `chunk_gap` apart; `never` nodes send nothing; `duplicate` nodes send
        every chunk twice."""
        plan = plan_command(self.topology, spec)
        nodes = {
            p: NodeCommand(
                p,
                spec.command_id,
                spec.reduction,
                spec.length,
                spec.chunk_elems,
                timeout_aggregator=p == spec.timeout_aggregator,
                position=self.topology.position,
                incremental=spec.incremental,
                root=self.topology.root,
            )
            for p in spec.participants
        }
        cmd = _Cmd(spec, plan, {k: np.asarray(v) for k, v in inputs.items()}, nodes)
        self.commands[spec.command_id] = cmd
        never = set(never)
        twice = set(duplicate)
        for p in spec.participants:
            # Each node opens its Results stream at its leaf first, which makes
            # the leaf load the command (and arm its deadline), as the service does.
            self._at(0.0, lambda p=p, c=cmd: self._subscribe(c, p))
        for p in spec.participants:
            if p in never:
                continue
            t0 = (start or {}).get(p, 0.0)
            for k in range(spec.chunks):
                for _ in range(2 if p in twice else 1):
                    self._at(t0 + k * chunk_gap, lambda p=p, k=k, c=cmd: self._send_chunk(c, p, k))

    def _subscribe(self, cmd: _Cmd, node: str) -> None:
        leaf = self.topology.leaf_switch(node)
        core = self.cores[leaf]
        if not core.knows(cmd.spec.command_id) and core.ended(cmd.spec.command_id) is None:
            self._apply(leaf, core.admit(cmd.plan, cmd.spec.deadline_at))

    def _send_chunk(self, cmd: _Cmd, node: str, k: int) -> None:
        spec = cmd.spec
        lo, hi = chunk_bounds(k, spec.length, spec.chunk_elems)
        data = cmd.inputs[node][lo:hi]
        data = np.array(data, dtype=spec.dtype.numpy)
        data.flags.writeable = False
        if node in spec.predicted:  # AG-9: a predicted timeout node tags its own data
            pkt = Packet(
                spec.command_id,
                k,
                Kind.LATE,
                node,
                data,
                destination=spec.timeout_aggregator,
                timeout_flag=True,
            )
        else:
            pkt = Packet(spec.command_id, k, Kind.CONTRIBUTION, node, data)
        self._send(node, self.topology.leaf_switch(node), pkt)

    # -- the event loop --------------------------------------------------------

    def _at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (t, next(self._seq), fn))

    def run(self, until: float = 1e9) -> Simulation:
        while self._queue and self._queue[0][0] <= until:
            t, _, fn = heapq.heappop(self._queue)
            self.now = t
            fn()
        return self

    def _send(self, frm: str, to: str, pkt: Packet) -> None:
        spec = self.commands[pkt.command_id].spec
        self.deliveries.append(
            Delivery(
                self.now + self._delay(frm, to),
                frm,
                to,
                pkt.command_id,
                pkt.chunk,
                pkt.kind,
                pkt.source,
                pkt.destination,
                pkt.timeout_nodes,
                pkt.timeout_flag,
                pkt.data is None,
                None if pkt.data is None else np.array(pkt.data),
            )
        )
        if self.wire:
            raw = wire.encode(pkt, spec.dtype)
            header, data = wire.decode(raw)
            pkt = wire.to_packet(header, data, raw)
        self._at(self.now + self._delay(frm, to), lambda: self._deliver(frm, to, pkt))

    def _deliver(self, frm: str, to: str, pkt: Packet) -> None:
        cmd = self.commands[pkt.command_id]
        if to in cmd.nodes:
            out = cmd.nodes[to].accept(pkt)
            if out is not None:
                self._send(to, self.topology.leaf_switch(to), out)
            return
        core = self.cores[to]
        if not core.knows(pkt.command_id) and core.ended(pkt.command_id) is None:
            self._apply(to, core.admit(cmd.plan, cmd.spec.deadline_at))
        self._apply(to, core.receive(pkt, frm, self.now))

    def _apply(self, here: str, eff: Effects) -> None:
        for ev in eff.events:
            self.events.append((self.now, here, ev))
        for key in eff.cancels:
            self._timers.pop((here, key), None)
        for key, at in eff.timers:
            token = next(self._seq)
            self._timers[(here, key)] = token
            self._at(at, lambda k=key, tok=token: self._fire(here, k, tok))
        for to, pkt in eff.sends:
            self._send(here, to, pkt)
        for pkt, _ in eff.refused:
            self.refused.append((here, pkt))
        self.reports.extend(eff.reports)
        for f in eff.failures:
            cmd = self.commands[f.command_id]
            cmd.failures.append(f)
            plan = cmd.plan.switch(here)
            if plan is not None:
                cmd.notified_failure.update(plan.compute_members)
        for cid in eff.completed:
            self.commands[cid].completed_at = self.now

    def _fire(self, here: str, key: tuple[str, str, int], token: int) -> None:
        if self._timers.get((here, key)) != token:
            return
        del self._timers[(here, key)]
        self._apply(here, self.cores[here].fire(key, self.now))

    # -- reading the outcome ---------------------------------------------------

    def result(self, command_id: str, node: str) -> np.ndarray:
        nc = self.commands[command_id].nodes[node]
        assert nc.done, f"{node} has {nc.received}/{nc.chunks} chunks"
        return nc.result

    def results(self, command_id: str) -> dict[str, np.ndarray]:
        return {n: self.result(command_id, n) for n in self.commands[command_id].nodes}

    def events_of(self, what: str, command_id: str | None = None) -> list[tuple[float, str, Event]]:
        return [
            (t, n, e)
            for t, n, e in self.events
            if e.what == what and (command_id is None or e.command_id == command_id)
        ]

    def bypass_entries(self) -> list:
        return [e for core in self.cores.values() for e in core.bypass_entries()]

    def holding(self, command_id: str) -> list[str]:
        """Switches still holding anything of the command (slots, entries, waiting arrivals)."""
        return [n for n, core in self.cores.items() if core.holds(command_id)]
