"""WS-1, WS-7: the pod's block state, job records and events in Redis.

Keys (all under the pod's hash tag, so one pod's state is one Redis Cluster slot,
and under `ws:` beside the ocs_manager's `ocs:` keys of the same pod):

    lp:{pod}:ws:fabric            hash   block types and fabric facts, for people and peers
    lp:{pod}:ws:block:failed      hash   block id -> JSON {at, reason}   (absent = healthy);
                                         {at, reason, hosts: 1} when only hosts failed, each
                                         one then "h<b>.<host>" -> JSON {at, reason}
    lp:{pod}:ws:block:owner       hash   block id -> job id               (absent = free);
                                         "~sub" for a block given over to sub-block slices,
                                         whose chips are "c<b>.<x>.<y>.<z>" -> job id;
                                         SWITCHED pods also "t<g>.<i>.<j>" -> small job
    lp:{pod}:ws:block:wired       hash   block id -> job id whose OCS slice may still include it
    lp:{pod}:ws:live              hash   job id -> SliceJob JSON, for every non-final job
    lp:{pod}:ws:job:<id>          hash   spec (base64 JobSpec, as updated), admitted (as admitted,
                                         once an update changed spec), state, epoch, summary,
                                         note (a cancel reason: its only copy), ...
    lp:{pod}:ws:job:<id>:events   list   the job's transitions (JSON), oldest first
    lp:{pod}:ws:jobs              zset   every job id by admission sequence (ListJobs)
    lp:{pod}:ws:state_counts      hash   job state -> number of jobs in it
    lp:{pod}:ws:events            stream job transitions and block health changes (WatchPod)
    lp:{pod}:ws:seq               string admission sequence
    lp:{pod}:ws:releasing:<id>    string claim (with expiry) while a queued job's old wiring is released
    lp:{pod}:ws:released:<id>     string JSON {at, reason} (with expiry): the pod let the job go back
                                         to the cell queue (a reclaim delayed it, issue 35) and
                                         forgot it; GetJob says so (the cell requeues it)
    lp:{pod}:ws:forwards          hash   job id -> the highest forward token the cell sent for it
                                         (AdmitJob, a take-over's GetJob; fencing, issue 32)
    lp:{pod}:ws:wiring:diff       hash   "<kind>:<job>" -> JSON {job, kind, detail, since}: where
                                         RUNNING jobs and the ocs_manager's slices disagree,
                                         as the last reconcile round found (GetPod shows it)

Indexes kept by the same commits, so a decision reads only what it needs (issue 15):

    lp:{pod}:ws:block:free        string bitmap, bit b set: block b healthy and unowned
    lp:{pod}:ws:block:freewired   hash   block id -> job id: the wiring marks on free blocks
    lp:{pod}:ws:wired:count       hash   job id -> how many wiring marks it has
    lp:{pod}:ws:queued            hash   job id -> SliceJob JSON, for PENDING / SUSPENDED jobs
    lp:{pod}:ws:running           zset   RUNNING job ids, all scored 0 (ranges by id: the
                                         reconcile loop's sweep over the ocs_manager's slices)

The commit script updates the first three for every block field it writes in the
owner / failed / wired hashes (write_job keeps the queued hash and the running set);
`rebuild_indexes` derives them all from the hashes above (at start, and whenever the bitmap is missing).

Every change goes through `commit(txn)`: one Lua script that first checks what
the caller's decision assumed (a job's state and epoch, a block still free,
healthy, held by a given job, not wired to a live slice) and then applies all
writes, or applies none and says which check failed. So a block is never in
two slices even with several scheduler replicas deciding at once: the loser
of a race gets `Conflict`, takes a new snapshot and decides again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from lightpath.domain.blocks import PodFabric
from lightpath.domain.slices import (
    FINAL_STATES,
    QUEUED_STATES,
    RUNNING,
    SUB_BLOCK_OWNER,
    SUSPENDED,
    SliceJob,
    chip_keys,
)
from lightpath_services.common import txn
from lightpath_services.common.keys import pod_key
from lightpath_services.common.txn import Conflict, Program
from lightpath_services.workload_scheduler.placement import PodState

EVENT_STREAM_MAXLEN = 10_000
# How long the pod remembers a job it let go back to the cell queue (GetJob answers so):
# far longer than a cell outage that would let the event stream drop its event.
RELEASED_KEPT_MS = 7 * 24 * 3600 * 1000
# Parsed SliceJob summaries kept by their JSON (a job's summary changes with every
# transition, so a snapshot parses only what changed since the last one).
PARSED_CACHE_LIMIT = 4096

# Every script of this store: services/lightpath_services/common/txn.lua with store.lua's checks and ops.
PROGRAM = Program(
    __package__,
    "store.lua",
    {
        "SUB_BLOCK_OWNER": SUB_BLOCK_OWNER,
        "QUEUED_STATES": sorted(QUEUED_STATES),
        "RUNNING": RUNNING,
    },
)


class PodKeys:
    def __init__(self, pod_id: str):
        self.pod_id = pod_id
        self.fabric = pod_key(pod_id, "ws", "fabric")
        self.failed = pod_key(pod_id, "ws", "block", "failed")
        self.owner = pod_key(pod_id, "ws", "block", "owner")
        self.wired = pod_key(pod_id, "ws", "block", "wired")
        self.live = pod_key(pod_id, "ws", "live")
        self.jobs = pod_key(pod_id, "ws", "jobs")
        self.state_counts = pod_key(pod_id, "ws", "state_counts")
        self.events = pod_key(pod_id, "ws", "events")
        self.seq = pod_key(pod_id, "ws", "seq")
        self.wiring_diff = pod_key(pod_id, "ws", "wiring", "diff")
        self.free = pod_key(pod_id, "ws", "block", "free")
        self.freewired = pod_key(pod_id, "ws", "block", "freewired")
        self.wired_count = pod_key(pod_id, "ws", "wired", "count")
        self.queued = pod_key(pod_id, "ws", "queued")
        self.running = pod_key(pod_id, "ws", "running")
        self.forwards = pod_key(pod_id, "ws", "forwards")
        self._job_prefix = pod_key(pod_id, "ws", "job") + ":"

    def job(self, job_id: str) -> str:
        """`pod_key(pod, "ws", "job", job_id)`, without re-checking the pod id each time."""
        if not job_id or "{" in job_id or "}" in job_id:
            return pod_key(self.pod_id, "ws", "job", job_id)  # raises, naming the rule
        return self._job_prefix + job_id

    def history(self, job_id: str) -> str:
        return self.job(job_id) + ":events"

    def releasing(self, job_id: str) -> str:
        """Claim held while one replica releases a queued job's leftover OCS wiring."""
        return pod_key(self.pod_id, "ws", "releasing", job_id)

    def released(self, job_id: str) -> str:
        """A job the pod let go back to the cell queue: what GetJob answers about it."""
        return pod_key(self.pod_id, "ws", "released", job_id)


