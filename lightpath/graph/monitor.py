"""Per-component monitoring inside a folded process (GF-6, seed §3).

Two ways to split the CPU time of one process among the members of its
folded set, both from the seed:

- Sampling (`CpuSampler`): a profiling timer (ITIMER_PROF, so it ticks with
  the process's CPU time) interrupts the process; the handler finds the
  member whose method is running, innermost first, and counts a sample for
  it. The seed has each function write "I am active" into a global variable;
  walking the interrupted frame stack finds the same member without any cost
  on the calls themselves.
- Timing: the executor times (in thread CPU time, so a call blocked on a full
  channel does not count as busy) each of the first 100 calls of each flow
  into a member, then one in 1000 (and every shutdown and blip call),
  excluding nested calls into downstream members; a call is one record, or
  one batch for a member that takes batches, and records × mean time per
  timed record estimates each member's share.

Either way the process's measured CPU time is divided in proportion, as the
seed says. A set of one component owns its process's CPU outright.
"""

from __future__ import annotations

import resource
import signal
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

# Below this many samples in a process the timed split is used instead.
MIN_SAMPLES = 50


class CpuSampler:
    """Counts which member is active at each tick of the process's CPU clock."""

    def __init__(self, owners: Mapping[int, str], classes: Iterable[type], interval: float = 0.005):
        self._owners = dict(owners)  # id(object) -> member
        self._codes: set[CodeType] = set()
        for cls in classes:
            for klass in cls.__mro__:
                if klass is object:
                    continue
                for attr in vars(klass).values():
                    code = getattr(attr, "__code__", None)
                    if isinstance(code, CodeType):
                        self._codes.add(code)
                    fget = getattr(attr, "fget", None)
                    if fget is not None and isinstance(getattr(fget, "__code__", None), CodeType):
                        self._codes.add(fget.__code__)
        self.interval = interval
        self.samples: dict[str, int] = {}
        self.unattributed = 0
        self._previous: Any = None
        self._running = False

    def start(self) -> None:
        if self.interval <= 0 or not hasattr(signal, "setitimer"):
            return
        self._previous = signal.signal(signal.SIGPROF, self._on_tick)
        signal.setitimer(signal.ITIMER_PROF, self.interval, self.interval)
        self._running = True

    def stop(self) -> None:
        if self._running:
            signal.setitimer(signal.ITIMER_PROF, 0, 0)
            signal.signal(signal.SIGPROF, self._previous or signal.SIG_DFL)
            self._running = False

    def _on_tick(self, signum: int, frame: FrameType | None) -> None:
        codes, owners = self._codes, self._owners
        f = frame
        while f is not None:
            if f.f_code in codes:
                owner = owners.get(id(f.f_locals.get("self")))
                if owner is not None:
                    self.samples[owner] = self.samples.get(owner, 0) + 1
                    return
            f = f.f_back
        self.unattributed += 1


@dataclass
class CpuSplit:
    sampled: float
    timed: float
    chosen: float
    method: str


def split_cpu(
    process_cpu: float,
    samples: Mapping[str, int],
    timed_estimates_ns: Mapping[str, float],
    members: Iterable[str],
) -> dict[str, CpuSplit]:
    """Divide one process's CPU among its members by samples and by timings (GF-6)."""
    members = list(members)
    if len(members) == 1:
        (m,) = members
        return {m: CpuSplit(process_cpu, process_cpu, process_cpu, "process")}
    total_samples = sum(samples.get(m, 0) for m in members)
    total_timed = sum(timed_estimates_ns.get(m, 0.0) for m in members)
    out = {}
    for m in members:
        sampled = process_cpu * samples.get(m, 0) / total_samples if total_samples else 0.0
        timed = process_cpu * timed_estimates_ns.get(m, 0.0) / total_timed if total_timed else 0.0
        if total_samples >= MIN_SAMPLES or not total_timed:
            out[m] = CpuSplit(sampled, timed, sampled, "sampled")
        else:
            out[m] = CpuSplit(sampled, timed, timed, "timed")
    return out


def process_usage() -> tuple[float, float]:
    """CPU seconds of this process and the programs it ran (interface components),
    and this process's peak RSS in MB.

    The peak comes from /proc/self/status (VmHWM: this program's memory since
    exec) where there is one: ru_maxrss would also count what the parent had
    mapped when it forked this process.
    """
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return cpu, int(line.split()[1]) / 1024
    except OSError:
        pass
    # ru_maxrss is KiB on Linux, bytes on macOS.
    scale = 1 / (1024 * 1024) if sys.platform == "darwin" else 1 / 1024
    return cpu, me.ru_maxrss * scale
