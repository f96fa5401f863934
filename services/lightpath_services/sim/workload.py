"""Workloads for the simulator: a trace file, or a generated one (issue 29).

A trace is CSV (a header row) or JSON lines (one object a line), with the fields

    arrival     seconds from the start of the run (>= 0)
    tenant      who submitted it (any word; reported per job)
    shape       the slice in chips, "4x4x8" (a JSON list [4, 4, 8] too)
    twisted     true / false (optional, default false)
    duration    seconds of work at the full shape (> 0)
    priority    1..100 (optional, default 50 = MEDIUM)
    preemption  delay / terminate / shrink (optional, default delay)
    shrink_to   with shrink: smaller shapes in chips, "4x4x4;4x4x8"
    estimate    the user's estimate of the duration, seconds (optional, default the
                duration): what EASY backfill plans with
    id          a job id (optional, default j<line>)

Every row goes through the workload scheduler's own request checks
(lightpath.domain.jobs.normalize, against the simulated pod), so a shape the pod
cannot take is refused with the service's words. A bad row (an impossible shape, a
negative duration, an unknown field, a value that is not a number) is reported with
its line number; it is skipped, or the whole trace is refused (`strict`).

The generator draws shapes from the TPU v4 Table 2 slice mix (lightpath/slice_mix.py),
arrivals from a Poisson process at a chosen offered load, and durations from a sample
of real job durations (lightpath/data/philly_durations.csv, see lightpath/data/README.md):

    offered load = (sum over jobs of chips x duration) / (run length x chips of the cell)
    arrival rate = load x chips of the cell / E[chips x duration]

then the arrival times are scaled so that the drawn sample offers exactly the asked
load over its run (first to last arrival): with heavy-tailed durations a sample's own
load strays far from the mean (a 3,000-job sample at 0.95 offered 1.09).
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import lightpath
from lightpath.domain.blocks import PodFabric
from lightpath.domain.jobs import NormalizedSpec, normalize
from lightpath.domain.slices import DELAY, SHRINK, TERMINATE
from lightpath.errors import InvalidArgument
from lightpath.slice_mix import load as load_mix
from lightpath.v1 import common_pb2, workload_scheduler_pb2

# The trace data ships with the client (lightpath/data), beside the slice mix.
DURATIONS = Path(lightpath.__file__).resolve().parent / "data" / "philly_durations.csv"
FIELDS = (
    "arrival",
    "tenant",
    "shape",
    "twisted",
    "duration",
    "priority",
    "preemption",
    "shrink_to",
    "estimate",
    "id",
)
REQUIRED = ("arrival", "shape", "duration")
POLICIES = {"delay": DELAY, "terminate": TERMINATE, "shrink": SHRINK}
_POLICY_ENUM = {DELAY: 2, TERMINATE: 1, SHRINK: 3}
DEFAULT_PRIORITY = 50


@dataclass(frozen=True)
class TraceJob:
    """One job of a workload, normalised against the simulated pod's fabric."""

    job_id: str
    arrival_s: float
    tenant: str
    chips: tuple[int, ...]
    twisted: bool
    duration_s: float
    priority: int
    preemption: str
    norm: NormalizedSpec = field(compare=False, repr=False)
    estimate_s: float = 0.0  # 0: the duration
    shrink_to: tuple[tuple[int, ...], ...] = ()

    @property
    def chip_count(self) -> int:
        return math.prod(self.chips)

    @property
    def estimate(self) -> float:
        return self.estimate_s or self.duration_s


@dataclass(frozen=True)
class BadRow:
    line: int
    why: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.why}"


class TraceError(Exception):
    """A trace refused as a whole (strict mode, or unreadable)."""

    def __init__(self, problems: list[BadRow]):
        self.problems = problems
        super().__init__("; ".join(map(str, problems[:5])) + ("; …" if len(problems) > 5 else ""))


