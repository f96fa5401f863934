"""`lightpath ocs ...`: a pod's optical fabric (OCS-7): fabric, switches, tables, slices,
1xK switches, invariants. Every read has --json."""

from __future__ import annotations

import argparse
import sys

from lightpath.cli._common import (
    add_json_flag,
    add_list_output,
    print_json,
    print_list,
    run_rpc,
    short_name,
    table,
)
from lightpath.client import channel
from lightpath.stack import endpoint
from lightpath.v1 import common_pb2, ocs_manager_pb2_grpc
from lightpath.v1 import ocs_manager_pb2 as pb


def _shape(dims) -> str:
    return "x".join(map(str, dims))


def register(sub: argparse._SubParsersAction) -> None:
    ocs = sub.add_parser("ocs", help="a pod's optical fabric: OCS, 1xK switches, slices' wiring")
    cmds = ocs.add_subparsers(dest="ocs_command", metavar="COMMAND")
    cmds.required = True

    def command(
        name: str, help: str, func, json: bool = True, listing: bool = False
    ) -> argparse.ArgumentParser:
        p = cmds.add_parser(name, help=help)
        p.add_argument("--pod", default="pod-1", help="superpod (default pod-1)")
        p.add_argument("--addr", help="host:port of its ocs_manager (default: from the stack)")
        if listing:
            add_list_output(p)
        elif json:
            add_json_flag(p)
        p.set_defaults(func=lambda args: run_rpc(lambda: func(args)))
        return p

    command("fabric", "the fabric: block shape, K, ports per OCS, counts", cmd_fabric)
    p = command("plan", "what a configuration would give (refused if impossible)", cmd_plan)
    p.add_argument("--shape", default="4x4x4", help="block shape, e.g. 4x4x4")
    p.add_argument("--blocks", type=int, default=64, help="number of blocks")
    p.add_argument("--k", type=int, default=1, help="OCS per logical axis")
    p.add_argument("--radix", type=int, default=136, help="ports per OCS")
    command("switches", "every OCS with its port use and table version", cmd_switches, listing=True)
    p = command("table", "one OCS's routing table", cmd_table)
    p.add_argument("ocs_id", help="e.g. ocs-x-5-0")
    command("slices", "the wired slices", cmd_slices, listing=True)
    p = command("slice", "one slice's placement and wiring", cmd_slice)
    p.add_argument("job_id", help="the slice's job id")
    p.add_argument(
        "--cross-connects", action="store_true", help="list every cross-connect and 1xK setting"
    )
    p = command("otm", "1xK switch states (set ones; --all for idle too)", cmd_otm)
    p.add_argument("--block", type=int, help="only this block's switches")
    p.add_argument("--job", help="only the switches of this job's slice")
    p.add_argument("--all", action="store_true", help="idle switches too")
    p = command("check", "check the wiring invariants (exit 1 on a violation)", cmd_check)
    p.add_argument(
        "--compare-switches", action="store_true", help="also compare the switches' own state"
    )


def _stub(args: argparse.Namespace):
    addr = args.addr or endpoint(f"ocs-{args.pod}", "LIGHTPATH_OCS_ADDR")
    ch = channel(addr)
    return ch, ocs_manager_pb2_grpc.OcsManagerStub(ch)


async def _all_pages(call, request_type, field: str) -> list:
    """Every item of a paged List call."""
    items: list = []
    token = ""
    while True:
        page = await call(request_type(page_size=1000, page_token=token))
        items += getattr(page, field)
        token = page.next_page_token
        if not token:
            return items


def _print_fabric(f: pb.Fabric) -> None:
    c = f.config
    print(
        f"pod {f.pod_id or '(plan)'}: {c.block_count} blocks of {_shape(c.block_shape.dims)}, "
        f"K={c.ocs_per_axis} OCS per logical axis, radix {c.ocs_radix}"
    )
    print(
        f"  {f.ocs_count} OCS ({', '.join(f'{n}: {a} axes' for n, a in zip(f.dim_names, f.axes_by_dim, strict=True))}), "
        f"{f.max_ports_used_per_ocs} ports used on the busiest, "
        f"{f.one_to_many_count} 1x{c.ocs_per_axis} switches"
    )


async def cmd_fabric(args: argparse.Namespace) -> int:
    ch, stub = _stub(args)
    async with ch:
        f = await stub.GetFabric(pb.GetFabricRequest())
    if args.json:
        print_json(f)
    else:
        _print_fabric(f)
    return 0


async def cmd_plan(args: argparse.Namespace) -> int:
    dims = [int(x) for x in args.shape.lower().split("x") if x]
    config = pb.FabricConfig(
        block_shape=common_pb2.Shape(dims=dims),
        block_count=args.blocks,
        ocs_per_axis=args.k,
        ocs_radix=args.radix,
    )
    ch, stub = _stub(args)
    async with ch:
        f = await stub.PlanFabric(pb.PlanFabricRequest(config=config))
    if args.json:
        print_json(f)
    else:
        _print_fabric(f)
    return 0


