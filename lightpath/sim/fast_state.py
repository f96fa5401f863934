"""A PodState that keeps an index of the chips sub-block slices hold.

PodState.chips_held() rebuilds that index from the owner hash on every call (a
service reads a fresh snapshot each time, so it has nothing to keep); the
planner calls it several times per sub-block decision, and the simulator makes
millions of decisions on one long-lived state. IndexedPodState keeps the same
index up to date in assume_allocated / assume_released (the only ways planning
and the simulator change chip ownership) and hands it out instead. Decisions are
unchanged: tests/sim checks the index against PodState.chips_held after every
step of a run.
"""

from __future__ import annotations

from collections.abc import Iterable

from lightpath.domain.slices import Position, SliceJob, parse_chip_key
from services.workload_scheduler.placement import PodState


class IndexedPodState(PodState):
    _held: dict[int, dict[Position, str]]

    def _index(self) -> dict[int, dict[Position, str]]:
        held = self.__dict__.get("_held")
        if held is None:
            held = self._held = PodState.chips_held(self)
        return held

    def chips_held(self) -> dict[int, dict[Position, str]]:
        return self._index()

    def copy(self) -> IndexedPodState:
        base = PodState.copy(self)
        out = IndexedPodState(**{f: getattr(base, f) for f in _FIELDS})
        out._held = {b: dict(chips) for b, chips in self._index().items()}
        return out

    def assume_allocated(self, job: SliceJob) -> None:
        held = self._index()
        for key in job.held_keys():
            if isinstance(key, str) and key[0] == "c":
                block, chip = parse_chip_key(key)
                held.setdefault(block, {})[chip] = job.job_id
        PodState.assume_allocated(self, job)

    def assume_released(self, job_id: str, blocks: Iterable[int | str]) -> None:
        keys = list(blocks)
        held = self._index()
        for key in keys:
            if isinstance(key, str) and key[0] == "c" and self.tile_owner.get(key) == job_id:
                block, chip = parse_chip_key(key)
                chips = held.get(block)
                if chips is not None:
                    chips.pop(chip, None)
                    if not chips:
                        del held[block]
        PodState.assume_released(self, job_id, keys)


_FIELDS = (
    "fabric",
    "failed",
    "owner",
    "wired",
    "jobs",
    "tile_owner",
    "tile_wired",
    "free",
    "marked",
    "failed_hosts",
)
