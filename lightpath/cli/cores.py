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
import asyncio
import json
import os
import re
import time
from datetime import UTC, datetime

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from lightpath.cli._common import add_json_flag, print_json, run_rpc, table, to_jsonable
from lightpath.client import channel
from lightpath.security.credentials import Credentials
from lightpath.security.identity import OPERATOR
from lightpath.stack import endpoint
from lightpath.v1 import common_pb2, core_broker_pb2_grpc
from lightpath.v1 import core_broker_pb2 as pb

PROCESS = "core-broker"
ADDR_ENV = "LIGHTPATH_CORE_BROKER_ADDR"
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def operator_credentials(base: Credentials | None = None) -> Credentials:
    """The operator's credentials for the broker: `base` (default `Credentials.default()`)
    as it is when it holds an operator's certificate, else with $LIGHTPATH_CB_OPERATOR_TOKEN
    as its token if that is set, else as it is (the broker then says what it lacks)."""
    base = Credentials.default() if base is None else base
    presented = base.certificate_principal()
    if presented is not None and presented.kind == OPERATOR:
        return base
    token = os.environ.get("LIGHTPATH_CB_OPERATOR_TOKEN", "").strip()
    return base.with_token(token) if token else base


def operator_metadata(base: Credentials | None = None) -> tuple[tuple[str, str], ...]:
    """Per-call metadata that makes a call on a channel of `base` (default
    `Credentials.default()`, what `lightpath.client.channel` uses) the operator's:
    nothing when the channel already presents the operator's certificate."""
    base = Credentials.default() if base is None else base
    creds = operator_credentials(base)
    return creds.metadata() if creds.token != base.token else ()


def broker_credentials(token: str = "", *, operator: bool = False) -> Credentials:
    """What a command presents to the broker: an application's `token` (else
    $LIGHTPATH_CB_TOKEN, unless `operator`) with your certificate, else the operator's."""
    base = Credentials.default()
    token = token or ("" if operator else os.environ.get("LIGHTPATH_CB_TOKEN", "").strip())
    if token:
        return base.with_token(token)
    return operator_credentials(base)


def parse_seconds(raw: str) -> float:
    """`90`, `90s`, `250ms`, `5m`, `1.5h` → seconds."""
    m = re.fullmatch(r"\s*(-?[0-9]*\.?[0-9]+)\s*(ms|s|m|min|h)?\s*", raw)
    if not m:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a duration like 90s, 5m, 250ms")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


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
            names = [n.removeprefix(prefix).lower() for n in enum.keys()[1:]]
            raise argparse.ArgumentTypeError(f"{raw!r} is not one of {', '.join(names)}") from None

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


