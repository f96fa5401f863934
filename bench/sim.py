"""Benchmark: how fast `lightpath sim` simulates, and its headline at offered load 0.95.

    python3 dev.py bench sim [--jobs 100000] [--cell-jobs 100000] [--headline-jobs 3000]

* `jobs_per_s_one_pod`: the Table 2 mix at offered load 0.95 on one 4,096-chip
  superpod, the default policy (aged: the service as it ships), no failures: jobs
  simulated per second of CPU (goal: 100,000 jobs in <= 60 s on one core, i.e.
  >= 1,667 jobs/s);
* `jobs_per_s_cell8`: the same on a cell of 8 pods, the cell's pod choice deciding
  where each job goes (goal: 100,000 jobs in <= 5 min, >= 333 jobs/s);
* the headline of `lightpath sim compare` at offered load 0.95 on one pod, host
  availability 99.5 % (MTTR 4 h): `utilisation_best_095` (the best OCS policy's
  utilisation of healthy chips), `utilisation_static_095` (the static torus's),
  `mean_wait_ratio_static_vs_best_095` (static mean wait ÷ the best policy's);
  `best_policy_095` names it, `idle_by_cause_best_095` where its idle healthy chips
  are (the summary's idle_by_cause, ÷ healthy chips). The best policy: the highest
  utilisation among the OCS policies whose mean wait is no longer than FIFO's
  (utilisation alone would crown a policy that keeps the machine busy by making jobs
  queue);
  `policies_095` gives every policy's utilisation and mean wait (hours).

`load_avg_1m` is the machine's load at the end. A benchmark, not a test: nothing
is asserted.
"""

from __future__ import annotations

import argparse
import os
import time

from _common import emit

from lightpath_services.sim.compare import run_many
from lightpath_services.sim.engine import Failures, SimConfig, pod_fabric, simulate
from lightpath_services.sim.workload import Generator


def rate(jobs: int, pods: int, seed: int) -> tuple[float, float]:
    work = Generator(load=0.95, jobs=jobs, seed=seed, chips=4096 * pods).generate(
        pod_fabric("pod-0")
    )
    started = time.process_time()
    simulate(work, SimConfig(pods=pods))
    cpu = time.process_time() - started
    return jobs / cpu, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs on one pod")
    parser.add_argument("--cell-jobs", type=int, default=100_000, help="jobs on the cell of 8")
    parser.add_argument(
        "--headline-jobs", type=int, default=3000, help="jobs of the 0.95 compare (6 policies)"
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    one, one_cpu = rate(args.jobs, 1, args.seed)
    cell, cell_cpu = rate(args.cell_jobs, 8, args.seed)
    work = Generator(load=0.95, jobs=args.headline_jobs, seed=args.seed).generate(
        pod_fabric("pod-0")
    )
    config = SimConfig(failures=Failures.from_availability(0.995, 4 * 3600), seed=args.seed)
    _, summaries = run_many(work, config, ["static", "fifo", "priority", "aged", "easy", "defrag"])
    by = {s["policy"]: s for s in summaries}
    fifo_wait = by["fifo"]["wait_s"]["mean"]
    best = max(
        (s for s in summaries if s["policy"] != "static" and s["wait_s"]["mean"] <= fifo_wait),
        key=lambda s: s["utilisation_healthy"],
    )
    static = by["static"]
    emit(
        {
            "jobs_per_s_one_pod": one,
            "one_pod_jobs": args.jobs,
            "one_pod_cpu_s": one_cpu,
            "jobs_per_s_cell8": cell,
            "cell8_jobs": args.cell_jobs,
            "cell8_cpu_s": cell_cpu,
            "utilisation_best_095": best["utilisation_healthy"],
            "best_policy_095": best["policy"],
            "utilisation_static_095": static["utilisation_healthy"],
            "mean_wait_ratio_static_vs_best_095": (
                static["wait_s"]["mean"] / best["wait_s"]["mean"]
                if best["wait_s"].get("mean")
                else None
            ),
            "idle_by_cause_best_095": {k: round(v, 4) for k, v in best["idle_by_cause"].items()},
            "headline_jobs": args.headline_jobs,
            "headline_offered_load": best["offered_load"],
            "policies_095": {
                s["policy"]: [
                    round(s["utilisation_healthy"], 4),
                    round(s["wait_s"]["mean"] / 3600, 2),
                ]
                for s in summaries
            },
            "load_avg_1m": os.getloadavg()[0],
        }
    )


if __name__ == "__main__":
    main()
