"""Admission control: shed or queue load instead of collapsing (issue 14).

What is shed and what never is, the two lanes, the settings and what a refused caller
sees: docs/security.md, "Under overload". Why it is built so:

  * A refusal at once with RESOURCE_EXHAUSTED / OVERLOADED and a retry delay keeps the
    admitted calls' latency, instead of every call slowing down until all time out.
  * Health checks, reflection and GetInfo are never shed (probes must see an
    overloaded service as alive), nor streams (a slot held for a stream's life would
    starve unary calls), nor calls between services: the front door already bounded
    them, and a refusal between services would read as a domain answer (the cell reads
    a pod's RESOURCE_EXHAUSTED as "no room on this pod").
  * Freeing calls (FREEING_METHODS) have a lane of their own (issue 30, as Kubernetes'
    API priority and fairness): a flood of submits never queues or sheds the calls
    that would free the capacity the submits wait for.
  * The limit adapts to how long admitted calls take (issue 30, as Envoy's adaptive
    concurrency and Netflix's limiters). Time waited in this queue is not counted:
    counted, it made queued calls look slow and lowered the limit, a loop toward
    MIN_SLOTS under overload. A call refused further down as too busy
    (DOWNSTREAM_BUSY) counts as slow, as a drop does for Netflix: otherwise the cell
    let in submits the pod then refused after they were planned and claimed (271 of
    1,262 refusals at 2x in the bench).
  * The queue's wait is bounded as CoDel bounds a packet's (RFC 8289): a queue that
    empties now and then absorbs a burst; a standing one (not empty for STANDING_S)
    lets a call wait at most `queue_target_s`.
  * The limiter is a counter and a deque of futures (a free slot costs no await), and
    whether a call would be refused (`would_refuse`, `refusal_now`) is known before it
    costs anything: at 4x the load most calls are refused, each for about what a
    GetInfo costs (bench/refusal_cost.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Callable

from lightpath.security.identity import CONSOLE_SERVICE, SERVICE, Principal
from lightpath_services.common.errors import ResourceExhausted

log = logging.getLogger("lightpath.admission")

# Unary methods never shed, whoever calls them: what keeps the system consistent.
EXEMPT_METHODS = frozenset(
    {
        "/lightpath.v1.CellScheduler/RegisterPod",
        "/lightpath.v1.CellScheduler/ReportPodStatus",
        "/lightpath.v1.AggSwitch/ReportLoad",
        "/lightpath.v1.AggSwitch/JoinCommand",
    }
)
EXEMPT_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")

# Unary methods (by name, in any service) that end or shrink work: the freeing lane.
FREEING_METHODS = frozenset(
    {
        "CompleteJob",
        "CancelJob",
        "ReleaseSlice",
        "ReleaseRings",
        "ReleaseReservation",
        "AbortCommand",
        "CancelGraphRun",
    }
)

OVERLOADED = "OVERLOADED"
# What a pod answers a no-wait admission it is too busy to decide soon (the workload
# scheduler's pass lock): relayed by the cell, it counts as a drop (module doc).
POD_BUSY = "POD_BUSY"
# Refusals from further down meaning "too busy", not "no": a call answered so lowers
# the limit as a slow one does.
DOWNSTREAM_BUSY = frozenset({POD_BUSY})
# The adaptive limit never goes below this many slots (module doc).
MIN_SLOTS = 4
# A queue not empty for this long is a standing one: calls then wait at most
# queue_target_s (module doc; CoDel's interval, a few calls' service time).
STANDING_S = 1.0
# Why a call finding every slot taken and no place to wait is refused.
FULL = "its wait queue is full"
# How often, at most, shedding is logged (one warning with the count, not a line per call).
LOG_EVERY_S = 10.0


def sheddable(method: str, *, streaming: bool) -> bool:
    """Whether calls of `method` go through admission at all (decided once per method)."""
    return not (
        streaming
        or method.startswith(EXEMPT_PREFIXES)
        or method.endswith("/GetInfo")
        or method in EXEMPT_METHODS
    )


def frees_capacity(method: str) -> bool:
    """Whether `method` (`/package.Service/Method`) ends or shrinks work."""
    return method.rpartition("/")[2] in FREEING_METHODS


def exempt_principal(principal: Principal | None) -> bool:
    """Calls from Lightpath services are never shed (see the module docstring), but for the
    web console's: it reads for people at browsers, like any outside caller."""
    return (
        principal is not None
        and principal.kind == SERVICE
        and not principal.is_service(CONSOLE_SERVICE)
    )


