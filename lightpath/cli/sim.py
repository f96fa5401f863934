"""`lightpath sim run|compare|generate`: replay a workload through the real scheduler's
decisions on a virtual clock (issue 29, docs/sim.md).

    lightpath sim run --load 0.95 --jobs 20000                   # the Table 2 mix, one pod
    lightpath sim run --trace jobs.csv --pods 8 --policy easy    # your trace, a cell of 8
    lightpath sim compare --load 0.95 --availability 0.995 --out sim-out
    lightpath sim generate --load 0.8 --jobs 1000 jobs.csv       # a trace to edit
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lightpath.cli._common import add_json_flag, print_json, table, wants_json
from lightpath.stack import services_missing

MODEL = """\
the model (docs/sim.md):
  A virtual clock over one 4,096-chip superpod (64 blocks of 4x4x4 chips, 16 hosts of
  2x2x1 chips each) or a cell of --pods such pods. Every decision is the services' own
  code: the workload scheduler's planner (admission, placement, sub-block packing,
  preemption, block swaps and box moves on a failed host, suspend or fail), and in a
  cell the cell scheduler's pod choice. The static baseline is a statically cabled
  16x16x16 torus with a contiguous packer (any orientation, aligned offsets first).
  A job needs chips x duration of work; an interrupted one (preempted and requeued,
  its block swapped, its box moved, suspended by a failure) pays --restart-s of its
  slice's work again; a terminated or failed one loses all it did.
  Hosts fail and recover (exponential up and down times) from --availability and
  --mttr-h; the same failure draws for every policy of a compare.

policies:
  static    static torus, contiguous boxes, queue order with greedy backfill
  fifo      OCS, queue order, no backfill, no preemption
  priority  OCS, the workload scheduler with its age bound off: priority order,
            preemption of lower priorities, greedy backfill
  aged      OCS, the workload scheduler as it ships: priority, and a job waiting past
            the age bound (LIGHTPATH_WS_AGE_BOUND_S, 1 h) may preempt the younger jobs
            of its priority that overtook it, and a running slice past it swaps a
            failed block for one of theirs [default]
  easy      OCS, priority + preemption, EASY backfill: later jobs may not delay the
            first waiting job's reservation (from duration estimates)
  defrag    easy + moving sub-block slices out of shared blocks to free whole blocks

