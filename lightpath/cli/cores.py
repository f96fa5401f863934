"""`lightpath cores ...`: accelerator cores as a service (core_broker, CB-1 … CB-9).

    lightpath cores devices                       # capacity map: total, reserved, free now
    lightpath cores reserve r-1 --cores 50 --duration 10m --accept partial
    lightpath cores list | get r-1 | release r-1 | extend r-1 --by 5m
    lightpath cores watch [r-1]                   # starts, changes, ends as they happen
    lightpath cores capacity --from +1m --to +10m # free cores over a range, per device and kind
    lightpath cores add-device gpu-1 --kind gpu --cores 80      # operator
    lightpath cores add-app camera-7 --qos premium              # operator: prints the token

Credentials (CB-2): an application's token, `--token` or else $LIGHTPATH_CB_TOKEN
(the operator's actions, add-device and add-app, take only `--token`), sent over
mTLS with your certificate; else the operator's certificate that
`Credentials.default()` finds (the local stack's, or LIGHTPATH_TLS_*); else
$LIGHTPATH_CB_OPERATOR_TOKEN as the token, if the broker has one. The broker:
$LIGHTPATH_CORE_BROKER_ADDR, else the running local stack.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from lightpath.cli._common import (
    add_json_flag,
    add_list_output,
    clip,
    parse_seconds,
    print_json,
    print_json_line,
    print_list,
    run_rpc,
    table,
)
from lightpath.sdk.cores import (
    AsyncCores,
    broker_credentials,
    operator_credentials,
    operator_metadata,
    reservation_request,
)
from lightpath.v1 import common_pb2
from lightpath.v1 import core_broker_pb2 as pb

__all__ = [
    "broker_credentials",
    "operator_credentials",
    "operator_metadata",
]

ADDR_ENV = AsyncCores.ADDR_ENV


def parse_time(raw: str) -> float:
    """`+30s` (from now), `now`, or an ISO 8601 time → seconds since the epoch."""
    if raw == "now":
        return time.time()
    if raw.startswith("+"):
        return time.time() + parse_seconds(raw[1:])
    try:
        t = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{raw!r} is not a time like +30s, now or 2025-01-01T12:00:00Z"
        ) from None
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def _ts(seconds: float) -> Timestamp:
    t = Timestamp()
    t.FromMilliseconds(int(seconds * 1000))
    return t


def _when(t: Timestamp) -> str:
    if not t.seconds and not t.nanos:
        return "-"
    return t.ToDatetime(tzinfo=UTC).strftime("%H:%M:%S.%f")[:-3]


def enum_arg(enum, prefix: str):
    """An argparse type: `gpu` → DEVICE_KIND_GPU's number (names case-insensitive, - or _)."""

    def parse(raw: str) -> int:
        try:
            return enum.Value(prefix + raw.strip().upper().replace("-", "_"))
        except ValueError:
            names = [n.removeprefix(prefix) for n in enum.keys()[1:]]
            raise argparse.ArgumentTypeError(
                f"{raw!r} is not one of {', '.join(names)} (any case)"
            ) from None

    parse.__name__ = prefix.lower().strip("_")
    return parse


KIND = enum_arg(pb.DeviceKind, "DEVICE_KIND_")
QOS = enum_arg(pb.QosLevel, "QOS_LEVEL_")
BILLING = enum_arg(pb.BillingModel, "BILLING_MODEL_")
POLICY = enum_arg(pb.PlacementPolicy, "PLACEMENT_POLICY_")
OUTCOME = enum_arg(pb.Outcome, "OUTCOME_")


def outcomes_arg(raw: str) -> list[int]:
    return [OUTCOME(name) for name in raw.split(",") if name.strip()]


def _short(enum, value: int, prefix: str) -> str:
    return enum.Name(value).removeprefix(prefix)


def _client(
    args: argparse.Namespace,
    body: Callable[[AsyncCores], Awaitable[int | None]],
    *,
    operator: bool = False,
    hints: Mapping[str, str] | None = None,
) -> int:
    """Run `body(client)` with the SDK's broker client and the command's credentials
    (`hints`: what to do next, by status code, for run_rpc)."""

    async def run() -> int | None:
        async with AsyncCores(args.addr or None, token=args.token or "", operator=operator) as b:
            return await body(b)

    return run_rpc(run, hints=hints)


def _call(
    args: argparse.Namespace,
    body,
    *,
    operator: bool = False,
    hints: Mapping[str, str] | None = None,
) -> int:
    """Run `body(stub, metadata)` on the broker's generated stub (for the RPCs the SDK
    does not wrap: graphs), with the command's credentials on the channel (`metadata`
    is empty, for calls that add their own)."""

    async def on_stub(client: AsyncCores) -> int | None:
        return await body(client.stub, ())  # type: ignore[no-any-return]

    return _client(args, on_stub, operator=operator, hints=hints)


