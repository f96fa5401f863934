"""Reservation decisions of the broker service (seed 001 ¶21-27, ¶33-55): pure
functions of a capacity map and requests, no I/O.

* `PriorityFunction` (CB-3, ¶34) maps a request's task type, QoS level,
  billing model and priority hint to a 0..1 score and a level.
* `decide` (CB-4, CB-5) decides requests together in descending priority:
  GRANTED — every core at the window's start (or now, if later);
  PARTIAL — what is free then plus the remainder from the earliest time it
  frees ("80 cores now, 120 in 15 s", ¶24, Fig. 3);
  DEFERRED — every core from a later start inside the window (Fig. 4);
  REJECTED — with the earliest start at which every core could be had.
  Each request says which of PARTIAL and DEFERRED it accepts; GRANTED is
  always accepted and preferred, then PARTIAL, then DEFERRED.
* Placement (CB-7, ¶27) chooses devices: spread, pack, nearest, task-type
  affinity, lowest latency.

No grant ever puts more cores on a device at any instant than it has (CB-9):
grants are cut from `CapacityMap.free_over`, the minimum free over the whole
interval, and each grant is assumed into the working map before the next
request is decided. A grant lies inside its request's window.

A request may spread over several devices; each part holds its cores for the
request's full duration from its own start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from lightpath.errors import FieldViolation, InvalidArgument, NotFound
from lightpath_services.core_broker.capacity import (
    DEVICE_KINDS,
    MAX_SPAN_MS,
    Allocation,
    CapacityMap,
)


class Outcome(StrEnum):
    GRANTED = "GRANTED"
    PARTIAL = "PARTIAL"
    DEFERRED = "DEFERRED"
    REJECTED = "REJECTED"


class Placement(StrEnum):
    SPREAD = "SPREAD"
    PACK = "PACK"
    NEAREST = "NEAREST"
    AFFINITY = "AFFINITY"
    LOWEST_LATENCY = "LOWEST_LATENCY"


QOS_LEVELS = ("BEST_EFFORT", "STANDARD", "PREMIUM")
BILLING_MODELS = ("SPOT", "ON_DEMAND", "COMMITTED")
LESSER_OUTCOMES = frozenset({Outcome.PARTIAL, Outcome.DEFERRED})


@dataclass(frozen=True)
class CoreRequest:
    """A request for cores (CB-3, ¶21, ¶33). Times in ms since the epoch."""

    reservation_id: str
    cores: int
    duration_ms: int
    earliest_start: int | None = None  # None: now
    latest_end: int | None = None  # None: no limit
    task_type: str = ""
    priority_hint: int = 50
    qos_level: str = "STANDARD"
    billing_model: str = "ON_DEMAND"
    site: str = ""
    location: tuple[float, float] | None = None
    placement: Placement | None = None  # None: the broker's default
    accept: frozenset[Outcome] = LESSER_OUTCOMES
    device_kind: str = ""  # "": any kind
    device_ids: tuple[str, ...] = ()  # (): any device
    application_id: str = ""


# -- priority (CB-3, ¶34) ------------------------------------------------------


@dataclass(frozen=True)
class Priority:
    """A level (LOW, MEDIUM, HIGH: common.proto's PriorityClass) and a 0..1 score."""

    level: str
    score: float


def parse_weights(raw: str) -> dict[str, float]:
    """`"vision=1,training=0.2,*=0.5"` → a dict; each weight must lie in 0..1."""
    out: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in raw.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{item!r} must look like name=weight")
        weight = float(value)
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"weight of {name.strip()!r} must lie in 0..1")
        out[name.strip()] = weight
    return out


def default_task_weights() -> dict[str, float]:
    # ¶34: computer vision ranks above ML training.
    return {
        "computer-vision": 1.0,
        "video-analytics": 0.9,
        "nlp": 0.7,
        "inference": 0.6,
        "graphics": 0.5,
        "training": 0.2,
        "*": 0.5,
    }


def default_qos_weights() -> dict[str, float]:
    return {"PREMIUM": 1.0, "STANDARD": 0.6, "BEST_EFFORT": 0.2}


def default_billing_weights() -> dict[str, float]:
    return {"COMMITTED": 1.0, "ON_DEMAND": 0.6, "SPOT": 0.1}


