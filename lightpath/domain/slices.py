"""Domain objects of the workload scheduler: slice demands, slice jobs and their states.

A slice (seed 000 "workload cluster") is a job's building blocks placed at the
logical positions of a block grid b1 x … x bm (¶58-64, ¶106). Positions are
listed row-major with x fastest, the same order the ocs_manager uses for
logical axes, so position i of a 2x2x1 grid is (i % 2, i // 2, 0).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

Grid = tuple[int, ...]
Position = tuple[int, ...]

# Job states (common.proto JobState without the prefix).
PENDING = "PENDING"
WIRING = "WIRING"
RUNNING = "RUNNING"
COMPLETED = "COMPLETED"
CANCELLED = "CANCELLED"
PREEMPTED = "PREEMPTED"
FAILED = "FAILED"
SUSPENDED = "SUSPENDED"
FINAL_STATES = frozenset({COMPLETED, CANCELLED, PREEMPTED, FAILED})
QUEUED_STATES = frozenset({PENDING, SUSPENDED})  # waiting in the pod's queue, holding no block
HOLDING_STATES = frozenset({WIRING, RUNNING})  # holding blocks (and maybe OCS wiring)

# Preemption policies a job accepts as a victim (WS-4).
TERMINATE = "TERMINATE"
DELAY = "DELAY"
SHRINK = "SHRINK"
# How much a policy disturbs its victim: a shrunk slice keeps running, a delayed
# one resumes later, a terminated one is gone.
DISRUPTION = {SHRINK: 0, DELAY: 1, TERMINATE: 2}

# What a request wants when the pod cannot place it now (WS-4), and what a
# running slice wants when a block fails with no replacement to be had (WS-5).
QUEUE = "QUEUE"
FAIL = "FAIL"
SUSPEND = "SUSPEND"

MIN_PRIORITY, MAX_PRIORITY = 1, 100


def grid_positions(grid: Grid) -> list[Position]:
    """Every position of `grid`, row-major with x fastest."""
    out: list[Position] = []
    for i in range(math.prod(grid)):
        coords = []
        for g in grid:
            coords.append(i % g)
            i //= g
        out.append(tuple(coords))
    return out


def position_index(position: Position, grid: Grid) -> int:
    index, stride = 0, 1
    for p, g in zip(position, grid, strict=True):
        index += p * stride
        stride *= g
    return index


@dataclass(frozen=True)
class SliceDemand:
    """What a slice needs: a block grid, the node type at each position, wrap per dimension.

    A sub-block slice (issue 28) has `box`, its extents in chips, and a 1x1x1 grid of
    one position: it takes a box of chips inside one block. A `twisted` slice is wired
    as a twisted torus (lightpath.domain.twist)."""

    grid: Grid
    node_types: tuple[str, ...]  # one per position, row-major x fastest
    wrap: tuple[bool, ...]
    box: Grid | None = None
    twisted: bool = False

    @property
    def sub_block(self) -> bool:
        return self.box is not None

    @property
    def block_count(self) -> int:
        return len(self.node_types)

    def type_counts(self) -> Counter[str]:
        return Counter(self.node_types)

    def shrunk(self, grid: Grid) -> SliceDemand:
        """The demand of the sub-box `grid` at the origin (a declared shrink arrangement, WS-4)."""
        if self.box is not None:  # a sub-block slice shrinks to a smaller box of chips
            return replace(self, box=grid)
        types = [self.node_types[position_index(p, self.grid)] for p in grid_positions(grid)]
        # A shrunk slice is a sub-box: twisted wiring needs the full k x k x 2k shape.
        return SliceDemand(grid, tuple(types), self.wrap)


def sub_box_indices(grid: Grid, sub: Grid) -> list[int]:
    """Indices (in `grid`) of the positions of the sub-box `sub` at the origin, in `sub`'s order."""
    return [position_index(p, grid) for p in grid_positions(sub)]


