"""Graph plans on the core broker (GF-1 … GF-7, seed 004).

- PlanGraph: `lightpath.graph` expands, validates and folds the graph (the
  same pure function the SDK runs locally).
- ReserveGraph (GF-4): one ReservationRequest per process of the plan (each
  instance of each folded set), named "<id>.<set>.<instance>", decided as one
  all-or-nothing group through the broker's own reservation path
  (`Broker.reserve`: batching, priorities, the Lua commit that never
  over-commits a device); with `allow_partial`, each on its own.
- ReportGraphMetrics / GetGraphMetrics (GF-6): per-component usage of each
  run, kept per graph in Redis:

      lp:{broker}:graph:<graph>:owner       STRING  the application that reports it
      lp:{broker}:graph:<graph>:runs        ZSET    run id scored by report time (ms)
      lp:{broker}:graph:<graph>:run:<run>   HASH    app, at, metrics (GraphRunMetrics as JSON)

  One Lua script claims the graph for the first reporter and stores the run,
  dropping the oldest beyond the runs kept.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from google.protobuf import json_format

from lightpath.errors import (
    Aborted,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from lightpath.graph.expand import expand
from lightpath.graph.fold import FoldedSet, GraphPlan, fold, plan_to_proto, unfold
from lightpath.graph.spec import from_proto
from lightpath.v1 import core_broker_pb2 as pb
from lightpath.v1 import graph_pb2
from lightpath_services.common.keys import ID_RULE, broker_key, is_valid_id
from lightpath_services.common.txn import Conflict, Program, Txn

GRAPH_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}\Z")
GRAPH_ID_RULE = "must be 1-64 characters of A-Z a-z 0-9 . _ -"
MAX_COMPONENTS_REPORTED = 10_000


def _under(exc: InvalidArgument, prefix: str) -> InvalidArgument:
    return InvalidArgument.of(
        [FieldViolation(f"{prefix}.{v.field}", v.rule) for v in exc.violations], reason=exc.reason
    )


def plan_graph(spec: graph_pb2.GraphSpec, *, unfolded: bool = False) -> GraphPlan:
    """Process 400 on a GraphSpec from a request; errors name fields under `graph.`."""
    try:
        graph = expand(from_proto(spec))
        return unfold(graph) if unfolded else fold(graph)
    except InvalidArgument as exc:
        raise _under(exc, "graph") from None


@dataclass(frozen=True)
class ProcessRequest:
    folded_set: FoldedSet
    instance: int
    request: pb.ReservationRequest


def process_requests(plan: GraphPlan, per_process: pb.ReservationRequest) -> list[ProcessRequest]:
    """One reservation request per process of `plan` (GF-4), from the per-process template."""
    base = per_process.reservation_id
    if not is_valid_id(base):
        raise InvalidArgument("per_process.reservation_id", ID_RULE)
    out = []
    for s in plan.folded_sets:
        for i in range(s.processes):
            rid = f"{base}.{s.id}.{i}"
            if not is_valid_id(rid):
                room = 64 - (len(rid) - len(base))
                raise InvalidArgument(
                    "per_process.reservation_id",
                    f'must leave room for ".{s.id}.{i}" (at most {room} characters here)',
                )
            m = pb.ReservationRequest()
            m.CopyFrom(per_process)
            m.reservation_id = rid
            out.append(ProcessRequest(s, i, m))
    return out


def graph_reservation(
    reservation_id: str,
    plan: GraphPlan,
    processes: Sequence[ProcessRequest],
    reservations: Sequence[pb.Reservation],
) -> pb.GraphReservation:
    return pb.GraphReservation(
        reservation_id=reservation_id,
        plan=plan_to_proto(plan),
        processes=[
            pb.ProcessReservation(
                folded_set=p.folded_set.id,
                instance=p.instance,
                members=list(p.folded_set.members),
                reservation=r,
            )
            for p, r in zip(processes, reservations, strict=True)
        ],
        complete=all(r.outcome != pb.OUTCOME_REJECTED for r in reservations),
    )


def check_metrics(m: graph_pb2.GraphRunMetrics) -> None:
    """What a report must hold (X-3): ids, and times that are finite and not negative."""
    bad: list[FieldViolation] = []
    if not GRAPH_ID.match(m.graph_id):
        bad.append(FieldViolation("metrics.graph_id", GRAPH_ID_RULE))
    if not is_valid_id(m.run_id):
        bad.append(FieldViolation("metrics.run_id", ID_RULE))
    if len(m.components) > MAX_COMPONENTS_REPORTED:
        bad.append(
            FieldViolation("metrics.components", f"at most {MAX_COMPONENTS_REPORTED} components")
        )
    seen: set[str] = set()
    for i, c in enumerate(m.components):
        if not c.component:
            bad.append(FieldViolation(f"metrics.components[{i}].component", "must not be empty"))
        elif c.component in seen:
            bad.append(FieldViolation(f"metrics.components[{i}].component", "is reported twice"))
        seen.add(c.component)
        for name in ("cpu_seconds", "cpu_seconds_sampled", "cpu_seconds_timed"):
            value = getattr(c, name)
            if not math.isfinite(value) or value < 0:
                bad.append(
                    FieldViolation(f"metrics.components[{i}].{name}", "must be a finite, >= 0")
                )
    for name in ("wall_seconds", "startup_seconds"):
        value = getattr(m, name)
        if not math.isfinite(value) or value < 0:
            bad.append(FieldViolation(f"metrics.{name}", "must be a finite, >= 0"))
    if bad:
        raise InvalidArgument.of(bad)


def only_components(
    m: graph_pb2.GraphRunMetrics, components: Sequence[str]
) -> graph_pb2.GraphRunMetrics:
    """The run's metrics of `components`, with the flows into and out of them."""
    if not components:
        return m
    have = {c.component for c in m.components}
    for i, c in enumerate(components):
        if c not in have:
            raise NotFound("component", c, hint=f"components[{i}]: no metrics in run {m.run_id}")
    wanted = set(components)
    out = graph_pb2.GraphRunMetrics()
    out.CopyFrom(m)
    del out.components[:]
    out.components.extend(c for c in m.components if c.component in wanted)
    del out.flows[:]
    out.flows.extend(
        f for f in m.flows if f.flow.source.node in wanted or f.flow.target.node in wanted
    )
    return out


