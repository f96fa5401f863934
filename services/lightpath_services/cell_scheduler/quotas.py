"""Tenants' quotas in the cell service (issue 35): what an operator sets, checked and
stored, and the cell queue gated and ordered by them.

The decisions are the pure model's (lightpath_services.cell_scheduler.quota); this module
reads the store's rows into a `QuotaState`, turns a resolved job into the chips
per node type it charges its tenant (`charge_of`), and walks the cell queue in
fair-share order (`gate`): a job whose tenant's quota plus what it may borrow
does not cover it stays in the queue with a reason that says so and takes no
place in the plan; the others are planned in that order.

Atomicity: every charge of a tenant with a quota, and every quota change, bumps
the store's quota version; a claim of such a tenant's job expects the version its
decision read, a claim of another's that it still has no quota (store.QuotaGuard,
Conflict QUOTA). So two replicas never admit beyond a quota together (the second
one's claim fails and it decides again with the first one's charge), a decision
made over a cached snapshot from before a quota was set is made again, and tenants
without a quota never conflict over quotas.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from lightpath.domain.slices import shields
from lightpath.errors import FieldViolation, InvalidArgument
from lightpath.security.identity import RESERVED_TENANTS
from lightpath.v1 import cell_scheduler_pb2, workload_scheduler_pb2
from lightpath_services.cell_scheduler.choice import CHIPS_SUFFIX
from lightpath_services.cell_scheduler.quota import (
    DEFAULT_HALF_LIFE_S,
    Hold,
    Quota,
    QuotaBook,
    Reclaim,
    RunningJob,
    Waiting,
    check_quota,
    decay,
    dominant_share,
    fair_order,
)
from lightpath_services.cell_scheduler.request import PodModel, Resolved
from lightpath_services.cell_scheduler.store import QuotaGuard, QuotaRows
from lightpath_services.common.keys import ID_RULE, is_valid_id

WAITING_FOR_QUOTA = "waiting for quota: "
QUOTA_ALLOWS = "queued in the cell: its tenant's quota allows it now; waiting for room"
NEVER_UNDER_QUOTA = "cannot be admitted under its tenant's quota (change the quota or the job): "
# The API's names of the model's fields (check_quota's violations).
_FIELD = {"nominal": "nominal_chips", "borrowing_limit": "borrowing_limit"}


def charge_of(r: Resolved) -> dict[str, int]:
    """Chips per node type a job resolved for a pod holds there: a sub-block slice its
    chips, a slice of blocks its chips split over its blocks' types."""
    out: Counter[str] = Counter()
    blocks = {t: n for t, n in r.needs.items() if not t.endswith(CHIPS_SUFFIX) and n}
    for t, n in r.needs.items():
        if t.endswith(CHIPS_SUFFIX):
            out[t.removesuffix(CHIPS_SUFFIX)] += n
    _split(out, math.prod(r.chips) if r.chips and blocks else 0, blocks)
    return dict(out)


def job_charge(job: workload_scheduler_pb2.Job) -> dict[str, int]:
    """The same for a job as a pod answers it (one found on a pod after a lost answer)."""
    types = Counter(b.node_type for b in job.blocks if b.node_type)
    if not types and job.spec.node_types:
        types[job.spec.node_types[0]] = 1
    out: Counter[str] = Counter()
    _split(out, math.prod(job.chips.dims) if job.chips.dims else 0, types)
    return dict(out)


def _split(out: Counter[str], chips: int, blocks: Mapping[str, int]) -> None:
    total = sum(blocks.values())
    left = chips
    for i, (t, n) in enumerate(sorted(blocks.items())):
        part = left if i == len(blocks) - 1 else chips * n // total
        out[t] += part
        left -= part


def capacity_of(models: Iterable[PodModel]) -> dict[str, int]:
    """The cell's chips per node type (fair share's denominator)."""
    out: Counter[str] = Counter()
    for m in models:
        per_block = math.prod(m.block_shape) if m.block_shape else 0
        for t, n in m.node_types:
            out[t] += n * per_block
    return dict(out)


# -- stored form ---------------------------------------------------------------------


def to_json(q: Quota) -> str:
    return json.dumps(
        {
            "nominal": dict(q.nominal),
            "cohort": q.cohort,
            "borrowing_limit": None if q.borrowing_limit is None else dict(q.borrowing_limit),
            "lending_limit": None if q.lending_limit is None else dict(q.lending_limit),
            "weight": q.weight,
            **({"pod": q.pod} if q.pod else {}),
        },
        sort_keys=True,
    )


