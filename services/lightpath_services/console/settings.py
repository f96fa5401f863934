"""The console's typed settings (X-1): where the services are, how it serves, who may look."""

from __future__ import annotations

from typing import Annotated

from lightpath_services.common.settings import (
    Address,
    MetricsListen,
    OptionalAddress,
    PositiveFloat,
    Settings,
    choice,
    parse_address,
    rule,
    setting,
)
from lightpath_services.common.tls import is_loopback


def parse_named_addresses(raw: str) -> tuple[tuple[str, str], ...]:
    """`pod-1=127.0.0.1:50062,pod-2=127.0.0.1:50072` -> (("pod-1", "127.0.0.1:50062"), ...)."""
    out: dict[str, str] = {}
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, address = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{item!r} must look like name=host:port, e.g. pod-1=127.0.0.1:50062")
        out[name.strip()] = parse_address(address)
    return tuple(out.items())


class ConsoleSettings(Settings):
    listen: Address = setting(
        "LIGHTPATH_CONSOLE_LISTEN",
        "127.0.0.1:8443",
        "HTTPS listen address of the console (host:port; port 0 picks a free one); loopback "
        "unless you configure otherwise",
    )
    tls_cert: str = setting(
        "LIGHTPATH_TLS_CERT",
        "",
        "PEM certificate the console serves HTTPS with and presents to the services (its "
        "identity, spiffe://lightpath/service/console)",
    )
    tls_key: str = setting("LIGHTPATH_TLS_KEY", "", "PEM private key of LIGHTPATH_TLS_CERT")
    tls_ca: str = setting(
        "LIGHTPATH_TLS_CA", "", "PEM CA certificate(s) the services' certificates chain to"
    )
    cell_addr: Address = setting(
        "LIGHTPATH_CELL_ADDR",
        "127.0.0.1:50051",
        "host:port of the cell_scheduler",
    )
    core_broker_addr: OptionalAddress = setting(
        "LIGHTPATH_CORE_BROKER_ADDR",
        "",
        "host:port of the core_broker (empty: no core broker view)",
    )
    ocs_addrs: Annotated[tuple[tuple[str, str], ...], rule(parse_named_addresses)] = setting(
        "LIGHTPATH_CONSOLE_OCS_ADDRS",
        (),
        "each superpod's ocs_manager: pod-1=host:port,pod-2=host:port (a pod left out shows "
        "no OCS view)",
    )
    agg_addrs: Annotated[tuple[tuple[str, str], ...], rule(parse_named_addresses)] = setting(
        "LIGHTPATH_CONSOLE_AGG_ADDRS",
        (),
        "the aggregation switches: root=host:port,sub-1=host:port (empty: no aggregation view)",
    )
    agg_tree: str = setting("LIGHTPATH_AGG_TREE", "tree-1", "the aggregation tree shown")
    anonymous: Annotated[str, choice("auto", "read", "none")] = setting(
        "LIGHTPATH_CONSOLE_ANONYMOUS",
        "auto",
        "what a viewer who has not signed in sees: `read` (everything, read-only, as the "
        "console's own identity), `none` (only the sign-in page), `auto` (read when the "
        "console listens on loopback, else none)",
    )
    session_ttl_s: PositiveFloat = setting(
        "LIGHTPATH_CONSOLE_SESSION_TTL_S",
        28800.0,
        "seconds a sign-in lasts without use",
    )
    poll_s: PositiveFloat = setting(
        "LIGHTPATH_CONSOLE_POLL_S",
        2.0,
        "seconds between reads of what has no watch stream (OCS use, switch states, "
        "aggregation switches) and between checks of the live views",
    )
    log_level: Annotated[str, choice("debug", "info", "warning", "error")] = setting(
        "LIGHTPATH_LOG_LEVEL",
        "info",
        "debug, info, warning or error",
    )
    log_format: Annotated[str, choice("json", "text")] = setting(
        "LIGHTPATH_LOG_FORMAT", "json", "json or text"
    )
    instance_id: str = setting("LIGHTPATH_INSTANCE_ID", "console", "unique name of this process")
    metrics_listen: MetricsListen = setting(
        "LIGHTPATH_METRICS_LISTEN",
        "",
        "Prometheus scrape endpoint (HTTP GET /metrics, plaintext) of the console: host:port, "
        "or a port alone for 127.0.0.1:PORT; empty: none. Its watches' state is "
        "lightpath_task_down (deploy/monitoring: LightpathConsoleStale)",
    )

    def anonymous_reads(self) -> bool:
        """Whether viewers who have not signed in see the console's read-only view."""
        if self.anonymous == "auto":
            return is_loopback(self.listen)
        return self.anonymous == "read"
