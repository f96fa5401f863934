"""The folded executor: one folded set (instance) in one process (GF-5, GF-6).

The executor wires the members of a folded set so that each work element
passes downstream as a direct function call (the seed's "data flow as control
flow"), drives the set's roots through their sources, and answers their
return codes:

- KEEP_GOING: call again (after the other ready roots);
- ERROR: stop, naming the component (ComponentFailure);
- REACHED_EOF: that root is done; members whose upstream is all done are shut
  down in topological order, and `shutdown` may emit (a hash rollup does);
- GOT_BLIP: `process_blip` on every member in topological order; for a
  checkpoint blip every member's state goes into ONE checkpoint file before
  the blip leaves the set on its channels.

Work elements pass record by record, or a batch at a time to members that
take batches (`Component.compute_batch`): a root emits a batch of its
input, each member is called once with the batch and calls the next with
the batch it makes, so the per-record cost inside the set is the members'
own work. Monitoring counts per batch what it counted per record (records,
sampled sizes), and a "call" is one invocation, of a record or of a batch
(see MemberStats).

A member with several inputs, all from inside the set, gets each input
buffered and is called only while every input has data (round robin, in
flow order); the rest is delivered at a logical break (a blip or shutdown).
Several roots (datasets, channels from other sets, an external service's
responses) are served as they become ready. Channels to other processes are
flushed whenever the process would otherwise wait.
"""

from __future__ import annotations

import importlib
import os
import pickle
import selectors
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from lightpath.graph.channels import Channel, ChannelInput, ChannelWriter, PartitionedWriter
from lightpath.graph.components import (
    BATCH,
    LIBRARY_CLASSES,
    SPLIT_CLASSES,
    Blip,
    Component,
    ComponentError,
    Context,
    Emit,
    EmitBatch,
    FileReader,
    FileWriter,
    Record,
    ReturnCode,
    Source,
    discard_batch,
    record_size,
)
from lightpath.graph.expand import FlatGraph, Flow, Node
from lightpath.graph.kinds import REQUEST_HALF, is_custom_kind
from lightpath.graph.monitor import CpuSampler, process_usage

ComponentFactory = Callable[[Node, Context], Component]

TIMED_FIRST = 100
TIMED_EVERY = 1000


class ComponentFailure(Exception):
    """A component answered ERROR or raised: the run stops, naming it (GF-5)."""

    def __init__(self, component: str, message: str):
        super().__init__(f"{component}: {message}")
        self.component = component
        self.message = message


