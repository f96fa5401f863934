"""Settings of agg_switch, from environment variables."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.settings import CommonSettings, parse_address, parse_id, setting


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