def parse_shape(raw: object) -> tuple[int, ...]:
    if isinstance(raw, list):
        dims = raw
    elif isinstance(raw, str):
        dims = [p for p in raw.strip().lower().split("x")]
    else:
        raise ValueError(f"shape {raw!r} is not like 4x4x8")
    try:
        out = tuple(int(d) for d in dims)
    except (TypeError, ValueError):
        raise ValueError(f"shape {raw!r} is not like 4x4x8") from None
    if not out or any(d < 1 for d in out):
        raise ValueError(f"shape {raw!r}: every extent must be >= 1")
    return out


def _bool(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    s = str(raw).strip().lower()
    if s in ("", "0", "false", "no", "n"):
        return False
    if s in ("1", "true", "yes", "y"):
        return True
    raise ValueError(f"twisted {raw!r} is not true or false")


def _number(name: str, raw: object) -> float:
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name} {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} {raw!r} is not a finite number")
    return value


class Normalizer:
    """normalize() of the workload scheduler, cached per distinct request."""

    def __init__(self, fabric: PodFabric):
        self.fabric = fabric
        self._cache: dict[tuple, NormalizedSpec | str] = {}

    def __call__(
        self,
        chips: tuple[int, ...],
        twisted: bool,
        priority: int,
        preemption: str,
        shrink_to: tuple[tuple[int, ...], ...] = (),
    ) -> NormalizedSpec:
        key = (chips, twisted, priority, preemption, shrink_to)
        got = self._cache.get(key)
        if got is None:
            spec = workload_scheduler_pb2.JobSpec(
                job_id="sim",
                shape=common_pb2.Shape(dims=chips),
                twisted=twisted,
                priority=priority,
                preemption_policy=_POLICY_ENUM[preemption],  # type: ignore[arg-type]
                shrink_to=[common_pb2.Shape(dims=s) for s in shrink_to],
            )
            try:
                got = normalize(spec, self.fabric)
            except InvalidArgument as err:
                got = err.message
            self._cache[key] = got
        if isinstance(got, str):
            raise ValueError(got)
        return got


def job_from_fields(fields: dict[str, object], line: int, normalizer: Normalizer) -> TraceJob:
    """One row as a TraceJob, or ValueError saying what is wrong with it."""
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown field {', '.join(unknown)} (fields: {', '.join(FIELDS)})")
    missing = [f for f in REQUIRED if fields.get(f) in (None, "")]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    arrival = _number("arrival", fields["arrival"])
    if arrival < 0:
        raise ValueError(f"arrival {arrival:g} is negative")
    duration = _number("duration", fields["duration"])
    if duration <= 0:
        raise ValueError(f"duration {duration:g} must be > 0 seconds")
    estimate = 0.0
    if fields.get("estimate") not in (None, ""):
        estimate = _number("estimate", fields["estimate"])
        if estimate <= 0:
            raise ValueError(f"estimate {estimate:g} must be > 0 seconds")
    priority = DEFAULT_PRIORITY
    if fields.get("priority") not in (None, ""):
        p = _number("priority", fields["priority"])
        if p != int(p) or not 1 <= p <= 100:
            raise ValueError(f"priority {fields['priority']!r} must be an integer 1..100")
        priority = int(p)
    raw_policy = str(fields.get("preemption") or "delay").strip().lower()
    if raw_policy not in POLICIES:
        raise ValueError(f"preemption {raw_policy!r} must be delay, terminate or shrink")
    policy = POLICIES[raw_policy]
    shrink: tuple[tuple[int, ...], ...] = ()
    raw_shrink = fields.get("shrink_to")
    if raw_shrink not in (None, ""):
        parts = raw_shrink if isinstance(raw_shrink, list) else str(raw_shrink).split(";")
        shrink = tuple(parse_shape(p) for p in parts)
    chips = parse_shape(fields["shape"])
    twisted = _bool(fields.get("twisted", False))
    norm = normalizer(chips, twisted, priority, policy, shrink)
    job_id = str(fields.get("id") or f"j{line}")
    return TraceJob(
        job_id=job_id,
        arrival_s=arrival,
        tenant=str(fields.get("tenant") or "-"),
        chips=chips,
        twisted=twisted,
        duration_s=duration,
        priority=priority,
        preemption=policy,
        norm=norm,
        estimate_s=estimate,
        shrink_to=shrink,
    )


