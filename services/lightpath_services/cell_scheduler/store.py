"""CS-1, CS-5, CS-6: the cell's state in Redis — the pod registry, the cell's jobs, the queue.

Every key is under the `{cell}` hash tag (lightpath_services.common.keys.cell_key), so
all of them live in one Redis Cluster slot and one commit may change any of
them together. Every change is a CellTxn (lightpath_services.common.txn) whose ops are
store.lua's; it declares every key it touches, the jobs of a set it walks (a
pod's live or assumed jobs) too, and a failed check raises Conflict with one of
the reasons below.

Registry (CS-1):

    lp:{cell}:pods                hash  pod -> registration (PodRegistration, base64)
    lp:{cell}:seen                zset  pod -> last heartbeat (ms)
    lp:{cell}:endpoints:<pod>     hash  scheduler replica address -> last heartbeat (ms)
    lp:{cell}:endpoint            hash  pod -> the replica heard from last (where calls go)
    lp:{cell}:capacity            hash  pod -> last capacity report (PodCapacity, base64)
    lp:{cell}:capver              hash  pod -> version of that report (padded stream id)
    lp:{cell}:free                hash  "<pod>|<type>" -> healthy free blocks (reported, minus placed since);
                                        "<pod>|<type>#chips" -> chips free for sub-block slices (same)
    lp:{cell}:held                hash  "<pod>|<type>" -> blocks of forwards in flight to that pod
                                        ("<pod>|<type>#chips": chips of sub-block slices in flight)
    lp:{cell}:pod:<p>:assumed     set   jobs whose blocks the cell counts as taken (a forward, a
                                        placement) or freed (an end through the cell) before a
                                        capacity report of the pod shows it (see _REPORT)
    lp:{cell}:ack                 hash  pod -> last job transition applied (padded stream id)
    lp:{cell}:suspect             hash  pod -> until (ms): a forward failed to reach it
    lp:{cell}:down                set   pods marked silent (their live jobs show UNKNOWN, CS-6;
                                        an end the pod answers meanwhile shows at once)

Jobs (CS-5):

    lp:{cell}:job:<id>            hash  the job: request (as updated; req0 as first submitted),
                                        tenant, phase, pod, state, ...
    lp:{cell}:job:<id>:events     list  the cell's own transitions of the job (JSON; an end's
                                        reason is the record's, stored once)
    lp:{cell}:jobs                zset  every job by submission sequence
    lp:{cell}:tenant:<t>:jobs     zset  a tenant's jobs by sequence
    lp:{cell}:pod:<p>:jobs        zset  jobs placed on a pod by sequence
    lp:{cell}:pod:<p>:live        set   jobs on a pod that have not ended
    lp:{cell}:queue               zset  the cell queue: priority, then age
    lp:{cell}:forwarding          zset  jobs being forwarded -> until (ms)
    lp:{cell}:maybe               set   jobs a forward may have reached on a pod that then went silent
    lp:{cell}:seq                 string submission sequence
    lp:{cell}:fwd                 string forward sequence: every claim of a job for a pod, and
                                        every take-over of one, takes the next: its fencing
                                        token at the pod (AdmitJobRequest.forward_token)
    lp:{cell}:events              stream the cell's job transitions (WatchJob): job id and the
                                        event's number in its list

Quotas (issue 35; services/lightpath_services/cell_scheduler/quotas.py):

    lp:{cell}:quotas              hash  tenant -> its quota (JSON); "<tenant>@<pod>" -> its
                                        quota on that pod
    lp:{cell}:usage               hash  "<tenant>|<type>" -> chips its forwarded and placed jobs
                                        hold (each job's charge is "qc" on its hash, its pod
                                        "qp"); "<tenant>@<pod>|<type>" -> those on that pod
    lp:{cell}:decayed             hash  "<tenant>|<type>" -> decayed chip-seconds (fair share),
                                        "<tenant>|<type>@" -> when last integrated (ms)
    lp:{cell}:qver                hash  "n": bumped by every quota change and every charge of a
                                        tenant with a quota; a claim decided over quotas
                                        expects the version its decision read (Conflict QUOTA)
    lp:{cell}:hold                hash  "job", "pod", "tenant", "at" (ms): the pod held for an
                                        owner's job within its nominal that reclaim could not
                                        place, since when (quota.Hold; one at a time; a claim
                                        of a job that would borrow checks it: not_held)

A job's phase in the cell: QUEUED (in the cell queue, no pod) → FORWARDING
(claimed by one replica, bound to one pod, with a token and a deadline) →
PLACED (the pod has it; its state mirrors the pod's, versioned by the pod's
per-job transition number) — or ENDED without ever reaching a pod (cancelled
in the queue). A forward that the pod refused, or whose outcome is unknown,
goes back to QUEUED; so does a PLACED job its pod let go (a reclaim of lent quota
delayed it, issue 35: the report's transition with `released`, or the pod's
RELEASED_TO_CELL answer about it), its quota charge given back, once. Only the
holder of the FORWARDING token may end it, so no two replicas forward one job at
once.
"""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from lightpath_services.cell_scheduler.quota import DEFAULT_HALF_LIFE_S, Hold
from lightpath_services.common import txn
from lightpath_services.common.keys import cell_key
from lightpath_services.common.txn import Conflict, Program