def default_mix() -> dict[str, float]:
    return {"hint": 0.4, "task": 0.2, "qos": 0.25, "billing": 0.15}


@dataclass(frozen=True)
class PriorityFunction:
    """score = Σ mix[f] · weight_f(request) / Σ mix, over f in hint, task, qos,
    billing; hint weight = priority_hint / 100; a task type missing from
    `task_types` weighs `task_types["*"]` (else 0.5). Level: HIGH from 2/3,
    MEDIUM from 1/3, else LOW."""

    mix: Mapping[str, float] = field(default_factory=default_mix)
    task_types: Mapping[str, float] = field(default_factory=default_task_weights)
    qos_levels: Mapping[str, float] = field(default_factory=default_qos_weights)
    billing_models: Mapping[str, float] = field(default_factory=default_billing_weights)

    def __post_init__(self) -> None:
        unknown = set(self.mix) - {"hint", "task", "qos", "billing"}
        if unknown:
            raise ValueError(f"mix names {sorted(unknown)} unknown: use hint, task, qos, billing")
        if sum(self.mix.values()) <= 0:
            raise ValueError("mix weights must not all be 0")
        for name, table, known in (
            ("QoS", self.qos_levels, QOS_LEVELS),
            ("billing", self.billing_models, BILLING_MODELS),
        ):
            bad = set(table) - set(known)
            if bad:
                raise ValueError(f"{name} names {sorted(bad)} unknown: use {', '.join(known)}")

    def __call__(self, r: CoreRequest) -> Priority:
        parts = {
            "hint": r.priority_hint / 100.0,
            "task": self.task_types.get(r.task_type, self.task_types.get("*", 0.5)),
            "qos": self.qos_levels.get(r.qos_level, 0.0),
            "billing": self.billing_models.get(r.billing_model, 0.0),
        }
        total = sum(self.mix.values())
        score = sum(self.mix.get(k, 0.0) * v for k, v in parts.items()) / total
        score = min(1.0, max(0.0, score))
        level = "HIGH" if score >= 2 / 3 else "MEDIUM" if score >= 1 / 3 else "LOW"
        return Priority(level, round(score, 6))


# -- validation against the capacity map (X-3) --------------------------------


def validate_request(
    capacity: CapacityMap, r: CoreRequest, *, now: int, max_duration_ms: int
) -> None:
    """Raise InvalidArgument / NotFound naming the field and the rule a request breaks."""
    bad: list[FieldViolation] = []
    if r.cores <= 0:
        bad.append(FieldViolation("cores", "must be > 0"))
    if r.duration_ms <= 0:
        bad.append(FieldViolation("duration", "must be > 0"))
    elif r.duration_ms > max_duration_ms:
        bad.append(FieldViolation("duration", f"must be at most {max_duration_ms / 1000:g} s"))
    start = max(now, r.earliest_start or now)
    if r.latest_end is not None and r.duration_ms > 0 and r.latest_end - start < r.duration_ms:
        bad.append(
            FieldViolation(
                "window",
                "must be at least duration long: latest_end - max(earliest_start, now) "
                f"is {(r.latest_end - start) / 1000:g} s, duration {r.duration_ms / 1000:g} s",
            )
        )
    if r.earliest_start is not None and r.earliest_start - now > MAX_SPAN_MS // 2:
        bad.append(FieldViolation("window.earliest_start", "is too far in the future"))
    if not 0 <= r.priority_hint <= 100:
        bad.append(FieldViolation("priority_hint", "must lie in 0..100"))
    if r.device_kind and r.device_kind not in DEVICE_KINDS:
        bad.append(FieldViolation("device_kind", "unknown device kind"))
    policy = r.placement
    if policy is Placement.NEAREST and r.location is None:
        bad.append(FieldViolation("client_location", "is required by placement NEAREST"))
    if policy is Placement.LOWEST_LATENCY and not r.site:
        bad.append(
            FieldViolation("client_location.site", "is required by placement LOWEST_LATENCY")
        )
    if policy is Placement.AFFINITY and not r.task_type:
        bad.append(FieldViolation("task_type", "is required by placement AFFINITY"))
    if bad:
        raise InvalidArgument.of(bad)
    for device_id in r.device_ids:
        if capacity.index_of(device_id) is None:
            raise NotFound("device", device_id)
    eligible = eligible_devices(capacity, r)
    total = int(capacity.cores[eligible].sum())
    if r.cores > total:
        where = (
            "the named devices"
            if r.device_ids
            else f"every {r.device_kind} device"
            if r.device_kind
            else "every device"
        )
        raise InvalidArgument("cores", f"must be at most {total}, the cores of {where}")


