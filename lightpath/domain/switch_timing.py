"""How a MEMS optical circuit switch settles, and what its power monitors read (issue 34).

Pure: the switch model shared by the reference switch agent (services/lightpath_services/switch_agent)
and the emulators of real switches' interfaces (services/lightpath_services/switch_emulators).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class SwitchTiming:
    """How long a MEMS OCS takes to settle a batch (issue 34).

    settle = min_ms + (full_ms - min_ms) * moved / ports
                    + (conflict_ms - full_ms) * min(1, 2 * conflicts / ports)

    `moved`: ports whose mirror moves (both ends of every cross-connect made or undone);
    `conflicts`: connects that found a port still in another cross-connect, which the
    switch must resolve itself (the batch added before it deleted). Defaults from
    Calient's S320 data sheet: a full set reconfigured in <= 200 ms when the controller
    sends deletes before adds, up to 500 ms when the switch resolves the conflicts; a
    single pair in about 25 ms. `fixed(ms)` is the old constant settling time."""

    min_ms: float = 25.0
    full_ms: float = 200.0
    conflict_ms: float = 500.0

    @classmethod
    def fixed(cls, ms: float) -> SwitchTiming:
        return cls(ms, ms, ms)

    @classmethod
    def parse(cls, raw: str) -> SwitchTiming:
        """`calient-s320` (the defaults), `fixed:<ms>`, or `ports:<min>/<full>/<conflict>`
        (ms). ValueError naming the form."""
        text = raw.strip().lower()
        try:
            if text in ("", "calient-s320", "ports"):
                return cls()
            if text.startswith("fixed:"):
                return cls.fixed(_ms(text.removeprefix("fixed:")))
            if text.startswith("ports:"):
                parts = [_ms(v) for v in text.removeprefix("ports:").split("/")]
                if len(parts) == 3 and parts[0] <= parts[1] <= parts[2]:
                    return cls(*parts)
        except ValueError:
            pass
        raise ValueError(
            f"{raw!r}: give calient-s320, fixed:<ms> or ports:<min>/<full>/<conflict> "
            "(ms, min <= full <= conflict; e.g. ports:25/200/500)"
        )

    @property
    def is_fixed(self) -> bool:
        return self.min_ms == self.full_ms == self.conflict_ms

    def settle_s(self, moved: int, ports: int, conflicts: int = 0) -> float:
        """Seconds a batch moving `moved` of `ports` ports settles (fixed: always the same;
        else 0 if nothing moves)."""
        if self.is_fixed:
            return self.full_ms / 1000
        if moved <= 0:
            return 0.0
        share = min(1.0, moved / max(1, ports))
        ms = self.min_ms + (self.full_ms - self.min_ms) * share
        if conflicts:
            ms += (self.conflict_ms - self.full_ms) * min(1.0, 2 * conflicts / max(1, ports))
        return ms / 1000

    def describe(self) -> str:
        if self.is_fixed:
            return f"fixed {self.full_ms:g} ms"
        return (
            f"{self.min_ms:g} ms (one pair) to {self.full_ms:g} ms (every port), "
            f"{self.conflict_ms:g} ms resolving conflicts"
        )


def _ms(raw: str) -> float:
    v = float(raw)
    if not v >= 0 or v == float("inf"):
        raise ValueError(raw)
    return v


LAUNCH_DBM = 0.0  # what the transceivers put in
DARK_DBM = -60.0  # a power monitor's floor: no light


def power_dbm(switch_id: str, port: int, peer: int | None, settling: bool) -> float:
    """What port `port`'s power monitor reads: the launch power less the path's insertion
    loss (1.0-2.5 dB, fixed per path like a factory table) when connected and settled;
    its floor when dark or while the mirror moves."""
    if peer is None or settling:
        return DARK_DBM
    a, b = min(port, peer), max(port, peer)
    h = hashlib.sha256(f"{switch_id}:{a}:{b}".encode()).digest()
    loss = 1.0 + 1.5 * (h[0] / 255)
    return round(LAUNCH_DBM - loss, 2)
