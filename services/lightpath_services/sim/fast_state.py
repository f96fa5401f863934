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

from collections import Counter
from collections.abc import Iterable

from lightpath.domain.blocks import PodFabric
from lightpath.domain.slices import (
    HOLDING_STATES,
    SUB_BLOCK_OWNER,
    Position,
    SliceJob,
    grid_positions,
    parse_chip_key,
)
from lightpath_services.workload_scheduler.placement import PodState


class IndexedPodState(PodState):
    _held: dict[int, dict[Position, str]]

    def _index(self) -> dict[int, dict[Position, str]]:
        held = self.__dict__.get("_held")
        if held is None:
            held = self._held = PodState.chips_held(self)
        return held

    def chips_held(self) -> dict[int, dict[Position, str]]:
        return self._index()

    def free_counts(self) -> Counter[str]:
        """PodState.free_counts (healthy blocks no slice holds nor a live slice's wiring
        marks, per node type) in one loop: the simulator asks it many times a pass."""
        if self.free is not None:
            return PodState.free_counts(self)
        types = self.fabric.node_types
        failed, owner, wired, jobs = self.failed, self.owner, self.wired, self.jobs
        counts: dict[str, int] = {}
        for b, t in enumerate(types):
            if b in failed or b in owner:
                continue
            marked = wired.get(b)
            if marked is not None and marked in jobs and jobs[marked].state in HOLDING_STATES:
                continue
            counts[t] = counts.get(t, 0) + 1
        return Counter(counts)

    def chips_free_by_type(self) -> dict[str, int]:
        """PodState.counts_by_type()[t]["chips_free"] per node type t (what the pod
        reports to the cell), without walking every chip of every block: chips on
        healthy hosts of blocks no block slice holds, less those sub-block slices hold."""
        fabric = self.fabric
        per_block = fabric.chips_per_block
        held = self._index()
        owner, failed_hosts = self.owner, self.failed_hosts
        out: dict[str, int] = {}
        for b, t in enumerate(fabric.node_types):
            n = out.setdefault(t, 0)
            if self.whole_failed(b):
                continue
            holder = owner.get(b)
            if holder is not None and holder != SUB_BLOCK_OWNER:
                continue  # a block slice's chips (or failed ones)
            bad = failed_hosts.get(b)
            if not bad and holder is None:
                out[t] = n + per_block
                continue
            usable = _healthy_chips(fabric, bad or frozenset())
            mine = held.get(b, {})
            out[t] = n + len(usable) - sum(1 for c in mine if c in usable)
        return out

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


_HEALTHY: dict[tuple, frozenset[Position]] = {}


def _healthy_chips(fabric: PodFabric, bad: frozenset[int]) -> frozenset[Position]:
    key = (fabric.block_shape, fabric.host_shape, bad)
    got = _HEALTHY.get(key)
    if got is None:
        got = _HEALTHY[key] = frozenset(
            c for c in grid_positions(fabric.block_shape) if fabric.host_of(c) not in bad
        )
    return got
