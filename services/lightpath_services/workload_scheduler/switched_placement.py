"""SW-2, SW-3: where a job goes on a SWITCHED superpod, as a pure function.

Seed 002 ¶56: a *small* job fits in one processor group and is scheduled only
onto groups that host small jobs; a *large* job spans groups, the smallest
increment being one whole group, and processors of its groups it does not
need only forward traffic. ¶61: allocation exploits locality — neighbouring
groups under the same tier-0 switch first (SW-3), then groups under one tier-1
switch. In this fabric every tier-0 switch of a plane reaches every tier-1
switch of that plane (¶52), so "under one tier-1" is any set of groups of the
pod; among those we keep transitions under shared row / column switches
(¶41-42) so rings need few uplinks.

`placements()` yields candidates best first; the scheduler asks the pod's
fabric manager to reserve rings for the first and falls back to the next when
the rings cannot be routed (uplinks are shared, SW-4). Nothing here does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from lightpath.domain.switched import SwitchedFabric
from lightpath.domain.switched_rings import Degrees, Tile, is_small
from lightpath.errors import InvalidArgument, ResourceExhausted

SMALL, LARGE = "small", "large"
# Locality of a placement, best first.
LOCALITY_GROUP, LOCALITY_TIER0, LOCALITY_TIER1, LOCALITY_MESH = "group", "tier0", "tier1", "mesh"


@dataclass(frozen=True)
class SwitchedPodState:
    """A snapshot of who holds which group of a switched pod."""

    # Groups reserved for small jobs (SW-2).
    small_groups: frozenset[int] = frozenset()
    failed: frozenset[int] = frozenset()
    # Group -> the large job holding it whole.
    large: Mapping[int, str] = field(default_factory=dict)
    # Small job -> its tile (inside a small group).
    small: Mapping[str, Tile] = field(default_factory=dict)

    def free_groups(self, fabric: SwitchedFabric) -> list[int]:
        """Healthy groups a large job may take."""
        return [
            g
            for g in range(fabric.group_count)
            if g not in self.small_groups and g not in self.failed and g not in self.large
        ]

    def small_used(self, fabric: SwitchedFabric) -> dict[int, set[int]]:
        """Small group -> processors held by small jobs."""
        used: dict[int, set[int]] = {}
        for tile in self.small.values():
            used.setdefault(tile.group, set()).update(tile.processors(fabric))
        return used


@dataclass(frozen=True)
class SwitchedPlacement:
    job_id: str
    kind: str  # SMALL or LARGE
    tiles: tuple[Tile, ...]
    locality: str
    # Processors of other jobs in the same groups: the job's paths must not cross them.
    forbidden: frozenset[int] = frozenset()

    @property
    def groups(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(t.group for t in self.tiles))


def reserved_small_groups(fabric: SwitchedFabric, count: int) -> frozenset[int]:
    """The last `count` groups (the far end of the last cluster rows): small
    jobs rarely leave their group, so they are kept together."""
    if not 0 <= count <= fabric.group_count:
        raise InvalidArgument("small_groups", f"must be 0..{fabric.group_count}, got {count}")
    return frozenset(range(fabric.group_count - count, fabric.group_count))


def placements(
    fabric: SwitchedFabric, state: SwitchedPodState, job_id: str, degrees: Degrees
) -> Iterator[SwitchedPlacement]:
    """Candidate placements, best first (SW-2, SW-3). Raises RESOURCE_EXHAUSTED
    up front when there is no candidate at all."""
    degrees.validate()
    if is_small(fabric, degrees):
        return _small(fabric, state, job_id, degrees)
    return _large(fabric, state, job_id, degrees)


def place(
    fabric: SwitchedFabric, state: SwitchedPodState, job_id: str, degrees: Degrees
) -> SwitchedPlacement:
    """The best candidate."""
    return next(placements(fabric, state, job_id, degrees))


# -- small jobs -----------------------------------------------------------------


def _tile_shapes(fabric: SwitchedFabric, degrees: Degrees) -> list[tuple[int, int]]:
    """Rectangles that hold the job, smallest first; among equal areas the one
    that holds the layer axis down a column (seed Fig. 10-11), then squarer."""
    n = degrees.total
    shapes = [
        (h, w)
        for h in range(1, fabric.rows + 1)
        for w in range(1, fabric.cols + 1)
        if h * w >= n and (h - 1) * w < n and h * (w - 1) < n
    ]
    return sorted(
        shapes,
        key=lambda s: (
            s[0] * s[1],
            s[0] != degrees.layer and s[1] != degrees.pipeline,
            abs(s[0] - s[1]),
            s,
        ),
    )


def _small(
    fabric: SwitchedFabric, state: SwitchedPodState, job_id: str, degrees: Degrees
) -> Iterator[SwitchedPlacement]:
    groups = sorted(g for g in state.small_groups if g not in state.failed)
    if not groups:
        raise ResourceExhausted(
            f"job {job_id} fits in one group ({degrees.total} ≤ {fabric.group_size} processors) "
            "and small jobs go only to groups reserved for them; this pod reserves none",
            reason="NO_SMALL_JOB_GROUPS",
        )
    used = state.small_used(fabric)
    gs = fabric.group_size
    # pack: the fullest group that still has room first
    groups.sort(key=lambda g: (gs - len(used.get(g, ())), g))
    shapes = _tile_shapes(fabric, degrees)
    found = False
    for area in sorted({h * w for h, w in shapes}):
        for g in groups:
            taken = used.get(g, set())
            if gs - len(taken) < area:
                continue
            for h, w in (s for s in shapes if s[0] * s[1] == area):
                for i in range(fabric.rows - h + 1):
                    for j in range(fabric.cols - w + 1):
                        tile = Tile(g, i, j, h, w)
                        if taken.isdisjoint(tile.processors(fabric)):
                            found = True
                            yield SwitchedPlacement(
                                job_id, SMALL, (tile,), LOCALITY_GROUP, frozenset(taken)
                            )
    if not found:
        best = max((gs - len(used.get(g, ())) for g in groups), default=0)
        raise ResourceExhausted(
            f"no group reserved for small jobs has a free {shapes[0][0]}x{shapes[0][1]} "
            f"rectangle for job {job_id} ({degrees.total} processors); the emptiest has {best} free",
            reason="SMALL_GROUPS_FULL",
        )


# -- large jobs -----------------------------------------------------------------


def _cross_row(fabric: SwitchedFabric) -> str | None:
    """How groups of different cluster rows reach each other, or None."""
    cfg = fabric.config
    if cfg.tier1_switches:
        return LOCALITY_TIER1
    if cfg.tier0_mesh_links:
        return LOCALITY_MESH
    if cfg.two_d:
        return LOCALITY_TIER0  # through column switches only
    return None


def _large(
    fabric: SwitchedFabric, state: SwitchedPodState, job_id: str, degrees: Degrees
) -> Iterator[SwitchedPlacement]:
    need = math.ceil(degrees.total / fabric.group_size)
    free = state.free_groups(fabric)
    if len(free) < need:
        raise ResourceExhausted(
            f"job {job_id} needs {need} whole groups ({degrees.total} processors in groups of "
            f"{fabric.group_size}), {len(free)} are free and healthy",
            reason="NOT_ENOUGH_GROUPS",
        )
    C = fabric.config.cluster_cols
    rows: dict[int, list[int]] = {}
    cols: dict[int, list[int]] = {}
    for g in free:
        r, c = divmod(g, C)
        rows.setdefault(r, []).append(g)
        cols.setdefault(c, []).append(g)
    whole = lambda gs: tuple(Tile.whole(fabric, g) for g in gs)  # noqa: E731
    seen: set[frozenset[int]] = set()

    def fresh(groups: Iterable[int]) -> bool:
        key = frozenset(groups)
        if key in seen:
            return False
        seen.add(key)
        return True

    # SW-3 level 1: all groups under one tier-0 switch (one cluster row, or one
    # cluster column for 2-D groups); best fit keeps big rows for big jobs.
    lines = [(len(gs), 0, r, gs) for r, gs in rows.items() if len(gs) >= need]
    if fabric.config.two_d:
        lines += [(len(gs), 1, c, gs) for c, gs in cols.items() if len(gs) >= need]
    yielded = False
    for _, _, _, gs in sorted(lines):
        chosen = sorted(gs)[:need]
        if fresh(chosen):
            yielded = True
            yield SwitchedPlacement(job_id, LARGE, whole(chosen), LOCALITY_TIER0)
    # SW-3 level 2: several rows, as few as possible, joined through column
    # switches where the rows share columns, else through tier 1.
    via = _cross_row(fabric)
    if via is not None:
        for chosen in _multi_row(rows, need, C):
            if fresh(chosen):
                yielded = True
                yield SwitchedPlacement(job_id, LARGE, whole(chosen), via)
    if not yielded:
        most = max(len(gs) for gs in rows.values())
        raise ResourceExhausted(
            f"job {job_id} needs {need} groups under one tier-0 switch (this pod has no "
            f"links between tier-0 switches); at most {most} are free under one",
            reason="NO_GROUPS_UNDER_ONE_SWITCH",
        )


def _multi_row(rows: dict[int, list[int]], need: int, C: int) -> Iterator[list[int]]:
    """Candidate multi-row group sets: fullest rows first, then bands of
    neighbouring rows; the last row contributes groups in the columns the
    others use, so rows meet under shared column switches."""
    order = sorted(rows, key=lambda r: (-len(rows[r]), r))
    yield _fill([*order], rows, need, C)
    keys = sorted(rows)
    # bands: contiguous runs of rows with enough groups, smallest band first
    bands = []
    for a in range(len(keys)):
        total = 0
        for b in range(a, len(keys)):
            total += len(rows[keys[b]])
            if total >= need:
                bands.append((b - a, a, keys[a : b + 1]))
                break
    for _, _, band in sorted(bands)[:3]:
        yield _fill(sorted(band, key=lambda r: (-len(rows[r]), r)), rows, need, C)


def _fill(order: list[int], rows: dict[int, list[int]], need: int, C: int) -> list[int]:
    chosen: list[int] = []
    used_cols: set[int] = set()
    for r in order:
        gs = rows[r]
        left = need - len(chosen)
        if left <= 0:
            break
        if len(gs) <= left:
            pick = gs
        else:
            pick = sorted(gs, key=lambda g: (g % C not in used_cols, g))[:left]
        chosen.extend(pick)
        used_cols.update(g % C for g in pick)
    return sorted(chosen)
