"""Quotas per tenant and node type, borrowing in a cohort, reclaim, and fair share.

A pure model over a snapshot (the quotas an operator set and the chips each
tenant's admitted jobs hold); the cell's admission, its queue order and the
simulator call it, the store commits what it decides. The shape follows Kueue's
ClusterQueues and cohorts (nominal quota per resource flavor, borrowing and
lending limits, reclaim of lent quota by preemption) with Slurm's fair-share
factor of decayed usage, across node types by dominant-resource fairness (DRF).

Per node type `t` (chips), for tenant `x` with quota `q` in cohort `C`:

* `used[x][t]`: chips held by x's admitted jobs (forwarded or placed, not ended).
* **nominal**: what x is owed. A tenant with no quota is not limited by this
  model (it neither borrows nor lends); a type missing from a quota's nominal
  has nominal 0.
* **borrowed** = max(0, used - nominal): chips x holds above its nominal.
* **lendable** of a member m = min(lending limit, nominal - used), at least 0
  (all of its unused nominal when no lending limit is set): what m lends now.
* x may hold `used + n` chips after admitting a job of `n` when the part above
  its nominal stays within its borrowing limit (none set: whatever the cohort
  lends) and within what the other members lend now, less what they borrow
  themselves. A tenant alone (no cohort) can
  never borrow.
* **reclaim**: a job that fits its tenant's nominal but finds no room may take
  back lent chips: the borrowers' jobs in the cohort, lowest priority first,
  youngest first, are preempted by their own policy (terminate, delay or
  shrink) on one pod, as few as free the room, never a job whose tenant is no
  longer borrowing when its turn comes.
* **hold**: a job within its tenant's nominal that reclaim can place on no pod has the
  pod closest to its room held for it (`Hold`): no job that would borrow goes there
  until it starts or leaves.
* **fair share**: the tenants that wait are served in the order of their
  weighted dominant share: for each type, the tenant's decayed chip-seconds
  over what the cell's chips of that type could give in the same decay window,
  the largest of those over the tenant's weight, smaller first. Each job taken
  in that order adds its own dominant share, so a tenant with many waiting jobs
  is interleaved with the others (DRF's progressive filling). Priority orders
  the jobs of one tenant.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# What a quota may say, and the rule each field keeps (the API's and the CLI's words).
MAX_CHIPS = 1 << 24  # a cell has at most this many chips of one type
MAX_WEIGHT = 1000.0
MIN_WEIGHT = 0.001


@dataclass(frozen=True)
class Quota:
    """One tenant's share of the cell, in chips per node type."""

    tenant: str
    nominal: Mapping[str, int]
    cohort: str = ""
    # Most chips per type the tenant may hold above its nominal; a type absent: no
    # limit but what the cohort lends. `None`: no limit on any type.
    borrowing_limit: Mapping[str, int] | None = None
    # Most chips per type of its nominal the tenant lends; absent: all of it.
    lending_limit: Mapping[str, int] | None = None
    weight: float = 1.0
    # The pod it holds on ("": the cell). A pod-scoped quota caps the tenant's chips on
    # that pod at its nominal (no cohort, no borrowing); the cell-wide one still holds.
    pod: str = ""

    def may_borrow(self, node_type: str) -> int | None:
        """Most chips of `node_type` above nominal (None: no limit of its own)."""
        if self.borrowing_limit is None:
            return None
        return self.borrowing_limit.get(node_type)

    def lend_cap(self, node_type: str) -> int:
        nominal = self.nominal.get(node_type, 0)
        if self.lending_limit is None or node_type not in self.lending_limit:
            return nominal
        return min(nominal, self.lending_limit[node_type])


@dataclass(frozen=True)
class Violation:
    """A bad quota field: the field's path and the rule it broke."""

    field: str
    rule: str


