"""The baseline: a statically cabled 16x16x16 torus and a contiguous packer.

Without optical switches a slice is a contiguous box of chips of the fixed
torus (wraparound included), in any orientation, avoiding the chips of down
hosts. The packer is the one of bench/availability.py made online: for each
orientation of the slice it finds every free offset at once (a windowed sum over
the occupancy, numpy), prefers an offset aligned to the box's extents (a box at
multiples of its size tiles the torus without leaving holes no later box fits,
the buddy rule), then the first free offset in chip order.

The windowed sums come from one summed-volume table of the occupancy per change
of the torus (eight corner lookups per offset for any box), and a shape's answer
is kept until the torus changes: a queue pass after an arrival asks again for the
shapes that did not fit before. That a shape does not fit is kept longer, until the
torus next frees a chip (a release, a host back up): taking chips only ever takes
offsets away.

A shape with an extent larger than the torus (4x4x32: only an optical fabric
can make it) runs as the most compact box of the same chip count that fits
(8x8x8), and a twisted slice as a regular torus: the static machine gets the
same work, never less.
"""

from __future__ import annotations

import itertools
import math
from functools import cache

import numpy as np

Box = tuple[int, int, int]


@cache
def fitting_shape(chips: tuple[int, ...], edge: int) -> Box:
    """`chips` if every extent fits the torus edge, else the most compact box of the
    same chip count that does (smallest largest extent, then smallest sum)."""
    if len(chips) == 3 and all(c <= edge for c in chips):
        return (chips[0], chips[1], chips[2])
    n = math.prod(chips)
    best: Box | None = None
    for a in range(1, edge + 1):
        for b in range(a, edge + 1):
            if n % (a * b):
                continue
            c = n // (a * b)
            if b <= c <= edge:
                cand = (a, b, c)
                if best is None or (max(cand), sum(cand)) < (max(best), sum(best)):
                    best = cand
    if best is None:
        raise ValueError(f"{'x'.join(map(str, chips))} does not fit a {edge}^3 torus")
    return best


@cache
def orientations(shape: Box) -> tuple[Box, ...]:
    return tuple(sorted(set(itertools.permutations(shape))))  # type: ignore[arg-type]


def window_any(mask: np.ndarray, box: Box) -> np.ndarray:
    """out[x, y, z] = any(mask over the box at offset (x, y, z)), with wraparound."""
    out = mask.astype(np.int32)
    for axis, a in enumerate(box):
        if a == 1:
            continue
        n = out.shape[axis]
        padded = np.concatenate([out, np.take(out, range(a - 1), axis=axis)], axis=axis)
        c = np.cumsum(padded, axis=axis)
        zero = np.zeros_like(np.take(c, [0], axis=axis))
        c = np.concatenate([zero, c], axis=axis)
        out = np.take(c, range(a, a + n), axis=axis) - np.take(c, range(n), axis=axis)
    return out > 0


@cache
def _aligned_mask(edge: int, box: Box) -> np.ndarray:
    """Offsets that are multiples of the box's extents (where the extent divides the edge)."""
    axes = [(np.arange(edge) % a == 0) if edge % a == 0 else np.ones(edge, bool) for a in box]
    return axes[0][:, None, None] & axes[1][None, :, None] & axes[2][None, None, :]


