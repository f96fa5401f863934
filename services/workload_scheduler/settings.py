"""Settings of workload_scheduler, from environment variables."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.settings import (
    CommonSettings,
    parse_address,
    parse_id,
    parse_optional_address,
    setting,
)


@dataclass(frozen=True)
class WorkloadSchedulerSettings(CommonSettings):
    listen: str = setting(
        "LIGHTPATH_LISTEN", "[::]:50061", "gRPC listen address", parse=parse_address
    )
    pod_id: str = setting(
        "LIGHTPATH_POD_ID", "pod-1", "the superpod this scheduler serves", parse=parse_id
    )
    ocs_addr: str = setting(
        "LIGHTPATH_OCS_ADDR",
        "127.0.0.1:50062",
        "host:port of this pod's ocs_manager",
        parse=parse_address,
    )
    cell_addr: str = setting(
        "LIGHTPATH_CELL_ADDR",
        "",
        "host:port of the cell_scheduler to register with; empty: run standalone",
        parse=parse_optional_address,
    )
    advertise_addr: str = setting(
        "LIGHTPATH_ADVERTISE_ADDR",
        "",
        "host:port the cell uses to reach this scheduler; default 127.0.0.1:<port>",
        parse=parse_optional_address,
    )