def _rows(text: str, name: str) -> Iterable[tuple[int, dict[str, object] | str]]:
    """(line number, fields or why the line cannot be read) per data row."""
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    if name.endswith((".jsonl", ".json", ".ndjson")) or first.lstrip().startswith("{"):
        for n, ln in enumerate(text.splitlines(), 1):
            if not ln.strip():
                continue
            try:
                obj = json.loads(ln)
            except json.JSONDecodeError as err:
                yield n, f"not JSON: {err.msg}"
                continue
            yield n, obj if isinstance(obj, dict) else "not a JSON object"
        return
    reader = csv.reader(io.StringIO(text))
    header: list[str] | None = None
    for row in reader:
        n = reader.line_num
        if not row or not any(c.strip() for c in row) or row[0].lstrip().startswith("#"):
            continue
        if header is None:
            header = [h.strip().lower() for h in row]
            continue
        if len(row) != len(header):
            yield n, f"{len(row)} values for {len(header)} columns"
            continue
        yield n, {h: v.strip() for h, v in zip(header, row, strict=True) if h or v.strip()}


def read_trace(
    path: Path | str, fabric: PodFabric, *, strict: bool = False
) -> tuple[list[TraceJob], list[BadRow]]:
    """The jobs of a trace file, in arrival order, and its bad rows (skipped). With
    `strict`, any bad row refuses the whole trace (TraceError lists them)."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise TraceError([BadRow(0, f"cannot read {path}: {err}")]) from None
    return parse_trace(text, fabric, name=path.name, strict=strict)


def parse_trace(
    text: str, fabric: PodFabric, *, name: str = "", strict: bool = False
) -> tuple[list[TraceJob], list[BadRow]]:
    normalizer = Normalizer(fabric)
    jobs: list[TraceJob] = []
    bad: list[BadRow] = []
    seen: set[str] = set()
    for line, fields in _rows(text, name):
        if isinstance(fields, str):
            bad.append(BadRow(line, fields))
            continue
        try:
            job = job_from_fields(fields, line, normalizer)
        except ValueError as err:
            bad.append(BadRow(line, str(err)))
            continue
        if job.job_id in seen:
            bad.append(BadRow(line, f"id {job.job_id} is used by an earlier row"))
            continue
        seen.add(job.job_id)
        jobs.append(job)
    if strict and bad:
        raise TraceError(bad)
    jobs.sort(key=lambda j: j.arrival_s)
    return jobs, bad


def write_trace(jobs: Iterable[TraceJob], path: Path) -> None:
    """A workload as a CSV trace (what `lightpath sim generate` writes)."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "arrival", "tenant", "shape", "twisted", "duration", "priority",
                    "preemption", "estimate"])  # fmt: skip
        for j in jobs:
            w.writerow(
                [
                    j.job_id,
                    f"{j.arrival_s:.3f}",
                    j.tenant,
                    "x".join(map(str, j.chips)),
                    str(j.twisted).lower(),
                    f"{j.duration_s:.3f}",
                    j.priority,
                    j.preemption.lower(),
                    f"{j.estimate_s:.3f}" if j.estimate_s else "",
                ]
            )


# -- the generator -------------------------------------------------------------------


def load_durations(path: Path = DURATIONS) -> list[float]:
    out = []
    for ln in path.read_text().splitlines():
        ln = ln.strip()
        if ln and not ln.startswith("#") and ln[0].isdigit():
            out.append(float(ln))
    return out


