"""The workload scheduler of one superpod: snapshot → pure decision → atomic commit → OCS.

Every change follows the same shape (STYLE: assume, then commit, or undo):

1. read a snapshot of the pod from Redis (store.snapshot);
2. decide with a pure planning function (planner, placement, preemption);
3. commit the decision with one Lua script that re-checks what the decision
   assumed (store.Txn) — on Conflict, go back to 1;
4. drive the ocs_manager (wire / release / replace), then commit the outcome.

Wiring marks (`block:wired`) make step 4 crash-safe: a block is marked with a
job before WireSlice is called and unmarked only after ReleaseSlice, so a
slice that may exist at the OCS is never forgotten. A reconcile loop on every
replica releases leftover wiring of finished jobs, takes over wirings whose
replica died, finishes interrupted replacements, compares RUNNING jobs with the
ocs_manager's slices and repairs a difference (consistency.py), and runs the queue.

A WireSlice past its deadline is followed through (GetSliceWiring: committed, or
rolled back by the ocs_manager), never repeated blindly; a long wiring records
progress events on the job (issue 14).

Requirements: WS-1 (block state), WS-2 (admission), WS-4 (preemption), WS-5
(failure and recovery), WS-6 (completion, cancel, queue), WS-7 (events).

The parts, each given the pod's collaborators (core.PodContext: store, ocs_manager
client, fabric, planner, clock) and the other parts it calls; WorkloadScheduler puts
them together: wiring.py (wire, follow through, release), admission.py (admit, the
queue's passes), swap.py (failure, recovery, back-to-back swaps), reconcile.py (the
repair loop); here: completion, cancel, updates and the event streams.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from lightpath.domain.job_update import UpdatePlan
from lightpath.domain.slices import (
    CANCELLED,
    COMPLETED,
    FINAL_STATES,
    HOLDING_STATES,
    PENDING,
    RUNNING,
    SUSPENDED,
    WIRING,
)
from lightpath.errors import RELEASED_TO_CELL, Aborted, FailedPrecondition, NotFound
from lightpath.v1 import workload_scheduler_pb2
from lightpath_services.workload_scheduler.admission import Admission
from lightpath_services.workload_scheduler.core import (
    FINISH_RELEASE_WAIT_S,
    MAX_COMMIT_ATTEMPTS,
    AdmitResult,
    Outcome,
    Part,
    PodContext,
    job_event_after,
)
from lightpath_services.workload_scheduler.ocs import OcsError, job_lease
from lightpath_services.workload_scheduler.reconcile import Reconcile
from lightpath_services.workload_scheduler.store import Conflict, JobRecord, PodStore
from lightpath_services.workload_scheduler.swap import Swap
from lightpath_services.workload_scheduler.wiring import Wirer

__all__ = ["AdmitResult", "Outcome", "PodContext", "WorkloadScheduler"]


class WorkloadScheduler(Part):
    """One pod's scheduler, composed of its parts. Several replicas may run on one
    Redis: all coordination goes through the store's atomic commits."""

    def __init__(self, pod: PodContext):
        super().__init__(pod)
        self.wiring = Wirer(pod, schedule_soon=lambda: self.admission.schedule_soon())
        self.admission = Admission(pod, self.wiring)
        self.swap = Swap(pod, self.wiring, self.admission)
        self.reconciler = Reconcile(pod, self.wiring, self.admission, self.swap)
        # What the servicer and the supervisor call, answered by the parts.
        self.admit = self.admission.admit
        self.schedule = self.admission.schedule
        self.report_health = self.swap.report_health
        self.reconcile = self.reconciler.reconcile
        self.run_reconciler = self.reconciler.run_reconciler

    # == completion and cancel (WS-6) =============================================

    async def complete(self, job_id: str) -> JobRecord:
        for attempt in range(MAX_COMMIT_ATTEMPTS):
            record = await self._record(job_id, guess=attempt == 0)
            if record.state == COMPLETED:
                return record
            if record.state != RUNNING:
                raise FailedPrecondition(
                    f"job {job_id}",
                    f"is {record.state}; only a RUNNING job completes",
                    reason="JOB_NOT_RUNNING",
                )
            try:
                return await self._finish(record, COMPLETED, "completed")
            except Conflict:
                continue
        raise FailedPrecondition(f"job {job_id}", "kept changing; retry", reason="BUSY")

    async def cancel(self, job_id: str, reason: str) -> JobRecord:
        for attempt in range(MAX_COMMIT_ATTEMPTS):
            record = await self._record(job_id, guess=attempt == 0)
            if record.state == CANCELLED:
                return record
            if record.state in FINAL_STATES:
                raise FailedPrecondition(
                    f"job {job_id}", f"already ended: {record.state}", reason="JOB_ENDED"
                )
            try:
                return await self._finish(record, CANCELLED, "cancelled", note=reason)
            except Conflict:
                continue
        raise FailedPrecondition(f"job {job_id}", "kept changing; retry", reason="BUSY")

    # == updates (issue 19: priority and labels without admitting again) ===========

    async def update(self, plan: UpdatePlan, job_id: str) -> JobRecord:
        """Apply a checked update to the job: its spec, its priority in the live set and
        the queue index (so a queued job takes its new place, and later preemption
        decisions judge a running one at its new priority), and an event saying what
        changed. The epoch moves on, so a decision taken on the old priority conflicts
        and is taken again. A wiring or block swap in flight owns the job's next commit:
        the update waits for it to end (at most the wiring timeout; then ABORTED)."""
        deadline = time.monotonic() + self.wiring_timeout_ms / 1000
        attempts = 0
        while True:
            tip = await self.store.tip()
            record = await self._record(job_id)
            job = record.summary
            if record.state in FINAL_STATES:
                raise FailedPrecondition(
                    f"job {job_id}",
                    f"already ended: {record.state}; an ended job does not change",
                    reason="JOB_ENDED",
                )
            if record.state == WIRING or job.replacing is not None:
                if time.monotonic() > deadline:
                    raise Aborted(
                        f"job {job_id} is still being wired; retry the update", reason="BUSY"
                    )
                await job_event_after(self.store, job_id, tip, deadline - time.monotonic())
                continue
            current = workload_scheduler_pb2.JobSpec.FromString(base64.b64decode(record.spec_b64))
            upd = plan.apply(current)
            if not upd.changes:  # nothing to change: the job as it is, history and all
                return await self.store.job(job_id, history=True) or record
            now = self.now_ms()
            new = job.with_(priority=upd.priority, epoch=record.epoch + 1)
            txn = self.store.txn()
            txn.expect_job(job_id, [record.state], record.epoch)
            fields = {
                "spec": base64.b64encode(upd.spec.SerializeToString(deterministic=True)).decode(),
                "labels": json.dumps(dict(upd.spec.labels)),
                "admitted": record.submitted_b64,
            }
            txn.hset(self.store.keys.job(job_id), fields)
            txn.write_job(new, old_state=record.state, reason=upd.describe(), now_ms=now)
            txn.read_job(job_id)
            try:
                (updated,) = await self.store.commit(txn)
            except Conflict:
                attempts += 1
                if attempts >= MAX_COMMIT_ATTEMPTS:
                    raise Aborted(
                        f"job {job_id} kept changing; retry the update", reason="BUSY"
                    ) from None
                continue
            self.log.info("job %s %s", job_id, upd.describe(), extra={"job_id": job_id})
            if upd.priority != job.priority:
                # queued, its new place may let it start (or preempt) now; running, the
                # jobs waiting may now be allowed to take its blocks, or no longer
                self.admission.schedule_soon()
            return updated  # type: ignore[no-any-return]

    async def _record(self, job_id: str, *, guess: bool = False) -> JobRecord:
        """The job as stored; with `guess`, as this replica last set it RUNNING if it did
        (the caller's commit checks it, and reads the job after a conflict)."""
        known = self.wiring.known.pop(job_id, None)
        if guess and known is not None:
            return known
        record = await self.store.job(job_id)
        if record is None:
            raise await job_not_found(self.store, job_id)
        return record

    async def _finish(
        self, record: JobRecord, final: str, reason: str, *, note: str = ""
    ) -> JobRecord:
        """End a job: free its blocks, remove its wiring, start queued work (¶114, ¶125:
        a pass in the background). `note`: the caller's words for it, stored once."""
        job = record.summary
        txn = self.store.txn()
        txn.expect_job(job.job_id, [record.state], record.epoch)
        if record.state in HOLDING_STATES:
            txn.release_held(job, self.fabric.block_shape)
        new = job.with_(state=final, epoch=record.epoch + 1)
        txn.write_job(new, old_state=record.state, reason=reason, now_ms=self.now_ms(), note=note)
        txn.read_back(self.store.keys.state_counts, [PENDING, SUSPENDED])
        txn.read_job(job.job_id)
        counts, ended = await self.store.commit(txn)
        waiting = sum(int(n or 0) for n in counts)
        self.log.info("job %s %s", job.job_id, reason, extra={"job_id": job.job_id})
        if job.offset is not None:
            pass  # a sub-block slice has no wiring at the ocs_manager
        elif record.state in HOLDING_STATES or job.job_id in await self.store.wired_jobs():
            try:
                await self.wiring.release(
                    job.job_id, wait_s=FINISH_RELEASE_WAIT_S, lease=job_lease(new)
                )
            except OcsError as err:
                self.wiring.release_error(job.job_id, err)
        if waiting:
            # Not awaited: the answer does not depend on the pass, and a call that frees
            # capacity is never held behind the admissions waiting for the pass lock
            # (issue 30; they took CompleteJob from 0.1 to 2 s under overload).
            self.admission.schedule_soon()
        return ended

    # == events (WS-7) ============================================================

    async def watch_job(self, job_id: str) -> AsyncIterator[dict[str, Any]]:
        """The job's stored transitions, then live ones until it ends (or the pod lets
        it go back to the cell queue, issue 35)."""
        redis = self.store.redis
        keys = self.store.keys
        tip = await self.store.tip()
        record = await self.store.job(job_id, history=True)
        if record is None:
            raise await job_not_found(self.store, job_id)
        last_n = 0
        for event in record.history:
            last_n = max(last_n, int(event.get("n", 0)))
            yield event
        if record.state in FINAL_STATES:
            return
        async for _, fields in _tail(redis, keys.events, tip):
            if fields.get("kind") != "job" or fields.get("job") != job_id:
                continue
            event = json.loads(fields["e"])
            if int(event.get("n", 0)) <= last_n:
                continue
            last_n = int(event["n"])
            (event,) = await self.store.with_notes([event])
            yield event
            if event["to"] in FINAL_STATES or event.get("released"):
                return

    async def watch_pod(self) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        redis = self.store.redis
        tip = await self.store.tip()
        async for _, fields in _tail(redis, self.store.keys.events, tip):
            kind, event = fields.get("kind", "job"), json.loads(fields["e"])
            if kind == "job":
                (event,) = await self.store.with_notes([event])
            yield kind, event


async def _tail(redis, key: str, after: str) -> AsyncIterator[tuple[str, dict[str, str]]]:
    """Entries of a stream after id `after`, forever (blocking reads of 1 s)."""
    cursor = after
    while True:
        got = await redis.xread({key: cursor}, block=1000, count=100)
        for _stream, entries in got or []:
            for entry_id, fields in entries:
                cursor = entry_id
                yield entry_id, fields


async def job_not_found(store: PodStore, job_id: str) -> NotFound:
    """NOT_FOUND for a job the pod does not have; RELEASED_TO_CELL (with the pod's reason
    in `released_reason`) when it let the job go back to the cell queue (issue 35)."""
    released = await store.released(job_id)
    if released is None:
        return NotFound("job", job_id)
    err = NotFound(
        "job", job_id, hint=f"this pod let it go back to the cell queue: {released['reason']}"
    )
    err.reason = RELEASED_TO_CELL
    err.metadata["released_reason"] = released["reason"]
    return err
