"""Quotas and fair share in the simulator (issue 35): the cell's quota model
(lightpath_services.cell_scheduler.quota) deciding which waiting job goes next, whether it may
be admitted, and which borrowed jobs are reclaimed for an owner.

With quotas, every job passes the cell (one pod too). A cell pass walks the cell
queue in fair-share order (`fair_order` over the tenants' decayed usage); a job
whose tenant's quota plus what it may borrow does not cover it waits; one that
fits goes to the pod `choose` picks. A job within its tenant's nominal quota that
no pod can take now reclaims: `QuotaBook.reclaim` names borrowers' jobs on one
pod, and each leaves it — terminated, or delayed (a shrinking job is delayed: its
chips are what is needed), paying its checkpoint-restart when it runs again —
before the owner's job goes there. A delayed job goes back to the cell queue at its
first place, its quota charge given back, as the service's pod lets it go (Kueue's
requeue of an evicted workload); the cell may then place it on any pod.

A job holds its tenant's quota from the moment the cell sends it to a pod until it
ends (as the service counts a forwarded or placed job).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lightpath_services.cell_scheduler.quota import (
    DEFAULT_HALF_LIFE_S,
    Quota,
    QuotaBook,
    RunningJob,
    Waiting,
    check_quota,
    decay,
    dominant_share,
    fair_order,
)

NODE_TYPE = "tpu"  # the simulator's pods are all tpu blocks

# Why an owner's job within its nominal waited (`denied_by_cause`): no pod where free
# blocks and borrowers' chips make its chips; some pod has them, but not in jobs of
# tenants still borrowing when their turn came; reclaim named victims but the pod's
# planner would not place it then; none found for it (not offered to reclaim: a pod
# took a job of its, or its turn came after the pass's own changes).
NO_POD_REACH = "no_pod_reach"
NOT_BORROWED = "not_borrowed"
REFUSED_BY_POD = "refused_by_pod"
UNEXPLAINED = "other"


def load_quotas(path: Path) -> list[Quota]:
    """Quotas from a JSON file: a list of objects with `tenant`, `tpu_chips` (nominal),
    and optionally `cohort`, `borrowing_limit` (chips; absent: no limit of its own),
    `lending_limit` and `weight`. Raises ValueError naming the entry and the field."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: {e}") from e
    if not isinstance(raw, list):
        raise ValueError(f"{path}: expected a JSON list of quotas")
    out: list[Quota] = []
    known = {"tenant", "tpu_chips", "cohort", "borrowing_limit", "lending_limit", "weight"}
    for i, q in enumerate(raw):
        where = f"{path} entry {i + 1}"
        if not isinstance(q, dict) or not isinstance(q.get("tenant"), str):
            raise ValueError(f"{where}: needs a 'tenant' name")
        unknown = set(q) - known
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        quota = Quota(
            tenant=q["tenant"],
            nominal={NODE_TYPE: q.get("tpu_chips", 0)},
            cohort=str(q.get("cohort", "")),
            borrowing_limit=_chips(q, "borrowing_limit"),
            lending_limit=_chips(q, "lending_limit"),
            weight=float(q.get("weight", 1.0)),
        )
        bad = check_quota(quota, known_types=[NODE_TYPE])
        if bad:
            raise ValueError(f"{where} ({quota.tenant}): {bad[0].field}: {bad[0].rule}")
        out.append(quota)
    if len({q.tenant for q in out}) != len(out):
        raise ValueError(f"{path}: a tenant has two quotas")
    return out


def _chips(entry: dict, name: str) -> dict[str, int] | None:
    return None if entry.get(name) is None else {NODE_TYPE: entry[name]}


@dataclass
class TenantTrack:
    """One tenant over a run."""

    quota: Quota | None
    held: int = 0  # chips of its admitted jobs now
    decayed: float = 0.0  # decayed chip-seconds (fair share)
    waiting: int = 0  # its jobs in the cell queue now
    smallest_waiting: int = 0  # chips of its smallest waiting job (0: none)
    held_area: float = 0.0  # chip-seconds held inside the window
    asking_s: float = 0.0  # time with a job waiting at the cell
    denied_s: float = 0.0  # ... one that would fit within its nominal quota
    denied_cause: str = ""  # why its smallest waiting job waits (the constants above)
    denied_by: dict[str, float] = field(default_factory=dict)  # denied_s by that cause
    series: list[tuple[float, int]] = field(default_factory=list)


