"""WS-10: ring plans for data, pipeline and layer parallelism on a torus slice.

Seed 002 ¶28-31, ¶38: the communication of each kind of parallelism maps onto
rings (Hamiltonian cycles); the job's chips form a data x pipeline x layer
Cartesian arrangement and every line of it along one axis is a ring.

Here each axis of degree > 1 gets whole dimensions of the slice (in chips), the
product of their extents being its degree; the axis' rings are Hamiltonian
cycles of that sub-grid, one per position of the other dimensions, so each
chip is in exactly one ring per axis and consecutive chips (and last → first)
are torus neighbours inside the slice (a wraparound link only where the slice
wraps). A sub-grid has such a cycle when it is:

* one chip (degree 1) or two neighbouring chips;
* one dimension of n >= 3 chips with wraparound (a line without it is a path);
* two or more dimensions with an even chip count (a snake with a return
  column), or with an odd chip count when an odd dimension wraps.

Splitting one dimension between two axes never works with contiguous chunks:
the outer axis would step over whole chunks, which are not neighbours. So a
degree that is no product of whole dimensions is refused with
INVALID_ARGUMENT saying which degrees cannot be mapped and why.

Among the assignments that work, the first in a fixed order is chosen (data on
the lowest dimensions), so the same request always gets the same plan.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from lightpath.errors import InvalidArgument

AXES = ("data", "pipeline", "layer")
Chip = tuple[int, ...]


@dataclass(frozen=True)
class AxisRings:
    axis: str
    degree: int
    dims: tuple[int, ...]  # slice dimensions this axis runs along
    rings: tuple[tuple[Chip, ...], ...]


@dataclass(frozen=True)
class RingPlan:
    chips: tuple[int, ...]
    wrap: tuple[bool, ...]
    axes: tuple[AxisRings, ...]


def _snake(sizes: Sequence[int]) -> list[tuple[int, ...]]:
    """Boustrophedon order of a grid: consecutive entries differ by 1 in one coordinate."""
    if not sizes:
        return [()]
    inner = _snake(sizes[:-1])
    out: list[tuple[int, ...]] = []
    for v in range(sizes[-1]):
        part = inner if v % 2 == 0 else inner[::-1]
        out.extend((*c, v) for c in part)
    return out


def _cycle_problem(sizes: Sequence[int], wraps: Sequence[bool]) -> str | None:
    """Why the grid `sizes` (each > 1) has no Hamiltonian cycle, or None if it has one."""
    if len(sizes) <= 1:
        if not sizes or sizes[0] == 2 or wraps[0]:
            return None
        return f"a line of {sizes[0]} chips without wraparound is a path, not a ring"
    if math.prod(sizes) % 2 == 0:
        return None
    if any(w and n >= 3 for n, w in zip(sizes, wraps, strict=True)):
        return None
    shape = "x".join(map(str, sizes))
    return f"a {shape} grid of an odd number of chips without wraparound has no ring through every chip"


def hamiltonian_cycle(sizes: Sequence[int], wraps: Sequence[bool]) -> list[tuple[int, ...]]:
    """A Hamiltonian cycle of the grid `sizes` (every size > 1), as local coordinates."""
    problem = _cycle_problem(sizes, wraps)
    if problem:
        raise ValueError(problem)
    if not sizes:
        return [()]
    if len(sizes) == 1:
        return [(i,) for i in range(sizes[0])]
    even = next((d for d, n in enumerate(sizes) if n % 2 == 0), None)
    if even is not None:
        return _ladder_cycle(sizes, even, turn_around=True)
    ring = next(d for d, (n, w) in enumerate(zip(sizes, wraps, strict=True)) if w and n >= 3)
    return _ladder_cycle(sizes, ring, turn_around=False)


def _ladder_cycle(sizes: Sequence[int], d: int, *, turn_around: bool) -> list[tuple[int, ...]]:
    """Cycle over (dimension d) x (snake path P over the other dimensions).

    turn_around (size of d even): rows i of d traverse P[1:] back and forth, then
    return along P[0]. Otherwise (d odd, wrapping): go along P at i = 0, then
    cover i = 1..n-1 row by row of P backwards, ending at (n-1, P[0]), whose
    wraparound neighbour is the start (0, P[0]).
    """
    n = sizes[d]
    rest = [s for k, s in enumerate(sizes) if k != d]
    path = _snake(rest)

    def chip(i: int, p: tuple[int, ...]) -> tuple[int, ...]:
        return (*p[:d], i, *p[d:])

    seq: list[tuple[int, ...]] = []
    if turn_around:
        for i in range(n):
            cols = path[1:] if i % 2 == 0 else path[:0:-1]
            seq.extend(chip(i, p) for p in cols)
        seq.extend(chip(i, path[0]) for i in range(n - 1, -1, -1))
        return seq
    seq.extend(chip(0, p) for p in path)
    for row, j in enumerate(range(len(path) - 1, -1, -1)):
        cs = range(1, n) if row % 2 == 0 else range(n - 1, 0, -1)
        seq.extend(chip(i, path[j]) for i in cs)
    return seq


def _assignments(chips: Sequence[int], degrees: dict[str, int]):
    """Every map of the slice's dimensions (extent > 1) to axes whose products are the degrees."""
    dims = [d for d, n in enumerate(chips) if n > 1]
    axes = [a for a in AXES if degrees[a] > 1]
    for owners in itertools.product(axes, repeat=len(dims)):
        got = dict.fromkeys(AXES, 1)
        for d, a in zip(dims, owners, strict=True):
            got[a] *= chips[d]
        if all(got[a] == degrees[a] for a in AXES):
            yield {a: tuple(d for d, o in zip(dims, owners, strict=True) if o == a) for a in AXES}