def eligible_devices(capacity: CapacityMap, r: CoreRequest) -> np.ndarray:
    mask = capacity.kind_mask(r.device_kind or None)
    if r.device_ids:
        named = np.zeros_like(mask)
        for device_id in r.device_ids:
            i = capacity.index_of(device_id)
            if i is not None:
                named[i] = True
        mask = mask & named
    return mask


# -- decisions -----------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What the broker answered one request (CB-4)."""

    request: CoreRequest
    priority: Priority
    outcome: Outcome
    decided_at: int
    allocations: tuple[Allocation, ...] = ()
    earliest_possible_start: int | None = None
    summary: str = ""

    @property
    def granted(self) -> bool:
        return self.outcome is not Outcome.REJECTED

    @property
    def start(self) -> int | None:
        return min((a.start for a in self.allocations), default=None)

    @property
    def end(self) -> int | None:
        return max((a.end for a in self.allocations), default=None)

    @property
    def cores_at_start(self) -> int:
        start = self.start
        return sum(a.cores for a in self.allocations if a.start == start)


@dataclass(frozen=True)
class Group:
    """Requests decided as one unit when `all_or_nothing` (every one GRANTED, or all REJECTED)."""

    requests: tuple[CoreRequest, ...]
    all_or_nothing: bool = False


def decide(
    capacity: CapacityMap,
    groups: Sequence[Group],
    *,
    now: int,
    priority: PriorityFunction,
    default_placement: Placement = Placement.SPREAD,
    keep: bool = False,
) -> list[tuple[Decision, ...]]:
    """Decide `groups` together (CB-5): in descending priority (an all-or-nothing
    group ranks by its highest member), ties in the order given. Returns the
    decisions per group, in the order of its requests. `capacity` is left as
    it was (grants are tried on it and taken back) unless `keep`: then every
    grant stays assumed in it, for the caller to settle once it knows which
    were stored (`CapacityMap.settle` to the savepoint taken before). Requests
    must have passed `validate_request`."""
    # Grants are assumed into the map itself and taken back at the end (a
    # savepoint, not a copy): deciding costs nothing per live reservation.
    work = capacity
    mark = work.savepoint()
    try:
        out = _decide_all(work, groups, now, priority, default_placement, keep)
    except BaseException:
        work.rollback(mark)
        raise
    if not keep:
        work.rollback(mark)
    return out


def _decide_all(
    work: CapacityMap,
    groups: Sequence[Group],
    now: int,
    priority: PriorityFunction,
    default_placement: Placement,
    keep: bool,
) -> list[tuple[Decision, ...]]:
    items: list[tuple[float, int, int, int | None]] = []
    prios = [[priority(r) for r in g.requests] for g in groups]
    for gi, g in enumerate(groups):
        if g.all_or_nothing and len(g.requests) > 1:
            items.append((max(p.score for p in prios[gi]), len(items), gi, None))
        else:
            for j in range(len(g.requests)):
                items.append((prios[gi][j].score, len(items), gi, j))
    items.sort(key=lambda it: (-it[0], it[1]))
    out: list[list[Decision | None]] = [[None] * len(g.requests) for g in groups]
    last = len(items) - 1
    for n, (_, _, gi, ri) in enumerate(items):
        g = groups[gi]
        if ri is not None:
            d = _decide_one(work, g.requests[ri], prios[gi][ri], now, default_placement)
            # the last grant: nothing decided after it sees it (unless it is kept)
            if d.granted and (keep or n < last):
                work.assume(d.allocations)
            out[gi][ri] = d
            continue
        # All or nothing: members in priority order, GRANTED only, taken back unless all are.
        trial = work.savepoint()
        order = sorted(range(len(g.requests)), key=lambda i: -prios[gi][i].score)
        decided: dict[int, Decision] = {}
        for i in order:
            d = _decide_one(
                work, g.requests[i], prios[gi][i], now, default_placement, accept=frozenset()
            )
            decided[i] = d
            if not d.granted:
                break
            work.assume(d.allocations)
        if len(decided) == len(order) and all(d.granted for d in decided.values()):
            for i, d in decided.items():
                out[gi][i] = d
        else:
            work.rollback(trial)
            failed = next(i for i in order if i in decided and not decided[i].granted)
            for i, r in enumerate(g.requests):
                earliest = _earliest_full_start(work, r, now)
                why = "all or nothing: " + (
                    f"{g.requests[failed].reservation_id} cannot be granted now"
                    if i != failed
                    else decided[failed].summary
                )
                out[gi][i] = Decision(
                    r, prios[gi][i], Outcome.REJECTED, now, (), earliest, summary=why
                )
    return [tuple(d for d in row if d is not None) for row in out]