def _common(p: argparse.ArgumentParser, *, json: bool = True) -> None:
    p.add_argument(
        "--token",
        help="an application's token (default: $LIGHTPATH_CB_TOKEN, else the operator's "
        "certificate, else $LIGHTPATH_CB_OPERATOR_TOKEN)",
    )
    p.add_argument("--addr", help=f"broker host:port (default: ${ADDR_ENV} or the local stack)")
    if json:
        add_json_flag(p)


def add_request_arguments(p: argparse.ArgumentParser) -> None:
    """What a ReservationRequest holds besides its id (`build_request` reads them back)."""
    p.add_argument("--cores", type=int, required=True, help="how many cores")
    p.add_argument("--duration", type=parse_seconds, required=True, help="e.g. 90s, 10m")
    p.add_argument("--start", type=parse_time, help="earliest start (+30s, ISO); default now")
    p.add_argument("--latest-end", type=parse_time, help="latest end; default no limit")
    p.add_argument("--within", type=parse_seconds, help="latest end = start + this")
    p.add_argument(
        "--task-type", default="", help="what runs (affinity placement prefers devices for it)"
    )
    p.add_argument("--priority", type=int, default=0, help="priority hint 1..100")
    p.add_argument("--qos", type=QOS, default=0, help="best_effort, standard, premium")
    p.add_argument("--billing", type=BILLING, default=0, help="spot, on_demand, committed")
    p.add_argument(
        "--policy",
        type=POLICY,
        default=0,
        help="placement: spread, pack, nearest, affinity, lowest_latency",
    )
    p.add_argument(
        "--accept",
        type=outcomes_arg,
        default=[],
        help="comma list of partial, deferred (default both); 'granted' for nothing less",
    )
    p.add_argument("--kind", type=KIND, default=0, help="device kind")
    p.add_argument("--device", action="append", default=[], help="only these devices")
    p.add_argument("--site", default="", help="client site (lowest-latency placement)")
    p.add_argument("--x", type=float, default=0.0, help="client x km (nearest placement)")
    p.add_argument("--y", type=float, default=0.0, help="client y km")


def register(sub: argparse._SubParsersAction) -> None:
    cores = sub.add_parser("cores", help="accelerator cores as a service (core_broker)")
    cs = cores.add_subparsers(dest="cores_command", metavar="ACTION")
    cs.required = True

    p = cs.add_parser("devices", help="devices with total, reserved and free cores now")
    p.add_argument("--kind", type=KIND, default=0, help="gpu, tpu, edge_tpu, npu, fpga")
    _common(p, json=False)
    add_list_output(p)
    p.set_defaults(func=cmd_devices)

    p = cs.add_parser("capacity", help="free cores over a time range, per device and kind")
    p.add_argument("--from", dest="start", type=parse_time, help="start (+30s, ISO); now")
    p.add_argument("--to", dest="end", type=parse_time, help="end; default an instant")
    p.add_argument("--kind", type=KIND, default=0, help="only this device kind")
    p.add_argument("--schedule", action="store_true", help="list each device's reservations")
    _common(p)
    p.set_defaults(func=cmd_capacity)

    p = cs.add_parser("reserve", help="ask for cores; prints the decision")
    p.add_argument("reservation_id", help="your id for it, unique; asking again is safe")
    add_request_arguments(p)
    _common(p)
    p.set_defaults(func=cmd_reserve)

    p = cs.add_parser("get", help="one reservation")
    p.add_argument("reservation_id", help="the reservation's id")
    _common(p)
    p.set_defaults(func=cmd_get)

    p = cs.add_parser("list", help="your reservations (the operator: everyone's)")
    p.add_argument("--app", default="", help="operator: one application's")
    p.add_argument("--limit", type=int, default=50, help="at most this many (one page)")
    p.add_argument("--all", action="store_true", help="every reservation, page after page")
    p.add_argument("--page-token", default="", help="the next page, from a previous listing")
    _common(p, json=False)
    add_list_output(p)
    p.set_defaults(func=cmd_list)

    p = cs.add_parser("release", help="release a reservation early")
    p.add_argument("reservation_id", help="the reservation's id")
    _common(p)
    p.set_defaults(func=cmd_release)

    p = cs.add_parser("extend", help="make a reservation end later, if the cores are free")
    p.add_argument("reservation_id", help="the reservation's id")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--by", type=parse_seconds, help="e.g. 5m")
    g.add_argument("--until", type=parse_time, help="new end (+10m, ISO)")
    _common(p)
    p.set_defaults(func=cmd_extend)

    p = cs.add_parser("watch", help="stream starts, changes and ends of reservations")
    p.add_argument(
        "reservation_id", nargs="?", default="", help="only this one (default: all of yours)"
    )
    p.add_argument("--count", type=int, default=0, help="stop after this many events")
    _common(p)
    p.set_defaults(func=cmd_watch)

    p = cs.add_parser("add-device", help="operator: register or update a device")
    p.add_argument("device_id", help="the device's id")
    p.add_argument("--kind", type=KIND, required=True, help="gpu, tpu, edge_tpu, npu, fpga")
    p.add_argument("--cores", type=int, required=True, help="its cores")
    p.add_argument("--site", default="", help="where it is (lowest-latency placement)")
    p.add_argument("--x", type=float, default=0.0, help="its x in km (nearest placement)")
    p.add_argument("--y", type=float, default=0.0, help="its y in km")
    p.add_argument("--affinity", action="append", default=[], help="task type it suits")
    _common(p)
    p.set_defaults(func=cmd_add_device)

    p = cs.add_parser("add-app", help="operator: register an application; prints its token")
    p.add_argument("application_id", help="the application's id (again: a new token)")
    p.add_argument("--qos", type=QOS, default=0, help="best_effort, standard (default), premium")
    p.add_argument(
        "--billing", type=BILLING, default=0, help="spot, on_demand (default), committed"
    )
    _common(p)
    p.set_defaults(func=cmd_add_app)