QUEUED, FORWARDING, PLACED, ENDED = "QUEUED", "FORWARDING", "PLACED", "ENDED"
FINAL = ("COMPLETED", "CANCELLED", "PREEMPTED", "FAILED")
EVENT_STREAM_MAXLEN = 10_000
# Queue score: (PRIORITY_ABOVE - priority) * PRIORITY_STRIDE + sequence → priority first,
# then age.
PRIORITY_ABOVE = 101
PRIORITY_STRIDE = 1 << 40

# Conflict reasons: the job exists already; it is no longer in the phase (or on the pod,
# or held by the token) the caller saw; the pod's free blocks (minus forwards in flight) no
# longer cover it; jobs wait in the cell queue that the decision did not know of; an update
# changed the request the decision was made for; the pod is not registered.
EXISTS, MOVED, STALE, WAITING, CHANGED, UNKNOWN_POD = (
    "exists",
    "moved",
    "stale",
    "queue",
    "changed",
    "unknown pod",
)
# ... and quotas or a cohort's usage changed since the decision read them (issue 35).
QUOTA = "quota"

# Every script of this store: services/lightpath_services/common/txn.lua with store.lua's checks and ops.
PROGRAM = Program(
    __package__,
    "store.lua",
    {
        "FINAL": list(FINAL),
        "EVENT_STREAM_MAXLEN": EVENT_STREAM_MAXLEN,
        "PRIORITY_ABOVE": PRIORITY_ABOVE,
        "PRIORITY_STRIDE": PRIORITY_STRIDE,
        "HALF_LIFE_S": DEFAULT_HALF_LIFE_S,
    },
)


def pad_id(stream_id: str) -> str:
    """A Redis stream id as a string that compares like the id ("" and "0-0" lowest)."""
    if not stream_id:
        stream_id = "0-0"
    ms, _, seq = stream_id.partition("-")
    return f"{int(ms):017d}-{int(seq or 0):010d}"


def unpad_id(padded: str) -> str:
    if not padded:
        return "0-0"
    ms, _, seq = padded.partition("-")
    return f"{int(ms)}-{int(seq or 0)}"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text.encode())


# The fields of a job record the service reads.
RECORD_FIELDS = (
    "req",
    "tenant",
    "priority",
    "seq",
    "phase",
    "state",
    "reason",
    "pod",
    "created_ms",
    "updated_ms",
    "pod_state",
    "n",
    "token",
    "until",
    "spec",
    "chips",
    "blocks",
    "derived",
    "why",
    "refused",
    "maybe",
    "needs",
    "req0",
    "reclaimed",
)


@dataclass(frozen=True)
class CellJobRecord:
    """A job as the cell stores it."""

    job_id: str
    request_b64: str
    tenant: str
    priority: int
    seq: int
    phase: str
    state: str
    reason: str
    pod: str
    created_ms: int
    updated_ms: int
    pod_state: str = ""
    n: int = 0
    token: str = ""
    until_ms: int = 0
    spec_b64: str = ""
    chips: tuple[int, ...] = ()
    block_count: int = 0
    derived: bool = False
    why: str = ""
    refused: dict[str, str] = field(default_factory=dict)
    maybe: tuple[str, ...] = ()
    needs: dict[str, int] = field(default_factory=dict)  # blocks per node type on its pod
    # The request as submitted, once an update changed `request_b64` (SubmitJob's
    # idempotency key stays the first request).
    first_request_b64: str = ""
    # How often a reclaim sent it back from its pod to the cell queue (issue 35).
    reclaimed: int = 0

    @property
    def submitted_b64(self) -> str:
        return self.first_request_b64 or self.request_b64

    @classmethod
    def of(cls, job_id: str, row: Mapping[str, str]) -> CellJobRecord | None:
        if not row or "phase" not in row:
            return None
        return cls(
            job_id=job_id,
            request_b64=row.get("req", ""),
            tenant=row.get("tenant", ""),
            priority=int(row.get("priority", 0)),
            seq=int(row.get("seq", 0)),
            phase=row["phase"],
            state=row.get("state", "PENDING"),
            reason=row.get("reason", ""),
            pod=row.get("pod", ""),
            created_ms=int(row.get("created_ms", 0)),
            updated_ms=int(row.get("updated_ms", 0)),
            pod_state=row.get("pod_state", ""),
            n=int(row.get("n") or 0),
            token=row.get("token", ""),
            until_ms=int(row.get("until") or 0),
            spec_b64=row.get("spec", ""),
            chips=tuple(int(c) for c in row["chips"].split("x")) if row.get("chips") else (),
            block_count=int(row.get("blocks") or 0),
            derived=row.get("derived") == "1",
            why=row.get("why", ""),
            refused=json.loads(row["refused"]) if row.get("refused") else {},
            maybe=tuple(json.loads(row["maybe"])) if row.get("maybe") else (),
            needs=json.loads(row["needs"]) if row.get("needs") else {},
            first_request_b64=row.get("req0", ""),
            reclaimed=int(row.get("reclaimed") or 0),
        )