def decide_one(
    capacity: CapacityMap,
    request: CoreRequest,
    *,
    now: int,
    priority: PriorityFunction,
    default_placement: Placement = Placement.SPREAD,
) -> Decision:
    return decide(
        capacity,
        [Group((request,))],
        now=now,
        priority=priority,
        default_placement=default_placement,
    )[0][0]


def _free(work: CapacityMap, eligible: np.ndarray, start: int, duration: int) -> np.ndarray:
    return work.offers(start, start + duration, eligible)


def _earliest_full_start(work: CapacityMap, r: CoreRequest, now: int) -> int:
    eligible = eligible_devices(work, r)
    t0 = max(now, r.earliest_start or now)
    if int(_free(work, eligible, t0, r.duration_ms).sum()) >= r.cores:
        return t0
    found = work.earliest_start(r.cores, r.duration_ms, t0, None, eligible, no_start_at_after=True)
    assert found is not None, "a validated request fits once every reservation has ended"
    return found[0]


def _decide_one(
    work: CapacityMap,
    r: CoreRequest,
    prio: Priority,
    now: int,
    default_placement: Placement,
    *,
    accept: frozenset[Outcome] | None = None,
) -> Decision:
    accept = r.accept if accept is None else accept
    duration = r.duration_ms
    t0 = max(now, r.earliest_start or now)
    last_start = None if r.latest_end is None else r.latest_end - duration
    in_window = last_start is None or t0 <= last_start
    eligible = eligible_devices(work, r)
    ranker = _Ranker(work, r, r.placement or default_placement)
    need = r.cores
    free0 = _free(work, eligible, t0, duration)
    have = int(free0.sum())

    def grant(outcome: Outcome, parts: list[Allocation]) -> Decision:
        return Decision(r, prio, outcome, now, tuple(parts), summary=summary_of(parts, now))

    if in_window and have >= need:
        return grant(Outcome.GRANTED, ranker.place(free0, need, t0, duration))
    if in_window and Outcome.PARTIAL in accept and have > 0:
        first = ranker.place(free0, have, t0, duration)
        mark = work.savepoint()
        work.assume(first)
        try:
            # every core free at t0 is in `first`: t0 is no start of the rest
            found = work.earliest_start(
                need - have, duration, t0, last_start, eligible, no_start_at_after=True
            )
        finally:
            work.rollback(mark)
        if found is not None:
            t1, free1 = found
            return grant(Outcome.PARTIAL, first + ranker.place(free1, need - have, t1, duration))
    # when could every core be had? (the deferred start, or the rejection's answer)
    if have >= need:
        full = t0
    else:
        found = work.earliest_start(need, duration, t0, None, eligible, no_start_at_after=True)
        assert found is not None, "a validated request fits once every reservation has ended"
        full, free_full = found
        fits = last_start is None or full <= last_start
        if in_window and fits and Outcome.DEFERRED in accept:
            return grant(Outcome.DEFERRED, ranker.place(free_full, need, full, duration))
    if last_start is not None and full > last_start:
        why = ", after the window's latest end" if in_window else ", but the window has passed"
    else:
        why = "; DEFERRED not accepted"
    return Decision(
        r,
        prio,
        Outcome.REJECTED,
        now,
        (),
        full,
        summary=f"all {need} cores {_when(full, now)}{why}",
    )