class Torus:
    """One static torus: which chips are taken (by a slice or a down host)."""

    def __init__(self, edge: int = 16):
        self.edge = edge
        self.used = np.zeros((edge, edge, edge), dtype=bool)  # held by a slice
        self.down = np.zeros((edge, edge, edge), dtype=bool)  # on a down host
        self.holder: dict[str, tuple[Box, Box]] = {}  # job -> (offset, box)
        self.free_chips = edge**3
        self.version = 0
        self._table: tuple[int, np.ndarray] = (-1, np.zeros(0))
        self._answers: dict[Box, tuple[Box, Box] | None] = {}
        self._answers_at = 0
        self._misses: set[Box] = set()  # shapes with no room since a chip was last freed

    def _summed(self) -> np.ndarray:
        """S[x, y, z] = chips taken in [0, x) x [0, y) x [0, z) of the torus tiled twice
        less one along each axis (so every window, wraparound included, is a box of it)."""
        if self._table[0] != self.version:
            e = self.edge
            dtype = np.int16 if e**3 < 1 << 15 else np.int32
            # the sums over the torus itself: p[x, y, z] for x, y, z in [0, e]
            taken = (self.used | self.down).astype(dtype)
            for axis in range(3):
                np.cumsum(taken, axis=axis, out=taken)
            p = np.zeros((e + 1,) * 3, dtype=dtype)
            p[1:, 1:, 1:] = taken
            # then the tiling, one axis at a time: past the edge, a sum is the whole
            # torus's along that axis plus the sum up to the same point of the next copy
            # (S(e + x) = S(e) + S(x)); the same table as summing the tiled torus, 6x
            # less CPU (the static baseline's share of a compare run)
            for axis in range(3):
                shape = list(p.shape)
                shape[axis] = 2 * e
                out = np.empty(shape, dtype=dtype)
                head = [slice(None)] * 3
                head[axis] = slice(0, e)
                tail = list(head)
                tail[axis] = slice(e, 2 * e)
                whole = list(head)
                whole[axis] = slice(e, e + 1)
                out[tuple(head)] = p[tuple(head)]
                np.add(p[tuple(head)], p[tuple(whole)], out=out[tuple(tail)])
                p = out
            self._table = (self.version, p)
        return self._table[1]

    def taken_in(self, box: Box) -> np.ndarray:
        """out[x, y, z] = chips taken (by a slice or a down host) in the box at (x, y, z):
        the eight corners' sum, one axis at a time (three differences, the first two
        over what remains of the table). The table's int16 arithmetic wraps, and the sum
        is exact modulo 2^16: the true count, at most edge^3 (< 2^15), comes out right."""
        s = self._summed()
        n = self.edge
        a, b, c = box
        d = s[a : a + n] - s[:n]
        d = d[:, b : b + n] - d[:, :n]
        return d[:, :, c : c + n] - d[:, :, :n]

    def place(self, shape: Box) -> tuple[Box, Box] | None:
        """(offset, oriented box) for a slice of `shape`, or None."""
        if self._answers_at != self.version:
            self._answers.clear()
            self._answers_at = self.version
        if shape in self._misses:
            return None
        if shape not in self._answers:
            self._answers[shape] = got = self._place(shape)
            if got is None:
                self._misses.add(shape)
        return self._answers[shape]

    def _place(self, shape: Box) -> tuple[Box, Box] | None:
        for box in orientations(shape):
            if math.prod(box) > self.free_chips:
                return None
            ok = self.taken_in(box) == 0
            aligned = np.flatnonzero(ok & _aligned_mask(self.edge, box))
            pick = aligned if aligned.size else np.flatnonzero(ok)
            if pick.size:
                x, y, z = np.unravel_index(int(pick[0]), ok.shape)
                return (int(x), int(y), int(z)), box
        return None

    def _index(self, offset: Box, box: Box):
        return np.ix_(*[np.arange(o, o + a) % self.edge for o, a in zip(offset, box, strict=True)])

    def take(self, job_id: str, offset: Box, box: Box) -> None:
        idx = self._index(offset, box)
        assert not (self.used[idx] | self.down[idx]).any(), "chips already taken"
        self.used[idx] = True
        self.holder[job_id] = (offset, box)
        self.free_chips -= math.prod(box)
        self.version += 1

    def release(self, job_id: str) -> None:
        offset, box = self.holder.pop(job_id)
        idx = self._index(offset, box)
        self.used[idx] = False
        self.free_chips += int((~self.down[idx]).sum())
        self.version += 1
        self._misses.clear()

    def holders_of(self, offset: Box, box: Box) -> set[str]:
        """Jobs holding any chip of the box (a host that just went down)."""
        out = set()
        cells = {
            tuple(int(v) % self.edge for v in (o + d for o, d in zip(offset, p, strict=True)))
            for p in itertools.product(*(range(a) for a in box))
        }
        for job, (off, b) in self.holder.items():
            for c in cells:
                if all((c[k] - off[k]) % self.edge < b[k] for k in range(3)):
                    out.add(job)
                    break
        return out

    def set_down(self, offset: Box, box: Box, down: bool) -> None:
        idx = self._index(offset, box)
        before = int((self.down[idx] | self.used[idx]).sum())
        self.down[idx] = down
        after = int((self.down[idx] | self.used[idx]).sum())
        self.free_chips -= after - before
        self.version += 1
        if not down:
            self._misses.clear()
