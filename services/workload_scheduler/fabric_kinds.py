"""What differs between the fabric kinds a pod may have, behind one interface chosen once
when the pod is set up (`planner_for`): the rest of the scheduler never asks which kind
it runs on.

* OCS_TORUS (`TorusPlanner`): block slices on whole blocks wired by the OCSes, and
  sub-block slices in boxes of chips inside one block (issue 28); the planner takes
  a job's boxes or blocks by its demand.
* SWITCHED (`SwitchedPlanner`, seed 002): jobs on processor groups of a switched
  fabric, small ones packed into groups reserved for them; the ocs_manager reserves
  rings instead of wiring slices (ocs.RingsClient).

The planning is the pure functions of planner.py; a planner adds what the service asks
of the kind: a new job's degrees, the views of a job and of the pod.
"""

from __future__ import annotations

import contextlib
import math
from typing import Protocol

from lightpath.domain.blocks import PodFabric
from lightpath.domain.jobs import NormalizedSpec, chips_of, degrees_of, job_degrees
from lightpath.domain.rings import RingPlan, plan_rings
from lightpath.domain.slices import SUB_BLOCK_OWNER, SliceJob, grid_positions
from lightpath.errors import FailedPrecondition, InvalidArgument
from lightpath.v1 import common_pb2, workload_scheduler_pb2
from services.workload_scheduler.box_placement import largest_free_box
from services.workload_scheduler.ocs import OcsError, OcsManagerClient, RingsClient
from services.workload_scheduler.placement import PodState, Unplaceable
from services.workload_scheduler.planner import (
    Allocation,
    Replacement,
    plan_admission,
    plan_replacement,
    plan_switched_admission,
    plan_switched_replacement,
)
from services.workload_scheduler.switched_view import add_switched_job, switched_pod_view


class FabricPlanner(Protocol):
    """A pod's fabric kind as the scheduler sees it."""

    # Every holder of a block is indexed: one read names it, and a lean snapshot (free
    # blocks and the queue, issue 15) can decide; otherwise decisions take the whole pod.
    lean: bool

    def admit(
        self, state: PodState, job: SliceJob, *, preempt: bool = True, take_younger: bool = False
    ) -> Allocation | Unplaceable:
        """Place a waiting job (planner.plan_pass asks for each job of the queue)."""
        ...

    def replace(self, state: PodState, job: SliceJob, failed: int) -> Replacement | None:
        """A block for the failed one of a running slice (WS-5), or None."""
        ...

    def degrees(self, norm: NormalizedSpec) -> tuple[int, int, int] | None:
        """The parallelism degrees a new job keeps for its placement."""
        ...

    def largest_free_box(self, state: PodState, node_type: str) -> int:
        """The chips the largest sub-block slice of `node_type` could get now (the cell's
        PodCapacity)."""
        ...

    def job_view(
        self,
        out: workload_scheduler_pb2.Job,
        job: SliceJob,
        spec: workload_scheduler_pb2.JobSpec,
        *,
        holding: bool,
        include_rings: bool,
    ) -> None:
        """The kind's part of a job's view: its chips, its rings."""
        ...

    async def add_rings(
        self, out: workload_scheduler_pb2.Job, job_id: str, ocs: OcsManagerClient
    ) -> None:
        """A holding job's rings as the ocs_manager keeps them (GetJob include_rings)."""
        ...

    async def pod_view(
        self, out: workload_scheduler_pb2.PodView, state: PodState, ocs: OcsManagerClient
    ) -> None:
        """The kind's part of the pod view (WS-9)."""
        ...

    def chips_free(self, state: PodState, block: int, held: dict) -> int:
        """Free chips of a block for the block map (`held`: PodState.chips_held())."""
        ...

    def plan_rings_allowed(self, pod_id: str) -> None:
        """Raise when PlanRings has no meaning on this kind."""
        ...


