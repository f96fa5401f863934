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
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import grpc

from lightpath.errors import FailedPrecondition, NotFound, ResourceExhausted
from lightpath.v1 import workload_scheduler_pb2
from services.workload_scheduler.consistency import MISSING, ORPHANED, wiring_differences
from services.workload_scheduler.fabric import PodFabric
from services.workload_scheduler.model import (
    CANCELLED,
    COMPLETED,
    DELAY,
    FAIL,
    FAILED,
    FINAL_STATES,
    HOLDING_STATES,
    PENDING,
    PREEMPTED,
    RUNNING,
    SUSPENDED,
    TERMINATE,
    WIRING,
    SliceJob,
    grid_positions,
)
from services.workload_scheduler.ocs import OcsError, OcsManagerClient, ReplaceResult, Wiring
from services.workload_scheduler.placement import PodState, Unplaceable
from services.workload_scheduler.planner import (
    Allocation,
    Replacement,
    apply_allocation,
    plan_admission,
    plan_pass,
    plan_replacement,
    running_with_failed_blocks,
)
from services.workload_scheduler.preemption import VictimAction
from services.workload_scheduler.spec import NormalizedSpec
from services.workload_scheduler.store import Conflict, JobRecord, PodStore, Txn
from services.workload_scheduler.switched import job_degrees

MAX_COMMIT_ATTEMPTS = 20
# A wiring refused because a block is still wired elsewhere may be a race with a
# release in flight; after this many refusals the job fails.
MAX_WIRING_ATTEMPTS = 3
RETRY_BACKOFF_MS = 500
RELEASE_CLAIM_MS = 30_000
# Leftover wiring of a job that ended less than this ago is left to the call ending it.
STALE_WIRING_GRACE_MS = 3_000
# Records of jobs this replica set RUNNING, kept as a first guess for ending them.
KNOWN_LIMIT = 4096
# A wiring that lasts records a progress event on the job this often (and so pushes its
# wiring deadline on: a slow switch is not a dead replica).
WIRING_PROGRESS_S = 2.0
# CompleteJob / CancelJob / ReportBlockHealth wait this long at most for another call
# changing the slice to end before releasing it; past that the other call (or the
# reconcile loop, which never waits: its next round asks again) releases it.
FINISH_RELEASE_WAIT_S = 5.0
# A reconcile round that finds nothing changed does nothing; every this many rounds
# (FULL_ROUND_MIN_S .. FULL_ROUND_MAX_S apart) one reads the whole pod anyway.
FULL_ROUND_EVERY = 10
FULL_ROUND_MIN_S = 1.0
FULL_ROUND_MAX_S = 10.0


class WiringRolledBack(OcsError):
    """A WireSlice past its deadline that the ocs_manager rolled back: nothing is wired."""


@dataclass(frozen=True)
class AdmitResult:
    record: JobRecord
    created: bool
    outcome: str = ""
    preempted: tuple[dict[str, Any], ...] = ()


@dataclass
class _Admission:
    """A job being admitted, as its admission's pass stores it."""

    spec_b64: str
    norm: NormalizedSpec
    spec: workload_scheduler_pb2.JobSpec
    # True once this call stored the job, False if it existed already, None until known.
    created: bool | None = None


@dataclass
class Outcome:
    """What one admission, failure report or pass did, for responses and logs."""

    preempted: list[dict[str, Any]] = field(default_factory=list)
    replacement: dict[str, Any] | None = None
    affected: list[str] = field(default_factory=list)
    action: str = ""