@dataclass(frozen=True)
class Generator:
    """The Table 2 mix at an offered load. `priorities`: (priority, share) pairs
    (default one class); `tenants`: how many tenants jobs are spread over;
    `estimate_error`: estimates are the duration times a factor drawn uniformly in
    [1, 1 + estimate_error] (users overestimate; 0: exact)."""

    load: float
    jobs: int
    seed: int = 1
    chips: int = 4096  # of the whole cell
    priorities: tuple[tuple[int, float], ...] = ((DEFAULT_PRIORITY, 1.0),)
    tenants: int = 8
    estimate_error: float = 0.0
    max_duration_s: float = 0.0  # cap the sampled durations (0: none)

    def generate(self, fabric: PodFabric) -> list[TraceJob]:
        if self.load <= 0:
            raise ValueError("offered load must be > 0")
        _, shapes = load_mix()
        durations = load_durations()
        if self.max_duration_s:
            durations = [min(d, self.max_duration_s) for d in durations]
        total = sum(s.share_pct for s in shapes)
        mean_chips = sum(s.share_pct * s.chip_count for s in shapes) / total
        mean_duration = sum(durations) / len(durations)
        # shapes and durations are drawn independently: E[chips x d] = E[chips] E[d]
        rate = self.load * self.chips / (mean_chips * mean_duration)
        rng = random.Random(self.seed)
        normalizer = Normalizer(fabric)
        weights = [s.share_pct for s in shapes]
        prios = [p for p, _ in self.priorities]
        pweights = [w for _, w in self.priorities]
        t = 0.0
        out = []
        for i in range(self.jobs):
            t += rng.expovariate(rate)
            shape = rng.choices(shapes, weights)[0]
            duration = rng.choice(durations)
            priority = rng.choices(prios, pweights)[0] if len(prios) > 1 else prios[0]
            estimate = duration * (1 + rng.random() * self.estimate_error)
            norm = normalizer(shape.chips, shape.twisted, priority, DELAY)
            out.append(
                TraceJob(
                    job_id=f"j{i + 1}",
                    arrival_s=t,
                    tenant=f"t{rng.randrange(self.tenants) + 1}",
                    chips=shape.chips,
                    twisted=shape.twisted,
                    duration_s=duration,
                    priority=priority,
                    preemption=DELAY,
                    norm=norm,
                    estimate_s=estimate if self.estimate_error else 0.0,
                )
            )
        return _at_load(out, self.load, self.chips)


def _at_load(jobs: list[TraceJob], load: float, chips: int) -> list[TraceJob]:
    """The drawn jobs with their arrival times scaled so that the sample offers exactly
    `load`: chip-seconds asked ÷ (first to last arrival x chips). Heavy-tailed durations
    make a sample's load stray far from the mean the arrival rate was set from (a few
    jobs of weeks decide it)."""
    if len(jobs) < 2:
        return jobs
    asked = sum(j.chip_count * j.duration_s for j in jobs)
    span = jobs[-1].arrival_s - jobs[0].arrival_s
    if span <= 0:
        return jobs
    factor = asked / (load * chips * span)
    first = jobs[0].arrival_s
    return [replace(j, arrival_s=first + (j.arrival_s - first) * factor) for j in jobs]


def bursty_tenants(
    jobs: list[TraceJob],
    tenants: Sequence[str],
    *,
    periods: int = 6,
    burst: float = 4.0,
    seed: int = 1,
) -> list[TraceJob]:
    """The same jobs spread over `tenants` in bursts: the arrival window is cut into
    `periods` equal spans and in each one tenant in turn submits `burst` times as many
    jobs as each of the others (quotas and fair share, docs/sim.md)."""
    if not jobs or not tenants:
        return jobs
    rng = random.Random(f"bursts-{seed}")
    first, last = jobs[0].arrival_s, jobs[-1].arrival_s
    span = max(last - first, 1e-9)
    out = []
    for j in jobs:
        period = min(periods - 1, int(periods * (j.arrival_s - first) / span))
        weights = [burst if i == period % len(tenants) else 1.0 for i in range(len(tenants))]
        out.append(replace(j, tenant=rng.choices(list(tenants), weights)[0]))
    return out
