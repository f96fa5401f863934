"""Admission and the queue (WS-2, WS-4, WS-6): a pass over the queue decides on a
snapshot (the lean one first, issue 15) and commits each allocation with its checks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from typing import Any

from lightpath.domain.jobs import NormalizedSpec
from lightpath.domain.slices import (
    DELAY,
    FAIL,
    FAILED,
    PENDING,
    PREEMPTED,
    RUNNING,
    SUB_BLOCK_OWNER,
    SUSPENDED,
    TERMINATE,
    WIRING,
    SliceJob,
    box_chips,
    chip_keys,
    describe_box,
)
from lightpath.errors import (
    WIRING_FAILED,
    FailedPrecondition,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from lightpath.v1 import workload_scheduler_pb2
from lightpath_services.common.admission import POD_BUSY
from lightpath_services.common.txn import STALE_LEASE
from lightpath_services.workload_scheduler.core import (
    BUSY_WAIT_S,
    MAX_COMMIT_ATTEMPTS,
    AdmitResult,
    Part,
    PassTimes,
    PodContext,
    _Admission,
    _b64,
    _victim_json,
    job_event_after,
)
from lightpath_services.workload_scheduler.placement import PodState, Unplaceable
from lightpath_services.workload_scheduler.planner import (
    Allocation,
    apply_allocation,
    plan_pass,
)
from lightpath_services.workload_scheduler.store import Conflict, JobRecord, Txn
from lightpath_services.workload_scheduler.wiring import WIRING_RETRY, Wirer

# How often a job that asked not to wait, found PENDING after its pass, is refused
# again before it is answered as it stands (`admit`).
REFUSE_ATTEMPTS = 3


class Admission(Part):
    """Admitting jobs and the passes over the queue; their wirings go to `wiring`."""

    def __init__(self, pod: PodContext, wiring: Wirer):
        super().__init__(pod)
        self.wiring = wiring
        self._pass_lock = asyncio.Lock()
        self._pass_started = 0
        self._pass_done = 0
        self._passes = PassTimes()

    # == admission (WS-2) ========================================================

    async def admit(
        self,
        spec: workload_scheduler_pb2.JobSpec,
        norm: NormalizedSpec,
        *,
        validate_only: bool,
        reclaim: frozenset[str] | None = None,
        forward_token: int = 0,
    ) -> AdmitResult:
        """Admit a job; answers once it is RUNNING, queued or refused (WS-2, WS-4).
        `reclaim`: the only running jobs it may preempt, whatever their priority.
        `forward_token`: the cell's forward (fencing, issue 32): refused when the pod was
        sent a newer one for the job; the job is stored only with a token no older than
        every one recorded (checked in the commit that stores it)."""
        spec_b64 = _b64(spec.SerializeToString(deterministic=True))
        await self._check_forward(norm.job_id, forward_token)
        if validate_only:
            return await self._dry_run(spec_b64, norm)
        started = time.monotonic()
        if norm.when_no_capacity == FAIL:
            await self._unless_busy(norm.job_id, started)
        admission = _Admission(spec_b64, norm, spec, reclaim=reclaim, forward_token=forward_token)
        self._passes.waiting += 1
        try:
            await self._pass_lock.acquire()
        finally:
            self._passes.waiting -= 1
        try:
            # A pass over the queue with the new job in it: the job's creation commits
            # with its allocation when the pass places it (one snapshot, one commit).
            self._pass_started += 1
            generation = self._pass_started
            with self._passes.timed():
                try:
                    await self._pass(admission)
                except FailedPrecondition:  # a stale forward or a reused id: another pass
                    # places the rest of the queue
                    self.schedule_soon()
                    raise
                finally:
                    self._pass_done = generation
        finally:
            self._pass_lock.release()
        if admission.created is None:  # the pass gave up before the job was stored
            admission.created = await self._create(admission)
            await self.schedule()
        created = admission.created
        record = await self._settled(norm.job_id)
        # A job that asked not to wait is never answered PENDING (left so, it would be
        # placed later and hold blocks its caller, told "not running", never ends): it
        # is refused, or it was placed meanwhile and is answered as its wiring ended.
        # Once is not enough (issue 30: the bench saw such answers): placed by the other
        # replica's pass while this one looked, its wiring may fail and leave it back
        # PENDING when read again.
        for _ in range(REFUSE_ATTEMPTS):
            if record.state != PENDING or norm.when_no_capacity != FAIL:
                break
            await self._refuse(record)
            record = await self._settled(norm.job_id)
        if record.state == PENDING and norm.when_no_capacity == FAIL:
            self.log.warning(
                "job %s asked not to wait and is still PENDING after %d refusals were "
                "tried (the pod kept changing); it stays queued",
                norm.job_id,
                REFUSE_ATTEMPTS,
                extra={"job_id": norm.job_id},
            )
        self.metrics.admitted(self.pod_id, record.state, started)
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
            degrees=self.planner.degrees(norm),
            submitted_ms=self.now_ms(),
        )

    def _store_new(self, txn: Txn, job: SliceJob, admission: _Admission, now: int) -> None:
        """Checks and writes that store a new job PENDING in the queue (first: its forward
        is the cell's newest, Conflict STALE_LEASE if not)."""
        txn.fence(self.store.keys.forwards, job.job_id, admission.forward_token)
        txn.expect_no_job(job.job_id)
        txn.delete(self.store.keys.released(job.job_id))  # admitted again (issue 35)
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

    async def _create(self, admission: _Admission) -> bool:
        """Store the job PENDING in the queue; False if the same request was already
        admitted. FailedPrecondition STALE_LEASE: the cell sent a newer forward of it."""
        norm = admission.norm
        seq = await self.store.next_seq()
        now = self.now_ms()
        job = self._new_job(norm, seq)
        txn = self.store.txn()
        self._store_new(txn, job, admission, now)
        try:
            await self.store.commit(txn)
        except Conflict as c:
            if c.reason == STALE_LEASE:
                raise self._stale_forward(norm.job_id, admission.forward_token, c.value) from None
            existing = await self.store.job(norm.job_id)
            if existing is None:  # admitted and refused (WHEN_NO_CAPACITY_FAIL) meanwhile
                return await self._create(admission)
            if existing.submitted_b64 != admission.spec_b64:
                raise FailedPrecondition(
                    f"job {norm.job_id}",
                    "already exists with a different request; choose a new job id",
                    reason="JOB_ID_REUSED",
                ) from None
            return False
        self._log_admitted(job)
        return True

    async def fence_forward(self, job_id: str, token: int) -> None:
        """A cell replica taking over a forward of the job (GetJobRequest.forward_token):
        from now on an older forward is refused; FailedPrecondition STALE_LEASE when the
        pod was sent a newer one."""
        try:
            await self.store.fence_forward(job_id, token)
        except Conflict as c:
            raise self._stale_forward(job_id, token, c.value) from None

    async def _check_forward(self, job_id: str, token: int) -> None:
        """Refuse a forward older than one the cell sent for the job (nothing changes);
        the commit that stores the job checks it again."""
        if token:
            newest = await self.store.forward_token(job_id)
            if newest > token:
                raise self._stale_forward(job_id, token, newest)

    def _stale_forward(self, job_id: str, token: int, newest: Any) -> FailedPrecondition:
        """A forward the cell has since taken over (counted: fencing, issue 32)."""
        self.metrics.stale_forward_refused(self.pod_id)
        self.log.warning(
            "job %s: refused a stale forward (token %d; the cell sent %s since)",
            job_id,
            token,
            newest,
            extra={"job_id": job_id},
        )
        return FailedPrecondition(
            "forward_token",
            f"{token} is older than {newest}, the newest forward of job {job_id} this pod "
            "was sent (another cell replica took the forward over); nothing was admitted",
            reason=STALE_LEASE,
        )

    async def _settled(self, job_id: str) -> JobRecord:
        """The job once no wiring of it is in flight (bounded by the wiring timeout)."""
        deadline = time.monotonic() + self.wiring_timeout_ms / 1000
        while True:
            task = self.wiring.tasks.get(job_id)
            if task is not None:
                with contextlib.suppress(Exception):
                    done = await asyncio.shield(task)
                    if isinstance(done, JobRecord) and done.job_id == job_id:
                        return done  # as the RUNNING commit left it
            tip = await self.store.tip()
            record = await self.store.job(job_id, history=True)
            if record is None:
                raise NotFound("job", job_id)
            if record.state != WIRING or time.monotonic() > deadline:
                return record
            # Wired by another replica: until the job's next transition.
            await job_event_after(self.store, job_id, tip, deadline - time.monotonic())

    async def _unless_busy(self, job_id: str, started: float) -> None:
        """A job that asked not to wait is refused at once, with nothing stored, when the
        admissions ahead of it would hold its caller longer than BUSY_WAIT_S (issue 30:
        a submit that cannot be placed soon is answered, not held; the calls accepted
        stay fast). Not a job the pod has already: its admission answers as it stands."""
        wait_s = self._passes.wait_s(self._pass_lock.locked())
        if wait_s <= BUSY_WAIT_S or await self.store.job(job_id) is not None:
            return
        self.metrics.admitted(self.pod_id, "BUSY", started)  # counted as refused
        raise ResourceExhausted(
            f"job {job_id} was not admitted and asked not to wait: pod {self.pod_id} is "
            f"busy ({self._passes.waiting} admissions ahead, about {wait_s:.1f} s); "
            "nothing was kept",
            reason=POD_BUSY,
            retry_delay_s=round(wait_s * (1.0 + 0.5 * random.random()), 3),
        )

    async def _refuse(self, record: JobRecord) -> None:
        """WHEN_NO_CAPACITY_FAIL: the job could not be placed → forget it, RESOURCE_EXHAUSTED;
        it was placed but its wiring failed (a switch, the ocs_manager) → forget it,
        UNAVAILABLE with what failed (retryable: the pod has the room)."""
        state = await self.snapshot()
        job = state.jobs.get(record.job_id)
        if job is None or job.state != PENDING:
            return
        wiring = record.reason.removeprefix(WIRING_RETRY) if job.attempts else ""
        if wiring and wiring != record.reason:
            reason = f"it was placed but its wiring failed: {wiring}"
        else:
            wiring = ""
            found = self.planner.admit(state, job)
            reason = found.reason if isinstance(found, Unplaceable) else "the pod is busy"
        txn = self.store.txn()
        txn.expect_job(job.job_id, [PENDING], job.epoch)
        txn.forget(
            job.job_id,
            PENDING,
            {"to": FAILED, "at": self.now_ms(), "reason": f"refused (asked not to wait): {reason}"},
        )
        try:
            await self.store.commit(txn)
        except Conflict:
            return  # placed meanwhile by another pass
        if wiring:
            # UNAVAILABLE (a switch failed: retryable, issue 34) with reason WIRING_FAILED,
            # which says the pod has forgotten the job: the cell takes it as a refusal, not
            # as "it may still be held here" (services/lightpath_services/cell_scheduler/podclient.py). Final:
            # no channel repeats it on its own, as a repeat would admit the forgotten job
            # anew (the chaos test caught the cell failing a job the pod then ran).
            failed = Unavailable(
                f"job {job.job_id} was not wired and asked not to wait: {reason}; nothing "
                "is kept (retry when the switch answers)",
                reason=WIRING_FAILED,
            )
            failed.final = True
            raise failed
        raise ResourceExhausted(
            f"job {job.job_id} cannot be placed now and asked not to wait: {reason}",
            reason="NO_CAPACITY",
        )

    async def _dry_run(self, spec_b64: str, norm: NormalizedSpec) -> AdmitResult:
        existing = await self.store.job(norm.job_id)
        if existing is not None:
            if existing.submitted_b64 != spec_b64:
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
            (
                d
                for d in plan_pass(state, self.now_ms(), self.age_bound_ms, self.planner.admit)
                or ()
                if d.job.job_id == job.job_id
            ),
            None,
        )
        now = self.now_ms()
        if decision is not None:
            placed = job.with_(state=WIRING, placement=decision.placement, offset=decision.offset)
            record = JobRecord(job.job_id, spec_b64, WIRING, 0, "", placed, now, now)
            if placed.offset is not None:
                outcome = "placed on " + describe_box(placed)
            else:
                outcome = "placed on blocks " + ",".join(map(str, decision.placement))
            if decision.victims:
                outcome += " by preempting " + ", ".join(
                    f"{v.job_id} ({v.action.lower()})" for v in decision.victims
                )
            preempted = tuple(_victim_json(v, state.jobs[v.job_id]) for v in decision.victims)
            return AdmitResult(record, True, outcome, preempted)
        found = self.planner.admit(state, job)
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

    def schedule_soon(self) -> None:
        self._spawn(self.schedule(), "schedule")

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
            with self._passes.timed():
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
        lean = self.planner.lean
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
                    admission.created = await self._create(admission)
                    continue
                new = self._new_job(admission.norm, int(seq))
                if admission.reclaim:
                    new = new.with_(reclaimed_from=tuple(sorted(admission.reclaim)))
                state.jobs[new.job_id] = new
            now = self.now_ms()
            named = (
                {admission.norm.job_id: admission.reclaim}
                if admission is not None and admission.reclaim is not None
                else None
            )
            found = plan_pass(state, now, self.age_bound_ms, self.planner.admit, named)
            if found is None:  # a job needs more than free blocks: decide on the whole pod
                lean = False
                state = await self.snapshot()
                if new is not None:
                    state.jobs.setdefault(new.job_id, new)
                found = plan_pass(state, now, self.age_bound_ms, self.planner.admit, named)
            assert found is not None
            decisions = found
            if not decisions and new is None:
                self.wiring.queue_waiting = bool(state.queue())
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
                    if c.reason == STALE_LEASE:  # the new job's forward was taken over
                        raise self._stale_forward(
                            new.job_id, admission.forward_token, c.value
                        ) from None
                    # The job may exist already (a retry, or another replica): as the
                    # store says; the next round of this pass then places it if it can.
                    admission.created = await self._create(admission)
                continue
            # Jobs left waiting may be placeable once the slices now wiring run (and so
            # become preemptible): the wirings then ask for another pass.
            self.wiring.queue_waiting = bool(work.queue())
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

    def victim_transitions(
        self, txn: Txn, state: PodState, victims, preemptor: SliceJob, now: int
    ) -> list[SliceJob]:
        """Checks and writes for the victims of a preemption; the shrunk ones to rewire."""
        shrunk = []
        for v in victims:
            vj = state.jobs[v.job_id]
            txn.expect_job(v.job_id, [RUNNING], vj.epoch)
            why = f"blocks taken by {preemptor.job_id} (priority {preemptor.priority} > {vj.priority})"
            if vj.priority == preemptor.priority:  # the age bound (planner.plan_pass)
                why = (
                    f"blocks taken by {preemptor.job_id}, of its priority and in the pod "
                    "before it, past the queue's age bound"
                )
            reclaimed = v.job_id in preemptor.reclaimed_from
            if reclaimed:
                why = f"blocks reclaimed for {preemptor.job_id}: its tenant took back quota it had lent"
            txn.hdel(self.store.keys.owner, list(v.freed))
            if v.action == DELAY and reclaimed:
                # Back to the cell queue, not this pod's: its tenant's quota is given back
                # there and the cell may place it on any pod (Kueue's requeue, issue 35).
                txn.release_to_cell(
                    vj,
                    reason=f"{why}; released to the cell queue, it resumes from its "
                    "checkpoint when placed again",
                    now_ms=now,
                )
                continue
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
            txn.write_job(new, old_state=RUNNING, reason=reason, now_ms=now)
        return shrunk

    def box_checks(
        self, txn: Txn, job: SliceJob, victim_ids: list[str], release_first: tuple[str, ...]
    ) -> None:
        """What placing a sub-block slice's box assumed: its block not failed as a whole
        and given over to sub-block slices (or free, or a victim's), unwired unless by a
        victim about to be released, and every host under the box healthy."""
        assert job.placement is not None and job.offset is not None and job.demand.box
        block = job.placement[0]
        txn.expect_not_whole_failed(block)
        txn.expect_owner(block, ["", SUB_BLOCK_OWNER, *victim_ids])
        txn.expect_wired_by(block, release_first)
        for host in sorted({self.fabric.host_of(c) for c in box_chips(job.offset, job.demand.box)}):
            txn.expect_host_health(block, host, "HEALTHY")

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
            offset=alloc.offset,
            wiring_deadline_ms=now + self.wiring_timeout_ms,
            queued_as=job.state,
        )
        # the blocks, a small job's processors (SWITCHED pods) or a sub-block slice's chips
        held = new.held_keys()
        if new.offset is not None:
            self.box_checks(txn, new, victim_ids, alloc.release_first)
        else:
            for b in alloc.placement:
                txn.expect_health(b, "HEALTHY")
        # Blocks whose sub-block slices are all victims (preemption.py): every chip of
        # them free or a victim's, so no slice placed there meanwhile is run over.
        split = {b for b in alloc.placement if state.owner.get(b) == SUB_BLOCK_OWNER}
        for b in held:
            txn.expect_owner(b, ["", *victim_ids, *([SUB_BLOCK_OWNER] if b in split else [])])
            if new.offset is None:
                txn.expect_wired_by(b, alloc.release_first)
        for b in sorted(split) if new.offset is None else ():
            for chip in chip_keys(b, (0,) * self.fabric.dims, self.fabric.block_shape):
                txn.expect_owner(chip, ["", *victim_ids])
        shrunk = self.victim_transitions(txn, state, alloc.victims, job, now)
        if new.offset is not None:
            txn.hset(keys.owner, {alloc.placement[0]: SUB_BLOCK_OWNER})
        txn.hset(keys.owner, {b: job.job_id for b in held})
        if not alloc.release_first and new.offset is None:
            # Nothing to release first: mark the blocks as (about to be) wired right away.
            txn.hset(keys.wired, {b: job.job_id for b in held})
        preempted = [_victim_json(v, state.jobs[v.job_id]) for v in alloc.victims]
        if preempted:
            txn.hset(keys.job(job.job_id), {"preempted": json.dumps(preempted)})
        if new.offset is not None:
            reason = "placed on " + describe_box(new)
        else:
            reason = "placed on blocks " + ",".join(map(str, alloc.placement))
        if alloc.victims:
            reason += " after preempting " + ", ".join(victim_ids)
        txn.write_job(new, old_state=job.state, reason=reason, now_ms=now)
        await self.store.commit(txn)
        self.metrics.preempted(self.pod_id, alloc.victims)
        if admission is not None:
            admission.created = True
            self._log_admitted(job)
        log = self.log.info if alloc.victims else self.log.debug
        log("job %s: %s", job.job_id, reason, extra={"job_id": job.job_id})
        return self.wiring.track(job.job_id, self.wiring.wire_allocation(alloc, new, shrunk))
