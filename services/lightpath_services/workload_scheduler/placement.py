"""WS-3: placement — a pure function of a pod snapshot and a slice demand.

With an optical fabric any healthy free blocks can form any logical shape
(seed 000 ¶59, ¶63-64), so placement only decides *which* blocks:

* of the node type each position asks for (¶103); a request that names no
  type gets the pod's primary type, so scarce types stay free for the
  requests that name them;
* healthy and free (¶101-102), and not still wired at the OCS to a live slice;
* blocks with no leftover wiring of a finished slice first (they need no
  release call before wiring), then lowest id;
* with K >= 2, spread round-robin over the K OCS that the blocks' first ends
  land on, so a slice's cross-connects are shared by the K switches of each
  axis and fewer ports are contended.

Positions are filled row-major in that order. The same snapshot and demand
always give the same placement. When the pod cannot place, `Unplaceable` says
why, per node type.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from lightpath.domain.blocks import PodFabric
from lightpath.domain.slices import (
    HOLDING_STATES,
    QUEUED_STATES,
    SUB_BLOCK_OWNER,
    Position,
    SliceDemand,
    SliceJob,
    parse_chip_key,
)


@dataclass(frozen=True)
class Placement:
    """Block id per logical position of the demand's grid (WS-8: the per-job configuration)."""

    blocks: tuple[int, ...]


@dataclass(frozen=True)
class Shortfall:
    node_type: str
    needed: int
    free: int
    failed: int
    allocated: int

    def describe(self) -> str:
        return (
            f"needs {self.needed} {self.node_type} block{'s' if self.needed != 1 else ''}: "
            f"{self.free} free and healthy, {self.allocated} allocated, {self.failed} failed"
        )


@dataclass(frozen=True)
class Unplaceable:
    shortfalls: tuple[Shortfall, ...]
    # Why, when it is not a count of blocks (a SWITCHED pod's locality, SW-3).
    note: str = ""

    @property
    def reason(self) -> str:
        return self.note or "; ".join(s.describe() for s in self.shortfalls)


