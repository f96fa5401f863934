"""`lightpath agg topology | start | status | abort | history`: in-network aggregation (AG-1 … AG-14).

Any switch of the tree answers; the default is the local stack's root
switch (or $LIGHTPATH_AGG_ADDR).

Who you are is the CLI's global choice (`--as acme`, LIGHTPATH_IDENTITY,
LIGHTPATH_TLS_*, LIGHTPATH_TOKEN*; the operator by default). A tenant starts
commands only for itself (`--tenant` may be left out, another tenant's name
is refused) and sees only its own commands and history; the operator sees
all.

Compute nodes act as themselves, each with its own node certificate: in a program,
`lightpath.aggregation.node.ComputeNode` (examples/agg_compute_nodes.py); on the local
stack, `lightpath agg contribute COMMAND` runs the command's compute nodes in this
process, each with a certificate the stack's CA issues it, to try a tree on day one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from google.protobuf import json_format

from lightpath.cli._common import (
    add_json_flag,
    add_list_output,
    print_json,
    print_list,
    run_rpc,
    short_name,
    table,
    to_jsonable,
)
from lightpath.client import channel
from lightpath.sdk.aggregation import (
    DTYPES,
    OPS,
    ORDERS,
    SLOTS,
    STRATEGIES,
    TRIGGERS,
    AsyncAggregation,
    command_request,
)
from lightpath.v1 import agg_switch_pb2 as pb
from lightpath.v1 import agg_switch_pb2_grpc


def _csv(raw: str) -> list[str]:
    return [x for x in (s.strip() for s in raw.split(",")) if x]


def _late(raw: str) -> dict[str, float]:
    out = {}
    for item in _csv(raw):
        node, _, seconds = item.partition("=")
        try:
            out[node] = float(seconds)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r}: give NODE=SECONDS, e.g. n3=0.8") from None
    return out


def _address(args: argparse.Namespace) -> str:
    if args.addr:
        return args.addr
    from lightpath.stack import endpoint

    return endpoint("agg-root", "LIGHTPATH_AGG_ADDR")


def _common(p: argparse.ArgumentParser, *, json: bool = True) -> None:
    p.add_argument("--addr", help="host:port of any switch (default: the stack's agg-root)")
    p.add_argument("--tree", default="", help="tree id (default: the switch's own tree)")
    if json:
        add_json_flag(p)


def register(sub: argparse._SubParsersAction) -> None:
    agg = sub.add_parser("agg", help="in-network aggregation: topology, commands, history")
    topics = agg.add_subparsers(dest="agg_command", metavar="TOPIC")
    topics.required = True

    topo = topics.add_parser("topology", help="show the tree, or define it from a JSON file")
    _common(topo)
    topo.add_argument(
        "--define",
        type=Path,
        metavar="FILE",
        help='AggTopology as JSON: {"nodes": [{"id": "root", "kind": "AGG_NODE_KIND_SWITCH", '
        '"threshold_ms": 100}, ...]}',
    )
    topo.set_defaults(func=cmd_topology)

    start = topics.add_parser("start", help="start an aggregation command")
    _common(start)
    start.add_argument("command_id", help="your id for the command (submitting it again is safe)")
    start.add_argument("--participants", type=_csv, required=True, help="n1,n2,…")
    start.add_argument("--length", type=int, required=True, help="elements per vector")
    start.add_argument("--dtype", choices=DTYPES, default="float32", help="element type")
    start.add_argument(
        "--op", choices=OPS, default="sum", help="how elements combine (and, or: bool only)"
    )
    start.add_argument(
        "--order",
        choices=ORDERS,
        default="preset",
        help="float sum/product order: arrival (fastest), preset (same bits for the same "
        "late nodes), exact (same bits always, fixed point)",
    )
    start.add_argument(
        "--trigger",
        choices=TRIGGERS,
        default="all",
        help="when a switch combines: all (every child, or its threshold passed) or on "
        "every arrival",
    )
    start.add_argument("--deadline-s", type=float, default=0.0, help="0 = 30 s")
    start.add_argument(
        "--tenant",
        default="",
        help="whose command (default: a tenant credential's own tenant; else `default`)",
    )
    start.add_argument(
        "--slot-policy",
        choices=SLOTS,
        default="wait",
        help="with no free aggregation slot: wait for one, or fall back (the chunk bypasses "
        "the switch)",
    )
    start.add_argument("--wait-for-all", action="store_true", help="timeouts off")
    start.add_argument(
        "--chunk-bytes",
        type=int,
        default=0,
        help="bytes per chunk, a multiple of the element size (0: the switch default)",
    )
    start.add_argument("--ta", default="", help="the timeout aggregation node (strategy fixed)")
    start.add_argument(
        "--ta-strategy",
        choices=STRATEGIES,
        default="fixed",
        help="how the timeout aggregation node is chosen among --ta-candidates",
    )
    start.add_argument(
        "--ta-candidates", type=_csv, default=[], help="nodes --ta-strategy chooses from: n1,n2,…"
    )
    start.add_argument(
        "--combine-at-switch",
        action="store_true",
        help="when a compute node is chosen to combine the late data, its switch does it "
        "instead (for nodes whose client cannot)",
    )
    start.add_argument("--predicted", type=_csv, default=[], help="timeout nodes named up front")
    start.add_argument(
        "--predict-top-k",
        type=int,
        default=0,
        help="predict the k latest nodes of recent commands as stragglers",
    )
    start.add_argument(
        "--predict-threshold-s",
        type=float,
        default=0.0,
        help="predict every node later than this many seconds as a straggler",
    )
    start.add_argument(
        "--exact-fraction-bits",
        type=int,
        help="with --order exact: fraction bits of the fixed point (default 32)",
    )
    start.set_defaults(func=cmd_start)

    contribute = topics.add_parser(
        "contribute",
        help="be the command's compute nodes here (local stack): each contributes a vector "
        "and gets the result",
        description="Runs compute nodes of a started command in this process, each acting as "
        "itself with a node certificate the local stack's CA issues it (a node elsewhere "
        "runs lightpath.aggregation.node.ComputeNode with its own). Every node contributes "
        "a vector of --value; with the sum, each element of the result is the sum of the "
        "values of the nodes that took part.",
    )
    _common(contribute)
    contribute.add_argument("command_id", help="a started command (`lightpath agg start`)")
    contribute.add_argument(
        "--nodes", type=_csv, default=[], help="n1,n2,… (default: every participant)"
    )
    contribute.add_argument(
        "--value", type=float, default=1.0, help="every element of each node's vector"
    )
    contribute.add_argument(
        "--late",
        type=_late,
        default={},
        metavar="NODE=SECONDS,…",
        help="nodes that send late, to watch a switch time them out (n3=0.8)",
    )
    contribute.set_defaults(func=cmd_contribute)

    status = topics.add_parser("status", help="one command in detail, or the latest commands")
    _common(status, json=False)
    add_list_output(status)
    status.add_argument(
        "command_id", nargs="?", help="the command (default: list the latest commands)"
    )
    status.add_argument("--limit", type=int, default=20, help="how many latest commands (one page)")
    status.add_argument("--all", action="store_true", help="every command, page after page")
    status.add_argument("--page-token", default="", help="the next page, from a previous listing")
    status.set_defaults(func=cmd_status)

    abort = topics.add_parser(
        "abort", help="stop a running command now: every waiting node is told why"
    )
    _common(abort)
    abort.add_argument("command_id", help="the running command")
    abort.add_argument(
        "--reason", required=True, help="why, in your words (every waiting node sees it)"
    )
    abort.set_defaults(func=cmd_abort)

    history = topics.add_parser(
        "history", help="lateness of each node per finished command, and who it predicts"
    )
    _common(history)
    history.add_argument("--limit", type=int, default=10, help="how many latest commands")
    history.add_argument(
        "--predict-top-k", type=int, default=0, help="show the k latest nodes it would predict"
    )
    history.add_argument(
        "--predict-threshold-s",
        type=float,
        default=0.0,
        help="show the nodes later than this many seconds it would predict",
    )
    history.set_defaults(func=cmd_history)


def _stub(address: str):
    ch = channel(address)
    return ch, agg_switch_pb2_grpc.AggSwitchStub(ch)


def _enum(value: int, enum) -> str:
    return short_name(enum, value)


def cmd_topology(args: argparse.Namespace) -> int:
    async def go() -> int:
        ch, stub = _stub(_address(args))
        async with ch:
            if args.define:
                try:
                    topo = json_format.Parse(args.define.read_text(), pb.AggTopology())
                except (OSError, json_format.ParseError) as exc:
                    print(f"error: {args.define}: {exc}", file=sys.stderr)
                    return 1
                if args.tree:
                    topo.tree_id = args.tree
                out = await stub.DefineTopology(pb.DefineTopologyRequest(topology=topo))
            else:
                out = await stub.GetTopology(pb.GetTopologyRequest(tree_id=args.tree))
        if args.json:
            print_json(out)
            return 0
        print(
            f"tree {out.tree_id} (version {out.version}), timeout aggregation node "
            f"{out.timeout_aggregator or 'the root'}"
        )
        print(
            table(
                [
                    (
                        n.id,
                        _enum(n.kind, pb.AggNodeKind),
                        n.parent or "-",
                        n.threshold_ms or "",
                        out.endpoints.get(n.id, ""),
                    )
                    for n in out.nodes
                ],
                ["node", "kind", "parent", "threshold ms", "endpoint"],
            )
        )
        return 0

    hint = (
        "a fresh tree has no topology yet: define one with `lightpath agg topology "
        "--define FILE` (an AggTopology as JSON: `lightpath agg topology -o json` on a "
        "local stack prints the tree `lightpath up` defines, to copy)"
    )
    return run_rpc(go, hints={"NOT_FOUND": hint})


def _start_request(args: argparse.Namespace) -> pb.StartCommandRequest:
    return command_request(
        args.command_id,
        args.participants,
        args.length,
        tree=args.tree,
        dtype=args.dtype,
        op=args.op,
        order=args.order,
        trigger=args.trigger,
        deadline=args.deadline_s,
        tenant=args.tenant,
        slot_policy=args.slot_policy,
        wait_for_all=args.wait_for_all,
        chunk_bytes=args.chunk_bytes,
        timeout_aggregator=args.ta,
        ta_strategy=args.ta_strategy,
        ta_candidates=args.ta_candidates,
        combine_at_switch=args.combine_at_switch,
        predicted=args.predicted,
        predict_top_k=args.predict_top_k,
        predict_threshold_s=args.predict_threshold_s,
        exact_fraction_bits=args.exact_fraction_bits,
    )


def _print_command(c: pb.AggCommand) -> None:
    print(
        f"command {c.command_id}: {_enum(c.state, pb.AggCommandState)}, tenant {c.tenant}, "
        f"{len(c.participants)} participants, {_enum(c.dtype, pb.AggDType)} "
        f"{_enum(c.op, pb.AggOp)} × {c.length} in {c.chunks} chunks, "
        f"order {_enum(c.order_policy, pb.OrderPolicy)}"
    )
    combined = f", combining for {c.combined_for}" if c.combined_for else ""
    print(
        f"timeout aggregation node {c.timeout_aggregator}{combined} "
        f"({_enum(c.ta_strategy, pb.TaStrategy)}); "
        f"predicted late: {', '.join(c.predicted_timeout_nodes) or 'none'}; "
        f"timed out: {', '.join(c.timeout_nodes) or 'none'}"
    )
    if c.failure:
        how = f" ({c.failure_reason.lower().replace('_', ' ')})" if c.failure_reason else ""
        print(f"failed{how}: {c.failure}; missing: {', '.join(c.missing_nodes) or '?'}")
    cleared = [
        f"{b.switch_id}:{k}"
        for b in c.bitmaps
        for k, on in zip(b.children, b.participates, strict=True)
        if not on
    ]
    if cleared:
        print("participation bits cleared: " + ", ".join(cleared))
    if c.slot_holds:
        print(
            table(
                [
                    (
                        h.switch_id,
                        h.chunks,
                        f"{h.max_ms:.1f}",
                        f"{h.mean_ms:.1f}",
                        h.timed_out_chunks,
                        h.fallback_chunks,
                        ", ".join(h.timeout_nodes) or "-",
                        h.bypass_entries_created,
                    )
                    for h in c.slot_holds
                ],
                [
                    "switch",
                    "slots",
                    "max ms",
                    "mean ms",
                    "timed out",
                    "fallback",
                    "timeout nodes",
                    "bypass entries",
                ],
            )
        )


def _with_client(args: argparse.Namespace, body) -> int:
    async def go() -> int:
        async with AsyncAggregation(args.addr or None) as agg:
            return int(await body(agg) or 0)

    return run_rpc(go)


def cmd_start(args: argparse.Namespace) -> int:
    request = _start_request(args)

    async def body(agg: AsyncAggregation) -> int:
        out = await agg.start(args.command_id, request=request)
        if args.json:
            print_json(out)
        else:
            _print_command(out)
            _next_after_start(out)
        return 0

    return _with_client(args, body)


def _next_after_start(c: pb.AggCommand) -> None:
    deadline = c.deadline.seconds - c.created_at.seconds if c.deadline.seconds else 0
    print(
        f"next: its {len(c.participants)} compute nodes contribute "
        + (f"within {deadline} s " if deadline > 0 else "")
        + f"(`lightpath agg contribute {c.command_id}` runs them here on the local stack); "
        f"`lightpath agg status {c.command_id}` follows it",
        file=sys.stderr,
    )


def cmd_contribute(args: argparse.Namespace) -> int:
    import numpy as np

    from lightpath.aggregation import wire
    from lightpath.aggregation.node import aggregate_all, local_node_credentials
    from lightpath.security.credentials import CredentialsError

    async def body(agg: AsyncAggregation) -> int:
        cmd = await agg.get(args.command_id, tree=args.tree)
        nodes = args.nodes or list(cmd.participants)
        strangers = [n for n in nodes if n not in cmd.participants]
        if strangers:
            print(
                f"error: --nodes: {', '.join(strangers)} not among the command's participants "
                f"({', '.join(cmd.participants)})",
                file=sys.stderr,
            )
            return 2
        try:
            creds = await local_node_credentials(nodes)
        except CredentialsError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        dtype = wire.PB_TO_DTYPE[cmd.dtype].numpy
        inputs = {n: np.full(cmd.length, args.value, dtype=dtype) for n in nodes}
        out = await aggregate_all(
            args.addr or _address(args),
            args.command_id,
            inputs,
            delays=args.late,
            credentials=creds.get,
        )
        final = await agg.get(args.command_id, tree=args.tree)
        if args.json:
            print_json(
                {
                    "command": to_jsonable(final),
                    "results": [
                        {
                            "node_id": r.node_id,
                            "seconds": round(r.seconds, 4),
                            "first_values": r.values[:4].tolist(),
                            "shared_memory": r.shared_memory,
                            "timeout_aggregator": r.timeout_aggregator,
                            "predicted_timeout": r.predicted_timeout,
                        }
                        for r in out.values()
                    ],
                }
            )
            return 0
        rows = [
            (
                r.node_id,
                f"{r.seconds:.2f}",
                " ".join(f"{v:g}" for v in r.values[:4].tolist()),
                "shared memory" if r.shared_memory else "gRPC",
                "yes" if r.timeout_aggregator else "",
            )
            for r in out.values()
        ]
        print(table(rows, ["node", "seconds", "result (first elements)", "chunks by", "combined"]))
        _print_command(final)
        return 0

    return _with_client(args, body)


def cmd_abort(args: argparse.Namespace) -> int:
    async def body(agg: AsyncAggregation) -> int:
        out = await agg.abort(args.command_id, args.reason, tree=args.tree)
        if args.json:
            print_json(out)
        else:
            _print_command(out)
        return 0

    return _with_client(args, body)


def cmd_status(args: argparse.Namespace) -> int:
    async def body(agg: AsyncAggregation) -> int:
        if args.command_id:
            one = await agg.get(args.command_id, tree=args.tree)
            if args.json or args.output in ("json", "yaml"):
                print_json(one)
            else:
                _print_command(one)
            return 0
        if args.all:
            listed = [
                c async for c in agg.list_commands(tree=args.tree, page_token=args.page_token)
            ]
            token = ""
        else:
            page = await agg.list_commands_page(
                tree=args.tree, page_size=args.limit, page_token=args.page_token
            )
            listed, token = list(page.commands), page.next_page_token

        def columns(wide: bool) -> tuple[list[str], list]:
            rows = [
                (
                    c.command_id,
                    _enum(c.state, pb.AggCommandState),
                    c.tenant,
                    len(c.participants),
                    c.timeout_aggregator,
                    ", ".join(c.timeout_nodes) or "-",
                    f"{max((h.max_ms for h in c.slot_holds), default=0):.1f}",
                )
                for c in listed
            ]
            headers = [
                "command",
                "state",
                "tenant",
                "nodes",
                "timeout agg node",
                "timed out",
                "max hold ms",
            ]
            return headers, rows

        print_list(args, "commands", listed, columns, lambda c: c.command_id, next_page_token=token)
        return 0

    return _with_client(args, body)


def cmd_history(args: argparse.Namespace) -> int:
    async def go() -> int:
        ch, stub = _stub(_address(args))
        async with ch:
            history = await stub.GetHistory(
                pb.GetHistoryRequest(tree_id=args.tree, limit=args.limit)
            )
            prediction = None
            if args.predict_top_k or args.predict_threshold_s:
                prediction = await stub.PredictStragglers(
                    pb.PredictStragglersRequest(
                        tree_id=args.tree,
                        options=pb.StragglerPredictionOptions(
                            top_k=args.predict_top_k,
                            threshold_s=args.predict_threshold_s,
                            history_window=args.limit,
                        ),
                    )
                )
        if args.json:
            out = to_jsonable(history)
            if prediction is not None:
                out["prediction"] = to_jsonable(prediction)
            print_json(out)
            return 0
        rows = [
            (e.command_id, x.node, x.switch_id, f"{x.lateness_s:.3f}")
            for e in history.entries
            for x in e.lateness
        ]
        print(table(rows, ["command", "node", "switch", "late s"]))
        if prediction is not None:
            print("predicted timeout nodes: " + (", ".join(prediction.nodes) or "none"))
        return 0

    return run_rpc(go)
