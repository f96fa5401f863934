"""Settings of ocs_manager, from environment variables."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.settings import CommonSettings, parse_address, parse_id, setting


@dataclass(frozen=True)
class OcsManagerSettings(CommonSettings):
    listen: str = setting(
        "LIGHTPATH_LISTEN", "[::]:50062", "gRPC listen address", parse=parse_address
    )
    pod_id: str = setting(
        "LIGHTPATH_POD_ID",
        "pod-1",
        "the superpod whose optical fabric this manager programs",
        parse=parse_id,
    )
