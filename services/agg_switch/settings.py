"""Settings of agg_switch, from environment variables."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.settings import (
    CommonSettings,
    parse_address,
    parse_id,
    parse_optional_address,
    setting,
)


def _parse_slots(raw: str) -> int:
    value = int(raw.strip())
    if not 1 <= value <= 1_000_000:
        raise ValueError("must be an integer within 1..1000000")
    return value


def _parse_chunk_bytes(raw: str) -> int:
    value = int(raw.strip())
    if not 8 <= value <= 16 << 20 or value % 8:
        raise ValueError("must be a multiple of 8 within 8..16777216")
    return value


def _parse_transport(raw: str) -> str:
    value = raw.strip().lower()
    if value not in ("auto", "grpc"):
        raise ValueError("must be auto (shared memory with co-located peers) or grpc")
    return value


def _parse_min_bytes(raw: str) -> int:
    value = int(raw.strip())
    if not 0 <= value <= 1 << 30:
        raise ValueError("must be an integer within 0..1073741824")
    return value


def _parse_idle_s(raw: str) -> float:
    value = float(raw.strip())
    if not 0 < value <= 86400:
        raise ValueError("must be a number of seconds within (0, 86400]")
    return value


@dataclass(frozen=True)
class AggSwitchSettings(CommonSettings):
    listen: str = setting(
        "LIGHTPATH_LISTEN", "127.0.0.1:50091", "gRPC listen address", parse=parse_address
    )
    switch_id: str = setting(
        "LIGHTPATH_SWITCH_ID", "root", "this switch's id in the aggregation tree", parse=parse_id
    )
    tree_id: str = setting(
        "LIGHTPATH_AGG_TREE",
        "tree-1",
        "the aggregation tree (topology in Redis) this switch belongs to",
        parse=parse_id,
    )
    advertise_addr: str = setting(
        "LIGHTPATH_ADVERTISE_ADDR",
        "",
        "host:port other switches and compute nodes use to reach this one; default 127.0.0.1:<port>",
        parse=parse_optional_address,
    )
    slots: int = setting(
        "LIGHTPATH_AGG_SLOTS",
        64,
        "aggregation slots of this switch (one per chunk in flight), shared by all commands",
        parse=_parse_slots,
    )
    chunk_bytes: int = setting(
        "LIGHTPATH_AGG_CHUNK_BYTES",
        1 << 20,
        "default chunk size of a command (bytes; a command may choose its own)",
        parse=_parse_chunk_bytes,
    )
    transport: str = setting(
        "LIGHTPATH_AGG_TRANSPORT",
        "auto",
        "auto: chunks go through shared memory to peers proven to share this host, "
        "gRPC bytes to the others; grpc: always gRPC bytes",
        parse=_parse_transport,
    )
    shm_min_bytes: int = setting(
        "LIGHTPATH_AGG_SHM_MIN_BYTES",
        65536,
        "chunks smaller than this go as gRPC bytes even to co-located peers",
        parse=_parse_min_bytes,
    )
    shm_idle_s: float = setting(
        "LIGHTPATH_AGG_SHM_IDLE_S",
        30.0,
        "seconds a free shared-memory buffer stays pooled before it is unlinked",
        parse=_parse_idle_s,
    )
    correction_grace_s: float = setting(
        "LIGHTPATH_AGG_CORRECTION_GRACE_S",
        5.0,
        "seconds a node has to send a refused chunk again correctly before the command "
        "fails across the tree (a FINAL to a wrong destination, a chunk of the wrong size)",
        parse=_parse_idle_s,
    )