def quota_key(tenant: str, pod: str = "") -> str:
    """The quota's field in the store (a pod-scoped one: "<tenant>@<pod>"; ids have no @)."""
    return f"{tenant}@{pod}" if pod else tenant


def from_json(key: str, raw: str) -> Quota:
    d = json.loads(raw)
    tenant, _, pod = key.partition("@")
    return Quota(
        pod=d.get("pod", pod),
        tenant=tenant,
        nominal=d["nominal"],
        cohort=d.get("cohort", ""),
        borrowing_limit=d.get("borrowing_limit"),
        lending_limit=d.get("lending_limit"),
        weight=float(d.get("weight", 1.0)),
    )


@dataclass(frozen=True)
class QuotaState:
    """Quotas, usage and decayed usage as one snapshot read them."""

    version: str
    quotas: Mapping[str, Quota]
    used: Mapping[str, Mapping[str, int]]
    # tenant -> type -> (decayed chip-seconds, when integrated in ms)
    decayed: Mapping[str, Mapping[str, tuple[float, int]]]
    # (tenant, pod) -> its quota on that pod, and the chips it holds there
    pod_quotas: Mapping[tuple[str, str], Quota] = field(default_factory=dict)
    pod_used: Mapping[tuple[str, str], Mapping[str, int]] = field(default_factory=dict)
    hold: Hold | None = None  # the pod held for an owner's job (store's "hold")

    @classmethod
    def of(cls, rows: QuotaRows) -> QuotaState:
        used: dict[str, dict[str, int]] = {}
        pod_used: dict[tuple[str, str], dict[str, int]] = {}
        for k, n in rows.usage.items():
            who, _, t = k.rpartition("|")
            tenant, scoped, pod = who.partition("@")
            if n > 0:
                held = (
                    pod_used.setdefault((tenant, pod), {})
                    if scoped
                    else used.setdefault(tenant, {})
                )
                held[t] = n
        decayed: dict[str, dict[str, tuple[float, int]]] = {}
        for k, v in rows.decayed.items():
            if k.endswith("@"):
                continue
            tenant, _, t = k.rpartition("|")
            at = int(rows.decayed.get(k + "@") or 0)
            decayed.setdefault(tenant, {})[t] = (float(v), at)
        parsed = [from_json(k, raw) for k, raw in rows.quotas.items()]
        quotas = {q.tenant: q for q in parsed if not q.pod}
        pod_quotas = {(q.tenant, q.pod): q for q in parsed if q.pod}
        return cls(rows.version, quotas, used, decayed, pod_quotas, pod_used, rows.hold)

    def keeps_out(self, job_id: str, tenant: str, need: Mapping[str, int]) -> str:
        """The pod the hold keeps job `job_id` of `tenant`'s (`need` chips) out of ("":
        none): the held pod, when the job would borrow (Hold.keeps_out)."""
        if self.hold is None:
            return ""
        return self.hold.keeps_out(job_id, not self.book().check(tenant, need).within_nominal)

    @property
    def active(self) -> bool:
        return bool(self.quotas or self.pod_quotas)

    def book(self) -> QuotaBook:
        return QuotaBook(self.quotas.values(), self.used)

    def tenants(self) -> list[str]:
        return sorted(set(self.quotas) | set(self.used) | {t for t, _ in self.pod_quotas})

    def pods_of(self, tenant: str) -> list[str]:
        """The pods `tenant` has a quota on, by name."""
        return sorted(p for t, p in self.pod_quotas if t == tenant)

    def pod_refusal(
        self, tenant: str, pod: str, need: Mapping[str, int], assumed: Mapping[str, int] = {}
    ) -> str:
        """Why `tenant`'s quota on `pod` does not cover a job of `need` chips there (with
        `assumed` more held: this pass's own charges), "" when it does or there is none."""
        q = self.pod_quotas.get((tenant, pod))
        if q is None:
            return ""
        held = self.pod_used.get((tenant, pod), {})
        for t, n in sorted(need.items()):
            after = held.get(t, 0) + assumed.get(t, 0) + n
            cap = q.nominal.get(t, 0)
            if n and after > cap:
                return (
                    f"{tenant} would hold {after} {t} chips on pod {pod}, "
                    f"{after - cap} over its quota there of {cap}"
                )
        return ""

    def share(self, tenant: str, capacity: Mapping[str, int], now_ms: int) -> float:
        """The tenant's weighted dominant share of decayed usage now (the store integrates
        at every change of what it holds; from then to now it held what it holds)."""
        usage = {}
        for t, (v, at) in self.decayed.get(tenant, {}).items():
            held = self.used.get(tenant, {}).get(t, 0)
            usage[t] = decay(v, held, (now_ms - at) / 1000, DEFAULT_HALF_LIFE_S)
        q = self.quotas.get(tenant)
        return dominant_share(usage, capacity, q.weight if q else 1.0)

    def guard(
        self,
        tenant: str,
        version: str | None = None,
        pod: str = "",
        need: Mapping[str, int] | None = None,
    ) -> QuotaGuard:
        """What a claim of `tenant`'s job of `need` chips on `pod` decided over this
        snapshot expects (`version`: the version as this pass's own charges moved it):
        a job that would borrow, that `pod` is still not held for another job."""
        borrows = need is not None and not self.book().check(tenant, need).within_nominal
        if not self.limits(tenant, pod):
            return QuotaGuard(tenant, None, pod, borrows)
        return QuotaGuard(tenant, self.version if version is None else version, pod, borrows)

    def limits(self, tenant: str, pod: str = "") -> bool:
        """Whether a charge of `tenant` on `pod` changes what may be admitted (it has a
        quota on the cell or on that pod: the store bumps the version)."""
        return tenant in self.quotas or (tenant, pod) in self.pod_quotas


