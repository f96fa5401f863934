"""The Redis store is the arbiter (CB-9): hypothesis drives the real Lua scripts
with reservations decided on two views that are deliberately left stale (the
commit told, or not, which state each was decided on), plus
releases, extensions and expiry sweeps at arbitrary times. Whatever the
interleaving, no device is ever over its cores at any instant of the stored
history, every grant lies in its window, and a view that catches up equals
what Redis holds."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from lightpath_services.common import redis_store
from lightpath_services.core_broker.broker import pending_reservation
from lightpath_services.core_broker.capacity import Device
from lightpath_services.core_broker.decisions import (
    CoreRequest,
    Group,
    Outcome,
    PriorityFunction,
    decide,
)
from lightpath_services.core_broker.store import BrokerStore
from lightpath_services.core_broker.view import LiveView, device_doc
from tests.core_broker.test_replicas import over_commits

DEVICES = {"d0": 6, "d1": 8}
T0 = 1_800_000_000_000

ops = st.one_of(
    st.tuples(
        st.just("reserve"),
        st.integers(0, 1),  # which view decides
        st.integers(2, 8),  # cores
        st.integers(1, 20),  # duration
        st.integers(0, 10),  # delay of the window's start
        st.sampled_from([frozenset(), frozenset({Outcome.PARTIAL, Outcome.DEFERRED})]),
        st.booleans(),  # say which state it was decided on (as the broker does)
    ),
    st.tuples(st.just("sync"), st.integers(0, 1)),
    st.tuples(st.just("release"), st.integers(0, 40)),
    st.tuples(st.just("extend"), st.integers(0, 40), st.integers(1, 20)),
    st.tuples(st.just("extend"), st.integers(0, 40), st.integers(1, 20)),
    st.tuples(st.just("advance"), st.integers(1, 12)),
)


async def run(redis_url: str, sequence) -> None:
    r = redis_store.connect(redis_url)
    try:
        await r.flushall()
        store = BrokerStore(r, retention_ms=3_600_000)
        for dev, cores in DEVICES.items():
            await store.upsert_device(dev, device_doc(Device(dev, "GPU", cores)))
        views = [LiveView(store), LiveView(store)]
        for v in views:
            await v.load()
        now = T0
        made: list[str] = []
        windows: dict[str, tuple[int, int | None]] = {}
        prio = PriorityFunction()
        for n, op in enumerate(sequence):
            if op[0] == "reserve":
                _, vi, cores, duration, delay, accept, say_seen = op
                rid = f"r{n}"
                req = CoreRequest(rid, cores, duration, earliest_start=now + delay, accept=accept)
                ((d,),) = decide(views[vi].capacity, [Group((req,))], now=now, priority=prio)
                seen = (views[vi].version, views[vi].stream_id) if say_seen else None
                if d.granted:
                    p = pending_reservation(d, "app", "", now)
                    result = await store.commit([([rid], [[p]])], now, seen)
                    _, statuses = result.tickets[0]
                    if statuses == ["ok"]:
                        made.append(rid)
                        windows[rid] = (now + delay, None)
            elif op[0] == "sync":
                await views[op[1]].catch_up()
            elif op[0] == "release" and made:
                await store.release(made[op[1] % len(made)], "app", now)
            elif op[0] == "extend" and made:
                rid = made[op[1] % len(made)]
                got = await store.get(rid)
                assert got is not None
                parts = [p for p in got[0]["parts"] if not p.get("cancelled")]
                if parts:
                    end = max(p["end"] for p in parts) + op[2]
                    await store.extend(rid, "app", end, now)
            elif op[0] == "advance":
                now += op[1]
                await store.reap(now)
        records = [data for data, _ in await store.all_reservations()]
        assert over_commits(records, DEVICES) == []
        for rec in records:
            start, _ = windows[rec["id"]]
            assert all(p["start"] >= start for p in rec["parts"])
        # a view that catches up holds exactly the allocations Redis holds
        for v in views:
            await v.catch_up()
            held = {
                dev: sorted(m for m, _ in await store.device_allocations(dev)) for dev in DEVICES
            }
            mine = {dev: [] for dev in DEVICES}
            for key, a in v.capacity.allocations():
                mine[a.device_id].append(key)
            assert {k: sorted(x) for k, x in mine.items()} == held
    finally:
        await r.aclose()


@settings(max_examples=60)
@given(st.lists(ops, min_size=1, max_size=25))
def test_stale_views_never_get_an_over_commit_past_the_store(redis_url, sequence):
    asyncio.run(run(redis_url, sequence))


def test_a_decision_on_a_stale_view_is_refused_as_a_conflict(redis_url):
    async def body():
        r = redis_store.connect(redis_url)
        store = BrokerStore(r, retention_ms=60_000)
        await store.upsert_device("d0", device_doc(Device("d0", "GPU", 8)))
        a, b = LiveView(store), LiveView(store)
        await a.load()
        await b.load()
        prio = PriorityFunction()
        reqs = [CoreRequest(f"x{i}", 6, 100, earliest_start=T0) for i in range(2)]
        (da,), (db,) = (
            decide(v.capacity, [Group((q,))], now=T0, priority=prio)[0]
            for v, q in zip((a, b), reqs, strict=True)
        )
        assert da.outcome is db.outcome is Outcome.GRANTED  # each view thinks 8 are free
        first = await store.commit([(["x0"], [[pending_reservation(da, "app", "", T0)]])], T0)
        second = await store.commit([(["x1"], [[pending_reservation(db, "app", "", T0)]])], T0)
        assert first.tickets == [("groups", ["ok"])]
        assert second.tickets == [("groups", ["conflict:d0"])]
        assert second.version == 0  # nothing written
        await b.catch_up()
        ((again,),) = decide(b.capacity, [Group((reqs[1],))], now=T0, priority=prio)
        # decided again on fresh state: the 2 cores left now, the rest when x0 ends
        assert again.outcome is Outcome.PARTIAL and again.cores_at_start == 2
        await r.aclose()

    asyncio.run(body())


def test_a_commit_re_reads_only_the_devices_others_added_to_since_its_decision(redis_url):
    """The re-check reads a device's schedule (ZRANGEBYSCORE inside the script,
    counted by Redis's command stats). A commit says which state it was decided
    on: decided on the store's current state it reads none; after other writes it
    reads the devices they added to (and refuses an over-commit there), not the
    devices they only freed cores on or did not touch; after a change of a device's
    record it reads every device it grants on."""

    async def reads(r) -> int:
        stats = await r.info("commandstats")
        return int(stats.get("cmdstat_zrangebyscore", {}).get("calls", 0))

    async def body():
        r = redis_store.connect(redis_url)
        await r.flushall()
        store = BrokerStore(r, retention_ms=60_000)
        for dev in ("d0", "d1"):
            await store.upsert_device(dev, device_doc(Device(dev, "GPU", 8)))
        a, b = LiveView(store), LiveView(store)
        prio = PriorityFunction()

        async def commit(view: LiveView, rid: str, cores: int, device: str):
            req = CoreRequest(rid, cores, 100, earliest_start=T0, device_ids=(device,))
            ((d,),) = decide(view.capacity, [Group((req,))], now=T0, priority=prio)
            assert d.granted
            p = pending_reservation(d, "app", "", T0)
            return await store.commit([([rid], [[p]])], T0, (view.version, view.stream_id))

        await a.load()
        await b.load()
        before = await reads(r)
        first = await commit(a, "x0", 6, "d0")
        assert (first.tickets, first.rechecked) == ([("groups", ["ok"])], False)
        assert await reads(r) == before  # decided on the current state: nothing read
        # b has not seen x0: a grant on d1 (untouched since) is not re-read ...
        on_d1 = await commit(b, "y0", 4, "d1")
        assert (on_d1.tickets, on_d1.rechecked) == ([("groups", ["ok"])], False)
        assert await reads(r) == before
        # ... one on d0, which x0 added to, is: and refused, 6 + 6 > 8
        on_d0 = await commit(b, "y1", 6, "d0")
        assert (on_d0.tickets, on_d0.rechecked) == ([("groups", ["conflict:d0"])], True)
        assert await reads(r) == before + 1
        # a release only frees cores: a view that missed it is not re-read for it
        await a.catch_up()
        await store.release("y0", "app", T0)
        after_release = await commit(a, "x1", 2, "d1")
        assert (after_release.tickets, after_release.rechecked) == ([("groups", ["ok"])], False)
        assert await reads(r) == before + 1
        # a device's record changed (its cores may be fewer): every device is re-read
        await a.catch_up()
        await store.upsert_device("d1", device_doc(Device("d1", "GPU", 4)))
        after_upsert = await commit(a, "x2", 2, "d0")
        assert after_upsert.rechecked and after_upsert.tickets == [("groups", ["ok"])]
        assert await reads(r) == before + 2
        await r.aclose()

    asyncio.run(body())


def test_an_extension_into_taken_cores_is_refused_and_says_how_far_it_could_go(redis_url):
    async def body():
        r = redis_store.connect(redis_url)
        store = BrokerStore(r, retention_ms=60_000)
        await store.upsert_device("d0", device_doc(Device("d0", "GPU", 6)))
        view = LiveView(store)
        await view.load()
        prio = PriorityFunction()
        for i, start in enumerate((0, 10)):
            req = CoreRequest(f"r{i}", 4, 10, earliest_start=T0 + start)
            ((d,),) = decide(view.capacity, [Group((req,))], now=T0, priority=prio)
            ok = await store.commit([([f"r{i}"], [[pending_reservation(d, "app", "", T0)]])], T0)
            assert ok.tickets == [("groups", ["ok"])]
            await view.catch_up()
        refused = await store.extend("r0", "app", T0 + 15, T0)
        assert (refused.status, refused.detail) == ("full", ("d0", str(T0 + 10)))
        got = await store.get("r0")
        assert got is not None and got[0]["parts"][0]["end"] == T0 + 10  # unchanged
        await store.release("r1", "app", T0)
        extended = await store.extend("r0", "app", T0 + 15, T0)
        assert extended.status == "ok" and extended.data is not None
        assert extended.data["parts"][0]["end"] == T0 + 15
        await view.catch_up()
        assert [(k, a.end) for k, a in view.capacity.allocations()] == [
            (f"r0:0:{T0 + 15}:4", T0 + 15)
        ]
        await r.aclose()

    asyncio.run(body())


def test_a_replica_that_did_not_commit_a_reservation_releases_extends_and_sweeps_it(redis_url):
    """Every key a transaction touches is declared: a store declares a reservation's devices
    as it committed them, or as the record it reads first says. Another replica (which
    never saw the commit) and a store whose memory of the devices is wrong still release,
    extend and sweep it, and leave the device's schedule as it should be."""

    async def body():
        r = redis_store.connect(redis_url)
        await r.flushall()
        mine, other = BrokerStore(r, retention_ms=60_000), BrokerStore(r, retention_ms=60_000)
        for dev in ("d0", "d1"):
            await mine.upsert_device(dev, device_doc(Device(dev, "GPU", 8)))
        view = LiveView(mine)
        await view.load()
        prio = PriorityFunction()
        made = []
        for i, dev in enumerate(("d0", "d0", "d1")):
            req = CoreRequest(f"x{i}", 4, 100, earliest_start=T0 + 10, device_ids=(dev,))
            ((d,),) = decide(view.capacity, [Group((req,))], now=T0, priority=prio)
            done = await mine.commit([([f"x{i}"], [[pending_reservation(d, "app", "", T0)]])], T0)
            assert done.tickets == [("groups", ["ok"])]
            await view.catch_up()
            made.append(d.allocations[0].device_id)
        assert made == ["d0", "d0", "d1"]
        extended = await other.extend("x0", "app", T0 + 10 + 150_000, T0)
        assert extended.status == "ok"
        assert extended.data["parts"][0]["end"] == T0 + 10 + 150_000
        mine._devices["x1"] = ["d1"]  # wrong: the transaction says so and it reads again
        assert (await mine.release("x1", "app", T0)).status == "ok"
        assert [m for m, _ in await mine.device_allocations("d0")] == [
            f"x0:0:{T0 + 10 + 150_000}:4"
        ]
        mine._devices["x2"] = ["d0"]  # wrong again: the first sweep skips x2, the next ends it
        assert (await mine.reap(T0 + 200_000))[0] == 2
        assert await mine.device_allocations("d1") != []
        await mine.reap(T0 + 200_000)
        assert await mine.device_allocations("d1") == []
        assert (await mine.get("x2"))[0]["state"] == "ENDED"
        await r.aclose()

    asyncio.run(body())