@dataclass
class PodState:
    """A snapshot of the pod that planning may change in memory (assume), never in Redis.

    `owner[b]` is the job holding block b; `wired[b]` the job whose OCS slice may still
    include b (set before WireSlice, cleared after ReleaseSlice); `failed` the failed blocks.
    On a SWITCHED pod small jobs share groups: they hold processors ("t<g>.<i>.<j>",
    SliceJob.held_keys) in `tile_owner` / `tile_wired` instead.

    Sub-block slices (issue 28) hold chips ("c<b>.<x>.<y>.<z>", SliceJob.held_keys) in
    `tile_owner` too, and their block is held by SUB_BLOCK_OWNER in `owner`. A block with
    failed hosts is in `failed` (no block slice may use it) and in `failed_hosts` with
    those hosts: its other hosts' chips still take sub-block slices.

    A `partial` state (store.lean_snapshot, issue 15) holds only what placing on free
    blocks needs: `free`, the healthy unowned blocks (then `owner` lists only what
    planning assumed); `wired`, the marks on free blocks; `jobs`, the queue and the jobs
    marking free blocks; `marked`, the jobs among those with a mark anywhere. It has no
    running jobs, so it can never find victims: a planner that would need them must
    take a full snapshot (plan_pass answers None).
    """

    fabric: PodFabric
    failed: set[int] = field(default_factory=set)
    owner: dict[int, str] = field(default_factory=dict)
    wired: dict[int, str] = field(default_factory=dict)
    jobs: dict[str, SliceJob] = field(default_factory=dict)  # live jobs
    tile_owner: dict[str, str] = field(default_factory=dict)
    tile_wired: dict[str, str] = field(default_factory=dict)
    free: set[int] | None = None
    marked: frozenset[str] = frozenset()
    failed_hosts: dict[int, frozenset[int]] = field(default_factory=dict)

    @property
    def partial(self) -> bool:
        return self.free is not None

    def copy(self) -> PodState:
        return PodState(
            self.fabric,
            set(self.failed),
            dict(self.owner),
            dict(self.wired),
            dict(self.jobs),
            dict(self.tile_owner),
            dict(self.tile_wired),
            None if self.free is None else set(self.free),
            self.marked,
            dict(self.failed_hosts),
        )

    # -- reading -----------------------------------------------------------------

    def healthy(self, block: int) -> bool:
        return block not in self.failed

    def live_wiring(self, block: int) -> bool:
        """True when block's OCS wiring belongs to a slice that is wiring or running."""
        job = self.wired.get(block)
        return job is not None and job in self.jobs and self.jobs[job].state in HOLDING_STATES

    def allocatable(self, block: int, allow_wired: Iterable[str] = ()) -> bool:
        if block in self.failed or block in self.owner:
            return False
        if self.free is not None and block not in self.free:
            return False
        marked = self.wired.get(block)
        return marked is None or not self.live_wiring(block) or marked in allow_wired

    def candidates(self) -> Iterable[int]:
        """Blocks that may be allocatable, in id order: every block, or the free ones."""
        if self.free is None:
            return range(self.fabric.block_count)
        return sorted(self.free)

    def has_wiring(self, job_id: str) -> bool:
        """True when some block still carries a wiring mark of `job_id`."""
        return job_id in self.marked or job_id in self.wired.values()

    def free_counts(self) -> Counter[str]:
        """Healthy unallocated blocks per node type (blocks that only await a release count)."""
        types = self.fabric.node_types
        return Counter(types[b] for b in self.candidates() if self.allocatable(b))

    def queue(self) -> list[SliceJob]:
        """Jobs waiting for blocks, in queue order: priority, then age (WS-4)."""
        return sorted(
            (j for j in self.jobs.values() if j.state in QUEUED_STATES), key=SliceJob.queue_key
        )

    def running(self) -> list[SliceJob]:
        return [j for j in self.jobs.values() if j.state == "RUNNING"]

    def whole_failed(self, block: int) -> bool:
        """Failed as a block (not only some of its hosts)."""
        return block in self.failed and block not in self.failed_hosts

    def chips_held(self) -> dict[int, dict[Position, str]]:
        """Per block hosting sub-block slices: chip coordinates -> the slice holding it."""
        out: dict[int, dict[Position, str]] = {}
        for key, job in self.tile_owner.items():
            if key[0] == "c":
                block, chip = parse_chip_key(key)
                out.setdefault(block, {})[chip] = job
        return out

    def counts_by_type(self) -> dict[str, dict[str, int]]:
        """Per node type (WS-9): blocks total, free (healthy, unallocated), allocated,
        failed (a block with a failed host counts as failed); and chips: total, used (by
        block or sub-block slices), failed (of failed blocks or hosts), free."""
        out: dict[str, dict[str, int]] = {}
        fabric = self.fabric
        shared = {int(k[1:].split(".")[0]) for k in self.tile_owner if k[0] == "t"}
        held = self.chips_held()
        per_block = fabric.chips_per_block
        names = ("total", "free", "allocated", "failed")
        for b, t in enumerate(fabric.node_types):
            c = out.setdefault(t, {**dict.fromkeys(names, 0), **dict.fromkeys(_CHIP_COUNTS, 0)})
            c["total"] += 1
            c["chips_total"] += per_block
            if b in self.failed:
                c["failed"] += 1
            elif b in self.owner or b in shared:
                c["allocated"] += 1
            else:
                c["free"] += 1
            if self.whole_failed(b):
                c["chips_failed"] += per_block
                continue
            owner = self.owner.get(b)
            bad = self.failed_hosts.get(b, frozenset())
            if not bad and owner is None and b not in shared:
                c["chips_free"] += per_block
            elif not bad and ((owner is not None and owner != SUB_BLOCK_OWNER) or b in shared):
                c["chips_used"] += per_block  # a block slice's, or a SWITCHED shared group
            else:
                # per chip: on a failed host, else used (by the block's slice or a
                # sub-block slice holding it), else free
                hosts = fabric.hosts_per_block
                failed = fabric.chips_per_host * sum(1 for h in bad if 0 <= h < hosts)
                if owner is not None and owner != SUB_BLOCK_OWNER:
                    used = per_block - failed
                else:
                    host_of = fabric.chip_hosts
                    used = sum(
                        1
                        for chip in held.get(b, ())
                        if chip in host_of and host_of[chip] not in bad
                    )
                c["chips_failed"] += failed
                c["chips_used"] += used
                c["chips_free"] += per_block - failed - used
        return out

    # -- assuming (planning only) -------------------------------------------------

    def assume_allocated(self, job: SliceJob) -> None:
        self.jobs[job.job_id] = job
        if job.offset is not None and job.placement:
            self.owner[job.placement[0]] = SUB_BLOCK_OWNER
            if self.free is not None:
                self.free.discard(job.placement[0])
        for b in job.held_keys():
            if isinstance(b, str):
                self.tile_owner[b] = job.job_id
            else:
                self.owner[b] = job.job_id
                if self.free is not None:
                    self.free.discard(b)

    def assume_released(self, job_id: str, blocks: Iterable[int | str]) -> None:
        if self.free is not None:
            raise ValueError("a partial snapshot knows no owners to release")
        emptied: set[int] = set()
        for b in blocks:
            if isinstance(b, str):
                if self.tile_owner.get(b) == job_id:
                    del self.tile_owner[b]
                    if b[0] == "c":
                        emptied.add(parse_chip_key(b)[0])
            elif self.owner.get(b) == job_id:
                del self.owner[b]
        for block in emptied - set(self.chips_held()):
            if self.owner.get(block) == SUB_BLOCK_OWNER:
                del self.owner[block]


