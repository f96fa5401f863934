"""CB-9 with several replicas: two brokers on one Redis under concurrent load
never reserve more cores on a device than it has, at any instant; expiry and
notifications happen once whichever replica runs them (CB-6)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import grpc

from lightpath.v1 import common_pb2
from lightpath.v1 import core_broker_pb2 as pb
from lightpath_services.common.keys import broker_key
from lightpath_services.core_broker.store import BrokerStore
from tests.core_broker.conftest import OP, Broker, dur, running_broker, ts

DEVICES = {"d0": 12, "d1": 16, "d2": 16, "d3": 20}
POLICIES = [
    pb.PLACEMENT_POLICY_SPREAD,
    pb.PLACEMENT_POLICY_PACK,
    pb.PLACEMENT_POLICY_NEAREST,
    pb.PLACEMENT_POLICY_AFFINITY,
]


def over_commits(records: list[dict], devices: dict[str, int]) -> list[tuple[str, int, int]]:
    """(device, instant, cores) wherever reserved cores exceed the device's, from
    the final record of every reservation (released parts as truncated)."""
    by_dev: dict[str, list[tuple[int, int, int]]] = {}
    for rec in records:
        for p in rec["parts"] if isinstance(rec["parts"], list) else []:
            if not p.get("cancelled") and p["end"] > p["start"]:
                by_dev.setdefault(p["dev"], []).append((p["start"], p["end"], p["cores"]))
    bad = []
    for dev, ivs in by_dev.items():
        for t in {s for s, _, _ in ivs}:
            used = sum(c for s, e, c in ivs if s <= t < e)
            if used > devices[dev]:
                bad.append((dev, t, used))
    return bad


async def worker(
    b: Broker, md, wid: int, rng: random.Random, granted: dict, counts: Counter
) -> None:
    mine: list[str] = []
    for i in range(22):
        roll = rng.random()
        try:
            if roll < 0.65 or not mine:
                rid = f"w{wid}-{i}"
                start = int(time.time() * 1000) + rng.choice([0, 0, 200, 700])
                seconds = rng.uniform(0.2, 2.0)
                r = await b.reserve(
                    md,
                    rid,
                    rng.randint(1, 18),
                    seconds,
                    window=common_pb2.TimeWindow(
                        earliest_start=ts(start),
                        latest_end=ts(start + int((seconds + rng.uniform(1, 4)) * 1000)),
                    ),
                    placement=rng.choice(POLICIES),
                    task_type="vision",
                    client_location=pb.Location(x_km=rng.uniform(0, 10)),
                    accept=rng.choice(
                        [[], [pb.OUTCOME_GRANTED], [pb.OUTCOME_PARTIAL], [pb.OUTCOME_DEFERRED]]
                    ),
                    priority_hint=rng.randint(1, 100),
                )
                counts[pb.Outcome.Name(r.outcome)] += 1
                if r.outcome != pb.OUTCOME_REJECTED:
                    granted[rid] = r
                    mine.append(rid)
            elif roll < 0.75:
                reqs = [
                    pb.ReservationRequest(
                        reservation_id=f"w{wid}-{i}-{k}", cores=rng.randint(1, 8), duration=dur(1)
                    )
                    for k in range(3)
                ]
                resp = await b.stub.BatchReserve(
                    pb.BatchReserveRequest(requests=reqs, all_or_nothing=rng.random() < 0.5),
                    metadata=md,
                )
                for r in resp.reservations:
                    counts[pb.Outcome.Name(r.outcome)] += 1
                    if r.outcome != pb.OUTCOME_REJECTED:
                        granted[r.reservation_id] = r
                        mine.append(r.reservation_id)
            elif roll < 0.88:
                rid = mine.pop(rng.randrange(len(mine)))
                await b.stub.ReleaseReservation(
                    pb.ReleaseReservationRequest(reservation_id=rid), metadata=md
                )
                counts["released"] += 1
            else:
                rid = rng.choice(mine)
                cur = await b.stub.GetReservation(
                    pb.GetReservationRequest(reservation_id=rid), metadata=md
                )
                await b.stub.ExtendReservation(
                    pb.ExtendReservationRequest(
                        reservation_id=rid,
                        new_end=ts(cur.end.ToMilliseconds() + rng.randint(100, 1500)),
                    ),
                    metadata=md,
                )
                counts["extended"] += 1
        except grpc.aio.AioRpcError as err:
            # what concurrency may legitimately answer: no room to extend, or
            # the reservation ended / was released meanwhile; on a loaded machine, a
            # reserve that arrived after its window had become shorter than its duration
            late = (
                err.code() == grpc.StatusCode.INVALID_ARGUMENT
                and "window: must be at least duration long" in (err.details() or "")
            )
            assert late or err.code() in (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                grpc.StatusCode.FAILED_PRECONDITION,
            ), err
            counts[err.code().name] += 1


async def test_two_replicas_under_concurrent_load_never_over_commit(redis_url, redis_client):
    async with running_broker(redis_url) as a, running_broker(redis_url) as b:
        for i, (dev, cores) in enumerate(DEVICES.items()):
            await a.device(
                dev,
                cores,
                location=pb.Location(x_km=float(i * 3)),
                task_affinities=["vision"] if i % 2 else [],
            )
        apps = [await a.app(f"app-{k}") for k in range(6)]
        granted: dict[str, pb.Reservation] = {}
        counts: Counter = Counter()
        await asyncio.gather(
            *(
                worker((a, b)[w % 2], apps[w % len(apps)], w, random.Random(w), granted, counts)
                for w in range(12)
            )
        )
        # every outcome happened, against a contended pool
        assert counts["OUTCOME_GRANTED"] and counts["OUTCOME_REJECTED"]
        assert counts["OUTCOME_PARTIAL"] + counts["OUTCOME_DEFERRED"] > 0
        store = BrokerStore(redis_client, retention_ms=3_600_000)
        records = [data for data, _ in await store.all_reservations()]
        assert {r["id"] for r in records} >= set(granted)
        assert over_commits(records, DEVICES) == []
        # both replicas' views agree with each other and with Redis
        start = int(time.time() * 1000)
        q = pb.QueryCapacityRequest(start=ts(start), end=ts(start + 10_000), include_schedule=True)
        for _ in range(50):
            va, vb = (
                await a.stub.QueryCapacity(q, metadata=OP),
                await b.stub.QueryCapacity(q, metadata=OP),
            )
            if va == vb:
                break
            await asyncio.sleep(0.05)
        assert va == vb
        # let everything end: each reservation ends exactly once, cores all return
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if not await redis_client.zcard(broker_key("timers")):
                break
            await asyncio.sleep(0.1)
        records = [data for data, _ in await store.all_reservations()]
        assert {r["state"] for r in records} <= {"ENDED", "RELEASED"}
        assert await a.free_now() == DEVICES == await b.free_now()
        for dev in DEVICES:
            assert await redis_client.zcard(broker_key("alloc", dev)) == 0
        for replica in (a, b):
            view = await replica.stub.QueryCapacity(q, metadata=OP)
            assert [list(d.schedule) for d in view.devices] == [[]] * len(DEVICES)


async def test_expiry_notifications_reach_a_watch_on_the_other_replica_once(redis_url):
    async with running_broker(redis_url) as a, running_broker(redis_url) as b:
        await a.device("g1", 9)
        app = await a.app("cam")
        # r0 exists before the watch, so the watch opens with it as CURRENT: once that
        # arrives the subscription is live and r1, r2 cannot slip in before it.
        await a.reserve(app, "r0", 1, 30)
        stream = b.stub.WatchReservations(pb.WatchReservationsRequest(), metadata=app)
        first = await stream.read()
        assert (first.reservation.reservation_id, first.type) == (
            "r0",
            pb.RESERVATION_EVENT_TYPE_CURRENT,
        )
        await a.reserve(app, "r1", 4, 0.3)
        await a.reserve(app, "r2", 4, 0.5)
        events = []
        while sum(t == "RESERVATION_EVENT_TYPE_ENDED" for _, t in events) < 2:
            ev = await stream.read()
            events.append((ev.reservation.reservation_id, pb.ReservationEventType.Name(ev.type)))
        stream.cancel()
        for rid in ("r1", "r2"):
            kinds = [t for r, t in events if r == rid]
            # both replicas sweep expiries; each transition is reported exactly once
            assert kinds == [
                "RESERVATION_EVENT_TYPE_CREATED",
                "RESERVATION_EVENT_TYPE_STARTED",
                "RESERVATION_EVENT_TYPE_ENDED",
            ], events
