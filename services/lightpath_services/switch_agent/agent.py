"""The switches one agent serves, and where their state is kept.

State is the agent's own: in memory, and (LIGHTPATH_AGENT_STATE_FILE) in a JSON
file written before a batch is answered (batches settling at once share one
write). Never the ocs_manager's Redis: a switch must keep its cross-connects
whatever happens to the controller (fail-static).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

from lightpath.domain.southbound import SouthboundDevice
from lightpath.errors import InvalidArgument, NotFound
from lightpath_services.switch_agent.faults import Faults, faults_for, parse_fault_spec
from lightpath_services.switch_agent.switches import SimulatedSwitch, SwitchTiming

log = logging.getLogger("lightpath.switch_agent")


class StateFile:
    """The switches' tables in one JSON file, replaced atomically; concurrent writers
    share a write (group commit)."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = asyncio.Lock()
        self._changed = 0
        self._written = 0

    def load(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"cannot read the agent state file {self.path}: {exc}") from exc
        return dict(data.get("switches", {}))

    async def save(self, snapshot) -> None:
        self._changed += 1
        mine = self._changed
        async with self._lock:
            if self._written >= mine:
                return  # a write that started after our change has it
            upto = self._changed
            data = snapshot()
            await asyncio.to_thread(self._write, data)
            self._written = upto

    def _write(self, data: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps(data, separators=(",", ":")))
        os.replace(tmp, self.path)


class Agent:
    """Simulated switches by id, with their settling time, faults and state file."""

    def __init__(
        self,
        devices: tuple[SouthboundDevice, ...],
        *,
        settle_s: float,
        timing: SwitchTiming | None = None,
        state_file: Path | None = None,
        faults: str = "",
        keys_kept: int = 1024,
    ):
        spec = parse_fault_spec(faults)
        self.timing = timing or SwitchTiming.fixed(settle_s * 1000)
        self.settle_s = self.timing.full_ms / 1000  # Describe's settling_time: a full set
        self.switches = {
            d.id: SimulatedSwitch(d, faults=faults_for(spec, d.id), keys_kept=keys_kept)
            for d in devices
        }
        self._file = StateFile(state_file) if state_file else None
        if self._file is not None:
            self._restore(self._file.load())

    def _restore(self, saved: dict[str, dict]) -> None:
        restored = 0
        for sid, s in saved.items():
            sw = self.switches.get(sid)
            if sw is None:
                continue
            sw.boot_id = str(s["boot_id"])
            sw.version = int(s["version"])
            sw.table = {int(p): int(q) for p, q in s.get("table", {}).items()}
            sw.outputs = {int(i): int(o) for i, o in s.get("outputs", {}).items()}
            # the highest token seen per lease: a restarted agent still refuses an older one
            sw.fences.update((lease, int(t)) for lease, t in s.get("fences", []))
            restored += 1
        if restored:
            log.info(
                "restored %d switches' tables from %s", restored, self._file and self._file.path
            )

    def snapshot(self) -> dict:
        return {
            "switches": {
                sid: {
                    "boot_id": sw.boot_id,
                    "version": sw.version,
                    "table": sw.table,
                    "outputs": sw.outputs,
                    "fences": list(sw.fences.items()),  # oldest first, as kept
                }
                for sid, sw in self.switches.items()
            }
        }

    async def persist(self) -> None:
        if self._file is not None:
            await self._file.save(self.snapshot)

    def switch(self, switch_id: str, field: str = "switch_id") -> SimulatedSwitch:
        if not switch_id:
            raise InvalidArgument(field, "must name a switch (e.g. ocs-x-0-0)")
        sw = self.switches.get(switch_id)
        if sw is None:
            some = ", ".join(list(self.switches)[:3])
            raise NotFound(
                "switch",
                switch_id,
                hint=f"this agent serves {len(self.switches)} switches ({some}, ...)",
            )
        return sw

    def targets(self, switch_id: str) -> list[SimulatedSwitch]:
        """One switch, or all of them for "*"."""
        if switch_id == "*":
            return list(self.switches.values())
        return [self.switch(switch_id)]

    def set_faults(self, switch_id: str, faults: Faults) -> list[str]:
        targets = self.targets(switch_id)
        for sw in targets:
            sw.faults = Faults(**vars(faults))
        return [sw.id for sw in targets]

    async def restart(self, switch_id: str) -> SimulatedSwitch:
        sw = self.switch(switch_id)
        sw.restart_empty()
        log.warning("switch %s restarted with empty tables (boot %s)", sw.id, sw.boot_id)
        await self.persist()
        return sw
