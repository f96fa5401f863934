"""Following jobs and pods through the cell (CS-5): streams relayed from the pods.

`watch_job` yields the cell's own transitions of a job (queued, sent to a pod,
UNKNOWN while its pod is silent and back) and, once the job is on a pod, the
pod's transitions, relayed live until the job ends; when the pod stops
answering the relay is started again once it is back (the pod replays the job's
history, which is skipped up to what was already sent). `watch_pod` relays a
pod's WatchPod stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc

from lightpath.v1 import common_pb2, workload_scheduler_pb2
from lightpath_services.cell_scheduler.jobs import CellJobs
from lightpath_services.cell_scheduler.podclient import classify, state_name
from lightpath_services.cell_scheduler.pods import PodDirectory
from lightpath_services.cell_scheduler.store import ENDED, FINAL, PLACED, CellStore
from lightpath_services.common.convert import job_event_pb
from lightpath_services.common.supervisor import ready


class CellEventHub:
    """One reader of the cell's event stream per replica, fanned out to the watchers of
    each job (a blocking read per watcher would hold a Redis connection each).

    `run` is the reader, a long-lived task under the service's supervisor: it idles
    while nobody watches, and its cursor lives here, so a run restarted after a
    failure (Redis away) resumes where the last one stopped and no watcher misses an
    event."""

    def __init__(self, store: CellStore, log: logging.Logger):
        self._store = store
        self._log = log
        self._subscribers: dict[str, set[asyncio.Queue]] = {}
        self._cursor: str | None = None  # None: nobody watches
        self._watched = asyncio.Event()

    @contextlib.asynccontextmanager
    async def subscribe(self, job_id: str, queue: asyncio.Queue) -> AsyncIterator[None]:
        """Put ("cell", event JSON) on `queue` for each of the job's cell events from
        about now on, while the block runs."""
        if self._cursor is None:
            self._cursor = await self._store.stream_tip()
        self._subscribers.setdefault(job_id, set()).add(queue)
        self._watched.set()
        try:
            yield
        finally:
            subs = self._subscribers.get(job_id, set())
            subs.discard(queue)
            if not subs:
                self._subscribers.pop(job_id, None)
            if not self._subscribers:
                self._watched.clear()
                self._cursor = None

    async def run(self) -> None:
        """Read the stream while anyone watches; a Redis fault ends the run (the
        supervisor logs it and starts the next after a backoff)."""
        while True:
            await self._watched.wait()
            cursor = self._cursor
            if cursor is None:
                continue
            entries = await self._store.tail(cursor)
            if self._cursor != cursor:  # all watchers left during the read (maybe new ones came)
                continue
            ready()
            for eid, fields in entries:
                self._cursor = eid
                for queue in self._subscribers.get(fields.get("job", ""), ()):
                    queue.put_nowait(("cell", int(fields["n"])))


def _cell_event_pb(e: Mapping[str, Any]) -> common_pb2.JobEvent:
    """A cell-side transition as the JobEvent watchers get (the pods' own shape)."""
    return job_event_pb(dict(e), e.get("pod", ""))


async def watch_job(
    jobs: CellJobs, events: CellEventHub, job_id: str
) -> AsyncIterator[common_pb2.JobEvent]:
    """The cell's transitions of the job and, once it is on a pod, the pod's; live
    until the job ends. A pod that stops answering is followed again when it returns."""
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    async with events.subscribe(job_id, queue):
        async for event in _follow(jobs, job_id, queue):
            yield event


async def _follow(
    jobs: CellJobs, job_id: str, queue: asyncio.Queue[tuple[str, Any]]
) -> AsyncIterator[common_pb2.JobEvent]:
    """History first, then the merged live events of the cell (from the hub) and of the
    job's pod (a relay task) on `queue`."""
    record = await jobs.job_record(job_id)
    cell_sent = 0
    for e in await jobs.store.history(job_id):
        cell_sent = max(cell_sent, int(e.get("n", 0)))
        yield _cell_event_pb(e)
    if record.phase == ENDED:
        return

    async def relay(pod: str, gen: int) -> None:
        try:
            endpoint = await jobs.pods.endpoint(pod, fresh=True)
            stub = jobs.pods.clients.stub(endpoint, pod)
            async for ev in stub.WatchJob(workload_scheduler_pb2.WatchJobRequest(job_id=job_id)):
                await queue.put(("pod", (gen, ev)))
            await queue.put(("pod-end", (gen, None)))
        except grpc.aio.AioRpcError as err:
            await queue.put(("pod-error", (gen, err)))

    relay_task: asyncio.Task | None = None
    getter: asyncio.Task | None = None
    pod_sent = 0  # pod events yielded; a new relay replays the pod's history first
    relay_seen = 0
    relay_gen = 0  # of the relay running now: a cancelled one's leftovers are dropped
    retry_at = 0.0
    try:
        while True:
            record = await jobs.job_record(job_id)
            if record.phase == ENDED:
                for e in await jobs.store.history(job_id, cell_sent):
                    yield _cell_event_pb(e)
                return
            wanted = record.phase == PLACED and record.state != "UNKNOWN"
            if wanted and relay_task is None and time.monotonic() >= retry_at:
                relay_seen = 0
                relay_gen += 1
                relay_task = asyncio.ensure_future(relay(record.pod, relay_gen))
            elif not wanted and relay_task is not None:
                relay_task.cancel()
                relay_task = None
                relay_gen += 1
            if record.phase != PLACED:
                # (back in the cell queue from its pod, issue 35: its next pod numbers
                # the job's events from the first again)
                pod_sent = 0
            # (not wait_for: on Python 3.11 a timeout racing the get can lose the item)
            getter = getter or asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({getter}, timeout=0.5)
            if not done:
                continue
            kind, item = getter.result()
            getter = None
            if kind != "cell":
                gen, item = item
                if gen != relay_gen:
                    continue  # from a relay cancelled since
            if kind == "cell":
                if item > cell_sent:  # the event is stored once, in the job's history
                    for e in await jobs.store.history(job_id, cell_sent):
                        cell_sent = max(cell_sent, int(e.get("n", 0)))
                        yield _cell_event_pb(e)
            elif kind == "pod":
                relay_seen += 1
                if relay_seen > pod_sent:
                    pod_sent = relay_seen
                    yield item
                    if state_name(item.to_state) in FINAL:
                        return
            else:
                relay_task = None
                retry_at = time.monotonic() + 1.0
    finally:
        for task in (getter, relay_task):
            if task is not None:
                task.cancel()


async def watch_pod(
    pods: PodDirectory, pod_id: str
) -> AsyncIterator[workload_scheduler_pb2.PodEvent]:
    await pods.registration(pod_id)
    endpoint = await pods.endpoint(pod_id, fresh=True)
    try:
        async for ev in pods.clients.stub(endpoint, pod_id).WatchPod(
            workload_scheduler_pb2.WatchPodRequest()
        ):
            yield ev
    except grpc.aio.AioRpcError as err:
        raise classify(pod_id, err).relayed() from None
