"""A job system's day with the Lightpath SDK: submit a job, wait until it runs, list
the tenant's jobs, report the workload finished, and wait until it has ended.

    lightpath up &                       # a local stack (or set LIGHTPATH_CELL_ADDR)
    python examples/sdk_submit.py [JOB_ID]

The test suite runs this script against a real cell (tests/sdk/test_example.py).
"""

from __future__ import annotations

import sys
import uuid

from lightpath.sdk import Cell, InvalidArgument, state_name


def main(job_id: str) -> int:
    with Cell(timeout=30) as cell:  # the local stack's cell, its operator's certificate
        try:
            cell.submit("too-odd", "6x4x4", tenant="example")
        except InvalidArgument as err:  # refused: the field and the rule, typed
            for v in err.violations:
                print(f"refused: {v.field}: {v.rule}")

        submitted = cell.submit(job_id, "4x4x4", priority_class="high", tenant="example")
        print(f"submitted {job_id}: {submitted.outcome}")

        job = cell.wait_running(job_id, timeout=60)
        print(f"{job_id} is {state_name(job.state)} on {job.pod_id} ({job.block_count} blocks)")

        for j in cell.list_jobs(tenant="example", states=["running"]):  # every page
            print(f"running: {j.job_id} on {j.pod_id}")

        cell.complete(job_id)
        ended = cell.wait_ended(job_id, timeout=60)
        print(f"{job_id} ended {state_name(ended.state)}")
        for event in cell.watch(job_id):  # its history; the stream ends with the job
            print(f"  {state_name(event.from_state)} -> {state_name(event.to_state)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else f"example-{uuid.uuid4().hex[:8]}"))
