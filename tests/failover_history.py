"""Load through the cell and the core broker while Sentinel fails the Redis master over,
and a checker of what the clients were told against what is there afterwards (issue 32).

Clients submit jobs through the cell and complete them (each call tried once), and
reserve cores on the broker and release them (retried as the SDK retries UNAVAILABLE,
up to 5 attempts: a retry may be answered from the record an earlier attempt wrote),
each call with a deadline. A call answered OK is
acknowledged and goes into the history; any other answer leaves its outcome unknown
(it may have been applied or not), so it is not checked. Afterwards every acknowledged
step must be there: an acknowledged job exists, and is COMPLETED when its completion
was acknowledged; an acknowledged reservation exists, and is RELEASED when its release
was. Anything else is an acknowledged write lost. Used by
tests/test_sentinel_failover.py and bench/sentinel_failover.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from lightpath.cli._common import environ_restored
from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import core_broker_pb2 as cb
from lightpath.v1 import workload_scheduler_pb2 as ws
from tests.cell_scheduler.conftest import Cell, cell_stack
from tests.core_broker.conftest import Broker, running_broker
from tests.helpers import identity
from tests.redis_topologies import SentinelSet, redis_sentinel, with_password

CALL_TIMEOUT_S = 5.0
DEVICES, CORES = 8, 8


@dataclass
class History:
    """What the clients were told: job id -> last acknowledged state, and the same
    for reservations; and how many calls were made and answered otherwise."""

    jobs: dict[str, int] = field(default_factory=dict)
    reservations: dict[str, int] = field(default_factory=dict)
    calls: int = 0
    unacknowledged: int = 0

    @property
    def acknowledged(self) -> int:
        # every entry is one acknowledged create, and a terminal state one more step
        terminal = (c.JOB_STATE_COMPLETED, cb.RESERVATION_STATE_RELEASED)
        return sum(1 + (s in terminal) for s in (*self.jobs.values(), *self.reservations.values()))


@dataclass
class Loss:
    jobs: list[str]
    reservations: list[str]

    @property
    def count(self) -> int:
        return len(self.jobs) + len(self.reservations)


async def _ok(history: History, call: Awaitable[Any]) -> Any | None:
    history.calls += 1
    try:
        return await call
    except grpc.aio.AioRpcError:
        history.unacknowledged += 1
        return None


async def _jobs(cell: Cell, history: History, worker: int, stop: asyncio.Event) -> None:
    i = 0
    while not stop.is_set():
        i += 1
        job_id = f"j{worker}-{i}"
        submitted = await _ok(
            history,
            cell.cell.SubmitJob(cs.SubmitJobRequest(spec=_spec(job_id)), timeout=CALL_TIMEOUT_S),
        )
        if submitted is None:
            await asyncio.sleep(0.05)
            continue
        history.jobs[job_id] = submitted.job.state
        if submitted.job.state != c.JOB_STATE_RUNNING:
            continue
        done = await _ok(
            history,
            cell.cell.CompleteJob(cs.CompleteCellJobRequest(job_id=job_id), timeout=CALL_TIMEOUT_S),
        )
        if done is not None:
            history.jobs[job_id] = done.state


def _spec(job_id: str) -> ws.JobSpec:
    return ws.JobSpec(job_id=job_id, shape=c.Shape(dims=[4, 4, 4]))


async def _reservations(
    broker: Broker, app_md: Any, history: History, worker: int, stop: asyncio.Event
) -> None:
    i = 0
    while not stop.is_set():
        i += 1
        rid = f"r{worker}-{i}"
        request = cb.ReservationRequest(reservation_id=rid, cores=1)
        request.duration.seconds = 3600
        granted = await _ok(
            history,
            broker.stub.Reserve(
                cb.ReserveRequest(request=request), metadata=app_md, timeout=CALL_TIMEOUT_S
            ),
        )
        if granted is None:
            await asyncio.sleep(0.05)
            continue
        history.reservations[rid] = granted.state
        released = await _ok(
            history,
            broker.stub.ReleaseReservation(
                cb.ReleaseReservationRequest(reservation_id=rid),
                metadata=app_md,
                timeout=CALL_TIMEOUT_S,
            ),
        )
        if released is not None:
            history.reservations[rid] = released.state


async def _read(call: Callable[[], Awaitable[Any]]) -> Any | None:
    """The answer of a read, None for NOT_FOUND; retried while the services recover."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return None
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def lost(
    cell: Cell, broker: Broker, app_md: Any, history: History, *, converge_s: float = 30.0
) -> Loss:
    """The acknowledged steps the services do not show within `converge_s` (a job the
    pod completed may reach the cell's record with the pod's next report)."""
    deadline = time.monotonic() + converge_s
    jobs = dict(history.jobs)
    reservations = dict(history.reservations)
    while True:
        jobs = {j: t for j, t in jobs.items() if not await _job_shows(cell, j, t)}
        reservations = {
            r: t
            for r, t in reservations.items()
            if not await _reservation_shows(broker, app_md, r, t)
        }
        if not (jobs or reservations) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    return Loss(
        [f"{j} (told {c.JobState.Name(t)})" for j, t in jobs.items()],
        [f"{r} (told {cb.ReservationState.Name(t)})" for r, t in reservations.items()],
    )


