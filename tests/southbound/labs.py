"""Real switches' management interfaces for the southbound tests (issue 34): a SONiC OCS is
a real redis-server (its CONFIG_DB and STATE_DB) with the orchagent emulator on it; a
Polatis-style switch is a NETCONF server over SSH (its own process). One per OCS."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from lightpath.domain.southbound import OCS, devices
from lightpath.domain.torus import Fabric
from lightpath.embedded_redis import EmbeddedRedis
from services.ocs_manager.device_switch import PortSides
from services.switch_agent.switches import SwitchTiming
from services.switch_emulators.sonic import OrchagentEmulator


@dataclass
class SonicSwitchLab:
    """One emulated SONiC OCS: its redis-server and orchagent."""

    switch_id: str
    server: EmbeddedRedis
    orchagent: OrchagentEmulator

    @property
    def url(self) -> str:
        return f"sonic://127.0.0.1:{self.server.port}"

    async def restart_empty(self) -> None:
        """Power cycle: Redis comes back empty (a new run id), orchagent starts again."""
        await self.orchagent.stop()
        self.server.stop()
        self.server.start()
        await self.orchagent.start()


@dataclass
class SonicLab:
    switches: dict[str, SonicSwitchLab] = field(default_factory=dict)

    def switch_map(self) -> str:
        """LIGHTPATH_OCS_SWITCHES naming every emulated switch."""
        return ",".join(f"{sid}={s.url}" for sid, s in self.switches.items())

    def __getitem__(self, switch_id: str) -> SonicSwitchLab:
        return self.switches[switch_id]


@contextlib.asynccontextmanager
async def sonic_lab(
    fabric: Fabric,
    workdir: Path,
    *,
    timing: SwitchTiming | None = None,
    only: set[str] | None = None,
    spare_ports: int = 2,
) -> AsyncIterator[SonicLab]:
    """A SONiC OCS per OCS of `fabric` (or of `only`), each with the ports the fabric
    cables plus `spare_ports` on each side."""
    lab = SonicLab()
    try:
        for d in devices(fabric):
            if d.kind != OCS or (only is not None and d.id not in only):
                continue
            sides = PortSides.of(fabric, d)
            server = EmbeddedRedis(workdir / f"sonic-{d.id}", appendonly=False)
            server.start()
            orch = OrchagentEmulator(
                f"redis://127.0.0.1:{server.port}",
                sides.first_ends + spare_ports,
                sides.second_ends + spare_ports,
                timing=timing or SwitchTiming.fixed(1.0),
            )
            lab.switches[d.id] = SonicSwitchLab(d.id, server, orch)
            await orch.start()
        yield lab
    finally:
        for s in lab.switches.values():
            with contextlib.suppress(Exception):
                await s.orchagent.stop()
            s.server.stop()
