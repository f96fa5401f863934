"""Monte-Carlo goodput of a superpod with and without optical reconfiguration.

    python3 dev.py bench availability [--trials 1000] [--seed 1]

The pod: 64 blocks of 4x4x4 chips (a 16x16x16 chip torus when cabled
statically); a host is a 2x2x1 tray of 4 chips, 16 hosts per block, 1024 hosts.
Each trial draws every host up with probability p (99.0 %, 99.5 %, 99.9 %).
For each slice size (64 … 4096 chips), all requests of that one size, goodput
is the fraction of the pod's 4096 chips that slices of that size get:

* ocs: a block is usable only when all 16 of its hosts are up; slices are
  placed one after another by the workload scheduler's own placement code
  (lightpath_services.workload_scheduler.placement.capacity_for: any healthy free
  blocks form any shape);
* static (no OCS): a slice must be a contiguous box (any orientation) with
  wraparound in the fixed 16x16x16 torus, avoiding the 4 chips of every down
  host. Packing: the best aligned tiling over every orientation and offset,
  then first-fit of further boxes (any orientation, any offset) into what is
  left — a strong static scheduler, so the comparison does not flatter OCS.

The same host draws feed both columns (paired trials). Prints one JSON line:
{"ocs": {"99.0": {"64": g, …}, …}, "static": {…}, "trials": N, "seconds": s}.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import numpy as np
from _common import emit

from lightpath.domain.blocks import PodFabric
from lightpath.domain.slices import SliceDemand
from lightpath_services.workload_scheduler.placement import PodState, capacity_for

AVAILABILITY = {"99.0": 0.990, "99.5": 0.995, "99.9": 0.999}
# Slice shapes in chips (TPU v4's published shapes for these sizes, Jouppi et al. 2023).
SHAPES = {
    64: (4, 4, 4),
    128: (4, 4, 8),
    256: (4, 8, 8),
    512: (8, 8, 8),
    1024: (8, 8, 16),
    2048: (8, 16, 16),
    3072: (12, 16, 16),
    4096: (16, 16, 16),
}
TORUS = 16
BLOCK = (4, 4, 4)
CHIPS = TORUS**3


def sample_hosts(rng: np.random.Generator, trials: int, p: float) -> np.ndarray:
    """Host up/down, shape (trials, 8, 8, 16): hosts are 2x2x1 trays of the 16^3 torus."""
    return rng.random((trials, TORUS // 2, TORUS // 2, TORUS)) < p


# -- OCS: blocks and the scheduler's placement ------------------------------------


def blocks_up(hosts: np.ndarray) -> np.ndarray:
    """(trials, 64): a 4x4x4 block is up when its 2x2x4 hosts all are."""
    t = hosts.shape[0]
    h = hosts.reshape(t, 4, 2, 4, 2, 4, 4)  # (bx, hx, by, hy, bz, hz)
    return h.all(axis=(2, 4, 6)).reshape(t, 64)


def ocs_goodput(up: np.ndarray, fabric: PodFabric) -> dict[str, float]:
    cache: dict[tuple[frozenset[int], int], int] = {}
    totals = dict.fromkeys(SHAPES, 0)
    for row in up:
        failed = frozenset(np.flatnonzero(~row).tolist())
        state = PodState(fabric, failed=set(failed))
        for size, chips in SHAPES.items():
            key = (failed, size)
            if key not in cache:  # capacity_for is a pure function of the failed set
                grid = tuple(c // b for c, b in zip(chips, BLOCK, strict=True))
                demand = SliceDemand(grid, ("tpu",) * math.prod(grid), (True, True, True))
                cache[key] = capacity_for(state, demand)
            totals[size] += cache[key] * size
    return {str(s): totals[s] / (CHIPS * len(up)) for s in SHAPES}


# -- static: contiguous boxes in the fixed torus ----------------------------------


def window_any(mask: np.ndarray, box: tuple[int, int, int]) -> np.ndarray:
    """out[..., x, y, z] = any(mask over the box at offset (x, y, z), with wraparound).
    The last three axes are the torus."""
    out = mask
    for k, a in enumerate(box):
        axis = out.ndim - 3 + k
        if a == 1:
            continue
        n = out.shape[axis]
        padded = np.concatenate([out, np.take(out, range(a - 1), axis=axis)], axis=axis)
        c = np.cumsum(padded, axis=axis, dtype=np.int32)
        zero = np.zeros_like(np.take(c, [0], axis=axis))
        c = np.concatenate([zero, c], axis=axis)
        out = (np.take(c, range(a, a + n), axis=axis) - np.take(c, range(n), axis=axis)) > 0
    return out


def orientations(shape: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    return sorted(set(itertools.permutations(shape)))


def best_tiling(bad: np.ndarray, box: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """For each trial, the most boxes of one aligned tiling (one offset) that avoid
    down chips, and the offset that achieves it. `bad` is window_any(down, box)."""
    t = bad.shape[0]
    counts = []
    offsets = []
    ranges = [range(a) if TORUS % a == 0 else range(TORUS) for a in box]
    for off in itertools.product(*ranges):
        idx = [
            np.array([(o + k * a) % TORUS for k in range(TORUS // a)])
            for o, a in zip(off, box, strict=True)
        ]
        sub = bad[:, idx[0]][:, :, idx[1]][:, :, :, idx[2]]
        counts.append((~sub).reshape(t, -1).sum(axis=1))
        offsets.append(off)
    stacked = np.stack(counts, axis=1)
    best = stacked.argmax(axis=1)
    return stacked[np.arange(t), best], np.array(offsets)[best]


def mark(used: np.ndarray, off, box) -> None:
    ix = [np.arange(o, o + a) % TORUS for o, a in zip(off, box, strict=True)]
    used[np.ix_(*ix)] = True


def first_fit(used: np.ndarray, boxes: list[tuple[int, int, int]]) -> int:
    """Place further boxes (any orientation, first free offset) into `used`; how many fit."""
    added = 0
    while True:
        for box in boxes:
            free = np.flatnonzero(~window_any(used, box))
            if free.size:
                mark(used, np.unravel_index(free[0], used.shape), box)
                added += 1
                break
        else:
            return added


def static_goodput(hosts: np.ndarray) -> dict[str, float]:
    down = ~np.repeat(np.repeat(hosts, 2, axis=1), 2, axis=2)  # (trials, 16, 16, 16) chips
    t = down.shape[0]
    out = {}
    for size, shape in SHAPES.items():
        boxes = orientations(shape)
        best = np.full(t, -1)
        best_off = np.zeros((t, 3), dtype=int)
        best_box = np.zeros(t, dtype=int)
        for i, box in enumerate(boxes):
            count, off = best_tiling(window_any(down, box), box)
            better = count > best
            best[better], best_off[better], best_box[better] = count[better], off[better], i
        max_tiles = max(math.prod(TORUS // a for a in b) for b in boxes)
        total = 0
        for trial in range(t):
            n = int(best[trial])
            if n < max_tiles and (CHIPS - size * n) >= size:
                used = down[trial].copy()
                box = boxes[best_box[trial]]
                bad = window_any(down[trial], box)
                ranges = [
                    [(o + k * a) % TORUS for k in range(TORUS // a)]
                    for o, a in zip(best_off[trial], box, strict=True)
                ]
                for pos in itertools.product(*ranges):
                    if not bad[pos]:
                        mark(used, pos, box)
                n += first_fit(used, boxes)
            total += n * size
        out[str(size)] = total / (CHIPS * t)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--trials", type=int, default=1000, help="trials per availability (>= 1000)"
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    fabric = PodFabric("bench", BLOCK, ("tpu",) * 64)
    ocs, static = {}, {}
    for name, p in AVAILABILITY.items():
        hosts = sample_hosts(rng, args.trials, p)
        ocs[name] = ocs_goodput(blocks_up(hosts), fabric)
        static[name] = static_goodput(hosts)
    emit(
        {
            "ocs": ocs,
            "static": static,
            "trials": args.trials,
            "seconds": time.perf_counter() - started,
        }
    )


if __name__ == "__main__":
    main()