class _Ranker:
    """Placement (CB-7): which devices, in which order.

    A request goes to the one device the policy ranks first among those that
    hold it whole; if none does, it is filled across devices in the policy's
    fill order. Ties fall to the device id, so replicas decide alike.
      spread         — the device left with the largest free share; fill: most free first
      pack           — the device left with the fewest free cores; fill: most free first
      nearest        — the closest device; fill: by distance
      affinity       — devices listing the task type first, then spread
      lowest latency — the lowest latency from the client's site; fill: by latency
    """

    def __init__(self, work: CapacityMap, r: CoreRequest, policy: Placement):
        self.policy = policy
        self.rank = work.rank
        self.cores = work.cores
        self.ids = work.device_at
        self.primary: np.ndarray | None = None
        if policy is Placement.NEAREST and r.location is not None:
            self.primary = work.distance_from(*r.location)
        elif policy is Placement.LOWEST_LATENCY:
            self.primary = work.latency_from(r.site)
        elif policy is Placement.AFFINITY:
            self.primary = (~work.affinity_mask(r.task_type)).astype(np.int64)

    def place(self, free: np.ndarray, need: int, start: int, duration: int) -> list[Allocation]:
        cand = np.flatnonzero(free > 0)
        f = free[cand]
        holds = f >= need
        parts: list[tuple[int, int]] = []
        if holds.any():
            c = cand[holds]
            parts.append((int(c[self._single(c, free[c], need)]), need))
        else:
            left = need
            for i in cand[self._fill(cand, f)].tolist():
                take = min(int(free[i]), left)
                parts.append((i, take))
                left -= take
                if left == 0:
                    break
            assert left == 0, "placement asked for more cores than are free"
        return [
            Allocation(self.ids(i).device_id, cores, start, start + duration)
            for i, cores in sorted(parts, key=lambda p: int(self.rank[p[0]]))
        ]

    def _single(self, c: np.ndarray, f: np.ndarray, need: int) -> int:
        left = f - need
        if self.policy is Placement.PACK:
            keys: tuple[np.ndarray, ...] = (left,)
        elif self.primary is None:
            keys = (-left / self.cores[c],)
        else:
            keys = (self.primary[c], -left / self.cores[c])
        return _argbest((*keys, self.rank[c]))

    def _fill(self, c: np.ndarray, f: np.ndarray) -> np.ndarray:
        if self.primary is None:
            return np.lexsort((self.rank[c], -f))
        return np.lexsort((self.rank[c], -f, self.primary[c]))


def _argbest(keys: tuple[np.ndarray, ...]) -> int:
    """Index of the smallest entry by keys[0], ties by keys[1], ... (lexsort's
    first element, by successive filtering)."""
    idx = np.arange(keys[0].shape[0])
    for k in keys:
        sub = k[idx]
        idx = idx[sub == sub.min()]
        if idx.shape[0] == 1:
            break
    return int(idx[0])


def _when(t: int, now: int) -> str:
    return "now" if t <= now else f"in {_span(t - now)}"


def _span(ms: int) -> str:
    if ms < 1000:
        return f"{ms} ms"
    s = ms / 1000
    if s < 120:
        return f"{s:.3g} s"
    if s < 7200:
        return f"{s / 60:.3g} min"
    return f"{s / 3600:.3g} h"


def summary_of(parts: Sequence[Allocation], at: int) -> str:
    """For people: the cores of `parts` and when, relative to `at` (the decision's time):
    "30 cores now, 20 more in 15 s (on 2 devices, 60 s each)". Derived from the parts as
    they are, so an extended or released reservation reads as it now is (issue 19)."""
    by_start: dict[int, int] = {}
    for a in parts:
        by_start[a.start] = by_start.get(a.start, 0) + a.cores
    starts = sorted(by_start)
    devices = len({a.device_id for a in parts})
    where = f"on {devices} device{'s' if devices != 1 else ''}"
    spans = sorted({a.end - a.start for a in parts})
    duration = _span(spans[0]) if len(spans) == 1 else f"{_span(spans[0])} to {_span(spans[-1])}"
    if len(starts) > 1:
        first = by_start[starts[0]]
        later = ", ".join(f"{by_start[t]} more {_when(t, at)}" for t in starts[1:])
        return f"{first} cores {_when(starts[0], at)}, {later} ({where}, {duration} each)"
    return f"{by_start[starts[0]]} cores {_when(starts[0], at)} for {duration} ({where})"
