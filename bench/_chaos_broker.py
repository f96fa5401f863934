"""The core_broker's part of bench/chaos.py: an application reserving and releasing
cores from concurrent clients through the kills, then every acknowledged
reservation checked and the schedule searched for a double-booked core.

A reservation is acknowledged when Reserve answered (GRANTED, PARTIAL or DEFERRED:
stored; REJECTED stores nothing), a release when ReleaseReservation answered; a
release whose answer was lost to a kill may have happened or not, and either is right.
After the chaos each acknowledged one must be there, with the allocations it was
granted, in a definite state (a released one RELEASED); no device may have more
cores in use at any moment than it has, counting every reservation the broker
lists that is not RELEASED (a released one's cores are free from its release on,
which the listing does not say part by part).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from lightpath.v1 import common_pb2
from lightpath.v1 import core_broker_pb2 as cb

BROKER = "broker"
APP = "chaos-app"
DEVICES = 8
CORES = 16
LIVE_STATES = {
    cb.RESERVATION_STATE_SCHEDULED,
    cb.RESERVATION_STATE_ACTIVE,
    cb.RESERVATION_STATE_ENDED,
}
DEFINITE = LIVE_STATES | {cb.RESERVATION_STATE_RELEASED}
# A call that failed so: it may or may not have been carried out (the broker or Redis
# was killed around it).
OUTCOME_UNKNOWN = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "UNKNOWN", "INTERNAL", "CANCELLED"}


@dataclass
class Reservations:
    """What the reservation clients were told."""

    # reservation id -> the allocations (device, cores, start ms, end ms) it was granted
    acked: dict[str, list[tuple[str, int, int, int]]] = field(default_factory=dict)
    released: set[str] = field(default_factory=set)
    # releases asked for whose answer was lost (a kill): released or not, both are right
    release_unknown: set[str] = field(default_factory=set)


def allocations(r: cb.Reservation) -> list[tuple[str, int, int, int]]:
    return sorted(
        (a.device_id, a.cores, a.start.ToMilliseconds(), a.end.ToMilliseconds())
        for a in r.allocations
    )


async def set_up(broker, metadata=()) -> tuple[tuple[str, str], ...]:
    """Devices and the application; the application's bearer metadata."""
    for i in range(DEVICES):
        await broker.RegisterDevice(
            cb.RegisterDeviceRequest(
                device=cb.Device(device_id=f"gpu-{i}", kind=cb.DEVICE_KIND_GPU, cores=CORES)
            ),
            metadata=metadata,
        )
    resp = await broker.RegisterApplication(
        cb.RegisterApplicationRequest(application_id=APP, qos_level=cb.QOS_LEVEL_PREMIUM),
        metadata=metadata,
    )
    return (("authorization", f"Bearer {resp.token}"),)


def _request(rid: str, rng: random.Random) -> cb.ReservationRequest:
    duration = Duration()
    duration.FromMilliseconds(rng.randint(1_000, 8_000))
    window = common_pb2.TimeWindow()
    if rng.random() < 0.4:  # some start later: the schedule fills beyond now
        start = Timestamp()
        start.FromMilliseconds(int(time.time() * 1000) + rng.randint(500, 10_000))
        window.earliest_start.CopyFrom(start)
    return cb.ReservationRequest(
        reservation_id=rid,
        cores=rng.randint(1, 3 * CORES // 2),
        duration=duration,
        window=window,
    )


async def client(index: int, broker, app_md, record, seen: Reservations, rng, deadline, call):
    """Reserve (60 %), release (25 %), get (15 %) until `deadline`; `call` records codes."""
    mine: list[str] = []
    n = 0
    while time.monotonic() < deadline:
        n += 1
        op = rng.random()
        if op < 0.6 or not mine:
            rid = f"res-{index}-{n}"
            resp = await call(
                record,
                broker.Reserve(
                    cb.ReserveRequest(request=_request(rid, rng)), metadata=app_md, timeout=20
                ),
            )
            if resp is not None and resp.state != cb.RESERVATION_STATE_REJECTED:
                seen.acked[rid] = allocations(resp)
                mine.append(rid)
        elif op < 0.85:
            rid = rng.choice(mine)
            resp = await call(
                record,
                broker.ReleaseReservation(
                    cb.ReleaseReservationRequest(reservation_id=rid), metadata=app_md, timeout=20
                ),
            )
            mine.remove(rid)
            if resp is not None:
                seen.released.add(rid)
            elif record.last_code in OUTCOME_UNKNOWN:  # (read before any other call ran)
                seen.release_unknown.add(rid)
        else:
            await call(
                record,
                broker.GetReservation(
                    cb.GetReservationRequest(reservation_id=rng.choice(mine)),
                    metadata=app_md,
                    timeout=20,
                ),
            )
        await asyncio.sleep(rng.uniform(0.0, 0.02))


async def list_all(broker) -> dict[str, cb.Reservation]:
    out: dict[str, cb.Reservation] = {}
    token = ""
    while True:
        resp = await broker.ListReservations(
            cb.ListReservationsRequest(page_size=500, page_token=token)
        )
        out.update((r.reservation_id, r) for r in resp.reservations)
        token = resp.next_page_token
        if not token:
            return out


def double_booked(listed: dict[str, cb.Reservation]) -> list[str]:
    """Moments at which a device has more cores reserved than it has."""
    edges: dict[str, list[tuple[int, int]]] = {}
    for r in listed.values():
        if r.state not in LIVE_STATES:
            continue
        for device, cores, start, end in allocations(r):
            edges.setdefault(device, []).extend([(start, cores), (end, -cores)])
    found = []
    for device, points in edges.items():
        in_use = 0
        for at, delta in sorted(points, key=lambda p: (p[0], p[1])):  # ends before starts
            in_use += delta
            if in_use > CORES:
                found.append(f"{device} has {in_use} of {CORES} cores reserved at {at} ms")
                break
    return found


async def check(broker, app_md, seen: Reservations) -> tuple[int, list[str]]:
    """(lost, problems): acknowledged reservations missing, and everything else wrong."""
    lost, problems = 0, []
    for rid, granted in seen.acked.items():
        try:
            r = await broker.GetReservation(
                cb.GetReservationRequest(reservation_id=rid), metadata=app_md
            )
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                lost += 1
                problems.append(f"reservation {rid} acknowledged, not in the broker")
                continue
            raise
        if r.state not in DEFINITE:
            problems.append(f"reservation {rid} is {cb.ReservationState.Name(r.state)}")
        if rid in seen.released and r.state != cb.RESERVATION_STATE_RELEASED:
            problems.append(f"reservation {rid} released, now {cb.ReservationState.Name(r.state)}")
        if rid in seen.release_unknown and r.state == cb.RESERVATION_STATE_RELEASED:
            continue
        if rid not in seen.released and allocations(r) != granted:
            problems.append(f"reservation {rid} granted {granted}, now {allocations(r)}")
    problems += double_booked(await list_all(broker))
    return lost, problems
