"""`lightpath graph ...`: dataflow graphs folded into few processes (GF-1 … GF-7).

    lightpath graph example fig-2a DIR            # the seed's Fig. 2A graph and its input
    lightpath graph plan DIR/fig-2a.json          # folded sets, here (--broker: the broker's)
    lightpath graph reserve DIR/fig-2a.json g-1 --cores 1 --duration 10m   # a reservation per process
    lightpath graph run DIR/fig-2a.json --report  # run here; per-component metrics to the broker
    lightpath graph run DIR/fig-3a.json --broker --reservation g-1 --wait   # run on the broker
    lightpath graph status RUN                    # a broker run: state, failure, metrics
    lightpath graph cancel RUN                    # stop a broker run
    lightpath graph metrics fig-2a                # the latest run's metrics, from the broker

Credentials and the broker's address as for `lightpath cores`: an application's
token, --token or else $LIGHTPATH_CB_TOKEN, sent over mTLS with your certificate;
else the operator's certificate (`Credentials.default()`), else
$LIGHTPATH_CB_OPERATOR_TOKEN; --addr, else $LIGHTPATH_CORE_BROKER_ADDR, else the
running local stack.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lightpath.cli._common import print_json, table
from lightpath.cli.cores import (
    _client,
    _common,
    add_request_arguments,
    build_request,
    reservation_lines,
)
from lightpath.errors import InvalidArgument
from lightpath.sdk.cores import AsyncCores


def register(sub: argparse._SubParsersAction) -> None:
    graph = sub.add_parser("graph", help="plan, run and monitor folded dataflow graphs")
    verbs = graph.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    plan = verbs.add_parser(
        "plan", help="fold a graph into sets of components that share a process"
    )
    plan.add_argument("spec", type=Path, help="graph spec: lightpath.v1.GraphSpec as JSON")
    plan.add_argument(
        "--unfolded", action="store_true", help="show the one-process-per-component plan instead"
    )
    plan.add_argument("--broker", action="store_true", help="ask the core broker (PlanGraph)")
    _common(plan)
    plan.set_defaults(func=cmd_plan)

    reserve = verbs.add_parser(
        "reserve", help="reserve cores for every process of the plan (all or nothing)"
    )
    reserve.add_argument("spec", type=Path, help="graph spec: lightpath.v1.GraphSpec as JSON")
    reserve.add_argument(
        "reservation_id", help='each process gets "<reservation_id>.<set>.<instance>"'
    )
    add_request_arguments(reserve)
    reserve.add_argument(
        "--allow-partial", action="store_true", help="decide each process on its own"
    )
    reserve.add_argument("--unfolded", action="store_true", help="one process per component")
    _common(reserve)
    reserve.set_defaults(func=cmd_reserve)

    metrics = verbs.add_parser("metrics", help="per-component usage of a run, from the broker")
    metrics.add_argument("graph_id", help="the graph's id (graph_id in its spec)")
    metrics.add_argument("--run", default="", help="run id (default: the latest reported)")
    metrics.add_argument(
        "--component", action="append", default=[], help="only these components (repeatable)"
    )
    _common(metrics)
    metrics.set_defaults(func=cmd_metrics)

    run = verbs.add_parser("run", help="run a graph here, one OS process per folded set instance")
    run.add_argument("spec", type=Path, help="graph spec: lightpath.v1.GraphSpec as JSON")
    run.add_argument(
        "--unfolded", action="store_true", help="one process per component (no folding)"
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
    run.add_argument(
        "--report", action="store_true", help="send the run's metrics to the core broker"
    )
    run.add_argument(
        "--broker",
        action="store_true",
        help="run it on the core broker's host instead (needs --reservation; library "
        "components only, files in the broker's graph data directory)",
    )
    run.add_argument(
        "--reservation",
        default="",
        metavar="ID",
        help="with --broker: the id you gave `lightpath graph reserve` for this graph",
    )
    run.add_argument(
        "--wait", action="store_true", help="with --broker: wait until the run has ended"
    )
    _common(run)
    run.set_defaults(func=cmd_run)

    status = verbs.add_parser("status", help="a run on the core broker: state, failure, metrics")
    status.add_argument("run_id", help="the run's id (`graph run --broker` prints it)")
    status.add_argument("--wait", action="store_true", help="wait until the run has ended")
    _common(status)
    status.set_defaults(func=cmd_status)

    cancel = verbs.add_parser("cancel", help="stop a run on the core broker")
    cancel.add_argument("run_id", help="the run's id")
    _common(cancel)
    cancel.set_defaults(func=cmd_cancel)

    example = verbs.add_parser(
        "example", help="write an example graph and its input data to a directory"
    )
    example.add_argument(
        "name",
        choices=["fig-2a", "fig-3a"],
        help="fig-2a: ten components from one input to three outputs; fig-3a: a partitioned "
        "input through three parallel components",
    )
    example.add_argument("directory", type=Path, help="where the spec, input and output go")
    example.add_argument("--records", type=int, default=10000, help="input records to write")
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
    from lightpath.graph.fold import fold, plan_from_proto, plan_to_proto, unfold

    def show(plan) -> int:
        if args.json:
            print_json(plan_to_proto(plan))
        else:
            print_plan(plan)
        return 0

    try:
        spec = _load(args.spec)
        if not args.broker:
            graph = expand(spec)
            return show(unfold(graph) if args.unfolded else fold(graph))
    except InvalidArgument as err:
        return _refused(err)

    async def body(cores: AsyncCores) -> int:
        return show(plan_from_proto(await cores.plan_graph(spec, unfolded=args.unfolded)))

    return _client(args, body)


def cmd_reserve(args: argparse.Namespace) -> int:

    try:
        spec = _load(args.spec)
    except InvalidArgument as err:
        return _refused(err)

    async def body(cores: AsyncCores) -> int:
        held = await cores.reserve_graph(
            spec,
            args.reservation_id,
            per_process=build_request(args),
            allow_partial=args.allow_partial,
            unfolded=args.unfolded,
        )
        if args.json:
            print_json(held)
            return 0 if held.complete else 1
        for p in held.processes:
            print(f"{p.folded_set}[{p.instance}] ({' '.join(p.members)})")
            print("  " + reservation_lines(p.reservation).replace("\n", "\n  "))
        state = (
            "every process holds its cores" if held.complete else "NOT every process holds cores"
        )
        print(f"\n{held.reservation_id}: {len(held.processes)} processes; {state}")
        return 0 if held.complete else 1

    return _client(args, body)


def print_metrics(m) -> None:
    from lightpath.graph.metrics import COMPONENT_HEADERS, component_rows

    print(table(component_rows(m), COMPONENT_HEADERS))
    rows = [(f.name, f.records, f.bytes, "yes" if f.crosses_processes else "no") for f in m.flows]
    print()
    print(table(rows, ["flow", "records", "bytes", "between processes"]))


def cmd_metrics(args: argparse.Namespace) -> int:
    from lightpath.graph.metrics import from_proto

    async def body(cores: AsyncCores) -> int:
        reply = await cores.graph_metrics(args.graph_id, run_id=args.run, components=args.component)
        if args.json:
            print_json(reply)
            return 0
        m = from_proto(reply)
        print(
            f"graph {m.graph_id}, run {m.run_id} ({'folded' if m.folded else 'one process per component'}): "
            f"{m.records_read} records in {m.wall_seconds:.2f} s by {len(m.processes)} processes"
        )
        print_metrics(m)
        return 0

    hint = (
        f"a run's metrics reach the broker with `lightpath graph run SPEC --report` "
        f"or `lightpath graph run SPEC --broker --reservation ID` "
        f"(SPEC the graph {args.graph_id}'s spec)"
    )
    return _client(args, body, hints={"NOT_FOUND": hint})


RUN_STATES = {1: "running", 2: "succeeded", 3: "failed", 4: "cancelled"}


def print_run(run) -> int:
    """A broker run in words; the exit code it deserves (0: running or succeeded)."""
    from lightpath.graph.metrics import from_proto

    state = RUN_STATES.get(run.state, "unknown")
    print(
        f"run {run.run_id} of graph {run.graph_id} for {run.application_id}: {state} "
        f"({run.plan.processes_after} processes, reservation {run.reservation_id})"
    )
    if run.failure:
        where = f"component {run.failed_component}: " if run.failed_component else ""
        print(f"  {where}{run.failure}")
    if run.HasField("metrics"):
        m = from_proto(run.metrics)
        print(f"  {m.records_read} records in {m.wall_seconds:.2f} s")
        print_metrics(m)
    elif state == "running":
        print(f"  follow it with `lightpath graph status {run.run_id} --wait`")
    return 0 if state in ("running", "succeeded") else 1


def _show_run(args: argparse.Namespace, run) -> int:
    if args.json:
        print_json(run)
        return 0 if run.state in (1, 2) else 1
    return print_run(run)


def _run_on_broker(args: argparse.Namespace) -> int:
    import uuid

    if not args.reservation:
        print(
            "error: --broker needs --reservation ID: reserve the graph's cores first with "
            "`lightpath graph reserve SPEC ID --cores N --duration 10m`",
            file=sys.stderr,
        )
        return 1
    try:
        spec = _load(args.spec)
    except InvalidArgument as err:
        return _refused(err)
    run_id = args.run_id or uuid.uuid4().hex[:12]

    async def body(cores: AsyncCores) -> int:
        run = await cores.run_graph(
            spec,
            run_id,
            args.reservation,
            unfolded=args.unfolded,
            checkpoint_every=args.checkpoint_every,
        )
        if args.wait:
            run = await cores.wait_graph_run(run.run_id)
        return _show_run(args, run)

    return _client(args, body)


def cmd_status(args: argparse.Namespace) -> int:
    async def body(cores: AsyncCores) -> int:
        run = await (cores.wait_graph_run if args.wait else cores.graph_run)(args.run_id)
        return _show_run(args, run)

    hint = "a run on the broker starts with `lightpath graph run SPEC --broker --reservation ID`"
    return _client(args, body, hints={"NOT_FOUND": hint})


def cmd_cancel(args: argparse.Namespace) -> int:
    async def body(cores: AsyncCores) -> int:
        return _show_run(args, await cores.cancel_graph_run(args.run_id))

    return _client(args, body)


def cmd_run(args: argparse.Namespace) -> int:
    from lightpath.graph.metrics import COMPONENT_HEADERS, component_rows, to_proto
    from lightpath.graph.runner import GraphRunError, run_graph

    if args.broker:
        return _run_on_broker(args)
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
    if args.report:
        code = _report(args, m)
        if code:
            return code
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


def _report(args: argparse.Namespace, metrics) -> int:

    async def body(cores: AsyncCores) -> int:
        reply = await cores.report_graph_metrics(metrics)
        print(
            f"reported run {reply.run_id} of {reply.graph_id} to the core broker "
            f"({reply.runs} runs kept)",
            file=sys.stderr,
        )
        return 0

    return _client(args, body)


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
