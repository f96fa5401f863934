"""Settings of core_broker, from environment variables."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.settings import CommonSettings, parse_address, setting


@dataclass(frozen=True)
class CoreBrokerSettings(CommonSettings):
    listen: str = setting(
        "LIGHTPATH_LISTEN", "[::]:50081", "gRPC listen address", parse=parse_address
    )
