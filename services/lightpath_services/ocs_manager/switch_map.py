"""Which driver programs which switch (issue 34): LIGHTPATH_OCS_SWITCHES.

`glob=address,...` by switch id, first match wins; the address's scheme picks the
driver, and `{id}` in it stands for the switch's id:

* `agent://host:port` (or bare `host:port`): a switch agent speaking
  optical_switch.proto (services/lightpath_services/switch_agent, a vendor's adapter);
* `sonic://[:password@]host[:port][?config_db=4&state_db=6]`: a SONiC OCS's own Redis
  (sonic_driver.py);
* `netconf://user@host[:port][?ingress=N]`: a Polatis-style switch's NETCONF server
  (netconf_driver.py).

LIGHTPATH_OCS_SWITCH_AGENTS (agents only) still works and is read after it.
Devices of the first two kinds are OCS only: a 1xK bank (`otm-*`) needs an agent.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from lightpath.domain.southbound import parse_endpoint_map

SCHEMES = ("agent", "sonic", "netconf")


@dataclass(frozen=True)
class SwitchEntry:
    glob: str
    scheme: str  # agent | sonic | netconf
    address: str  # host:port for an agent, the URL for a device

    def for_switch(self, switch_id: str) -> str:
        return self.address.replace("{id}", switch_id)


def parse_switch_map(raw: str) -> tuple[SwitchEntry, ...]:
    """ValueError naming the rule."""
    out: list[SwitchEntry] = []
    for item in (p.strip() for p in raw.split(",")):
        if not item:
            continue
        glob, sep, address = item.partition("=")
        if not sep or not glob or not address:
            raise ValueError(
                f"{item!r}: give glob=address entries separated by commas, e.g. "
                "ocs-x-*=sonic://{id}.mgmt:6379 (or ocs-*=netconf://admin@{id}.mgmt:830"
                ",otm-*=agent://10.0.0.6:50063)"
            )
        scheme, colon, rest = address.partition("://")
        if not colon:
            scheme, rest = "agent", address
        if scheme not in SCHEMES:
            raise ValueError(f"{item!r}: the scheme must be one of {', '.join(SCHEMES)}")
        if scheme == "agent":
            parse_endpoint_map(rest)  # host:port
            out.append(SwitchEntry(glob, "agent", rest))
        else:
            out.append(SwitchEntry(glob, scheme, address))
    return tuple(out)


def entry_of(entries: tuple[SwitchEntry, ...], switch_id: str) -> SwitchEntry | None:
    for e in entries:
        if fnmatch.fnmatchcase(switch_id, e.glob):
            return e
    return None


def combined(switches: str, agents: str) -> tuple[SwitchEntry, ...]:
    """LIGHTPATH_OCS_SWITCHES, then LIGHTPATH_OCS_SWITCH_AGENTS as agent entries."""
    return parse_switch_map(switches) + tuple(
        SwitchEntry(g, "agent", a) for g, a in parse_endpoint_map(agents)
    )