def within_pod_quotas(
    tenant: str, resolved: Mapping[str, Resolved], state: QuotaState
) -> tuple[dict[str, Resolved], str]:
    """The pods where `tenant`'s quota on the pod (if any) covers the job, and, when
    there is none, why (each pod's quota it would exceed)."""
    kept: dict[str, Resolved] = {}
    why: list[str] = []
    for pod, r in resolved.items():
        refusal = state.pod_refusal(tenant, pod, charge_of(r))
        if refusal:
            why.append(refusal)
        else:
            kept[pod] = r
    return kept, "" if kept else "; ".join(sorted(why))


# -- the API's quota, checked --------------------------------------------------------


def quota_from_pb(
    pb: cell_scheduler_pb2.Quota,
    *,
    known_types: Iterable[str],
    quotas: Mapping[str, Quota],
    known_pods: Iterable[str] = (),
) -> Quota:
    """The quota a SetQuota asks for; INVALID_ARGUMENT naming each bad field."""
    bad: list[FieldViolation] = []
    if pb.pod:
        bad.extend(_pod_scope_violations(pb, sorted(known_pods)))
    types = sorted(set(known_types))
    tenant = pb.tenant
    if not is_valid_id(tenant):
        bad.append(FieldViolation("quota.tenant", ID_RULE))
    elif tenant.lower() in RESERVED_TENANTS:
        bad.append(FieldViolation("quota.tenant", f"{tenant!r} is reserved: no tenant has it"))
    if pb.cohort and not is_valid_id(pb.cohort):
        bad.append(FieldViolation("quota.cohort", ID_RULE))
    if pb.no_borrowing and pb.borrowing_limit:
        bad.append(
            FieldViolation("quota.no_borrowing", "give borrowing_limit or no_borrowing, not both")
        )
    borrowing: dict[str, int] | None = dict(pb.borrowing_limit) or None
    if pb.no_borrowing:
        borrowing = {t: 0 for t in types}
    q = Quota(
        tenant=tenant,
        nominal=dict(pb.nominal_chips),
        cohort=pb.cohort,
        borrowing_limit=borrowing,
        lending_limit=dict(pb.lending_limit) or None,
        weight=pb.weight or 1.0,
        pod=pb.pod,
    )
    others: Counter[str] = Counter()
    for other in quotas.values():
        if other.cohort == q.cohort and other.tenant != tenant:
            others.update(other.nominal)
    for v in check_quota(q, known_types=types, cohort_nominal=dict(others) if q.cohort else None):
        name, _, rest = v.field.partition("[")
        path = f"quota.{_FIELD.get(name, name)}" + (f"[{rest}" if rest else "")
        bad.append(FieldViolation(path, v.rule))
    if bad:
        raise InvalidArgument.of(bad)
    return q