class RefusalRate:
    """The share of recent calls refused (about the last `window_s`: two buckets of half
    of it), for retry delays that grow with it: a caller refused while most are
    comes back later, so retries never become most of the load (issue 30)."""

    def __init__(self, window_s: float = 2.0, clock: Callable[[], float] = time.monotonic):
        self.half = window_s / 2
        self._clock = clock
        self._start = clock()
        self._now = [0, 0]  # admitted, refused in the current bucket
        self._before = [0, 0]  # ... in the one before

    def _roll(self) -> None:
        now = self._clock()
        if now - self._start >= self.half:
            self._before = self._now if now - self._start < 2 * self.half else [0, 0]
            self._now = [0, 0]
            self._start = now

    def record(self, refused: bool) -> None:
        self._roll()
        self._now[1 if refused else 0] += 1

    def fraction(self) -> float:
        self._roll()
        admitted = self._now[0] + self._before[0]
        refused = self._now[1] + self._before[1]
        return refused / (admitted + refused) if admitted + refused else 0.0

    def delay(self, base: float, cap: float = 10.0) -> float:
        """`base` jittered by up to +50 %, divided by the square of the share admitted (at
        least 5 %). With a share s admitted, about 1/s callers compete for each slot: one
        told base/s came back while they still did and was refused again, so under a
        steady overload most calls were such retries, each a refusal taking CPU from the
        calls served (4.6 refusals per job served at 4x). Told base/s², a caller returns
        about when its turn can come, or gives up: in bench/chaos.py's overload at the
        same offered load, a third to a half fewer refusals, more goodput at 2x and 4x,
        and recovery in 1 s instead of 4 (docs/benchmarks.md)."""
        share = max(0.05, 1.0 - self.fraction())
        return round(min(cap, base * (1.0 + 0.5 * random.random()) / share**2), 3)


class _Waiter:
    """A call in the queue: its future (the slot, when set) and when it came."""

    __slots__ = ("fut", "since")

    def __init__(self, fut: asyncio.Future[None], since: float):
        self.fut = fut
        self.since = since


