"""Job and pod views of a SWITCHED pod (seed 002): parallelism, groups, small
jobs' rectangles and switch use, for GetJob / GetPod (WS-9, SW-6)."""

from __future__ import annotations

import contextlib
import math

from lightpath.domain.blocks import PodFabric
from lightpath.domain.slices import HOLDING_STATES, SliceJob
from lightpath.domain.switched_rings import Tile
from lightpath.v1 import common_pb2, workload_scheduler_pb2
from services.common.convert import fabric_to_proto, tile_to_proto
from services.workload_scheduler.ocs import OcsError, RingsClient
from services.workload_scheduler.placement import PodState


def job_tiles(fabric: PodFabric, job: SliceJob) -> list[Tile]:
    sf = fabric.switched
    assert sf is not None
    if job.tile is not None:
        return [Tile(*job.tile)]
    return [Tile.whole(sf, g) for g in job.placement or ()]


def add_switched_job(
    out: workload_scheduler_pb2.Job, job: SliceJob, fabric: PodFabric, holding: bool
) -> None:
    """The SWITCHED part of a job's view: degrees, processors, its groups' tiles."""
    sf = fabric.switched
    assert sf is not None
    d = job.degrees or (1, 1, 1)
    n = math.prod(d)
    out.switched.CopyFrom(
        workload_scheduler_pb2.SwitchedJob(
            degrees=common_pb2.ParallelismDegrees(data=d[0], pipeline=d[1], layer=d[2]),
            processors=n,
            small=n <= sf.group_size,
        )
    )
    if holding and job.placement:
        out.switched.tiles.extend(tile_to_proto(sf, t) for t in job_tiles(fabric, job))


async def switched_pod_view(
    fabric: PodFabric,
    state: PodState,
    out: workload_scheduler_pb2.SwitchedPodView,
    ocs: RingsClient,
) -> None:
    sf = fabric.switched
    assert sf is not None
    out.fabric.CopyFrom(fabric_to_proto(fabric.pod_id, sf))
    out.small_groups.extend(sorted(fabric.small_groups))
    for job in state.jobs.values():
        if job.tile is not None and job.state in HOLDING_STATES:
            out.small_tiles[job.job_id].CopyFrom(tile_to_proto(sf, Tile(*job.tile)))
    with contextlib.suppress(OcsError):  # the pod view does not fail for want of switch use
        out.switches.extend(await ocs.switch_use())