@dataclass(frozen=True)
class RegistrySnapshot:
    """The registry as planning reads it (one round trip)."""

    registrations: dict[str, str]  # pod -> base64 PodRegistration
    capacities: dict[str, str]  # pod -> base64 PodCapacity
    versions: dict[str, str]  # pod -> capacity version
    free: dict[str, int]  # "pod|type" -> blocks
    held: dict[str, int]  # "pod|type" -> blocks
    seen: dict[str, int]  # pod -> ms
    suspect: dict[str, int]  # pod -> until ms
    down: set[str]
    endpoint: dict[str, str]  # pod -> the scheduler replica heard from last
    queue: list[str]  # job ids in queue order
    existing: dict[str, str] | None = None  # the job asked about, if any
    quotas: QuotaRows = field(default_factory=lambda: QuotaRows())


@dataclass(frozen=True)
class QuotaRows:
    """The quota keys as read (version first: a charge after the read is seen by a claim
    that expects this version)."""

    version: str = ""
    quotas: dict[str, str] = field(default_factory=dict)  # tenant -> JSON
    usage: dict[str, int] = field(default_factory=dict)  # "tenant|type" -> chips
    decayed: dict[str, str] = field(default_factory=dict)
    # the pod the cell holds for an owner's job (issue 35)
    hold: Hold | None = None


def _row(values: Sequence[Any]) -> dict[str, str]:
    """RECORD_FIELDS' values (HMGET order) as a dict of the fields that are set."""
    return {f: v for f, v in zip(RECORD_FIELDS, values, strict=True) if v is not None}


def _quota_rows(got: Sequence[Any]) -> QuotaRows:
    version, quotas, usage, decayed, hold = got
    return QuotaRows(
        version or "",
        dict(quotas),
        {k: _i(v) for k, v in usage.items()},
        decayed,
        Hold(hold["job"], hold["pod"], hold.get("tenant", ""), _i(hold.get("at")))
        if hold.get("job") and hold.get("pod")
        else None,
    )


@dataclass(frozen=True)
class QuotaGuard:
    """What a claim's decision knew of its tenant's quota: with one, the `version` of the
    quotas and usage it read (it holds while no charge or change came since); without
    (None), that there was none (it holds while there still is none: the charges of
    tenants without a quota change nobody's limit, so they never conflict)."""

    tenant: str
    version: str | None
    pod: str = ""  # the pod the claim binds the job to: its quota there counts too
    # The job would borrow quota: it holds while `pod` is not held for another job
    # (quota.Hold; a replica may hold it after the decision read that it was not).
    borrows: bool = False


def _expect_quota(t: txn.Txn, guard: QuotaGuard | None, job_id: str) -> None:
    if guard is None:
        return
    if guard.borrows and guard.pod:
        t.check("not_held", guard.pod, job_id)
    if guard.version is None:
        for field_ in [guard.tenant] + ([f"{guard.tenant}@{guard.pod}"] if guard.pod else []):
            t.expect_field(
                cell_key("quotas"),
                field_,
                False,
                reason=QUOTA,
                message=f"tenant {guard.tenant} has a quota now",
            )
    else:
        t.expect(
            cell_key("qver"),
            "n",
            [guard.version],
            reason=QUOTA,
            message="quotas or their usage changed since the decision",
        )


def _i(v: Any) -> int:
    return int(float(v)) if v not in (None, "") else 0


@dataclass(frozen=True)
class Reported:
    """A heartbeat applied: the transitions acknowledged up to `ack`; whether the pod came
    back from silent; whether the cell queue should be looked at again; how many jobs
    the pod let go went back to the cell queue (issue 35)."""

    ack: str
    returned: bool
    wake: bool
    requeued: int = 0


@dataclass(frozen=True)
class Claimed:
    """A new job stored: its submission sequence, and its forward's fencing token when it
    was bound to a pod (0: queued in the cell)."""

    seq: int
    fence: int


@dataclass(frozen=True)
class Mirrored:
    """A pod's answer followed (`applied`, or not: the cell had a newer one): the record
    after, how many jobs wait in the cell queue, and whether the job's blocks count as
    free until the pod reports."""

    applied: bool
    record: CellJobRecord | None
    queued: int = 0
    freed: bool = False


