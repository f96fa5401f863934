"""Settings of ocs_manager, from environment variables."""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import model_validator

from lightpath.domain.southbound import devices, parse_endpoint_map
from lightpath.domain.switched import SwitchedFabricConfig
from lightpath.domain.torus import Fabric
from lightpath.errors import InvalidArgument
from lightpath_services.common.settings import (
    Address,
    Id,
    NonNegativeFloat,
    PositiveFloat,
    SettingsError,
    TorusFabricSettings,
    checked,
    rule,
    setting,
)
from lightpath_services.ocs_manager.switch_map import combined, entry_of, parse_switch_map

FABRIC_KINDS = ("OCS_TORUS", "SWITCHED")


def _fabric_kind(raw: str) -> str:
    kind = raw.strip().upper().removeprefix("FABRIC_KIND_")
    if kind not in FABRIC_KINDS:
        raise ValueError(f"must be one of {', '.join(FABRIC_KINDS)}")
    return kind


def _switched_fabric(raw: str) -> str:
    """SW-1: read and check the one-line switched fabric; keep it in canonical form."""
    try:
        return SwitchedFabricConfig.parse(raw).validate().spec()
    except InvalidArgument as exc:
        raise ValueError("; ".join(f"{v.field}: {v.rule}" for v in exc.violations)) from None


class OcsManagerSettings(TorusFabricSettings):
    listen: Address = setting("LIGHTPATH_LISTEN", "127.0.0.1:50062", "gRPC listen address")
    pod_id: Id = setting(
        "LIGHTPATH_POD_ID",
        "pod-1",
        "the superpod whose optical fabric this manager programs",
    )
    driver_settle_ms: NonNegativeFloat = setting(
        "LIGHTPATH_OCS_DRIVER_SETTLE_MS",
        0.0,
        "settling delay the simulated switches add to every change (MEMS mirrors), ms",
    )
    switch_agents: Annotated[str, checked(parse_endpoint_map)] = setting(
        "LIGHTPATH_OCS_SWITCH_AGENTS",
        "",
        "where the switches are: empty for the simulation in Redis (the default driver); "
        "host:port of one switch agent serving all of them; or glob=host:port,... by switch "
        "id (ocs-x-*=10.0.0.5:50063,otm-*=10.0.0.6:50063; first match wins). "
        "docs/ocs_southbound.md",
    )
    switches: Annotated[str, checked(parse_switch_map)] = setting(
        "LIGHTPATH_OCS_SWITCHES",
        "",
        "the driver of each switch, glob=address by switch id (first match wins; {id} is the "
        "switch's id): agent://host:port (a switch agent), sonic://[:password@]host[:port] "
        "(a SONiC OCS's own Redis: CONFIG_DB/STATE_DB), netconf://user@host[:port] "
        "(a Polatis-style NETCONF server). Read before LIGHTPATH_OCS_SWITCH_AGENTS. "
        "docs/ocs_southbound.md",
    )
    netconf_password_file: str = setting(
        "LIGHTPATH_OCS_NETCONF_PASSWORD_FILE",
        "",
        "file holding the NETCONF switches' SSH password (or use a key file)",
    )
    netconf_key_file: str = setting(
        "LIGHTPATH_OCS_NETCONF_KEY_FILE",
        "",
        "private key for the NETCONF switches' SSH login",
    )
    netconf_known_hosts: str = setting(
        "LIGHTPATH_OCS_NETCONF_KNOWN_HOSTS",
        "",
        "OpenSSH known_hosts file pinning the NETCONF switches' host keys ([host]:port key); "
        "empty: ~/.ssh/known_hosts",
    )
    switch_timeout_s: PositiveFloat = setting(
        "LIGHTPATH_OCS_SWITCH_TIMEOUT_S",
        5.0,
        "deadline of one call to a switch agent, s (above its settling time; below half the "
        "change lease)",
    )
    reconcile_s: PositiveFloat = setting(
        "LIGHTPATH_OCS_RECONCILE_S",
        5.0,
        "with switch agents: how often the switches are read and put back to the committed "
        "tables (a switch restarted empty, a port changed behind the manager), s",
    )
    change_lease_s: PositiveFloat = setting(
        "LIGHTPATH_OCS_CHANGE_LEASE_S",
        30.0,
        "how long a wire/release/replace may hold a slice before another call rolls it back",
    )

    fabric_kind: Annotated[str, rule(_fabric_kind)] = setting(
        "LIGHTPATH_FABRIC_KIND",
        "OCS_TORUS",
        "OCS_TORUS (building blocks wired by OCS, seed 000) or SWITCHED (processor groups on "
        "two-tier switches, seed 002): which fabric this manager serves",
    )
    switched_fabric: Annotated[str, rule(_switched_fabric)] = setting(
        "LIGHTPATH_SWITCHED_FABRIC",
        "group=3x3 cluster=2x4 planes=9 ports=48/16 tier1=2x64",
        "SWITCHED pods: group shape (p or rxc), cluster of groups, switch planes per "
        "dimension, tier-0 down/up ports, tier-1 switches per plane x ports, optional mesh= "
        "and rowcol= links",
    )

    @property
    def switched_config(self) -> SwitchedFabricConfig:
        return SwitchedFabricConfig.parse(self.switched_fabric)

    @model_validator(mode="after")
    def check_switches(self) -> Self:
        if (self.switch_agents or self.switches) and self.fabric_kind == "OCS_TORUS":
            if self.switch_timeout_s >= self.change_lease_s / 2:
                raise SettingsError(
                    f"LIGHTPATH_OCS_SWITCH_TIMEOUT_S={self.switch_timeout_s:g} must be below half "
                    f"of LIGHTPATH_OCS_CHANGE_LEASE_S={self.change_lease_s:g}: a change and its "
                    "rollback must both fit in the lease"
                )
            entries = self.switch_entries
            for d in devices(Fabric(self.fabric_config)):
                e = entry_of(entries, d.id)
                if e is None:
                    raise SettingsError(
                        f"LIGHTPATH_OCS_SWITCHES={self.switches!r} / LIGHTPATH_OCS_SWITCH_AGENTS="
                        f"{self.switch_agents!r} names no agent for switch {d.id} (nor a device "
                        "driver): add an entry matching it (or * for the rest)"
                    )
                if d.kind != "OCS" and e.scheme != "agent":
                    raise SettingsError(
                        f"switch {d.id} is a bank of 1xK switches: only a switch agent "
                        f"drives one, not {e.scheme} (LIGHTPATH_OCS_SWITCHES entry {e.glob})"
                    )
        return self

    @property
    def switch_entries(self):
        return combined(self.switches, self.switch_agents)

    @property
    def switch_endpoints(self) -> tuple[tuple[str, str], ...]:
        return parse_endpoint_map(self.switch_agents)