def _call(args: argparse.Namespace, body, *, operator: bool = False) -> int:
    """Run `body(stub, metadata)` against the broker with the command's credentials
    (they ride on the channel: `metadata` is empty, for calls that add their own)."""

    async def run() -> int | None:
        creds = broker_credentials(args.token or "", operator=operator)
        ch = channel(args.addr or endpoint(PROCESS, ADDR_ENV), credentials=creds)
        try:
            return await body(core_broker_pb2_grpc.CoreBrokerStub(ch), ())
        finally:
            await ch.close()

    return run_rpc(run)


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
    p.add_argument("--cores", type=int, required=True)
    p.add_argument("--duration", type=parse_seconds, required=True, help="e.g. 90s, 10m")
    p.add_argument("--start", type=parse_time, help="earliest start (+30s, ISO); default now")
    p.add_argument("--latest-end", type=parse_time, help="latest end; default no limit")
    p.add_argument("--within", type=parse_seconds, help="latest end = start + this")
    p.add_argument("--task-type", default="")
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
    _common(p)
    p.set_defaults(func=cmd_devices)

    p = cs.add_parser("capacity", help="free cores over a time range, per device and kind")
    p.add_argument("--from", dest="start", type=parse_time, help="start (+30s, ISO); now")
    p.add_argument("--to", dest="end", type=parse_time, help="end; default an instant")
    p.add_argument("--kind", type=KIND, default=0)
    p.add_argument("--schedule", action="store_true", help="list each device's reservations")
    _common(p)
    p.set_defaults(func=cmd_capacity)

    p = cs.add_parser("reserve", help="ask for cores; prints the decision")
    p.add_argument("reservation_id")
    add_request_arguments(p)
    _common(p)
    p.set_defaults(func=cmd_reserve)

    p = cs.add_parser("get", help="one reservation")
    p.add_argument("reservation_id")
    _common(p)
    p.set_defaults(func=cmd_get)

    p = cs.add_parser("list", help="your reservations (the operator: everyone's)")
    p.add_argument("--app", default="", help="operator: one application's")
    p.add_argument("--limit", type=int, default=50)
    _common(p)
    p.set_defaults(func=cmd_list)

    p = cs.add_parser("release", help="release a reservation early")
    p.add_argument("reservation_id")
    _common(p)
    p.set_defaults(func=cmd_release)

    p = cs.add_parser("extend", help="make a reservation end later, if the cores are free")
    p.add_argument("reservation_id")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--by", type=parse_seconds, help="e.g. 5m")
    g.add_argument("--until", type=parse_time, help="new end (+10m, ISO)")
    _common(p)
    p.set_defaults(func=cmd_extend)

    p = cs.add_parser("watch", help="stream starts, changes and ends of reservations")
    p.add_argument("reservation_id", nargs="?", default="")
    p.add_argument("--count", type=int, default=0, help="stop after this many events")
    _common(p)
    p.set_defaults(func=cmd_watch)

    p = cs.add_parser("add-device", help="operator: register or update a device")
    p.add_argument("device_id")
    p.add_argument("--kind", type=KIND, required=True, help="gpu, tpu, edge_tpu, npu, fpga")
    p.add_argument("--cores", type=int, required=True)
    p.add_argument("--site", default="")
    p.add_argument("--x", type=float, default=0.0)
    p.add_argument("--y", type=float, default=0.0)
    p.add_argument("--affinity", action="append", default=[], help="task type it suits")
    _common(p)
    p.set_defaults(func=cmd_add_device)

    p = cs.add_parser("add-app", help="operator: register an application; prints its token")
    p.add_argument("application_id")
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
    async def body(stub, md):
        resp = await stub.ListDevices(pb.ListDevicesRequest(kind=args.kind), metadata=md)
        if args.json:
            print_json(resp)
            return 0
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
            for d in resp.devices
        ]
        print(table(rows, ["device", "kind", "cores", "reserved", "free", "site", "affinity"]))
        return 0

    return _call(args, body)


def cmd_capacity(args: argparse.Namespace) -> int:
    async def body(stub, md):
        req = pb.QueryCapacityRequest(include_schedule=args.schedule, kind=args.kind)
        if args.start is not None:
            req.start.CopyFrom(_ts(args.start))
        if args.end is not None:
            req.end.CopyFrom(_ts(args.end))
        resp = await stub.QueryCapacity(req, metadata=md)
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

    return _call(args, body)


def build_request(args: argparse.Namespace) -> pb.ReservationRequest:
    d = Duration()
    d.FromMilliseconds(int(args.duration * 1000))
    req = pb.ReservationRequest(
        reservation_id=args.reservation_id,
        cores=args.cores,
        duration=d,
        task_type=args.task_type,
        priority_hint=args.priority,
        device_ids=args.device,
        qos_level=args.qos,
        billing_model=args.billing,
        placement=args.policy,
        accept=args.accept,
        device_kind=args.kind,
    )
    if args.start is not None or args.latest_end is not None or args.within is not None:
        window = common_pb2.TimeWindow()
        start = args.start if args.start is not None else time.time()
        if args.start is not None:
            window.earliest_start.CopyFrom(_ts(args.start))
        if args.latest_end is not None:
            window.latest_end.CopyFrom(_ts(args.latest_end))
        elif args.within is not None:
            window.latest_end.CopyFrom(_ts(start + args.within))
        req.window.CopyFrom(window)
    if args.site or args.x or args.y:
        req.client_location.CopyFrom(pb.Location(site=args.site, x_km=args.x, y_km=args.y))
    return req


def cmd_reserve(args: argparse.Namespace) -> int:
    return _one(args, "Reserve", pb.ReserveRequest(request=build_request(args)))


