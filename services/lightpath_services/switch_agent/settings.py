"""Settings of switch_agent, from environment variables.

The agent serves the switches of one pod's optical fabric, derived from the same
LIGHTPATH_FABRIC_* settings the pod's ocs_manager reads (lightpath.domain.southbound),
narrowed by LIGHTPATH_AGENT_SWITCHES.
"""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import model_validator

from lightpath.domain.southbound import devices, select
from lightpath.domain.switch_timing import SwitchTiming
from lightpath.domain.torus import Fabric
from lightpath_services.common.settings import (
    Address,
    Id,
    NonNegativeFloat,
    PositiveInt,
    SettingsError,
    TorusFabricSettings,
    checked,
    rule,
    setting,
)
from lightpath_services.switch_agent.faults import parse_fault_spec


def _timing(raw: str) -> str:
    if raw.strip():
        SwitchTiming.parse(raw)  # ValueError naming the forms
    return raw.strip()


def _globs(raw: str) -> str:
    if not any(p.strip() for p in raw.split(",")):
        raise ValueError("give at least one switch id or glob, e.g. * or ocs-x-*,otm-*")
    return raw.strip()


class SwitchAgentSettings(TorusFabricSettings):
    listen: Address = setting("LIGHTPATH_LISTEN", "127.0.0.1:50063", "gRPC listen address")
    pod_id: Id = setting(
        "LIGHTPATH_POD_ID",
        "pod-1",
        "the pod whose switches this agent serves: only that pod's ocs_manager may program them",
    )
    switches: Annotated[str, rule(_globs)] = setting(
        "LIGHTPATH_AGENT_SWITCHES",
        "*",
        "which of the pod's switches this agent serves: comma-separated ids or globs "
        "(ocs-x-*, otm-*, ocs-y-3-0)",
    )
    settle_ms: NonNegativeFloat = setting(
        "LIGHTPATH_AGENT_SETTLE_MS",
        10.0,
        "settling time of every batch (MEMS mirrors moving), ms; ApplyBatch answers after it",
    )
    timing: Annotated[str, rule(_timing)] = setting(
        "LIGHTPATH_AGENT_TIMING",
        "",
        "settling that depends on the ports a batch moves: calient-s320 (25 ms for one pair, "
        "200 ms for every port, 500 ms when the switch resolves conflicts), "
        "ports:<min>/<full>/<conflict> (ms) or fixed:<ms>; empty: LIGHTPATH_AGENT_SETTLE_MS "
        "for every batch",
    )
    state_file: str = setting(
        "LIGHTPATH_AGENT_STATE_FILE",
        "",
        "file keeping the switches' tables across agent restarts (JSON, written before a "
        "batch is answered); empty: in memory, so a restarted agent's switches come up empty",
    )
    faults: Annotated[str, checked(parse_fault_spec)] = setting(
        "LIGHTPATH_AGENT_FAULTS",
        "",
        "faults injected at start: glob=fault[+fault],... with fault unreachable, slow:<ms>, "
        "reject:<n> or partial:<n> (e.g. ocs-x-3-0=unreachable,otm-*=slow:200)",
    )
    idempotency_keys: PositiveInt = setting(
        "LIGHTPATH_AGENT_IDEMPOTENCY_KEYS",
        1024,
        "batch ids whose outcome each switch remembers (a repeated one is answered, not re-applied)",
    )

    @property
    def switch_timing(self) -> SwitchTiming:
        if self.timing:
            return SwitchTiming.parse(self.timing)
        return SwitchTiming.fixed(self.settle_ms)

    @model_validator(mode="after")
    def check_selection(self) -> Self:
        fabric = Fabric(self.fabric_config)
        if not select(devices(fabric), self.switches):
            raise SettingsError(
                f"LIGHTPATH_AGENT_SWITCHES={self.switches!r} matches none of the pod's switches "
                f"(ids like {fabric.ocs_ids[0]}" + (", otm-0)" if fabric.k > 1 else ")")
            )
        return self