class Admission:
    """At most `max_inflight` admitted calls at once, `max_queued` more waiting up to
    `queue_wait_s` each (`queue_target_s` once the queue stands); beyond that `acquire`
    raises ResourceExhausted (OVERLOADED) with a retry delay. Every successful
    `acquire` must be paired with one `release`."""

    def __init__(
        self,
        max_inflight: int,
        max_queued: int,
        queue_wait_s: float,
        *,
        service: str = "service",
        freeing_slots: int | None = None,
        target_s: float = 0.0,
        queue_target_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if max_inflight < 1:
            raise ValueError("max_inflight must be >= 1")
        if min(max_queued, queue_wait_s, target_s, queue_target_s) < 0:
            raise ValueError("max_queued, queue_wait_s, target_s and queue_target_s must be >= 0")
        self.max_inflight = max_inflight
        self.max_queued = max_queued
        self.queue_wait_s = queue_wait_s
        self.service = service
        self.target_s = target_s  # 0: a fixed limit of max_inflight
        # 0: every queued call may wait queue_wait_s (no standing-queue bound)
        self.queue_target_s = min(queue_target_s, queue_wait_s)
        self._clock = clock
        self.limit = float(max_inflight)
        self._lowered_at = -float("inf")
        self.inflight = 0
        self.shed = 0  # calls refused since start
        self._waiters: deque[_Waiter] = deque()
        self._busy_since: float | None = None  # when the queue last stopped being empty
        self._logged_at = -float("inf")
        self._shed_since_log = 0
        self.rate = RefusalRate()
        if freeing_slots is None:
            freeing_slots = max(4, max_inflight // 4)
        self.min_limit = float(min(max_inflight, MIN_SLOTS))
        # The freeing lane (module doc); 0: none (every call in this one).
        self.freeing: FreeingLane | None = (
            FreeingLane(self, freeing_slots, max_queued, queue_wait_s, service=service)
            if freeing_slots > 0
            else None
        )

    def lane(self, method: str) -> Admission:
        """The limiter calls of `method` go through."""
        if self.freeing is not None and frees_capacity(method):
            return self.freeing
        return self

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> None:
        """Take a slot, waiting for one in the queue if need be; ResourceExhausted if
        the queue is full or no slot came free within the wait (`queue_wait_s`, or
        `queue_target_s` while the queue stands)."""
        if self._free():
            self.inflight += 1
            self.rate.record(False)
            return
        if self._full():
            raise self._refusal(FULL)
        now = self._clock()
        if not self._waiters:
            self._busy_since = now
        wait_s = self.queue_target_s if self.standing(now) else self.queue_wait_s
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(fut, now)
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(wait_s):
                await fut
        except TimeoutError:
            if self._granted(fut):
                self.rate.record(False)
                return  # the slot came at the deadline: keep it
            refused = fut.exception() if fut.done() and not fut.cancelled() else None
            if refused is not None:
                raise refused from None  # refused at the head at the deadline
            self._forget(waiter)
            raise self._refusal(f"no call finished within {wait_s:g} s") from None
        except BaseException:
            # Cancelled (the caller went away, its deadline passed): give back what it got;
            # refused at the head of a standing queue (`release`): nothing to give back.
            if self._granted(fut):
                Admission.release(self)  # this lane's own slot (a subclass counts its own)
            else:
                self._forget(waiter)
            raise
        self.rate.record(False)

    def _free(self) -> bool:
        """Whether a call arriving now is served at once."""
        return self.inflight < self.slots and not self._waiters

    def _full(self) -> bool:
        """Whether a call arriving now that is not served at once has no place to wait."""
        return len(self._waiters) >= self.queue_places or self.queue_wait_s == 0

    def would_refuse(self) -> bool:
        """Whether a call arriving now is refused at once (every slot taken, no place
        to wait): what `acquire` would do, asked before the call costs anything."""
        return not self._free() and self._full()

    def refusal_now(self) -> ResourceExhausted | None:
        """The refusal a call arriving now gets at once, counted as `acquire` counts
        one, or None when the call would be served or may wait (then `acquire` it).
        The server asks before it opens a span or raises anything for the call: at 4x
        the load most calls are refused, and what a refusal costs is CPU taken from
        the calls served (issue 30)."""
        return self._refusal(FULL) if self.would_refuse() else None

    def standing(self, now: float) -> bool:
        """Whether the queue has not been empty for STANDING_S (module doc): more is
        offered than served, so a call waits at most `queue_target_s`."""
        return (
            self.queue_target_s > 0
            and self._busy_since is not None
            and now - self._busy_since >= STANDING_S
        )

    @property
    def slots(self) -> int:
        """Calls served at once now: the adaptive limit (module doc)."""
        return int(self.limit)

    @property
    def queue_places(self) -> int:
        """Calls that may wait now: with an adaptive limit, no more than it serves at
        once (a longer queue would hold its last call past the target)."""
        return min(self.max_queued, self.slots) if self.target_s else self.max_queued

    def observe(self, took_s: float, *, dropped: bool = False) -> None:
        """A call admitted here was served in `took_s` (from its slot to its answer, the
        wait in the queue left out: module doc), or `dropped` (refused further down as
        too busy): adapt the limit."""
        if not self.target_s:
            return
        if took_s > self.target_s or dropped:
            now = self._clock()
            if now - self._lowered_at >= self.target_s:
                self.limit = max(self.min_limit, self.limit * 0.75)
                self._lowered_at = now
        elif 2 * self.inflight >= self.limit:
            # Raised only while at least half of it is in use (as Netflix's AIMD limit):
            # a light load that never tests the limit would raise it all the same, and
            # the next overload would find it high and take seconds of slow calls to
            # bring it down.
            self.limit = min(float(self.max_inflight), self.limit + 1.0 / self.limit)

    def release(self) -> None:
        """Give a slot back: to the oldest waiter still waiting (unless the limit fell
        below the calls in progress), else to the pool. In a standing queue a waiter
        that waited longer than `queue_target_s` is refused instead, and the slot goes
        on to the next (CoDel drops at the head)."""
        now = self._clock()
        standing = self.standing(now)
        while self._waiters and self.inflight <= self.slots:
            waiter = self._waiters.popleft()
            if waiter.fut.done():
                continue
            if standing and now - waiter.since > self.queue_target_s:
                waiter.fut.set_exception(
                    self._refusal(
                        f"it waited {now - waiter.since:.2g} s in a queue that has not "
                        f"emptied for {STANDING_S:g} s"
                    )
                )
                continue
            waiter.fut.set_result(None)  # the slot passes on: inflight unchanged
            self._emptied()
            return
        self.inflight -= 1
        self._emptied()

    def _emptied(self) -> None:
        if not self._waiters:
            self._busy_since = None

    @staticmethod
    def _granted(fut: asyncio.Future[None]) -> bool:
        return fut.done() and not fut.cancelled() and fut.exception() is None

    def _forget(self, waiter: _Waiter) -> None:
        waiter.fut.cancel()
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass
        self._emptied()

    def retry_delay_s(self) -> float:
        """When a refused caller should come back: about one queue wait (by then the
        calls in progress and queued now have been served or refused), jittered by
        up to +50 % so refused callers do not all return at the same instant, and
        longer the more of the recent calls were refused (RefusalRate)."""
        return self.rate.delay(max(self.queue_wait_s, 0.1))

    def _refusal(self, why: str) -> ResourceExhausted:
        self.rate.record(True)
        self.shed += 1
        self._shed_since_log += 1
        now = self._clock()
        if now - self._logged_at >= LOG_EVERY_S:
            log.warning(
                "%s is overloaded: shed %d call(s) since the last such warning (%d in "
                "progress of %d, %d queued; LIGHTPATH_MAX_INFLIGHT=%d, LIGHTPATH_MAX_QUEUED=%d)",
                self.service,
                self._shed_since_log,
                self.inflight,
                self.slots,
                len(self._waiters),
                self.max_inflight,
                self.max_queued,
                extra={"shed": self._shed_since_log},
            )
            self._logged_at = now
            self._shed_since_log = 0
        delay = self.retry_delay_s()
        return ResourceExhausted(
            f"{self.service} is overloaded ({self.inflight} calls in progress of "
            f"{self.slots}, "
            f"{len(self._waiters)} waiting; {why}); nothing was done, retry in {delay:g} s",
            reason=OVERLOADED,
            retry_delay_s=delay,
            metadata={"service": self.service},
        )


class FreeingLane(Admission):
    """The freeing calls' own slots and queue (module doc). A call takes a free slot of
    the new-work lane first (when nobody waits for one), so with no load the lanes
    together serve as many calls as before; `release` gives each slot back to the lane
    it came from."""

    def __init__(
        self, general: Admission, slots: int, max_queued: int, queue_wait_s: float, *, service: str
    ):
        super().__init__(slots, max_queued, queue_wait_s, service=service, freeing_slots=0)
        self.general = general
        self.borrowed = 0  # calls in progress on a slot of the new-work lane

    def would_refuse(self) -> bool:
        return not self.general._free() and super().would_refuse()

    async def acquire(self) -> None:
        g = self.general
        if g._free():
            g.inflight += 1
            self.borrowed += 1
            return
        await super().acquire()

    def release(self) -> None:
        # Which slot a finished call held does not matter, only how many of each are
        # held: a borrowed one goes back first (new work may be waiting for it).
        if self.borrowed:
            self.borrowed -= 1
            self.general.release()
        else:
            super().release()

    def _refusal(self, why: str) -> ResourceExhausted:
        return super()._refusal(f"calls that end or release work: {why}")
