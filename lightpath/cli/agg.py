"""`lightpath agg topology | start | status | history`: in-network aggregation (AG-1 … AG-14).

Any switch of the tree answers; the default is the local stack's root
switch (or $LIGHTPATH_AGG_ADDR).

Who you are is the CLI's global choice (`--as acme`, LIGHTPATH_IDENTITY,
LIGHTPATH_TLS_*, LIGHTPATH_TOKEN*; the operator by default). A tenant starts
commands only for itself (`--tenant` may be left out, another tenant's name
is refused) and sees only its own commands and history; the operator sees
all. Compute nodes do not use the CLI: they run the SDK
(`lightpath.aggregation.node.ComputeNode`) with their own node certificates.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from google.protobuf import duration_pb2, json_format

from lightpath.cli._common import add_json_flag, print_json, run_rpc, table
from lightpath.client import channel
from lightpath.v1 import agg_switch_pb2 as pb
from lightpath.v1 import agg_switch_pb2_grpc

DTYPES = {
    "int32": pb.AGG_DTYPE_INT32,
    "int64": pb.AGG_DTYPE_INT64,
    "float32": pb.AGG_DTYPE_FLOAT32,
    "float64": pb.AGG_DTYPE_FLOAT64,
    "bool": pb.AGG_DTYPE_BOOL,
}
OPS = {
    "sum": pb.AGG_OP_SUM,
    "min": pb.AGG_OP_MIN,
    "max": pb.AGG_OP_MAX,
    "prod": pb.AGG_OP_PROD,
    "and": pb.AGG_OP_AND,
    "or": pb.AGG_OP_OR,
}
ORDERS = {
    "arrival": pb.ORDER_POLICY_ARRIVAL,
    "preset": pb.ORDER_POLICY_PRESET,
    "exact": pb.ORDER_POLICY_EXACT,
}
TRIGGERS = {"all": pb.TRIGGER_MODE_ALL_OR_THRESHOLD, "incremental": pb.TRIGGER_MODE_INCREMENTAL}
SLOTS = {"wait": pb.SLOT_POLICY_WAIT, "fallback": pb.SLOT_POLICY_FALLBACK}
STRATEGIES = {
    "fixed": pb.TA_STRATEGY_FIXED,
    "random-by-id": pb.TA_STRATEGY_RANDOM_BY_ID,
    "least-load": pb.TA_STRATEGY_LEAST_LOAD,
    "fewest-hops": pb.TA_STRATEGY_FEWEST_HOPS,
    "lowest-link-cost": pb.TA_STRATEGY_LOWEST_LINK_COST,
}


def _csv(raw: str) -> list[str]:
    return [x for x in (s.strip() for s in raw.split(",")) if x]


def _address(args: argparse.Namespace) -> str:
    if args.addr:
        return args.addr
    from lightpath.stack import endpoint

    return endpoint("agg-root", "LIGHTPATH_AGG_ADDR")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--addr", help="host:port of any switch (default: the stack's agg-root)")
    p.add_argument("--tree", default="", help="tree id (default: the switch's own tree)")
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

    start = topics.add_parser("start", help="start an aggregation command (AG-2)")
    _common(start)
    start.add_argument("command_id")
    start.add_argument("--participants", type=_csv, required=True, help="n1,n2,…")
    start.add_argument("--length", type=int, required=True, help="elements per vector")
    start.add_argument("--dtype", choices=DTYPES, default="float32")
    start.add_argument("--op", choices=OPS, default="sum")
    start.add_argument("--order", choices=ORDERS, default="preset")
    start.add_argument("--trigger", choices=TRIGGERS, default="all")
    start.add_argument("--deadline-s", type=float, default=0.0, help="0 = 30 s")
    start.add_argument(
        "--tenant",
        default="",
        help="whose command (default: a tenant credential's own tenant; else `default`)",
    )
    start.add_argument("--slot-policy", choices=SLOTS, default="wait")
    start.add_argument("--wait-for-all", action="store_true", help="timeouts off")
    start.add_argument("--chunk-bytes", type=int, default=0)
    start.add_argument("--ta", default="", help="the timeout aggregation node (strategy fixed)")
    start.add_argument("--ta-strategy", choices=STRATEGIES, default="fixed")
    start.add_argument("--ta-candidates", type=_csv, default=[])
    start.add_argument("--predicted", type=_csv, default=[], help="timeout nodes named up front")
    start.add_argument("--predict-top-k", type=int, default=0)
    start.add_argument("--predict-threshold-s", type=float, default=0.0)
    start.add_argument("--exact-fraction-bits", type=int)
    start.set_defaults(func=cmd_start)

    status = topics.add_parser("status", help="one command in detail, or the latest commands")
    _common(status)
    status.add_argument("command_id", nargs="?")
    status.add_argument("--limit", type=int, default=20)
    status.set_defaults(func=cmd_status)

    history = topics.add_parser(
        "history", help="lateness of each node per finished command, and who it predicts (AG-9)"
    )
    _common(history)
    history.add_argument("--limit", type=int, default=10)
    history.add_argument("--predict-top-k", type=int, default=0)
    history.add_argument("--predict-threshold-s", type=float, default=0.0)
    history.set_defaults(func=cmd_history)


def _stub(address: str):
    ch = channel(address)
    return ch, agg_switch_pb2_grpc.AggSwitchStub(ch)


def _enum(value: int, enum) -> str:
    return enum.Name(value).split("_", 2)[-1].lower()


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

    return run_rpc(go)


def _start_request(args: argparse.Namespace) -> pb.StartCommandRequest:
    req = pb.StartCommandRequest(
        tree_id=args.tree,
        command_id=args.command_id,
        participants=args.participants,
        dtype=DTYPES[args.dtype],
        op=OPS[args.op],
        length=args.length,
        order_policy=ORDERS[args.order],
        trigger=TRIGGERS[args.trigger],
        tenant=args.tenant,
        slot_policy=SLOTS[args.slot_policy],
        wait_for_all=args.wait_for_all,
        chunk_bytes=args.chunk_bytes,
        timeout_aggregator=pb.TimeoutAggregatorSelection(
            strategy=STRATEGIES[args.ta_strategy], node=args.ta, candidates=args.ta_candidates
        ),
        predicted_timeout_nodes=args.predicted,
        predict_stragglers=pb.StragglerPredictionOptions(
            top_k=args.predict_top_k, threshold_s=args.predict_threshold_s
        ),
    )
    if args.deadline_s:
        req.deadline.CopyFrom(
            duration_pb2.Duration(
                nanos=int(args.deadline_s % 1 * 1e9), seconds=int(args.deadline_s)
            )
        )
    if args.exact_fraction_bits is not None:
        req.exact_fraction_bits = args.exact_fraction_bits
    return req


def _print_command(c: pb.AggCommand) -> None:
    print(
        f"command {c.command_id}: {_enum(c.state, pb.AggCommandState)}, tenant {c.tenant}, "
        f"{len(c.participants)} participants, {_enum(c.dtype, pb.AggDType)} "
        f"{_enum(c.op, pb.AggOp)} × {c.length} in {c.chunks} chunks, "
        f"order {_enum(c.order_policy, pb.OrderPolicy)}"
    )
    print(
        f"timeout aggregation node {c.timeout_aggregator} "
        f"({_enum(c.ta_strategy, pb.TaStrategy).replace('_', '-')}); "
        f"predicted late: {', '.join(c.predicted_timeout_nodes) or 'none'}; "
        f"timed out: {', '.join(c.timeout_nodes) or 'none'}"
    )
    if c.failure:
        print(f"failed: {c.failure}; missing: {', '.join(c.missing_nodes) or '?'}")
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


def cmd_start(args: argparse.Namespace) -> int:
    async def go() -> int:
        ch, stub = _stub(_address(args))
        async with ch:
            out = await stub.StartCommand(_start_request(args))
        if args.json:
            print_json(out)
        else:
            _print_command(out)
        return 0

    return run_rpc(go)


def cmd_status(args: argparse.Namespace) -> int:
    async def go() -> int:
        ch, stub = _stub(_address(args))
        async with ch:
            if args.command_id:
                one = await stub.GetCommand(
                    pb.GetCommandRequest(tree_id=args.tree, command_id=args.command_id)
                )
                if args.json:
                    print_json(one)
                else:
                    _print_command(one)
                return 0
            listed = await stub.ListCommands(
                pb.ListCommandsRequest(tree_id=args.tree, page_size=args.limit)
            )
        if args.json:
            print_json(listed)
            return 0
        print(
            table(
                [
                    (
                        c.command_id,
                        _enum(c.state, pb.AggCommandState),
                        c.tenant,
                        len(c.participants),
                        c.timeout_aggregator,
                        ", ".join(c.timeout_nodes) or "-",
                        f"{max((h.max_ms for h in c.slot_holds), default=0):.1f}",
                    )
                    for c in listed.commands
                ],
                [
                    "command",
                    "state",
                    "tenant",
                    "nodes",
                    "timeout agg node",
                    "timed out",
                    "max hold ms",
                ],
            )
        )
        return 0

    return run_rpc(go)


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
            out = json.loads(json_format.MessageToJson(history, preserving_proto_field_name=True))
            if prediction is not None:
                out["prediction"] = json_format.MessageToDict(
                    prediction, preserving_proto_field_name=True
                )
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