def check_quota(
    q: Quota,
    *,
    known_types: Iterable[str],
    known_tenants: Iterable[str] | None = None,
    cohort_nominal: Mapping[str, int] | None = None,
) -> list[Violation]:
    """What is wrong with `q` (empty: nothing). `known_types`: the node types of the
    registered pods; `known_tenants`: the tenants that exist (None: not checked);
    `cohort_nominal`: the other members' nominal chips per type of q's cohort, so a
    borrowing limit above what the cohort could ever lend is refused."""
    out: list[Violation] = []
    types = set(known_types)
    if known_tenants is not None and q.tenant not in set(known_tenants):
        out.append(Violation("tenant", f"no tenant {q.tenant!r}: create it first"))
    for name, limits in (
        ("nominal", q.nominal),
        ("borrowing_limit", q.borrowing_limit or {}),
        ("lending_limit", q.lending_limit or {}),
    ):
        for t, n in sorted(limits.items()):
            path = f"{name}[{t}]"
            if t not in types:
                known = ", ".join(sorted(types)) or "none registered yet"
                out.append(Violation(path, f"unknown node type {t!r}; the cell has {known}"))
            if isinstance(n, bool) or not isinstance(n, int):
                out.append(Violation(path, "must be a whole number of chips"))
            elif not 0 <= n <= MAX_CHIPS:
                out.append(Violation(path, f"must be 0 to {MAX_CHIPS} chips"))
    if not (MIN_WEIGHT <= q.weight <= MAX_WEIGHT) or math.isnan(q.weight):
        out.append(Violation("weight", f"must be {MIN_WEIGHT} to {MAX_WEIGHT:g}"))
    if q.borrowing_limit:
        if not q.cohort and any(n > 0 for n in q.borrowing_limit.values()):
            out.append(
                Violation("borrowing_limit", "a tenant outside a cohort has nobody to borrow from")
            )
        elif cohort_nominal is not None:
            for t, n in sorted(q.borrowing_limit.items()):
                lendable = cohort_nominal.get(t, 0)
                if isinstance(n, int) and n > lendable:
                    out.append(
                        Violation(
                            f"borrowing_limit[{t}]",
                            f"{n} is above the {lendable} {t} chips the other members of "
                            f"cohort {q.cohort!r} hold in nominal quota",
                        )
                    )
    return out


@dataclass(frozen=True)
class QuotaCheck:
    """Whether a job fits its tenant's quota now."""

    ok: bool
    # Chips per type the tenant would hold above its nominal after the job.
    borrowed: Mapping[str, int] = field(default_factory=dict)
    # Why it waits, in the words a person reads.
    reason: str = ""
    # Within the tenant's nominal: lent chips may be reclaimed for it.
    within_nominal: bool = True


@dataclass(frozen=True)
class RunningJob:
    """An admitted job as reclaim sees it."""

    job_id: str
    tenant: str
    priority: int
    seq: int
    pod: str
    chips: Mapping[str, int]
    # A sub-block slice: the block its box of chips is in (None: a slice of whole blocks).
    block: int | None = None


@dataclass(frozen=True)
class _Unit:
    """What reclaim may take at once: a slice of whole blocks, or sub-block slices of one
    block (all of a block's, for a block slice: only then is the block free)."""

    jobs: tuple[RunningJob, ...]
    frees: Mapping[str, int]

    @property
    def key(self) -> tuple[int, int, str]:
        """Lowest priority, then youngest first (the order reclaim takes in)."""
        return (
            max(j.priority for j in self.jobs),
            -max(j.seq for j in self.jobs),
            self.jobs[0].job_id,
        )


@dataclass(frozen=True)
class Reclaim:
    pod: str
    victims: tuple[RunningJob, ...]

    @property
    def reason(self) -> str:
        lenders = sorted({v.tenant for v in self.victims})
        return (
            f"reclaiming quota lent to {', '.join(lenders)}: preempting "
            f"{len(self.victims)} job(s) on {self.pod}"
        )


def _by_block(order: list[RunningJob]) -> tuple[list[_Unit], dict[int, list[RunningJob]]]:
    """Each slice of whole blocks as a unit of its own, and the sub-block slices per
    block, both in `order`."""
    units = [_Unit((j,), j.chips) for j in order if j.block is None]
    blocks: dict[int, list[RunningJob]] = {}
    for j in order:
        if j.block is not None:
            blocks.setdefault(j.block, []).append(j)
    return units, blocks


