"""Settings of cell_scheduler, from environment variables."""

from __future__ import annotations

from typing import Annotated

from lightpath_services.common.settings import (
    Address,
    CommonSettings,
    PositiveFloat,
    checked,
    setting,
)


def node_flops(raw: str) -> dict[str, float]:
    """Effective FLOP/s of one chip per node type, in the order given (the first is the default)."""
    from lightpath_services.cell_scheduler.request import is_type_name

    out: dict[str, float] = {}
    if not raw.strip():
        return out
    for part in raw.split(","):
        name, sep, value = part.strip().partition(":")
        if not sep or not is_type_name(name):
            raise ValueError(
                f'{part.strip()!r} must look like "tpu:275e12" (node type:FLOP/s per chip)'
            )
        try:
            flops = float(value)
        except ValueError:
            raise ValueError(f"{name}: {value!r} is not a number") from None
        if not flops > 0 or flops == float("inf"):
            raise ValueError(f"{name}: FLOP/s per chip must be > 0")
        if name in out:
            raise ValueError(f"node type {name!r} is listed twice")
        out[name] = flops
    return out


class CellSchedulerSettings(CommonSettings):
    listen: Address = setting("LIGHTPATH_LISTEN", "127.0.0.1:50051", "gRPC listen address")
    pod_timeout_s: PositiveFloat = setting(
        "LIGHTPATH_CELL_POD_TIMEOUT_S",
        5.0,
        "a pod silent (no heartbeat) for longer is not chosen and its jobs show UNKNOWN",
    )
    forward_timeout_s: PositiveFloat = setting(
        "LIGHTPATH_CELL_FORWARD_TIMEOUT_S",
        40.0,
        "deadline of a job forwarded to a pod (the pod answers once the slice is wired)",
    )
    reconcile_s: PositiveFloat = setting(
        "LIGHTPATH_CELL_RECONCILE_S",
        0.5,
        "seconds between rounds of the cell's background work (silent pods, the queue, "
        "forwards left by a dead replica)",
    )
    node_flops: Annotated[str, checked(node_flops)] = setting(
        "LIGHTPATH_CELL_NODE_FLOPS",
        "tpu:275e12,gpu:312e12",
        "effective FLOP/s of one chip per node type, for shapes derived from a compute "
        "demand (CS-4); the first type is the default",
    )
