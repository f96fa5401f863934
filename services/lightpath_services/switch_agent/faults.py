"""Faults a simulated switch can be told to have (settings or the admin service)."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass


@dataclass
class Faults:
    """What is wrong with one switch now (optical_switch.proto, SwitchFaults)."""

    unreachable: bool = False
    extra_delay_s: float = 0.0  # added to every batch's settling time
    reject_batches: int = 0  # the next N batches are refused whole
    partial_batches: int = 0  # the next N batches apply half their operations, then fail

    @property
    def any(self) -> bool:
        return bool(
            self.unreachable or self.extra_delay_s or self.reject_batches or self.partial_batches
        )


def _one(text: str, faults: Faults) -> None:
    name, _, arg = text.strip().partition(":")
    if name == "unreachable" and not arg:
        faults.unreachable = True
        return
    if name in ("slow", "reject", "partial") and arg.strip().isdigit():
        n = int(arg)
        if name == "slow":
            faults.extra_delay_s = n / 1000
        elif name == "reject":
            faults.reject_batches = n
        else:
            faults.partial_batches = n
        return
    raise ValueError(
        f"{text!r} is not a fault: use unreachable, slow:<ms>, reject:<n> or partial:<n>"
    )


def parse_fault_spec(raw: str) -> list[tuple[str, Faults]]:
    """`glob=fault[+fault],...` -> [(glob, Faults)]; ValueError naming the rule."""
    out = []
    for item in (p.strip() for p in raw.split(",")):
        if not item:
            continue
        glob, sep, spec = item.partition("=")
        if not sep or not glob.strip() or not spec.strip():
            raise ValueError(
                f"{item!r} must look like <switch id or glob>=<fault>[+<fault>], "
                "e.g. ocs-x-3-0=unreachable or otm-*=slow:200+reject:1"
            )
        faults = Faults()
        for part in spec.split("+"):
            _one(part, faults)
        out.append((glob.strip(), faults))
    return out


def faults_for(spec: list[tuple[str, Faults]], switch_id: str) -> Faults:
    """The faults the first matching entry of `spec` gives `switch_id` (a fresh copy)."""
    for glob, faults in spec:
        if fnmatch.fnmatchcase(switch_id, glob):
            return Faults(**vars(faults))
    return Faults()