what it leaves out: the core broker, aggregation switches, the network's effect on
job speed (a twisted torus runs as fast as a regular one), wiring failures, the
cell's report delays; see docs/sim.md.
"""


def register(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser(
        "sim",
        help="simulate a workload through the real scheduler on a virtual clock",
        description=__doc__.splitlines()[0],
        epilog=MODEL,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = sim.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    run = verbs.add_parser(
        "run",
        help="one policy: a summary, a per-job CSV and plots",
        epilog=MODEL,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _workload_args(run)
    run.add_argument(
        "--policy",
        help="static, fifo, priority, aged, easy or defrag "
        "(default aged: the workload scheduler as it ships)",
    )
    run.set_defaults(func=cmd_run)
    compare = verbs.add_parser(
        "compare",
        help="several policies on the same workload and failures, side by side",
        epilog=MODEL,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _workload_args(compare)
    compare.add_argument(
        "--policies",
        default="static,fifo,priority,aged,easy,defrag",
        help="comma-separated (default static,fifo,priority,aged,easy,defrag)",
    )
    compare.set_defaults(func=cmd_compare)
    gen = verbs.add_parser("generate", help="write a generated workload as a CSV trace")
    _generator_args(gen)
    gen.add_argument("path", type=Path, help="the CSV file to write")
    gen.set_defaults(func=cmd_generate)


def _generator_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("generated workload (without --trace)")
    g.add_argument(
        "--load",
        type=float,
        default=0.8,
        help="offered load: chip-seconds asked per second ÷ chips",
    )
    g.add_argument("--jobs", type=int, default=2000, help="how many jobs (default 2000)")
    g.add_argument(
        "--seed",
        type=int,
        default=1,
        help="random generator start value: the same value draws the same workload and failures",
    )
    g.add_argument("--pods", type=int, default=1, help="pods in the cell (default 1: one superpod)")
    g.add_argument(
        "--estimate-error",
        type=float,
        default=0.0,
        help="users' duration estimates are the duration x U(1, 1+E) (default 0: exact)",
    )


def _workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", type=Path, help="a CSV or JSON-lines trace (docs/sim.md)")
    p.add_argument(
        "--strict", action="store_true", help="refuse the trace if any row is bad (else skipped)"
    )
    _generator_args(p)
    f = p.add_argument_group("failures and costs")
    f.add_argument(
        "--availability",
        type=float,
        default=0.0,
        help="per-host availability, e.g. 0.995 (default: no failures)",
    )
    f.add_argument("--mttr-h", type=float, default=4.0, help="mean time to repair a host (hours)")
    f.add_argument(
        "--restart-s",
        type=float,
        default=300.0,
        help="checkpoint-restart cost of an interrupted slice (seconds of its work)",
    )
    f.add_argument(
        "--reconfig-s", type=float, default=0.0, help="OCS wiring time of a block slice (seconds)"
    )
    q = p.add_argument_group("quotas and fair share (docs/sim.md)")
    q.add_argument(
        "--quotas",
        type=Path,
        help="a JSON list of tenants' quotas ({tenant, tpu_chips, cohort, borrowing_limit, "
        "lending_limit, weight}): jobs pass the cell's quota check and fair-share order",
    )
    q.add_argument(
        "--half-life-h",
        type=float,
        default=1.0,
        help="half-life of the usage fair share orders tenants by (hours, default 1)",
    )
    p.add_argument("--out", type=Path, help="write summary.json, jobs-*.csv and PNG plots here")
    add_json_flag(p)


def _fail(message: str) -> int:
    print(f"lightpath sim: {message}", file=sys.stderr)
    return 2


def _load_jobs(args: argparse.Namespace):
    from lightpath_services.sim.engine import pod_fabric
    from lightpath_services.sim.workload import Generator, TraceError, read_trace

    fabric = pod_fabric("pod-0")
    if getattr(args, "trace", None) is not None:
        try:
            jobs, bad = read_trace(args.trace, fabric, strict=args.strict)
        except TraceError as err:
            for b in err.problems:
                print(f"{args.trace}: {b}", file=sys.stderr)
            raise SystemExit(
                _fail(f"{args.trace}: {len(err.problems)} bad row(s); refused")
            ) from None
        for b in bad:
            print(f"{args.trace}: {b} (skipped)", file=sys.stderr)
        if not jobs:
            raise SystemExit(_fail(f"{args.trace}: no job to simulate"))
        return jobs, {"trace": str(args.trace), "bad_rows": len(bad)}
    if args.load <= 0 or args.jobs < 1 or args.pods < 1:
        raise SystemExit(_fail("--load must be > 0, --jobs and --pods >= 1"))
    gen = Generator(
        load=args.load,
        jobs=args.jobs,
        seed=args.seed,
        chips=4096 * args.pods,
        estimate_error=args.estimate_error,
    )
    return gen.generate(fabric), {"generator": "tpu_v4_table2", "load": args.load}


def _config(args: argparse.Namespace):
    from lightpath_services.sim.engine import Failures, SimConfig

    failures = None
    if args.availability:
        if not 0 < args.availability < 1 or args.mttr_h <= 0:
            raise SystemExit(_fail("--availability must be in (0, 1) and --mttr-h > 0"))
        failures = Failures.from_availability(args.availability, args.mttr_h * 3600)
    if args.restart_s < 0 or args.reconfig_s < 0:
        raise SystemExit(_fail("--restart-s and --reconfig-s must be >= 0"))
    quotas: tuple = ()
    if getattr(args, "quotas", None) is not None:
        from lightpath_services.sim.quotas import load_quotas

        if args.half_life_h <= 0:
            raise SystemExit(_fail("--half-life-h must be > 0"))
        try:
            quotas = tuple(load_quotas(args.quotas))
        except ValueError as e:
            raise SystemExit(_fail(f"--quotas {e}")) from None
    return SimConfig(
        quotas=quotas,
        half_life_s=getattr(args, "half_life_h", 1.0) * 3600,
        pods=args.pods,
        restart_s=args.restart_s,
        reconfig_s=args.reconfig_s,
        failures=failures,
        seed=args.seed,
    )


def _policies(raw: str) -> list[str]:
    from lightpath_services.sim.engine import POLICIES

    names = [p.strip() for p in raw.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown or not names:
        raise SystemExit(
            _fail(f"unknown policy {', '.join(unknown)}; choose from {', '.join(POLICIES)}")
        )
    return names


def _report(args: argparse.Namespace, results, summaries, extra) -> int:
    from lightpath_services.sim.compare import idle_legend, idle_rows, write_outputs
    from lightpath_services.sim.compare import table as rows_of

    written = []
    if args.out is not None:
        written = write_outputs(args.out, results, summaries, extra)
    if wants_json(args):
        print_json({**extra, "runs": summaries, "files": [str(p) for p in written]})
        return 0
    rows = rows_of(summaries)
    print(table(rows[1:], rows[0]))
    idle = idle_rows(summaries)
    print(
        "\nidle healthy chips by cause, % of healthy chips (each idle chip under the first"
        " cause, left to right, that holds)"
    )
    print(table(idle[1:], idle[0]))
    for line in idle_legend(summaries):
        print(f"  {line}")
    s = summaries[0]
    print(
        f"\n{s['jobs']} jobs, offered load {s['offered_load']:.2f} on {s['pods']} pod(s), "
        f"host availability {100 * s['host_availability']:.2f} %; utilisation over the "
        "arrival window; 'largest wait' is the mean wait of the largest slices"
    )
    for run in summaries:
        tenants = (run.get("quotas") or {}).get("tenants")
        if not tenants:
            continue
        print(f"\nquotas, {run['label']}: share of the cell's chips each tenant held")
        print(
            table(
                [
                    [
                        t,
                        f"{100 * v['nominal_share']:.1f} %",
                        f"{100 * v['share_held']:.1f} %",
                        f"{100 * v['asking_fraction']:.0f} %",
                        f"{100 * v['denied_within_nominal']:.2f} %",
                        f"{v['mean_wait_s'] / 3600:,.1f}",
                    ]
                    for t, v in tenants.items()
                ],
                ["TENANT", "NOMINAL", "HELD", "ASKING", "DENIED WITHIN QUOTA", "WAIT_H"],
            )
        )
    for p in written:
        print(f"wrote {p}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    if missing := services_missing("the simulator"):
        return _fail(missing)
    from dataclasses import replace

    from lightpath_services.sim.compare import run_many
    from lightpath_services.sim.engine import DEFAULT_POLICY

    names = _policies(args.policy or DEFAULT_POLICY)
    if len(names) != 1:
        return _fail("--policy takes one policy (compare runs several)")
    jobs, extra = _load_jobs(args)
    config = _config(args)
    results, summaries = run_many(jobs, replace(config), names)
    return _report(args, results, summaries, extra)


def cmd_compare(args: argparse.Namespace) -> int:
    if missing := services_missing("the simulator"):
        return _fail(missing)
    from lightpath_services.sim.compare import run_many

    names = _policies(args.policies)
    jobs, extra = _load_jobs(args)
    config = _config(args)
    progress = None if wants_json(args) else (lambda m: print(m, file=sys.stderr))
    results, summaries = run_many(jobs, config, names, progress)
    return _report(args, results, summaries, extra)


def cmd_generate(args: argparse.Namespace) -> int:
    if missing := services_missing("the simulator"):
        return _fail(missing)
    from lightpath_services.sim.workload import write_trace

    args.trace = None
    jobs, _ = _load_jobs(args)
    write_trace(jobs, args.path)
    print(f"wrote {len(jobs)} jobs to {args.path}")
    return 0