# ---------------------------------------------------------------- Redis

# A put whose trim would drop runs it did not declare (they came meanwhile): declared, retried.
UNDECLARED = "undeclared-runs"
PROGRAM = Program("lightpath_services.core_broker", "graphs.lua", {"UNDECLARED": UNDECLARED})


class GraphMetricsStore:
    """Runs' per-component metrics in Redis (GF-6)."""

    def __init__(self, redis: aioredis.Redis, *, runs_kept: int = 100):
        self._redis = redis
        self._runs_kept = runs_kept
        self._script = PROGRAM.bind(redis)

    @staticmethod
    def _key(graph_id: str, *parts: str) -> str:
        return broker_key("graph", graph_id, *parts)

    async def put(self, application_id: str, metrics: graph_pb2.GraphRunMetrics, at_ms: int) -> int:
        """Store one run; the runs now kept. PermissionDenied if another application owns the graph."""
        gid, run = metrics.graph_id, metrics.run_id
        runs = self._key(gid, "runs")
        # the runs the trim will drop once this one is in: declared up front
        old: list[Any] = await self._redis.zrange(runs, 0, -self._runs_kept)
        for _ in range(3):
            t = Txn(families={"run": lambda r: self._key(gid, "run", r)})
            t.check("owner", t.k(self._key(gid, "owner")), application_id)
            t.check("runs_declared", t.k(runs), self._runs_kept)
            t.members("run", old)
            t.op("setnx", t.k(self._key(gid, "owner")), application_id)
            t.hset(
                self._key(gid, "run", run),
                {
                    "app": application_id,
                    "metrics": json_format.MessageToJson(metrics, indent=None),
                    "at": at_ms,
                },
            )
            t.zadd(runs, at_ms, run)
            t.op("trim", t.k(runs), self._runs_kept)
            try:
                return int((await self._script.commit(t))["kept"])
            except Conflict as c:
                if c.reason != UNDECLARED:
                    # Not whose it is (issue 30): only that the id cannot be used.
                    raise PermissionDenied(
                        f'graph id "{gid}" cannot be used; choose another graph_id',
                        reason="ID_UNAVAILABLE",
                    ) from None
                old = json.loads(c.value)
        raise Aborted(f'graph "{gid}" kept getting runs; retry')

    async def owner(self, graph_id: str) -> str | None:
        """The application whose runs of `graph_id` the broker keeps (None: nobody's yet)."""
        owner: Any = await self._redis.get(self._key(graph_id, "owner"))
        return None if owner is None else str(owner)

    async def get(self, graph_id: str, run_id: str = "") -> tuple[str, graph_pb2.GraphRunMetrics]:
        """(application, metrics) of a run, the latest if `run_id` is empty; NotFound otherwise."""
        if not run_id:
            latest: list[Any] = await self._redis.zrevrange(self._key(graph_id, "runs"), 0, 0)
            if not latest:
                raise NotFound("graph", graph_id, hint="no metrics were reported for it")
            run_id = str(latest[0])
        row: dict[Any, Any] = await self._redis.hgetall(self._key(graph_id, "run", run_id))
        if not row:
            raise NotFound("graph run", f"{graph_id}/{run_id}")
        return row["app"], json_format.Parse(row["metrics"], graph_pb2.GraphRunMetrics())
