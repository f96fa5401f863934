"""CS-6 and X-5 when something broke half-way: the cell's background work.

Runs on every replica, safe side by side (atomic scripts, a lease per pod):

* a pod silent for longer than the pod timeout is marked down: its jobs show
  UNKNOWN (their last known state in the reason) and it is not chosen;
* a forward whose replica died (its deadline passed) is taken over and finished
  from what the pod says: the pod has the job (placed) or not (back to the queue);
* a job whose forward got no answer may be on that pod after all: once the pod
  answers, a job the cell still queues is adopted, a duplicate is cancelled;
* a pod that answers again (or whose event stream lost entries) has each of the
  cell's live jobs on it checked against its own GetJob (a job the pod let go back
  to the cell queue, its event lost, is queued again).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping

from lightpath.v1 import workload_scheduler_pb2
from lightpath_services.cell_scheduler.choice import PodCapacityView
from lightpath_services.cell_scheduler.jobs import CellJobs
from lightpath_services.cell_scheduler.podclient import (
    PodCallError,
    PodRefused,
    PodUnreachable,
    placed_fields,
    state_name,
)
from lightpath_services.cell_scheduler.pods import PodDirectory
from lightpath_services.cell_scheduler.quotas import job_charge
from lightpath_services.cell_scheduler.store import FINAL, FORWARDING, PLACED, QUEUED, unb64


class Recovery:
    """Needs the pods (status, calls) and the cell's jobs (records, tokens, the
    transitions), and a way to wake the dispatcher; not the cell itself."""

    def __init__(
        self, *, pods: PodDirectory, jobs: CellJobs, kick: Callable[[], None], log: logging.Logger
    ):
        self.pods = pods
        self.jobs = jobs
        self.store = pods.store
        self._kick = kick
        self.log = log
        self._reconciling: set[str] = set()

    async def reconcile(self) -> None:
        now = self.pods.now_ms()
        registered, heard, down = await self.store.liveness()
        for pod_id in sorted(registered):
            seen = heard.get(pod_id, 0)
            if pod_id not in down and now - seen > self.pods.pod_timeout_ms:
                count = await self.store.mark_down(pod_id, now, self.pods.pod_timeout_ms)
                if count >= 0:
                    self.log.warning(
                        "pod %s silent for %.1f s: not chosen; %d job(s) now UNKNOWN",
                        pod_id,
                        (now - seen) / 1000,
                        count,
                        extra={"pod_id": pod_id},
                    )
        for job_id in await self.store.stuck_forwards(now):
            await self._take_over(job_id)
        maybe = await self.store.maybe_jobs()
        if maybe:  # (the whole snapshot only then: most rounds have none)
            views = self.pods.views_of(await self.store.snapshot(queue=False), now)
            for job_id in maybe:
                await self._check_maybe(job_id, views)

    async def _take_over(self, job_id: str) -> None:
        """A forward whose replica went away: find out from the pod what became of it."""
        token = self.jobs.new_token()
        now = self.pods.now_ms()
        taken = await self.store.take_over(job_id, token, now + self.jobs.forward_window_ms(), now)
        if taken is None:
            return
        pod, fence = taken
        self.log.warning("job %s: taking over a forward to pod %s that timed out", job_id, pod)
        try:
            # Fenced: the pod records the take-over's token before it answers, so the
            # forward taken over, should it still arrive (its replica paused before
            # sending it), is refused there from now on.
            job = await self.pods.call(
                pod,
                "GetJob",
                workload_scheduler_pb2.GetJobRequest(job_id=job_id, forward_token=fence),
            )
        except PodRefused:
            # The pod does not have it, and the forward taken over can no longer put it there.
            await self.jobs.back_to_queue(
                job_id, token, pod, f"the forward to pod {pod} was lost", cause="lost"
            )
            self._kick()
            return
        except PodUnreachable as err:
            await self.jobs.back_to_queue(
                job_id, token, pod, f"pod {pod} did not answer ({err.code.name})", uncertain=True
            )
            self._kick()
            return
        record = await self.jobs.job_record(job_id)
        spec = workload_scheduler_pb2.JobSpec.FromString(unb64(record.spec_b64))
        await self.jobs.placed(job_id, token, pod, job, placed_fields(job, spec))

    async def _check_maybe(self, job_id: str, views: Mapping[str, PodCapacityView]) -> None:
        """A forward to these pods got no answer: does one of them have the job after all?"""
        record = await self.store.job(job_id)
        if record is None:
            return
        for pod in record.maybe:
            if pod not in views or not views[pod].usable:
                continue
            try:
                job = await self.pods.call(
                    pod, "GetJob", workload_scheduler_pb2.GetJobRequest(job_id=job_id)
                )
            except PodRefused:
                await self.store.forget_maybe(job_id, pod)
                continue
            except PodUnreachable:
                continue
            record = await self.jobs.job_record(job_id)
            if record.phase == FORWARDING:
                continue  # decide once that forward is done
            if record.phase == QUEUED:
                spec = job.spec
                await self.store.adopt(
                    job_id,
                    pod=pod,
                    state=state_name(job.state),
                    n=len(job.history),
                    reason=job.reason,
                    fields=placed_fields(job, spec),
                    now_ms=self.pods.now_ms(),
                    charge=job_charge(job),
                )
                self.log.info("job %s found on pod %s after it answered again", job_id, pod)
            elif not (record.phase == PLACED and record.pod == pod):
                if state_name(job.state) not in FINAL:
                    where = f"pod {record.pod}" if record.pod else "the cell"
                    with contextlib.suppress(PodCallError):
                        await self.pods.call(
                            pod,
                            "CancelJob",
                            workload_scheduler_pb2.CancelJobRequest(
                                job_id=job_id,
                                reason=f"duplicate: the cell has this job on {where}",
                            ),
                        )
                    self.log.warning(
                        "job %s: cancelled a duplicate on pod %s (the cell has it on %s)",
                        job_id,
                        pod,
                        where,
                    )
            await self.store.forget_maybe(job_id, pod)

    async def reconcile_pod(self, pod_id: str) -> None:
        """A pod answers again (or its event stream lost entries): ask it about each job
        the cell placed there that has not ended (CS-6)."""
        if pod_id in self._reconciling:
            return
        self._reconciling.add(pod_id)
        lease = f"reconcile:{pod_id}"
        owner = self.jobs.new_token()
        try:
            if not await self.store.lease(lease, owner, 30_000):
                return
            fixed = 0
            for job_id in await self.store.live_jobs(pod_id):
                record = await self.store.job(job_id)
                if record is None or record.phase != PLACED or record.pod != pod_id:
                    continue
                try:
                    job = await self.pods.call(
                        pod_id, "GetJob", workload_scheduler_pb2.GetJobRequest(job_id=job_id)
                    )
                except PodRefused as err:
                    # Its event lost (the stream trimmed), the pod's answer says it let the
                    # job go back to the cell queue (issue 35).
                    if await self.jobs.released(job_id, pod_id, err):
                        fixed += 1
                        continue
                    await self.store.mirror(
                        job_id,
                        pod=pod_id,
                        state="FAILED",
                        n=record.n + 1,
                        reason=f"pod {pod_id} no longer knows this job",
                        now_ms=self.pods.now_ms(),
                    )
                    fixed += 1
                    continue
                except PodUnreachable:
                    return
                before = record.pod_state
                await self.jobs.follow(record, job)
                fixed += before != state_name(job.state)
            self.log.info(
                "pod %s reconciled: %d job state(s) corrected",
                pod_id,
                fixed,
                extra={"pod_id": pod_id},
            )
        finally:
            self._reconciling.discard(pod_id)
            await self.store.release_lease(lease, owner)
