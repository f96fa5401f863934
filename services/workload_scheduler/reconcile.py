"""The reconcile loop: repairs any replica may do (leftover wiring, wirings and swaps
whose replica went away, missed swaps, differences with the ocs_manager, the queue)."""

from __future__ import annotations

import asyncio
import contextlib

from services.workload_scheduler.consistency import MISSING, ORPHANED, wiring_differences
from services.workload_scheduler.core import (
    FULL_ROUND_EVERY,
    FULL_ROUND_MAX_S,
    FULL_ROUND_MIN_S,
    STALE_WIRING_GRACE_MS,
    Outcome,
)
from services.workload_scheduler.model import (
    HOLDING_STATES,
    RUNNING,
    SUSPENDED,
    WIRING,
    SliceJob,
    grid_positions,
)
from services.workload_scheduler.ocs import OcsError
from services.workload_scheduler.planner import (
    running_with_failed_blocks,
)
from services.workload_scheduler.store import Conflict
from services.workload_scheduler.swap import FailureMixin


class ReconcileMixin(FailureMixin):
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