# -- output ---------------------------------------------------------------------


def reservation_lines(r: pb.Reservation) -> str:
    head = (
        f"{r.reservation_id}: {_short(pb.Outcome, r.outcome, 'OUTCOME_')} "
        f"({_short(pb.ReservationState, r.state, 'RESERVATION_STATE_')}), "
        f"priority {_short(common_pb2.PriorityClass, r.priority.level, 'PRIORITY_CLASS_')} "
        f"{r.priority.score:.2f} — {r.summary}"
    )
    if r.outcome == pb.OUTCOME_REJECTED:
        return head + f"\n  earliest possible start {_when(r.earliest_possible_start)}"
    rows = [(a.device_id, a.cores, _when(a.start), _when(a.end)) for a in r.allocations]
    return head + "\n" + table(rows, ["device", "cores", "start (UTC)", "end (UTC)"])


def _print_reservation(args: argparse.Namespace, r: pb.Reservation) -> None:
    if args.json:
        print_json(r)
    else:
        print(reservation_lines(r))


# -- commands ---------------------------------------------------------------------


def cmd_devices(args: argparse.Namespace) -> int:
    async def body(cores: AsyncCores) -> int:
        devices = list((await cores.devices(args.kind)).devices)

        def columns(wide: bool) -> tuple[list[str], list]:
            rows = [
                (
                    d.device.device_id,
                    _short(pb.DeviceKind, d.device.kind, "DEVICE_KIND_"),
                    d.device.cores,
                    d.reserved_cores,
                    d.free_cores,
                    d.device.location.site or "-",
                    ",".join(d.device.task_affinities) or "-",
                )
                for d in devices
            ]
            return ["device", "kind", "cores", "reserved", "free", "site", "affinity"], rows

        print_list(args, "devices", devices, columns, lambda d: d.device.device_id)
        return 0

    return _client(args, body)


def cmd_capacity(args: argparse.Namespace) -> int:
    async def body(cores: AsyncCores) -> int:
        resp = await cores.capacity(
            start=args.start, end=args.end, kind=args.kind, include_schedule=args.schedule
        )
        if args.json:
            print_json(resp)
            return 0
        print(f"free during {_when(resp.start)} – {_when(resp.end)} UTC")
        rows = [
            (
                _short(pb.DeviceKind, k.kind, "DEVICE_KIND_"),
                k.devices,
                k.total_cores,
                k.free_cores,
            )
            for k in resp.kinds
        ]
        print(table(rows, ["kind", "devices", "cores", "free"]))
        rows = [
            (d.device.device_id, d.device.cores, d.peak_reserved_cores, d.free_cores)
            for d in resp.devices
        ]
        print(table(rows, ["device", "cores", "peak reserved", "free"]))
        for d in resp.devices:
            for s in d.schedule:
                print(
                    f"  {d.device.device_id}: {s.cores} cores {_when(s.start)}–{_when(s.end)}"
                    f" {s.reservation_id}"
                )
        return 0

    return _client(args, body)


