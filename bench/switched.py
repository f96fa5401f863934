"""Switched superpods (SW-4, seed 002 ¶46-52, ¶61): ring planning speed and
what 3:1 oversubscription costs.

Fabric: 24×24 groups of 4×4 processors (9,216), 12 planes per dimension,
64-port tier-0 switches with 48 down / 16 up (3:1), 8 tier-1 switches per
plane (¶52). The 1:1 baseline has 48 up ports per tier-0 switch (24 tier-1
switches per plane), everything else equal; both run in the same process.

* ring_plans_per_s_{16,256,2048}: `plan_rings` for jobs of (data, pipeline,
  layer) = (1,4,4), (16,4,4), (128,4,4) on an empty fabric, on the groups the
  placement picks; steady state (the router's per-fabric memo is warm after
  the first plan, as in a running fabric manager).
* placed_fraction_{3to1,1to1}: a random job mix (sizes and shapes drawn from
  the TPU v4 slice mix, shapes read as (data, pipeline, layer) largest first)
  arrives one job at a time with random lifetimes (~90 % offered load); a job
  counts as placed when some placement candidate gets all its rings routed
  with reserved channels (congestion-free). Same arrivals for both fabrics.

Run: python3 dev.py bench switched   (or: .venv/bin/python bench/switched.py)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import emit
from lightpath.domain.switched import FIG18_FABRIC, SwitchedFabric
from lightpath.domain.switched_rings import Degrees, RingPlan, plan_rings, release, reserve
from lightpath.errors import ResourceExhausted
from lightpath_services.workload_scheduler.switched_placement import (
    LARGE,
    SwitchedPodState,
    place,
    placements,
    reserved_small_groups,
)

# Jouppi et al., TPU v4 (ISCA 2023), Table 2: share of slices by shape (copied from shared/data).
DATA = Path(__file__).resolve().parent / "data" / "tpu_v4_slice_mix.json"

OVERSUBSCRIBED = FIG18_FABRIC
FULL_BISECTION = replace(OVERSUBSCRIBED, tier0_up_ports=48, tier1_switches=24)
SMALL_GROUPS = 24  # one cluster row reserved for small jobs (SW-2)


def plans_per_second(fabric: SwitchedFabric, degrees: Degrees, seconds: float) -> float:
    state = SwitchedPodState(small_groups=reserved_small_groups(fabric, SMALL_GROUPS))
    placement = place(fabric, state, "bench", degrees)
    used = bytearray(fabric.channel_count)
    n = 0
    start = time.perf_counter()
    while True:
        plan_rings(fabric, used, "bench", degrees, placement.tiles, forbidden=placement.forbidden)
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and n >= 3:
            return n / elapsed


def job_mix(jobs: int, seed: int) -> list[tuple[Degrees, int]]:
    """(degrees, lifetime in arrivals) per job."""
    shapes = json.loads(DATA.read_text())["shapes"]
    weights = [s["share_pct"] for s in shapes]
    mean = sum(w * math.prod(s["chips"]) for w, s in zip(weights, shapes, strict=True)) / sum(
        weights
    )
    # offered load ~0.9 of the pod: mean concurrency = 0.9 * P / mean size
    mean_life = 0.9 * OVERSUBSCRIBED.processor_count / mean
    rng = random.Random(seed)
    out = []
    for _ in range(jobs):
        s = rng.choices(shapes, weights)[0]
        layer, pipeline, data = sorted(s["chips"])
        out.append((Degrees(data, pipeline, layer), max(1, round(rng.expovariate(1 / mean_life)))))
    return out


def placed_fraction(
    fabric: SwitchedFabric, mix: list[tuple[Degrees, int]], tries: int = 4
) -> float:
    small = reserved_small_groups(fabric, SMALL_GROUPS)
    used = bytearray(fabric.channel_count)
    plans: dict[str, tuple[RingPlan, str]] = {}
    departures: dict[int, list[str]] = {}
    placed = 0
    for k, (degrees, life) in enumerate(mix):
        for job in departures.pop(k, []):
            plan, _ = plans.pop(job)
            release(used, plan.channels())
        job = f"j{k}"
        state = SwitchedPodState(
            small_groups=small,
            large={g: j for j, (p, kind) in plans.items() if kind == LARGE for g in p.groups},
            small={j: p.tiles[0] for j, (p, kind) in plans.items() if kind != LARGE},
        )
        try:
            for n, placement in enumerate(placements(fabric, state, job, degrees)):
                if n >= tries:
                    break
                try:
                    plan = plan_rings(
                        fabric, used, job, degrees, placement.tiles, forbidden=placement.forbidden
                    )
                except ResourceExhausted:
                    continue
                reserve(used, plan.channels())
                plans[job] = (plan, placement.kind)
                departures.setdefault(k + life, []).append(job)
                placed += 1
                break
        except ResourceExhausted:
            pass
    return placed / len(mix)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="time per plans-per-second figure")
    ap.add_argument("--jobs", type=int, default=300, help="arrivals in the job mix")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()

    over = SwitchedFabric(OVERSUBSCRIBED)
    full = SwitchedFabric(FULL_BISECTION)
    result = {
        "ring_plans_per_s_16": plans_per_second(over, Degrees(1, 4, 4), args.seconds),
        "ring_plans_per_s_256": plans_per_second(over, Degrees(16, 4, 4), args.seconds),
        "ring_plans_per_s_2048": plans_per_second(over, Degrees(128, 4, 4), args.seconds),
    }
    mix = job_mix(args.jobs, args.seed)
    result["placed_fraction_3to1"] = placed_fraction(over, mix)
    result["placed_fraction_1to1"] = placed_fraction(full, mix)
    emit(result)


if __name__ == "__main__":
    main()