# The job hash's field with a caller's own words for a transition (a cancel reason),
# stored there only; an event with NOTE set refers to it.
NOTE = "note"


class Txn(txn.Txn):
    """Checks and writes for one atomic commit of the pod's state (lightpath_services.common.txn),
    in the pod's terms."""

    def __init__(self, keys: PodKeys):
        super().__init__()
        self.pod = keys
        self._reads: list[str] = []  # "hmget" | "job" per read_back / read_job, in order

    # -- checks ----------------------------------------------------------------

    def expect_job(self, job_id: str, states: Iterable[str], epoch: int = -1) -> None:
        allowed = list(states)
        k = self.pod.job(job_id)
        self.expect(
            k,
            "state",
            allowed,
            reason="state",
            message=f"job {job_id} is {{}}",
            absent=f"job {job_id} does not exist",
        )
        if epoch >= 0:
            ok = [str(epoch), *([""] if "" in allowed else [])]
            self.expect(
                k, "epoch", ok, reason="epoch", message=f"job {job_id} changed (epoch {{}})"
            )

    def expect_no_job(self, job_id: str) -> None:
        self.expect_job(job_id, [""])

    def expect_owner(self, block: int | str, owners: Iterable[str]) -> None:
        """Block held by one of `owners` ("" = free)."""
        self.expect(
            self.pod.owner,
            str(block),
            owners,
            reason="owner",
            message=f"block {block} is held by {{}}",
            absent=f"block {block} is held by nobody",
        )

    def expect_health(self, block: int | str, health: str) -> None:
        self.expect_field(
            self.pod.failed,
            str(block),
            health == "FAILED",
            reason="health",
            message=f"block {block} is not {health}",
        )

    def expect_wired_by(self, block: int | str, allowed: Iterable[str]) -> None:
        """Block unmarked, or marked by one of `allowed`."""
        self.expect(
            self.pod.wired,
            str(block),
            ["", *allowed],
            reason="wired",
            message=f"block {block} is still wired to {{}}",
        )

    def expect_not_whole_failed(self, block: int) -> None:
        """Block healthy, or failed only in some of its hosts (issue 28)."""
        self.check("notwhole", self.k(self.pod.failed), str(block))

    def expect_host_health(self, block: int, host: int, health: str) -> None:
        self.expect_health(f"h{block}.{host}", health)

    def expect_no_release_claim(self, job_id: str) -> None:
        self.expect_no_key(
            self.pod.releasing(job_id),
            reason="releasing",
            message=f"job {job_id} is being released",
        )

    # -- writes ----------------------------------------------------------------

    def release_held(self, job: SliceJob, block_shape: Sequence[int]) -> None:
        """Give up what `job` holds: its blocks, or a sub-block slice's chips (then its
        block leaves sub-block use if no other slice holds chips there)."""
        self.hdel(self.pod.owner, job.held_keys())
        if job.offset is not None and job.placement:
            self.leave_block_if_empty(job.placement[0], block_shape)

    def leave_block_if_empty(self, block: int, block_shape: Sequence[int]) -> None:
        every = chip_keys(block, (0,) * len(block_shape), tuple(block_shape))
        self.op("subfree", str(block), *every)

    def unwire(self, job_id: str) -> None:
        self.op("unwire", job_id)

    def job_event(self, event: dict[str, Any]) -> None:  # type: ignore[override]
        job_id = event["job"]
        k = self.pod
        super().job_event(
            k.job(job_id),
            k.history(job_id),
            k.events,
            EVENT_STREAM_MAXLEN,
            event,
            ["kind", "job", "job", job_id],
        )

    def block_event(self, event: dict[str, Any]) -> None:
        self.xadd(
            self.pod.events,
            EVENT_STREAM_MAXLEN,
            {"kind": "block", "e": json.dumps(event, separators=(",", ":"))},
        )

    # -- composite writes -----------------------------------------------------

    def write_job(
        self, job: SliceJob, *, old_state: str | None, reason: str, now_ms: int, note: str = ""
    ) -> None:
        """Store `job` (its state, epoch, summary), mirror it in the live set (or drop it
        there when final), count states, and record the transition as an event. A
        caller's own words for it (`note`: a cancel reason) are stored once, in the job's
        hash; the reason and the events refer to it (`with_note`)."""
        k = self.pod.job(job.job_id)
        summary = job.to_json()
        fields: dict[str, Any] = {
            "state": job.state,
            "epoch": job.epoch,
            "summary": summary,
            "reason": reason,
            "updated_ms": now_ms,
        }
        if note:
            fields[NOTE] = note
        self.hset(k, fields)
        if job.state in FINAL_STATES:
            self.hdel(self.pod.live, [job.job_id])
        else:
            self.hset(self.pod.live, {job.job_id: summary})
        if job.state in QUEUED_STATES:
            self.hset(self.pod.queued, {job.job_id: summary})
        elif old_state is None or old_state in QUEUED_STATES:
            self.hdel(self.pod.queued, [job.job_id])
        if job.state == RUNNING:
            self.zadd(self.pod.running, 0, job.job_id)
        elif old_state == RUNNING:
            self.zrem(self.pod.running, job.job_id)
        if old_state != job.state:
            if old_state:
                self.hincr(self.pod.state_counts, old_state, -1)
            self.hincr(self.pod.state_counts, job.state, 1)
        event: dict[str, Any] = {
            "job": job.job_id,
            "from": old_state or "",
            "to": job.state,
            "at": now_ms,
            "reason": reason,
        }
        if note:
            event[NOTE] = 1  # the words are the job hash's NOTE field
        self.job_event(event)

    def forget(self, job_id: str, state: str, event: dict[str, Any]) -> None:
        """Drop a job in `state` (PENDING, or RUNNING) from the pod's records and indexes:
        `event`, its last transition, reaches the pod's watchers (and the cell), and the
        job's keys go right after it."""
        k = self.pod
        self.hdel(k.live, [job_id])
        if state == RUNNING:
            self.zrem(k.running, job_id)
        else:
            self.hdel(k.queued, [job_id])
        self.hincr(k.state_counts, state, -1)
        self.zrem(k.jobs, job_id)
        self.job_event({"job": job_id, "from": state, **event})
        self.delete(k.job(job_id))
        self.delete(k.history(job_id))

    def release_to_cell(self, job: SliceJob, *, reason: str, now_ms: int) -> None:
        """Let a RUNNING job go back to the cell queue (a reclaim delayed it, issue 35):
        the pod forgets it in this commit (its blocks are freed by the caller's writes,
        its leftover wiring released as a job the pod does not know). The event, with
        `released`, is the cell's to act on: the pod's stream holds it until the cell
        acknowledges it, and the tombstone answers GetJob after the stream lost it."""
        k = self.pod
        self.forget(
            job.job_id,
            RUNNING,
            {"to": SUSPENDED, "at": now_ms, "reason": reason, "released": 1},
        )
        self.set_px(
            k.released(job.job_id),
            json.dumps({"at": now_ms, "reason": reason}),
            RELEASED_KEPT_MS,
        )

    def read_back(self, key: str, fields: Sequence[str]) -> None:
        """After the writes, return these fields of hash `key` from commit()."""
        self.read("HMGET", key, *fields)
        self._reads.append("hmget")

    def read_job(self, job_id: str) -> None:
        """After the writes, return the job's record (with history) from commit()."""
        self.read("HGETALL", self.pod.job(job_id))
        self.read("LRANGE", self.pod.history(job_id), 0, -1)
        self._reads.append("job")

    def payload(self) -> tuple[list[str], str]:
        k = self.pod
        for name in ("owner", "failed", "wired", "free", "freewired", "wired_count"):
            self.name(name, getattr(k, name))
        return super().payload()