class TorusPlanner:
    """OCS_TORUS pods: block slices and sub-block slices (planner.plan_admission)."""

    lean = True

    def __init__(self, fabric: PodFabric):
        self.fabric = fabric

    admit = staticmethod(plan_admission)
    replace = staticmethod(plan_replacement)

    def degrees(self, norm: NormalizedSpec) -> tuple[int, int, int] | None:
        return None  # the rings of a torus slice follow from its shape (PlanRings)

    def largest_free_box(self, state: PodState, node_type: str) -> int:
        return largest_free_box(state, node_type)

    def job_view(self, out, job, spec, *, holding, include_rings) -> None:
        chips = job.demand.box or chips_of(job.demand.grid, self.fabric)
        out.chips.dims.extend(chips)
        degrees = degrees_of(spec.parallelism) if spec.HasField("parallelism") else None
        if include_rings and degrees:
            with contextlib.suppress(InvalidArgument):  # a shrunk slice no longer fits its degrees
                out.rings.CopyFrom(ring_plan_pb(plan_rings(chips, job.demand.wrap, degrees)))

    async def add_rings(self, out, job_id, ocs) -> None:
        return None  # planned from the shape (job_view)

    async def pod_view(self, out, state, ocs) -> None:
        return None

    def chips_free(self, state: PodState, block: int, held: dict) -> int:
        fabric = self.fabric
        owner = state.owner.get(block, "")
        if state.whole_failed(block) or (owner and owner != SUB_BLOCK_OWNER):
            return 0
        mine = held.get(block, {})
        bad = state.failed_hosts.get(block, frozenset())
        return sum(
            1
            for c in grid_positions(fabric.block_shape)
            if c not in mine and fabric.host_of(c) not in bad
        )

    def plan_rings_allowed(self, pod_id: str) -> None:
        return None


class SwitchedPlanner:
    """SWITCHED pods: groups, small jobs' tiles, rings (planner.plan_switched_*)."""

    # The small jobs' processors are not indexed per group: decisions take the whole pod.
    lean = False

    def __init__(self, fabric: PodFabric):
        self.fabric = fabric

    def admit(
        self, state: PodState, job: SliceJob, *, preempt: bool = True, take_younger: bool = False
    ) -> Allocation | Unplaceable:
        return plan_switched_admission(state, job, preempt=preempt)

    replace = staticmethod(plan_switched_replacement)

    def degrees(self, norm: NormalizedSpec) -> tuple[int, int, int] | None:
        return job_degrees(norm)

    def largest_free_box(self, state: PodState, node_type: str) -> int:
        return 0  # no sub-block slices on processor groups

    def job_view(self, out, job, spec, *, holding, include_rings) -> None:
        out.chips.dims.append(math.prod(job.degrees or (1,)))
        add_switched_job(out, job, self.fabric, holding)

    async def add_rings(self, out, job_id, ocs) -> None:
        assert isinstance(ocs, RingsClient)
        with contextlib.suppress(OcsError):  # the job view does not fail for want of rings
            found = await ocs.rings(job_id, full=True)
            if found is not None:
                out.switched.rings.CopyFrom(found)

    async def pod_view(self, out, state, ocs) -> None:
        assert isinstance(ocs, RingsClient)
        await switched_pod_view(self.fabric, state, out.switched, ocs)

    def chips_free(self, state: PodState, block: int, held: dict) -> int:
        return 0  # a group's processors are counted per job (SwitchedPodView)

    def plan_rings_allowed(self, pod_id: str) -> None:
        raise FailedPrecondition(
            f"pod {pod_id}",
            "is SWITCHED: its rings are reserved per job by the fabric manager; admit the "
            "job with parallelism degrees and read them with GetJob(include_rings)",
            reason="FABRIC_KIND",
        )


def planner_for(fabric: PodFabric) -> FabricPlanner:
    """The planner of the pod's fabric kind: the one place that tells them apart."""
    return TorusPlanner(fabric) if fabric.switched is None else SwitchedPlanner(fabric)


def ring_plan_pb(plan: RingPlan) -> workload_scheduler_pb2.RingPlan:
    return workload_scheduler_pb2.RingPlan(
        chips=common_pb2.Shape(dims=plan.chips),
        wrap=list(plan.wrap),
        axes=[
            workload_scheduler_pb2.AxisRings(
                axis=a.axis,
                degree=a.degree,
                dims=list(a.dims),
                rings=[
                    workload_scheduler_pb2.Ring(
                        chips=[common_pb2.Coordinate(coords=c) for c in ring]
                    )
                    for ring in a.rings
                ],
            )
            for a in plan.axes
        ],
    )
