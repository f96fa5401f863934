"""Demo step of core_broker: the seed's three scenarios (001 Fig. 2, 3, 4).

The operator registers a GPU per scenario and the edge applications; each
application reserves cores with its own credential (CB-2). Fig. 2: three
requests of 25, 21 and 10 cores, all granted. Fig. 3: two requests of 50 cores
on an 80-core GPU, sent together — the higher-priority one gets all 50, the
lower 30 now and 20 when the first ends. Fig. 4: the same, but the lower one
accepts only a later start — it is deferred until the higher one ends, and the
watch stream reports its start and its end (CB-6). Everything made is removed
at the end, so the demo can run again on the same stack.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from lightpath.cli._common import table
from lightpath.cli.cores import operator_metadata
from lightpath.demo.context import DemoContext
from lightpath.v1 import common_pb2, core_broker_pb2_grpc
from lightpath.v1 import core_broker_pb2 as pb

PROCESS = "core-broker"


def _md(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _dur(seconds: float) -> Duration:
    d = Duration()
    d.FromMilliseconds(int(seconds * 1000))
    return d


def _at(ms: int) -> Timestamp:
    t = Timestamp()
    t.FromMilliseconds(ms)
    return t


def _rel(t: Timestamp, t0: int) -> str:
    return f"+{(t.ToMilliseconds() - t0) / 1000:.1f} s"


def _rows(rs: list[tuple[str, pb.Reservation]], t0: int) -> list[tuple]:
    return [
        (
            app,
            r.reservation_id,
            pb.Outcome.Name(r.outcome).removeprefix("OUTCOME_"),
            f"{common_pb2.PriorityClass.Name(r.priority.level).removeprefix('PRIORITY_CLASS_')} "
            f"{r.priority.score:.2f}",
            " + ".join(f"{a.cores}@{_rel(a.start, t0)}" for a in r.allocations) or "-",
            r.summary,
        )
        for app, r in rs
    ]


HEADERS = ["application", "reservation", "decision", "priority", "cores@start", "summary"]


async def run(ctx: DemoContext) -> None:
    stub = core_broker_pb2_grpc.CoreBrokerStub(ctx.channel(PROCESS))
    # the operator: the channel's own certificate (the local stack's operator), else
    # LIGHTPATH_CB_OPERATOR_TOKEN; each application calls with its own token
    op = operator_metadata()
    tag = uuid.uuid4().hex[:6]
    devices: list[str] = []
    apps: dict[str, tuple[tuple[str, str], ...]] = {}
    made: list[tuple[str, str]] = []

    async def device(name: str, cores: int) -> str:
        device_id = f"{name}-{tag}"
        await stub.RegisterDevice(
            pb.RegisterDeviceRequest(
                device=pb.Device(device_id=device_id, kind=pb.DEVICE_KIND_GPU, cores=cores)
            ),
            metadata=op,
        )
        devices.append(device_id)
        return device_id

    async def app(name: str, qos: pb.QosLevel.ValueType) -> tuple[str, tuple[tuple[str, str], ...]]:
        app_id = f"{name}-{tag}"
        resp = await stub.RegisterApplication(
            pb.RegisterApplicationRequest(application_id=app_id, qos_level=qos), metadata=op
        )
        apps[app_id] = _md(resp.token)
        return app_id, apps[app_id]

    try:
        ctx.section("core_broker: three requests, all granted")
        gpu = await device("gpu-104", 64)
        t0 = int(time.time() * 1000) + 2000
        rows = []
        for client, cores, offset, seconds in (
            ("client-102-1", 25, 0.0, 10),
            ("client-102-2", 21, 2.0, 10),
            ("client-102-n", 10, 5.0, 4),
        ):
            app_id, md = await app(client, pb.QOS_LEVEL_STANDARD)
            start = t0 + int(offset * 1000)
            r = await stub.Reserve(
                pb.ReserveRequest(
                    request=pb.ReservationRequest(
                        reservation_id=f"req-{client}-{tag}",
                        cores=cores,
                        duration=_dur(seconds),
                        window=common_pb2.TimeWindow(earliest_start=_at(start)),
                        device_ids=[gpu],
                    )
                ),
                metadata=md,
            )
            made.append((app_id, r.reservation_id))
            rows.append((app_id, r))
        print(f"{gpu}: 64 cores; times relative to t_a")
        print(table(_rows(rows, t0), HEADERS))

        for fig, lower_accepts in (("Fig. 3", pb.OUTCOME_PARTIAL), ("Fig. 4", pb.OUTCOME_DEFERRED)):
            what = "partially now, the rest later" if fig == "Fig. 3" else "deferred"
            ctx.section(f"core_broker: conflicting requests, the lower {what}")
            gpu = await device(f"gpu-{fig[-1]}", 80)
            cam_id, cam = await app(f"camera-{fig[-1]}", pb.QOS_LEVEL_PREMIUM)
            train_id, trainer = await app(f"trainer-{fig[-1]}", pb.QOS_LEVEL_BEST_EFFORT)
            higher = pb.ReservationRequest(
                reservation_id=f"req-302-1-{fig[-1]}-{tag}",
                cores=50,
                duration=_dur(2),
                task_type="computer-vision",
                billing_model=pb.BILLING_MODEL_COMMITTED,
                priority_hint=90,
                device_ids=[gpu],
            )
            lower = pb.ReservationRequest(
                reservation_id=f"req-302-n-{fig[-1]}-{tag}",
                cores=50,
                duration=_dur(2),
                task_type="training",
                billing_model=pb.BILLING_MODEL_SPOT,
                priority_hint=10,
                accept=[lower_accepts],
                device_ids=[gpu],
            )
            t0 = int(time.time() * 1000)
            # sent together (the lower first): decided together, by priority (CB-5)
            low, high = await asyncio.gather(
                stub.Reserve(pb.ReserveRequest(request=lower), metadata=trainer),
                stub.Reserve(pb.ReserveRequest(request=higher), metadata=cam),
            )
            made += [(cam_id, high.reservation_id), (train_id, low.reservation_id)]
            print(f"{gpu}: 80 cores; both ask for 50 for 2 s")
            print(table(_rows([(cam_id, high), (train_id, low)], t0), HEADERS))
            print(f"watching {low.reservation_id}:")
            # what happened before the watch began arrives as its CURRENT state
            watch = stub.WatchReservations(
                pb.WatchReservationsRequest(reservation_id=low.reservation_id), metadata=trainer
            )
            async for ev in watch:
                at = ev.at.ToMilliseconds()
                held = [
                    str(a.cores)
                    for a in ev.reservation.allocations
                    if a.start.ToMilliseconds() <= at < a.end.ToMilliseconds()
                ]
                kind = pb.ReservationEventType.Name(ev.type).removeprefix("RESERVATION_EVENT_TYPE_")
                if ev.type == pb.RESERVATION_EVENT_TYPE_CURRENT:
                    kind = pb.ReservationState.Name(ev.reservation.state).removeprefix(
                        "RESERVATION_STATE_"
                    )
                print(f"  {_rel(ev.at, t0):>8}  {kind:<12} cores held: {' + '.join(held) or '0'}")
                if ev.type in (pb.RESERVATION_EVENT_TYPE_ENDED, pb.RESERVATION_EVENT_TYPE_RELEASED):
                    break
    finally:
        for _, rid in made:
            try:
                await stub.ReleaseReservation(
                    pb.ReleaseReservationRequest(reservation_id=rid), metadata=op
                )
            except Exception:
                pass  # already ended
        for device_id in devices:
            await stub.RemoveDevice(pb.RemoveDeviceRequest(device_id=device_id), metadata=op)
        for app_id in apps:
            await stub.RemoveApplication(
                pb.RemoveApplicationRequest(application_id=app_id), metadata=op
            )
