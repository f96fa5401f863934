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


@dataclass(frozen=True)
class AggSwitchSettings(CommonSettings):
    listen: str = setting(
        "LIGHTPATH_LISTEN", "[::]:50091", "gRPC listen address", parse=parse_address
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
