"""The reconcile loop: repairs any replica may do (leftover wiring, wirings and swaps
whose replica went away, missed swaps, differences with the ocs_manager, the queue)."""

from __future__ import annotations

import asyncio
import contextlib

from lightpath.domain.slices import (
    HOLDING_STATES,
    QUEUED_STATES,
    RUNNING,
    SUSPENDED,
    WIRING,
    SliceJob,
    grid_positions,
)
from lightpath_services.workload_scheduler.admission import Admission
from lightpath_services.workload_scheduler.consistency import MISSING, ORPHANED, wiring_differences
from lightpath_services.workload_scheduler.core import (
    QUIET_HORIZON_MS,
    STALE_WIRING_GRACE_MS,
    SWEEP_PAGE,
    WIRING_TAKEN_OVER,
    Outcome,
    Part,
    PodContext,
)
from lightpath_services.workload_scheduler.ocs import OcsError, job_lease
from lightpath_services.workload_scheduler.placement import PodState
from lightpath_services.workload_scheduler.planner import (
    boxes_on_failed_chips,
    running_with_failed_blocks,
)
from lightpath_services.workload_scheduler.store import Conflict
from lightpath_services.workload_scheduler.swap import Swap
from lightpath_services.workload_scheduler.wiring import Wirer


class Reconcile(Part):
    """The repair rounds; what they repair goes through the parts given."""

    def __init__(self, pod: PodContext, wiring: Wirer, admission: Admission, swap: Swap):
        super().__init__(pod)
        self.wiring, self.admission, self.swap = wiring, admission, swap
        # The newest event when the last full round found nothing to do (None: it did
        # something), and until when that holds.
        self._quiet_tip: str | None = None
        self._quiet_until_ms = 0
        # Where the sweeps of quiet rounds go on: an HSCAN cursor over the wiring marks;
        # ListSlices' next page token and the last job id before it.
        self._marks_cursor = 0
        # A sweep found a difference with the ocs_manager: compare every slice.
        self._compare_all = True
        self._slices_token = ""
        self._slices_after = ""

    async def reconcile(self, *, full: bool = False) -> None:
        """One round of repairs any replica may do (idempotent, safe concurrently).

        Each round compares one page of the ocs_manager's slices with the jobs in the
        same id range (a sweep, for a slice released or wired behind the scheduler's
        back); on a difference, the rounds compare every slice, report and repair until
        none is left. A round that finds the pod as the last full round left it (the
        same newest event, no deadline or backoff come due) reads no more than that
        event id and one page of a second sweep, over the wiring marks (for a mark left
        without an event, by a replica that died, say); otherwise, or when that sweep
        finds leftover wiring, it reads the whole pod. So an idle pod costs the same
        with 1,000 live jobs as with 100 (issue 15)."""
        now = self.now_ms()
        tip = await self.store.tip()
        if full or self._compare_all:
            # Every slice against every job: report and repair (issue 14).
            self._compare_all = await self._check_wiring()
        elif await self._sweep_slices():
            self._compare_all = True  # a difference: the next round compares everything
        if not full and tip == self._quiet_tip and now < self._quiet_until_ms:
            if await self._sweep_marks():
                self._quiet_tip = None  # leftover wiring: the next round looks at everything
            return
        state = await self.snapshot()
        due = now + QUIET_HORIZON_MS  # when a time-based repair comes due, at the latest
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
                    await self.wiring.release_claimed(other, wait_s=0)
                except OcsError as err:
                    self.wiring.release_error(other, err)
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
            if (
                self.age_bound_ms is not None
                and job.state in QUEUED_STATES
                and job.submitted_ms + self.age_bound_ms > now
            ):
                due = min(due, job.submitted_ms + self.age_bound_ms)  # it may preempt then
        for job, block in running_with_failed_blocks(state):
            busy = True
            await self.swap.handle_failure(job.job_id, block)
        for job in boxes_on_failed_chips(state):  # a move missed or interrupted
            busy = True
            await self.swap.move_box(job.job_id)
        if state.queue():
            await self.admission.schedule()
        self._quiet_tip = None if busy else tip
        self._quiet_until_ms = due

    async def _sweep_marks(self) -> bool:
        """The next page of wiring marks: True if one is of a job no longer wiring or
        running (leftover wiring to release)."""
        cursor, marks, live = await self.store.marks_page(self._marks_cursor, SWEEP_PAGE)
        self._marks_cursor = cursor
        return any(
            j not in live or live[j].state not in HOLDING_STATES for j in set(marks.values())
        )

    async def _sweep_slices(self) -> bool:
        """The next page of the ocs_manager's slices (ListSlices pages in job id order)
        against the RUNNING jobs in the same id range: True on a difference
        (consistency.py), or when the pages are not in that order after all. On a
        SWITCHED pod (ListRingReservations promises no order) every round compares
        everything, as before."""
        if not self.ocs.pages_in_order:
            return await self._check_wiring()
        after = self._slices_after
        try:
            page, token = await self.ocs.slices_page(self._slices_token, SWEEP_PAGE)
        except OcsError as err:
            log = self.log.debug if err.transient else self.log.warning
            log("cannot compare jobs with the ocs_manager's slices: %s", err)
            return False  # a full round would not get an answer either
        ids = list(page)
        if ids != sorted(ids) or (after and ids and ids[0] <= after):
            self._slices_token, self._slices_after = "", ""
            return True
        upto = ids[-1] if token else None
        jobs = await self.store.live_in_range(after, upto, also=ids)
        self._slices_token, self._slices_after = (token, upto or "") if token else ("", "")
        return bool(wiring_differences(PodState(self.fabric, jobs=jobs), page))

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
                    await self.wiring.release_claimed(diff.job_id, wait_s=0)
                except OcsError as err:
                    self.wiring.release_error(diff.job_id, err)
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
        self.wiring.track(job.job_id, self.wiring.wire(mine, marked=True))

    async def _take_over_wiring(self, job: SliceJob) -> None:
        """A wiring whose replica went away: finish it if the OCS has it, else requeue."""
        mine = job.with_(
            epoch=job.epoch + 1, wiring_deadline_ms=self.now_ms() + self.wiring_timeout_ms
        )
        txn = self.store.txn()
        txn.expect_job(job.job_id, [WIRING], job.epoch)
        txn.write_job(mine, old_state=WIRING, reason=WIRING_TAKEN_OVER, now_ms=self.now_ms())
        try:
            await self.store.commit(txn)
        except Conflict:
            return
        self.log.warning("job %s: taking over a wiring that timed out", job.job_id)
        if mine.offset is not None:  # a sub-block slice: nothing at the OCS to look at
            self.wiring.track(job.job_id, self.wiring.wire(mine))
            return
        try:
            found = await self.ocs.wiring(job.job_id)
            if found is not None and found.blocks != mine.placement:
                await self.wiring.release(job.job_id, lease=job_lease(mine))
                found = None
            elif found is not None and not found.committed:
                found = None  # still being programmed: WireSlice again finishes or replays it
        except OcsError as err:
            await self.wiring.wiring_failed(mine, err)
            return
        if found is None:
            self.wiring.track(job.job_id, self.wiring.wire(mine))
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
            await self.swap.replacement_failed(mine, err, Outcome())
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
        await self.swap.swap_at_ocs(mine, position, Outcome())

    async def run_reconciler(self, interval_s: float) -> None:
        """Reconcile rounds for ever (a supervised task: a failed round restarts it)."""
        while True:
            await self.reconcile()
            await asyncio.sleep(interval_s)