class SimQuotas:
    """The quota state of one simulated cell, and its per-tenant accounting."""

    def __init__(
        self,
        quotas: Iterable[Quota],
        capacity_chips: int,
        half_life_s: float = DEFAULT_HALF_LIFE_S,
    ):
        self.quotas = {q.tenant: q for q in quotas}
        self.book = QuotaBook(self.quotas.values(), {})
        self.capacity = {NODE_TYPE: capacity_chips}
        self.half_life_s = half_life_s
        self.tenants: dict[str, TenantTrack] = {t: TenantTrack(q) for t, q in self.quotas.items()}
        self.admitted: dict[str, tuple[str, int]] = {}  # job -> (tenant, chips)
        self.reclaimed = 0
        self._t = 0.0

    def track(self, tenant: str) -> TenantTrack:
        got = self.tenants.get(tenant)
        if got is None:
            got = self.tenants[tenant] = TenantTrack(None)
        return got

    # -- the clock -------------------------------------------------------------------

    def advance(self, t0: float, t1: float, window: tuple[float, float]) -> None:
        """Integrate every tenant's usage from t0 to t1 (the simulator's clock)."""
        dt = t1 - t0
        if dt <= 0:
            return
        lo, hi = window
        inside = max(0.0, min(t1, hi) - max(t0, lo))
        for tr in self.tenants.values():
            tr.decayed = decay(tr.decayed, tr.held, dt, self.half_life_s)
            if inside:
                tr.held_area += tr.held * inside
                nominal = tr.quota.nominal.get(NODE_TYPE, 0) if tr.quota else 0
                if tr.smallest_waiting:
                    tr.asking_s += inside
                    if tr.held + tr.smallest_waiting <= nominal:
                        tr.denied_s += inside
                        cause = tr.denied_cause or UNEXPLAINED
                        tr.denied_by[cause] = tr.denied_by.get(cause, 0.0) + inside
        self._t = t1

    # -- admission -------------------------------------------------------------------

    def order(self, waiting: list[Waiting]) -> list[Waiting]:
        shares = {
            t: dominant_share(
                {NODE_TYPE: tr.decayed},
                self.capacity,
                tr.quota.weight if tr.quota else 1.0,
                self.half_life_s,
            )
            for t, tr in self.tenants.items()
        }
        weights = {t: (q.weight) for t, q in self.quotas.items()}
        return fair_order(waiting, shares, self.capacity, weights)

    def nominal(self, tenant: str) -> int | None:
        """Chips of `tenant`'s nominal quota (None: it has no quota, nothing limits it)."""
        q = self.quotas.get(tenant)
        return q.nominal.get(NODE_TYPE, 0) if q else None

    def note_waiting(self, waiting: Iterable[Waiting], causes: Mapping[str, str] = {}) -> None:
        """The jobs left in the cell queue after a pass; `causes`: why each owner's job
        within nominal was not placed."""
        for tr in self.tenants.values():
            tr.waiting = 0
            tr.smallest_waiting = 0
            tr.denied_cause = ""
        for w in waiting:
            tr = self.track(w.tenant)
            chips = w.chips[NODE_TYPE]
            tr.waiting += 1
            if not tr.smallest_waiting or chips < tr.smallest_waiting:
                tr.smallest_waiting = chips
                tr.denied_cause = causes.get(w.job_id, "")

    def admit(self, job_id: str, tenant: str, chips: int, now: float) -> None:
        self.book.assume(tenant, {NODE_TYPE: chips})
        self.admitted[job_id] = (tenant, chips)
        tr = self.track(tenant)
        tr.held += chips
        tr.series.append((now, tr.held))

    def release(self, job_id: str, now: float) -> None:
        got = self.admitted.pop(job_id, None)
        if got is None:
            return
        tenant, chips = got
        self.book.forget(tenant, {NODE_TYPE: chips})
        tr = self.track(tenant)
        tr.held -= chips
        tr.series.append((now, tr.held))

    def running(
        self,
        pod_of: dict[str, str],
        priority_of: dict[str, tuple[int, int]],
        block_of: dict[str, int] | None = None,
    ) -> list[RunningJob]:
        """The admitted jobs on pods as reclaim sees them (`block_of`: a sub-block slice's
        block)."""
        out = []
        for job_id, (tenant, chips) in self.admitted.items():
            pod = pod_of.get(job_id)
            if pod is None:
                continue
            prio, seq = priority_of[job_id]
            block = (block_of or {}).get(job_id)
            out.append(RunningJob(job_id, tenant, prio, seq, pod, {NODE_TYPE: chips}, block))
        return out

    # -- the report ------------------------------------------------------------------

    def summary(self, window: tuple[float, float], waits: dict[str, list[float]]) -> dict:
        lo, hi = window
        span = max(hi - lo, 1e-9)
        total = self.capacity[NODE_TYPE]
        out: dict[str, dict] = {}
        for t, tr in sorted(self.tenants.items()):
            nominal = tr.quota.nominal.get(NODE_TYPE, 0) if tr.quota else 0
            w = sorted(waits.get(t, []))
            out[t] = {
                "nominal_chips": nominal,
                "nominal_share": nominal / total,
                "share_held": tr.held_area / (total * span),
                "asking_fraction": tr.asking_s / span,
                # of the time it asked, how long a job of its that fits within its
                # nominal quota waited: 0 means it got its nominal share whenever it asked
                "denied_within_nominal": (tr.denied_s / tr.asking_s) if tr.asking_s else 0.0,
                # the same by why (of the time it asked; they add up to the above)
                "denied_by_cause": {
                    c: s / tr.asking_s for c, s in sorted(tr.denied_by.items()) if tr.asking_s
                },
                "jobs": len(w),
                "mean_wait_s": sum(w) / len(w) if w else 0.0,
                "p99_wait_s": w[min(len(w) - 1, math.ceil(0.99 * len(w)) - 1)] if w else 0.0,
            }
        return {"tenants": out, "reclaimed_jobs": self.reclaimed, "half_life_s": self.half_life_s}

    def series(self) -> dict[str, list[tuple[float, int]]]:
        return {t: tr.series for t, tr in self.tenants.items()}
