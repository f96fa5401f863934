"""Benchmark: what quotas and fair share do to a cell (issue 35).

    python3 dev.py bench fair_share [--jobs 1500] [--load 0.95] [--policy priority]
                                    [--pods 1] [--seeds 1,2,3]

Three tenants share one 4,096-chip superpod in one cohort with nominal quotas of
50 / 31 / 19 % (examples/sim_quotas.json; with `--pods N`, a cell of N pods, the
quotas scaled to it and the offered load to its chips); the Table 2 mix at the
offered load, each sixth of the arrival window a burst of one tenant (4x the others'
rate). Per seed (the workload's and the bursts'), the same trace runs without quotas
and with them, side by side:

* `utilisation_no_quotas`, `utilisation_quotas` (healthy chips busy over the
  arrival window) and `utilisation_gap_points` (the first minus the second, goal
  <= 3); a job a reclaim delayed goes back to the cell queue and gives its quota
  back, as the service's pod lets it go;
* `utilisation_quotas_no_reclaim`: borrowing without reclaim (and without the pod
  held for an owner's job reclaim cannot place, quota.Hold);
* `idle_points` per run: the healthy chip-seconds not worked, by cause (the
  simulator's `idle_by_cause`, the causes that occur, in points of utilisation: they
  add up with it to 100);
* per tenant: `nominal_share`, `share_held` (mean share of the cell's chips it
  held), `denied_within_nominal` (of the time it had a job waiting, the share during
  which a job of its that fits within its nominal quota waited: 0 = it got its
  nominal share whenever it asked) and `denied_by_cause` (the same split by why the
  job waited: `no_pod_reach`, no pod whose free blocks and borrowers' chips make its
  chips; `not_borrowed`, a pod has them but not in jobs of tenants still borrowing
  when their turn came; `refused_by_pod`, the pod's planner would not place it after
  the reclaim; `other`), mean wait in hours; `reclaims`; `cell_refusals` (forwards
  a pod refused: the cell's view said it could place the job), `holds` (pods held
  for an owner's job).

The top level gives the worst seed's gap (`utilisation_gap_points`) and the most any
tenant was denied within nominal. `no_hold` (per seed and at the top): the run with
quotas again without the pod the cell holds for an owner's job reclaim cannot place
(quota.Hold), side by side.
`load_avg_1m` is the machine's load at the end. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

from _common import emit

from lightpath_services.cell_scheduler import quota as quota_model
from lightpath_services.sim import engine
from lightpath_services.sim.engine import POLICIES, SimConfig, pod_fabric, simulate
from lightpath_services.sim.quotas import load_quotas
from lightpath_services.sim.workload import Generator, bursty_tenants

QUOTAS = Path(__file__).resolve().parent.parent / "examples" / "sim_quotas.json"


def _points(stats: dict) -> dict[str, float]:
    return {k: round(100 * v, 2) for k, v in stats["idle_by_cause"].items() if v}


def _tenants(stats: dict) -> dict[str, dict[str, float]]:
    return {
        t: {
            "nominal_share": round(v["nominal_share"], 4),
            "share_held": round(v["share_held"], 4),
            "denied_within_nominal": round(v["denied_within_nominal"], 5),
            "denied_by_cause": {c: round(f, 5) for c, f in v["denied_by_cause"].items()},
            "mean_wait_h": round(v["mean_wait_s"] / 3600, 2),
        }
        for t, v in stats["quotas"]["tenants"].items()
    }


def one_seed(args: argparse.Namespace, seed: int) -> dict:
    quotas = tuple(
        replace(q, nominal={t: n * args.pods for t, n in q.nominal.items()})
        for q in load_quotas(QUOTAS)
    )
    fabric = pod_fabric("pod-0")
    chips = fabric.chips_per_block * fabric.block_count * args.pods
    jobs = Generator(load=args.load, jobs=args.jobs, seed=seed, chips=chips).generate(fabric)
    jobs = bursty_tenants(jobs, [q.tenant for q in quotas], seed=seed)
    base = SimConfig(policy=POLICIES[args.policy], pods=args.pods)
    plain = simulate(jobs, base).stats
    with_quotas = simulate(jobs, replace(base, quotas=quotas)).stats
    engine.HOLDS = False  # the same, no pod held for an owner's job: what the hold changes
    try:
        no_hold = simulate(jobs, replace(base, quotas=quotas)).stats
    finally:
        engine.HOLDS = True
    # borrowing alone: no reclaim, and so no pod held for an owner's job either
    reclaim = quota_model.QuotaBook.reclaim
    quota_model.QuotaBook.reclaim = lambda *a, **k: None  # type: ignore[method-assign]
    engine.HOLDS = False
    try:
        no_reclaim = simulate(jobs, replace(base, quotas=quotas)).stats
    finally:
        quota_model.QuotaBook.reclaim = reclaim  # type: ignore[method-assign]
        engine.HOLDS = True
    u0, u1 = (s["utilisation_healthy"] for s in (plain, with_quotas))
    return {
        "seed": seed,
        "utilisation_no_quotas": round(u0, 4),
        "utilisation_quotas": round(u1, 4),
        "utilisation_gap_points": round(100 * (u0 - u1), 2),
        "utilisation_quotas_no_reclaim": round(no_reclaim["utilisation_healthy"], 4),
        "reclaims": with_quotas["counters"].get("reclaims", 0),
        "cell_refusals": with_quotas["counters"].get("cell_refusals", 0),
        "holds": with_quotas["counters"].get("holds", 0),
        "idle_points": {
            "no_quotas": _points(plain),
            "quotas": _points(with_quotas),
        },
        "tenants": _tenants(with_quotas),
        "no_hold": {
            "utilisation_quotas": round(no_hold["utilisation_healthy"], 4),
            "utilisation_gap_points": round(100 * (u0 - no_hold["utilisation_healthy"]), 2),
            "tenants": _tenants(no_hold),
        },
    }


def _most_denied(runs: list[dict]) -> float:
    return max(v["denied_within_nominal"] for r in runs for v in r["tenants"].values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1500)
    parser.add_argument("--load", type=float, default=0.95)
    parser.add_argument("--policy", default="priority", choices=sorted(POLICIES))
    parser.add_argument("--seeds", default="1", help="comma-separated workload seeds")
    parser.add_argument("--pods", type=int, default=1)
    args = parser.parse_args()
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error("--seeds takes whole numbers separated by commas, e.g. 1,2,3")
    if not seeds:
        parser.error("--seeds needs at least one seed, e.g. 1,2,3")
    runs = [one_seed(args, s) for s in seeds]
    emit(
        {
            "bench": "fair_share",
            "jobs": args.jobs,
            "pods": args.pods,
            "offered_load": args.load,
            "policy": args.policy,
            "seeds": seeds,
            "utilisation_gap_points": max(r["utilisation_gap_points"] for r in runs),
            "denied_within_nominal_most": _most_denied(runs),
            "no_hold": {
                "utilisation_gap_points": max(r["no_hold"]["utilisation_gap_points"] for r in runs),
                "denied_within_nominal_most": _most_denied([r["no_hold"] for r in runs]),
            },
            "runs": runs,
            "load_avg_1m": round(os.getloadavg()[0], 2),
        }
    )


if __name__ == "__main__":
    sys.exit(main())