@dataclass(frozen=True)
class SliceJob:
    """A job as the planner sees it: its demand, priority, policies and, while it holds
    blocks, its placement (block id per position). Stored as JSON in the pod's live set."""

    job_id: str
    state: str
    epoch: int
    priority: int
    seq: int  # admission order: lower is older
    demand: SliceDemand
    placement: tuple[int, ...] | None = None
    preemption: str = DELAY
    shrink_to: tuple[Grid, ...] = ()
    on_block_failure: str = SUSPEND
    when_no_capacity: str = QUEUE
    # While WIRING: when another replica may take over a wiring that never finished.
    wiring_deadline_ms: int = 0
    # While a failed block is being swapped (WS-5): (failed block, new block).
    replacing: tuple[int, int] | None = None
    # The state it was allocated from (PENDING or SUSPENDED), to go back to if wiring fails.
    queued_as: str = PENDING
    # Wiring attempts that failed; a queued job is not retried before not_before_ms.
    attempts: int = 0
    not_before_ms: int = 0
    # SWITCHED pods (seed 002): (data, pipeline, layer), and a small job's
    # rectangle (group, row, col, height, width) inside its shared group.
    degrees: tuple[int, int, int] | None = None
    tile: tuple[int, int, int, int, int] | None = None
    # A sub-block slice while it holds chips: the chip coordinates of its box's first
    # chip inside its one block (placement[0]).
    offset: tuple[int, ...] | None = None
    # When the pod admitted it (ms): its age, for the queue's age bound
    # (planner.waited_past). 0 for jobs stored before the field: counted as old.
    submitted_ms: int = 0
    # Jobs this one preempted when the cell reclaimed lent quota for it (issue 35): they
    # never preempt it back by priority while it holds its blocks.
    reclaimed_from: tuple[str, ...] = ()

    def queue_key(self) -> tuple[int, int]:
        """Queue order (WS-4): higher priority first, then older first."""
        return (-self.priority, self.seq)

    def with_(self, **changes: Any) -> SliceJob:
        if "placement" in changes and changes["placement"] is None:
            changes.setdefault("tile", None)  # a small job's rectangle goes with its group
            changes.setdefault("offset", None)  # and a sub-block slice's box with its block
        return replace(self, **changes)

    def held_keys(self) -> list[Any]:
        """The fields this job holds in the pod's owner / wired hashes: its blocks, or for a
        small job on a SWITCHED pod one field per processor of its rectangle ("t<g>.<i>.<j>"),
        since several small jobs share a group (SW-2)."""
        if self.tile is not None:
            g, r0, c0, h, w = self.tile
            return [f"t{g}.{r0 + i}.{c0 + j}" for i in range(h) for j in range(w)]
        if self.offset is not None and self.placement and self.demand.box is not None:
            return list(chip_keys(self.placement[0], self.offset, self.demand.box))
        return list(self.placement or ())

    def to_json(self) -> str:
        extra: dict[str, Any] = {}
        if self.degrees is not None:
            extra["deg"] = list(self.degrees)
        if self.tile is not None:
            extra["tile"] = list(self.tile)
        if self.demand.box is not None:
            extra["box"] = list(self.demand.box)
        if self.demand.twisted:
            extra["tw"] = 1
        if self.offset is not None:
            extra["off"] = list(self.offset)
        if self.submitted_ms:
            extra["sub"] = self.submitted_ms
        if self.reclaimed_from:
            extra["rcl"] = list(self.reclaimed_from)
        return json.dumps(
            {
                "id": self.job_id,
                "st": self.state,
                "ep": self.epoch,
                "pr": self.priority,
                "seq": self.seq,
                "grid": list(self.demand.grid),
                "types": _compress(self.demand.node_types),
                "wrap": [int(w) for w in self.demand.wrap],
                "pl": list(self.placement) if self.placement is not None else None,
                "pol": self.preemption,
                "shr": [list(g) for g in self.shrink_to],
                "obf": self.on_block_failure,
                "wnc": self.when_no_capacity,
                "wdl": self.wiring_deadline_ms,
                "rep": list(self.replacing) if self.replacing else None,
                "qa": self.queued_as,
                "att": self.attempts,
                "nb": self.not_before_ms,
                **extra,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, raw: str) -> SliceJob:
        d = json.loads(raw)
        grid = tuple(d["grid"])
        return cls(
            job_id=d["id"],
            state=d["st"],
            epoch=int(d["ep"]),
            priority=int(d["pr"]),
            seq=int(d["seq"]),
            demand=SliceDemand(
                grid,
                _expand(d["types"]),
                tuple(bool(w) for w in d["wrap"]),
                tuple(d["box"]) if d.get("box") else None,
                bool(d.get("tw")),
            ),
            placement=tuple(d["pl"]) if d["pl"] is not None else None,
            preemption=d["pol"],
            shrink_to=tuple(tuple(g) for g in d["shr"]),
            on_block_failure=d["obf"],
            when_no_capacity=d["wnc"],
            wiring_deadline_ms=int(d.get("wdl") or 0),
            replacing=tuple(d["rep"]) if d.get("rep") else None,  # type: ignore[arg-type]
            queued_as=d.get("qa", PENDING),
            attempts=int(d.get("att", 0)),
            not_before_ms=int(d.get("nb", 0)),
            degrees=tuple(d["deg"]) if d.get("deg") else None,  # type: ignore[arg-type]
            tile=tuple(d["tile"]) if d.get("tile") else None,  # type: ignore[arg-type]
            offset=tuple(d["off"]) if d.get("off") is not None else None,
            submitted_ms=int(d.get("sub", 0)),
            reclaimed_from=tuple(d.get("rcl", ())),
        )


def shields(reclaimed_from: Collection[str], preemptor: str) -> bool:
    """Whether a job that reclaimed lent quota from the jobs `reclaimed_from` (issue 35)
    is out of `preemptor`'s reach: a job is never the victim of one it reclaimed from,
    or the borrower a reclaim sent away would take the owner's blocks straight back by
    priority. The one rule the pod's preemption and the cell's choice of pods and of
    reclaim victims (and the simulator, through them) all apply."""
    return bool(preemptor) and preemptor in reclaimed_from


# A block given over to sub-block slices holds this in the pod's owner hash instead
# of a job id (job ids cannot contain "~"), so block placement and the free-block
# index see it as taken; its chips are held one field each (chip_keys).
SUB_BLOCK_OWNER = "~sub"


def box_chips(offset: Position, box: Grid) -> list[Position]:
    """The chip coordinates (inside the block) of the box `box` at `offset`."""
    return [tuple(o + p for o, p in zip(offset, pos, strict=True)) for pos in grid_positions(box)]


def chip_keys(block: int, offset: Position, box: Grid) -> list[str]:
    """The owner-hash fields of a box's chips: "c<block>.<x>.<y>.<z>"."""
    return [f"c{block}." + ".".join(map(str, c)) for c in box_chips(offset, box)]


def describe_box(job: SliceJob) -> str:
    """ "chips 2x2x1 at (0,2,0) of block 17" for a sub-block slice holding chips."""
    assert job.demand.box is not None and job.offset is not None and job.placement
    return (
        f"chips {'x'.join(map(str, job.demand.box))} at "
        f"({','.join(map(str, job.offset))}) of block {job.placement[0]}"
    )


def parse_chip_key(key: str) -> tuple[int, Position]:
    """ "c7.1.0.3" -> (7, (1, 0, 3))."""
    block, *coords = key[1:].split(".")
    return int(block), tuple(int(c) for c in coords)


def _compress(types: tuple[str, ...]) -> list[Any]:
    """Run-length encode per-position types: a 64-block slice of one type is one pair."""
    out: list[Any] = []
    for t in types:
        if out and out[-1][0] == t:
            out[-1][1] += 1
        else:
            out.append([t, 1])
    return out


def _expand(runs: list[Any]) -> tuple[str, ...]:
    return tuple(t for t, n in runs for _ in range(n))