_CHIP_COUNTS = ("chips_total", "chips_used", "chips_failed", "chips_free")


def place(
    state: PodState, demand: SliceDemand, *, allow_wired: Iterable[str] = ()
) -> Placement | Unplaceable:
    """Choose a block for every position of `demand` (WS-3), or say why not.

    `allow_wired`: jobs whose leftover wiring on a block is about to be released
    (victims of a preemption), so their blocks count as free.
    """
    fabric = state.fabric
    allow = set(allow_wired)
    need = demand.type_counts()
    chosen: dict[str, list[int]] = {}
    shortfalls: list[Shortfall] = []
    for node_type in sorted(need):
        n = need[node_type]
        types = fabric.node_types
        candidates = [
            b for b in state.candidates() if types[b] == node_type and state.allocatable(b, allow)
        ]
        if len(candidates) < n:
            of_type = [b for b, t in enumerate(fabric.node_types) if t == node_type]
            failed = sum(1 for b in of_type if b in state.failed)
            shortfalls.append(
                Shortfall(
                    node_type, n, len(candidates), failed, len(of_type) - failed - len(candidates)
                )
            )
            continue
        chosen[node_type] = _prefer(state, candidates, n)
    if shortfalls:
        return Unplaceable(tuple(shortfalls))
    cursor = dict.fromkeys(chosen, 0)
    blocks: list[int] = []
    for node_type in demand.node_types:
        blocks.append(chosen[node_type][cursor[node_type]])
        cursor[node_type] += 1
    return Placement(tuple(blocks))


def _prefer(state: PodState, candidates: list[int], n: int) -> list[int]:
    """The n preferred candidates: unwired first, then lowest id, round-robin over OCS groups."""
    ordered = sorted(candidates, key=lambda b: (b in state.wired, b))
    k = state.fabric.ocs_per_axis
    if k <= 1:
        return ordered[:n]
    groups = state.fabric.first_end_group
    buckets: dict[int, list[int]] = {}
    for b in ordered:
        buckets.setdefault(groups[b], []).append(b)
    out: list[int] = []
    queues = [buckets[g] for g in sorted(buckets)]
    while len(out) < n:
        for q in queues:
            if q and len(out) < n:
                out.append(q.pop(0))
    return out


def capacity_for(state: PodState, demand: SliceDemand) -> int:
    """How many more slices of `demand` the pod could place now, one after another
    with this placement code (the pod view, and bench/availability.py)."""
    trial = state.copy()
    count = 0
    while True:
        p = place(trial, demand)
        if not isinstance(p, Placement):
            return count
        job_id = f"~capacity-{count}"
        for b in p.blocks:
            trial.owner[b] = job_id
        count += 1


def blocks_by_job(owner: Mapping[int, str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for b, j in sorted(owner.items()):
        out.setdefault(j, []).append(b)
    return out
