"""Wiring at the ocs_manager and releasing (WS-2, WS-8): mark, WireSlice, follow a
WireSlice past its deadline through, record progress, undo a failed wiring."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from typing import Any

import grpc

from lightpath.domain.slices import (
    FAILED,
    FINAL_STATES,
    HOLDING_STATES,
    PENDING,
    RUNNING,
    SUSPENDED,
    WIRING,
    SliceJob,
    describe_box,
)
from lightpath_services.workload_scheduler.core import (
    KNOWN_LIMIT,
    MAX_WIRING_ATTEMPTS,
    RELEASE_CLAIM_MS,
    RETRY_BACKOFF_MS,
    WIRING_PROGRESS_S,
    WIRING_TAKEN_OVER,
    Part,
    PodContext,
    WiringRolledBack,
)
from lightpath_services.workload_scheduler.ocs import OcsError, Wiring, job_lease
from lightpath_services.workload_scheduler.planner import (
    Allocation,
)
from lightpath_services.workload_scheduler.store import Conflict, JobRecord

# The reason of a job back in the queue after its wiring failed at the switches (or the
# ocs_manager): an admission that asked not to wait answers it as UNAVAILABLE.
WIRING_RETRY = "wiring failed, blocks returned, will retry: "


class Wirer(Part):
    """Wiring this replica's jobs at the ocs_manager and releasing them. It asks for a
    pass over the queue (`schedule_soon`, the admission's) when capacity may be had."""

    def __init__(self, pod: PodContext, *, schedule_soon: Callable[[], None]):
        super().__init__(pod)
        self.schedule_soon = schedule_soon
        self._progress_s = min(WIRING_PROGRESS_S, pod.wiring_timeout_s / 3)
        # Wirings in flight, by job: an admission of the same job awaits its own.
        self.tasks: dict[str, asyncio.Task] = {}
        # The last pass left jobs waiting: a wiring that ends asks for another pass.
        self.queue_waiting = False
        # The record as this replica's RUNNING commit left it: complete / cancel start from
        # it instead of reading the job. Only a guess: their commit checks state and epoch,
        # and on a conflict they read the job as it is.
        self.known: dict[str, JobRecord] = {}

    def remember(self, record: JobRecord) -> None:
        if len(self.known) >= KNOWN_LIMIT:
            del self.known[next(iter(self.known))]
        self.known[record.job_id] = record

    def track(self, job_id: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Wire in the background; an admission of the same job awaits it (`Admission._settled`)."""
        task = self._spawn(coro, f"wire {job_id}")
        self.tasks[job_id] = task

        def done(_t: asyncio.Task) -> None:
            if self.tasks.get(job_id) is task:
                del self.tasks[job_id]

        task.add_done_callback(done)
        return task

    async def wire_allocation(
        self, alloc: Allocation, job: SliceJob, shrunk: list[SliceJob]
    ) -> JobRecord | None:
        err = await self.make_room(alloc.release_first, {job.job_id}, shrunk)
        if err is not None:
            await self.wiring_failed(job, err)
            return None
        return await self.wire(job, marked=not alloc.release_first)

    async def make_room(
        self, release_first: tuple[str, ...], owned: set[str], shrunk: list[SliceJob]
    ) -> OcsError | None:
        """Release the leftover and victims' wiring on the blocks about to be used, then
        rewire the shrunk victims; the ocs_manager's error if a release failed."""
        owned = owned | {s.job_id for s in shrunk}
        try:
            for other in release_first:
                if other in owned:
                    await self.release(other)
                else:
                    await self.release_claimed(other)
        except OcsError as err:
            for s in shrunk:
                await self.wiring_failed(s, err)
            return err
        for s in shrunk:
            await self.wire(s)
        return None

    async def wire(self, job: SliceJob, *, marked: bool = False) -> JobRecord | None:
        """Mark, wire at the OCS, commit RUNNING (job is WIRING at job.epoch, owned by us)."""
        assert job.placement is not None
        if job.offset is not None:
            return await self._run_box(job)
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
        started = time.monotonic()
        job, outcome = await self._wire_at_ocs(job)
        self.metrics.wired(started)
        if isinstance(outcome, OcsError):
            await self.wiring_failed(
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
        self.remember(record)
        self.log.info(
            "job %s running on %d blocks",
            job.job_id,
            len(job.placement or ()),
            extra={"job_id": job.job_id, "cross_connects": wiring.cross_connects},
        )
        # A block that failed while the slice was being wired is swapped by the
        # reconcile loop (running_with_failed_blocks), like any missed replacement.
        if self.queue_waiting:
            self.schedule_soon()
        return record

    async def _run_box(self, job: SliceJob) -> JobRecord | None:
        """A sub-block slice runs on its block's electrical links: RUNNING with no OCS
        change (issue 28)."""
        txn = self.store.txn()
        txn.expect_job(job.job_id, [WIRING], job.epoch)
        running = job.with_(
            state=RUNNING, epoch=job.epoch + 1, wiring_deadline_ms=0, attempts=0, not_before_ms=0
        )
        txn.write_job(
            running,
            old_state=WIRING,
            reason=f"running on {describe_box(job)}: a mesh on the block's own links, "
            "no OCS change",
            now_ms=self.now_ms(),
        )
        txn.read_job(job.job_id)
        try:
            (record,) = await self.store.commit(txn)
        except Conflict:
            return None  # cancelled or changed meanwhile: its own path freed the chips
        self.remember(record)
        self.log.info(
            "job %s running on %s", job.job_id, describe_box(job), extra={"job_id": job.job_id}
        )
        if self.queue_waiting:
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
        record = await self.store.job(job.job_id, history=True)
        self._count_if_taken_over(job, record)
        if (
            record is not None
            and record.state in HOLDING_STATES
            and record.summary.placement == job.placement
        ):
            return  # another replica finished the same wiring
        try:
            if record is None or record.state in FINAL_STATES:
                # our hold on it: refused if a replica took the job over and wired it
                await self.release(job.job_id, lease=job_lease(job))
            else:
                await self.release_claimed(job.job_id)
        except OcsError as err:
            self.release_error(job.job_id, err)
        self.schedule_soon()

    def _count_if_taken_over(self, job: SliceJob, record: JobRecord | None) -> None:
        """Count this replica's commit of `job`'s wiring, just refused, as stale when the
        job was taken over after this replica's wiring lease ran out (a take-over's event
        past `job.wiring_deadline_ms` in `record`'s history), whatever became of it
        since; not when a cancel, say, ended the wiring while the lease held."""
        if record is None or not job.wiring_deadline_ms:
            return
        if any(
            e.get("reason") == WIRING_TAKEN_OVER and int(e.get("at", 0)) >= job.wiring_deadline_ms
            for e in record.history
        ):
            self.metrics.stale_commit_refused(self.pod_id)
            self.log.info(
                "job %s: commit refused, its wiring was taken over after this replica's "
                "lease ran out (now %s at epoch %d)",
                job.job_id,
                record.state,
                record.epoch,
                extra={"job_id": job.job_id},
            )

    def release_error(self, job_id: str, err: OcsError) -> None:
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
        txn = self.store.txn()
        txn.expect_job(job.job_id, [WIRING], job.epoch)
        back = job.with_(
            state=job.queued_as,
            epoch=job.epoch + 1,
            placement=None,
            wiring_deadline_ms=0,
            not_before_ms=self.now_ms() + RETRY_BACKOFF_MS,
        )
        txn.release_held(job, self.fabric.block_shape)
        txn.write_job(back, old_state=WIRING, reason=reason, now_ms=self.now_ms())
        with contextlib.suppress(Conflict):
            await self.store.commit(txn)

    async def wiring_failed(
        self, job: SliceJob, err: OcsError, *, counted: bool = False, rolled_back: bool = False
    ) -> None:
        """The blocks go back to the pool and the job says why (WS-2): back in the queue
        when the ocs_manager may accept later, FAILED when it refused for good. A
        `counted` failure (a wiring past its deadline) is retried MAX_WIRING_ATTEMPTS
        times at most, each with twice the deadline, never in an endless loop; a
        `rolled_back` one left nothing at the OCS."""
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
        txn.release_held(job, self.fabric.block_shape)
        if retry:
            new = job.with_(
                state=job.queued_as,
                epoch=job.epoch + 1,
                placement=None,
                wiring_deadline_ms=0,
                attempts=attempts,
                not_before_ms=now + RETRY_BACKOFF_MS * attempts,
            )
            reason = f"{WIRING_RETRY}{err}"
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
            self._count_if_taken_over(job, await self.store.job(job.job_id, history=True))
            return
        log = self.log.info if err.busy else self.log.warning
        log("job %s: %s", job.job_id, reason, extra={"job_id": job.job_id})
        self.schedule_soon()

    async def _release_at_ocs(
        self, job_id: str, *, wait_s: float | None = None, lease: tuple[str, int] | None = None
    ) -> bool:
        """ReleaseSlice (ReleaseRings); False when there was none. While another call is
        changing the slice (ABORTED SLICE_BUSY: a release or wiring in progress) ask
        again once it ended, for `wait_s` (the call deadline) at most; then that call
        owns it."""
        limit = time.monotonic() + (self.ocs.timeout_s if wait_s is None else wait_s)
        delay = 0.05
        while True:
            try:
                return await self.ocs.release(job_id, lease=lease)
            except OcsError as err:
                if not err.busy or time.monotonic() > limit:
                    raise
                self.log.debug("job %s: %s; asking again", job_id, err, extra={"job_id": job_id})
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)

    async def release(
        self, job_id: str, *, wait_s: float | None = None, lease: tuple[str, int] | None = None
    ) -> None:
        """ReleaseSlice for a job this caller owns (final, or WIRING by us), then unmark;
        `lease` (job_lease of the job as this caller holds it) fences the release."""
        await self._release_at_ocs(job_id, wait_s=wait_s, lease=lease)
        txn = self.store.txn()
        txn.unwire(job_id)
        await self.store.commit(txn)

    async def release_claimed(self, job_id: str, *, wait_s: float | None = None) -> bool:
        """Release the leftover wiring of a job that is not wiring or running, holding a
        claim so that no replica places and wires that job meanwhile. False if it is live.
        The release carries the job's lease as the claim read it (job_lease: its epoch,
        which any later placement raises): should this replica pause past the claim
        while another places and wires the job, its late release is refused
        (STALE_LEASE) instead of tearing down that wiring. A job the pod does not know
        has no lease: its release is unfenced."""
        keys = self.store.keys
        token = f"{id(self)}-{self.now_ms()}"
        txn = self.store.txn()
        txn.expect_job(job_id, ["", PENDING, SUSPENDED, *FINAL_STATES])
        txn.set_px(keys.releasing(job_id), token, RELEASE_CLAIM_MS)
        txn.read_back(keys.job(job_id), ["summary"])
        try:
            ((summary,),) = await self.store.commit(txn)
        except Conflict:
            return False  # live again: its own wiring step releases what is left
        lease = job_lease(self.store.slice_job(summary)) if summary else None
        try:
            await self._release_at_ocs(job_id, wait_s=wait_s, lease=lease)
            txn = self.store.txn()
            txn.unwire(job_id)
            await self.store.commit(txn)
        finally:
            await self.store.redis.delete(keys.releasing(job_id))
        return True
