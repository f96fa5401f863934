"""Run a whole graph as OS processes: folded, or one process per component (GF-5, GF-7).

`run_graph` plans the graph (`fold`, or `unfold` for the baseline the seed
contrasts), then per phase starts one worker process per folded-set
instance, joined by buffered channels: an OS pipe per flow and pair of
instances (a straight flow joins instance i to instance i, a repartitioning
flow every instance to every instance), or a spill file when the flow crosses
into a later phase. It collects each worker's report into RunMetrics, and on
an ERROR stops every process and raises GraphRunError naming the component.

Checkpoints: with `checkpoint_every`, every input dataset reader sends a
checkpoint blip each that many records; each set instance saves one file per
blip. A checkpoint is complete when every instance of the phase has saved it;
`resume=True` restarts the run from the latest complete one (and skips
finished phases).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import selectors
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from lightpath.graph.executor import CheckpointStore, ExecutorReport
from lightpath.graph.expand import FlatGraph, expand
from lightpath.graph.fold import FoldedSet, GraphPlan, fold, unfold
from lightpath.graph.metrics import RunMetrics, aggregate
from lightpath.graph.spec import GraphSpec, to_proto

PIPE_SIZE = 1 << 20


class GraphRunCancelled(Exception):
    """`cancel` was set: every worker process was killed."""


class GraphRunError(Exception):
    """A component answered ERROR (or its process died): the run stopped."""

    def __init__(self, component: str, message: str, *, process: str = "", log: str = ""):
        where = f"{component}: " if component else ""
        super().__init__(f"{where}{message}")
        self.component = component
        self.message = message
        self.process = process
        self.log = log


@dataclass
class RunResult:
    graph: FlatGraph
    plan: GraphPlan
    metrics: RunMetrics
    reports: list[ExecutorReport]
    run_dir: Path
    resumed_from: dict[int, int] = field(default_factory=dict)  # phase -> checkpoint

    @property
    def processes(self) -> int:
        return self.plan.processes_after


@dataclass
class _Worker:
    fset: FoldedSet
    instance: int
    job: dict[str, Any]
    fds: list[int] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    control: IO[str] | None = None
    buffer: str = ""
    ready_at: float | None = None
    report: ExecutorReport | None = None
    error: tuple[str, str] | None = None
    checkpoints: list[int] = field(default_factory=list)
    log_path: Path | None = None

    @property
    def name(self) -> str:
        return f"{self.fset.id}.{self.instance}"


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)  # type: ignore[attr-defined]
    return r, w


def run_graph(
    spec: GraphSpec,
    *,
    folded: bool = True,
    run_dir: str | Path | None = None,
    run_id: str = "",
    checkpoint_every: int = 0,
    resume: bool = False,
    sample_interval: float = 0.005,
    channel_batch: int = 1024,
    python: str = sys.executable,
    keep_checkpoints: bool = False,
    cancel: threading.Event | None = None,
    env: Mapping[str, str] | None = None,
) -> RunResult:
    """Plan and run `spec` to completion; RunMetrics per component and flow (GF-5, GF-6).

    `cancel`: set from another thread, it kills every worker and raises
    GraphRunCancelled. `env`: the workers' environment (default: this
    process's), to which PYTHONPATH is added."""
    graph = expand(spec)
    plan = fold(graph) if folded else unfold(graph)
    run_id = run_id or uuid.uuid4().hex[:12]
    base = Path(run_dir) if run_dir else Path.cwd() / ".lightpath" / "graph-runs" / run_id
    if not resume and base.exists():
        for sub in ("checkpoints", "spill", "logs", "jobs"):
            shutil.rmtree(base / sub, ignore_errors=True)
        for marker in base.glob("phase-*.done"):
            marker.unlink()
    for sub in ("checkpoints", "spill", "logs", "jobs"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    spec_path = base / "spec.pb"
    spec_path.write_bytes(to_proto(spec).SerializeToString())

    reports: list[ExecutorReport] = []
    resumed: dict[int, int] = {}
    wall = startup = 0.0
    for phase in plan.phases:
        if cancel is not None and cancel.is_set():
            raise GraphRunCancelled(f"cancelled before phase {phase}")
        marker = base / f"phase-{phase}.done"
        if resume and marker.exists():
            reports.extend(
                ExecutorReport.from_dict(d) for d in json.loads(marker.read_text())["reports"]
            )
            continue
        sets = [s for s in plan.folded_sets if s.phase == phase]
        resume_from = _complete_checkpoint(base / "checkpoints", sets) if resume else None
        if resume_from is not None:
            resumed[phase] = resume_from
        phase_reports, phase_wall, phase_startup = _run_phase(
            graph,
            plan,
            sets,
            base=base,
            spec_path=spec_path,
            checkpoint_every=checkpoint_every,
            resume_from=resume_from,
            sample_interval=sample_interval,
            channel_batch=channel_batch,
            python=python,
            cancel=cancel,
            env=env,
        )
        marker.write_text(json.dumps({"reports": [r.to_dict() for r in phase_reports]}))
        reports.extend(phase_reports)
        wall += phase_wall
        startup += phase_startup
    if not keep_checkpoints:
        shutil.rmtree(base / "checkpoints", ignore_errors=True)
    metrics = aggregate(
        graph,
        plan,
        reports,
        run_id=run_id,
        folded=folded,
        wall_seconds=wall,
        startup_seconds=startup,
    )
    return RunResult(graph, plan, metrics, reports, base, resumed)


def _complete_checkpoint(directory: Path, sets: list[FoldedSet]) -> int | None:
    """The latest checkpoint every instance of these sets saved."""
    common: set[int] | None = None
    for s in sets:
        for i in range(s.degree):
            saved = set(CheckpointStore(directory, s.id, i).saved())
            common = saved if common is None else common & saved
    return max(common) if common else None


def _run_phase(
    graph: FlatGraph,
    plan: GraphPlan,
    sets: list[FoldedSet],
    *,
    base: Path,
    spec_path: Path,
    checkpoint_every: int,
    resume_from: int | None,
    sample_interval: float,
    channel_batch: int,
    python: str,
    cancel: threading.Event | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[list[ExecutorReport], float, float]:
    phase = sets[0].phase
    workers: dict[tuple[str, int], _Worker] = {}
    for s in sets:
        for i in range(s.degree):
            workers[(s.id, i)] = _Worker(
                s,
                i,
                {
                    "spec": str(spec_path),
                    "set_id": s.id,
                    "members": list(s.members),
                    "instance": i,
                    "degree": s.degree,
                    "channels_in": [],
                    "spill_in": [],
                    "channels_out": {},
                    "spill_out": {},
                    "checkpoint_dir": str(base / "checkpoints"),
                    "checkpoint_every": checkpoint_every,
                    "resume_from": resume_from,
                    "sample_interval": sample_interval,
                    "channel_batch": channel_batch,
                },
            )
    parent_fds: list[int] = []
    try:
        for f in graph.flows:
            s_node, t_node = f.source.node, f.target.node
            if s_node not in graph.components or t_node not in graph.components:
                continue
            src, dst = plan.set_of(s_node), plan.set_of(t_node)
            if src.id == dst.id or phase not in (src.phase, dst.phase):
                continue
            pairs = (
                [(i, i) for i in range(src.degree)]
                if f.straight
                else [(i, j) for i in range(src.degree) for j in range(dst.degree)]
            )
            for i, j in pairs:
                if src.phase == dst.phase:
                    read_end, write_end = _pipe()
                    parent_fds += [read_end, write_end]
                    producer, consumer = workers[(src.id, i)], workers[(dst.id, j)]
                    producer.job["channels_out"].setdefault(str(f.index), []).append(write_end)
                    producer.fds.append(write_end)
                    consumer.job["channels_in"].append([f.index, read_end, i])
                    consumer.fds.append(read_end)
                else:
                    path = str(base / "spill" / f"flow-{f.index}.{i}.{j}")
                    if src.phase == phase:
                        workers[(src.id, i)].job["spill_out"].setdefault(str(f.index), []).append(
                            path
                        )
                    else:
                        workers[(dst.id, j)].job["spill_in"].append([f.index, path, i])
        started = time.perf_counter()
        worker_env = dict(os.environ if env is None else env)
        worker_env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        for w in workers.values():
            r, wfd = os.pipe()
            parent_fds.append(r)
            w.job["control_fd"] = wfd
            job_path = base / "jobs" / f"{w.name}.json"
            job_path.write_text(json.dumps(w.job))
            w.log_path = base / "logs" / f"{w.name}.log"
            with open(w.log_path, "wb") as log:
                w.proc = subprocess.Popen(
                    [python, "-m", "lightpath.graph.worker", str(job_path)],
                    pass_fds=[*w.fds, wfd],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=worker_env,
                )
            os.close(wfd)
            w.control = os.fdopen(r, "r")
            parent_fds.remove(r)
        # The children hold the channel ends now; the parent's copies would keep pipes open.
        for fd in parent_fds:
            os.close(fd)
        parent_fds = []
        _watch(
            workers,
            on_complete=lambda k: _drop_checkpoints_before(base, sets, k),
            cancel=cancel,
        )
    finally:
        for fd in parent_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        for w in workers.values():
            if w.proc is not None and w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
            if w.control is not None:
                w.control.close()
    wall = time.perf_counter() - started
    ready = [w.ready_at for w in workers.values() if w.ready_at is not None]
    startup = (max(ready) - started) if ready else 0.0
    return [w.report for w in workers.values() if w.report is not None], wall, startup


def _drop_checkpoints_before(base: Path, sets: list[FoldedSet], complete: int) -> None:
    """Checkpoint `complete` is saved by every instance: older ones are no longer needed."""
    for s in sets:
        for i in range(s.degree):
            store = CheckpointStore(base / "checkpoints", s.id, i)
            for k in store.saved():
                if k < complete:
                    store.path(k).unlink(missing_ok=True)


CANCEL_POLL_S = 0.1


def _watch(
    workers: dict[tuple[str, int], _Worker],
    on_complete: Callable[[int], None] = lambda k: None,
    cancel: threading.Event | None = None,
) -> None:
    """Read every worker's control lines until all exit; on an error stop them all.

    `on_complete(k)` runs once every worker has reported checkpoint k; `cancel`,
    once set, stops them all (GraphRunCancelled).
    """
    saved: dict[int, int] = {}
    sel = selectors.DefaultSelector()
    for w in workers.values():
        assert w.control is not None
        os.set_blocking(w.control.fileno(), False)
        sel.register(w.control.fileno(), selectors.EVENT_READ, w)
    open_ = len(workers)
    failure: _Worker | None = None
    deadline: float | None = None
    try:
        while open_ and (failure is None or _secondary(failure)):
            if failure is not None and deadline is None:
                # A broken channel is a consequence; give the cause a moment to report.
                deadline = time.perf_counter() + SECONDARY_GRACE_S
            timeout = None if deadline is None else max(0.0, deadline - time.perf_counter())
            if cancel is not None:
                if cancel.is_set():
                    break
                timeout = CANCEL_POLL_S if timeout is None else min(timeout, CANCEL_POLL_S)
            events = sel.select(timeout)
            if not events and cancel is not None and deadline is None:
                continue
            if not events and deadline is not None:
                break
            for key, _ in events:
                w = key.data
                assert w.control is not None
                chunk = os.read(w.control.fileno(), 1 << 16)
                if not chunk:
                    sel.unregister(key.fd)
                    open_ -= 1
                    if w.report is None and w.error is None:
                        assert w.proc is not None
                        code = w.proc.wait()
                        w.error = (
                            "",
                            f"process {w.name} exited with status {code} without a report",
                        )
                        failure = _first_cause(failure, w)
                    continue
                w.buffer += chunk.decode()
                *lines, w.buffer = w.buffer.split("\n")
                for line in lines:
                    event = json.loads(line)
                    kind = event["event"]
                    if kind == "ready":
                        w.ready_at = time.perf_counter()
                    elif kind == "checkpoint":
                        w.checkpoints.append(event["id"])
                        saved[event["id"]] = saved.get(event["id"], 0) + 1
                        if saved[event["id"]] == len(workers):
                            on_complete(event["id"])
                    elif kind == "done":
                        w.report = ExecutorReport.from_dict(event["report"])
                    elif kind == "error":
                        w.error = (event["component"], event["message"])
                        failure = _first_cause(failure, w)
    finally:
        sel.close()
    if cancel is not None and cancel.is_set():
        for w in workers.values():
            if w.proc is not None and w.proc.poll() is None:
                w.proc.kill()
        for w in workers.values():
            if w.proc is not None:
                w.proc.wait()
        raise GraphRunCancelled("cancelled")
    if failure is not None:
        for w in workers.values():
            if w.proc is not None and w.proc.poll() is None:
                w.proc.kill()
        for w in workers.values():
            if w.proc is not None:
                w.proc.wait()
        assert failure.error is not None
        component, message = failure.error
        log = failure.log_path.read_text(errors="replace")[-4000:] if failure.log_path else ""
        raise GraphRunError(component, message, process=failure.name, log=log)
    for w in workers.values():
        assert w.proc is not None
        code = w.proc.wait()
        if code != 0:
            raise GraphRunError("", f"process {w.name} exited with status {code}", process=w.name)


SECONDARY_GRACE_S = 5.0
_CONSEQUENCES = ("BrokenPipeError", "closed before its end")


def _secondary(w: _Worker) -> bool:
    """An error that another process's failure causes (its channel broke)."""
    return w.error is not None and any(s in w.error[1] for s in _CONSEQUENCES)


def _first_cause(current: _Worker | None, new: _Worker) -> _Worker:
    if current is None or (_secondary(current) and not _secondary(new)):
        return new
    return current