async def _job_shows(cell: Cell, job_id: str, told: int) -> bool:
    job = await _read(lambda: cell.job(job_id))
    return job is not None and (told != c.JOB_STATE_COMPLETED or job.state == told)


async def _reservation_shows(broker: Broker, app_md: Any, rid: str, told: int) -> bool:
    r = await _read(
        lambda: broker.stub.GetReservation(
            cb.GetReservationRequest(reservation_id=rid), metadata=app_md
        )
    )
    return r is not None and (told != cb.RESERVATION_STATE_RELEASED or r.state == told)


@dataclass
class Rig:
    sentinel: SentinelSet
    cell: Cell
    broker: Broker
    app_md: Any


def durability_env(replicas: int, timeout_ms: int = 1000) -> dict[str, str]:
    return {
        "LIGHTPATH_REDIS_COMMIT_REPLICAS": str(replicas),
        "LIGHTPATH_REDIS_COMMIT_TIMEOUT_MS": str(timeout_ms),
        "LIGHTPATH_LOG_LEVEL": "error",
    }


@contextlib.asynccontextmanager
async def rig(directory: Path, env: dict[str, str]) -> AsyncIterator[Rig]:
    """A primary, two replicas and three sentinels; a cell with one pod and a core
    broker on it, each service with `env`."""
    files = identity("operator:operator")
    tls = {
        "LIGHTPATH_TLS_CA": files.ca,
        "LIGHTPATH_TLS_CERT": files.cert,
        "LIGHTPATH_TLS_KEY": files.key,
    }
    # The clients' channels present the operator's certificate (as tests/conftest.py
    # arranges for tests; a bench has no conftest).
    with environ_restored(tuple(tls)), redis_sentinel(directory, replicas=2) as sentinel:
        os.environ.update({k: str(v) for k, v in tls.items()})
        url = with_password(sentinel.url)
        async with (
            cell_stack(url, pods=(("pod-a", 8, "tpu"),), env=env) as cell,
            running_broker(url, **env) as broker,
        ):
            for i in range(DEVICES):
                await broker.device(f"gpu-{i}", CORES)
            app_md = await broker.app("failover-app")
            yield Rig(sentinel, cell, broker, app_md)


async def failovers_under_load(
    r: Rig, count: int, *, workers: int = 2, settle_s: float = 1.0
) -> tuple[History, Loss]:
    """`count` failovers (pause the master, the sentinels promote a replica, resume it,
    the sentinels demote it) while `workers` clients of each kind run; then the check."""
    history = History()
    stop = asyncio.Event()
    load = [
        *(asyncio.create_task(_jobs(r.cell, history, w, stop)) for w in range(workers)),
        *(
            asyncio.create_task(_reservations(r.broker, r.app_md, history, w, stop))
            for w in range(workers)
        ),
    ]
    try:
        for _ in range(count):
            await asyncio.sleep(settle_s)
            old, _new = await asyncio.to_thread(r.sentinel.pause_master)
            r.sentinel.resume(old)
            await asyncio.to_thread(r.sentinel.wait_rejoined, old)
        await asyncio.sleep(settle_s)
    finally:
        stop.set()
        await asyncio.gather(*load)
    return history, await lost(r.cell, r.broker, r.app_md, history)
