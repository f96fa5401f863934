"""SW-4, SW-5: Hamiltonian rings with reserved links, as pure functions.

A job with parallelism degrees (data D, pipeline P, layer L) runs on D·P·L
processors (seed 002 ¶28-31, ¶38). For every axis, each line of processors
along that axis forms a ring: a Hamiltonian cycle through exactly those
processors (¶30: "a set of Hamiltonian cycles connecting each dimension").
Consecutive processors of a ring talk over a *hop*: a path of concrete links —
one link between processor neighbours inside a group, or out through an edge
port, a tier-0 switch (and tier-1 if need be) and back in (¶34-36, ¶47).

The planner reserves, for its ring, the channel (the direction of a full-duplex
link, see switched.py) of every link a hop crosses, and no channel carries two
rings, so each ring gets full link bandwidth with no congestion (¶59-60).
Routing follows NCCL's ring search (`src/graph/search.cc`, `followPath`):
reserve along a path, and undo the reservations on backtrack. A job that
cannot be routed answers RESOURCE_EXHAUSTED naming what is missing.

Everything here is a function of the static fabric, a snapshot of used
channels (one byte per channel, 1 = reserved) and the request; nothing is
written anywhere. The fabric manager commits a plan's channels atomically.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from lightpath.domain.switched import COLUMN, LINK_KIND_NAMES, ROW, SwitchedFabric
from lightpath.errors import Aborted, FailedPrecondition, InvalidArgument, ResourceExhausted

AXES = ("data", "pipeline", "layer")


@dataclass(frozen=True)
class Degrees:
    """Degrees of the three parallelisms; their product is the processor count."""

    data: int
    pipeline: int
    layer: int

    @property
    def total(self) -> int:
        return self.data * self.pipeline * self.layer

    def validate(self, field_prefix: str = "degrees") -> Degrees:
        bad = [a for a in AXES if getattr(self, a) < 1]
        if bad:
            raise InvalidArgument(f"{field_prefix}.{bad[0]}", "must be at least 1")
        return self

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.data, self.pipeline, self.layer)


def is_small(fabric: SwitchedFabric, degrees: Degrees) -> bool:
    """Seed 002 ¶56: a small job fits in one processor group; a large one spans groups."""
    return degrees.total <= fabric.group_size


@dataclass(frozen=True, order=True)
class Tile:
    """A rectangle of processors of one group: a whole group for a large job,
    part of a group reserved for small jobs otherwise (SW-2)."""

    group: int
    row: int
    col: int
    height: int
    width: int

    @classmethod
    def whole(cls, fabric: SwitchedFabric, group: int) -> Tile:
        return cls(group, 0, 0, fabric.rows, fabric.cols)

    @property
    def size(self) -> int:
        return self.height * self.width

    def processor(self, fabric: SwitchedFabric, i: int, j: int) -> int:
        return fabric.processor(self.group, self.row + i, self.col + j)

    def processors(self, fabric: SwitchedFabric) -> list[int]:
        return [self.processor(fabric, i, j) for i in range(self.height) for j in range(self.width)]

    def check(self, fabric: SwitchedFabric, field_name: str = "tile") -> None:
        if not 0 <= self.group < fabric.group_count:
            raise InvalidArgument(
                f"{field_name}.group", f"must be a group of this pod (0..{fabric.group_count - 1})"
            )
        if (
            self.height < 1
            or self.width < 1
            or self.row < 0
            or self.col < 0
            or self.row + self.height > fabric.rows
            or self.col + self.width > fabric.cols
        ):
            raise InvalidArgument(
                field_name, f"must lie inside a {fabric.rows}x{fabric.cols} group, got {self}"
            )


@dataclass(frozen=True)
class Hop:
    """From `nodes[0]` to `nodes[-1]`; `channels[k]` goes from nodes[k] to nodes[k+1]."""

    nodes: tuple[int, ...]
    channels: tuple[int, ...]


@dataclass(frozen=True)
class Ring:
    axis: str
    # The coordinates of the other two axes, in AXES order (e.g. data ring: (p, l)).
    key: tuple[int, int]
    processors: tuple[int, ...]
    # hops[k] goes from processors[k] to processors[k+1] (the last one closes the ring).
    hops: tuple[Hop, ...]

    @property
    def name(self) -> str:
        others = [a[0] for a in AXES if a != self.axis]
        return f"{self.axis}({others[0]}={self.key[0]},{others[1]}={self.key[1]})"

    @property
    def channels(self) -> tuple[int, ...]:
        return tuple(c for hop in self.hops for c in hop.channels)


@dataclass(frozen=True)
class RingPlan:
    """SW-4: the rings of one job and the links each holds."""

    job_id: str
    degrees: Degrees
    tiles: tuple[Tile, ...]
    # Processor of logical index n = (d·P + p)·L + l.
    assignment: tuple[int, ...]
    rings: tuple[Ring, ...]
    layout: str = ""

    @property
    def groups(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(t.group for t in self.tiles))

    def channels(self) -> list[int]:
        return [c for ring in self.rings for c in ring.channels]

    def ring(self, name: str) -> Ring:
        for r in self.rings:
            if r.name == name:
                return r
        raise KeyError(name)

    def to_dict(self) -> dict:
        return {
            "job_id": self.job_id,
            "degrees": list(self.degrees.as_tuple()),
            "tiles": [[t.group, t.row, t.col, t.height, t.width] for t in self.tiles],
            "assignment": list(self.assignment),
            "layout": self.layout,
            "rings": [
                [
                    r.axis,
                    list(r.key),
                    list(r.processors),
                    [[list(h.nodes), list(h.channels)] for h in r.hops],
                ]
                for r in self.rings
            ],
        }

    @classmethod
    def from_dict(cls, d: dict) -> RingPlan:
        return cls(
            job_id=d["job_id"],
            degrees=Degrees(*d["degrees"]),
            tiles=tuple(Tile(*t) for t in d["tiles"]),
            assignment=tuple(d["assignment"]),
            layout=d.get("layout", ""),
            rings=tuple(
                Ring(
                    axis,
                    (key[0], key[1]),
                    tuple(procs),
                    tuple(Hop(tuple(n), tuple(ls)) for n, ls in hops),
                )
                for axis, key, procs, hops in d["rings"]
            ),
        )


# -- reservations on a snapshot (assume / commit / undo) -----------------------


def reserve(used: bytearray, channels: Iterable[int]) -> None:
    """Mark channels used, all or nothing; ABORTED if any is taken already."""
    channels = list(channels)
    taken = [c for c in channels if used[c]]
    if taken:
        raise Aborted(
            f"{len(taken)} channels of the plan were reserved meanwhile (first: {taken[0]})"
        )
    for c in channels:
        used[c] = 1


def release(used: bytearray, channels: Iterable[int]) -> int:
    """Free exactly these channels; they must be reserved. Returns how many."""
    channels = list(channels)
    free = [c for c in channels if not used[c]]
    if free:
        raise FailedPrecondition(
            f"channel {free[0]}", "is not reserved", reason="CHANNEL_NOT_RESERVED"
        )
    for c in channels:
        used[c] = 0
    return len(channels)


# -- embedding: logical coordinates -> processors -------------------------------


def ring_members(
    assignment: Sequence[int], degrees: Degrees
) -> list[tuple[str, tuple[int, int], list[int]]]:
    """Every ring of the job: (axis, key, processors in ring order). Axes of degree 1 have none."""
    D, P, L = degrees.as_tuple()
    A = assignment
    out: list[tuple[str, tuple[int, int], list[int]]] = []
    if D > 1:
        for p in range(P):
            for l in range(L):  # noqa: E741
                out.append(("data", (p, l), [A[(d * P + p) * L + l] for d in range(D)]))
    if P > 1:
        for d in range(D):
            for l in range(L):  # noqa: E741
                out.append(("pipeline", (d, l), [A[(d * P + p) * L + l] for p in range(P)]))
    if L > 1:
        for d in range(D):
            for p in range(P):
                base = (d * P + p) * L
                out.append(("layer", (d, p), list(A[base : base + L])))
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def _inner_order(bh: int, bw: int, order: str) -> list[tuple[int, int]] | None:
    if order == "col":
        return [(i, j) for j in range(bw) for i in range(bh)]
    if order == "row":
        return [(i, j) for i in range(bh) for j in range(bw)]
    if order == "snake":
        return [(i, j if i % 2 == 0 else bw - 1 - j) for i in range(bh) for j in range(bw)]
    # "cycle": a Hamiltonian cycle along neighbours; exists when bh·bw is even
    # and both sides are at least 2 (a 2-D group of even size, SW-4).
    if bh < 2 or bw < 2 or (bh * bw) % 2:
        return None
    if bh % 2:
        t = _inner_order(bw, bh, "cycle")
        return None if t is None else [(j, i) for i, j in t]
    seq = [(0, j) for j in range(bw)]
    for i in range(1, bh):
        cols = range(bw - 1, 0, -1) if i % 2 == 1 else range(1, bw)
        seq.extend((i, j) for j in cols)
    seq.extend((i, 0) for i in range(bh - 1, 0, -1))
    return seq


@functools.lru_cache(maxsize=512)
def _layouts(
    h: int, w: int, degrees: tuple[int, int, int], tiles: int
) -> tuple[tuple[str, tuple[tuple[int, int], ...]], ...]:
    """Candidate orders of a tile's processors, best first.

    The tile is cut into blocks of bh×bw (divisors of h and w) visited in a
    snake; inside a block processors go column-major (the seed's Fig. 10-11:
    layers down a column, pipeline stages along a row), row-major, as a
    Hamiltonian cycle or as a snake. Logical index n takes the n-th position
    (tiles concatenated). Scored by how many ring hops join neighbours.
    """
    D, P, L = degrees
    N = D * P * L
    T = h * w
    seen: set[tuple[tuple[int, int], ...]] = set()
    cands: list[tuple[int, int, str, tuple[tuple[int, int], ...]]] = []
    rank = 0
    for bh in _divisors(h):
        for bw in _divisors(w):
            blocks = [
                (bi, bj if bi % 2 == 0 else w // bw - 1 - bj)
                for bi in range(h // bh)
                for bj in range(w // bw)
            ]
            for order in ("col", "row", "cycle", "snake"):
                inner = _inner_order(bh, bw, order)
                if inner is None:
                    continue
                pos = tuple((bi * bh + di, bj * bw + dj) for bi, bj in blocks for di, dj in inner)
                if pos in seen:
                    continue
                seen.add(pos)
                cands.append(
                    (
                        -_score(pos, T, (D, P, L), min(N, 2 * T, T * tiles)),
                        rank,
                        f"{order}{bh}x{bw}",
                        pos,
                    )
                )
                rank += 1
    cands.sort()
    return tuple((name, pos) for _, _, name, pos in cands)


def _score(pos: tuple[tuple[int, int], ...], T: int, degrees: tuple[int, int, int], n: int) -> int:
    D, P, L = degrees
    score = 0
    for stride, count in ((1, L), (L, P), (L * P, D)):
        if count < 2:
            continue
        for a in range(n):
            k = (a // stride) % count
            b = a + stride if k < count - 1 else a - (count - 1) * stride
            if b >= n:
                continue
            ta, tb = divmod(a, T), divmod(b, T)
            (ia, ja), (ib, jb) = pos[ta[1]], pos[tb[1]]
            if ta[0] == tb[0]:
                d = abs(ia - ib) + abs(ja - jb)
                score += 3 if d == 1 else (1 if ia == ib or ja == jb else 0)
            elif (ia, ja) == (ib, jb):
                score += 1
    return score


def order_tiles(fabric: SwitchedFabric, tiles: Sequence[Tile]) -> list[Tile]:
    """Order a large job's groups into a cycle that stays under tier-0 switches.

    Groups of one cluster row share row switches and groups of one cluster
    column share column switches (¶41-42), so rows are visited in turn and each
    row is left in the column where the next row is entered; only transitions
    that share neither fall back to tier-1 uplinks (SW-3, ¶61).
    """
    if len(tiles) <= 1:
        return list(tiles)
    by_group = {t.group: t for t in tiles}
    if len(by_group) != len(tiles):
        return sorted(tiles)
    rows: dict[int, list[int]] = {}
    for g in sorted(by_group):
        r, c = fabric.group_position(g)
        rows.setdefault(r, []).append(c)
    C = fabric.config.cluster_cols
    order = [by_group[r * C + c] for r, cs in _row_cycle(rows, fabric.config.two_d) for c in cs]
    return order


def _row_cycle(rows: dict[int, list[int]], two_d: bool) -> list[tuple[int, list[int]]]:
    keys = sorted(rows)
    if len(keys) == 1 or not two_d:
        return [(r, rows[r]) for r in keys]
    sets = [rows[r] for r in keys]
    best: tuple[int, list[tuple[int, int]]] | None = None
    firsts = list(dict.fromkeys([c for c in sets[0] if c in set(sets[-1])][:3] + sets[0][:2]))
    for x1 in firsts:
        # dp: exit column -> (cost, [(entry, exit) per row])
        dp: dict[int, tuple[int, list[tuple[int, int]]]] = {}
        for y in sets[0]:
            if y != x1 or len(sets[0]) == 1:
                dp[y] = (0, [(x1, y)])
        for s in sets[1:]:
            sset = set(s)
            nxt: dict[int, tuple[int, list[tuple[int, int]]]] = {}
            for yp, (cost, path) in dp.items():
                if yp in sset:
                    x, extra = yp, 0
                else:
                    x, extra = -1, 1
                for y in s:
                    if len(s) > 1 and y == x:
                        continue
                    xx = x if x >= 0 else next((c for c in s if c != y), y)
                    cand = (cost + extra, [*path, (xx, y)])
                    if y not in nxt or cand[0] < nxt[y][0]:
                        nxt[y] = cand
            dp = nxt
        for y, (cost, path) in dp.items():
            total = cost + (0 if y == x1 else 1)
            if best is None or total < best[0]:
                best = (total, path)
        if best is not None and best[0] == 0:
            break
    assert best is not None
    out = []
    for r, s, (x, y) in zip(keys, sets, best[1], strict=True):
        mid = [c for c in s if c not in (x, y)]
        out.append((r, [x] if x == y else [x, *mid, y]))
    return out


def layouts(
    fabric: SwitchedFabric, degrees: Degrees, tiles: Sequence[Tile], limit: int | None = None
) -> list[tuple[str, list[int]]]:
    """Candidate assignments (logical index -> processor), best first (at most `limit`)."""
    N = degrees.total
    shapes = {(t.height, t.width) for t in tiles}
    if len(shapes) != 1:
        procs = [p for t in tiles for p in t.processors(fabric)]
        return [("row-mixed", procs[:N])]
    ((h, w),) = shapes
    out = []
    cols = fabric.cols
    for name, pos in _layouts(h, w, degrees.as_tuple(), len(tiles))[:limit]:
        offsets = [i * cols + j for i, j in pos]
        assignment: list[int] = []
        for t in tiles:
            base = t.processor(fabric, 0, 0)
            assignment.extend([base + o for o in offsets])
            if len(assignment) >= N:
                break
        out.append((name, assignment[:N]))
    return out


# -- routing ----------------------------------------------------------------------


class _NoPath(Exception):
    def __init__(self, src: int, dst: int):
        self.src, self.dst = src, dst


@dataclass
class _Router:
    """Reserve along a path, undo on backtrack (NCCL's followPath)."""

    fabric: SwitchedFabric
    used: bytearray
    forbidden: frozenset[int] = field(default_factory=frozenset)
    # Whole groups of the job: their processors may forward a hop between two
    # other groups of the job (¶60), before a hop takes shared uplinks.
    via_groups: frozenset[int] = field(default_factory=frozenset)

    def hop(self, a: int, b: int) -> Hop:
        fab, used = self.fabric, self.used
        # 1. neighbours: one link (the common case inside a group)
        bundle = fab.proc_nbrs[a].get(b)
        if bundle is not None:
            for c in bundle:
                if not used[c]:
                    used[c] = 1
                    return Hop((a, b), (c,))
        # 2. through one tier-0 switch both hang off (a chain closing through
        #    its switch, ¶34; edge processors of two groups, ¶40)
        gb = b // fab.group_size
        P = fab.processor_count
        for s, out in fab.proc_ports[a]:
            c1 = next((c for c in out if not used[c]), -1)
            if c1 < 0:
                continue
            for v, into in fab.sw_down[s - P].get(gb, ()):
                if v == b:
                    c2 = next((c for c in into if not used[c]), -1)
                    if c2 >= 0:
                        used[c1] = used[c2] = 1
                        return Hop((a, s, b), (c1, c2))
                    break
        # 3. breadth-first: first without uplinks (they are shared and scarce,
        #    ¶48), then through tier 1 / other switches
        ga = a // fab.group_size
        hop = None
        if ga == gb or fab.share_tier0(ga, gb):
            hop = self._local(a, b) if not self.forbidden else self._search(a, b, uplinks=False)
        if hop is None:
            hop = self._search(a, b, uplinks=True)
        if hop is None and self.via_groups and fab.config.two_d and ga != gb:
            # 4. uplinks gone: through the job's own group at the corner — the
            #    row switch of one end's cluster row, then the column switch of
            #    the other's; that group's spare links forward (¶60)
            C = fab.config.cluster_cols
            (ra, ca), (rb, cb) = fab.group_position(ga), fab.group_position(gb)
            for corner in (ra * C + cb, rb * C + ca):
                if corner in self.via_groups and corner not in (ga, gb):
                    hop = self._search(a, b, uplinks=False, via=corner)
                    if hop is not None:
                        break
        if hop is None:
            raise _NoPath(a, b)
        for c in hop.channels:
            used[c] = 1
        return hop

    def undo(self, channels: Iterable[int]) -> None:
        for c in channels:
            self.used[c] = 0

    def _local(self, a: int, b: int) -> Hop | None:
        """`_search` without uplinks, remembered per fabric.

        Such a path stays inside the two end groups and their tier-0 switches,
        so it depends only on the two groups' own channels (one contiguous
        slice of the state each), the ends' places in their groups, and
        whether the groups are one, share a cluster row or a cluster column.
        Large jobs repeat the same hop in group after group (¶45-52)."""
        fab, used = self.fabric, self.used
        gs, per = fab.group_size, 2 * fab.links_per_group
        ga, gb = a // gs, b // gs
        (ra, ca), (rb, cb) = fab.group_position(ga), fab.group_position(gb)
        rel = 0 if ga == gb else (1 if ra == rb else 2)
        ba, bb = 2 * fab.group_link_base[ga], 2 * fab.group_link_base[gb]
        key = (
            rel,
            a - ga * gs,
            b - gb * gs,
            bytes(used[ba : ba + per]),
            b"" if rel == 0 else bytes(used[bb : bb + per]),
        )
        memo = _local_memo(fab)
        hit = memo.get(key)
        if hit is None:
            hop = self._search(a, b, uplinks=False)
            if len(memo) > _MEMO_LIMIT:
                memo.clear()
            memo[key] = _encode(fab, hop, ga, gb) if hop is not None else ()
            return hop
        if not hit:
            return None
        nodes_rel, chans_rel = hit
        bases = (ga * gs, gb * gs)
        idx = {ROW: (ra, rb), COLUMN: (ca, cb)}
        nodes = tuple(
            bases[side] + off if dim == "" else fab.tier0_switch(dim, idx[dim][side], off)
            for dim, side, off in nodes_rel
        )
        return Hop(nodes, tuple((ba, bb)[side] + off for side, off in chans_rel))

    def _search(self, src: int, dst: int, *, uplinks: bool, via: int = -1) -> Hop | None:
        """Breadth-first over free channels, entering only the two end groups'
        processors (and those of group `via`)."""
        fab, used, forbidden = self.fabric, self.used, self.forbidden
        P, gs = fab.processor_count, fab.group_size
        ga, gb = src // gs, dst // gs
        end_switches = set(fab.group_switches[ga]) | set(fab.group_switches[gb])
        proc_ports, proc_nbrs, sw_down, sw_up, tiers = (
            fab.proc_ports,
            fab.proc_nbrs,
            fab.sw_down,
            fab.sw_up,
            fab.switch_tier,
        )
        parent: dict[int, tuple[int, int]] = {src: (-1, -1)}
        frontier = [src]
        while frontier:
            nxt: list[int] = []
            for u in frontier:
                if u < P:
                    cands: list[tuple[int, tuple[int, ...]]] = [
                        *proc_ports[u],
                        *proc_nbrs[u].items(),
                    ]
                else:
                    si = u - P
                    down = sw_down[si]
                    cands = list(down.get(ga, ()))
                    if gb != ga:
                        cands.extend(down.get(gb, ()))
                    if via >= 0:
                        cands.extend(down.get(via, ()))
                    if uplinks:
                        from_tier1 = tiers[si] == 1
                        for v, bundle in sw_up[si]:
                            if from_tier1 and tiers[v - P] == 0 and v not in end_switches:
                                continue
                            cands.append((v, bundle))
                for v, bundle in cands:
                    if v in parent or (v < P and v in forbidden):
                        continue
                    for c in bundle:
                        if not used[c]:
                            break
                    else:
                        continue
                    parent[v] = (u, c)
                    if v == dst:
                        nodes, chans = [v], []
                        while v != src:
                            v, c = parent[v]
                            nodes.append(v)
                            chans.append(c)
                        return Hop(tuple(reversed(nodes)), tuple(reversed(chans)))
                    nxt.append(v)
            frontier = nxt
        return None


_MEMO_LIMIT = 200_000
_MEMOS: dict[int, tuple[SwitchedFabric, dict]] = {}


def _local_memo(fab: SwitchedFabric) -> dict:
    entry = _MEMOS.get(id(fab))
    if entry is None or entry[0] is not fab:
        if len(_MEMOS) > 8:
            _MEMOS.clear()
        entry = _MEMOS[id(fab)] = (fab, {})
    return entry[1]


def _encode(fab: SwitchedFabric, hop: Hop, ga: int, gb: int) -> tuple:
    """A hop relative to its two end groups (see `_Router._local`)."""
    P, gs = fab.processor_count, fab.group_size
    per = 2 * fab.links_per_group
    ba, bb = 2 * fab.group_link_base[ga], 2 * fab.group_link_base[gb]
    nodes = []
    for n in hop.nodes:
        if n < P:
            nodes.append(("", 0 if n // gs == ga else 1, n - (n // gs) * gs))
        else:
            si = n - P
            side = 0 if n in fab.group_switches[ga] else 1
            nodes.append((fab.switch_dim[si], side, fab.switch_plane[si]))
    chans = [(0, c - ba) if ba <= c < ba + per else (1, c - bb) for c in hop.channels]
    return (tuple(nodes), tuple(chans))


_AXIS_RANK = {"layer": 0, "pipeline": 1, "data": 2}


def _route_rings(
    router: _Router,
    members: list[tuple[str, tuple[int, int], list[int]]],
) -> list[Ring]:
    """Route every ring, local rings first; on failure undo everything and raise."""
    fab = router.fabric
    gs = fab.group_size
    order = sorted(
        range(len(members)),
        key=lambda k: (len({p // gs for p in members[k][2]}), _AXIS_RANK[members[k][0]]),
    )
    routed: dict[int, Ring] = {}
    try:
        for k in order:
            axis, key, procs = members[k]
            routed[k] = _route_ring(router, axis, key, procs)
    except _RingFailed:
        for ring in routed.values():
            router.undo(ring.channels)
        raise
    return [routed[k] for k in range(len(members))]


class _RingFailed(Exception):
    def __init__(self, axis: str, key: tuple[int, int], procs: list[int], src: int, dst: int):
        self.axis, self.key, self.procs, self.src, self.dst = axis, key, procs, src, dst
        self.error: ResourceExhausted | None = None

    @property
    def ring_name(self) -> str:
        return Ring(self.axis, self.key, (), ()).name


def _route_ring(router: _Router, axis: str, key: tuple[int, int], procs: list[int]) -> Ring:
    hops: list[Hop] = []
    n = len(procs)
    try:
        for k in range(n):
            hops.append(router.hop(procs[k], procs[(k + 1) % n]))
    except _NoPath as e:
        for h in hops:
            router.undo(h.channels)
        failed = _RingFailed(axis, key, procs, e.src, e.dst)
        # what is free now, with the job's other rings in place, is what the ring lacked
        failed.error = _explain(router.fabric, router.used, failed)
        raise failed from None
    return Ring(axis, key, tuple(procs), tuple(hops))


def _explain(fab: SwitchedFabric, used: bytearray, failure: _RingFailed) -> ResourceExhausted:
    """Name what is missing (SW-4): free uplinks against what the ring needs, or the group's links.

    Uplinks are counted one way (out of the switch): a ring leaving a switch's
    groups and coming back needs one up channel to leave and one down to return."""
    gs = fab.group_size
    ga, gb = failure.src // gs, failure.dst // gs
    ring = failure.ring_name
    where = f"{fab.node_name(failure.src)} -> {fab.node_name(failure.dst)}"
    if ga == gb or fab.share_tier0(ga, gb):
        groups = fab.group_name(ga) + ("" if ga == gb else f" and {fab.group_name(gb)}")
        return ResourceExhausted(
            f"ring {ring} has no free path {where}: the processor links and tier-0 ports "
            f"of {groups} are all reserved",
            reason="RING_LINKS_EXHAUSTED",
            metadata={
                "ring": ring,
                "from": fab.node_name(failure.src),
                "to": fab.node_name(failure.dst),
            },
        )
    # uplinks: the hops of this ring that leave ga's tier-0 switches / enter gb's
    procs = failure.procs
    n = len(procs)
    need_out = need_in = 0
    for k in range(n):
        x, y = procs[k] // gs, procs[(k + 1) % n] // gs
        if x != y and not fab.share_tier0(x, y):
            need_out += x == ga
            need_in += y == gb

    def best(group: int, inbound: bool) -> tuple[str, int]:
        top, name = -1, ""
        for s in fab.group_switches[group]:
            free = sum(1 for c in fab.up_channels(s) if not used[c ^ inbound])
            if free > top:
                top, name = free, fab.node_name(s)
        return name, top

    meta = {"ring": ring, "from": fab.node_name(failure.src), "to": fab.node_name(failure.dst)}
    sw, free = best(ga, False)
    if free < need_out:
        return ResourceExhausted(
            f"tier-0 switch {sw} has {free} free uplinks, ring {ring} needs {need_out} "
            f"(no free path {where})",
            reason="UPLINKS_EXHAUSTED",
            metadata={**meta, "switch": sw, "free_uplinks": str(free), "needed": str(need_out)},
        )
    sw, free = best(gb, True)
    if free < need_in:
        return ResourceExhausted(
            f"tier-0 switch {sw} has {free} free downlinks from tier 1, ring {ring} needs "
            f"{need_in} (no free path {where})",
            reason="UPLINKS_EXHAUSTED",
            metadata={**meta, "switch": sw, "free_downlinks": str(free), "needed": str(need_in)},
        )
    return ResourceExhausted(
        f"ring {ring} has no free path {where}: the switches have free uplinks, but the "
        f"processor links and tier-0 ports of {fab.group_name(ga)} and {fab.group_name(gb)} "
        "that reach them are reserved",
        reason="RING_LINKS_EXHAUSTED",
        metadata=meta,
    )


def _check_request(
    fabric: SwitchedFabric, degrees: Degrees, tiles: Sequence[Tile], forbidden: frozenset[int]
) -> None:
    degrees.validate()
    if not tiles:
        raise InvalidArgument("tiles", "must name at least one group")
    for n, t in enumerate(tiles):
        t.check(fabric, f"tiles[{n}]")
    seen: set[int] = set()
    for t in tiles:
        procs = t.processors(fabric)
        if seen.intersection(procs):
            raise InvalidArgument("tiles", f"overlap in group {fabric.group_name(t.group)}")
        seen.update(procs)
    capacity = sum(t.size for t in tiles)
    if capacity < degrees.total:
        raise InvalidArgument(
            "degrees",
            f"need {degrees.total} processors (data × pipeline × layer), the tiles hold {capacity}",
        )
    if seen & forbidden:
        raise InvalidArgument("tiles", "include processors of another job")


def _whole_groups(fabric: SwitchedFabric, tiles: Iterable[Tile]) -> frozenset[int]:
    return frozenset(t.group for t in tiles if t.size == fabric.group_size)


def plan_rings(
    fabric: SwitchedFabric,
    used: bytes | bytearray,
    job_id: str,
    degrees: Degrees,
    tiles: Sequence[Tile],
    *,
    forbidden: Iterable[int] = (),
    max_layouts: int = 4,
) -> RingPlan:
    """SW-4: the rings of a job on these tiles, every hop on channels free in `used`.

    `forbidden`: processors of other jobs in the same groups (small jobs), which
    a path may not cross. Processors of the tiles left over by the job (idle
    processors of a large job's groups) only forward (SW-2, ¶56). Tries the best
    few layouts; RESOURCE_EXHAUSTED names what the best one lacked.
    """
    forbidden = frozenset(forbidden)
    _check_request(fabric, degrees, tiles, forbidden)
    ordered = order_tiles(fabric, tiles)
    work = bytearray(used)
    router = _Router(fabric, work, forbidden, _whole_groups(fabric, ordered))
    first_error: ResourceExhausted | None = None
    for name, assignment in layouts(fabric, degrees, ordered, max_layouts):
        members = ring_members(assignment, degrees)
        try:
            rings = _route_rings(router, members)
        except _RingFailed as failure:
            if first_error is None:
                first_error = failure.error
            continue
        return RingPlan(job_id, degrees, tuple(ordered), tuple(assignment), tuple(rings), name)
    assert first_error is not None
    raise first_error


# -- failure: swap a group (SW-5) ------------------------------------------------------


@dataclass(frozen=True)
class SwapResult:
    plan: RingPlan
    old_tile: Tile
    new_tile: Tile
    rerouted: tuple[str, ...]
    # channels freed (the affected rings' old paths) and taken (their new paths)
    released: tuple[int, ...]
    reserved: tuple[int, ...]


def swap_tile(
    fabric: SwitchedFabric,
    used: bytes | bytearray,
    plan: RingPlan,
    old: Tile,
    new: Tile,
    *,
    forbidden: Iterable[int] = (),
) -> SwapResult:
    """Move the processors of `old` to the same places in `new`; re-route only
    the rings that touched `old`, every other ring keeps its links (SW-5).

    `used` must include the plan's own channels (it is the fabric's state)."""
    if old not in plan.tiles:
        raise InvalidArgument("old_tile", f"is not a tile of job {plan.job_id}")
    if (old.height, old.width) != (new.height, new.width):
        raise InvalidArgument(
            "new_tile", f"must have the shape {old.height}x{old.width} of the failed tile"
        )
    new.check(fabric, "new_tile")
    if any(t.group == new.group and t != old for t in plan.tiles):
        raise InvalidArgument(
            "new_tile", f"group {fabric.group_name(new.group)} already runs this job"
        )
    moved = {
        old.processor(fabric, i, j): new.processor(fabric, i, j)
        for i in range(old.height)
        for j in range(old.width)
    }
    forbidden = frozenset(forbidden) - set(moved)
    if forbidden & set(moved.values()):
        raise InvalidArgument("new_tile", "includes processors of another job")
    work = bytearray(used)
    new_plan_tiles = tuple(new if t == old else t for t in plan.tiles)
    affected = [k for k, r in enumerate(plan.rings) if any(p in moved for p in r.processors)]
    released = [c for k in affected for c in plan.rings[k].channels]
    release(work, released)
    router = _Router(fabric, work, forbidden, _whole_groups(fabric, new_plan_tiles))
    members = [
        (plan.rings[k].axis, plan.rings[k].key, [moved.get(p, p) for p in plan.rings[k].processors])
        for k in affected
    ]
    try:
        rerouted = _route_rings(router, members)
    except _RingFailed as failure:
        assert failure.error is not None
        raise failure.error from None
    rings = list(plan.rings)
    for k, ring in zip(affected, rerouted, strict=True):
        rings[k] = ring
    new_plan = RingPlan(
        plan.job_id,
        plan.degrees,
        new_plan_tiles,
        tuple(moved.get(p, p) for p in plan.assignment),
        tuple(rings),
        plan.layout,
    )
    return SwapResult(
        new_plan,
        old,
        new,
        tuple(r.name for r in rerouted),
        tuple(released),
        tuple(c for r in rerouted for c in r.channels),
    )


def replacement_order(
    fabric: SwitchedFabric, failed_group: int, free_groups: Iterable[int]
) -> list[int]:
    """Free groups by preference for taking a failed group's place (SW-5, ¶57):
    same tier-0 switch (cluster row, then column) first, then the nearest."""
    fr, fc = fabric.group_position(failed_group)

    def key(g: int) -> tuple[int, int, int]:
        r, c = fabric.group_position(g)
        level = 0 if r == fr else (1 if fabric.config.two_d and c == fc else 2)
        return (level, abs(r - fr) + abs(c - fc), g)

    return sorted((g for g in set(free_groups) if g != failed_group), key=key)


def job_tile_in(fabric: SwitchedFabric, plan: RingPlan, group: int) -> Tile:
    """The job's tile in `group`; FAILED_PRECONDITION when the job does not use it."""
    old = next((t for t in plan.tiles if t.group == group), None)
    if old is None:
        raise FailedPrecondition(
            f"group {fabric.group_name(group)}",
            f"does not run job {plan.job_id}",
            reason="GROUP_NOT_IN_JOB",
        )
    return old


def swap_first(
    fabric: SwitchedFabric,
    used: bytes | bytearray,
    plan: RingPlan,
    old: Tile,
    candidates: Sequence[Tile],
    *,
    forbidden_for: Callable[[tuple[Tile, ...]], Iterable[int]] = lambda tiles: (),
) -> SwapResult:
    """SW-5: the first candidate tile, in the order given, whose rings route takes
    `old`'s place. `forbidden_for(new tiles)`: other jobs' processors in those groups."""
    if not candidates:
        raise ResourceExhausted(
            f"no free group can take the place of {fabric.group_name(old.group)} in job "
            f"{plan.job_id}",
            reason="NO_FREE_GROUP",
        )
    first: ResourceExhausted | None = None
    for new in candidates:
        tiles = tuple(new if t == old else t for t in plan.tiles)
        try:
            return swap_tile(fabric, used, plan, old, new, forbidden=forbidden_for(tiles))
        except ResourceExhausted as e:
            first = first or e
    assert first is not None
    if len(candidates) == 1:
        raise first
    raise ResourceExhausted(
        f"none of {len(candidates)} free groups can take the place of "
        f"{fabric.group_name(old.group)}: {first.message}",
        reason=first.reason,
        metadata=first.metadata,
    )


def swap_group(
    fabric: SwitchedFabric,
    used: bytes | bytearray,
    plan: RingPlan,
    failed_group: int,
    free_groups: Iterable[int],
    *,
    forbidden: Iterable[int] = (),
) -> SwapResult:
    """SW-5 for a large job: the first free group, in `replacement_order`, whose
    rings can be re-routed takes the failed group's place."""
    old = job_tile_in(fabric, plan, failed_group)
    candidates = [
        Tile(g, old.row, old.col, old.height, old.width)
        for g in replacement_order(fabric, failed_group, free_groups)
    ]
    blocked = frozenset(forbidden)
    return swap_first(fabric, used, plan, old, candidates, forbidden_for=lambda tiles: blocked)


def channel_kinds(fabric: SwitchedFabric, channels: Iterable[int]) -> dict[str, int]:
    """How many channels of each link kind (processor, down, up, mesh, cross)."""
    counts = dict.fromkeys(LINK_KIND_NAMES, 0)
    for c in channels:
        counts[LINK_KIND_NAMES[fabric.link_kind[c >> 1]]] += 1
    return counts


__all__ = [
    "AXES",
    "Degrees",
    "Hop",
    "Ring",
    "RingPlan",
    "SwapResult",
    "Tile",
    "channel_kinds",
    "job_tile_in",
    "layouts",
    "order_tiles",
    "plan_rings",
    "release",
    "replacement_order",
    "reserve",
    "ring_members",
    "swap_first",
    "swap_group",
    "swap_tile",
]
