"""Cross-service consistency (issue 14): the scheduler's jobs against the ocs_manager's
slices. Pure: a snapshot of the pod and the ocs_manager's slice list in, differences out.

* MISSING   a RUNNING job (not swapping a block) has no slice at the ocs_manager: it
            was released behind the scheduler's back (an operator's ReleaseSlice).
* ORPHANED  the ocs_manager holds a slice of a job that is neither wiring nor running.

The reconcile round (WorkloadScheduler._check_wiring) confirms each against the job as
stored, reports it (GetPod's `wiring_differences`) and repairs it once it has lasted a
few seconds: MISSING is wired again on the same blocks, ORPHANED is released.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lightpath.domain.slices import HOLDING_STATES, RUNNING
from lightpath_services.workload_scheduler.placement import PodState

MISSING = "MISSING"
ORPHANED = "ORPHANED"


@dataclass(frozen=True)
class WiringDifference:
    job_id: str
    kind: str  # MISSING | ORPHANED
    detail: str

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.job_id}"


def _blocks(blocks) -> str:
    return ",".join(map(str, blocks))


def wiring_differences(
    state: PodState, slices: Mapping[str, tuple[int, ...]]
) -> list[WiringDifference]:
    """Every difference between the pod's live jobs and the ocs_manager's `slices`
    (job id -> blocks or groups), running jobs first by admission order."""
    out: list[WiringDifference] = []
    for job in sorted(state.jobs.values(), key=lambda j: j.seq):
        # a sub-block slice has no slice at the ocs_manager (it needs no OCS change)
        if (
            job.state == RUNNING
            and not job.replacing
            and job.offset is None
            and job.job_id not in slices
        ):
            out.append(
                WiringDifference(
                    job.job_id,
                    MISSING,
                    f"job {job.job_id} is RUNNING on blocks {_blocks(job.placement or ())} "
                    "but the ocs_manager has no slice for it",
                )
            )
    for job_id in sorted(slices):
        live = state.jobs.get(job_id)
        if live is None or live.state not in HOLDING_STATES:
            out.append(
                WiringDifference(
                    job_id,
                    ORPHANED,
                    f"the ocs_manager holds a slice on blocks {_blocks(slices[job_id])} of job "
                    f"{job_id}, which is {live.state if live else 'not live'}",
                )
            )
    return out
