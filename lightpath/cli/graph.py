"""`lightpath graph plan | run | example`: dataflow graphs folded into few processes (GF-1 … GF-7)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lightpath.cli._common import add_json_flag, print_json, table
from lightpath.errors import InvalidArgument


def register(sub: argparse._SubParsersAction) -> None:
    graph = sub.add_parser("graph", help="plan, run and monitor folded dataflow graphs")
    verbs = graph.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    plan = verbs.add_parser(
        "plan", help="fold a graph into sets of components that share a process (process 400)"
    )
    plan.add_argument("spec", type=Path, help="graph spec: lightpath.v1.GraphSpec as JSON")
    plan.add_argument(
        "--unfolded", action="store_true", help="show the one-process-per-component plan instead"
    )
    add_json_flag(plan)
    plan.set_defaults(func=cmd_plan)

    run = verbs.add_parser("run", help="run a graph here, one OS process per folded set instance")
    run.add_argument("spec", type=Path, help="graph spec: lightpath.v1.GraphSpec as JSON")
    run.add_argument(
        "--unfolded", action="store_true", help="one process per component (the seed's baseline)"
    )
    run.add_argument(
        "--run-dir",
        type=Path,
        help="checkpoints, spill files, logs (default .lightpath/graph-runs/RUN)",
    )
    run.add_argument("--run-id", default="", help="id of this run (default: random)")
    run.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="N",
        help="a checkpoint blip every N records read from each input (0: none)",
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="restart from the last complete checkpoint in --run-dir",
    )
    add_json_flag(run)
    run.set_defaults(func=cmd_run)

    example = verbs.add_parser(
        "example", help="write one of the seed's example graphs and its input data to a directory"
    )
    example.add_argument("name", choices=["fig-2a", "fig-3a"])
    example.add_argument("directory", type=Path)
    example.add_argument("--records", type=int, default=10000)
    example.add_argument("--degree", type=int, default=4, help="fig-3a: ways of parallelism")
    example.set_defaults(func=cmd_example)


def _load(path: Path):
    from lightpath.graph.spec import load_spec

    if not path.is_file():
        raise InvalidArgument(str(path), "no such file")
    return load_spec(path)


def _refused(err: InvalidArgument) -> int:
    print(f"error: {err.message}", file=sys.stderr)
    return 1


def plan_rows(plan) -> list[tuple]:
    return [
        (
            s.id,
            " ".join(s.members),
            " ".join(s.roots),
            s.degree,
            s.phase,
            "yes" if s.foldable else "no",
            s.processes,
        )
        for s in plan.folded_sets
    ]


PLAN_HEADERS = ("set", "members", "roots", "degree", "phase", "foldable", "processes")


def print_plan(plan) -> None:
    print(table(plan_rows(plan), PLAN_HEADERS))
    print(f"\nprocesses: {plan.processes_before} one per component, {plan.processes_after} folded")


def cmd_plan(args: argparse.Namespace) -> int:
    from lightpath.graph.expand import expand
    from lightpath.graph.fold import fold, plan_to_proto, unfold

    try:
        graph = expand(_load(args.spec))
        plan = unfold(graph) if args.unfolded else fold(graph)
    except InvalidArgument as err:
        return _refused(err)
    if args.json:
        print_json(plan_to_proto(plan))
    else:
        print_plan(plan)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from lightpath.graph.metrics import COMPONENT_HEADERS, component_rows, to_proto
    from lightpath.graph.runner import GraphRunError, run_graph

    try:
        result = run_graph(
            _load(args.spec),
            folded=not args.unfolded,
            run_dir=args.run_dir,
            run_id=args.run_id,
            checkpoint_every=args.checkpoint_every,
            resume=args.resume,
        )
    except InvalidArgument as err:
        return _refused(err)
    except GraphRunError as err:
        print(f"error: {err}", file=sys.stderr)
        if err.process:
            print(f"  in process {err.process}; its log:\n{err.log}", file=sys.stderr)
        return 1
    m = result.metrics
    if args.json:
        print_json(to_proto(m))
        return 0
    print(table(component_rows(m), COMPONENT_HEADERS))
    print(
        f"\n{m.records_read} records read in {m.wall_seconds:.2f} s "
        f"({m.records_read / m.wall_seconds if m.wall_seconds else 0:.0f}/s) by "
        f"{len(m.processes)} processes ({'folded' if m.folded else 'one per component'}); "
        f"start-up {m.startup_seconds:.2f} s, peak memory {m.peak_rss_mb:.0f} MB; "
        f"run {m.run_id} in {result.run_dir}"
    )
    return 0


def cmd_example(args: argparse.Namespace) -> int:
    from lightpath.graph.examples import fig2a, fig3a, write_records
    from lightpath.graph.spec import dump_spec

    d = args.directory.resolve()
    d.mkdir(parents=True, exist_ok=True)
    if args.name == "fig-2a":
        write_records(d / "202.tsv", args.records)
        spec = fig2a(d / "202.tsv", d / "out")
    else:
        for part in range(args.degree):
            write_records(d / f"302.{part}.tsv", args.records // args.degree, seed=part)
        spec = fig3a(str(d / "302.{part}.tsv"), str(d / "out" / "306.{part}.tsv"), args.degree)
    path = d / f"{args.name}.json"
    path.write_text(dump_spec(spec))
    print(path)
    return 0
