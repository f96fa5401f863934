"""Pods and jobs for the pure planning tests (no I/O)."""

from __future__ import annotations

import math

from lightpath.domain.blocks import PodFabric, block_types_for, parse_block_types
from lightpath.domain.slices import (
    DELAY,
    PENDING,
    RUNNING,
    SliceDemand,
    SliceJob,
)
from lightpath_services.workload_scheduler.placement import PodState


def fabric(
    types: str = "tpu", blocks: int = 64, k: int = 1, shape=(4, 4, 4), hosts=()
) -> PodFabric:
    node_types = block_types_for(parse_block_types(types), blocks)
    groups = tuple(b % k for b in range(blocks)) if k > 1 else ()
    return PodFabric("pod-t", shape, node_types, k, groups, host_shape=tuple(hosts))


def demand(grid, types: str | tuple[str, ...] = "tpu", wrap=None) -> SliceDemand:
    n = math.prod(grid)
    node_types = (types,) * n if isinstance(types, str) else tuple(types)
    return SliceDemand(tuple(grid), node_types, tuple(wrap) if wrap else (True,) * len(grid))


_seq = iter(range(1, 10**9))


def job(
    job_id: str,
    grid,
    *,
    priority: int = 50,
    state: str = PENDING,
    placement=None,
    types: str | tuple[str, ...] = "tpu",
    policy: str = DELAY,
    shrink_to=(),
    seq: int | None = None,
) -> SliceJob:
    return SliceJob(
        job_id=job_id,
        state=state,
        epoch=1,
        priority=priority,
        seq=seq if seq is not None else next(_seq),
        demand=demand(grid, types),
        placement=tuple(placement) if placement is not None else None,
        preemption=policy,
        shrink_to=tuple(tuple(g) for g in shrink_to),
    )


def pod(fab: PodFabric | None = None, *, failed=(), jobs=()) -> PodState:
    """A pod whose running/wiring jobs hold (and are wired on) their placements."""
    state = PodState(fab or fabric(), failed=set(failed))
    for j in jobs:
        state.jobs[j.job_id] = j
        if j.placement is not None and j.state in (RUNNING, "WIRING"):
            for b in j.placement:
                state.owner[b] = j.job_id
                state.wired[b] = j.job_id
    return state


def running(job_id: str, blocks, grid=None, **kw) -> SliceJob:
    blocks = list(blocks)
    return job(job_id, grid or (len(blocks), 1, 1), state=RUNNING, placement=blocks, **kw)