class CellTxn(txn.Txn):
    """A commit of the cell's state about `pod` (and `tenant`): declares every key the
    store's ops may name (services/lightpath_services/cell_scheduler/store.lua), jobs as the families "job"
    (the hash) and "ev" (its events)."""

    def __init__(self, pod: str = "", tenant: str = "", jobs: Iterable[str] = ()):
        super().__init__(families=_FAMILIES)
        self.include(_CELL_KEYS)
        for name, key in _pod_keys(pod) if pod else ():
            self.name(name, key)
        if tenant:
            self.name("tenantjobs", _tenant_jobs_key(tenant))
        for job_id in jobs:
            self.job(job_id)

    def job(self, job_id: str) -> str:
        """Declare a job's hash and events; the hash's key."""
        self.member("job", job_id)
        self.member("ev", job_id)
        return _job_key(job_id)

    def expect_phase(self, job_id: str, phases: Iterable[str]) -> None:
        self.expect(
            _job_key(job_id),
            "phase",
            phases,
            reason=MOVED,
            message=f"job {job_id} is {{}}",
            absent=f"job {job_id} does not exist",
        )

    def expect_value(self, job_id: str, f: str, value: str, *, reason: str = MOVED) -> None:
        self.expect(
            _job_key(job_id), f, [value], reason=reason, message=f"job {job_id}: {f} is {{}}"
        )

    def read_record(self, job_id: str) -> None:
        self.read("HMGET", _job_key(job_id), *RECORD_FIELDS)


# The cell's keys that are one per cell, by the names store.lua gives them.
_CELL_KEYS = txn.Txn()
for _name in (
    *("pods", "seen", "endpoint", "capacity", "capver", "free", "held", "ack", "suspect"),
    *("down", "jobs", "queue", "forwarding", "maybe", "seq", "fwd", "events"),
    *("quotas", "usage", "decayed", "qver", "hold"),
):
    _CELL_KEYS.name(_name, cell_key(_name))


# Keys made once (cell_key checks every part each time), as every commit declares them.
@functools.lru_cache(maxsize=256)
def _pod_keys(pod: str) -> tuple[tuple[str, str], ...]:
    return (
        ("endpoints", cell_key("endpoints", pod)),
        *((name, cell_key("pod", pod, part)) for name, part in _POD_KEYS),
    )


_POD_KEYS = (("assumed", "assumed"), ("live", "live"), ("podjobs", "jobs"))


@functools.lru_cache(maxsize=256)
def _tenant_jobs_key(tenant: str) -> str:
    return cell_key("tenant", tenant, "jobs")


@functools.lru_cache(maxsize=4096)
def _job_key(job_id: str) -> str:
    return cell_key("job", job_id)


@functools.lru_cache(maxsize=4096)
def _events_key(job_id: str) -> str:
    return cell_key("job", job_id, "events")


_FAMILIES = {"job": _job_key, "ev": _events_key}


def _fields(fields: Mapping[str, Any]) -> str:
    return json.dumps({k: str(v) for k, v in fields.items()})


