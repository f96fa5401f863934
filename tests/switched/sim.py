"""A pod of switched groups driven by the pure functions, as the services will:
place (SW-2/3), plan rings (SW-4), reserve, release, swap (SW-5)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lightpath.domain.switched import SwitchedFabric
from lightpath.domain.switched_rings import (
    Degrees,
    RingPlan,
    plan_rings,
    release,
    reserve,
    swap_group,
)
from lightpath.errors import ResourceExhausted
from lightpath_services.workload_scheduler.switched_placement import (
    LARGE,
    SwitchedPodState,
    placements,
)


@dataclass
class PodSim:
    fabric: SwitchedFabric
    small_groups: frozenset[int] = frozenset()
    failed: set[int] = field(default_factory=set)
    plans: dict[str, RingPlan] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    used: bytearray = field(init=False)

    def __post_init__(self) -> None:
        self.used = bytearray(self.fabric.channel_count)

    def state(self) -> SwitchedPodState:
        large = {g: j for j, p in self.plans.items() if self.kinds[j] == LARGE for g in p.groups}
        small = {j: p.tiles[0] for j, p in self.plans.items() if self.kinds[j] != LARGE}
        return SwitchedPodState(self.small_groups, frozenset(self.failed), large, small)

    def forbidden_for(self, job: str) -> set[int]:
        plan = self.plans[job]
        groups = set(plan.groups)
        return {
            p
            for j, other in self.plans.items()
            if j != job
            for t in other.tiles
            if t.group in groups
            for p in t.processors(self.fabric)
        }

    def admit(self, job: str, degrees: Degrees, tries: int = 4) -> RingPlan | None:
        try:
            cands = placements(self.fabric, self.state(), job, degrees)
            for k, placement in enumerate(cands):
                if k >= tries:
                    break
                try:
                    plan = plan_rings(
                        self.fabric,
                        self.used,
                        job,
                        degrees,
                        placement.tiles,
                        forbidden=placement.forbidden,
                    )
                except ResourceExhausted:
                    continue
                reserve(self.used, plan.channels())
                self.plans[job] = plan
                self.kinds[job] = placement.kind
                return plan
        except ResourceExhausted:
            return None
        return None

    def finish(self, job: str) -> RingPlan:
        plan = self.plans.pop(job)
        self.kinds.pop(job)
        release(self.used, plan.channels())
        return plan

    def fail_group(self, job: str, group: int):
        self.failed.add(group)
        state = self.state()
        result = swap_group(
            self.fabric, self.used, self.plans[job], group, state.free_groups(self.fabric)
        )
        release(self.used, result.released)
        reserve(self.used, result.reserved)
        self.plans[job] = result.plan
        return result