@dataclass(frozen=True)
class JobRecord:
    """A stored job as GetJob answers it."""

    job_id: str
    spec_b64: str
    state: str
    epoch: int
    reason: str
    summary: SliceJob
    created_ms: int
    updated_ms: int
    history: tuple[dict[str, Any], ...] = ()
    # Victims of the preemption that placed it (WS-4), as stored at allocation.
    preempted: tuple[dict[str, Any], ...] = ()
    # The spec as admitted, when an update (UpdateJob) changed `spec_b64` since: a
    # retried AdmitJob of the same request is compared with this one.
    admitted_b64: str = ""

    @property
    def submitted_b64(self) -> str:
        """The spec as admitted (the idempotency key of AdmitJob)."""
        return self.admitted_b64 or self.spec_b64


class PodStore:
    """Redis persistence of one pod's scheduling state (WS-1)."""

    def __init__(self, redis: aioredis.Redis, pod_id: str):
        self.redis = redis
        self.keys = PodKeys(pod_id)
        self._script = PROGRAM.bind(redis)
        self._parsed: dict[str, SliceJob] = {}

    def slice_job(self, raw: str) -> SliceJob:
        """SliceJob.from_json, remembered by its JSON (SliceJob is immutable)."""
        job = self._parsed.get(raw)
        if job is None:
            if len(self._parsed) >= PARSED_CACHE_LIMIT:
                self._parsed.clear()
            job = self._parsed[raw] = SliceJob.from_json(raw)
        return job

    def txn(self) -> Txn:
        return Txn(self.keys)

    async def commit(self, txn: Txn) -> list[Any]:
        """Apply `txn` atomically, or raise Conflict naming the first failed check.
        Returns what `read_back` / `read_job` asked for, in order (a JobRecord for read_job)."""
        reads = iter((await self._script.commit(txn)).reads)
        out: list[Any] = []
        for shape in txn._reads:
            if shape == "job":
                row, history = _pairs(next(reads)), next(reads)
                job_id = self.slice_job(row["summary"]).job_id if "summary" in row else ""
                out.append(self._record(job_id, row, history))
            else:
                out.append(next(reads))
        return out

    async def _read(self, names: Iterable[str], *ops: Sequence[Any]) -> list[Any]:
        """Run the ops of store.lua that read (with the named keys of the pod declared)."""
        t = txn.Txn()
        for name in names:
            t.name(name, getattr(self.keys, name))
        for o in ops:
            t.op(*o)
        return (await self._script.commit(t)).reads

    async def _snapshot(self, extra: str = "") -> list[Any]:
        """Block health, owners, wiring marks and live jobs (and `extra`: the next
        admission sequence, or the newest event's id) in one atomic read: MULTI, which
        costs Redis less than a script for plain reads on this hottest path."""
        k = self.keys
        async with self.redis.pipeline(transaction=True) as pipe:
            for key in (k.failed, k.owner, k.wired, k.live):
                pipe.hgetall(key)
            if extra == "seq":
                pipe.incr(k.seq)
            elif extra == "tip":
                pipe.xrevrange(k.events, count=1)
            got = await pipe.execute()
        if extra == "tip":
            got[4] = got[4][0][0] if got[4] else "0-0"
        return got

    async def next_seq(self) -> int:
        return int(await self.redis.incr(self.keys.seq))

    async def forward_token(self, job_id: str) -> int:
        """The highest forward token the cell sent for `job_id` (0: none)."""
        return int(await self.redis.hget(self.keys.forwards, job_id) or 0)

    async def fence_forward(self, job_id: str, token: int) -> None:
        """Record a cell take-over's forward token for `job_id`, so an older forward is
        refused from now on; Conflict(STALE_LEASE, value: the newer token) when a newer
        one is recorded already."""
        t = self.txn()
        t.fence(self.keys.forwards, job_id, token)
        await self.commit(t)

    async def save_fabric(self, fabric: PodFabric, describe: dict[str, str]) -> None:
        mapping: dict[str, str] = {"node_types": json.dumps(list(fabric.node_types)), **describe}
        await self.redis.hset(self.keys.fabric, mapping=mapping)  # type: ignore[arg-type]

    async def snapshot(self, fabric: PodFabric) -> PodState:
        """One round trip (one script, so one atomic read): block health, owners, wiring
        marks and live jobs."""
        return self._state(fabric, await self._snapshot())

    async def snapshot_and_seq(self, fabric: PodFabric) -> tuple[PodState, int]:
        """The snapshot and, in the same round trip, the next admission sequence (INCR)."""
        reply = await self._snapshot("seq")
        return self._state(fabric, reply), int(reply[4])

    async def snapshot_and_tip(self, fabric: PodFabric) -> tuple[PodState, str]:
        """The snapshot and the id of the newest event in the same atomic read: every
        change to the state appends an event in its own commit, so the id versions
        exactly this state (a capacity report carries it; see cell_link)."""
        reply = await self._snapshot("tip")
        return self._state(fabric, reply), str(reply[4])

    async def tip(self) -> str:
        """The id of the newest event ("0-0" if none): it changes with every commit that
        changes a job or a block's health."""
        last = await self.redis.xrevrange(self.keys.events, count=1)
        return str(last[0][0]) if last else "0-0"

    async def block(self, block: int) -> tuple[str, bool, SliceJob | None]:
        """One block in one read: who holds it ("" = nobody), whether it failed, and the
        holder as a live job (None when it is not live)."""
        ((owner, failed, raw),) = await self._read(
            ("owner", "live", "failed"), ("block", str(block))
        )
        return owner, bool(int(failed)), self.slice_job(raw) if raw else None

    async def marks_page(
        self, cursor: int, count: int
    ) -> tuple[int, dict[str, str], dict[str, SliceJob]]:
        """A page of the wiring marks from an HSCAN `cursor` (0 = from the start; the
        next one is 0 after the last page): the next cursor, the marks, and the live jobs
        among those marking."""
        ((nxt, marks, jobs),) = await self._read(("wired", "live"), ("marks", cursor, count))
        live = {j: self.slice_job(raw) for j, raw in _pairs(jobs).items()}
        return int(nxt), _pairs(marks), live

    async def live_in_range(
        self, after: str, upto: str | None, also: Sequence[str] = ()
    ) -> dict[str, SliceJob]:
        """RUNNING jobs with ids in (after, upto] (None: to the last), and the live ones
        of `also`."""
        (flat,) = await self._read(("running", "live"), ("range", after, upto or "", *also))
        return {j: self.slice_job(raw) for j, raw in _pairs(flat).items()}

    async def holder(self, block: int) -> SliceJob | None:
        """The live job holding `block`, in one read."""
        return (await self.block(block))[2]

    async def rebuild_indexes(self, fabric: PodFabric) -> None:
        """Derive the free-block and queue indexes from the pod's hashes (one atomic
        script, so safe beside other replicas' commits)."""
        names = ("owner", "failed", "wired", "live", "free", "freewired", "wired_count")
        await self._read((*names, "queued", "running"), ("rebuild", fabric.block_count))

    async def lean_snapshot(
        self, fabric: PodFabric, *, jobs: Sequence[str] = (), extra: str = ""
    ) -> tuple[PodState, Any]:
        """What a decision that takes free blocks needs, independent of the number of
        live jobs (issue 15): free blocks (healthy, unowned), the wiring marks on them
        and their jobs, the failed blocks, the queue, and the jobs named in `jobs`. The
        state is `partial` (PodState): a decision that needs more (preemption) takes a
        full snapshot. With `extra` "seq" / "tip", also what snapshot_and_seq /
        snapshot_and_tip add. OCS_TORUS pods only."""
        names = ["free", "freewired", "failed", "queued", "live", "wired_count"]
        if extra:
            names.append("seq" if extra == "seq" else "events")
        for _ in range(2):
            (reply,) = await self._read(names, ("lean", extra, *jobs))
            if int(reply[0]) == 1:
                break
            await self.rebuild_indexes(fabric)  # Redis lost it (or it was never built)
        else:
            raise Conflict("index", "the free-block index is missing")
        _, bitmap, fw, failed, queued, named, marked, tip = reply
        live = {j: self.slice_job(raw) for j, raw in _pairs(named).items()}
        live.update((j, self.slice_job(raw)) for j, raw in _pairs(queued).items())
        state = PodState(
            fabric,
            failed={int(b) for b in failed if b[0] != "h"},
            wired={int(b): j for b, j in _pairs(fw).items()},
            jobs=live,
            free=_bits(bytes.fromhex(bitmap or ""), fabric.block_count),
            marked=frozenset(marked),
        )
        return state, tip

    def _state(self, fabric: PodFabric, reply: list[Any]) -> PodState:
        failed, owner, wired, live = reply[:4]  # dicts (HGETALL in MULTI)
        # Small jobs of a SWITCHED pod hold processors ("t<g>.<i>.<j>"), sub-block slices
        # chips ("c<b>.<x>.<y>.<z>"), not blocks; failed hosts are "h<b>.<host>".
        hosts: dict[int, set[int]] = {}
        for f in failed:
            if f[0] == "h":
                b, h = f[1:].split(".")
                hosts.setdefault(int(b), set()).add(int(h))
        only_hosts = {
            b: frozenset(hosts.get(b, ()))
            for b, raw in ((int(f), raw) for f, raw in failed.items() if f[0] != "h")
            if '"hosts"' in raw and json.loads(raw).get("hosts")
        }
        return PodState(
            fabric,
            failed={int(b) for b in failed if b[0] != "h"},
            owner={int(b): j for b, j in owner.items() if b[0] not in "tc"},
            wired={int(b): j for b, j in wired.items() if b[0] != "t"},
            jobs={j: self.slice_job(s) for j, s in live.items()},
            tile_owner={b: j for b, j in owner.items() if b[0] in "tc"},
            tile_wired={b: j for b, j in wired.items() if b[0] == "t"},
            failed_hosts=only_hosts,
        )

    async def wired_jobs(self) -> set[str]:
        """Jobs whose OCS wiring may still exist (their marks)."""
        values: list[str] = await self.redis.hvals(self.keys.wired)  # type: ignore[assignment, misc]
        return set(values)

    async def wiring_report(self) -> dict[str, dict[str, Any]]:
        """The differences the last reconcile round found (see consistency.py), by key."""
        raw: dict[str, str] = await self.redis.hgetall(self.keys.wiring_diff)  # type: ignore[assignment, misc]
        return {k: json.loads(v) for k, v in raw.items()}

    async def save_wiring_report(self, report: dict[str, dict[str, Any]]) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.wiring_diff)
            if report:
                pipe.hset(
                    self.keys.wiring_diff,
                    mapping={k: json.dumps(v, separators=(",", ":")) for k, v in report.items()},
                )
            await pipe.execute()

    async def failed_entry(self, block: int) -> dict[str, Any] | None:
        """A block's failure record ({at, reason[, hosts]}), None when it is healthy."""
        raw = await self.redis.hget(self.keys.failed, str(block))
        return json.loads(raw) if raw else None

    async def released(self, job_id: str) -> dict[str, Any] | None:
        """{at, reason} of a job the pod let go back to the cell queue (issue 35), or None."""
        raw = await self.redis.get(self.keys.released(job_id))
        return json.loads(raw) if raw else None

    async def job(self, job_id: str, *, history: bool = False) -> JobRecord | None:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.job(job_id))
            if history:
                pipe.lrange(self.keys.history(job_id), 0, -1)
            results = await pipe.execute()
        return self._record(job_id, results[0], results[1] if history else [])

    async def jobs_page(self, *, before_seq: int | None, count: int) -> list[JobRecord]:
        """Jobs newest first, with admission sequence below `before_seq`."""
        hi = f"({before_seq}" if before_seq is not None else "+inf"
        ids: list[str] = await self.redis.zrevrangebyscore(  # type: ignore[assignment]
            self.keys.jobs, hi, "-inf", start=0, num=count, withscores=False
        )
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hgetall(self.keys.job(job_id))
            rows = await pipe.execute()
        return [
            r for job_id, row in zip(ids, rows, strict=True) if (r := self._record(job_id, row, []))
        ]

    async def state_counts(self) -> dict[str, int]:
        raw: dict[str, str] = await self.redis.hgetall(self.keys.state_counts)  # type: ignore[assignment]
        return {k: int(v) for k, v in raw.items() if int(v) > 0}

    async def with_notes(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Job events as callers see them: those referring to their job's note with its
        words in their reason (one read for all the jobs that have one)."""
        wanted = sorted({e["job"] for e in events if e.get(NOTE)})
        if not wanted:
            return events
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in wanted:
                pipe.hget(self.keys.job(job_id), NOTE)
            notes = dict(zip(wanted, await pipe.execute(), strict=True))
        return [with_note(e, notes.get(e["job"])) if e.get(NOTE) else e for e in events]

    def _record(self, job_id: str, row: dict[str, str], history: list[str]) -> JobRecord | None:
        if not row or "state" not in row:
            return None
        note = row.get(NOTE)
        return JobRecord(
            job_id=job_id,
            spec_b64=row.get("spec", ""),
            state=row["state"],
            epoch=int(row.get("epoch", 0)),
            reason=_noted(row.get("reason", ""), note) if note else row.get("reason", ""),
            summary=self.slice_job(row["summary"]),
            created_ms=int(row.get("created_ms", 0)),
            updated_ms=int(row.get("updated_ms", 0)),
            history=tuple(with_note(e, note) for e in map(json.loads, history)),
            preempted=tuple(json.loads(row["preempted"])) if row.get("preempted") else (),
            admitted_b64=row.get("admitted", ""),
        )


def with_note(event: dict[str, Any], note: str | None) -> dict[str, Any]:
    """`event` with the words of its job's note in its reason, if it refers to them."""
    if not event.get(NOTE):
        return event
    out = {k: v for k, v in event.items() if k != NOTE}
    out["reason"] = _noted(event.get("reason", ""), note)
    return out


def _noted(reason: str, note: str | None) -> str:
    return f"{reason}: {note}" if note else reason


def _bits(bitmap: bytes, n: int) -> set[int]:
    """The set bits of a Redis bitmap (bit 0 = the high bit of the first byte), below n."""
    out: set[int] = set()
    for i, byte in enumerate(bitmap):
        if byte:
            base = i * 8
            out.update(base + o for o in _BYTE_BITS[byte] if base + o < n)
    return out


_BYTE_BITS = [tuple(o for o in range(8) if byte & (0x80 >> o)) for byte in range(256)]


def _pairs(flat: list[str]) -> dict[str, str]:
    """A flat HGETALL reply from a script -> dict."""
    it = iter(flat)
    return dict(zip(it, it, strict=True))
