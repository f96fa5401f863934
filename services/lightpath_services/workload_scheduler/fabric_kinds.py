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
of the kind: a new job's degrees, capacity, the views of a job and of the pod (WS-9,
SW-6).
"""

from __future__ import annotations

import contextlib
import math
from typing import Protocol

from lightpath.domain.blocks import PodFabric
from lightpath.domain.jobs import NormalizedSpec, chips_of, degrees_of, job_degrees
from lightpath.domain.rings import RingPlan, plan_rings
from lightpath.domain.slices import HOLDING_STATES, SUB_BLOCK_OWNER, SliceJob
from lightpath.domain.switched import SwitchedFabric
from lightpath.domain.switched_rings import Tile
from lightpath.errors import FailedPrecondition, InvalidArgument
from lightpath.v1 import common_pb2, workload_scheduler_pb2
from lightpath_services.common.convert import fabric_to_proto, tile_to_proto
from lightpath_services.workload_scheduler.box_placement import largest_free_box
from lightpath_services.workload_scheduler.ocs import OcsError, OcsManagerClient, RingsClient
from lightpath_services.workload_scheduler.placement import PodState, Unplaceable
from lightpath_services.workload_scheduler.planner import (
    Allocation,
    Replacement,
    plan_admission,
    plan_replacement,
    plan_switched_admission,
    plan_switched_replacement,
)


class FabricPlanner(Protocol):
    """A pod's fabric kind as the scheduler sees it."""

    # Every holder of a block is indexed: one read names it, and a lean snapshot (free
    # blocks and the queue, issue 15) can decide; otherwise decisions take the whole pod.
    lean: bool

    # Place a waiting job (plan_pass asks for each of the queue); a block for the failed
    # one of a running slice (WS-5); the degrees a new job keeps for its placement.
    def admit(
        self,
        state: PodState,
        job: SliceJob,
        *,
        preempt: bool = True,
        take_younger: bool = False,
        reclaim: frozenset[str] | None = None,
    ) -> Allocation | Unplaceable: ...
    def replace(
        self, state: PodState, job: SliceJob, failed: int, *, take_younger: bool = False
    ) -> Replacement | None: ...
    def degrees(self, norm: NormalizedSpec) -> tuple[int, int, int] | None: ...

    # Capacity: the chips of the largest sub-block slice of a type it could place now
    # (the cell's PodCapacity); a block's free chips (`held`: PodState.chips_held()).
    def largest_free_box(self, state: PodState, node_type: str) -> int: ...
    def chips_free(self, state: PodState, block: int, held: dict) -> int: ...

    # Views: the kind's part of a job's (chips, rings) and of the pod's (WS-9); a holding
    # job's rings as the ocs_manager keeps them (GetJob include_rings); PlanRings refused.
    def job_view(
        self,
        out: workload_scheduler_pb2.Job,
        job: SliceJob,
        spec: workload_scheduler_pb2.JobSpec,
        *,
        holding: bool,
        include_rings: bool,
    ) -> None: ...
    async def pod_view(
        self, out: workload_scheduler_pb2.PodView, state: PodState, ocs: OcsManagerClient
    ) -> None: ...
    async def add_rings(
        self, out: workload_scheduler_pb2.Job, job_id: str, ocs: OcsManagerClient
    ) -> None: ...
    def plan_rings_allowed(self, pod_id: str) -> None: ...


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
        if not mine and not bad:
            return fabric.chips_per_block
        return sum(1 for c, h in fabric.chip_hosts.items() if c not in mine and h not in bad)

    def plan_rings_allowed(self, pod_id: str) -> None:
        return None


class SwitchedPlanner:
    """SWITCHED pods: groups, small jobs' tiles, rings (planner.plan_switched_*)."""

    # The small jobs' processors are not indexed per group: decisions take the whole pod.
    lean = False

    def __init__(self, fabric: PodFabric, switched: SwitchedFabric):
        self.fabric = fabric
        self.switched = switched

    def admit(
        self,
        state: PodState,
        job: SliceJob,
        *,
        preempt: bool = True,
        take_younger: bool = False,
        reclaim: frozenset[str] | None = None,  # quotas reclaim blocks only (issue 35)
    ) -> Allocation | Unplaceable:
        return plan_switched_admission(state, job, preempt=preempt)

    replace = staticmethod(plan_switched_replacement)

    def degrees(self, norm: NormalizedSpec) -> tuple[int, int, int] | None:
        return job_degrees(norm)

    def largest_free_box(self, state: PodState, node_type: str) -> int:
        return 0  # no sub-block slices on processor groups

    def job_view(self, out, job, spec, *, holding, include_rings) -> None:
        """Its chips, degrees and processors, and its groups' tiles (its rings come
        from the ocs_manager: add_rings)."""
        d = job.degrees or (1, 1, 1)
        n = math.prod(d)
        out.chips.dims.append(n)
        out.switched.CopyFrom(
            workload_scheduler_pb2.SwitchedJob(
                degrees=common_pb2.ParallelismDegrees(data=d[0], pipeline=d[1], layer=d[2]),
                processors=n,
                small=n <= self.switched.group_size,
            )
        )
        if holding and job.placement:
            tiles = (
                [Tile(*job.tile)]
                if job.tile is not None
                else [Tile.whole(self.switched, g) for g in job.placement]
            )
            out.switched.tiles.extend(tile_to_proto(self.switched, t) for t in tiles)

    async def add_rings(self, out, job_id, ocs) -> None:
        assert isinstance(ocs, RingsClient)
        with contextlib.suppress(OcsError):  # the job view does not fail for want of rings
            found = await ocs.rings(job_id, full=True)
            if found is not None:
                out.switched.rings.CopyFrom(found)

    async def pod_view(self, out, state, ocs) -> None:
        """The fabric, the groups kept for small jobs, their tiles, switch use (SW-6)."""
        assert isinstance(ocs, RingsClient)
        view, sf = out.switched, self.switched
        view.fabric.CopyFrom(fabric_to_proto(self.fabric.pod_id, sf))
        view.small_groups.extend(sorted(self.fabric.small_groups))
        for job in state.jobs.values():
            if job.tile is not None and job.state in HOLDING_STATES:
                view.small_tiles[job.job_id].CopyFrom(tile_to_proto(sf, Tile(*job.tile)))
        with contextlib.suppress(OcsError):  # the pod view does not fail for want of switch use
            view.switches.extend(await ocs.switch_use())

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
    if fabric.switched is None:
        return TorusPlanner(fabric)
    return SwitchedPlanner(fabric, fabric.switched)


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