def _fmt(chips: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {t}" for t, n in sorted(chips.items()) if n) or "nothing"


class QuotaBook:
    """Quotas and usage at one moment. `assume` and `forget` change the usage of this
    copy only, for planning a queue in order."""

    def __init__(self, quotas: Iterable[Quota], used: Mapping[str, Mapping[str, int]]):
        self.quotas = {q.tenant: q for q in quotas}
        self.used: dict[str, dict[str, int]] = {t: dict(u) for t, u in used.items()}
        self.cohorts: dict[str, list[str]] = {}
        for q in self.quotas.values():
            if q.cohort:
                self.cohorts.setdefault(q.cohort, []).append(q.tenant)

    def copy(self) -> QuotaBook:
        return QuotaBook(self.quotas.values(), self.used)

    @property
    def active(self) -> bool:
        return bool(self.quotas)

    def usage(self, tenant: str, node_type: str) -> int:
        return self.used.get(tenant, {}).get(node_type, 0)

    def borrowed(self, tenant: str, node_type: str) -> int:
        q = self.quotas.get(tenant)
        if q is None:
            return 0
        return max(0, self.usage(tenant, node_type) - q.nominal.get(node_type, 0))

    def lendable(self, tenant: str, node_type: str) -> int:
        q = self.quotas[tenant]
        return max(
            0,
            min(q.lend_cap(node_type), q.nominal.get(node_type, 0) - self.usage(tenant, node_type)),
        )

    def cohort_lends(self, tenant: str, node_type: str) -> int:
        """Chips of `node_type` the rest of `tenant`'s cohort can lend it now: what its
        members lend less what the others already borrow."""
        q = self.quotas[tenant]
        if not q.cohort:
            return 0
        others = [m for m in self.cohorts[q.cohort] if m != tenant]
        lent = sum(self.lendable(m, node_type) for m in others)
        return max(0, lent - sum(self.borrowed(m, node_type) for m in others))

    def check(self, tenant: str, need: Mapping[str, int]) -> QuotaCheck:
        q = self.quotas.get(tenant)
        if q is None:
            return QuotaCheck(True)
        borrowed: dict[str, int] = {}
        within = True
        for t, n in sorted(need.items()):
            nominal = q.nominal.get(t, 0)
            after = self.usage(tenant, t) + n
            borrowed[t] = max(0, after - nominal)
            if after <= nominal:
                continue
            within = False
            held = f"{tenant} would hold {after} {t} chips, {after - nominal} over its quota of {nominal}"
            cap = q.may_borrow(t)
            if cap is not None and borrowed[t] > cap:
                if cap == 0:
                    why = f"{held}, and may not borrow {t} chips"
                else:
                    why = f"{held}, and may borrow at most {cap}"
                return QuotaCheck(False, borrowed, why, within_nominal=False)
            lends = self.cohort_lends(tenant, t)
            if borrowed[t] > lends:
                where = f"cohort {q.cohort!r}" if q.cohort else "no cohort (nothing to borrow)"
                return QuotaCheck(
                    False,
                    borrowed,
                    f"{held}; {where} can lend it {lends} {t} chips now",
                    within_nominal=False,
                )
        return QuotaCheck(True, borrowed, within_nominal=within)

    def never_fits(self, tenant: str, need: Mapping[str, int]) -> str:
        """Why a job of `need` chips can never be admitted under these quotas, even with
        the tenant's cohort idle ("" when it can): above its nominal plus the most it may
        borrow (its borrowing limit, and what the others lend at most)."""
        q = self.quotas.get(tenant)
        if q is None:
            return ""
        for t, n in sorted(need.items()):
            others = [m for m in self.cohorts.get(q.cohort, []) if m != tenant]
            most = sum(self.quotas[m].lend_cap(t) for m in others)
            cap = q.may_borrow(t)
            if cap is not None:
                most = min(most, cap)
            ceiling = q.nominal.get(t, 0) + most
            if n > ceiling:
                return (
                    f"needs {n} {t} chips; {tenant}'s quota allows at most {ceiling} "
                    f"({q.nominal.get(t, 0)} nominal + {most} it may borrow)"
                )
        return ""

    def assume(self, tenant: str, need: Mapping[str, int]) -> None:
        u = self.used.setdefault(tenant, {})
        for t, n in need.items():
            u[t] = u.get(t, 0) + n

    def forget(self, tenant: str, need: Mapping[str, int]) -> None:
        u = self.used.setdefault(tenant, {})
        for t, n in need.items():
            u[t] = max(0, u.get(t, 0) - n)

    def reach(
        self,
        tenant: str,
        node_type: str,
        running: Iterable[RunningJob],
        room: Mapping[str, Mapping[str, int]],
    ) -> dict[str, int]:
        """Per pod, the chips of `node_type` a job of `tenant`'s within its nominal could
        get there at most: whole free blocks' (`room`) and those of the running jobs of
        its cohort's members that borrow now (reclaim's turns aside)."""
        q = self.quotas.get(tenant)
        members = set(self.cohorts.get(q.cohort, ())) - {tenant} if q and q.cohort else set()
        out = {p: c.get(node_type, 0) for p, c in room.items()}
        for j in running:
            if j.tenant in members and self.borrowed(j.tenant, node_type) > 0:
                out[j.pod] = out.get(j.pod, 0) + j.chips.get(node_type, 0)
        return out

    def pod_to_hold(
        self,
        tenant: str,
        need: Mapping[str, int],
        running: Iterable[RunningJob],
        room: Mapping[str, Mapping[str, int]],
    ) -> str | None:
        """The pod to hold (`Hold`) for `tenant`'s job of `need` chips that reclaim cannot
        place: the closest to making its room, the most chips it could get there
        (`reach`, summed over its types; ties to the first pod id), or None when no pod
        has any."""
        running = list(running)
        reach: dict[str, int] = {}
        for t in need:
            for pod, n in self.reach(tenant, t, running, room).items():
                reach[pod] = reach.get(pod, 0) + n
        best = max(sorted(reach), key=lambda p: reach[p], default=None)
        return best if best is not None and reach[best] > 0 else None

    def reclaim(
        self,
        tenant: str,
        need: Mapping[str, int],
        running: Iterable[RunningJob],
        room: Mapping[str, Mapping[str, int]],
        *,
        box: bool = False,
        block_chips: Mapping[str, int] | None = None,
        holders: Mapping[tuple[str, int], Iterable[str]] | None = None,
    ) -> Reclaim | None:
        """Borrowers' jobs to preempt so that `tenant`'s job of `need` chips, which fits
        its nominal quota, finds room on one pod; None when it does not fit its nominal,
        nobody in its cohort borrows, or no pod can be freed enough. `room`: chips per
        type of whole free blocks now per pod (what the job could use without
        preempting). `box`: the job is a sub-block slice (a box inside one block).
        `block_chips`: chips in one block of each pod; `holders`: per (pod, block) given
        over to sub-block slices, every job holding chips there (whoever's, whatever
        its state; the running jobs' own blocks are added) — a block slice gets a
        block of sub-block slices only when all of them go."""
        q = self.quotas.get(tenant)
        if q is None or not q.cohort or not self.check(tenant, need).within_nominal:
            return None
        members = set(self.cohorts[q.cohort]) - {tenant}
        running = list(running)
        held: dict[tuple[str, int], set[str]] = {k: set(v) for k, v in (holders or {}).items()}
        for j in running:
            if j.block is not None:
                held.setdefault((j.pod, j.block), set()).add(j.job_id)
        order = sorted(
            (j for j in running if j.tenant in members),
            key=lambda j: (j.priority, -j.seq, j.job_id),
        )
        best: Reclaim | None = None
        best_key: tuple | None = None
        for pod in sorted({j.pod for j in order}):
            on_pod = [j for j in order if j.pod == pod]
            per_block = (block_chips or {}).get(pod, 0)
            units = (
                self._places(need, on_pod)
                if box
                else self._block_units(on_pod, per_block, held, pod)
            )
            taken = self._victims(need, units, room.get(pod, {}), alone_only=box)
            if taken:
                key = (
                    max(v.priority for v in taken),
                    len(taken),
                    sum(sum(v.chips.values()) for v in taken),
                    pod,
                )
                if best_key is None or key < best_key:
                    best, best_key = Reclaim(pod, tuple(taken)), key
        return best

    @staticmethod
    def _block_units(
        order: list[RunningJob], per_block: int, held: Mapping[tuple[str, int], set[str]], pod: str
    ) -> list[_Unit]:
        """What frees blocks for a block slice: each slice of whole blocks, and each block
        whose every holder is a borrower's running sub-block slice (it frees the block's
        chips, the free ones too)."""
        units, blocks = _by_block(order)
        for b, jobs in sorted(blocks.items()):
            if per_block and {j.job_id for j in jobs} == held.get((pod, b), set()):
                node_type = next(iter(jobs[0].chips))  # a block has one node type
                units.append(_Unit(tuple(jobs), {node_type: per_block}))
        return sorted(units, key=lambda u: u.key)

    def _places(self, need: Mapping[str, int], order: list[RunningJob]) -> list[_Unit]:
        """Where a sub-block slice could get its box: a borrowed slice of whole blocks
        (it frees a block), or sub-block slices of one block, lowest priority and
        youngest first, whose chips hold the box's while their tenants still borrow
        (the chips left free in that block are not known here: not counted)."""
        units, blocks = _by_block(order)
        for _, jobs in sorted(blocks.items()):
            book = self.copy()
            taken: list[RunningJob] = []
            free: dict[str, int] = {}
            for j in jobs:
                if all(free.get(t, 0) >= n for t, n in need.items()):
                    break
                if book._takes(j, list(need)):
                    taken.append(j)
                    for t, n in j.chips.items():
                        free[t] = free.get(t, 0) + n
            if taken:
                units.append(_Unit(tuple(taken), free))
        return sorted(units, key=lambda u: u.key)

    def _takes(self, j: RunningJob, types: Iterable[str]) -> bool:
        """Whether `j`'s tenant still borrows a type of `types` that `j` holds; if so,
        this book forgets `j` (its turn is taken)."""
        if not any(self.borrowed(j.tenant, t) > 0 for t in types if j.chips.get(t)):
            return False
        self.forget(j.tenant, j.chips)
        return True

    def _victims(
        self,
        need: Mapping[str, int],
        units: list[_Unit],
        room: Mapping[str, int],
        *,
        alone_only: bool = False,
    ) -> list[RunningJob]:
        """Victims on one pod, or [] when they cannot free enough: a single borrowed unit
        that frees enough alone, the lowest priority and then the fewest chips first
        (taking a 512-chip slice for an 8-chip box wastes the rest); else (not for a
        box, which needs its room in one place) borrowed units in their order (lowest
        priority, youngest first) until the room suffices."""

        def short(free: Mapping[str, int]) -> bool:
            return any(free.get(t, 0) < n for t, n in need.items())

        def freed(us: Iterable[_Unit]) -> dict[str, int]:
            free = dict(room)
            for u in us:
                for t, n in u.frees.items():
                    free[t] = free.get(t, 0) + n
            return free

        def borrowed(u: _Unit, book: QuotaBook, types: list[str]) -> bool:
            return all(book._takes(j, types) for j in u.jobs)

        if not short(room):
            return []
        usable = [u for u in units if borrowed(u, self.copy(), list(need))]
        if not usable:
            return []
        alone = [u for u in usable if not short(freed([u]))]
        low = min(u.key[0] for u in usable) if not alone_only else None
        pool = [u for u in alone if low is None or u.key[0] == low]
        if pool:
            pick = min(
                pool,
                key=lambda u: (u.key[0], len(u.jobs), sum(u.frees.values()), u.key[1:]),
            )
            return list(pick.jobs)
        if alone_only:
            return []
        book = self.copy()
        free = dict(room)
        taken: list[RunningJob] = []
        for u in usable:
            if not short(free):
                break
            useful = [t for t, n in need.items() if free.get(t, 0) < n and u.frees.get(t, 0)]
            trial = book.copy()
            if not useful or not borrowed(u, trial, useful):
                continue
            book = trial
            taken.extend(u.jobs)
            for t, n in u.frees.items():
                free[t] = free.get(t, 0) + n
        return [] if short(free) else taken


@dataclass(frozen=True)
class Hold:
    """A pod the cell holds for an owner's job within its nominal that reclaim can place
    on no pod (no pod's free blocks and borrowers' chips make its room: its chips are
    spread over pods, or held by tenants within their own nominal): until that job
    starts or leaves the cell queue, no job that would borrow goes to that pod, so the
    room the pod's jobs leave as they end is the owners' — the owner's job takes it by
    reclaim once free blocks and borrowers' chips there suffice. Owners' jobs within
    their nominal still go there (they are owed). One hold at a time (EASY's one
    reservation, at the cell's level, in chips a tenant is owed)."""

    job_id: str
    pod: str
    tenant: str = ""  # the job's (shown to operators and to that tenant only)
    since_ms: int = 0  # when the cell held the pod

    def keeps_out(self, job_id: str, borrows: bool) -> str:
        """The pod job `job_id` may not go to now ("": none): the held one, for a job
        that would borrow."""
        return self.pod if borrows and job_id != self.job_id else ""


# -- fair share ---------------------------------------------------------------------

# Half-life of the usage that orders tenants (Slurm's PriorityDecayHalfLife): a chip-hour
# held a half-life ago counts half.
DEFAULT_HALF_LIFE_S = 3600.0


def decay(value: float, held: float, dt_s: float, half_life_s: float) -> float:
    """Decayed chip-seconds after `dt_s` more seconds at `held` chips: the old value
    decays, the new usage is integrated with the same decay (exact for constant `held`)."""
    if dt_s <= 0:
        return value
    f = 0.5 ** (dt_s / half_life_s)
    return value * f + held * half_life_s / math.log(2) * (1 - f)


def dominant_share(
    usage: Mapping[str, float],
    capacity: Mapping[str, int],
    weight: float,
    half_life_s: float = DEFAULT_HALF_LIFE_S,
) -> float:
    """A tenant's weighted dominant share: the largest, over node types, of its decayed
    chip-seconds over what all the cell's chips of that type would have accumulated
    (capacity × half-life / ln 2), divided by its weight."""
    window = half_life_s / math.log(2)
    share = max(
        (v / (capacity[t] * window) for t, v in usage.items() if capacity.get(t)), default=0.0
    )
    return share / weight


@dataclass(frozen=True)
class Waiting:
    """A job in the cell queue, for ordering."""

    job_id: str
    tenant: str
    priority: int
    seq: int
    chips: Mapping[str, int]


def fair_order(
    waiting: Sequence[Waiting],
    shares: Mapping[str, float],
    capacity: Mapping[str, int],
    weights: Mapping[str, float],
) -> list[Waiting]:
    """The queue in fair-share order: repeatedly the head (highest priority, then
    oldest) of the tenant with the smallest share, which then grows by that job's
    dominant share of the cell over the tenant's weight. Ties go to the older head."""
    heads: dict[str, list[Waiting]] = {}
    for w in sorted(waiting, key=lambda w: (-w.priority, w.seq)):
        heads.setdefault(w.tenant, []).append(w)
    share = {t: shares.get(t, 0.0) for t in heads}
    pos = {t: 0 for t in heads}
    out: list[Waiting] = []
    while len(out) < len(waiting):
        tenant = min(
            (t for t in heads if pos[t] < len(heads[t])),
            key=lambda t: (share[t], heads[t][pos[t]].seq),
        )
        job = heads[tenant][pos[tenant]]
        pos[tenant] += 1
        out.append(job)
        dom = max((n / capacity[t] for t, n in job.chips.items() if capacity.get(t)), default=0.0)
        share[tenant] += dom / weights.get(tenant, 1.0)
    return out
