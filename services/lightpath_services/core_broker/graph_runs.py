"""Graph runs on the broker's host: RunGraph, GetGraphRun, CancelGraphRun (GF-5, GF-6).

A client that is not Python (or does not want to host the processes) runs a
reserved graph here: the broker checks that every process of the plan holds
its reservation, then `lightpath.graph.runner.run_graph` — the SDK's own
runtime — starts one worker process per folded-set instance in a thread of
the broker, and the run's metrics go where ReportGraphMetrics puts them.

What may run here (decided before anything starts, `confine`):

* only the component library's kinds without outside access — no user code
  (`"module:Class"`), no `interface` (an external program), no `kv_lookup`
  (a connection to any Redis) — unless the operator set
  LIGHTPATH_CB_GRAPH_CODE=any: a caller's code would otherwise run with the
  broker's privileges;
* every file inside the broker's graph data directory
  (LIGHTPATH_CB_GRAPH_DATA_DIR): a relative path is taken there, an absolute
  one must resolve inside it — with `{part}` filled in as each number it will be,
  through any symbolic links — and the workers check each again as they open it
  (lightpath.graph.confine), so a link that leads out is refused whenever it was
  made; errors name paths relative to the directory;
* workers get a bare environment (PATH, locale, TMPDIR, HOME): none of the
  broker's credentials, Redis URL or settings.

Runs are kept in Redis, so any replica answers for them:

    lp:{broker}:graph-run:<run>   HASH  app, graph, reservation, digest, state,
                                        plan (JSON), failed_component, failure,
                                        started, finished, beat (ms), cancel

The replica running a run writes `beat` every HEARTBEAT_S and reads `cancel`
(set by whichever replica answered CancelGraphRun); a RUNNING run whose beat
is older than ORPHAN_S lost its broker and reads as FAILED.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from google.protobuf import json_format

from lightpath.errors import (
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    ResourceExhausted,
)
from lightpath.graph import confine as graph_confine
from lightpath.graph.fold import GraphPlan, plan_to_proto
from lightpath.graph.kinds import GRAPH_KIND, LIBRARY
from lightpath.graph.metrics import to_proto as metrics_to_proto
from lightpath.graph.runner import GraphRunCancelled, GraphRunError, run_graph
from lightpath.graph.spec import from_proto
from lightpath.v1 import core_broker_pb2 as pb
from lightpath.v1 import graph_pb2
from lightpath_services.common.keys import broker_key
from lightpath_services.common.txn import Program, Txn

log = logging.getLogger("lightpath.core_broker.graph_runs")

HEARTBEAT_S = 1.0
ORPHAN_S = 10.0
FINISHED_TTL_S = 7 * 24 * 3600
# A run's record: created once, finished once (txn.lua's generic checks and ops).
PROGRAM = Program("lightpath_services.core_broker", [], {})
# Library kinds that touch nothing but their records and the data directory's files.
CONTAINED_KINDS = frozenset(LIBRARY) - {"interface", "kv_lookup"}
FILE_KINDS = ("file_input", "file_output")
WORKER_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "HOME")

STATES = {
    "running": pb.GRAPH_RUN_STATE_RUNNING,
    "succeeded": pb.GRAPH_RUN_STATE_SUCCEEDED,
    "failed": pb.GRAPH_RUN_STATE_FAILED,
    "cancelled": pb.GRAPH_RUN_STATE_CANCELLED,
}


# -- what may run (pure) -----------------------------------------------------------------


PART = "{part}"


def _inside(raw: str, data_dir: Path, field: str, bad: list[FieldViolation], parts: int = 1) -> str:
    """`raw` absolute inside `data_dir`, checked with every substitution the run will
    make (`{part}` as each of 0..parts-1), each resolved through any symbolic links;
    a violation naming the path relative to the data directory otherwise."""
    if not raw:
        return raw
    root = data_dir.resolve()
    try:
        path = Path(raw) if os.path.isabs(raw) else root / raw
        for concrete in _filled(str(path), parts):
            resolved = Path(os.path.realpath(concrete))
            if not resolved.is_relative_to(root):
                shown = graph_confine.shown(concrete, str(root))
                bad.append(
                    FieldViolation(
                        field,
                        f"{shown!r} leads outside the broker's graph data directory (a "
                        "symbolic link, `..` or an absolute path elsewhere); use a path "
                        "inside it (a relative path is taken there)",
                    )
                )
                return raw
    except (ValueError, OSError, RuntimeError) as exc:  # a NUL byte, a loop, too long
        bad.append(FieldViolation(field, f"is not a usable path ({type(exc).__name__})"))
        return raw
    # The workers resolve each path again when they open it (lightpath.graph.confine),
    # with `{part}` filled in, so a link made since this check is caught too.
    return _resolved_template(str(path))


def _resolved_template(path: str) -> str:
    """`path` with its links resolved up to the directory that holds the first `{part}`;
    from there on as given, for the worker to resolve once `{part}` is filled in. Not
    os.path.normpath: it takes `..` after a link textually, so `in-file/../x{part}` (a
    link to `real/f`) would become `x{part}`, another file than the one checked
    (`real/x{part}`), or one outside."""
    if PART not in path:
        return os.path.realpath(path)
    head, _, rest = path[: path.index(PART)].rpartition(os.sep)
    return os.path.realpath(head or os.sep) + os.sep + rest + path[path.index(PART) :]


def _filled(template: str, parts: int) -> list[str]:
    if PART not in template:
        return [template]
    return [template.replace(PART, str(i)) for i in range(max(parts, 1))]


def confine(
    spec: graph_pb2.GraphSpec, data_dir: Path, *, any_code: bool = False, parts: int = 1
) -> graph_pb2.GraphSpec:
    """A copy of `spec` with every file path absolute inside `data_dir`; raises
    InvalidArgument naming each path outside it and, unless `any_code`, each
    component of a kind that could reach beyond it. `parts`: the most instances any
    component runs as (the plan's largest degree), so `{part}` in a component's path
    is checked as each number it will be; a dataset's as each of its partitions."""
    out = graph_pb2.GraphSpec()
    out.CopyFrom(spec)
    bad: list[FieldViolation] = []

    def walk(g: graph_pb2.GraphSpec, prefix: str) -> None:
        for i, d in enumerate(g.datasets):
            d.path = _inside(
                d.path, data_dir, f"{prefix}.datasets[{i}].path", bad, max(d.partitions, parts)
            )
        for i, c in enumerate(g.components):
            where = f"{prefix}.components[{i}]"
            if c.kind == GRAPH_KIND:
                walk(c.subgraph.graph, f"{where}.subgraph.graph")
                continue
            if not any_code and c.kind not in CONTAINED_KINDS:
                bad.append(
                    FieldViolation(
                        f"{where}.kind",
                        f"{c.kind!r} does not run on the broker: only the component "
                        f"library's {', '.join(sorted(CONTAINED_KINDS))} do (user code, "
                        "interface and kv_lookup reach outside the data directory); run "
                        "such a graph with the SDK's run_graph",
                    )
                )
            if c.kind in FILE_KINDS and "path" in c.params:
                c.params["path"] = _inside(
                    c.params["path"], data_dir, f"{where}.params.path", bad, parts
                )

    walk(out, "graph")
    if bad:
        raise InvalidArgument.of(bad, reason="NOT_RUNNABLE_HERE")
    return out


def process_reservation_ids(reservation_id: str, plan: GraphPlan) -> list[str]:
    """ReserveGraph's name of each process's reservation, in the plan's order."""
    return [f"{reservation_id}.{s.id}.{i}" for s in plan.folded_sets for i in range(s.degree)]


def holds_now(record: dict[str, Any], now_ms: int) -> str:
    """ "" when the reservation holds its cores at `now_ms`; else why not."""
    state = record.get("state", "")
    if state in ("RELEASED", "REJECTED", "ENDED"):
        return f"is {state.lower()}"
    parts = [p for p in record.get("parts") or [] if isinstance(p, dict) and not p.get("cancelled")]
    if not parts:
        return "holds no cores"
    start = min(int(p["start"]) for p in parts)
    end = max(int(p["end"]) for p in parts)
    if now_ms < start:
        return f"holds its cores from {time.strftime('%H:%M:%S', time.gmtime(start / 1000))} UTC on"
    if now_ms >= end:
        return "has ended"
    return ""


def request_digest(request: pb.RunGraphRequest) -> str:
    return hashlib.sha256(request.SerializeToString(deterministic=True)).hexdigest()


def worker_env(data_dir: Path) -> dict[str, str]:
    """The workers' environment: enough to run Python, nothing of the broker's, and
    the data directory every file they open must resolve inside."""
    env = {k: os.environ[k] for k in WORKER_ENV if k in os.environ}
    env[graph_confine.ROOT_ENV] = str(data_dir.resolve())
    return env


# -- records ---------------------------------------------------------------------------------


@dataclass
class RunRecord:
    run_id: str
    app: str
    graph_id: str
    reservation_id: str
    digest: str
    state: str
    plan: graph_pb2.GraphPlan
    failed_component: str = ""
    failure: str = ""
    started_ms: int = 0
    finished_ms: int = 0
    beat_ms: int = 0
    cancel: str = ""


class GraphRunStore:
    def __init__(self, redis: aioredis.Redis):
        self._r = redis
        self._script = PROGRAM.bind(redis)

    @staticmethod
    def key(run_id: str) -> str:
        return broker_key("graph-run", run_id)

    async def create(self, rec: RunRecord) -> bool:
        """Store a new RUNNING run; False when the id is taken."""
        fields: dict[str, str | int] = {
            "app": rec.app,
            "graph": rec.graph_id,
            "reservation": rec.reservation_id,
            "digest": rec.digest,
            "state": rec.state,
            "plan": json_format.MessageToJson(rec.plan, indent=None),
            "started": rec.started_ms,
            "beat": rec.started_ms,
        }
        t = Txn()
        t.expect_no_key(self.key(rec.run_id), reason="EXISTS")
        t.hset(self.key(rec.run_id), fields)
        return await self._script.applies(t)

    async def get(self, run_id: str) -> RunRecord | None:
        row: dict[Any, Any] = await self._r.hgetall(self.key(run_id))
        if not row or "state" not in row:
            return None
        return RunRecord(
            run_id=run_id,
            app=row["app"],
            graph_id=row["graph"],
            reservation_id=row["reservation"],
            digest=row["digest"],
            state=row["state"],
            plan=json_format.Parse(row["plan"], graph_pb2.GraphPlan()),
            failed_component=row.get("failed_component", ""),
            failure=row.get("failure", ""),
            started_ms=int(row.get("started") or 0),
            finished_ms=int(row.get("finished") or 0),
            beat_ms=int(row.get("beat") or 0),
            cancel=row.get("cancel", ""),
        )

    async def beat(self, run_id: str, now_ms: int) -> str:
        """Record that the run is alive; who asked to cancel it ("" for nobody)."""
        async with self._r.pipeline(transaction=False) as p:
            p.hset(self.key(run_id), "beat", now_ms)
            p.hget(self.key(run_id), "cancel")
            _, cancel = await p.execute()
        return cancel or ""

    async def request_cancel(self, run_id: str, who: str) -> None:
        await self._r.hsetnx(self.key(run_id), "cancel", who)

    async def finish(
        self, run_id: str, state: str, now_ms: int, component: str = "", failure: str = ""
    ) -> bool:
        """RUNNING → state, once."""
        key = self.key(run_id)
        t = Txn()
        t.expect(key, "state", ["running"], reason="FINISHED")
        fields = {"state": state, "failed_component": component, "failure": failure}
        t.hset(key, {**fields, "finished": now_ms})
        t.expire(key, FINISHED_TTL_S)
        return await self._script.applies(t)


# -- running -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunnerConfig:
    data_dir: Path
    run_dir: Path
    max_runs: int = 2
    any_code: bool = False


class GraphRunner:
    """The runs of this broker process: each a thread running `run_graph`, and a task
    that keeps its record's heartbeat and forwards a cancel to it."""

    def __init__(
        self,
        store: GraphRunStore,
        config: RunnerConfig,
        *,
        spawn: Callable[[Awaitable[None], str], object],
        save_metrics: Callable[[str, graph_pb2.GraphRunMetrics], Awaitable[None]],
        now_ms: Callable[[], int],
    ):
        self.store = store
        self.config = config
        self._spawn = spawn
        self._save_metrics = save_metrics
        self._now_ms = now_ms
        self._cancels: dict[str, threading.Event] = {}

    @property
    def active(self) -> int:
        return len(self._cancels)

    def check_capacity(self) -> None:
        if self.active >= self.config.max_runs:
            raise ResourceExhausted(
                f"this broker runs {self.active} graphs already (at most "
                f"{self.config.max_runs}); try again when one has ended",
                retry_delay_s=5.0,
                reason="GRAPH_RUNS_BUSY",
            )

    def start(
        self,
        rec: RunRecord,
        spec: graph_pb2.GraphSpec,
        *,
        unfolded: bool,
        checkpoint_every: int,
        still_held: Callable[[], Awaitable[str]],
    ) -> None:
        """Run it in the background; `still_held()` says why the run may not go on
        ("" while every process's reservation holds its cores), asked every beat."""
        cancel = self._cancels[rec.run_id] = threading.Event()
        self._spawn(
            self._run(rec, spec, unfolded, checkpoint_every, cancel, still_held),
            f"graph run {rec.run_id}",
        )

    def _relative(self, text: str) -> str:
        """`text` with the broker's own directories left out: paths relative to them."""
        for directory in {self.config.data_dir.resolve(), self.config.data_dir}:
            text = text.replace(f"{directory}{os.sep}", "").replace(str(directory), ".")
        run_dir = self.config.run_dir
        return text.replace(f"{run_dir}{os.sep}", "").replace(str(run_dir), "<runs>")

    def cancel_here(self, run_id: str) -> bool:
        event = self._cancels.get(run_id)
        if event is None:
            return False
        event.set()
        return True

    async def _run(
        self,
        rec: RunRecord,
        spec: graph_pb2.GraphSpec,
        unfolded: bool,
        checkpoint_every: int,
        cancel: threading.Event,
        still_held: Callable[[], Awaitable[str]],
    ) -> None:
        run_id = rec.run_id
        stopped = ""  # why the broker stopped it (its reservation no longer held)
        graph = from_proto(spec)
        work = asyncio.ensure_future(
            asyncio.to_thread(
                run_graph,
                graph,
                folded=not unfolded,
                run_dir=self.config.run_dir / run_id,
                run_id=run_id,
                checkpoint_every=checkpoint_every,
                cancel=cancel,
                env=worker_env(self.config.data_dir),
            )
        )
        # What the record says if this task is cancelled mid-run (the broker stopping).
        state, component, failure = "failed", "", "the broker stopped while it ran; run it again"
        try:
            while True:
                done, _ = await asyncio.wait({work}, timeout=HEARTBEAT_S)
                if done:
                    break
                with contextlib.suppress(Exception):  # Redis away: the run goes on
                    who = await self.store.beat(run_id, self._now_ms())
                    if who:
                        cancel.set()
                    elif not stopped and (stopped := await still_held()):
                        cancel.set()
            try:
                result = work.result()
            except GraphRunCancelled:
                if stopped:
                    failure = f"stopped by the broker: {stopped}"
                else:
                    who = (await self.store.get(run_id) or rec).cancel or "the broker"
                    state, failure = "cancelled", f"cancelled by {who}"
            except GraphRunError as exc:
                component, failure = exc.component, self._relative(exc.message)
                if exc.process:
                    failure += (
                        f" (process {exc.process}; its log is in {run_id}/logs under the "
                        "broker's graph run directory)"
                    )
            except Exception as exc:
                log.exception("graph run %s crashed", run_id)
                failure = self._relative(f"the run could not go on: {exc}")
            else:
                state, failure = "succeeded", ""
                try:
                    await self._save_metrics(rec.app, metrics_to_proto(result.metrics))
                except Exception as exc:  # the run itself succeeded
                    log.warning("graph run %s: its metrics were not kept: %s", run_id, exc)
                    failure = f"it ran, but its metrics were not kept: {exc}"
        finally:
            self._cancels.pop(run_id, None)
            if not work.done():
                cancel.set()
                with contextlib.suppress(BaseException):
                    await asyncio.shield(work)
            try:
                await self.store.finish(run_id, state, self._now_ms(), component, failure)
            except Exception:  # Redis away: the run reads FAILED once its heartbeat is old
                log.exception("graph run %s: could not record its end (%s)", run_id, state)
            log.info(
                "graph run %s of %s %s%s",
                run_id,
                rec.graph_id,
                state,
                f": {failure}" if failure else "",
                extra={"run_id": run_id, "graph_id": rec.graph_id, "application_id": rec.app},
            )


async def settle(store: GraphRunStore, rec: RunRecord, now_ms: int) -> RunRecord:
    """A RUNNING run whose broker stopped beating for ORPHAN_S reads as FAILED."""
    if rec.state == "running" and now_ms - rec.beat_ms > ORPHAN_S * 1000:
        failure = "the broker running it stopped (no heartbeat); run it again"
        if await store.finish(rec.run_id, "failed", now_ms, "", failure):
            rec.state, rec.failure, rec.finished_ms = "failed", failure, now_ms
        else:
            return await store.get(rec.run_id) or rec
    return rec


def run_out(rec: RunRecord, metrics: graph_pb2.GraphRunMetrics | None) -> pb.GraphRun:
    from lightpath_services.core_broker.convert import timestamp

    out = pb.GraphRun(
        run_id=rec.run_id,
        graph_id=rec.graph_id,
        state=STATES[rec.state],  # type: ignore[arg-type]
        application_id=rec.app,
        reservation_id=rec.reservation_id,
        plan=rec.plan,
        failed_component=rec.failed_component,
        failure=rec.failure,
        started_at=timestamp(rec.started_ms),
    )
    if rec.finished_ms:
        out.finished_at.CopyFrom(timestamp(rec.finished_ms))
    if metrics is not None:
        out.metrics.CopyFrom(metrics)
    return out


def new_record(request: pb.RunGraphRequest, app: str, plan: GraphPlan, now_ms: int) -> RunRecord:
    return RunRecord(
        run_id=request.run_id,
        app=app,
        graph_id=plan.graph_id,
        reservation_id=request.reservation_id,
        digest=request_digest(request),
        state="running",
        plan=plan_to_proto(plan),
        started_ms=now_ms,
        beat_ms=now_ms,
    )


def same_request(rec: RunRecord, request: pb.RunGraphRequest, app: str) -> None:
    """A run id names one request of one application."""
    if rec.app != app or rec.digest != request_digest(request):
        raise FailedPrecondition(
            f"graph run {rec.run_id}",
            "exists with another request; choose a new run_id",
            reason="RUN_EXISTS",
        )