def _one(args: argparse.Namespace, method: str, request) -> int:
    """Call one RPC that answers a Reservation, and print it."""

    async def body(stub, md):
        _print_reservation(args, await getattr(stub, method)(request, metadata=md))
        return 0

    return _call(args, body)


def cmd_get(args: argparse.Namespace) -> int:
    return _one(
        args, "GetReservation", pb.GetReservationRequest(reservation_id=args.reservation_id)
    )


def cmd_list(args: argparse.Namespace) -> int:
    async def body(stub, md):
        out: list[pb.Reservation] = []
        token = ""
        while len(out) < args.limit:
            page = await stub.ListReservations(
                pb.ListReservationsRequest(
                    page_size=min(args.limit - len(out), 1000),
                    page_token=token,
                    application_id=args.app,
                ),
                metadata=md,
            )
            out += page.reservations
            token = page.next_page_token
            if not token:
                break
        if args.json:
            print_json({"reservations": out})
            return 0
        rows = [
            (
                r.reservation_id,
                r.application_id,
                _short(pb.Outcome, r.outcome, "OUTCOME_"),
                _short(pb.ReservationState, r.state, "RESERVATION_STATE_"),
                sum(a.cores for a in r.allocations if a.start == r.start),
                _when(r.start),
                _when(r.end),
                r.summary,
            )
            for r in out
        ]
        print(table(rows, ["id", "app", "outcome", "state", "cores", "start", "end", "summary"]))
        return 0

    return _call(args, body)


def cmd_release(args: argparse.Namespace) -> int:
    return _one(
        args,
        "ReleaseReservation",
        pb.ReleaseReservationRequest(reservation_id=args.reservation_id),
    )


def cmd_extend(args: argparse.Namespace) -> int:
    async def body(stub, md):
        if args.until is not None:
            new_end = _ts(args.until)
        else:
            cur = await stub.GetReservation(
                pb.GetReservationRequest(reservation_id=args.reservation_id), metadata=md
            )
            new_end = Timestamp()
            new_end.FromMilliseconds(cur.end.ToMilliseconds() + int(args.by * 1000))
        r = await stub.ExtendReservation(
            pb.ExtendReservationRequest(reservation_id=args.reservation_id, new_end=new_end),
            metadata=md,
        )
        _print_reservation(args, r)
        return 0

    return _call(args, body)


def cmd_watch(args: argparse.Namespace) -> int:
    async def body(stub, md):
        n = 0
        stream = stub.WatchReservations(
            pb.WatchReservationsRequest(reservation_id=args.reservation_id), metadata=md
        )
        try:
            async for ev in stream:
                if args.json:
                    print(json.dumps(to_jsonable(ev), sort_keys=True), flush=True)
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
        except asyncio.CancelledError:
            pass
        finally:
            stream.cancel()
        return 0

    try:
        return _call(args, body)
    except KeyboardInterrupt:
        return 0


def cmd_add_device(args: argparse.Namespace) -> int:
    async def body(stub, md):
        d = await stub.RegisterDevice(
            pb.RegisterDeviceRequest(
                device=pb.Device(
                    device_id=args.device_id,
                    kind=args.kind,
                    cores=args.cores,
                    location=pb.Location(site=args.site, x_km=args.x, y_km=args.y),
                    task_affinities=args.affinity,
                )
            ),
            metadata=md,
        )
        if args.json:
            print_json(d)
        else:
            kind = _short(pb.DeviceKind, d.kind, "DEVICE_KIND_")
            print(f"device {d.device_id}: {kind} with {d.cores} cores")
        return 0

    return _call(args, body, operator=True)


def cmd_add_app(args: argparse.Namespace) -> int:
    async def body(stub, md):
        r = await stub.RegisterApplication(
            pb.RegisterApplicationRequest(
                application_id=args.application_id,
                qos_level=args.qos,
                billing_model=args.billing,
            ),
            metadata=md,
        )
        if args.json:
            print_json(r)
        else:
            print(
                f"application {r.application_id} {'rotated' if r.rotated else 'registered'}; "
                f"its token (shown once):\n{r.token}"
            )
        return 0

    return _call(args, body, operator=True)
