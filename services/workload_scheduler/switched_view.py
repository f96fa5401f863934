"""Job and pod views of a SWITCHED pod (seed 002): parallelism, groups, small
jobs' rectangles and switch use, for GetJob / GetPod (WS-9, SW-6)."""

from __future__ import annotations

import contextlib
import math

from lightpath.v1 import common_pb2, workload_scheduler_pb2
from lightpath.v1 import ocs_manager_pb2 as ocs_pb
from services.ocs_manager.switched.rings import Tile
from services.ocs_manager.switched.server import config_to_proto, tile_to_proto
from services.workload_scheduler.fabric import PodFabric
from services.workload_scheduler.model import HOLDING_STATES, SliceJob
from services.workload_scheduler.ocs import OcsError
from services.workload_scheduler.placement import PodState
from services.workload_scheduler.store import JobRecord


def job_tiles(fabric: PodFabric, job: SliceJob) -> list[Tile]:
    sf = fabric.switched
    assert sf is not None
    if job.tile is not None:
        return [Tile(*job.tile)]
    return [Tile.whole(sf, g) for g in job.placement or ()]


def switched_job_pb(
    record: JobRecord,
    fabric: PodFabric,
    spec: workload_scheduler_pb2.JobSpec,
    with_history: bool,
    queue_position: int,
) -> workload_scheduler_pb2.Job:
    from services.workload_scheduler.server import _ts, job_event_pb

    job = record.summary
    sf = fabric.switched
    assert sf is not None
    d = job.degrees or (1, 1, 1)
    n = math.prod(d)
    out = workload_scheduler_pb2.Job(
        job_id=record.job_id,
        pod_id=fabric.pod_id,
        state=common_pb2.JobState.Value("JOB_STATE_" + record.state),
        reason=record.reason,
        spec=spec,
        priority=job.priority,
        grid=common_pb2.Shape(dims=job.demand.grid),
        chips=common_pb2.Shape(dims=[n]),
        created_at=_ts(record.created_ms),
        updated_at=_ts(record.updated_ms),
        queue_position=queue_position,
    )
    out.switched.CopyFrom(
        workload_scheduler_pb2.SwitchedJob(
            degrees=common_pb2.ParallelismDegrees(data=d[0], pipeline=d[1], layer=d[2]),
            processors=n,
            small=n <= sf.group_size,
        )
    )
    if record.state in HOLDING_STATES and job.placement:
        for i, (g, node_type) in enumerate(zip(job.placement, job.demand.node_types, strict=True)):
            out.blocks.append(
                workload_scheduler_pb2.SliceBlock(
                    position=common_pb2.Coordinate(coords=[i]), block_id=g, node_type=node_type
                )
            )
        out.switched.tiles.extend(tile_to_proto(sf, t) for t in job_tiles(fabric, job))
    if with_history:
        out.history.extend(job_event_pb(e, fabric.pod_id) for e in record.history)
    return out


async def switched_pod_view(
    sched, state: PodState, out: workload_scheduler_pb2.SwitchedPodView
) -> None:
    fabric = sched.fabric
    sf = fabric.switched
    assert sf is not None
    d = sf.describe()
    out.fabric.CopyFrom(
        ocs_pb.SwitchedFabric(
            pod_id=fabric.pod_id,
            config=config_to_proto(sf.config),
            spec=sf.config.spec(),
            groups=d["groups"],
            processors=d["processors"],
            tier0_switches=d["tier0_switches"],
            tier1_switches=d["tier1_switches"],
            links=d["links"],
            lanes=d["lanes"],
        )
    )
    out.small_groups.extend(sorted(fabric.small_groups))
    for job in state.jobs.values():
        if job.tile is not None and job.state in HOLDING_STATES:
            out.small_tiles[job.job_id].CopyFrom(tile_to_proto(sf, Tile(*job.tile)))
    with contextlib.suppress(OcsError):  # the pod view does not fail for want of switch use
        out.switches.extend(await sched.ocs.switch_use())
