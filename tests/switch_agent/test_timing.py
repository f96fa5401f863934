"""The switch model's timing (issue 34): settling grows with the ports a batch moves, a
batch that adds before it deletes pays the conflict penalty, and power readings follow
the ports' states. Checked on the model's own account of each batch (no wall clock)."""

from __future__ import annotations

import pytest

from lightpath.domain.southbound import OCS, SouthboundDevice
from lightpath_services.common.settings import load
from lightpath_services.switch_agent.settings import SwitchAgentSettings
from lightpath_services.switch_agent.switches import (
    DARK_DBM,
    Batch,
    SimulatedSwitch,
    SwitchTiming,
    power_dbm,
)


def test_the_calient_defaults_and_the_forms():
    t = SwitchTiming()
    assert (t.min_ms, t.full_ms, t.conflict_ms) == (25.0, 200.0, 500.0)
    assert t.settle_s(0, 64) == 0.0
    assert t.settle_s(64, 64) == pytest.approx(0.200)  # a full set, deletes before adds
    assert t.settle_s(64, 64, conflicts=32) == pytest.approx(0.500)  # every port in conflict
    assert t.settle_s(2, 64) < t.settle_s(32, 64) < t.settle_s(64, 64)
    assert SwitchTiming.parse("ports:1/2/5") == SwitchTiming(1, 2, 5)
    assert SwitchTiming.parse("fixed:10").settle_s(0, 64) == pytest.approx(0.010)
    assert SwitchTiming.parse("calient-s320") == SwitchTiming()
    for bad in ("ports:5/2/1", "fixed:-1", "slow", "ports:1/2"):
        with pytest.raises(ValueError, match="calient-s320"):
            SwitchTiming.parse(bad)


def test_the_agent_setting_picks_the_model():
    s = load(SwitchAgentSettings, {"LIGHTPATH_AGENT_TIMING": "ports:1/2/5"})
    assert s.switch_timing == SwitchTiming(1, 2, 5)
    assert load(SwitchAgentSettings, {}).switch_timing == SwitchTiming.fixed(10.0)


async def _noop() -> None:
    return None


async def test_settling_follows_the_ports_moved_and_conflicts():
    sw = SimulatedSwitch(SouthboundDevice("ocs-x-0-0", OCS, 16, 0, 0))
    timing = SwitchTiming(1.0, 4.0, 10.0)  # ms: small, so the test is quick

    async def apply(key: str, batch: Batch) -> float:
        await sw.apply(key, batch, settle_s=timing, persist=_noop)
        return sw.last_settle_s

    one = await apply("a", Batch(connect=((8, 0),)))
    assert one == pytest.approx(timing.settle_s(2, 16))
    many = await apply("b", Batch(connect=((9, 1), (10, 2), (11, 3), (12, 4))))
    assert many == pytest.approx(timing.settle_s(8, 16)) and many > one
    # re-patch 8 onto 1 with deletes first: no conflict
    clean = await apply("c", Batch(disconnect=((8, 0), (9, 1)), connect=((8, 1),)))
    assert sw.conflicts == 0 and clean == pytest.approx(timing.settle_s(4, 16))
    # moving 1 back to 9 without deleting (8, 1) first: the switch resolves the conflict
    dirty = await apply("d", Batch(connect=((9, 1),)))
    assert sw.conflicts == 1
    assert dirty == pytest.approx(timing.settle_s(3, 16, conflicts=1))
    assert dirty > timing.settle_s(3, 16)


def test_power_readings():
    assert power_dbm("ocs-x-0-0", 3, None, False) == DARK_DBM
    assert power_dbm("ocs-x-0-0", 3, 9, True) == DARK_DBM  # the mirror is moving
    lit = power_dbm("ocs-x-0-0", 3, 9, False)
    assert -2.5 <= lit <= -1.0 and lit == power_dbm("ocs-x-0-0", 9, 3, False)