class CellStore:
    """Redis persistence of the cell (CS-1, CS-5, CS-6)."""

    def __init__(self, redis: aioredis.Redis):
        # decode_responses=True: every reply is str (the stubs' bytes | str unions do not apply).
        self.redis: Any = redis
        self._script = PROGRAM.bind(redis)

    def key(self, *parts: object) -> str:
        return cell_key(*parts)

    def job_key(self, job_id: str) -> str:
        return _job_key(job_id)

    async def _try(self, t: CellTxn) -> txn.Committed | None:
        """The commit, or None when a check failed (the job moved on meanwhile)."""
        try:
            return await self._script.commit(t)
        except Conflict:
            return None

    # -- registry (CS-1) -----------------------------------------------------------

    async def register(
        self, pod_id: str, registration_b64: str, endpoint: str, now_ms: int, tip: str
    ) -> bool:
        """Store a pod's registration; True if it had been marked silent."""
        t = CellTxn(pod_id)
        live, down = cell_key("pod", pod_id, "live"), cell_key("down")
        t.expect_declared(live, ["job", "ev"], if_in=(down, pod_id))
        t.op("register", pod_id, registration_b64, endpoint, now_ms, pad_id(tip))
        return bool(int((await self._script.commit(t))["returned"]))

    async def report(
        self,
        pod_id: str,
        *,
        endpoint: str,
        now_ms: int,
        capacity_b64: str,
        version: str,
        free: Mapping[str, int],
        after: str,
        until: str,
        transitions: Sequence[Sequence[Any]],
        assume_ms: int,
    ) -> Reported:
        """Apply a heartbeat (Conflict UNKNOWN_POD when the pod is not registered). The
        reported free blocks are corrected by the placements and ends through the cell
        that the report does not show yet (its version predates the pod's event of them),
        each for at most `assume_ms`."""
        t = CellTxn(pod_id, jobs=sorted({str(tr[1]) for tr in transitions}))
        t.expect_field(
            cell_key("pods"),
            pod_id,
            True,
            reason=UNKNOWN_POD,
            message=f"pod {pod_id} is not registered",
        )
        t.expect_declared(
            cell_key("pod", pod_id, "live"), ["job", "ev"], if_in=(cell_key("down"), pod_id)
        )
        t.expect_declared(cell_key("pod", pod_id, "assumed"), ["job"])
        t.op(
            "report",
            pod_id,
            endpoint,
            now_ms,
            capacity_b64,
            pad_id(version),
            json.dumps(dict(free)),
            pad_id(after),
            pad_id(until),
            json.dumps([[pad_id(tr[0]), *tr[1:]] for tr in transitions]),
            assume_ms,
        )
        done = await self._script.commit(t)
        return Reported(
            unpad_id(done["ack"]),
            bool(int(done["returned"])),
            bool(int(done["wake"])),
            int(done["requeued"]),
        )

    async def snapshot(self, job_id: str | None = None, *, queue: bool = True) -> RegistrySnapshot:
        async with self.redis.pipeline(transaction=False) as pipe:
            self._read_quotas(pipe)
            pipe.hgetall(self.key("pods"))
            pipe.hgetall(self.key("capacity"))
            pipe.hgetall(self.key("capver"))
            pipe.hgetall(self.key("free"))
            pipe.hgetall(self.key("held"))
            pipe.zrange(self.key("seen"), 0, -1, withscores=True)
            pipe.hgetall(self.key("suspect"))
            pipe.smembers(self.key("down"))
            pipe.hgetall(self.key("endpoint"))
            if queue:
                pipe.zrange(self.key("queue"), 0, -1)
            if job_id is not None:
                pipe.hmget(self.job_key(job_id), RECORD_FIELDS)
            got = await pipe.execute()
        rows = _quota_rows(got[:5])
        pods, caps, vers, free, held, seen, suspect, down, endpoint = got[5:14]
        rest = got[14:]
        q = rest.pop(0) if queue else []
        existing = _row(rest.pop(0)) if job_id is not None else None
        return RegistrySnapshot(
            pods,
            caps,
            vers,
            {k: _i(v) for k, v in free.items()},
            {k: _i(v) for k, v in held.items()},
            {p: int(s) for p, s in seen},
            {p: _i(v) for p, v in suspect.items()},
            set(down),
            dict(endpoint),
            list(q),
            existing or None,
            rows,
        )

    async def liveness(self) -> tuple[list[str], dict[str, int], set[str]]:
        """(registered pods, their last heartbeats in ms, those marked silent): what the
        background round's silent-pod check reads, without the rest of the snapshot."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hkeys(self.key("pods"))
            pipe.zrange(self.key("seen"), 0, -1, withscores=True)
            pipe.smembers(self.key("down"))
            pods, seen, down = await pipe.execute()
        return list(pods), {p: int(s) for p, s in seen}, set(down)

    async def queue_or_hold(self) -> bool:
        """Whether the cell queue has a job or a pod is held (quota.Hold): else a pass over
        the queue has nothing to do, and need not read the snapshot."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.exists(self.key("queue"))
            pipe.hmget(self.key("hold"), ["job", "pod"])
            queued, (job, pod) = await pipe.execute()
        return bool(queued) or bool(job and pod)

    def _read_quotas(self, pipe: Any) -> None:
        pipe.hget(self.key("qver"), "n")  # first: see QuotaRows
        pipe.hgetall(self.key("quotas"))
        pipe.hgetall(self.key("usage"))
        pipe.hgetall(self.key("decayed"))
        pipe.hgetall(self.key("hold"))

    async def quota_rows(self) -> QuotaRows:
        async with self.redis.pipeline(transaction=False) as pipe:
            self._read_quotas(pipe)
            return _quota_rows(await pipe.execute())

    async def put_quota(self, tenant: str, quota_json: str | None, version: str) -> None:
        """Set (JSON) or delete (None) a tenant's quota, if the quotas are still at
        `version` (Conflict QUOTA: changed meanwhile; decide again)."""
        t = CellTxn()
        qver = cell_key("qver")
        t.expect(qver, "n", [version], reason=QUOTA, message="the quotas changed meanwhile")
        if quota_json is None:
            t.hdel(cell_key("quotas"), [tenant])
        else:
            t.hset(cell_key("quotas"), {tenant: quota_json})
        t.hincr(qver, "n", 1)
        await self._script.commit(t)

    async def hold_pod(self, job_id: str, pod: str, tenant: str, now_ms: int) -> bool:
        """Hold `pod` for `tenant`'s job `job_id` from `now_ms` (issue 35, quota.Hold) unless
        the cell holds a pod already: whether this call set it (one hold at a time,
        whichever replica sets it first)."""
        t = CellTxn()
        t.expect(cell_key("hold"), "job", [""], reason=MOVED, message="a pod is held for {}")
        t.hset(cell_key("hold"), {"job": job_id, "pod": pod, "tenant": tenant, "at": now_ms})
        return await self._try(t) is not None

    async def release_pod(self, job_id: str) -> bool:
        """End the hold for `job_id` (it started or left the cell queue), if it is its."""
        t = CellTxn()
        t.expect(cell_key("hold"), "job", [job_id], reason=MOVED, message="the hold is {}'s")
        t.hdel(cell_key("hold"), ["job", "pod", "tenant", "at"])
        return await self._try(t) is not None

    async def waiting_reason(self, job_id: str, reason: str, now_ms: int) -> None:
        """A queued job's reason (why it waits: its tenant's quota); nothing if it moved on."""
        t = CellTxn(jobs=[job_id])
        t.expect_phase(job_id, [QUEUED])
        t.hset(_job_key(job_id), {"reason": reason, "updated_ms": now_ms})
        await self._try(t)

    async def heard_from(self, pod_id: str) -> tuple[int, bool]:
        """(last heartbeat in ms, 0 if never; marked silent) of one pod, in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zscore(self.key("seen"), pod_id)
            pipe.sismember(self.key("down"), pod_id)
            seen, down = await pipe.execute()
        return int(seen or 0), bool(down)

    async def mark_suspect(self, pod_id: str, until_ms: int) -> None:
        await self.redis.hset(self.key("suspect"), pod_id, until_ms)

    async def registration(self, pod_id: str) -> str | None:
        return await self.redis.hget(self.key("pods"), pod_id)

    async def endpoint(self, pod_id: str) -> str | None:
        return await self.redis.hget(self.key("endpoint"), pod_id)

    async def endpoints(self, pod_id: str) -> list[tuple[str, int]]:
        raw = await self.redis.hgetall(self.key("endpoints", pod_id))
        return sorted(((a, _i(t)) for a, t in raw.items()), key=lambda e: -e[1])

    async def live_count(self, pod_id: str) -> int:
        return int(await self.redis.scard(self.key("pod", pod_id, "live")))

    async def mark_down(self, pod_id: str, now_ms: int, timeout_ms: int) -> int:
        """Mark a silent pod down and its jobs UNKNOWN (CS-6); -1 if it is not (newly) silent."""
        t = CellTxn(pod_id)
        t.expect_declared(cell_key("pod", pod_id, "live"), ["job", "ev"])
        t.op("mark_down", pod_id, now_ms, timeout_ms)
        return int((await self._script.commit(t))["count"])

    async def live_fields(
        self, pods: Sequence[str], names: Sequence[str]
    ) -> list[tuple[str, str, dict[str, str]]]:
        """(pod, job, its fields `names` that are set) of every live job on `pods`, in two
        round trips (the metrics' job states; reclaim's tenants, priorities and charges)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for p in pods:
                pipe.smembers(self.key("pod", p, "live"))
            live = await pipe.execute()
        owners = [(p, j) for p, jobs in zip(pods, live, strict=True) for j in sorted(jobs)]
        async with self.redis.pipeline(transaction=False) as pipe:
            for _, j in owners:
                pipe.hmget(self.job_key(j), list(names))
            rows = await pipe.execute()
        return [
            (p, j, {k: v for k, v in zip(names, row, strict=True) if v is not None})
            for (p, j), row in zip(owners, rows, strict=True)
        ]

    async def live_jobs(self, pod_id: str) -> list[str]:
        return sorted(await self.redis.smembers(self.key("pod", pod_id, "live")))

    # -- jobs (CS-2 … CS-5) ----------------------------------------------------------

    async def claim_new(
        self,
        job_id: str,
        *,
        fields: Mapping[str, Any],
        tenant: str,
        pod: str,
        needs: Mapping[str, int],
        token: str,
        until_ms: int,
        now_ms: int,
        check_free: bool,
        reason: str,
        expect_empty_queue: bool = False,
        charge: Mapping[str, int] | None = None,
        quota: QuotaGuard | None = None,
    ) -> Claimed:
        """Create the job, bound to `pod` (or queued when pod is ""): its sequence and,
        bound to a pod, the forward's fencing token (else 0). Conflict EXISTS when the id
        exists; STALE when the pod's free blocks (minus forwards in
        flight) no longer cover it; WAITING when jobs wait in the cell queue (with
        `expect_empty_queue`: the decision did not know of them)."""
        t = CellTxn(pod, tenant, [job_id])
        t.expect_no_key(_job_key(job_id), reason=EXISTS, message=f"job {job_id} exists")
        if pod and check_free:
            t.check("enough", pod, json.dumps(dict(needs)))
        if expect_empty_queue:
            t.expect_no_key(
                cell_key("queue"), reason=WAITING, message="jobs wait in the cell queue"
            )
        _expect_quota(t, quota, job_id)
        t.op(
            "claim_new",
            job_id,
            _fields(fields),
            tenant,
            pod,
            json.dumps(dict(needs)),
            token,
            until_ms,
            now_ms,
            reason,
            json.dumps(dict(charge or {})),
        )
        done = await self._script.commit(t)
        return Claimed(int(done["seq"]), int(done.values.get("fence", 0)))

    async def claim_queued(
        self,
        job_id: str,
        *,
        pod: str,
        needs: Mapping[str, int],
        token: str,
        until_ms: int,
        now_ms: int,
        check_free: bool,
        reason: str,
        request: str = "",
        charge: Mapping[str, int] | None = None,
        quota: QuotaGuard | None = None,
        fields: Mapping[str, str] | None = None,
    ) -> int:
        """A queued job bound to `pod` and charged to its tenant (`charge`): the forward's
        fencing token. Conflict
        MOVED when it is no longer queued; STALE when its blocks went; with `request`,
        CHANGED when its request is no longer the one the decision was made for (updated
        meanwhile); with `quota`, QUOTA when what its decision knew of them changed.
        `fields`: more of its record set with the claim."""
        t = CellTxn(pod, jobs=[job_id])
        t.expect_phase(job_id, [QUEUED])
        if request:
            t.expect_value(job_id, "req", request, reason=CHANGED)
        if check_free:
            t.check("enough", pod, json.dumps(dict(needs)))
        _expect_quota(t, quota, job_id)
        t.op(
            "claim_queued",
            job_id,
            pod,
            json.dumps(dict(needs)),
            token,
            until_ms,
            now_ms,
            reason,
            json.dumps(dict(charge or {})),
        )
        if fields:
            t.hset(_job_key(job_id), fields)
        return int((await self._script.commit(t))["fence"])

    def _forwarding(self, pod: str, job_id: str, token: str) -> CellTxn:
        t = CellTxn(pod, jobs=[job_id])
        t.expect_phase(job_id, [FORWARDING])
        t.expect_value(job_id, "token", token)
        return t

    async def placed(
        self,
        job_id: str,
        *,
        token: str,
        pod: str,
        state: str,
        n: int,
        reason: str,
        fields: Mapping[str, Any],
        now_ms: int,
    ) -> CellJobRecord | None:
        """FORWARDING → PLACED on `pod`, the record as it is then; None if the token no
        longer holds the job."""
        t = self._forwarding(pod, job_id, token)
        t.op("placed", job_id, pod, state, n, reason, _fields(fields), now_ms)
        t.read_record(job_id)
        done = await self._try(t)
        return CellJobRecord.of(job_id, _row(done.reads[0])) if done else None

    async def unbind(
        self,
        job_id: str,
        *,
        token: str,
        pod: str,
        uncertain: bool,
        version: str,
        reason: str,
        now_ms: int,
    ) -> bool:
        """FORWARDING → QUEUED; False if the token no longer holds the job."""
        t = self._forwarding(pod, job_id, token)
        kind = "uncertain" if uncertain else "refused"
        t.op("unbind", job_id, pod, kind, version, reason, now_ms)
        return await self._try(t) is not None

    async def end_queued(
        self, job_id: str, final: str, reason: str, now_ms: int, *, forget: bool = False
    ) -> str:
        """End a job in the cell queue: its final state, or "forgotten" (with `forget`,
        when no pod may have it: deleted). Conflict MOVED when it is no longer queued."""
        tenant = ""
        if forget:  # its tenant's index loses it: known before the commit, checked in it
            tenant = await self.redis.hget(_job_key(job_id), "tenant") or ""
        t = CellTxn(tenant=tenant, jobs=[job_id])
        t.expect_phase(job_id, [QUEUED])
        if forget:
            t.expect_value(job_id, "tenant", tenant)
        t.op("end_queued", job_id, final, reason, now_ms, int(forget))
        return str((await self._script.commit(t))["outcome"])

    async def mirror(
        self,
        job_id: str,
        *,
        pod: str,
        state: str,
        n: int,
        reason: str,
        now_ms: int,
        ended_here: bool = False,
        box: str = "",
    ) -> Mirrored:
        """Follow the pod's answer about a job (newer than what the cell has). `ended_here`:
        the answer to a complete or cancel through the cell, whose freed blocks count as
        free until the pod reports. `box`: the block a sub-block slice's box is in now
        ("" none)."""
        t = CellTxn(pod, jobs=[job_id])
        t.expect_value(job_id, "pod", pod)
        t.expect_phase(job_id, [PLACED])
        t.expect_number(_job_key(job_id), "n", "<=", n, reason=STALE)
        t.op("mirror", job_id, pod, state, n, reason, now_ms, int(ended_here), box)
        t.read_record(job_id)
        done = await self._try(t)
        if done is None:
            return Mirrored(False, await self.job(job_id))
        record = CellJobRecord.of(job_id, _row(done.reads[0]))
        return Mirrored(True, record, int(done["queued"]), bool(int(done["freed"])))

    async def update(
        self,
        job_id: str,
        *,
        phase: str,
        pod: str,
        request: str,
        priority: int,
        spec: str,
        reason: str,
        now_ms: int,
    ) -> CellJobRecord | None:
        """A job's new request and priority (UpdateJob), if it is still in `phase` (and on
        `pod`): in the cell queue it takes its new place, with an event; the record
        after, or None when the job moved on meanwhile."""
        t = CellTxn(jobs=[job_id])
        t.expect_phase(job_id, [phase])
        if phase == PLACED:
            t.expect_value(job_id, "pod", pod)
        t.op("update", job_id, request, priority, spec, reason, now_ms)
        t.read_record(job_id)
        done = await self._try(t)
        return CellJobRecord.of(job_id, _row(done.reads[0])) if done else None

    async def take_over(
        self, job_id: str, token: str, until_ms: int, now_ms: int
    ) -> tuple[str, int] | None:
        """Take a forward whose deadline passed: the pod it was bound to and the take-over's
        fencing token (the next forward number, higher than the forward's), or None."""
        t = CellTxn()
        k = _job_key(job_id)
        t.expect_phase(job_id, [FORWARDING])
        t.expect_number(k, "until", "<", now_ms, reason=MOVED)
        t.hset(k, {"token": token, "until": until_ms})
        t.zadd(cell_key("forwarding"), until_ms, job_id)
        t.read("HGET", k, "pod")
        t.read("INCR", cell_key("fwd"))
        done = await self._try(t)
        return (str(done.reads[0] or ""), int(done.reads[1])) if done else None

    async def adopt(
        self,
        job_id: str,
        *,
        pod: str,
        state: str,
        n: int,
        reason: str,
        fields: Mapping[str, Any],
        now_ms: int,
        charge: Mapping[str, int] | None = None,
    ) -> bool:
        """A queued job found on `pod` (it answered again) is placed there, charged to its
        tenant; False when it is no longer queued."""
        t = CellTxn(pod, jobs=[job_id])
        t.expect_phase(job_id, [QUEUED])
        t.op(
            "adopt",
            job_id,
            pod,
            state,
            n,
            reason,
            _fields(fields),
            now_ms,
            json.dumps(dict(charge or {})),
        )
        return await self._try(t) is not None

    async def requeue_released(self, job_id: str, *, pod: str, reason: str, now_ms: int) -> bool:
        """A job PLACED on `pod` that the pod let go back to the cell queue (a reclaim delayed
        it, issue 35), known from the pod's answer rather than its event: queued again as
        the report does it. False when it is not (or no longer) PLACED there."""
        t = CellTxn(pod, jobs=[job_id])
        t.expect_value(job_id, "pod", pod)
        t.expect_phase(job_id, [PLACED])
        t.op("released", job_id, pod, reason, now_ms)
        return await self._try(t) is not None

    async def forget_maybe(self, job_id: str, pod: str) -> None:
        t = CellTxn(jobs=[job_id])
        t.op("forget_maybe", job_id, pod)
        await self._script.commit(t)

    async def job(self, job_id: str) -> CellJobRecord | None:
        return CellJobRecord.of(
            job_id, _row(await self.redis.hmget(self.job_key(job_id), RECORD_FIELDS))
        )

    async def jobs(self, job_ids: Iterable[str]) -> list[CellJobRecord]:
        ids = list(job_ids)
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for j in ids:
                pipe.hmget(self.job_key(j), RECORD_FIELDS)
            rows = await pipe.execute()
        return [
            r for j, row in zip(ids, rows, strict=True) if (r := CellJobRecord.of(j, _row(row)))
        ]

    async def history(self, job_id: str, start: int = 0) -> list[dict[str, Any]]:
        """The cell's transitions of the job from the `start`-th (0-based). Free text is
        stored once: an end's event takes its reason from the record (store.lua)."""
        # (The record's reason is read after the events: an end's event is written with it.)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.lrange(_events_key(job_id), start, -1)
            pipe.hget(_job_key(job_id), "reason")
            raw, reason = await pipe.execute()
        events = [json.loads(e) for e in raw]
        for e in events:
            if e.pop("reason_in", "") == "record":
                e["reason"] = reason or ""
        return events

    async def queue_position(self, job_id: str) -> int:
        """1-based place in the cell queue; 0 when the job is not in it."""
        rank = await self.redis.zrank(self.key("queue"), job_id)
        return int(rank) + 1 if rank is not None else 0

    async def queue_positions(self, job_ids: Sequence[str]) -> dict[str, int]:
        """`queue_position` of several jobs in one round trip."""
        if not job_ids:
            return {}
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.zrank(self.key("queue"), job_id)
            ranks = await pipe.execute()
        return {j: int(r) + 1 if r is not None else 0 for j, r in zip(job_ids, ranks, strict=True)}

    async def page(self, index: str, *, before_seq: int | None, count: int) -> list[str]:
        hi = f"({before_seq}" if before_seq is not None else "+inf"
        return list(
            await self.redis.zrevrangebyscore(index, hi, "-inf", start=0, num=count)  # type: ignore[arg-type]
        )

    async def stuck_forwards(self, now_ms: int) -> list[str]:
        return list(await self.redis.zrangebyscore(self.key("forwarding"), "-inf", now_ms))

    async def maybe_jobs(self) -> list[str]:
        return sorted(await self.redis.smembers(self.key("maybe")))

    async def lease(self, name: str, owner: str, ttl_ms: int) -> bool:
        """A short lease so one replica does a piece of background work at a time."""
        return bool(await self.redis.set(self.key("lease", name), owner, nx=True, px=ttl_ms))

    async def release_lease(self, name: str, owner: str) -> None:
        key = self.key("lease", name)
        if await self.redis.get(key) == owner:
            await self.redis.delete(key)

    async def stream_tip(self) -> str:
        last = await self.redis.xrevrange(self.key("events"), count=1)
        return last[0][0] if last else "0-0"

    async def tail(self, after: str, block_ms: int = 1000) -> list[tuple[str, dict[str, str]]]:
        """Entries of the cell's event stream after `after`: {"job": id, "n": the event's
        number in the job's history}."""
        got = await self.redis.xread({self.key("events"): after}, block=block_ms, count=200)
        return [(eid, fields) for _stream, entries in got or [] for eid, fields in entries]