def _pod_scope_violations(pb: cell_scheduler_pb2.Quota, pods: list[str]) -> list[FieldViolation]:
    """A pod-scoped quota names a registered pod and caps chips there, nothing more."""
    bad: list[FieldViolation] = []
    if not is_valid_id(pb.pod):
        bad.append(FieldViolation("quota.pod", ID_RULE))
    elif pb.pod not in pods:
        bad.append(
            FieldViolation(
                "quota.pod",
                f"no pod {pb.pod!r} is registered; the cell has " + (", ".join(pods) or "none"),
            )
        )
    why = "a pod-scoped quota caps chips on its pod only (set this on the cell-wide quota)"
    for name, given in (
        ("cohort", pb.cohort),
        ("borrowing_limit", pb.borrowing_limit),
        ("lending_limit", pb.lending_limit),
        ("weight", pb.weight),
    ):
        if given:
            bad.append(FieldViolation(f"quota.{name}", why))
    return bad


def pod_quota_pb(tenant: str, pod: str, state: QuotaState) -> cell_scheduler_pb2.TenantQuota:
    """A tenant's row for its quota on one pod: what it holds there."""
    q = state.pod_quotas[(tenant, pod)]
    out = cell_scheduler_pb2.TenantQuota(
        tenant=tenant, pod=pod, used_chips=dict(state.pod_used.get((tenant, pod), {}))
    )
    out.quota.CopyFrom(quota_pb(q))
    return out


def tenant_quota_pb(
    tenant: str, state: QuotaState, capacity: Mapping[str, int], now_ms: int, waiting: Sequence[str]
) -> cell_scheduler_pb2.TenantQuota:
    """One row of ListQuotas. `waiting`: the reasons of the tenant's queued jobs."""
    book = state.book()
    q = state.quotas.get(tenant)
    used = dict(state.used.get(tenant, {}))
    out = cell_scheduler_pb2.TenantQuota(
        tenant=tenant,
        used_chips=used,
        borrowed_chips={
            t: b
            for t in sorted(set(used) | set(q.nominal if q else ()))
            if (b := book.borrowed(tenant, t))
        },
        waiting_jobs=len(waiting),
        waiting_for_quota=sum(1 for r in waiting if waits_for_quota(r)),
        share=state.share(tenant, capacity, now_ms),
    )
    if q is not None:
        out.quota.CopyFrom(quota_pb(q))
    return out


def hold_pb(hold: Hold, viewer: str | None) -> cell_scheduler_pb2.PodHold:
    """The held pod as `viewer` sees it (None: an operator, who sees whose job it is
    held for; a tenant sees that only for its own job)."""
    out = cell_scheduler_pb2.PodHold(pod=hold.pod)
    out.since.FromMilliseconds(hold.since_ms)
    if viewer is None or viewer == hold.tenant:
        out.job_id, out.tenant = hold.job_id, hold.tenant
    return out


def waits_for_quota(reason: str) -> bool:
    """Whether a queued job's reason says it waits for its tenant's quota (not for room)."""
    return WAITING_FOR_QUOTA in reason or NEVER_UNDER_QUOTA in reason


def quota_pb(q: Quota) -> cell_scheduler_pb2.Quota:
    pb = cell_scheduler_pb2.Quota(
        tenant=q.tenant,
        nominal_chips=dict(q.nominal),
        cohort=q.cohort,
        lending_limit=dict(q.lending_limit or {}),
        weight=q.weight,
        pod=q.pod,
    )
    if q.pod:  # caps on its pod: no borrowing to speak of
        pb.weight = 0
        return pb
    limits = dict(q.borrowing_limit or {})
    if limits and not any(limits.values()) and set(limits) >= set(q.nominal):
        pb.no_borrowing = True
    else:
        pb.borrowing_limit.update(limits)
    return pb


# -- the cell queue ----------------------------------------------------------------


@dataclass(frozen=True)
class Queued:
    """A job of the cell queue as the gate sees it."""

    job_id: str
    tenant: str
    priority: int
    seq: int
    chips: Mapping[str, int]


