"""A history of acknowledged operations, checked against the final state (issue 32).

Jepsen-style: clients record every operation the system acknowledged (a submit that
answered, a complete or cancel that answered, a reservation granted or released) and,
once the faults are healed, the checker reads the final state and says what was lost
or contradicted:

* `lost` — an acknowledged job (or reservation) the final state does not have;
* `contradicted` — one whose final state is not what was acknowledged: a completed job
  that is not COMPLETED, a cancelled one not CANCELLED, a released reservation still held;
* `undefined` — a job not in a definite state (UNKNOWN, WIRING, or a state of nobody's);
* `double_booked` — a block in two live jobs, or in two slices at the ocs_manager, or a
  slice whose job is not RUNNING (a cross-connect no live job owns).

An operation that timed out or failed with UNAVAILABLE is indeterminate: it is recorded
with `maybe` and never counts as acknowledged (the system may or may not have done it),
but a later acknowledged operation on the same key does. Pure: no gRPC, no Redis; the
caller turns what it read into `Final`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# Job states a job may rest in (common.proto's JobState names, without the prefix).
DEFINITE = frozenset({"PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED"})
FINAL = frozenset({"COMPLETED", "CANCELLED", "FAILED"})
LIVE = frozenset({"WIRING", "RUNNING"})
# What an acknowledged operation promises of the final state (None: only that it exists).
PROMISES: Mapping[str, frozenset[str] | None] = {
    "submit": None,
    "complete": frozenset({"COMPLETED"}),
    "cancel": frozenset({"CANCELLED"}),
    "reserve": None,
    "release": frozenset({"RELEASED"}),
}


@dataclass(frozen=True)
class Op:
    kind: str  # a key of PROMISES
    key: str  # job id or reservation id
    at: float  # when it was acknowledged (the client's monotonic clock)
    answer: str = ""  # the state the acknowledgement said


@dataclass
class Final:
    """The state read after the faults healed: jobs (state, blocks held), the slices at
    the ocs_manager (blocks), reservations (state)."""

    jobs: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    slices: dict[str, tuple[int, ...]] = field(default_factory=dict)
    reservations: dict[str, str] = field(default_factory=dict)


@dataclass
class Report:
    acknowledged: int
    lost: list[str]
    contradicted: list[str]
    undefined: list[str]
    double_booked: list[str]

    @property
    def ok(self) -> bool:
        return not (self.lost or self.contradicted or self.undefined or self.double_booked)

    def details(self, limit: int = 20) -> list[str]:
        return [*self.lost, *self.contradicted, *self.undefined, *self.double_booked][:limit]


@dataclass
class History:
    ops: list[Op] = field(default_factory=list)
    maybe: list[Op] = field(default_factory=list)

    def ack(self, kind: str, key: str, at: float, answer: str = "") -> None:
        if kind not in PROMISES:
            raise ValueError(f"no operation {kind!r}: one of {', '.join(PROMISES)}")
        self.ops.append(Op(kind, key, at, answer))

    def indeterminate(self, kind: str, key: str, at: float) -> None:
        self.maybe.append(Op(kind, key, at))

    def last(self) -> dict[str, Op]:
        """The last acknowledged operation of each key (what the final state must show)."""
        out: dict[str, Op] = {}
        for op in sorted(self.ops, key=lambda o: o.at):
            out[op.key] = op
        return out

    def check(self, final: Final) -> Report:
        lost: list[str] = []
        contradicted: list[str] = []
        for key, op in sorted(self.last().items()):
            reservation = op.kind in ("reserve", "release")
            found = final.reservations.get(key) if reservation else _state(final, key)
            if found is None:
                lost.append(f"{key}: {op.kind} acknowledged, absent from the final state")
                continue
            want = PROMISES[op.kind]
            if want is not None and found not in want:
                contradicted.append(
                    f"{key}: {op.kind} acknowledged, final state {found} (not {'/'.join(want)})"
                )
        undefined = [
            f"{job}: {state}, not a definite state"
            for job, (state, _) in sorted(final.jobs.items())
            if state not in DEFINITE
        ]
        return Report(
            acknowledged=len(self.last()),
            lost=lost,
            contradicted=contradicted,
            undefined=undefined,
            double_booked=double_booked(final),
        )


def _state(final: Final, job: str) -> str | None:
    found = final.jobs.get(job)
    return None if found is None else found[0]


def double_booked(final: Final) -> list[str]:
    """Blocks in two live jobs or two slices, and slices of no RUNNING job."""
    out: list[str] = []
    out += _overlaps(
        "job", ((j, b) for j, (state, b) in sorted(final.jobs.items()) if state in LIVE)
    )
    out += _overlaps("slice", sorted(final.slices.items()))
    for job, blocks in sorted(final.slices.items()):
        state = _state(final, job)
        if state != "RUNNING":
            out.append(f"slice {job} on blocks {list(blocks)} wired, its job {state or 'absent'}")
    return out


def _overlaps(what: str, holders: Iterable[tuple[str, tuple[int, ...]]]) -> list[str]:
    owner: dict[int, str] = {}
    out: list[str] = []
    for job, blocks in holders:
        for b in blocks:
            if b in owner:
                out.append(f"block {b} in {what}s {owner[b]} and {job}")
            else:
                owner[b] = job
    return out
