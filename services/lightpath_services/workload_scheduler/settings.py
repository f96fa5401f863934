"""Settings of workload_scheduler, from environment variables."""

from __future__ import annotations

from typing import Annotated

from lightpath.domain.blocks import parse_block_types
from lightpath_services.common.settings import (
    Address,
    CommonSettings,
    Id,
    NonNegativeInt,
    OptionalAddress,
    PositiveFloat,
    checked,
    rule,
    setting,
)
from lightpath_services.workload_scheduler.planner import DEFAULT_AGE_BOUND_S


def parse_host_shape(raw: str) -> tuple[int, ...]:
    """LIGHTPATH_HOST_SHAPE: chips per host, like 2x2x1 (checked against the blocks at start)."""
    parts = raw.strip().lower().split("x")
    if not raw.strip() or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise ValueError("must look like 2x2x1 (extents >= 1 joined by x)")
    return tuple(int(p) for p in parts)


def parse_age_bound(raw: str) -> float | None:
    """LIGHTPATH_WS_AGE_BOUND_S: seconds >= 0, or "off"."""
    if raw.strip().lower() == "off":
        return None
    value = float(raw)
    if not value >= 0:
        raise ValueError('must be seconds >= 0, or "off"')
    return value


class WorkloadSchedulerSettings(CommonSettings):
    listen: Address = setting("LIGHTPATH_LISTEN", "127.0.0.1:50061", "gRPC listen address")
    pod_id: Id = setting("LIGHTPATH_POD_ID", "pod-1", "the superpod this scheduler serves")
    ocs_addr: Address = setting(
        "LIGHTPATH_OCS_ADDR",
        "127.0.0.1:50062",
        "host:port of this pod's ocs_manager",
    )
    cell_addr: OptionalAddress = setting(
        "LIGHTPATH_CELL_ADDR",
        "",
        "host:port of the cell_scheduler to register with; empty: run standalone",
    )
    advertise_addr: OptionalAddress = setting(
        "LIGHTPATH_ADVERTISE_ADDR",
        "",
        "host:port the cell uses to reach this scheduler; default 127.0.0.1:<port>",
    )
    cell_heartbeat_s: PositiveFloat = setting(
        "LIGHTPATH_CELL_HEARTBEAT_S",
        1.0,
        "seconds between reports to the cell (capacity, job transitions); also sent soon "
        "after any change in the pod",
    )
    block_types: Annotated[str, checked(parse_block_types)] = setting(
        "LIGHTPATH_BLOCK_TYPES",
        "tpu",
        'node type of each block, in block-id order: "tpu" (all), "tpu:60,gpu:4", '
        '"tpu:60,gpu" (gpu takes the rest)',
    )
    host_shape: Annotated[tuple[int, ...], rule(parse_host_shape)] = setting(
        "LIGHTPATH_HOST_SHAPE",
        (2, 2, 1),
        "chips of one host, like 2x2x1 (TPU v4: 4 chips a host, 16 hosts a 4x4x4 block); "
        "hosts are reported failed one by one. Must tile the block; on a pod whose blocks "
        "have other dimensions, or on a SWITCHED pod, one host per block is used",
    )
    wiring_timeout_s: PositiveFloat = setting(
        "LIGHTPATH_WS_WIRING_TIMEOUT_S",
        30.0,
        "seconds a slice may stay WIRING before another replica takes the wiring over",
    )
    ocs_timeout_s: PositiveFloat = setting(
        "LIGHTPATH_WS_OCS_TIMEOUT_S",
        45.0,
        "deadline of a call to the pod's ocs_manager, s; above a slow switch's worst case "
        "(its change lease, 30 s by default, bounds programming plus rollback). A WireSlice "
        "past it is followed through (finished or rolled back), and a retry gets twice as long",
    )
    switched_small_groups: NonNegativeInt = setting(
        "LIGHTPATH_SWITCHED_SMALL_GROUPS",
        2,
        "SWITCHED pods: how many groups (the last ones) are reserved for small jobs, those "
        "that fit in one group (SW-2)",
    )
    age_bound_s: Annotated[float | None, rule(parse_age_bound)] = setting(
        "LIGHTPATH_WS_AGE_BOUND_S",
        DEFAULT_AGE_BOUND_S,
        "seconds a job may wait unplaced before it may preempt the jobs of its own priority "
        "admitted after it (each by its own preemption policy), so later jobs that fit "
        'cannot starve a large one; "off": only lower priorities are ever preempted',
    )
    reconcile_s: PositiveFloat = setting(
        "LIGHTPATH_WS_RECONCILE_S",
        1.0,
        "seconds between reconcile rounds (leftover wiring, stalled wirings, the queue)",
    )
