"""The reservation path of the broker service (seed 001 Fig. 5, Fig. 6A-6B):
micro-batched decisions committed through Redis, expiry, and watch fan-out.

* `Broker.reserve` queues one caller's requests as a `Ticket`. One worker per
  replica takes every ticket that arrived within the batch window (CB-5, Fig.
  5 op. 506: "more requests received?"), validates them against the live
  view, decides them together in descending priority (`decisions.decide`),
  and commits the grants in one Lua call that re-checks capacity (CB-9).
  Groups refused for a conflict (another replica got there first) are
  decided again on the caught-up view. `Broker.reserve(..., all_or_nothing)`
  is the path graph plans use: one group, granted whole or not at all.
* `Broker.reap_forever` moves due reservations on (CB-6, Fig. 5 ops.
  512-516): parts start, cores return at the end, events go out. It runs on
  every replica; each step is one Lua script, so each transition happens once.
* `WatchHub` hands the events of the change stream (from any replica) to the
  watch streams of this replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from redis.exceptions import RedisError

from lightpath.errors import (
    Aborted,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    LightpathError,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from lightpath_services.core_broker.decisions import (
    CoreRequest,
    Decision,
    Group,
    Placement,
    PriorityFunction,
    decide,
    validate_request,
)
from lightpath_services.core_broker.metrics import BrokerMetrics
from lightpath_services.core_broker.store import (
    BrokerStore,
    Change,
    PendingReservation,
    allocation_member,
)
from lightpath_services.core_broker.view import LiveView

log = logging.getLogger("lightpath.core_broker")

Record = tuple[dict[str, Any], int]  # (reservation JSON, version of its last change)
TERMINAL_EVENTS = frozenset({"RELEASED", "ENDED"})
# The shortest time between two expiry sweeps when changes wake the reaper (it sweeps
# when something falls due, and at least every reaper_interval_s, either way).
EVENT_SWEEP_GAP_S = 0.1


@dataclass(frozen=True)
class BrokerConfig:
    priority: PriorityFunction = field(default_factory=PriorityFunction)
    default_placement: Placement = Placement.SPREAD
    batch_window_s: float = 0.002
    max_batch: int = 64
    max_duration_ms: int = 86_400_000
    reaper_interval_s: float = 1.0
    max_attempts: int = 8


@dataclass
class Ticket:
    """One caller's requests in a decision batch."""

    application_id: str
    groups: list[Group]
    stored_requests: dict[str, str]  # reservation id -> the request as stored (JSON)
    field_prefix: dict[str, str]  # reservation id -> "request" / "requests[3]"
    future: asyncio.Future[list[Record]]
    results: dict[str, Record] = field(default_factory=dict)
    open: list[int] = field(default_factory=list)
    batch_size: int = 0  # requests decided together with these (CB-5)
    rounds: int = 0  # decisions made: more than 1 after a conflict with another replica

    def __post_init__(self) -> None:
        self.open = list(range(len(self.groups)))

    @property
    def done(self) -> bool:
        return self.future.done()

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)

    def finish_if_complete(self) -> None:
        if not self.open and not self.future.done():
            order = [r.reservation_id for g in self.groups for r in g.requests]
            self.future.set_result([self.results[rid] for rid in order])

    def ids(self, groups: Sequence[int]) -> list[str]:
        return [r.reservation_id for gi in groups for r in self.groups[gi].requests]


