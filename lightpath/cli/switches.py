"""`lightpath switches ...`: the optical switches of a pod as its switch agent serves them
(the southbound, docs/ocs_southbound.md): what each switch is and holds, its ports and
counters, and the operator's fault drills on Lightpath's reference agent (inject a
fault, restart a switch with empty tables). Every read has --json.

The agent runs when the stack does with switch agents (`lightpath up --switch-agents`,
compose and Kubernetes); its switch ids are the ocs_manager's (`lightpath ocs
switches`: ocs-x-5-0 ...; the 1xK banks are otm-<block>).
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message

from lightpath.cli._common import (
    CliError,
    add_json_flag,
    add_list_output,
    parse_seconds,
    print_json,
    print_list,
    run_rpc,
    table,
)
from lightpath.client import channel
from lightpath.stack import located
from lightpath.v1 import optical_switch_pb2 as sb
from lightpath.v1 import optical_switch_pb2_grpc

ADDR_ENV = "LIGHTPATH_SWITCH_AGENT_ADDR"
_KINDS = {sb.SWITCH_KIND_OCS: "OCS", sb.SWITCH_KIND_ONE_TO_K: "1xK"}
_PORT_STATES = {
    sb.PORT_STATE_DARK: "dark",
    sb.PORT_STATE_CONNECTED: "connected",
    sb.PORT_STATE_SETTLING: "settling",
    sb.PORT_STATE_FAULT: "fault",
}


def register(sub: argparse._SubParsersAction) -> None:
    top = sub.add_parser(
        "switches",
        help="a pod's optical switches through its switch agent: state, ports, counters, "
        "fault drills",
    )
    cmds = top.add_subparsers(dest="switches_command", metavar="COMMAND")
    cmds.required = True

    def command(name: str, help: str, func, listing: bool = False) -> argparse.ArgumentParser:
        p = cmds.add_parser(name, help=help)
        p.add_argument("--pod", default="pod-1", help="superpod (default pod-1)")
        p.add_argument(
            "--addr", help=f"host:port of its switch agent (default: ${ADDR_ENV}, the stack)"
        )
        if listing:
            add_list_output(p)
        else:
            add_json_flag(p)
        p.set_defaults(func=lambda args: run_rpc(lambda: func(args)))
        return p

    p = command(
        "describe", "what a switch is: kind, ports, boot id, version, settling", cmd_describe
    )
    p.add_argument("switch_id", help="e.g. ocs-x-5-0 or otm-3")
    p = command(
        "cross-connects",
        "a switch's cross-connects (OCS) or selected outputs (1xK bank)",
        cmd_cross_connects,
        listing=True,
    )
    p.add_argument("switch_id", help="e.g. ocs-x-5-0 or otm-3")
    p = command("ports", "every port's state: dark, connected, settling, fault", cmd_ports, True)
    p.add_argument("switch_id", help="e.g. ocs-x-5-0 or otm-3")
    p.add_argument("--all", action="store_true", help="dark ports too")
    p = command("stats", "batch counters of one switch, or summed over the agent's", cmd_stats)
    p.add_argument("switch_id", nargs="?", default="", help="one switch (default: all)")
    p = command(
        "fault",
        "set (replace) the faults of a switch, or of every one with '*' (a drill: the "
        "ocs_manager repairs or rolls back)",
        cmd_fault,
    )
    p.add_argument("switch_id", help="a switch id, or '*' for every switch of the agent")
    p.add_argument("--unreachable", action="store_true", help="every call answers UNAVAILABLE")
    p.add_argument(
        "--delay", type=parse_seconds, default=0.0, help="added to every batch's settling, e.g. 2s"
    )
    p.add_argument("--reject", type=int, default=0, metavar="N", help="refuse the next N batches")
    p.add_argument(
        "--partial",
        type=int,
        default=0,
        metavar="N",
        help="the next N batches apply their first half, then fail",
    )
    p.add_argument("--clear", action="store_true", help="no faults (the same as giving none)")
    p = command(
        "restart",
        "restart a switch with empty tables (a new boot id; the ocs_manager tells it again)",
        cmd_restart,
    )
    p.add_argument("switch_id", help="e.g. ocs-x-5-0 or otm-3")


def _address(args: argparse.Namespace) -> str:
    if args.addr:
        return args.addr
    try:
        return located(f"switches-{args.pod}", ADDR_ENV)[0]
    except KeyError:
        raise CliError(
            f"no switch agent known for {args.pod}: run the stack with switch agents "
            f"(`lightpath up --switch-agents`), or give --addr or ${ADDR_ENV}"
        ) from None


def _stubs(args: argparse.Namespace):
    ch = channel(_address(args))
    return (
        ch,
        optical_switch_pb2_grpc.OpticalSwitchStub(ch),
        optical_switch_pb2_grpc.OpticalSwitchAdminStub(ch),
    )


async def _ask(args: argparse.Namespace, call: Callable[[Any, Any], Awaitable[Message]]):
    """The agent's answer to `call(switch stub, admin stub)`; with --json printed whole
    (and None returned: nothing more to print)."""
    ch, stub, admin = _stubs(args)
    async with ch:
        answer = await call(stub, admin)
    if args.json:
        print_json(answer)
        return None
    return answer


def _seconds(d: Duration) -> str:
    ms = d.seconds * 1000 + d.nanos / 1e6
    return f"{ms / 1000:g} s" if ms >= 1000 else f"{ms:g} ms"


def _print_description(d: sb.SwitchDescription) -> None:
    kind = _KINDS.get(d.kind, "unknown kind")
    what = (
        f"{d.ports} ports" if d.kind == sb.SWITCH_KIND_OCS else f"{d.ports} inputs of 1x{d.outputs}"
    )
    print(f"{d.switch_id}: {kind}, {what}, version {d.version}, boot {d.boot_id}")
    made = " ".join(x for x in (d.vendor, d.model) if x)
    print(f"  settles in {_seconds(d.settling_time)}" + (f"; {made}" if made else ""))


async def cmd_describe(args: argparse.Namespace) -> int:
    d = await _ask(
        args, lambda s, _: s.Describe(sb.DescribeSwitchRequest(switch_id=args.switch_id))
    )
    if d is not None:
        _print_description(d)
    return 0


async def cmd_cross_connects(args: argparse.Namespace) -> int:
    ch, stub, _ = _stubs(args)
    async with ch:
        d = await stub.Describe(sb.DescribeSwitchRequest(switch_id=args.switch_id))
        state = await stub.GetCrossConnects(sb.GetCrossConnectsRequest(switch_id=args.switch_id))
    if d.kind == sb.SWITCH_KIND_ONE_TO_K:
        outputs = list(state.outputs)

        def outputs_columns(wide: bool) -> tuple[list[str], list]:
            return ["input", "output"], [(o.input, o.output) for o in outputs]

        print_list(args, "outputs", outputs, outputs_columns, lambda o: str(o.input), data=state)
        return 0
    pairs = list(state.cross_connects)

    def pair_columns(wide: bool) -> tuple[list[str], list]:
        return ["port", "port"], [(c.port_a, c.port_b) for c in pairs]

    print_list(
        args, "cross_connects", pairs, pair_columns, lambda c: f"{c.port_a}-{c.port_b}", data=state
    )
    return 0


async def cmd_ports(args: argparse.Namespace) -> int:
    ch, stub, _ = _stubs(args)
    async with ch:
        status = await stub.GetPortStatus(sb.GetPortStatusRequest(switch_id=args.switch_id))
    ports = [p for p in status.ports if args.all or p.state != sb.PORT_STATE_DARK]

    def columns(wide: bool) -> tuple[list[str], list]:
        rows = [
            (p.port, _PORT_STATES.get(p.state, "unknown"), p.peer if p.HasField("peer") else "")
            for p in ports
        ]
        return ["port", "state", "peer/output"], rows

    print_list(args, "ports", ports, columns, lambda p: str(p.port), data=status)
    return 0


async def cmd_stats(args: argparse.Namespace) -> int:
    s = await _ask(
        args, lambda _, a: a.GetSwitchStats(sb.GetSwitchStatsRequest(switch_id=args.switch_id))
    )
    if s is None:
        return 0
    rows = [
        ("ApplyBatch calls", s.apply_calls),
        ("batches applied", s.batches_applied),
        ("batches replayed", s.batches_replayed),
        ("batches failed", s.batches_failed),
        ("operations applied", s.operations_applied),
        ("restarts", s.restarts),
    ]
    print(f"{s.switch_id or 'every switch of the agent'}:")
    print(table(rows, ["counter", "value"], show_headers=False))
    return 0


async def cmd_fault(args: argparse.Namespace) -> int:
    for flag, value in (
        ("--delay", args.delay),
        ("--reject", args.reject),
        ("--partial", args.partial),
    ):
        if value < 0:
            raise CliError(f"{flag} must not be negative (0: none)")
    faults = sb.SwitchFaults()
    if not args.clear:
        faults.unreachable = args.unreachable
        faults.reject_batches = args.reject
        faults.partial_batches = args.partial
        if args.delay:
            faults.extra_delay.FromMilliseconds(round(args.delay * 1000))
    request = sb.InjectFaultRequest(switch_id=args.switch_id, faults=faults)
    r = await _ask(args, lambda _, a: a.InjectFault(request))
    if r is None:
        return 0
    f = r.faults
    said = [
        "unreachable" if f.unreachable else "",
        f"{_seconds(f.extra_delay)} more settling" if f.HasField("extra_delay") else "",
        f"{_next_batches(f.reject_batches)} refused" if f.reject_batches else "",
        f"{_next_batches(f.partial_batches)} half applied" if f.partial_batches else "",
    ]
    said = [s for s in said if s]
    who = "1 switch" if len(r.switch_ids) == 1 else f"{len(r.switch_ids)} switches"
    print(f"{who}: {', '.join(said) if said else 'no faults'}")
    if said:
        print(
            f"clear with `lightpath switches fault {args.switch_id} --clear`; "
            "`lightpath ocs check --compare-switches` shows what the switches hold"
        )
    return 0


def _next_batches(n: int) -> str:
    return "the next batch" if n == 1 else f"the next {n} batches"


async def cmd_restart(args: argparse.Namespace) -> int:
    d = await _ask(
        args, lambda _, a: a.RestartSwitch(sb.RestartSwitchRequest(switch_id=args.switch_id))
    )
    if d is None:
        return 0
    print(f"{d.switch_id} restarted with empty tables (boot {d.boot_id})")
    print(
        "the ocs_manager repairs it on its next reconcile round; "
        "`lightpath ocs check --compare-switches` shows when it holds its wiring again"
    )
    return 0