class _SwapRun:
    """This replica swapping the failed blocks of one slice one after another; a report
    of one of them waits here for its block's outcome (issue 15)."""

    def __init__(self) -> None:
        self.done: dict[int, Outcome] = {}
        # The outcome that ended the slice (suspended, failed): the answer for the rest.
        self.lost: Outcome | None = None
        self.ended = False
        self._changed = asyncio.Event()

    def record(self, job_id: str, block: int, outcome: Outcome) -> None:
        self.done[block] = outcome
        if job_id in outcome.affected and outcome.replacement is None:
            self.lost = outcome
        self._changed.set()
        self._changed = asyncio.Event()

    def end(self) -> None:
        self.ended = True
        self._changed.set()

    async def outcome_of(self, block: int) -> Outcome | None:
        """The outcome of `block`'s swap, the slice's loss, or None when the run ended
        without it (the caller then decides itself)."""
        while True:
            if block in self.done:
                return self.done[block]
            if self.lost is not None:
                return self.lost
            if self.ended:
                return None
            await self._changed.wait()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class WorkloadScheduler:
    """One pod's scheduler. Several replicas may run on one Redis: all coordination
    goes through the store's atomic commits."""

    def __init__(
        self,
        *,
        store: PodStore,
        ocs: OcsManagerClient,
        fabric: PodFabric,
        wiring_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        spawn: Callable[..., asyncio.Task] | None = None,
        log: logging.Logger | None = None,
    ):
        self.store = store
        self.ocs = ocs
        self.fabric = fabric
        self.pod_id = store.keys.pod_id
        self.wiring_timeout_ms = int(wiring_timeout_s * 1000)
        self._progress_s = min(WIRING_PROGRESS_S, wiring_timeout_s / 3)
        self._clock = clock
        self._spawn = spawn or (lambda coro, name: asyncio.ensure_future(coro))
        self.log = log or logging.getLogger("lightpath.workload_scheduler")
        self._pass_lock = asyncio.Lock()
        self._pass_started = 0
        self._pass_done = 0
        self._wiring: dict[str, asyncio.Task] = {}
        self._queue_waiting = False
        # The record as this replica's RUNNING commit left it: complete / cancel start from
        # it instead of reading the job. Only a guess: their commit checks state and epoch,
        # and on a conflict they read the job as it is.
        self._known: dict[str, JobRecord] = {}
        # Reconcile rounds: the newest event when the last full round found nothing to
        # do (None: it did something), and until when that holds.
        self._quiet_tip: str | None = None
        self._quiet_until_ms = 0
        self._last_full_ms = 0
        self.full_every_ms = int(FULL_ROUND_MAX_S * 1000)
        # Slices of which this replica is swapping failed blocks, back to back (WS-5).
        self._swap_runs: dict[str, _SwapRun] = {}

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def snapshot(self) -> PodState:
        return await self.store.snapshot(self.fabric)

    # == admission (WS-2) ========================================================

    async def admit(
        self, spec: workload_scheduler_pb2.JobSpec, norm: NormalizedSpec, *, validate_only: bool
    ) -> AdmitResult:
        """Admit a job; answers once it is RUNNING, queued or refused (WS-2, WS-4)."""
        spec_b64 = _b64(spec.SerializeToString(deterministic=True))
        if validate_only:
            return await self._dry_run(spec_b64, norm)
        admission = _Admission(spec_b64, norm, spec)
        async with self._pass_lock:
            # A pass over the queue with the new job in it: the job's creation commits
            # with its allocation when the pass places it (one snapshot, one commit).
            self._pass_started += 1
            generation = self._pass_started
            try:
                await self._pass(admission)
            finally:
                self._pass_done = generation
        if admission.created is None:  # the pass gave up before the job was stored
            admission.created = await self._create(spec_b64, norm, spec)
            await self.schedule()
        created = admission.created
        record = await self._settled(norm.job_id)
        if record.state == PENDING and norm.when_no_capacity == FAIL:
            await self._refuse(record)
            record = await self._settled(norm.job_id)
        return AdmitResult(record, created, preempted=record.preempted)

    def _new_job(self, norm: NormalizedSpec, seq: int) -> SliceJob:
        return SliceJob(
            job_id=norm.job_id,
            state=PENDING,
            epoch=1,
            priority=norm.priority,
            seq=seq,
            demand=norm.demand,
            preemption=norm.preemption,
            shrink_to=norm.shrink_to,
            on_block_failure=norm.on_block_failure,
            when_no_capacity=norm.when_no_capacity,
            degrees=job_degrees(norm) if self.fabric.switched is not None else None,
        )

    def _store_new(self, txn: Txn, job: SliceJob, admission: _Admission, now: int) -> None:
        """Checks and writes that store a new job PENDING in the queue."""
        txn.expect_no_job(job.job_id)
        txn.hset(
            self.store.keys.job(job.job_id),
            {
                "spec": admission.spec_b64,
                "created_ms": now,
                "seq": job.seq,
                "labels": json.dumps(dict(admission.spec.labels)),
            },
        )
        txn.zadd(self.store.keys.jobs, job.seq, job.job_id)
        txn.write_job(
            job, old_state=None, reason=f"admitted at priority {job.priority}", now_ms=now
        )

    def _log_admitted(self, job: SliceJob) -> None:
        self.log.debug(
            "job %s admitted: %s blocks, priority %d",
            job.job_id,
            "x".join(map(str, job.demand.grid)),
            job.priority,
            extra={"job_id": job.job_id},
        )

    async def _create(
        self, spec_b64: str, norm: NormalizedSpec, spec: workload_scheduler_pb2.JobSpec
    ) -> bool:
        """Store the job PENDING in the queue; False if the same request was already admitted."""
        seq = await self.store.next_seq()
        now = self.now_ms()
        job = self._new_job(norm, seq)
        txn = self.store.txn()
        self._store_new(txn, job, _Admission(spec_b64, norm, spec), now)
        try:
            await self.store.commit(txn)
        except Conflict:
            existing = await self.store.job(norm.job_id)
            if existing is None:  # admitted and refused (WHEN_NO_CAPACITY_FAIL) meanwhile
                return await self._create(spec_b64, norm, spec)
            if existing.spec_b64 != spec_b64:
                raise FailedPrecondition(
                    f"job {norm.job_id}",
                    "already exists with a different request; choose a new job id",
                    reason="JOB_ID_REUSED",
                ) from None
            return False
        self._log_admitted(job)
        return True

    async def _settled(self, job_id: str) -> JobRecord:
        """The job once no wiring of it is in flight (bounded by the wiring timeout)."""
        deadline = time.monotonic() + self.wiring_timeout_ms / 1000
        while True:
            task = self._wiring.get(job_id)
            if task is not None:
                with contextlib.suppress(Exception):
                    done = await asyncio.shield(task)
                    if isinstance(done, JobRecord) and done.job_id == job_id:
                        return done  # as the RUNNING commit left it
            record = await self.store.job(job_id, history=True)
            if record is None:
                raise NotFound("job", job_id)
            if record.state != WIRING or time.monotonic() > deadline:
                return record
            await asyncio.sleep(0.02)

    async def _refuse(self, record: JobRecord) -> None:
        """WHEN_NO_CAPACITY_FAIL: the job could not be placed → forget it, RESOURCE_EXHAUSTED."""
        state = await self.snapshot()
        job = state.jobs.get(record.job_id)
        if job is None or job.state != PENDING:
            return
        found = plan_admission(state, job)
        reason = found.reason if isinstance(found, Unplaceable) else "the pod is busy"
        keys = self.store.keys
        txn = self.store.txn()
        txn.expect_job(job.job_id, [PENDING], job.epoch)
        txn.hdel(keys.live, [job.job_id])
        txn.hdel(keys.queued, [job.job_id])
        txn.hincr(keys.state_counts, PENDING, -1)
        txn.zrem(keys.jobs, job.job_id)
        # The transition reaches pod watchers; the job's keys go right after it.
        txn.job_event(
            {
                "job": job.job_id,
                "from": PENDING,
                "to": FAILED,
                "at": self.now_ms(),
                "reason": f"refused (asked not to wait): {reason}",
            }
        )
        txn.delete(keys.job(job.job_id))
        txn.delete(keys.history(job.job_id))
        try:
            await self.store.commit(txn)
        except Conflict:
            return  # placed meanwhile by another pass
        raise ResourceExhausted(
            f"job {job.job_id} cannot be placed now and asked not to wait: {reason}",
            reason="NO_CAPACITY",
        )

    async def _dry_run(self, spec_b64: str, norm: NormalizedSpec) -> AdmitResult:
        existing = await self.store.job(norm.job_id)
        if existing is not None:
            if existing.spec_b64 != spec_b64:
                raise FailedPrecondition(
                    f"job {norm.job_id}",
                    "already exists with a different request; choose a new job id",
                    reason="JOB_ID_REUSED",
                )
            return AdmitResult(existing, False, f"already admitted: {existing.state}")
        state = await self.snapshot()
        job = self._new_job(norm, seq=2**62)
        state.jobs[job.job_id] = job
        decision = next(
            (d for d in plan_pass(state, self.now_ms()) or () if d.job.job_id == job.job_id), None
        )
        now = self.now_ms()
        if decision is not None:
            placed = job.with_(state=WIRING, placement=decision.placement)
            record = JobRecord(job.job_id, spec_b64, WIRING, 0, "", placed, now, now)
            outcome = "placed on blocks " + ",".join(map(str, decision.placement))
            if decision.victims:
                outcome += " by preempting " + ", ".join(
                    f"{v.job_id} ({v.action.lower()})" for v in decision.victims
                )
            preempted = tuple(_victim_json(v, state.jobs[v.job_id]) for v in decision.victims)
            return AdmitResult(record, True, outcome, preempted)
        found = plan_admission(state, job)
        reason = found.reason if isinstance(found, Unplaceable) else "lower queue position"
        if norm.when_no_capacity == FAIL:
            raise ResourceExhausted(
                f"job {job.job_id} cannot be placed now and asked not to wait: {reason}",
                reason="NO_CAPACITY",
            )
        position = 1 + [j.job_id for j in state.queue()].index(job.job_id)
        record = JobRecord(job.job_id, spec_b64, PENDING, 0, reason, job, now, now)
        return AdmitResult(record, True, f"queued at position {position}: {reason}")

    # == the queue (WS-4, WS-6) ===================================================

    async def schedule(self) -> None:
        """Run a pass over the queue that starts after this call (coalesced per replica).
        Its allocations are committed when this returns; their wiring proceeds in the
        background (an admission waits for its own job's, see `_settled`)."""
        wanted = self._pass_started + 1
        async with self._pass_lock:
            if self._pass_done >= wanted:
                return
            self._pass_started += 1
            generation = self._pass_started
            try:
                await self._pass()
            finally:
                self._pass_done = generation

    async def _pass(self, admission: _Admission | None = None) -> list[asyncio.Task]:
        """One pass over the queue (under the pass lock). With `admission`, the pass also
        stores that new job: with its allocation when the pass places it, else PENDING;
        `admission.created` says how it went (None: the pass gave up first)."""
        started: list[asyncio.Task] = []
        # First decide on the free blocks and the queue only (cost independent of the
        # live jobs, issue 15); the whole pod when that cannot decide or after a conflict.
        lean = self.fabric.switched is None
        for _ in range(MAX_COMMIT_ATTEMPTS):
            new: SliceJob | None = None
            creating = admission is not None and admission.created is None
            if lean:
                state, seq = await self.store.lean_snapshot(
                    self.fabric,
                    jobs=[admission.norm.job_id] if admission is not None and creating else (),
                    extra="seq" if creating else "",
                )
            elif creating:
                state, seq = await self.store.snapshot_and_seq(self.fabric)
            else:
                state = await self.snapshot()
            if admission is not None and creating:
                if admission.norm.job_id in state.jobs:  # admitted before: as the store says
                    admission.created = await self._create(
                        admission.spec_b64, admission.norm, admission.spec
                    )
                    continue
                new = self._new_job(admission.norm, int(seq))
                state.jobs[new.job_id] = new
            now = self.now_ms()
            found = plan_pass(state, now)
            if found is None:  # a job needs more than free blocks: decide on the whole pod
                lean = False
                state = await self.snapshot()
                if new is not None:
                    state.jobs.setdefault(new.job_id, new)
                found = plan_pass(state, now)
            assert found is not None
            decisions = found
            if not decisions and new is None:
                self._queue_waiting = bool(state.queue())
                return started
            work = state.copy()
            try:
                if new is not None and all(d.job.job_id != new.job_id for d in decisions):
                    assert admission is not None
                    await self._commit_new(new, admission, now)  # waits in the queue
                for alloc in decisions:
                    creating = new is not None and alloc.job.job_id == new.job_id
                    started.append(
                        await self._commit_allocation(
                            work, alloc, admission=admission if creating else None
                        )
                    )
                    apply_allocation(work, alloc)
            except Conflict as c:
                self.log.debug("pass conflicted (%s); deciding again", c)
                lean = False
                if new is not None and admission is not None and admission.created is None:
                    # The job may exist already (a retry, or another replica): as the
                    # store says; the next round of this pass then places it if it can.
                    admission.created = await self._create(
                        admission.spec_b64, admission.norm, admission.spec
                    )
                continue
            # Jobs left waiting may be placeable once the slices now wiring run (and so
            # become preemptible): the wirings then ask for another pass.
            self._queue_waiting = bool(work.queue())
            return started
        self.log.warning("scheduling pass gave up after %d conflicts", MAX_COMMIT_ATTEMPTS)
        return started

    async def _commit_new(self, job: SliceJob, admission: _Admission, now: int) -> None:
        """Store a new job the pass leaves waiting: PENDING in the queue."""
        txn = self.store.txn()
        self._store_new(txn, job, admission, now)
        await self.store.commit(txn)
        admission.created = True
        self._log_admitted(job)

    def _victim_transitions(
        self, txn: Txn, state: PodState, victims, preemptor: SliceJob, now: int
    ) -> list[SliceJob]:
        """Checks and writes for the victims of a preemption; the shrunk ones to rewire."""
        shrunk = []
        for v in victims:
            vj = state.jobs[v.job_id]
            txn.expect_job(v.job_id, [RUNNING], vj.epoch)
            why = f"blocks taken by {preemptor.job_id} (priority {preemptor.priority} > {vj.priority})"
            if v.action == TERMINATE:
                new = vj.with_(state=PREEMPTED, epoch=vj.epoch + 1, placement=None)
                reason = f"preempted: {why}"
            elif v.action == DELAY:
                new = vj.with_(state=SUSPENDED, epoch=vj.epoch + 1, placement=None, replacing=None)
                reason = f"suspended and requeued: {why}"
            else:
                assert v.shrink_grid is not None
                new = vj.with_(
                    state=WIRING,
                    epoch=vj.epoch + 1,
                    demand=vj.demand.shrunk(v.shrink_grid),
                    placement=v.kept_placement,
                    wiring_deadline_ms=now + self.wiring_timeout_ms,
                    queued_as=SUSPENDED,
                    replacing=None,
                )
                reason = f"shrinking to {'x'.join(map(str, v.shrink_grid))} blocks: {why}"
                shrunk.append(new)
            txn.hdel(self.store.keys.owner, list(v.freed))
            txn.write_job(new, old_state=RUNNING, reason=reason, now_ms=now)
        return shrunk

    async def _commit_allocation(
        self, state: PodState, alloc: Allocation, *, admission: _Admission | None = None
    ) -> asyncio.Task:
        """Commit an allocation; with `admission`, alloc.job is new and is stored with it
        (admitted PENDING, then placed: the same transitions as two commits)."""
        job = alloc.job
        now = self.now_ms()
        keys = self.store.keys
        txn = self.store.txn()
        if admission is not None:
            self._store_new(txn, job, admission, now)
        else:
            txn.expect_job(job.job_id, [job.state], job.epoch)
        txn.expect_no_release_claim(job.job_id)
        victim_ids = [v.job_id for v in alloc.victims]
        new = job.with_(
            state=WIRING,
            epoch=job.epoch + 1,
            placement=alloc.placement,
            tile=alloc.tile,
            wiring_deadline_ms=now + self.wiring_timeout_ms,
            queued_as=job.state,
        )
        held = new.held_keys()  # the blocks, or a small job's processors (SWITCHED pods)
        for b in alloc.placement:
            txn.expect_health(b, "HEALTHY")
        for b in held:
            txn.expect_owner(b, ["", *victim_ids])
            txn.expect_wired_by(b, alloc.release_first)
        shrunk = self._victim_transitions(txn, state, alloc.victims, job, now)
        txn.hset(keys.owner, {b: job.job_id for b in held})
        if not alloc.release_first:
            # Nothing to release first: mark the blocks as (about to be) wired right away.
            txn.hset(keys.wired, {b: job.job_id for b in held})
        preempted = [_victim_json(v, state.jobs[v.job_id]) for v in alloc.victims]
        if preempted:
            txn.hset(keys.job(job.job_id), {"preempted": json.dumps(preempted)})
        reason = "placed on blocks " + ",".join(map(str, alloc.placement))
        if alloc.victims:
            reason += " after preempting " + ", ".join(victim_ids)
        txn.write_job(new, old_state=job.state, reason=reason, now_ms=now)
        await self.store.commit(txn)
        if admission is not None:
            admission.created = True
            self._log_admitted(job)
        log = self.log.info if alloc.victims else self.log.debug
        log("job %s: %s", job.job_id, reason, extra={"job_id": job.job_id})
        return self._track_wiring(job.job_id, self._wire_allocation(alloc, new, shrunk))

    # == wiring (WS-2, WS-8) ======================================================

    def _track_wiring(self, job_id: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Wire in the background; an admission of the same job awaits it (`_settled`)."""
        task = self._spawn(coro, f"wire {job_id}")
        self._wiring[job_id] = task

        def done(_t: asyncio.Task) -> None:
            if self._wiring.get(job_id) is task:
                del self._wiring[job_id]

        task.add_done_callback(done)
        return task

    async def _wire_allocation(
        self, alloc: Allocation, job: SliceJob, shrunk: list[SliceJob]
    ) -> JobRecord | None:
        err = await self._make_room(alloc.release_first, {job.job_id}, shrunk)
        if err is not None:
            await self._wiring_failed(job, err)
            return None
        return await self._wire(job, marked=not alloc.release_first)

    async def _make_room(
        self, release_first: tuple[str, ...], owned: set[str], shrunk: list[SliceJob]
    ) -> OcsError | None:
        """Release the leftover and victims' wiring on the blocks about to be used, then
        rewire the shrunk victims; the ocs_manager's error if a release failed."""
        owned = owned | {s.job_id for s in shrunk}
        try:
            for other in release_first:
                if other in owned:
                    await self._release(other)
                else:
                    await self._release_claimed(other)
        except OcsError as err:
            for s in shrunk:
                await self._wiring_failed(s, err)
            return err
        for s in shrunk:
            await self._wire(s)
        return None

    async def _wire(self, job: SliceJob, *, marked: bool = False) -> JobRecord | None:
        """Mark, wire at the OCS, commit RUNNING (job is WIRING at job.epoch, owned by us)."""
        assert job.placement is not None
        keys = self.store.keys
        if not marked:
            txn = self.store.txn()
            txn.expect_job(job.job_id, [WIRING], job.epoch)
            for b in job.held_keys():
                txn.expect_wired_by(b, [job.job_id])
            txn.hset(keys.wired, {b: job.job_id for b in job.held_keys()})
            try:
                await self.store.commit(txn)
            except Conflict as c:
                self.log.info("job %s not wired: %s", job.job_id, c, extra={"job_id": job.job_id})
                await self._requeue_if_wiring(job, f"could not wire: {c}")
                return None
        job, outcome = await self._wire_at_ocs(job)
        if isinstance(outcome, OcsError):
            await self._wiring_failed(
                job,
                outcome,
                counted=outcome.deadline,
                rolled_back=isinstance(outcome, WiringRolledBack),
            )
            return None
        wiring = outcome
        now = self.now_ms()
        running = job.with_(
            state=RUNNING, epoch=job.epoch + 1, wiring_deadline_ms=0, attempts=0, not_before_ms=0
        )
        txn = self.store.txn()
        txn.expect_job(job.job_id, [WIRING], job.epoch)
        txn.write_job(
            running,
            old_state=WIRING,
            reason=f"wired by the ocs_manager: {wiring.describe()}",
            now_ms=now,
        )
        txn.read_job(job.job_id)
        try:
            (record,) = await self.store.commit(txn)
        except Conflict:
            await self._wired_but_superseded(job)
            return None
        self._remember(record)
        self.log.info(
            "job %s running on %d blocks",
            job.job_id,
            len(job.placement or ()),
            extra={"job_id": job.job_id, "cross_connects": wiring.cross_connects},
        )
        # A block that failed while the slice was being wired is swapped by the
        # reconcile loop (running_with_failed_blocks), like any missed replacement.
        if self._queue_waiting:
            self.schedule_soon()
        return record

    async def _wire_at_ocs(self, job: SliceJob) -> tuple[SliceJob, Wiring | OcsError]:
        """WireSlice (ReserveRings) for `job`, recording progress events while it lasts.
        A call that outlives its deadline is followed through, not repeated: the
        ocs_manager either committed the change or rolls it back (it undoes a change whose
        caller went away), and GetSliceWiring says which. Answers the job as last
        committed (a progress event moves its epoch on) and the wiring or the error; a
        wiring rolled back after the deadline is a WiringRolledBack."""
        # Each retry after a deadline gets twice as long (the job's attempts count them).
        timeout = self.ocs.timeout_s * 2 ** min(job.attempts, MAX_WIRING_ATTEMPTS - 1)
        started = time.monotonic()
        call = asyncio.ensure_future(self.ocs.wire_job(job, timeout_s=timeout))
        try:
            job = await self._progress_until(call, job, started, "waiting for the ocs_manager")
        finally:
            call.cancel()  # only if we are cancelled ourselves: it is done otherwise
        try:
            return job, call.result()
        except OcsError as err:
            if not err.deadline:
                return job, err
        self.log.info(
            "job %s: WireSlice got no answer within %g s; asking the ocs_manager how it ended",
            job.job_id,
            timeout,
            extra={"job_id": job.job_id},
        )
        follow = asyncio.ensure_future(self._follow_through(job))
        try:
            job = await self._progress_until(
                follow,
                job,
                started,
                f"no answer within {timeout:g} s (LIGHTPATH_WS_OCS_TIMEOUT_S); waiting for the "
                "ocs_manager to finish or roll back the wiring",
            )
        finally:
            follow.cancel()
        found = follow.result()
        if found is None:
            return job, WiringRolledBack(
                "WireSlice",
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"WireSlice got no answer within {timeout:g} s (LIGHTPATH_WS_OCS_TIMEOUT_S) "
                "and the ocs_manager rolled the wiring back",
            )
        return job, found

    async def _follow_through(self, job: SliceJob) -> Wiring | OcsError | None:
        """After a WireSlice deadline: the slice once the ocs_manager committed it, None
        once it rolled it back (no slice), an OcsError if it did neither in time."""
        limit = time.monotonic() + self.wiring_timeout_ms / 1000
        delay = 0.05
        while True:
            try:
                found = await self.ocs.wiring(job.job_id)
            except OcsError as err:
                if time.monotonic() > limit:
                    return err
            else:
                if found is None:
                    return None
                if found.committed:
                    if job.placement is None or found.blocks == tuple(job.placement):
                        return found
                    return OcsError(
                        "GetSliceWiring",
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"slice {job.job_id} is wired on other blocks: "
                        + ",".join(map(str, found.blocks)),
                    )
                if time.monotonic() > limit:
                    return OcsError(
                        "GetSliceWiring",
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"slice {job.job_id} is still being programmed "
                        f"{self.wiring_timeout_ms / 1000:g} s after the deadline",
                    )
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)

    async def _progress_until(
        self, fut: asyncio.Future, job: SliceJob, started: float, what: str
    ) -> SliceJob:
        """Wait for `fut`, recording a progress event on the WIRING job every few seconds
        (WatchJob / GetJob show it; it also pushes the wiring deadline on). Answers the
        job as last committed."""
        while True:
            done, _ = await asyncio.wait({fut}, timeout=self._progress_s)
            if done:
                return job
            now = self.now_ms()
            newer = job.with_(epoch=job.epoch + 1, wiring_deadline_ms=now + self.wiring_timeout_ms)
            txn = self.store.txn()
            txn.expect_job(job.job_id, [WIRING], job.epoch)
            txn.write_job(
                newer,
                old_state=WIRING,
                reason=f"still wiring after {time.monotonic() - started:.0f} s: {what}",
                now_ms=now,
            )
            try:
                await self.store.commit(txn)
            except Conflict:
                # Cancelled or taken over: the wiring's own commit finds out and undoes it.
                await asyncio.wait({fut})
                return job
            job = newer

    async def _wired_but_superseded(self, job: SliceJob) -> None:
        """Wired at the OCS, but the job changed meanwhile (cancelled, or taken over)."""
        record = await self.store.job(job.job_id)
        if (
            record is not None
            and record.state in HOLDING_STATES
            and record.summary.placement == job.placement
        ):
            return  # another replica finished the same wiring
        try:
            if record is None or record.state in FINAL_STATES:
                await self._release(job.job_id)
            else:
                await self._release_claimed(job.job_id)
        except OcsError as err:
            self._release_error(job.job_id, err)
        self.schedule_soon()

    def _release_error(self, job_id: str, err: OcsError) -> None:
        """A release that did not happen: its marks stay and the reconcile loop retries.
        Another call changing the slice (ABORTED SLICE_BUSY) is an expected race: that
        call owns it, so it is logged at debug."""
        if err.busy:
            self.log.debug(
                "job %s: release left to the call changing the slice: %s",
                job_id,
                err,
                extra={"job_id": job_id},
            )
        else:
            self.log.warning(
                "job %s: release failed, the reconcile loop retries: %s",
                job_id,
                err,
                extra={"job_id": job_id},
            )

    async def _requeue_if_wiring(self, job: SliceJob, reason: str) -> None:
        keys = self.store.keys
        txn = self.store.txn()
        txn.expect_job(job.job_id, [WIRING], job.epoch)
        back = job.with_(
            state=job.queued_as,
            epoch=job.epoch + 1,
            placement=None,
            wiring_deadline_ms=0,
            not_before_ms=self.now_ms() + RETRY_BACKOFF_MS,
        )
        txn.hdel(keys.owner, job.held_keys())
        txn.write_job(back, old_state=WIRING, reason=reason, now_ms=self.now_ms())
        with contextlib.suppress(Conflict):
            await self.store.commit(txn)

    async def _wiring_failed(
        self, job: SliceJob, err: OcsError, *, counted: bool = False, rolled_back: bool = False
    ) -> None:
        """The blocks go back to the pool and the job says why (WS-2): back in the queue
        when the ocs_manager may accept later, FAILED when it refused for good. A
        `counted` failure (a wiring past its deadline) is retried MAX_WIRING_ATTEMPTS
        times at most, each with twice the deadline, never in an endless loop; a
        `rolled_back` one left nothing at the OCS."""
        keys = self.store.keys
        now = self.now_ms()
        attempts = job.attempts + 1
        if counted:
            retry = attempts < MAX_WIRING_ATTEMPTS
        else:
            retry = err.transient or (
                err.code.name == "FAILED_PRECONDITION" and attempts < MAX_WIRING_ATTEMPTS
            )
        txn = self.store.txn()
        txn.expect_job(job.job_id, [WIRING], job.epoch)
        txn.hdel(keys.owner, job.held_keys())
        if retry:
            new = job.with_(
                state=job.queued_as,
                epoch=job.epoch + 1,
                placement=None,
                wiring_deadline_ms=0,
                attempts=attempts,
                not_before_ms=now + RETRY_BACKOFF_MS * attempts,
            )
            reason = f"wiring failed, blocks returned, will retry: {err}"
        else:
            new = job.with_(state=FAILED, epoch=job.epoch + 1, placement=None, attempts=attempts)
            reason = f"wiring failed, blocks returned: {err}"
            if counted:
                reason += f" (gave up after {attempts} attempts)"
            if not err.transient:
                txn.unwire(job.job_id)  # the ocs_manager refused: nothing of it is wired
        if rolled_back:
            txn.unwire(job.job_id)  # rolled back at the OCS: nothing of it is wired
        txn.write_job(new, old_state=WIRING, reason=reason, now_ms=now)
        try:
            await self.store.commit(txn)
        except Conflict:
            return
        log = self.log.info if err.busy else self.log.warning
        log("job %s: %s", job.job_id, reason, extra={"job_id": job.job_id})
        self.schedule_soon()

    def schedule_soon(self) -> None:
        self._spawn(self.schedule(), "schedule")

    async def _release_at_ocs(self, job_id: str, *, wait_s: float | None = None) -> bool:
        """ReleaseSlice (ReleaseRings); False when there was none. While another call is
        changing the slice (ABORTED SLICE_BUSY: a release or wiring in progress) ask
        again once it ended, for `wait_s` (the call deadline) at most; then that call
        owns it."""
        limit = time.monotonic() + (self.ocs.timeout_s if wait_s is None else wait_s)
        delay = 0.05
        while True:
            try:
                return await self.ocs.release(job_id)
            except OcsError as err:
                if not err.busy or time.monotonic() > limit:
                    raise
                self.log.debug("job %s: %s; asking again", job_id, err, extra={"job_id": job_id})
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)

    async def _release(self, job_id: str, *, wait_s: float | None = None) -> None:
        """ReleaseSlice for a job this caller owns (final, or WIRING by us), then unmark."""
        await self._release_at_ocs(job_id, wait_s=wait_s)
        txn = self.store.txn()
        txn.unwire(job_id)
        await self.store.commit(txn)

    async def _release_claimed(self, job_id: str, *, wait_s: float | None = None) -> bool:
        """Release the leftover wiring of a job that is not wiring or running, holding a
        claim so that no replica places and wires that job meanwhile. False if it is live."""
        keys = self.store.keys
        token = f"{id(self)}-{self.now_ms()}"
        txn = self.store.txn()
        txn.expect_job(job_id, ["", PENDING, SUSPENDED, *FINAL_STATES])
        txn.set_px(keys.releasing(job_id), token, RELEASE_CLAIM_MS)
        try:
            await self.store.commit(txn)
        except Conflict:
            return False  # live again: its own wiring step releases what is left
        try:
            await self._release_at_ocs(job_id, wait_s=wait_s)
            txn = self.store.txn()
            txn.unwire(job_id)
            await self.store.commit(txn)
        finally:
            await self.store.redis.delete(keys.releasing(job_id))
        return True

    # == completion and cancel (WS-6) =============================================

    def _remember(self, record: JobRecord) -> None:
        if len(self._known) >= KNOWN_LIMIT:
            del self._known[next(iter(self._known))]
        self._known[record.job_id] = record

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
                return await self._finish(
                    record, CANCELLED, "cancelled" + (f": {reason}" if reason else "")
                )
            except Conflict:
                continue
        raise FailedPrecondition(f"job {job_id}", "kept changing; retry", reason="BUSY")

    async def _record(self, job_id: str, *, guess: bool = False) -> JobRecord:
        """The job as stored; with `guess`, as this replica last set it RUNNING if it did
        (the caller's commit checks it, and reads the job after a conflict)."""
        known = self._known.pop(job_id, None)
        if guess and known is not None:
            return known
        record = await self.store.job(job_id)
        if record is None:
            raise NotFound("job", job_id)
        return record

    async def _finish(self, record: JobRecord, final: str, reason: str) -> JobRecord:
        """End a job: free its blocks, remove its wiring, start queued work (¶114, ¶125)."""
        job = record.summary
        txn = self.store.txn()
        txn.expect_job(job.job_id, [record.state], record.epoch)
        held = job.held_keys() if record.state in HOLDING_STATES else []
        if held:
            txn.hdel(self.store.keys.owner, held)
        new = job.with_(state=final, epoch=record.epoch + 1)
        txn.write_job(new, old_state=record.state, reason=reason, now_ms=self.now_ms())
        txn.read_back(self.store.keys.state_counts, [PENDING, SUSPENDED])
        txn.read_job(job.job_id)
        counts, ended = await self.store.commit(txn)
        waiting = sum(int(n or 0) for n in counts)
        self.log.info("job %s %s", job.job_id, reason, extra={"job_id": job.job_id})
        if record.state in HOLDING_STATES or job.job_id in await self.store.wired_jobs():
            try:
                await self._release(job.job_id, wait_s=FINISH_RELEASE_WAIT_S)
            except OcsError as err:
                self._release_error(job.job_id, err)
        if waiting:
            await self.schedule()
        return ended

    # == failure and recovery (WS-5) ==============================================

    async def report_health(self, block: int, healthy: bool, reason: str) -> Outcome:
        if not 0 <= block < self.fabric.block_count:
            raise NotFound(
                "block", str(block), hint=f"this pod has blocks 0..{self.fabric.block_count - 1}"
            )
        keys = self.store.keys
        now = self.now_ms()
        txn = self.store.txn()
        txn.expect_health(block, "FAILED" if healthy else "HEALTHY")
        if healthy:
            txn.hdel(keys.failed, [block])
        else:
            txn.hset(keys.failed, {block: json.dumps({"at": now, "reason": reason})})
        txn.block_event(
            {
                "block": block,
                "health": "HEALTHY" if healthy else "FAILED",
                "at": now,
                "reason": reason,
            }
        )
        changed = True
        try:
            await self.store.commit(txn)
        except Conflict:
            changed = False  # already in that state: the report is idempotent
        if changed:
            self.log.info(
                "block %d %s: %s",
                block,
                "recovered" if healthy else "failed",
                reason,
                extra={"block": block},
            )
        if healthy:
            await self.schedule()
            return Outcome(
                action="block is healthy and back in the pool"
                if changed
                else "no change: block was healthy"
            )
        sharing: list[SliceJob] = []
        if self.fabric.switched is None:
            job = await self.store.holder(block)  # one read, whatever the live jobs
            owner = job.job_id if job is not None else None
        else:
            state = await self.snapshot()
            owner = state.owner.get(block)
            job = state.jobs.get(owner) if owner else None
            sharing = sorted(
                (
                    j
                    for j in state.jobs.values()
                    if j.tile and j.tile[0] == block and j.state == RUNNING
                ),
                key=SliceJob.queue_key,
            )
        if sharing:  # small jobs of a SWITCHED pod's shared group (SW-2, SW-5)
            outcome = Outcome()
            for small in sharing:
                done = await self.handle_failure(small.job_id, block)
                outcome.affected += done.affected
                outcome.action = "; ".join(a for a in (outcome.action, done.action) if a)
            return outcome
        if job is None:
            return Outcome(action="block marked failed; it held no slice")
        if job.state == WIRING:
            return Outcome(
                action=f"block marked failed; job {owner} is being wired and will get a "
                "replacement once it runs",
                affected=[],
            )
        return await self.handle_failure(job.job_id, block)

    async def handle_failure(self, job_id: str, failed: int) -> Outcome:
        """Keep a running slice alive through a failed block (Fig. 11, ¶126-132).

        Several failed blocks of one slice are swapped back to back (issue 15): while
        this replica swaps one, a report of another waits for that swap run, which takes
        the slice's next failed block as soon as the swap before is committed (it reads
        the failed blocks again each time, so blocks reported through another replica
        are included), instead of answering "already swapping" and leaving the block in
        the slice until a reconcile round."""
        while (run := self._swap_runs.get(job_id)) is not None:
            outcome = await run.outcome_of(failed)
            if outcome is not None:
                return outcome
        run = self._swap_runs[job_id] = _SwapRun()
        try:
            outcome = await self._handle_one(job_id, failed)
        except BaseException:
            self._end_swap_run(job_id, run)
            raise
        run.record(job_id, failed, outcome)
        self._spawn(self._continue_swap_run(job_id, run), f"swap {job_id}")
        return outcome

    async def _continue_swap_run(self, job_id: str, run: _SwapRun) -> None:
        """Swap the slice's other failed blocks, one after another, then end the run."""
        try:
            while True:
                state = await self._decision_state([job_id])
                job = state.jobs.get(job_id)
                if job is None or job.state != RUNNING or job.replacing or not job.placement:
                    return
                following = next((b for b in job.placement if b in state.failed), None)
                if following is None:
                    return
                run.record(job_id, following, await self._handle_one(job_id, following))
        finally:
            self._end_swap_run(job_id, run)

    def _end_swap_run(self, job_id: str, run: _SwapRun) -> None:
        if self._swap_runs.get(job_id) is run:
            del self._swap_runs[job_id]
        run.end()

    async def _decision_state(self, jobs: list[str], *, full: bool = False) -> PodState:
        """The lean snapshot naming `jobs` (issue 15), or the whole pod when asked or on
        a SWITCHED pod (its small jobs' processors are not indexed)."""
        if full or self.fabric.switched is not None:
            return await self.snapshot()
        state, _ = await self.store.lean_snapshot(self.fabric, jobs=jobs)
        return state

    async def _handle_one(self, job_id: str, failed: int) -> Outcome:
        full = False
        for _ in range(MAX_COMMIT_ATTEMPTS):
            state = await self._decision_state([job_id], full=full)
            job = state.jobs.get(job_id)
            if (
                job is None
                or job.state != RUNNING
                or not job.placement
                or failed not in job.placement
                or failed not in state.failed
            ):
                return Outcome(action=f"nothing to do for job {job_id}")
            if job.replacing:
                return Outcome(action=f"job {job_id} is already swapping a block")
            plan = plan_replacement(state, job, failed)
            if plan is None and state.partial:
                full = True  # no free spare: victims, or the slice's loss, need the whole pod
                continue
            try:
                if plan is None:
                    return await self._lose_slice(state, job, failed)
                return await self._replace(state, plan)
            except Conflict:
                full = True
                continue
        return Outcome(action=f"job {job_id}: state kept changing; the reconcile loop retries")

    async def _lose_slice(self, state: PodState, job: SliceJob, failed: int) -> Outcome:
        """No block to be had: SUSPENDED (requeued) or FAILED, as the job asked (WS-5)."""
        node_type = self.fabric.node_types[failed]
        final = job.on_block_failure == FAIL
        new = job.with_(
            state=FAILED if final else SUSPENDED,
            epoch=job.epoch + 1,
            placement=None,
            replacing=None,
        )
        if job.tile is not None:
            why = f"group {failed} failed under this small job; "
        else:
            why = (
                f"block {failed} failed and no healthy {node_type} block is free or held by "
                "lower-priority work; "
            )
        reason = why + ("failed as the job asked" if final else "suspended until blocks free")
        txn = self.store.txn()
        txn.expect_job(job.job_id, [RUNNING], job.epoch)
        txn.hdel(self.store.keys.owner, job.held_keys())
        txn.write_job(new, old_state=RUNNING, reason=reason, now_ms=self.now_ms())
        await self.store.commit(txn)
        self.log.warning("job %s: %s", job.job_id, reason, extra={"job_id": job.job_id})
        try:
            if final:
                await self._release(job.job_id, wait_s=FINISH_RELEASE_WAIT_S)
            else:
                await self._release_claimed(job.job_id, wait_s=FINISH_RELEASE_WAIT_S)
        except OcsError as err:
            self._release_error(job.job_id, err)
        await self.schedule()
        return Outcome(
            action=f"job {job.job_id} {new.state.lower()}: {reason}", affected=[job.job_id]
        )

    async def _replace(self, state: PodState, plan: Replacement) -> Outcome:
        job = plan.job
        assert job.placement is not None
        now = self.now_ms()
        keys = self.store.keys
        placement = list(job.placement)
        placement[plan.position_index] = plan.spare
        position = grid_positions(job.demand.grid)[plan.position_index]
        victim_ids = [v.job_id for v in plan.victims]
        txn = self.store.txn()
        txn.expect_job(job.job_id, [RUNNING], job.epoch)
        txn.expect_owner(plan.failed, [job.job_id])
        txn.expect_health(plan.failed, "FAILED")
        txn.expect_owner(plan.spare, ["", *victim_ids])
        txn.expect_health(plan.spare, "HEALTHY")
        txn.expect_wired_by(plan.spare, plan.release_first)
        shrunk = self._victim_transitions(txn, state, plan.victims, job, now)
        swapping = job.with_(
            epoch=job.epoch + 1,
            placement=tuple(placement),
            replacing=(plan.failed, plan.spare),
            wiring_deadline_ms=now + self.wiring_timeout_ms,
        )
        txn.hdel(keys.owner, [plan.failed])
        txn.hset(keys.owner, {plan.spare: job.job_id})
        reason = (
            f"block {plan.failed} failed; replacing it with block {plan.spare} at position "
            f"{_pos(position)}" + (f" taken from {', '.join(victim_ids)}" if victim_ids else "")
        )
        txn.write_job(swapping, old_state=RUNNING, reason=reason, now_ms=now)
        await self.store.commit(txn)
        self.log.info("job %s: %s", job.job_id, reason, extra={"job_id": job.job_id})
        outcome = Outcome(
            preempted=[_victim_json(v, state.jobs[v.job_id]) for v in plan.victims],
            affected=[job.job_id, *victim_ids],
        )
        err = await self._make_room(plan.release_first, set(), shrunk)
        if err is not None:
            return await self._replacement_failed(swapping, err, outcome)
        return await self._swap_at_ocs(swapping, position, outcome)

    async def _swap_at_ocs(
        self, swapping: SliceJob, position: tuple[int, ...], outcome: Outcome
    ) -> Outcome:
        assert swapping.replacing is not None
        failed, spare = swapping.replacing
        keys = self.store.keys
        txn = self.store.txn()
        txn.expect_job(swapping.job_id, [RUNNING], swapping.epoch)
        txn.expect_wired_by(spare, [swapping.job_id])
        txn.hset(keys.wired, {spare: swapping.job_id})
        try:
            await self.store.commit(txn)
        except Conflict as c:
            return Outcome(action=f"replacement of block {failed} stopped: {c}")
        try:
            result: ReplaceResult = await self.ocs.replace_job(swapping, failed, spare)
        except OcsError as err:
            return await self._replacement_failed(swapping, err, outcome)
        done = swapping.with_(epoch=swapping.epoch + 1, replacing=None, wiring_deadline_ms=0)
        reason = (
            f"block {failed} replaced by block {spare} at position {_pos(position)}: "
            f"{result.moved} {result.unit} moved, {result.untouched} untouched"
        )
        txn = self.store.txn()
        txn.expect_job(swapping.job_id, [RUNNING], swapping.epoch)
        txn.hdel(keys.wired, [failed])
        txn.write_job(done, old_state=RUNNING, reason=reason, now_ms=self.now_ms())
        try:
            await self.store.commit(txn)
        except Conflict:
            # Completed or cancelled meanwhile: its release removes the slice, and the
            # failed block's mark with it.
            return Outcome(action=f"block {failed} replaced, but the job ended meanwhile")
        self.log.info("job %s: %s", swapping.job_id, reason, extra={"job_id": swapping.job_id})
        outcome.action = reason
        outcome.replacement = {
            "job": swapping.job_id,
            "failed": failed,
            "new": spare,
            "position": list(position),
            "moved": result.moved,
            "untouched": result.untouched,
            "unit": result.unit,
        }
        return outcome

    async def _replacement_failed(
        self, swapping: SliceJob, err: OcsError, outcome: Outcome
    ) -> Outcome:
        """The OCS could not swap the block: the slice is lost like with no spare."""
        state = await self.snapshot()
        job = state.jobs.get(swapping.job_id)
        if job is None or job.state != RUNNING or job.epoch != swapping.epoch:
            return Outcome(action=f"replacement failed ({err}); the job changed meanwhile")
        assert swapping.replacing is not None
        res = await self._lose_slice(state, job, swapping.replacing[0])
        res.action = f"replacement failed ({err}); " + res.action
        res.preempted = outcome.preempted
        return res

    # == reconcile loop ===========================================================

    async def reconcile(self, *, full: bool = False) -> None:
        """One round of repairs any replica may do (idempotent, safe concurrently).

        A round that finds the pod as the last one left it (the same newest event, no
        deadline or backoff come due, no difference with the ocs_manager pending) does
        nothing more than read that event id, so an idle pod costs the same with 1,000
        live jobs as with none (issue 15). Every `full_every_ms` (and with `full`) a
        round reads everything anyway: changes that append no event (a mark a dead
        replica left, a slice released at the ocs_manager) are found that late at most."""
        now = self.now_ms()
        tip = await self.store.tip()
        if (
            not full
            and tip == self._quiet_tip
            and now < self._quiet_until_ms
            and now - self._last_full_ms < self.full_every_ms
        ):
            return
        state = await self.snapshot()
        due = now + self.full_every_ms  # when a time-based repair comes due, at the latest
        busy = False
        # Leftover wiring of jobs that no longer wire or run.
        for other in sorted(set(state.wired.values())):
            job = state.jobs.get(other)
            if job is None or job.state not in HOLDING_STATES:
                record = await self.store.job(other)
                if record is not None and now - record.updated_ms < STALE_WIRING_GRACE_MS:
                    # just ended: the call that ended it is releasing it
                    due = min(due, record.updated_ms + STALE_WIRING_GRACE_MS)
                    continue
                busy = True
                try:
                    await self._release_claimed(other, wait_s=0)
                except OcsError as err:
                    self._release_error(other, err)
        for job in list(state.jobs.values()):
            if job.state == WIRING and job.wiring_deadline_ms:
                if job.wiring_deadline_ms < now:
                    busy = True
                    await self._take_over_wiring(job)
                else:
                    due = min(due, job.wiring_deadline_ms + 1)
            elif job.state == RUNNING and job.replacing:
                if job.wiring_deadline_ms < now:
                    busy = True
                    await self._take_over_replacement(job)
                else:
                    due = min(due, job.wiring_deadline_ms + 1)
            elif job.not_before_ms > now:
                due = min(due, job.not_before_ms)  # a queued job's backoff ends
        for job, block in running_with_failed_blocks(state):
            busy = True
            await self.handle_failure(job.job_id, block)
        if await self._check_wiring():
            busy = True  # differences with the ocs_manager: look again next round
        if state.queue():
            await self.schedule()
        self._last_full_ms = now
        self._quiet_tip = None if busy else tip
        self._quiet_until_ms = due

    async def _check_wiring(self) -> bool:
        """Cross-service consistency (issue 14): compare RUNNING jobs with the
        ocs_manager's slices (consistency.py), report the differences (GetPod) and
        repair those that lasted STALE_WIRING_GRACE_MS: wire a RUNNING job whose slice
        vanished again on its blocks, release a slice of no wiring or running job.
        True while differences (or an unanswered ocs_manager) call for another look."""
        state = await self.snapshot()
        try:
            slices = await self.ocs.slices()
        except OcsError as err:
            log = self.log.debug if err.transient else self.log.warning
            log("cannot compare jobs with the ocs_manager's slices: %s", err)
            return True
        now = self.now_ms()
        confirmed = []
        for diff in wiring_differences(state, slices):
            # Read the job again: one that changed since the snapshot raced the listing.
            record = await self.store.job(diff.job_id)
            seen = state.jobs.get(diff.job_id)
            if diff.kind == MISSING:
                if record is None or seen is None or record.epoch != seen.epoch:
                    continue
            elif record is not None and (
                record.state in HOLDING_STATES or now - record.updated_ms < STALE_WIRING_GRACE_MS
            ):
                continue  # placed meanwhile, or just ended: the call ending it releases it
            confirmed.append((diff, record))
        before = await self.store.wiring_report()
        report = {
            d.key: {
                "job": d.job_id,
                "kind": d.kind,
                "detail": d.detail,
                "since": before.get(d.key, {}).get("since", now),
            }
            for d, _ in confirmed
        }
        if report or before:
            await self.store.save_wiring_report(report)
        for diff, record in confirmed:
            if now - report[diff.key]["since"] < STALE_WIRING_GRACE_MS:
                continue
            if diff.kind == MISSING and record is not None:
                await self._rewire(record.summary)
            elif diff.kind == ORPHANED:
                self.log.warning("releasing a slice of no live job: %s", diff.detail)
                try:
                    await self._release_claimed(diff.job_id, wait_s=0)
                except OcsError as err:
                    self._release_error(diff.job_id, err)
        return bool(report)

    async def _rewire(self, job: SliceJob) -> None:
        """A RUNNING job whose slice vanished at the ocs_manager (an operator's
        ReleaseSlice, say): WIRING again on the same blocks, then RUNNING; should that
        fail it goes back to the queue SUSPENDED (FAILED if the ocs_manager refuses it
        for good), like any wiring that fails."""
        assert job.placement is not None
        now = self.now_ms()
        mine = job.with_(
            state=WIRING,
            epoch=job.epoch + 1,
            wiring_deadline_ms=now + self.wiring_timeout_ms,
            queued_as=SUSPENDED,
            attempts=0,
        )
        reason = (
            "its slice vanished at the ocs_manager (released behind the scheduler's back); "
            "wiring it again on blocks " + ",".join(map(str, job.placement))
        )
        txn = self.store.txn()
        txn.expect_job(job.job_id, [RUNNING], job.epoch)
        for b in mine.held_keys():
            txn.expect_wired_by(b, [job.job_id])
        txn.hset(self.store.keys.wired, {b: job.job_id for b in mine.held_keys()})
        txn.write_job(mine, old_state=RUNNING, reason=reason, now_ms=now)
        try:
            await self.store.commit(txn)
        except Conflict:
            return
        self.log.warning("job %s: %s", job.job_id, reason, extra={"job_id": job.job_id})
        self._track_wiring(job.job_id, self._wire(mine, marked=True))

    async def _take_over_wiring(self, job: SliceJob) -> None:
        """A wiring whose replica went away: finish it if the OCS has it, else requeue."""
        mine = job.with_(
            epoch=job.epoch + 1, wiring_deadline_ms=self.now_ms() + self.wiring_timeout_ms
        )
        txn = self.store.txn()
        txn.expect_job(job.job_id, [WIRING], job.epoch)
        txn.write_job(
            mine, old_state=WIRING, reason="wiring taken over after a timeout", now_ms=self.now_ms()
        )
        try:
            await self.store.commit(txn)
        except Conflict:
            return
        self.log.warning("job %s: taking over a wiring that timed out", job.job_id)
        try:
            found = await self.ocs.wiring(job.job_id)
            if found is not None and found.blocks != mine.placement:
                await self._release(job.job_id)
                found = None
            elif found is not None and not found.committed:
                found = None  # still being programmed: WireSlice again finishes or replays it
        except OcsError as err:
            await self._wiring_failed(mine, err)
            return
        if found is None:
            self._track_wiring(job.job_id, self._wire(mine))
            return
        txn = self.store.txn()
        txn.expect_job(job.job_id, [WIRING], mine.epoch)
        txn.hset(self.store.keys.wired, {b: job.job_id for b in mine.held_keys()})
        txn.write_job(
            mine.with_(state=RUNNING, epoch=mine.epoch + 1, wiring_deadline_ms=0),
            old_state=WIRING,
            reason=f"wired by the ocs_manager: {found.describe()}",
            now_ms=self.now_ms(),
        )
        with contextlib.suppress(Conflict):
            await self.store.commit(txn)

    async def _take_over_replacement(self, job: SliceJob) -> None:
        assert job.replacing is not None and job.placement is not None
        failed, spare = job.replacing
        mine = job.with_(
            epoch=job.epoch + 1, wiring_deadline_ms=self.now_ms() + self.wiring_timeout_ms
        )
        txn = self.store.txn()
        txn.expect_job(job.job_id, [RUNNING], job.epoch)
        txn.write_job(
            mine,
            old_state=RUNNING,
            reason="block swap taken over after a timeout",
            now_ms=self.now_ms(),
        )
        try:
            await self.store.commit(txn)
        except Conflict:
            return
        position = grid_positions(job.demand.grid)[job.placement.index(spare)]
        try:
            found = await self.ocs.wiring(job.job_id)
        except OcsError as err:
            await self._replacement_failed(mine, err, Outcome())
            return
        if (
            found is not None
            and found.committed
            and spare in found.blocks
            and failed not in found.blocks
        ):
            done = mine.with_(epoch=mine.epoch + 1, replacing=None, wiring_deadline_ms=0)
            txn = self.store.txn()
            txn.expect_job(job.job_id, [RUNNING], mine.epoch)
            txn.hdel(self.store.keys.wired, [failed])
            txn.hset(self.store.keys.wired, {spare: job.job_id})
            txn.write_job(
                done,
                old_state=RUNNING,
                reason=f"block {failed} replaced by block {spare}",
                now_ms=self.now_ms(),
            )
            with contextlib.suppress(Conflict):
                await self.store.commit(txn)
            return
        await self._swap_at_ocs(mine, position, Outcome())

    async def run_reconciler(self, interval_s: float) -> None:
        """Reconcile rounds for ever (a supervised task: a failed round restarts it).
        A round reads everything every FULL_ROUND_EVERY rounds (1 to 10 s) at least."""
        self.full_every_ms = int(
            1000 * min(FULL_ROUND_MAX_S, max(FULL_ROUND_MIN_S, FULL_ROUND_EVERY * interval_s))
        )
        while True:
            await self.reconcile()
            await asyncio.sleep(interval_s)

    # == events (WS-7) ============================================================

    async def watch_job(self, job_id: str) -> AsyncIterator[dict[str, Any]]:
        """The job's stored transitions, then live ones until it ends."""
        redis = self.store.redis
        keys = self.store.keys
        tip = await _stream_tip(redis, keys.events)
        record = await self.store.job(job_id, history=True)
        if record is None:
            raise NotFound("job", job_id)
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
            yield event
            if event["to"] in FINAL_STATES:
                return

    async def watch_pod(self) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        redis = self.store.redis
        tip = await _stream_tip(redis, self.store.keys.events)
        async for _, fields in _tail(redis, self.store.keys.events, tip):
            yield fields.get("kind", "job"), json.loads(fields["e"])


def _pos(position: tuple[int, ...]) -> str:
    return "(" + ",".join(map(str, position)) + ")"


def _victim_json(v: VictimAction, job: SliceJob) -> dict[str, Any]:
    return {
        "job": v.job_id,
        "action": v.action,
        "blocks": list(v.freed),
        "grid": list(v.shrink_grid) if v.shrink_grid else [],
        "priority": job.priority,
    }


async def _stream_tip(redis, key: str) -> str:
    last = await redis.xrevrange(key, count=1)
    return last[0][0] if last else "0-0"


async def _tail(redis, key: str, after: str) -> AsyncIterator[tuple[str, dict[str, str]]]:
    """Entries of a stream after id `after`, forever (blocking reads of 1 s)."""
    cursor = after
    while True:
        got = await redis.xread({key: cursor}, block=1000, count=100)
        for _stream, entries in got or []:
            for entry_id, fields in entries:
                cursor = entry_id
                yield entry_id, fields
