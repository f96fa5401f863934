"""Settings of agg_switch, from environment variables."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from lightpath_services.common.settings import (
    Address,
    CommonSettings,
    Id,
    OptionalAddress,
    choice,
    setting,
)

Seconds = Annotated[float, Field(gt=0, le=86400)]


class AggSwitchSettings(CommonSettings):
    listen: Address = setting("LIGHTPATH_LISTEN", "127.0.0.1:50091", "gRPC listen address")
    switch_id: Id = setting(
        "LIGHTPATH_SWITCH_ID", "root", "this switch's id in the aggregation tree"
    )
    tree_id: Id = setting(
        "LIGHTPATH_AGG_TREE",
        "tree-1",
        "the aggregation tree (topology in Redis) this switch belongs to",
    )
    advertise_addr: OptionalAddress = setting(
        "LIGHTPATH_ADVERTISE_ADDR",
        "",
        "host:port other switches and compute nodes use to reach this one; default 127.0.0.1:<port>",
    )
    slots: Annotated[int, Field(ge=1, le=1_000_000)] = setting(
        "LIGHTPATH_AGG_SLOTS",
        64,
        "aggregation slots of this switch (one per chunk in flight), shared by all commands",
    )
    chunk_bytes: Annotated[int, Field(ge=8, le=16 << 20, multiple_of=8)] = setting(
        "LIGHTPATH_AGG_CHUNK_BYTES",
        1 << 20,
        "default chunk size of a command (bytes; a command may choose its own)",
    )
    transport: Annotated[str, choice("auto", "grpc")] = setting(
        "LIGHTPATH_AGG_TRANSPORT",
        "auto",
        "auto: chunks go through shared memory to peers proven to share this host, "
        "gRPC bytes to the others; grpc: always gRPC bytes",
    )
    shm_min_bytes: Annotated[int, Field(ge=0, le=1 << 30)] = setting(
        "LIGHTPATH_AGG_SHM_MIN_BYTES",
        65536,
        "chunks smaller than this go as gRPC bytes even to co-located peers",
    )
    shm_idle_s: Seconds = setting(
        "LIGHTPATH_AGG_SHM_IDLE_S",
        30.0,
        "seconds a free shared-memory buffer stays pooled before it is unlinked",
    )
    correction_grace_s: Seconds = setting(
        "LIGHTPATH_AGG_CORRECTION_GRACE_S",
        5.0,
        "seconds a node has to send a refused chunk again correctly before the command "
        "fails across the tree (a FINAL to a wrong destination, a chunk of the wrong size)",
    )