def gate(
    queue: Sequence[Queued], state: QuotaState, capacity: Mapping[str, int], now_ms: int
) -> tuple[list[str], dict[str, str]]:
    """The jobs that may be admitted now in the order to plan them (fair share among
    tenants, priority within one), and why each of the others waits. Without quotas:
    the queue as it is."""
    if not state.active:
        return [j.job_id for j in queue], {}
    book = state.book()
    tenants = {j.tenant for j in queue}
    shares = {t: state.share(t, capacity, now_ms) for t in tenants}
    weights = {t: state.quotas[t].weight for t in tenants if t in state.quotas}
    order = fair_order(
        [Waiting(j.job_id, j.tenant, j.priority, j.seq, j.chips) for j in queue],
        shares,
        capacity,
        weights,
    )
    admit: list[str] = []
    waits: dict[str, str] = {}
    for w in order:
        verdict = book.check(w.tenant, w.chips)
        if verdict.ok:
            book.assume(w.tenant, w.chips)
            admit.append(w.job_id)
            continue
        never = book.never_fits(w.tenant, w.chips)
        waits[w.job_id] = (
            (NEVER_UNDER_QUOTA + never) if never else WAITING_FOR_QUOTA + verdict.reason
        )
    return admit, waits


# -- reclaim -------------------------------------------------------------------------

# What reclaim reads of each live job (store.live_fields); "rcl" and "rcb" too when the
# job reclaimed quota itself (jobs.record_fields).
RECLAIM_FIELDS = ("tenant", "priority", "seq", "state", "qc", "phase", "box", "rcl", "rcb")


def reclaimers(
    live: Iterable[tuple[str, str, Mapping[str, str]]],
) -> list[tuple[str, list[str], int, dict[str, int]]]:
    """Of the live jobs (store.live_fields of RECLAIM_FIELDS), each running one that
    reclaimed quota: (its pod, the jobs it reclaimed from, its priority, the blocks per
    type it gives up at most), as choice.shielded_blocks reads them."""
    return [
        (pod, json.loads(f["rcl"]), int(f.get("priority", 0)), json.loads(f.get("rcb") or "{}"))
        for pod, _, f in live
        if f.get("rcl") and f.get("state") == "RUNNING" and f.get("phase") == "PLACED"
    ]


def plan_reclaim(
    job_id: str,
    tenant: str,
    need: Mapping[str, int],
    state: QuotaState,
    live: Iterable[tuple[str, str, Mapping[str, str]]],
    room: Mapping[str, Mapping[str, int]],
    *,
    box: bool = False,
    block_chips: Mapping[str, int] | None = None,
) -> Reclaim | None:
    """Borrowers' running jobs on one pod whose chips let `tenant`'s job `job_id`
    (within its nominal quota, no room anywhere) run there: the model's choice over
    what the store says runs (store.live_fields of RECLAIM_FIELDS), or None. A job that
    reclaimed quota from `job_id` is never named (lightpath.domain.slices.shields: the
    pod would refuse the forward), though it holds its chips. `box`: the job is a
    sub-block slice; a live job's `box` field names the block its own box is in (the
    pod's answer), so boxes count as chips of their block, and every live job there,
    whatever its state, holds that block. A job of fewer chips than a block with no
    `box` is a box of an unknown block (placed before the cell stored it, or moved
    since the last answer the cell followed): never named, and while it holds chips it
    may hold any block of its pod given over to boxes."""
    running, holders = running_of(job_id, live, block_chips or {})
    return state.book().reclaim(
        tenant, need, running, room, box=box, block_chips=block_chips, holders=holders
    )


def running_of(
    job_id: str, live: Iterable[tuple[str, str, Mapping[str, str]]], sizes: Mapping[str, int]
) -> tuple[list[RunningJob], dict[tuple[str, int], set[str]]]:
    """The running jobs reclaim may take for `job_id`, and per (pod, block) given over to
    sub-block slices every job holding chips there (plan_reclaim)."""
    running = []
    holders: dict[tuple[str, int], set[str]] = {}
    unknown: dict[str, set[str]] = {}
    for pod, job, f in live:
        chips = json.loads(f["qc"]) if f.get("qc") else {}
        if f.get("box"):
            holders.setdefault((pod, int(f["box"])), set()).add(job)
        elif chips and sum(chips.values()) < sizes.get(pod, 0):
            if f.get("state") not in ("PENDING", "SUSPENDED"):  # holding chips somewhere
                unknown.setdefault(pod, set()).add(job)
            continue
        if (
            chips
            and f.get("state") == "RUNNING"
            and f.get("phase") == "PLACED"
            and not shields(json.loads(f.get("rcl") or "[]"), job_id)
        ):
            running.append(
                RunningJob(
                    job,
                    f["tenant"],
                    int(f.get("priority", 0)),
                    int(f.get("seq", 0)),
                    pod,
                    chips,
                    block=int(f["box"]) if f.get("box") else None,
                )
            )
    for (pod, _), jobs in holders.items():
        jobs |= unknown.get(pod, set())
    return running, holders