def cancel_requested() -> bool:
    """True once this task has been asked to stop, even if a library swallowed
    the CancelledError (seen with redis.asyncio under load): background loops
    check it so shutdown never hangs."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def iso(ms: int) -> str:
    """A time in ms since the epoch for people: 2025-01-01T12:00:00.250Z."""
    return (
        datetime.fromtimestamp(ms / 1000, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def fingerprint(stored_request: str) -> str:
    return hashlib.sha256(stored_request.encode()).hexdigest()[:32]


def _prefixed(exc: LightpathError, prefix: str) -> LightpathError:
    if isinstance(exc, InvalidArgument):
        return InvalidArgument.of(
            [FieldViolation(f"{prefix}.{v.field}", v.rule) for v in exc.violations],
            reason=exc.reason,
        )
    return exc


def base_record(d: Decision, application_id: str, stored: str, now: int) -> dict[str, Any]:
    return {
        "id": d.request.reservation_id,
        "app": application_id,
        "outcome": d.outcome.value,
        "priority": {"level": d.priority.level, "score": d.priority.score},
        "summary": d.summary,
        "request": stored,
        "fp": fingerprint(stored),
        "created": now,
    }


def pending_reservation(
    d: Decision, application_id: str, stored: str, now: int
) -> PendingReservation:
    """A granted decision as the record and allocation parts the store commits."""
    rid = d.request.reservation_id
    parts = [
        (a.device_id, a.cores, a.start, a.end, allocation_member(rid, i, a.end, a.cores))
        for i, a in enumerate(d.allocations)
    ]
    # parts that start at once are started by the commit itself (CB-6): no sweep needed
    record = {
        **base_record(d, application_id, stored, now),
        "state": "ACTIVE" if any(start <= now for _, _, start, _, _ in parts) else "SCHEDULED",
        "parts": [
            {
                "dev": dev,
                "cores": cores,
                "start": start,
                "end": end,
                "member": member,
                "started": start <= now,
                "ended": False,
            }
            for dev, cores, start, end, member in parts
        ],
    }
    return PendingReservation(rid, application_id, record, now, parts)


class WatchHub:
    """Local watch streams, fed with the events of every replica (CB-6)."""

    class Subscription:
        def __init__(self, application_id: str | None, reservation_id: str):
            self.application_id = application_id
            self.reservation_id = reservation_id
            self.queue: asyncio.Queue[tuple[str, dict[str, Any], int] | None] = asyncio.Queue(
                maxsize=4096
            )
            self.broken = ""

        def put(self, item: tuple[str, dict[str, Any], int] | None) -> None:
            if self.broken:
                return
            try:
                self.queue.put_nowait(item)
            except asyncio.QueueFull:
                self.broken = "the watch fell behind the broker's events; watch again"
                with contextlib.suppress(asyncio.QueueEmpty):
                    self.queue.get_nowait()
                self.queue.put_nowait(None)

        async def next(self) -> tuple[str, dict[str, Any], int]:
            item = await self.queue.get()
            if item is None:
                raise Aborted(self.broken or "the watch was interrupted; watch again")
            return item

    def __init__(self) -> None:
        self._subs: dict[str | None, set[WatchHub.Subscription]] = {}

    def subscribe(self, application_id: str | None, reservation_id: str = "") -> Subscription:
        sub = WatchHub.Subscription(application_id, reservation_id)
        self._subs.setdefault(application_id, set()).add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.application_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.application_id]

    @property
    def watching(self) -> int:
        return sum(len(s) for s in self._subs.values())

    def dispatch(self, change: Change) -> None:
        if not self._subs:
            return
        for kind, rid, app, data in change.events:
            targets = [*self._subs.get(app, ()), *self._subs.get(None, ())]
            if not targets:
                continue
            record = json.loads(data)
            for sub in targets:
                if not sub.reservation_id or sub.reservation_id == rid:
                    sub.put((kind, record, change.version))

    def reset(self) -> None:
        """The view reloaded after a gap: events may have been missed."""
        for subs in self._subs.values():
            for sub in subs:
                sub.put(None)
                sub.broken = sub.broken or "the broker reloaded its state; watch again"


class _Committed(NamedTuple):
    """What one commit of a round stored: the store's answer, the change stream
    entry it wrote (None: it stored nothing) and each ticket's groups with their
    decisions and what was sent for them."""

    result: Any
    change: Change | None
    plans: list[list[tuple[int, tuple[Decision, ...], list[PendingReservation]]]]
    seen: int  # the view's version decided on


class Broker:
    def __init__(
        self,
        store: BrokerStore,
        view: LiveView,
        config: BrokerConfig,
        *,
        clock: Callable[[], float] = time.time,
        metrics: BrokerMetrics | None = None,
    ):
        self.metrics = metrics or BrokerMetrics.noop()
        self.store = store
        self.view = view
        self.config = config
        self.hub = WatchHub()
        self._clock = clock
        self._queue: asyncio.Queue[Ticket] = asyncio.Queue()
        view.on_events(self.hub.dispatch)
        view.on_reset(self.hub.reset)
        # Set by every change the view applies (this replica's or another's: a
        # reservation made, extended, released or reaped) and by a reload: the
        # reaper's next due time may have moved.
        self._timers_moved = asyncio.Event()
        view.on_events(lambda _change: self._timers_moved.set())
        view.on_reset(self._timers_moved.set)
        self.batches = 0
        self.conflicts = 0

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    # -- reserving ------------------------------------------------------------

    async def reserve(
        self,
        application_id: str,
        requests: Sequence[CoreRequest],
        stored_requests: Sequence[str],
        field_prefixes: Sequence[str],
        *,
        all_or_nothing: bool = False,
        on_decided: Callable[[Ticket], None] | None = None,
    ) -> list[Record]:
        """Decide and commit `requests` of one application; the records in request order.

        Each request is decided on its own unless `all_or_nothing`, where they
        are one group: every one GRANTED, or all REJECTED and nothing stored.
        `on_decided` sees the ticket afterwards (batch size, rounds)."""
        if all_or_nothing:
            groups = [Group(tuple(requests), all_or_nothing=True)]
        else:
            groups = [Group((r,)) for r in requests]
        ticket = Ticket(
            application_id,
            groups,
            {r.reservation_id: s for r, s in zip(requests, stored_requests, strict=True)},
            {r.reservation_id: p for r, p in zip(requests, field_prefixes, strict=True)},
            asyncio.get_running_loop().create_future(),
        )
        started = time.monotonic()
        await self._queue.put(ticket)
        try:
            return await ticket.future
        finally:
            self.metrics.answered(started)
            if on_decided is not None:
                on_decided(ticket)

    async def decide_forever(self) -> None:
        """The decision worker: one batch at a time (a background task)."""
        while not cancel_requested():
            first = await self._queue.get()
            if self.config.batch_window_s > 0 and self._queue.qsize() < self.config.max_batch:
                await asyncio.sleep(self.config.batch_window_s)
            tickets = [first]
            n = len(first.groups)
            while n < self.config.max_batch and not self._queue.empty():
                t = self._queue.get_nowait()
                tickets.append(t)
                n += len(t.groups)
            try:
                await self._decide_batch(tickets)
            except RedisError as exc:
                log.warning("decision batch failed: Redis: %s", exc)
                for t in tickets:
                    t.fail(Unavailable(f"the broker's store is unavailable: {exc}"))
            except Exception as exc:
                log.exception("decision batch failed")
                for t in tickets:
                    t.fail(exc)

    async def _decide_batch(self, tickets: list[Ticket]) -> None:
        self.batches += 1
        pending = [t for t in tickets if not t.done]
        size = sum(len(g.requests) for t in pending for g in t.groups)
        for t in pending:
            t.batch_size = size
        for _ in range(self.config.max_attempts):
            if not pending:
                return
            pending = await self._round(pending)
        for t in pending:
            t.fail(
                Aborted(
                    "concurrent reservations kept taking the cores this request was "
                    "decided for; retry with the same reservation ids"
                )
            )

    async def _round(self, tickets: list[Ticket]) -> list[Ticket]:
        """Decide and commit every open group once; the tickets left open (conflicts)."""
        await self.view.catch_up()
        now = self.now_ms()
        cap = self.view.capacity
        live: list[Ticket] = []
        for t in tickets:
            t.rounds += 1
            try:
                for gi in t.open:
                    for r in t.groups[gi].requests:
                        try:
                            validate_request(
                                cap, r, now=now, max_duration_ms=self.config.max_duration_ms
                            )
                        except LightpathError as exc:
                            raise _prefixed(exc, t.field_prefix[r.reservation_id]) from None
            except LightpathError as exc:
                t.fail(exc)
                continue
            live.append(t)
        if not live:
            return []
        flat = [t.groups[gi] for t in live for gi in t.open]
        # The grants stay assumed in the map until the commit answers: those it stored
        # become its rows there and then (`settle`), the others are taken back. (Meanwhile,
        # one Redis round trip, a read of this replica's capacity counts them already.)
        mark = cap.savepoint()
        decided = decide(
            cap,
            flat,
            now=now,
            priority=self.config.priority,
            default_placement=self.config.default_placement,
            keep=True,
        )
        stored: list[tuple[str, str, int, int, int]] = []
        try:
            done = await self._commit(live, decided, now)
            if done.change is not None:
                stored = [
                    (op[2], op[1], op[3], op[4], op[5]) for op in done.change.ops if op[0] == "+"
                ]
        finally:
            # on the map decided on (the view may have been reloaded meanwhile)
            cap.settle(mark, stored)
        return await self._finish(live, done, now)

    async def _commit(
        self, live: list[Ticket], decided: list[tuple[Decision, ...]], now: int
    ) -> _Committed:
        """Store the grants of `decided` in one Lua call (which re-checks capacity)."""
        payload: list[tuple[list[str], list[list[PendingReservation]]]] = []
        plans: list[list[tuple[int, tuple[Decision, ...], list[PendingReservation]]]] = []
        k = 0
        for t in live:
            plan = []
            groups = []
            for gi in t.open:
                ds = decided[k]
                k += 1
                pend = [self._pending(t, d, now) for d in ds if d.granted]
                plan.append((gi, ds, pend))
                if pend:
                    groups.append(pend)
            plans.append(plan)
            payload.append((t.ids(t.open), groups))
        # the state decided on: Redis is at least here, unless it lost its state
        seen = self.view.version
        result = await self.store.commit(payload, now, (seen, self.view.stream_id))
        change = self._change_of(result, payload) if result.version else None
        return _Committed(result, change, plans, seen)

    async def _finish(self, live: list[Ticket], done: _Committed, now: int) -> list[Ticket]:
        """Answer what the commit settled; the tickets left open (conflicts)."""
        result = done.result
        self.metrics.committed(rechecked=result.rechecked)
        if done.change is not None:
            self.view.note_commit(done.change)
        elif result.current_version < done.seen:
            log.warning(
                "the store is at version %d, behind this view's %d (Redis lost its state?); "
                "reloading",
                result.current_version,
                done.seen,
            )
            await self.view.load()
        still_open: list[Ticket] = []
        for t, plan, (kind, status) in zip(live, done.plans, result.tickets, strict=True):
            if kind == "exists":
                if await self._resolve_existing(t):
                    still_open.append(t)
                continue
            statuses = iter(status)
            reopen = []
            for gi, ds, pend in plan:
                if pend:
                    s = next(statuses)
                    if s != "ok":
                        self.conflicts += 1
                        log.info("reservation conflict on %s; deciding again", s.split(":", 1)[1])
                        reopen.append(gi)
                        continue
                self.metrics.decided(ds)
                for d in ds:
                    if d.granted:
                        p = next(x for x in pend if x.reservation_id == d.request.reservation_id)
                        t.results[d.request.reservation_id] = (p.record, result.version)
                    else:
                        t.results[d.request.reservation_id] = (
                            self._rejected_record(t, d, now),
                            0,
                        )
            t.open = reopen
            t.finish_if_complete()
            if t.open:
                still_open.append(t)
        return still_open

    def _pending(self, t: Ticket, d: Decision, now: int) -> PendingReservation:
        rid = d.request.reservation_id
        return pending_reservation(d, t.application_id, t.stored_requests[rid], now)

    def _rejected_record(self, t: Ticket, d: Decision, now: int) -> dict[str, Any]:
        rid = d.request.reservation_id
        return {
            **base_record(d, t.application_id, t.stored_requests[rid], now),
            "state": "REJECTED",
            "parts": [],
            "earliest": d.earliest_possible_start,
        }

    @staticmethod
    def _change_of(
        result: Any, payload: list[tuple[list[str], list[list[PendingReservation]]]]
    ) -> Change:
        """The stream entry our commit wrote, rebuilt from what was committed."""
        ops: list[list[Any]] = []
        events: list[list[Any]] = []
        for (_, groups), (kind, status) in zip(payload, result.tickets, strict=True):
            if kind != "groups":
                continue
            for group, s in zip(groups, status, strict=True):
                if s != "ok":
                    continue
                for p in group:
                    data = p.payload()
                    for dev, cores, start, end, member in p.parts:
                        ops.append(["+", dev, member, start, end, cores])
                    events.append(["CREATED", p.reservation_id, p.application_id, data["data"]])
                    if p.started:
                        events.append(["STARTED", p.reservation_id, p.application_id, data["data"]])
        return Change(result.stream_id, result.version, parsed_ops=ops, parsed_events=events)

    async def _resolve_existing(self, t: Ticket) -> bool:
        """Some ids of the ticket exist: a retry (X-5) gets the stored records;
        an id of another application or of a different request fails the
        ticket. True if requests are left to decide."""
        ids = t.ids(t.open)
        records = await self.store.get_many(ids)
        found: dict[str, Record] = {}
        for rid, rec in zip(ids, records, strict=True):
            if rec is None:
                continue
            data = rec[0]
            if data.get("app") != t.application_id:
                # Not whose it is (issue 30): only that the id cannot be used.
                t.fail(
                    PermissionDenied(
                        f'reservation id "{rid}" cannot be used; choose another',
                        reason="ID_UNAVAILABLE",
                    )
                )
                return False
            if data.get("fp") != fingerprint(t.stored_requests[rid]):
                t.fail(
                    FailedPrecondition(
                        f'reservation "{rid}"',
                        "exists with a different request; choose a new reservation_id",
                        reason="RESERVATION_ID_REUSED",
                    )
                )
                return False
            found[rid] = rec
        reopen = []
        for gi in t.open:
            rids = [r.reservation_id for r in t.groups[gi].requests]
            have = [rid for rid in rids if rid in found]
            if len(have) == len(rids):
                for rid in rids:
                    t.results[rid] = found[rid]
            elif have:
                t.fail(
                    FailedPrecondition(
                        f'reservation "{have[0]}"',
                        "exists, but not every reservation of its all-or-nothing group does",
                        reason="RESERVATION_ID_REUSED",
                    )
                )
                return False
            else:
                reopen.append(gi)
        t.open = reopen
        t.finish_if_complete()
        return bool(t.open)

    # -- one reservation --------------------------------------------------------

    async def get(self, reservation_id: str, application_id: str | None) -> Record:
        rec = await self.store.get(reservation_id)
        if rec is None:
            raise NotFound("reservation", reservation_id)
        self._check_owner(rec[0], reservation_id, application_id)
        return rec

    @staticmethod
    def _check_owner(data: dict[str, Any], rid: str, application_id: str | None) -> None:
        if application_id is not None and data.get("app") != application_id:
            # Another application's reservation is not there for this one (issue 30).
            raise NotFound("reservation", rid)

    def _script_error(self, rid: str, status: str) -> LightpathError:
        if status == "missing":
            return NotFound("reservation", rid)
        if status == "denied":  # another application's: not there for this one
            return NotFound("reservation", rid)
        return FailedPrecondition(f'reservation "{rid}"', status)

    async def release(self, reservation_id: str, application_id: str | None) -> Record:
        """Early release (CB-6): unused cores return at once."""
        res = await self.store.release(reservation_id, application_id, self.now_ms())
        if res.status == "ended":
            raise FailedPrecondition(
                f'reservation "{reservation_id}"',
                "has already ended; its cores are back",
                reason="RESERVATION_ENDED",
            )
        if res.status not in {"ok", "released"} or res.data is None:
            raise self._script_error(reservation_id, res.status)
        return res.data, res.version

    async def extend(self, reservation_id: str, application_id: str | None, new_end: int) -> Record:
        """Extension when free (CB-6): every unfinished part ends later, or nothing changes."""
        res = await self.store.extend(reservation_id, application_id, new_end, self.now_ms())
        if res.status == "ok" and res.data is not None:
            return res.data, res.version
        if res.status in {"released", "ended"}:
            raise FailedPrecondition(
                f'reservation "{reservation_id}"',
                f"is {res.status.upper()}; only a scheduled or active reservation can be extended",
                reason="RESERVATION_FINISHED",
            )
        if res.status == "shorter":
            raise InvalidArgument(
                "new_end",
                f"must not be before the reservation's current end, {iso(int(res.detail[0]))}",
            )
        if res.status == "full":
            device, limit = res.detail[0], int(res.detail[1])
            raise ResourceExhausted(
                f'reservation "{reservation_id}" cannot be extended to {iso(new_end)}: '
                f"device {device} has its cores only until {iso(limit)}; "
                "extend to at most that",
                reason="CORES_TAKEN",
                metadata={"device_id": device, "latest_end": iso(limit)},
            )
        raise self._script_error(reservation_id, res.status)

    # -- expiry (CB-6) --------------------------------------------------------------

    async def reap_forever(self) -> None:
        """Sweep when the next start or end falls due, when the view applies a change
        (a reservation made or changed meanwhile, on any replica, may fall due sooner
        than the sweep planned for), and at least every `reaper_interval_s`. Idle,
        that is one sweep per interval; busy, a sweep a change wakes comes at least
        EVENT_SWEEP_GAP_S after the last (the old fixed cadence), so a stream of
        changes costs no more sweeps than before. A supervised task: a Redis error
        ends this run, and the supervisor restarts it with backoff."""
        interval = self.config.reaper_interval_s
        gap = min(EVENT_SWEEP_GAP_S, interval)
        loop = asyncio.get_running_loop()
        while not cancel_requested():
            self._timers_moved.clear()  # (before the sweep: a change during it wakes the next)
            swept = loop.time()
            n, nxt = await self.store.reap(self.now_ms())
            if n >= 256:
                continue
            delay = interval
            if nxt is not None:
                delay = min(interval, max(0.002, (nxt - self.now_ms()) / 1000))
            # (asyncio.wait, not wait_for: on Python 3.11 wait_for can swallow a cancellation)
            waiter = asyncio.ensure_future(self._timers_moved.wait())
            try:
                done, _ = await asyncio.wait({waiter}, timeout=delay)
            finally:
                waiter.cancel()
            if done and (rest := swept + min(gap, delay) - loop.time()) > 0:
                await asyncio.sleep(rest)  # woken by a change: not sooner than the gap

    async def follow_forever(self) -> None:
        """Keep the capacity view current (a supervised task, resumed from the view's
        stream position after a failure)."""
        while not cancel_requested():
            await self.view.follow()