def library_factory(node: Node, context: Context) -> Component:
    """Instantiate a library kind, a split half, or user code named "module:Class"."""
    if node.kind in SPLIT_CLASSES:
        request_cls, response_cls = SPLIT_CLASSES[node.kind]
        cls = request_cls if node.half == REQUEST_HALF else response_cls
    elif node.kind in LIBRARY_CLASSES:
        cls = LIBRARY_CLASSES[node.kind]
    elif is_custom_kind(node.kind):
        module, _, name = node.kind.partition(":")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise ComponentFailure(node.id, f'cannot load kind "{node.kind}": {exc}') from exc
    else:
        raise ComponentFailure(node.id, f'no implementation of kind "{node.kind}"')
    return cls(node.params, context)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ComponentError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class CheckpointStore:
    """One file per checkpoint of one set instance: `<set>.<instance>.<blip id>.ckpt`."""

    def __init__(self, directory: str | Path, set_id: str, instance: int):
        self.directory = Path(directory)
        self.prefix = f"{set_id}.{instance}."

    def path(self, checkpoint: int) -> Path:
        return self.directory / f"{self.prefix}{checkpoint}.ckpt"

    def save(self, checkpoint: int, state: dict[str, Any]) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.path(checkpoint)
        tmp = final.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        return final

    def load(self, checkpoint: int) -> dict[str, Any]:
        with open(self.path(checkpoint), "rb") as f:
            return pickle.load(f)

    def saved(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        out = []
        for p in self.directory.glob(f"{self.prefix}*.ckpt"):
            try:
                out.append(int(p.name[len(self.prefix) : -len(".ckpt")]))
            except ValueError:
                continue
        return sorted(out)


@dataclass
class FlowCounter:
    """[records, sampled records, sampled bytes] as a list for speed in closures; exact bytes if known."""

    counts: list[int] = field(default_factory=lambda: [0, 0, 0])
    exact_bytes: Callable[[], int] | None = None
    crosses: bool = False

    @property
    def records(self) -> int:
        return self.counts[0]

    @property
    def bytes(self) -> int:
        if self.exact_bytes is not None:
            return self.exact_bytes()
        records, sampled, size = self.counts
        return round(size / sampled * records) if sampled else 0


@dataclass
class MemberStats:
    """What the executor counts of one member's calls (GF-6).

    A call is one invocation of the member by the executor: `compute` with one
    record, or `compute_batch` with a batch when the member takes batches.
    Each flow into the member counts its calls; the first 100 calls of each
    flow are timed, then one in 1000 (and every call nested in a timed one, so
    that the outer call's time excludes it). The member's CPU is estimated as
    the timed time per record times the records it got, plus its shutdown and
    blip calls, which are all timed.
    """

    # [timed calls, timed ns (exclusive of nested member calls), records in timed calls]
    timing: list[int] = field(default_factory=lambda: [0, 0, 0])
    # Shutdown and blip calls, all timed.
    once_ns: int = 0
    # Record counters of the flows into this member (in-set flows and channel arrivals).
    inbound: list[list[int]] = field(default_factory=list)
    # Call counters of the flows into this member.
    calls_in: list[list[int]] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(c[0] for c in self.inbound)

    @property
    def calls(self) -> int:
        return sum(c[0] for c in self.calls_in)

    def estimate_ns(self) -> float:
        _, timed_ns, timed_records = self.timing
        per_record = timed_ns / timed_records if timed_records else 0.0
        return per_record * self.records + self.once_ns


@dataclass
class ChannelIn:
    """A pipe or spill file bringing flow `flow` from instance `source_instance` of another set."""

    flow: int
    fd: int
    source_instance: int = 0


@dataclass
class ExecutorReport:
    set_id: str
    instance: int
    members: dict[str, dict[str, Any]]
    flows: dict[int, dict[str, Any]]
    cpu_seconds: float
    peak_rss_mb: float
    samples: int
    unattributed_samples: int
    channel_bytes: int
    checkpoints: list[int]

    def to_dict(self) -> dict[str, Any]:
        return {
            "set_id": self.set_id,
            "instance": self.instance,
            "members": self.members,
            "flows": {str(k): v for k, v in self.flows.items()},
            "cpu_seconds": self.cpu_seconds,
            "peak_rss_mb": self.peak_rss_mb,
            "samples": self.samples,
            "unattributed_samples": self.unattributed_samples,
            "channel_bytes": self.channel_bytes,
            "checkpoints": self.checkpoints,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ExecutorReport:
        return cls(
            set_id=d["set_id"],
            instance=d["instance"],
            members=dict(d["members"]),
            flows={int(k): v for k, v in d["flows"].items()},
            cpu_seconds=d["cpu_seconds"],
            peak_rss_mb=d["peak_rss_mb"],
            samples=d["samples"],
            unattributed_samples=d["unattributed_samples"],
            channel_bytes=d["channel_bytes"],
            checkpoints=list(d["checkpoints"]),
        )


class _MultiInput:
    """Buffers each input of a multi-input member until every input has data.

    Then the member is called input by input, in flow order, while every
    input has data: a record from each in turn, or, for a member taking
    batches, a batch from each of as many records as the shortest queue holds.
    """

    def __init__(self, deliveries: Sequence[tuple[Emit, EmitBatch]], batched: bool):
        self.one = [d[0] for d in deliveries]
        self.many = [d[1] for d in deliveries]
        self.batched = batched
        self.queues: list[deque[Record]] = [deque() for _ in deliveries]

    def pushers(self, i: int) -> tuple[Emit, EmitBatch]:
        q = self.queues[i]
        queues = self.queues

        def push(record: Record) -> None:
            q.append(record)
            if all(queues):
                self.release()

        def push_batch(records: list[Record]) -> None:
            q.extend(records)
            if all(queues):
                self.release()

        return push, push_batch

    def release(self) -> None:
        queues = self.queues
        if self.batched:
            while all(queues):
                k = min(map(len, queues))
                for q, deliver_batch in zip(queues, self.many, strict=True):
                    deliver_batch([q.popleft() for _ in range(k)])
            return
        while all(queues):
            for q, deliver in zip(queues, self.one, strict=True):
                deliver(q.popleft())

    def drain(self) -> None:
        """A logical break: deliver the rest, input by input."""
        for q, deliver, deliver_batch in zip(self.queues, self.one, self.many, strict=True):
            if q and self.batched:
                rest = list(q)
                q.clear()
                deliver_batch(rest)
            while q:
                deliver(q.popleft())


class FoldedExecutor:
    """Runs the members of one folded set as one process instance (GF-5)."""

    def __init__(
        self,
        graph: FlatGraph,
        members: Sequence[str],
        *,
        set_id: str = "set-0",
        instance: int = 0,
        degree: int = 1,
        channels_in: Sequence[ChannelIn] = (),
        channels_out: Mapping[int, Sequence[int]] | None = None,
        factory: ComponentFactory = library_factory,
        checkpoints: CheckpointStore | None = None,
        checkpoint_every: int = 0,
        resume_from: int | None = None,
        sample_interval: float = 0.005,
        on_ready: Callable[[], None] | None = None,
        on_checkpoint: Callable[[int], None] | None = None,
        channel_batch: int = 1024,
        batch: int = BATCH,
    ):
        self.graph = graph
        self.member_set = set(members)
        position = {c: i for i, c in enumerate(graph.order)}
        self.order = sorted(members, key=position.__getitem__)
        self.set_id = set_id
        self.instance = instance
        self.degree = degree
        self._channels_in = list(channels_in)
        self._channels_out = dict(channels_out or {})
        self._factory = factory
        self._checkpoints = checkpoints
        self._checkpoint_every = checkpoint_every
        self._resume_from = resume_from
        self._sample_interval = sample_interval
        self._on_ready = on_ready
        self._on_checkpoint = on_checkpoint
        self._channel_batch = channel_batch
        self._batch = batch

        self.components: dict[str, Component] = {}
        self.stats: dict[str, MemberStats] = {m: MemberStats() for m in self.order}
        self.flows: dict[int, FlowCounter] = {}
        self._tstack: list[int] = []
        self._sources: list[Source] = []
        self._done_sources: set[int] = set()
        self._blocked: dict[int, Blip] = {}
        self._down: set[str] = set()
        self._multi: dict[str, _MultiInput] = {}
        # Sinks a member's output goes to outside the set, ended when it shuts down.
        self._sinks: dict[str, list[Any]] = {m: [] for m in self.order}
        self._file_writers: dict[int, FileWriter] = {}
        self._channel_writers: dict[int, ChannelWriter | PartitionedWriter] = {}
        self._flushers: list[Component] = []
        self._saved: list[int] = []
        self._sampler: CpuSampler | None = None

    # ------------------------------------------------------------ wiring

    def _deliver(
        self, member: str, port: str, counts: list[int], *, counted: bool = True
    ) -> tuple[Emit, EmitBatch]:
        """Direct calls into `member` for one record and for a batch: counted
        (records and sampled bytes into `counts` unless the source counts them
        itself), sometimes timed, errors named.

        A member without its own compute_batch gets a batch as calls of
        compute, one per record, each counted and timed as a call."""
        comp = self.components[member]
        compute, compute_batch = comp.compute, comp.compute_batch
        stats = self.stats[member]
        timing = stats.timing
        calls = [0]
        stats.calls_in.append(calls)
        tstack = self._tstack
        # CPU time of this thread: a call blocked on a full channel is not busy.
        clock = time.thread_time_ns
        first, every = TIMED_FIRST, TIMED_EVERY

        def timed(fn: Callable[[str, Any], None], arg: Any, records: int) -> None:
            tstack.append(0)
            t0 = clock()
            try:
                fn(port, arg)
            finally:
                dt = clock() - t0
                nested = tstack.pop()
                timing[0] += 1
                timing[1] += dt - nested
                timing[2] += records
                if tstack:
                    tstack[-1] += dt

        def deliver(record: Record) -> None:
            if counted:
                k = counts[0] = counts[0] + 1
                if k <= first or not k % every:
                    # The records of the rule carry the flow's size sample.
                    counts[1] += 1
                    counts[2] += record_size(record)
            n = calls[0] = calls[0] + 1
            try:
                if n > first and n % every and not tstack:
                    compute(port, record)
                else:
                    timed(compute, record, 1)
            except ComponentFailure:
                raise
            except Exception as exc:
                raise ComponentFailure(member, _describe(exc)) from exc

        if type(comp).compute_batch is Component.compute_batch:

            def deliver_each(records: list[Record]) -> None:
                for record in records:
                    deliver(record)

            return deliver, deliver_each

        def deliver_batch(records: list[Record]) -> None:
            if counted:
                _count(counts, records)
            n = calls[0] = calls[0] + 1
            try:
                if n > first and n % every and not tstack:
                    compute_batch(port, records)
                else:
                    timed(compute_batch, records, len(records))
            except ComponentFailure:
                raise
            except Exception as exc:
                raise ComponentFailure(member, _describe(exc)) from exc

        return deliver, deliver_batch

    def _sink(self, sink: Any, counts: list[int]) -> tuple[Emit, EmitBatch]:
        """Counts records leaving the set (to a file or a channel); samples their size."""
        first, every = TIMED_FIRST, TIMED_EVERY
        write_batch = sink.write_batch

        def send(record: Record) -> None:
            n = counts[0] = counts[0] + 1
            if n <= first or not n % every:
                counts[1] += 1
                counts[2] += record_size(record)
            sink(record)

        def send_batch(records: list[Record]) -> None:
            _count(counts, records)
            write_batch(records)

        return send, send_batch

    def _path_for(self, dataset: str) -> str:
        return self.graph.datasets[dataset].partition_path(self.instance)

    def _build(self) -> None:
        g = self.graph
        for m in self.order:
            node = g.components[m]
            context = Context(m, self.instance, self.degree, self._checkpoint_every, self._batch)
            self.components[m] = self._factory(node, context)
        for req, resp in g.halves.items():
            if req in self.member_set and resp in self.member_set:
                self.components[req].pair(self.components[resp])

        # Inputs of each member: in-set flows become direct calls (buffered when multi-input).
        targets: dict[int, tuple[Emit, EmitBatch]] = {}
        for m in self.order:
            inflows = g.in_flows[m]
            inside = [f for f in inflows if f.source.node in self.member_set]
            for f in inside:
                self.flows[f.index] = FlowCounter()
            deliveries = []
            for f in inside:
                counts = self.flows[f.index].counts
                self.stats[m].inbound.append(counts)
                deliveries.append(self._deliver(m, f.target.port, counts))
            if len(inside) > 1 and len(inside) == len(inflows):
                comp_type = type(self.components[m])
                multi = self._multi[m] = _MultiInput(
                    deliveries, comp_type.compute_batch is not Component.compute_batch
                )
                for i, f in enumerate(inside):
                    targets[f.index] = multi.pushers(i)
            else:
                for f, d in zip(inside, deliveries, strict=True):
                    targets[f.index] = d

        # Outputs of each member: ports -> emitters fanning out over their flows.
        for m in self.order:
            comp = self.components[m]
            by_port: dict[str, list[tuple[Emit, EmitBatch]]] = {
                p: [] for p in g.components[m].outputs
            }
            for f in g.out_flows[m]:
                by_port[f.source.port].append(self._output_of(m, f, targets))
            for port, emits in by_port.items():
                comp.outputs[port] = _fan_out([one for one, _ in emits], _discard)
                comp.batch_outputs[port] = _fan_out([many for _, many in emits], discard_batch)

        # Roots fed by input datasets read them themselves.
        for m in self.order:
            for f in g.in_flows[m]:
                if f.source.node in g.datasets:
                    counter = FlowCounter()
                    self.flows[f.index] = counter
                    _, deliver_batch = self._deliver(
                        m, f.target.port, counter.counts, counted=False
                    )
                    self.stats[m].inbound.append(counter.counts)
                    reader = FileReader(
                        self._path_for(f.source.node),
                        deliver_batch,
                        owner=m,
                        feeds=frozenset({m}),
                        checkpoint_every=self._checkpoint_every,
                        counter=counter.counts,
                        batch=self._batch,
                    )
                    # The reader counts records and exact bytes itself.
                    counter.exact_bytes = lambda c=counter.counts: c[1]  # type: ignore[misc]
                    self._sources.append(reader)

        # Channels from other processes: one root source for all of them.
        if self._channels_in:
            channels = []
            fed = []
            for ch in self._channels_in:
                f = g.flows[ch.flow]
                m = f.target.node
                if m not in self.member_set:
                    raise ValueError(f"channel of flow {f.name} does not feed this set")
                counts = [0, 0, 0]
                self.stats[m].inbound.append(counts)
                _, deliver_batch = self._deliver(m, f.target.port, counts)
                channels.append(
                    Channel(ch.fd, deliver_batch, f"{f.name} (from instance {ch.source_instance})")
                )
                fed.append(m)
            self._sources.append(ChannelInput(channels, owner=fed[0], feeds=frozenset(fed)))

    def _output_of(
        self, member: str, f: Flow, targets: Mapping[int, tuple[Emit, EmitBatch]]
    ) -> tuple[Emit, EmitBatch]:
        g = self.graph
        target = f.target.node
        if target in self.member_set:
            return targets[f.index]
        counter = self.flows[f.index] = FlowCounter()
        if target in g.datasets:
            writer = FileWriter(self._path_for(target))
            self._file_writers[f.index] = writer
            self._sinks[member].append(writer)
            return self._sink(writer, counter.counts)
        fds = self._channels_out.get(f.index)
        if not fds:
            raise ValueError(f"flow {f.name} leaves the set but no channel was given for it")
        counter.crosses = True
        channel: ChannelWriter | PartitionedWriter
        if f.straight:
            if len(fds) != 1:
                raise ValueError(f"straight flow {f.name} needs one channel, got {len(fds)}")
            channel = ChannelWriter(fds[0], batch=self._channel_batch)
        else:
            channel = PartitionedWriter(
                [ChannelWriter(fd, batch=self._channel_batch) for fd in fds], f.partition_key
            )
        self._channel_writers[f.index] = channel
        self._sinks[member].append(channel)
        return self._sink(channel, counter.counts)

    # ------------------------------------------------------------ running

    def run(self) -> ExecutorReport:
        try:
            self._build()
            for m in self.order:
                self._call(m, self.components[m].start)
            for m in self.order:
                comp = self.components[m]
                try:
                    self._sources.extend(comp.sources())
                except ComponentFailure:
                    raise
                except Exception as exc:
                    raise ComponentFailure(m, _describe(exc)) from exc
                if type(comp).flush is not Component.flush:
                    self._flushers.append(comp)
            if self._resume_from is not None:
                self._restore(self._resume_from)
            owners = {id(c): m for m, c in self.components.items()}
            owners.update({id(s): s.owner for s in self._sources})
            self._sampler = CpuSampler(
                owners,
                [*(type(c) for c in self.components.values()), *(type(s) for s in self._sources)],
                self._sample_interval,
            )
            if self._on_ready:
                self._on_ready()
            self._sampler.start()
            self._shutdown_ready()
            self._loop()
        finally:
            if self._sampler:
                self._sampler.stop()
            self._close()
        return self._report()

    def _loop(self) -> None:
        selector = selectors.PollSelector()
        registered: dict[int, Source] = {}
        try:
            while len(self._down) < len(self.order):
                active = [
                    (i, s)
                    for i, s in enumerate(self._sources)
                    if i not in self._done_sources and i not in self._blocked
                ]
                ready = [(i, s) for i, s in active if s.ready]
                if not ready:
                    wanted = {fd: s for _, s in active for fd in s.filenos()}
                    if not wanted:
                        raise ComponentFailure(
                            self.order[0],
                            "the folded set waits for nothing but is not finished: "
                            f"{', '.join(m for m in self.order if m not in self._down)} never shut down",
                        )
                    self._idle()
                    for fd in set(registered) - set(wanted):
                        selector.unregister(fd)
                        del registered[fd]
                    for fd, s in wanted.items():
                        if fd not in registered:
                            selector.register(fd, selectors.EVENT_READ)
                            registered[fd] = s
                    events = selector.select()
                    hit = {id(registered[key.fd]) for key, _ in events}
                    ready = [(i, s) for i, s in active if id(s) in hit]
                for i, s in ready:
                    if i in self._blocked or i in self._done_sources:
                        continue
                    self._serve(i, s)
        finally:
            selector.close()

    def _serve(self, i: int, source: Source) -> None:
        try:
            code = source.compute()
        except ComponentFailure:
            raise
        except Exception as exc:
            raise ComponentFailure(source.owner, _describe(exc)) from exc
        if code is ReturnCode.KEEP_GOING:
            return
        if code is ReturnCode.ERROR:
            raise ComponentFailure(source.owner, source.error or "ERROR")
        if code is ReturnCode.REACHED_EOF:
            self._done_sources.add(i)
            self._maybe_release_blip()
            self._shutdown_ready()
            return
        if code is ReturnCode.GOT_BLIP:
            assert source.blip is not None
            self._blocked[i] = source.blip
            self._maybe_release_blip()
            return
        raise ComponentFailure(source.owner, f"unknown return code {code!r}")

    def _idle(self) -> None:
        """About to wait: send what is buffered for other processes and services."""
        for comp in self._flushers:
            self._call(self._member_of(comp), comp.flush)
        for w in self._channel_writers.values():
            w.flush()

    def _member_of(self, comp: Component) -> str:
        return comp.id

    def _call(self, member: str, fn: Callable[..., Any], *args: Any) -> None:
        """A call outside the record stream (start, shutdown, blip): always timed, errors named."""
        tstack = self._tstack
        tstack.append(0)
        t0 = time.thread_time_ns()
        try:
            fn(*args)
        except ComponentFailure:
            raise
        except Exception as exc:
            raise ComponentFailure(member, _describe(exc)) from exc
        finally:
            dt = time.thread_time_ns() - t0
            nested = tstack.pop()
            self.stats[member].once_ns += dt - nested
            if tstack:
                tstack[-1] += dt

    # ------------------------------------------------------------ shutdown

    def _shutdown_ready(self) -> None:
        """Shut down, in topological order, every member whose upstream is all done."""
        waiting_on: set[str] = set()
        for i, s in enumerate(self._sources):
            if i not in self._done_sources:
                waiting_on |= s.feeds
        for m in self.order:
            if m in self._down or m in waiting_on:
                continue
            if any(u in self.member_set and u not in self._down for u in self.graph.upstream(m)):
                continue
            if m in self._multi:
                self._multi[m].drain()
            self._call(m, self.components[m].shutdown)
            self._down.add(m)
            for sink in self._sinks[m]:
                self._end_sink(sink)

    @staticmethod
    def _end_sink(sink: Any) -> None:
        if isinstance(sink, FileWriter):
            sink.finish()
        else:
            sink.end()

    # ------------------------------------------------------------ blips

    def _maybe_release_blip(self) -> None:
        if not self._blocked:
            return
        waiting = [
            i for i, s in enumerate(self._sources) if s.emits_blips and i not in self._done_sources
        ]
        if all(i in self._blocked for i in waiting):
            blip = next(iter(self._blocked.values()))
            self._blocked.clear()
            self._process_blip(blip)

    def _process_blip(self, blip: Blip) -> None:
        for m in self.order:
            if m in self._down:
                continue
            if m in self._multi:
                self._multi[m].drain()
            self._call(m, self.components[m].process_blip, blip)
        if blip.kind == Blip.CHECKPOINT and self._checkpoints is not None:
            self._save(blip.id)
        for w in self._channel_writers.values():
            if not _ended(w):
                w.blip(blip)

    def _save(self, checkpoint: int) -> None:
        assert self._checkpoints is not None
        state = {
            "checkpoint": checkpoint,
            "members": {m: self.components[m].snapshot() for m in self.order},
            "sources": [s.snapshot() for s in self._sources],
            "done_sources": sorted(self._done_sources),
            "writers": {i: w.snapshot() for i, w in self._file_writers.items()},
            "flows": {i: list(c.counts) for i, c in self.flows.items()},
            "down": sorted(self._down),
        }
        self._checkpoints.save(checkpoint, state)
        self._saved.append(checkpoint)
        if self._on_checkpoint:
            self._on_checkpoint(checkpoint)

    def _restore(self, checkpoint: int) -> None:
        assert self._checkpoints is not None
        try:
            state = self._checkpoints.load(checkpoint)
        except FileNotFoundError as exc:
            raise ComponentFailure(
                self.order[0], f"no checkpoint {checkpoint} of {self.set_id}.{self.instance}"
            ) from exc
        for m in self.order:
            try:
                self.components[m].restore(state["members"][m])
            except Exception as exc:
                raise ComponentFailure(m, f"cannot restore: {_describe(exc)}") from exc
        for s, saved in zip(self._sources, state["sources"], strict=False):
            s.restore(saved)
        self._done_sources = set(state["done_sources"])
        for i, saved in state["writers"].items():
            self._file_writers[i].restore(saved)
        for i, counts in state["flows"].items():
            if i in self.flows:
                self.flows[i].counts[:] = counts
        for m in state["down"]:
            self._down.add(m)
            for sink in self._sinks[m]:
                self._end_sink(sink)

    # ------------------------------------------------------------ the end

    def _close(self) -> None:
        for comp in self.components.values():
            try:
                comp.close()
            except Exception:
                pass
        for s in self._sources:
            try:
                s.close()
            except Exception:
                pass
        for w in self._file_writers.values():
            w.close()
        for cw in self._channel_writers.values():
            cw.close()

    def _report(self) -> ExecutorReport:
        cpu, rss = process_usage()
        sampler = self._sampler
        samples = sampler.samples if sampler else {}
        members = {
            m: {
                "records": self.stats[m].records,
                "calls": self.stats[m].calls,
                "timed_calls": self.stats[m].timing[0],
                "timed_records": self.stats[m].timing[2],
                "timed_ns": self.stats[m].timing[1],
                "once_ns": self.stats[m].once_ns,
                "estimate_ns": self.stats[m].estimate_ns(),
                "samples": samples.get(m, 0),
            }
            for m in self.order
        }
        flows = {
            i: {"records": c.records, "bytes": c.bytes, "crosses": c.crosses}
            for i, c in self.flows.items()
        }
        return ExecutorReport(
            set_id=self.set_id,
            instance=self.instance,
            members=members,
            flows=flows,
            cpu_seconds=cpu,
            peak_rss_mb=rss,
            samples=sum(samples.values()),
            unattributed_samples=sampler.unattributed if sampler else 0,
            channel_bytes=sum(w.bytes for w in self._channel_writers.values()),
            checkpoints=list(self._saved),
        )


def _ended(w: ChannelWriter | PartitionedWriter) -> bool:
    if isinstance(w, ChannelWriter):
        return w.fd < 0
    return all(x.fd < 0 for x in w.writers)


_T = TypeVar("_T")


def _fan_out(
    emits: list[Callable[[_T], None]], nowhere: Callable[[_T], None]
) -> Callable[[_T], None]:
    """Each flow of a port gets the record, or the batch (lent: no member modifies it)."""
    if not emits:
        return nowhere
    if len(emits) == 1:
        return emits[0]
    targets = tuple(emits)

    def fan(item: _T) -> None:
        for t in targets:
            t(item)

    return fan


def _discard(record: Record) -> None:
    pass


def _count(counts: list[int], records: list[Record]) -> None:
    """Count a batch on a flow: [records, sampled records, sampled bytes].

    The sampled records are the flow's records 1 to 100, then every 1000th,
    whether they pass one by one or in batches (and folded or not)."""
    before = counts[0]
    after = counts[0] = before + len(records)
    if before >= TIMED_FIRST and after // TIMED_EVERY == before // TIMED_EVERY:
        return
    picked = list(range(min(len(records), max(0, TIMED_FIRST - before))))
    start = max(before + 1, TIMED_FIRST + 1)
    picked += range(-(-start // TIMED_EVERY) * TIMED_EVERY - before - 1, len(records), TIMED_EVERY)
    for i in picked:
        counts[1] += 1
        counts[2] += record_size(records[i])


def run_set(graph: FlatGraph, members: Sequence[str], **kwargs: Any) -> ExecutorReport:
    """Run one folded set in this process (its flows must stay inside or go to datasets)."""
    return FoldedExecutor(graph, members, **kwargs).run()
