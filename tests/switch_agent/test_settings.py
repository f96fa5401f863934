"""Bad settings of the agent and of the manager's agent driver stop the start, naming the
variable and the rule (issue 20)."""

from __future__ import annotations

import pytest

from lightpath_services.common.settings import SettingsError, load
from lightpath_services.ocs_manager.settings import OcsManagerSettings
from lightpath_services.switch_agent.settings import SwitchAgentSettings


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"LIGHTPATH_AGENT_SWITCHES": "nope-*"}, "matches none of the pod's switches"),
        ({"LIGHTPATH_AGENT_SWITCHES": " , "}, "at least one switch id"),
        ({"LIGHTPATH_AGENT_FAULTS": "ocs-x-0-0=melted"}, "is not a fault"),
        ({"LIGHTPATH_AGENT_FAULTS": "unreachable"}, "<switch id or glob>=<fault>"),
        ({"LIGHTPATH_AGENT_SETTLE_MS": "-1"}, "LIGHTPATH_AGENT_SETTLE_MS"),
        ({"LIGHTPATH_FABRIC_OCS_RADIX": "10"}, "LIGHTPATH_FABRIC_OCS_RADIX"),
    ],
)
def test_the_agent_refuses_bad_settings(env, says):
    with pytest.raises(SettingsError, match=says):
        load(SwitchAgentSettings, env)


def test_the_agent_reads_faults_and_a_selection():
    s = load(
        SwitchAgentSettings,
        {
            "LIGHTPATH_AGENT_SWITCHES": "ocs-x-*",
            "LIGHTPATH_AGENT_FAULTS": "ocs-x-1-0=slow:200+reject:2",
        },
    )
    assert s.switches == "ocs-x-*"


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"LIGHTPATH_OCS_SWITCH_AGENTS": "nohost"}, "LIGHTPATH_OCS_SWITCH_AGENTS"),
        (
            {"LIGHTPATH_OCS_SWITCH_AGENTS": "ocs-x-*=127.0.0.1:1"},
            "names no agent for switch ocs-y-0-0",
        ),
        (
            {"LIGHTPATH_OCS_SWITCH_AGENTS": "127.0.0.1:1", "LIGHTPATH_OCS_SWITCH_TIMEOUT_S": "20"},
            "below half of LIGHTPATH_OCS_CHANGE_LEASE_S",
        ),
        ({"LIGHTPATH_OCS_SWITCHES": "ocs-*=gnmi://x:1"}, "scheme must be one of"),
        ({"LIGHTPATH_OCS_SWITCHES": "sonic://x:1"}, "glob=address"),
        (
            {"LIGHTPATH_OCS_SWITCHES": "ocs-x-*=sonic://{id}:6379"},
            "names no agent for switch ocs-y-0-0",
        ),
        (
            {
                "LIGHTPATH_FABRIC_OCS_PER_AXIS": "2",
                "LIGHTPATH_FABRIC_OCS_RADIX": "136",
                "LIGHTPATH_OCS_SWITCHES": "*=sonic://{id}:6379",
            },
            "otm-0 is a bank of 1xK switches: only a switch agent",
        ),
    ],
)
def test_the_manager_refuses_an_incomplete_switch_map(env, says):
    with pytest.raises(SettingsError, match=says):
        load(OcsManagerSettings, env)


def test_a_switch_map_by_glob_covers_every_switch():
    s = load(
        OcsManagerSettings,
        {
            "LIGHTPATH_FABRIC_OCS_PER_AXIS": "2",
            "LIGHTPATH_OCS_SWITCH_AGENTS": "ocs-*=10.0.0.5:50063,otm-*=10.0.0.6:50063",
        },
    )
    assert s.switch_endpoints == (("ocs-*", "10.0.0.5:50063"), ("otm-*", "10.0.0.6:50063"))


def test_devices_and_agents_together_cover_every_switch():
    from lightpath_services.ocs_manager.switch_map import entry_of

    s = load(
        OcsManagerSettings,
        {
            "LIGHTPATH_OCS_SWITCHES": "ocs-x-*=sonic://:pw@{id}.mgmt,ocs-y-*=netconf://admin@{id}",
            "LIGHTPATH_OCS_SWITCH_AGENTS": "127.0.0.1:50063",
        },
    )
    e = entry_of(s.switch_entries, "ocs-x-1-0")
    assert e is not None and e.scheme == "sonic"
    assert e.for_switch("ocs-x-1-0") == "sonic://:pw@ocs-x-1-0.mgmt"
    assert entry_of(s.switch_entries, "ocs-y-0-0").scheme == "netconf"  # type: ignore[union-attr]
    assert entry_of(s.switch_entries, "ocs-z-0-0").scheme == "agent"  # type: ignore[union-attr]