def plan_rings(
    chips: Sequence[int],
    wrap: Sequence[bool],
    degrees: dict[str, int],
    *,
    field: str = "parallelism",
) -> RingPlan:
    """The rings of each parallelism axis (WS-10), or InvalidArgument saying why there are none."""
    chips = tuple(chips)
    wrap = tuple(wrap)
    total = math.prod(chips)
    bad = [a for a in AXES if degrees.get(a, 0) < 1]
    if bad:
        raise InvalidArgument(f"{field}.{bad[0]}", "every degree must be >= 1")
    product = math.prod(degrees[a] for a in AXES)
    shape = "x".join(map(str, chips))
    if product != total:
        raise InvalidArgument(
            field,
            f"data x pipeline x layer = {degrees['data']}x{degrees['pipeline']}x"
            f"{degrees['layer']} = {product} must equal the slice's {total} chips ({shape})",
            reason="PARALLELISM_PRODUCT",
        )
    problems: list[str] = []
    for assignment in _assignments(chips, degrees):
        why = [
            f"{a} on {_dims_text(assignment[a], chips, wrap)}: {p}"
            for a in AXES
            if (
                p := _cycle_problem(
                    [chips[d] for d in assignment[a]], [wrap[d] for d in assignment[a]]
                )
            )
        ]
        if not why:
            return RingPlan(
                chips,
                wrap,
                tuple(_axis_rings(a, degrees[a], assignment[a], chips, wrap) for a in AXES),
            )
        problems.append("; ".join(why))
    if problems:
        detail = " | ".join(sorted(set(problems)))
        rule = f"no ring mapping of these degrees on the {shape}-chip slice: {detail}"
    else:
        rule = (
            f"each degree must be a product of whole slice dimensions ({shape} chips), "
            "each dimension going to one axis: "
            + ", ".join(
                f"{a}={degrees[a]}"
                for a in AXES
                if degrees[a] > 1 and not _is_subproduct(degrees[a], chips)
            )
            or "the degrees do not split the dimensions between the axes"
        )
    raise InvalidArgument(field, rule, reason="PARALLELISM_UNMAPPABLE")


def _is_subproduct(degree: int, chips: Sequence[int]) -> bool:
    dims = [n for n in chips if n > 1]
    return any(
        math.prod(c) == degree
        for r in range(1, len(dims) + 1)
        for c in itertools.combinations(dims, r)
    )


def _dims_text(dims: tuple[int, ...], chips: Sequence[int], wrap: Sequence[bool]) -> str:
    names = "xyzwvu"
    return "+".join(f"{names[d]}({chips[d]}{'' if wrap[d] else ', no wrap'})" for d in dims)


def _axis_rings(
    axis: str, degree: int, dims: tuple[int, ...], chips: tuple[int, ...], wrap: tuple[bool, ...]
) -> AxisRings:
    cycle = hamiltonian_cycle([chips[d] for d in dims], [wrap[d] for d in dims])
    others = [d for d in range(len(chips)) if d not in dims]
    rings = []
    for fixed in _snake_free([chips[d] for d in others]):
        ring = []
        for local in cycle:
            c = [0] * len(chips)
            for d, v in zip(others, fixed, strict=True):
                c[d] = v
            for d, v in zip(dims, local, strict=True):
                c[d] = v
            ring.append(tuple(c))
        rings.append(tuple(ring))
    return AxisRings(axis, degree, dims, tuple(rings))


def _snake_free(sizes: Sequence[int]) -> list[tuple[int, ...]]:
    """Row-major (x fastest) positions of the dimensions not in the ring."""
    return [tuple(reversed(p)) for p in itertools.product(*(range(n) for n in reversed(sizes)))]


def neighbours(a: Chip, b: Chip, chips: Sequence[int], wrap: Sequence[bool]) -> bool:
    """True when chips a and b are linked in the slice's torus (wraparound only where it wraps)."""
    diff = [d for d in range(len(chips)) if a[d] != b[d]]
    if len(diff) != 1:
        return False
    d = diff[0]
    step = abs(a[d] - b[d])
    return step == 1 or (wrap[d] and step == chips[d] - 1 and chips[d] > 2)
