"""Bad settings of the agent and of the manager's agent driver stop the start, naming the
variable and the rule (issue 20)."""

from __future__ import annotations

import pytest

from services.common.settings import SettingsError, load
from services.ocs_manager.settings import OcsManagerSettings
from services.switch_agent.settings import SwitchAgentSettings


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
