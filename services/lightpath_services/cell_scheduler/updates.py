"""UpdateJob through the cell (issue 19): a job's priority or labels changed in place.

The mask is checked first (lightpath.domain.job_update: the same paths and
words as the pod's UpdateJob), then by where the job is:

* in the cell queue: its stored request and priority change and it takes its
  new place in the queue, with a PENDING → PENDING event saying what changed,
  in one script (`CellStore.update`, which checks the job is still queued);
* on a pod: the pod applies it first (its queue order, or for a running job
  the priority later preemption decisions see, with an event in the job's
  history); then the cell's record follows the pod's answer. A pod that does
  not answer is UNAVAILABLE; the same update again is safe (an update that
  changes nothing is answered as the job is, and the cell's record follows);
* being forwarded: waited for (as cancel does), else ABORTED;
* ended: FAILED_PRECONDITION.

The request as first submitted stays the idempotency key of SubmitJob, so a
retried submit of it still answers the (updated) job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from lightpath.domain.job_update import LABELS, parse_update
from lightpath.errors import Aborted, FailedPrecondition, InvalidArgument, Unavailable
from lightpath.v1 import cell_scheduler_pb2, workload_scheduler_pb2
from lightpath_services.cell_scheduler.jobs import MAX_PLAN_ATTEMPTS, CellJobs, JobView, request_b64
from lightpath_services.cell_scheduler.podclient import PodCallError
from lightpath_services.cell_scheduler.request import TENANT_LABEL
from lightpath_services.cell_scheduler.store import ENDED, FINAL, PLACED, QUEUED, CellJobRecord, b64


class Updates:
    def __init__(
        self,
        *,
        jobs: CellJobs,
        request_of: Callable[[CellJobRecord], cell_scheduler_pb2.SubmitJobRequest],
        kick: Callable[[], None],
        log: logging.Logger,
    ):
        self.jobs = jobs
        self.pods = jobs.pods
        self.store = jobs.store
        self._request_of = request_of
        self._kick = kick
        self.log = log

    async def update(self, patch: workload_scheduler_pb2.JobSpec, paths: Sequence[str]) -> JobView:
        plan = parse_update(patch, paths, reserved=(TENANT_LABEL,))
        job_id = patch.job_id
        for _ in range(MAX_PLAN_ATTEMPTS):
            record = await self.jobs.settled(await self.jobs.job_record(job_id))
            if record.phase == ENDED or record.state in FINAL:
                raise FailedPrecondition(
                    f"job {job_id}",
                    f"already ended: {record.state}; an ended job does not change",
                    reason="JOB_ENDED",
                )
            label = patch.labels.get(TENANT_LABEL)
            if plan.all_labels and label is not None and label != record.tenant:
                raise InvalidArgument(
                    f"spec.labels[{TENANT_LABEL}]",
                    f"{label!r} is not the job's tenant {record.tenant!r}; the tenant "
                    "label cannot change",
                )
            req = self._request_of(record)
            upd = plan.apply(req.spec)
            new_req = cell_scheduler_pb2.SubmitJobRequest()
            new_req.CopyFrom(req)
            new_req.spec.CopyFrom(upd.spec)
            if record.phase == QUEUED:
                if not upd.changes:
                    return await self.jobs.view(record)
                after = await self.store.update(
                    job_id,
                    phase=QUEUED,
                    pod="",
                    request=request_b64(new_req),
                    priority=upd.priority,
                    spec="",
                    reason=upd.describe(),
                    now_ms=self.pods.now_ms(),
                )
                if after is None:
                    continue  # left the queue meanwhile: as it is now
                self.log.info(
                    "job %s in the cell queue %s", job_id, upd.describe(), extra={"job_id": job_id}
                )
                if upd.priority > record.priority:
                    self._kick()  # a higher place (or preemption) may let it go now
                return await self.jobs.view(after)
            if record.phase == PLACED:
                view = await self._on_pod(record, plan.paths, patch, new_req)
                if view is not None:
                    return view
        raise Aborted(f"job {job_id} is still being placed; retry the update", reason="BUSY")

    async def _on_pod(
        self,
        record: CellJobRecord,
        paths: list[str],
        patch: workload_scheduler_pb2.JobSpec,
        new_req: cell_scheduler_pb2.SubmitJobRequest,
    ) -> JobView | None:
        """The pod applies the update first; the cell's record follows its answer. None:
        the pod let the job go back to the cell queue (issue 35): update it there."""
        if record.state == "UNKNOWN":
            raise Unavailable(
                f"pod {record.pod} of job {record.job_id} is not answering; the job can "
                "change once it does",
                reason="POD_UNREACHABLE",
            )
        forwarded = workload_scheduler_pb2.JobSpec()
        forwarded.CopyFrom(patch)
        if LABELS in paths:
            forwarded.labels[TENANT_LABEL] = record.tenant  # the pod keeps the tenant label
        request = workload_scheduler_pb2.UpdateJobRequest(spec=forwarded)
        request.update_mask.paths.extend(paths)
        try:
            # as long as a forward: the pod waits out a wiring of the job in flight
            job = await self.pods.call(
                record.pod, "UpdateJob", request, timeout=self.jobs.forward_timeout_s
            )
        except PodCallError as err:
            if await self.jobs.released(record.job_id, record.pod, err):
                return None
            raise err.relayed() from None
        after = await self.store.update(
            record.job_id,
            phase=PLACED,
            pod=record.pod,
            request=request_b64(new_req),
            priority=job.priority,
            spec=b64(job.spec.SerializeToString(deterministic=True)),
            reason="",
            now_ms=self.pods.now_ms(),
        )
        return JobView(await self.jobs.follow(after or record, job), job)
