"""Benchmark: how much of a 4,096-chip superpod the real TPU v4 slice mix fills (issue 28).

    python3 dev.py bench slice_mix [--seed 1] [--runs 20] [--no-wire]

A 64-block pod of 4x4x4 blocks (16 hosts of 2x2x1 chips each) is offered slices
drawn from Table 2 of the TPU v4 paper (lightpath/data/tpu_v4_slice_mix.json,
weighted by each shape's share, fixed seed). Each drawn JobSpec goes through the
real code: `lightpath.domain.jobs.normalize` (the workload scheduler's request
checks, twisted shapes as the table marks them) and the workload scheduler's
planner (`plan_admission` without preemption, then `apply_allocation`), on one
in-memory snapshot that every placement updates. A slice that does not fit is
skipped; the fill stops after 100 draws in a row that do not fit.

Two draws from the same seed, side by side:

* `chips_used_fraction`: the share of the pod's chips held by the slices placed,
  with slices smaller than a block packed into shared blocks (goal >= 0.95);
  `blocks_touched_fraction`: the share of blocks holding any slice;
* `chips_used_fraction_blocks_only`: the same draw with every sub-block shape
  rounded up to a whole 4x4x4 block, what a job system had to do before: the chips
  the slices asked for over the pod's; `chips_held_fraction_blocks_only` counts the
  whole blocks they were given.

Then `twisted_wire_ms_p50` / `untwisted_wire_ms_p50`: the full-pod wiring time
of a twisted and a regular 8x8x16 through a real ocs_manager, interleaved in one
run (bench/twisted_wire.py). `load_avg_1m` is the machine's load at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from _common import emit
from twisted_wire import measure_twisted_wire

from lightpath.domain.blocks import PodFabric
from lightpath.domain.jobs import normalize
from lightpath.domain.slices import RUNNING, SliceJob
from lightpath.errors import InvalidArgument
from lightpath.slice_mix import MixShape, drawer, load
from lightpath.v1 import common_pb2, workload_scheduler_pb2
from lightpath_services.workload_scheduler.placement import PodState
from lightpath_services.workload_scheduler.planner import (
    Allocation,
    apply_allocation,
    plan_admission,
)

BLOCK = (4, 4, 4)
BLOCKS = 64
GIVE_UP_AFTER = 100


def pod() -> PodState:
    return PodState(PodFabric("bench", BLOCK, ("tpu",) * BLOCKS, host_shape=(2, 2, 1)))


def rounded_up(chips: tuple[int, ...]) -> tuple[int, ...]:
    """A sub-block shape as a job system must ask for it without sub-block slices."""
    if all(c <= b for c, b in zip(chips, BLOCK, strict=True)):
        return BLOCK
    return chips


def fill(seed: int, *, blocks_only: bool) -> dict:
    """Offer draws until GIVE_UP_AFTER in a row do not fit; what the pod then holds."""
    state = pod()
    fabric = state.fabric
    draws = drawer(load()[1], seed)
    misses = placed = offered = asked = 0
    started = time.perf_counter()
    while misses < GIVE_UP_AFTER:
        shape: MixShape = next(draws)
        offered += 1
        chips = rounded_up(shape.chips) if blocks_only else shape.chips
        spec = workload_scheduler_pb2.JobSpec(
            job_id=f"j{offered}",
            shape=common_pb2.Shape(dims=chips),
            twisted=shape.twisted,
        )
        try:
            norm = normalize(spec, fabric)
        except InvalidArgument as err:  # the table holds only shapes the pod takes
            raise SystemExit(f"{shape.name}: {err.message}") from err
        job = SliceJob(
            job_id=spec.job_id,
            state="PENDING",
            epoch=1,
            priority=norm.priority,
            seq=offered,
            demand=norm.demand,
        )
        state.jobs[job.job_id] = job
        found = plan_admission(state, job, preempt=False)
        if not isinstance(found, Allocation):
            del state.jobs[job.job_id]
            misses += 1
            continue
        misses = 0
        placed += 1
        asked += shape.chip_count
        apply_allocation(state, found)
        state.jobs[job.job_id] = state.jobs[job.job_id].with_(state=RUNNING)
    counts = state.counts_by_type()["tpu"]
    total = counts["chips_total"]
    touched = sum(1 for b in range(BLOCKS) if b in state.owner)
    return {
        "placed": placed,
        "offered": offered,
        "chips_held": counts["chips_used"],
        "chips_asked": asked,
        "chips_used_fraction": asked / total,
        "chips_held_fraction": counts["chips_used"] / total,
        "blocks_touched_fraction": touched / BLOCKS,
        "plan_ms_per_offer": (time.perf_counter() - started) * 1000 / offered,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--runs", type=int, default=20, help="wiring runs of each kind")
    parser.add_argument("--no-wire", action="store_true", help="skip the wiring figures")
    args = parser.parse_args()
    mixed = fill(args.seed, blocks_only=False)
    whole = fill(args.seed, blocks_only=True)
    out = {
        "seed": args.seed,
        "chips_used_fraction": mixed["chips_used_fraction"],
        "blocks_touched_fraction": mixed["blocks_touched_fraction"],
        "slices_placed": mixed["placed"],
        "slices_offered": mixed["offered"],
        "plan_ms_per_offer": mixed["plan_ms_per_offer"],
        "chips_used_fraction_blocks_only": whole["chips_used_fraction"],
        "chips_held_fraction_blocks_only": whole["chips_held_fraction"],
        "blocks_touched_fraction_blocks_only": whole["blocks_touched_fraction"],
        "slices_placed_blocks_only": whole["placed"],
    }
    if not args.no_wire:
        wired = asyncio.run(measure_twisted_wire(args.runs))
        out.update(
            twisted_wire_ms_p50=wired["twisted_wire_ms_p50"],
            untwisted_wire_ms_p50=wired["untwisted_wire_ms_p50"],
            wire_runs=wired["runs"],
        )
    out["load_avg_1m"] = os.getloadavg()[0]
    emit(out)


if __name__ == "__main__":
    main()