async def cmd_switches(args: argparse.Namespace) -> int:
    ch, stub = _stub(args)
    async with ch:
        switches = await _all_pages(stub.ListSwitches, pb.ListSwitchesRequest, "switches")

    def columns(wide: bool) -> tuple[list[str], list]:
        rows = [
            (s.ocs_id, s.k, f"{s.ports_in_use}/{s.ports_cabled}/{s.radix}", s.version)
            for s in switches
        ]
        return ["ocs", "k", "ports in use/cabled/radix", "version"], rows

    print_list(args, "switches", switches, columns, lambda s: s.ocs_id)
    return 0


async def cmd_table(args: argparse.Namespace) -> int:
    ch, stub = _stub(args)
    async with ch:
        t = await stub.GetRoutingTable(pb.GetRoutingTableRequest(ocs_id=args.ocs_id))
    if args.json:
        print_json(t)
        return 0
    print(f"{t.ocs_id}: dimension {t.dim}, logical axis {t.axis}, k {t.k}, version {t.version}")
    rows = [
        (
            c.port_a,
            c.port_b,
            f"block {c.a.block_id} second end",
            f"block {c.b.block_id} first end",
            c.job_id,
        )
        for c in t.cross_connects
    ]
    print(table(rows, ["port", "port", "a", "b", "slice"]) if rows else "  no cross-connects")
    return 0


async def cmd_slices(args: argparse.Namespace) -> int:
    ch, stub = _stub(args)
    async with ch:
        slices = await _all_pages(stub.ListSlices, pb.ListSlicesRequest, "slices")

    def columns(wide: bool) -> tuple[list[str], list]:
        rows = [
            (s.job_id, _shape(s.grid.dims), " ".join(map(str, s.block_ids)), s.cross_connects)
            for s in slices
        ]
        return ["slice", "grid", "blocks", "cross-connects"], rows

    print_list(args, "slices", slices, columns, lambda s: s.job_id)
    return 0


async def cmd_slice(args: argparse.Namespace) -> int:
    view = pb.WIRING_VIEW_FULL if (args.cross_connects or args.json) else pb.WIRING_VIEW_COUNTS
    ch, stub = _stub(args)
    async with ch:
        w = await stub.GetSliceWiring(pb.GetSliceWiringRequest(job_id=args.job_id, view=view))
    if args.json:
        print_json(w)
        return 0
    wrap = "".join("w" if x else "-" for x in w.wrap)
    print(
        f"slice {w.job_id}: grid {_shape(w.grid.dims)} (wrap {wrap}), "
        f"{short_name(pb.SliceState, w.state)}, "
        f"{w.cross_connect_count} cross-connects, {w.one_to_many_count} 1xK settings"
    )
    print(
        table(
            [(tuple(b.position.coords), b.block_id) for b in w.blocks],
            ["position", "block"],
        )
    )
    if args.cross_connects:
        print(
            table(
                [
                    (c.ocs_id, c.port_a, c.port_b, c.a.block_id, c.b.block_id)
                    for c in w.cross_connects
                ],
                ["ocs", "port a", "port b", "from block", "to block"],
            )
        )
        if w.one_to_many:
            print(
                table(
                    [(s.switch_id, s.output, s.ocs_id) for s in w.one_to_many],
                    ["1xK switch", "output", "reaches"],
                )
            )
    return 0


async def cmd_otm(args: argparse.Namespace) -> int:
    req = pb.GetOneToManyStatesRequest(job_id=args.job or "")
    if args.block is not None:
        req.block_id = args.block
    ch, stub = _stub(args)
    async with ch:
        states = (await stub.GetOneToManyStates(req)).states
    shown = [s for s in states if args.all or s.selected_output >= 0]
    if args.json:
        print_json({"states": shown})
        return 0
    if not states:
        print("no 1xK switches (K = 1), or none matched")
        return 0
    rows = [
        (
            s.switch_id,
            "idle" if s.selected_output < 0 else s.selected_output,
            s.outputs[s.selected_output].ocs_id if s.selected_output >= 0 else "",
            s.job_id,
        )
        for s in shown
    ]
    print(table(rows, ["1xK switch", "output", "reaches", "slice"]) if rows else "all idle")
    return 0


async def cmd_check(args: argparse.Namespace) -> int:
    ch, stub = _stub(args)
    async with ch:
        r = await stub.CheckInvariants(
            pb.CheckInvariantsRequest(compare_switches=args.compare_switches)
        )
    if args.json:
        print_json(r)
    elif r.ok:
        print(
            f"ok: {r.slices_checked} slices, {r.cross_connects_checked} cross-connects, "
            "every wiring invariant holds (no port in two cross-connects, slices apart, 1xK "
            "settings agree, tables match the slices)"
        )
    else:
        print(f"{len(r.violations)} violations:", file=sys.stderr)
        for v in r.violations:
            print(f"  {v.rule}: {v.detail}", file=sys.stderr)
    return 0 if r.ok else 1