def build_request(args: argparse.Namespace) -> pb.ReservationRequest:
    """The ReservationRequest of `add_request_arguments`' flags."""
    return reservation_request(
        args.reservation_id,
        args.cores,
        args.duration,
        start=args.start,
        latest_end=args.latest_end,
        within=args.within,
        task_type=args.task_type,
        priority=args.priority,
        qos=args.qos,
        billing=args.billing,
        placement=args.policy,
        accept=args.accept,
        kind=args.kind,
        devices=args.device,
        site=args.site,
        x_km=args.x,
        y_km=args.y,
    )


def _one(args: argparse.Namespace, call: Callable[[AsyncCores], Awaitable[pb.Reservation]]) -> int:
    """Make one call that answers a Reservation, and print it."""

    async def body(cores: AsyncCores) -> int:
        _print_reservation(args, await call(cores))
        return 0

    return _client(args, body)


def cmd_reserve(args: argparse.Namespace) -> int:
    request = build_request(args)
    return _one(args, lambda cores: cores.reserve(args.reservation_id, request=request))


def cmd_get(args: argparse.Namespace) -> int:
    return _one(args, lambda cores: cores.get(args.reservation_id))


def cmd_release(args: argparse.Namespace) -> int:
    return _one(args, lambda cores: cores.release(args.reservation_id))


def cmd_extend(args: argparse.Namespace) -> int:
    return _one(args, lambda cores: cores.extend(args.reservation_id, until=args.until, by=args.by))


def _reservation_columns(out: list[pb.Reservation]):
    def columns(wide: bool) -> tuple[list[str], list]:
        headers = ["id", "app", "outcome", "state", "cores", "start", "end", "summary"]
        rows = []
        for r in out:
            row = [
                r.reservation_id,
                r.application_id,
                _short(pb.Outcome, r.outcome, "OUTCOME_"),
                _short(pb.ReservationState, r.state, "RESERVATION_STATE_"),
                sum(a.cores for a in r.allocations if a.start == r.start),
                _when(r.start),
                _when(r.end),
                r.summary if wide else clip(r.summary, 60),
            ]
            if wide:
                row[-1:-1] = [len(r.allocations), r.request.task_type or "-"]
            rows.append(row)
        if wide:
            headers[-1:-1] = ["parts", "task"]
        return headers, rows

    return columns


def cmd_list(args: argparse.Namespace) -> int:
    async def body(cores: AsyncCores) -> int:
        if args.all:
            out = [
                r
                async for r in cores.list_reservations(
                    application=args.app, page_token=args.page_token
                )
            ]
            token = ""
        else:
            page = await cores.list_reservations_page(
                application=args.app, page_size=args.limit, page_token=args.page_token
            )
            out, token = list(page.reservations), page.next_page_token
        print_list(
            args,
            "reservations",
            out,
            _reservation_columns(out),
            lambda r: r.reservation_id,
            next_page_token=token,
        )
        return 0

    return _client(args, body)


def cmd_watch(args: argparse.Namespace) -> int:
    async def body(cores: AsyncCores) -> int:
        n = 0
        async for ev in cores.watch(args.reservation_id):
            if args.json:
                print_json_line(ev)
            else:
                r = ev.reservation
                print(
                    f"{_when(ev.at)}  {_short(pb.ReservationEventType, ev.type, 'RESERVATION_EVENT_TYPE_'):<12}"
                    f" {r.reservation_id:<16} "
                    f"{_short(pb.ReservationState, r.state, 'RESERVATION_STATE_'):<9}"
                    f" {r.summary}",
                    flush=True,
                )
            n += 1
            if args.count and n >= args.count:
                break
        return 0

    try:
        return _client(args, body)
    except KeyboardInterrupt:
        return 0


def cmd_add_device(args: argparse.Namespace) -> int:
    async def body(cores: AsyncCores) -> int:
        d = await cores.register_device(
            pb.Device(
                device_id=args.device_id,
                kind=args.kind,
                cores=args.cores,
                location=pb.Location(site=args.site, x_km=args.x, y_km=args.y),
                task_affinities=args.affinity,
            )
        )
        if args.json:
            print_json(d)
        else:
            kind = _short(pb.DeviceKind, d.kind, "DEVICE_KIND_")
            print(f"device {d.device_id}: {kind} with {d.cores} cores")
        return 0

    return _client(args, body, operator=True)


def cmd_add_app(args: argparse.Namespace) -> int:
    async def body(cores: AsyncCores) -> int:
        r = await cores.register_application(
            args.application_id, qos=args.qos, billing=args.billing
        )
        if args.json:
            print_json(r)
        else:
            print(
                f"application {r.application_id} {'rotated' if r.rotated else 'registered'}; "
                f"its token (shown once):\n{r.token}"
            )
        return 0

    return _client(args, body, operator=True)
