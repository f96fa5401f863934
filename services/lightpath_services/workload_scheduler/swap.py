"""Failure and recovery (WS-5): a failed block of a running slice swapped for a spare
at the same logical position, several of one slice back to back (issue 15), or the
slice suspended or failed when no block can be had."""

from __future__ import annotations

import json

from lightpath.domain.slices import (
    FAIL,
    FAILED,
    RUNNING,
    SUB_BLOCK_OWNER,
    SUSPENDED,
    WIRING,
    SliceJob,
    describe_box,
    grid_positions,
)
from lightpath.errors import InvalidArgument, NotFound
from lightpath_services.workload_scheduler.admission import Admission
from lightpath_services.workload_scheduler.core import (
    FINISH_RELEASE_WAIT_S,
    MAX_COMMIT_ATTEMPTS,
    Outcome,
    Part,
    PodContext,
    _pos,
    _SwapRun,
    _victim_json,
)
from lightpath_services.workload_scheduler.ocs import OcsError, ReplaceResult, job_lease
from lightpath_services.workload_scheduler.placement import PodState
from lightpath_services.workload_scheduler.planner import (
    Replacement,
    boxes_on_failed_chips,
    plan_box_move,
    waited_past,
)
from lightpath_services.workload_scheduler.store import Conflict
from lightpath_services.workload_scheduler.wiring import Wirer


class Swap(Part):
    """Failure and recovery: block and host health, swaps, moved boxes. A swap frees
    and wires through `wiring`, takes victims and asks for passes through `admission`."""

    def __init__(self, pod: PodContext, wiring: Wirer, admission: Admission):
        super().__init__(pod)
        self.wiring = wiring
        self.admission = admission
        # Slices of which this replica is swapping failed blocks, back to back (WS-5).
        self._swap_runs: dict[str, _SwapRun] = {}

    # == failure and recovery (WS-5) ==============================================

    async def report_health(
        self, block: int, healthy: bool, reason: str, host: int | None = None
    ) -> Outcome:
        if not 0 <= block < self.fabric.block_count:
            raise NotFound(
                "block", str(block), hint=f"this pod has blocks 0..{self.fabric.block_count - 1}"
            )
        if host is not None:
            return await self.report_host_health(block, host, healthy, reason)
        keys = self.store.keys
        now = self.now_ms()
        entry = await self.store.failed_entry(block)
        only_hosts = entry is not None and bool(entry.get("hosts"))
        txn = self.store.txn()
        if healthy:
            # A block-level report covers every host: their reports go with it.
            txn.expect_health(block, "FAILED")
            txn.hdel(keys.failed, [block, *self._host_fields(block)])
        else:
            if only_hosts:  # failed in some hosts so far: now as a whole
                txn.expect_not_whole_failed(block)
            else:
                txn.expect_health(block, "HEALTHY")
            txn.hset(keys.failed, {block: json.dumps({"at": now, "reason": reason})})
        txn.block_event(
            {
                "block": block,
                "health": "HEALTHY" if healthy else "FAILED",
                "at": now,
                "reason": reason,
            }
        )
        changed = True
        try:
            await self.store.commit(txn)
        except Conflict:
            changed = False  # already in that state: the report is idempotent
        if changed:
            self.log.info(
                "block %d %s: %s",
                block,
                "recovered" if healthy else "failed",
                reason,
                extra={"block": block},
            )
        if healthy:
            await self.admission.schedule()
            return Outcome(
                action="block is healthy and back in the pool"
                if changed
                else "no change: block was healthy"
            )
        sharing: list[SliceJob] = []
        if self.planner.lean:
            holder, _, job = await self.store.block(block)  # one read, whatever the live jobs
        else:  # the small jobs sharing a group are not indexed: the whole pod
            state = await self.snapshot()
            holder = state.owner.get(block, "")
            job = state.jobs.get(holder) if holder else None
            sharing = sorted(
                (
                    j
                    for j in state.jobs.values()
                    if j.tile and j.tile[0] == block and j.state == RUNNING
                ),
                key=SliceJob.queue_key,
            )
        if holder == SUB_BLOCK_OWNER:
            return await self._move_boxes(block)
        if sharing:  # small jobs of a SWITCHED pod's shared group (SW-2, SW-5)
            outcome = Outcome()
            for small in sharing:
                done = await self.handle_failure(small.job_id, block)
                outcome.affected += done.affected
                outcome.action = "; ".join(a for a in (outcome.action, done.action) if a)
            return outcome
        return await self._failed_under(block, job, "block", "it held no slice")

    async def _failed_under(
        self, block: int, job: SliceJob | None, what: str, idle: str
    ) -> Outcome:
        """What a failed block (or host, `what` says which) does to the slice holding it:
        swapped (WS-5), or swapped once its wiring ends; `idle` when it held none."""
        if job is None:
            return Outcome(action=f"{what} marked failed; {idle}")
        if job.state == WIRING:
            return Outcome(
                action=f"{what} marked failed; job {job.job_id} is being wired and will get "
                "a replacement once it runs"
            )
        return await self.handle_failure(job.job_id, block)

    # == hosts and sub-block slices (issue 28) =====================================

    def _host_fields(self, block: int) -> list[str]:
        return [f"h{block}.{h}" for h in range(self.fabric.hosts_per_block)]

    async def report_host_health(
        self, block: int, host: int, healthy: bool, reason: str
    ) -> Outcome:
        """One host of a block FAILED or RECOVERED. A failed host takes its chips out:
        the block takes no block slice (a block slice holding it swaps it, as for a
        failed block) and the sub-block slices on its chips move to healthy chips (or
        follow on_block_failure); its other hosts keep serving sub-block slices."""
        fabric = self.fabric
        n = fabric.hosts_per_block
        if not 0 <= host < n:
            grid = "x".join(map(str, fabric.host_grid))
            shape = "x".join(map(str, fabric.host_shape))
            raise InvalidArgument(
                "host",
                f"block {block} has hosts 0..{n - 1} ({grid} hosts of {shape} chips, "
                "LIGHTPATH_HOST_SHAPE)",
                reason="HOST_OUT_OF_RANGE",
            )
        keys = self.store.keys
        now = self.now_ms()
        entry = await self.store.failed_entry(block)
        whole = entry is not None and not entry.get("hosts")
        field = f"h{block}.{host}"
        txn = self.store.txn()
        if healthy:
            txn.expect_host_health(block, host, "FAILED")
            txn.hdel(keys.failed, [field])
            if not whole:
                # The block is healthy again once its last failed host recovered: the
                # other hosts' checks keep a report racing in through another replica.
                others = await self.store.redis.hmget(keys.failed, self._host_fields(block))
                if not any(v for h, v in enumerate(others) if h != host):
                    for h in range(n):
                        if h != host:
                            txn.expect_host_health(block, h, "HEALTHY")
                    txn.expect_not_whole_failed(block)
                    txn.hdel(keys.failed, [block])
        else:
            txn.expect_host_health(block, host, "HEALTHY")
            txn.hset(keys.failed, {field: json.dumps({"at": now, "reason": reason})})
            if not whole:
                txn.expect_not_whole_failed(block)
                txn.hset(
                    keys.failed,
                    {
                        block: json.dumps(
                            {"at": now, "reason": f"host {host} failed: {reason}", "hosts": 1}
                        )
                    },
                )
        txn.block_event(
            {
                "block": block,
                "host": host,
                "health": "HEALTHY" if healthy else "FAILED",
                "at": now,
                "reason": reason,
            }
        )
        try:
            await self.store.commit(txn)
        except Conflict:
            what = "healthy" if healthy else "failed"
            return Outcome(action=f"no change: host {host} of block {block} was {what}")
        self.log.info(
            "host %d of block %d %s: %s",
            host,
            block,
            "recovered" if healthy else "failed",
            reason,
            extra={"block": block},
        )
        if healthy:
            await self.admission.schedule()
            return Outcome(action=f"host {host} of block {block} is healthy and back in the pool")
        holder, _, job = await self.store.block(block)
        if holder == SUB_BLOCK_OWNER:
            return await self._move_boxes(block)
        return await self._failed_under(
            block,
            job,
            f"host {host} of block {block}",
            "the block takes no block slice until it recovers, its other hosts serve "
            "sub-block slices",
        )

    async def _move_boxes(self, block: int) -> Outcome:
        """Move every sub-block slice on failed chips of `block` (issue 28)."""
        state = await self.snapshot()
        outcome = Outcome()
        for job in boxes_on_failed_chips(state, block):
            done = await self.move_box(job.job_id)
            outcome.affected += done.affected
            outcome.moved += done.moved
            outcome.action = "; ".join(a for a in (outcome.action, done.action) if a)
        if not outcome.action:
            outcome.action = f"block {block}: no sub-block slice was on the failed chips"
        return outcome

    async def move_box(self, job_id: str) -> Outcome:
        """A running sub-block slice with a chip on a failed host or block: to healthy
        chips (no OCS change), or SUSPENDED / FAILED as its on_block_failure says."""
        for _ in range(MAX_COMMIT_ATTEMPTS):
            state = await self.snapshot()
            job = state.jobs.get(job_id)
            if job is None or job not in boxes_on_failed_chips(state):
                return Outcome(action=f"nothing to do for job {job_id}")
            target = plan_box_move(state, job)
            try:
                if target is None:
                    return await self._lose_box(job)
                return await self._commit_box_move(job, target.block, target.offset)
            except Conflict:
                continue
        return Outcome(action=f"job {job_id}: state kept changing; the reconcile loop retries")

    async def _commit_box_move(self, job: SliceJob, block: int, offset: tuple[int, ...]) -> Outcome:
        assert job.placement is not None
        keys = self.store.keys
        moved = job.with_(epoch=job.epoch + 1, placement=(block,), offset=offset)
        old, new = set(job.held_keys()), moved.held_keys()
        txn = self.store.txn()
        txn.expect_job(job.job_id, [RUNNING], job.epoch)
        self.admission.box_checks(txn, moved, [], ())
        for k in new:
            txn.expect_owner(k, ["", job.job_id])
        txn.hdel(keys.owner, sorted(old - set(new)))
        txn.hset(keys.owner, {block: SUB_BLOCK_OWNER})
        txn.hset(keys.owner, {k: job.job_id for k in new})
        if job.placement[0] != block:
            txn.leave_block_if_empty(job.placement[0], self.fabric.block_shape)
        reason = (
            f"moved off failed chips from {describe_box(job)} to {describe_box(moved)} "
            "(no OCS change)"
        )
        txn.write_job(moved, old_state=RUNNING, reason=reason, now_ms=self.now_ms())
        await self.store.commit(txn)
        self.log.info("job %s %s", job.job_id, reason, extra={"job_id": job.job_id})
        return Outcome(
            action=f"job {job.job_id} {reason}", affected=[job.job_id], moved=[(job, moved)]
        )

    async def _lose_box(self, job: SliceJob) -> Outcome:
        final = job.on_block_failure == FAIL
        new = job.with_(state=FAILED if final else SUSPENDED, epoch=job.epoch + 1, placement=None)
        reason = f"chips of {describe_box(job)} failed and no healthy chips are free; " + (
            "failed as the job asked" if final else "suspended until chips free"
        )
        txn = self.store.txn()
        txn.expect_job(job.job_id, [RUNNING], job.epoch)
        txn.release_held(job, self.fabric.block_shape)
        txn.write_job(new, old_state=RUNNING, reason=reason, now_ms=self.now_ms())
        await self.store.commit(txn)
        self.log.warning("job %s: %s", job.job_id, reason, extra={"job_id": job.job_id})
        await self.admission.schedule()
        return Outcome(
            action=f"job {job.job_id} {new.state.lower()}: {reason}", affected=[job.job_id]
        )

    async def handle_failure(self, job_id: str, failed: int) -> Outcome:
        """Keep a running slice alive through a failed block (Fig. 11, ¶126-132).

        Several failed blocks of one slice are swapped back to back (issue 15): while
        this replica swaps one, a report of another waits for that swap run, which takes
        the slice's next failed block as soon as the swap before is committed (it reads
        the failed blocks again each time, so blocks reported through another replica
        are included), instead of answering "already swapping" and leaving the block in
        the slice until a reconcile round."""
        while (run := self._swap_runs.get(job_id)) is not None:
            outcome = await run.outcome_of(failed)
            if outcome is not None:
                return outcome
        run = self._swap_runs[job_id] = _SwapRun()
        try:
            outcome = await self._handle_one(job_id, failed)
        except BaseException:
            self._end_swap_run(job_id, run)
            raise
        run.record(job_id, failed, outcome)
        self._spawn(self._continue_swap_run(job_id, run), f"swap {job_id}")
        return outcome

    async def _continue_swap_run(self, job_id: str, run: _SwapRun) -> None:
        """Swap the slice's other failed blocks, one after another, then end the run."""
        try:
            while True:
                state = await self._decision_state([job_id])
                job = state.jobs.get(job_id)
                if job is None or job.state != RUNNING or job.replacing or not job.placement:
                    return
                following = next((b for b in job.placement if b in state.failed), None)
                if following is None:
                    return
                run.record(job_id, following, await self._handle_one(job_id, following))
        finally:
            self._end_swap_run(job_id, run)

    def _end_swap_run(self, job_id: str, run: _SwapRun) -> None:
        if self._swap_runs.get(job_id) is run:
            del self._swap_runs[job_id]
        run.end()

    async def _decision_state(self, jobs: list[str], *, full: bool = False) -> PodState:
        """The lean snapshot naming `jobs` (issue 15), or the whole pod when asked or on
        a SWITCHED pod (its small jobs' processors are not indexed)."""
        if full or not self.planner.lean:
            return await self.snapshot()
        state, _ = await self.store.lean_snapshot(self.fabric, jobs=jobs)
        return state

    async def _handle_one(self, job_id: str, failed: int) -> Outcome:
        started = self.metrics.clock()
        full = False
        for _ in range(MAX_COMMIT_ATTEMPTS):
            state = await self._decision_state([job_id], full=full)
            job = state.jobs.get(job_id)
            if (
                job is None
                or job.state != RUNNING
                or not job.placement
                or failed not in job.placement
                or failed not in state.failed
            ):
                return Outcome(action=f"nothing to do for job {job_id}")
            if job.replacing:
                return Outcome(action=f"job {job_id} is already swapping a block")
            younger = waited_past(job, self.now_ms(), self.age_bound_ms)
            plan = self.planner.replace(state, job, failed, take_younger=younger)
            if plan is None and state.partial:
                full = True  # no free spare: victims, or the slice's loss, need the whole pod
                continue
            try:
                if plan is None:
                    outcome = await self._lose_slice(state, job, failed)
                else:
                    outcome = await self._replace(state, plan)
                return self.metrics.replaced(self.pod_id, outcome, started)
            except Conflict:
                full = True
                continue
        return Outcome(action=f"job {job_id}: state kept changing; the reconcile loop retries")

    async def _lose_slice(self, state: PodState, job: SliceJob, failed: int) -> Outcome:
        """No block to be had: SUSPENDED (requeued) or FAILED, as the job asked (WS-5)."""
        node_type = self.fabric.node_types[failed]
        final = job.on_block_failure == FAIL
        new = job.with_(
            state=FAILED if final else SUSPENDED,
            epoch=job.epoch + 1,
            placement=None,
            replacing=None,
        )
        if job.tile is not None:
            why = f"group {failed} failed under this small job; "
        else:
            why = (
                f"block {failed} failed and no healthy {node_type} block is free or held by "
                "lower-priority work; "
            )
        reason = why + ("failed as the job asked" if final else "suspended until blocks free")
        txn = self.store.txn()
        txn.expect_job(job.job_id, [RUNNING], job.epoch)
        txn.release_held(job, self.fabric.block_shape)
        txn.write_job(new, old_state=RUNNING, reason=reason, now_ms=self.now_ms())
        await self.store.commit(txn)
        self.log.warning("job %s: %s", job.job_id, reason, extra={"job_id": job.job_id})
        try:
            if final:
                await self.wiring.release(
                    job.job_id, wait_s=FINISH_RELEASE_WAIT_S, lease=job_lease(new)
                )
            else:
                await self.wiring.release_claimed(job.job_id, wait_s=FINISH_RELEASE_WAIT_S)
        except OcsError as err:
            self.wiring.release_error(job.job_id, err)
        await self.admission.schedule()
        return Outcome(
            action=f"job {job.job_id} {new.state.lower()}: {reason}", affected=[job.job_id]
        )

    async def _replace(self, state: PodState, plan: Replacement) -> Outcome:
        job = plan.job
        assert job.placement is not None
        now = self.now_ms()
        keys = self.store.keys
        placement = list(job.placement)
        placement[plan.position_index] = plan.spare
        position = grid_positions(job.demand.grid)[plan.position_index]
        victim_ids = [v.job_id for v in plan.victims]
        txn = self.store.txn()
        txn.expect_job(job.job_id, [RUNNING], job.epoch)
        txn.expect_owner(plan.failed, [job.job_id])
        txn.expect_health(plan.failed, "FAILED")
        txn.expect_owner(plan.spare, ["", *victim_ids])
        txn.expect_health(plan.spare, "HEALTHY")
        txn.expect_wired_by(plan.spare, plan.release_first)
        shrunk = self.admission.victim_transitions(txn, state, plan.victims, job, now)
        swapping = job.with_(
            epoch=job.epoch + 1,
            placement=tuple(placement),
            replacing=(plan.failed, plan.spare),
            wiring_deadline_ms=now + self.wiring_timeout_ms,
        )
        txn.hdel(keys.owner, [plan.failed])
        txn.hset(keys.owner, {plan.spare: job.job_id})
        reason = (
            f"block {plan.failed} failed; replacing it with block {plan.spare} at position "
            f"{_pos(position)}" + (f" taken from {', '.join(victim_ids)}" if victim_ids else "")
        )
        txn.write_job(swapping, old_state=RUNNING, reason=reason, now_ms=now)
        await self.store.commit(txn)
        self.metrics.preempted(self.pod_id, plan.victims)
        self.log.info("job %s: %s", job.job_id, reason, extra={"job_id": job.job_id})
        outcome = Outcome(
            preempted=[_victim_json(v, state.jobs[v.job_id]) for v in plan.victims],
            affected=[job.job_id, *victim_ids],
        )
        err = await self.wiring.make_room(plan.release_first, set(), shrunk)
        if err is not None:
            return await self.replacement_failed(swapping, err, outcome)
        outcome = await self.swap_at_ocs(swapping, position, outcome)
        if plan.victims:
            # The victims gave up more than the spare (and a delayed one waits again): a
            # pass now, not at the next event or reconcile round (the simulator's live
            # fidelity test found the blocks left idle meanwhile).
            await self.admission.schedule()
        return outcome

    async def swap_at_ocs(
        self, swapping: SliceJob, position: tuple[int, ...], outcome: Outcome
    ) -> Outcome:
        assert swapping.replacing is not None
        failed, spare = swapping.replacing
        keys = self.store.keys
        txn = self.store.txn()
        txn.expect_job(swapping.job_id, [RUNNING], swapping.epoch)
        txn.expect_wired_by(spare, [swapping.job_id])
        txn.hset(keys.wired, {spare: swapping.job_id})
        try:
            await self.store.commit(txn)
        except Conflict as c:
            return Outcome(action=f"replacement of block {failed} stopped: {c}")
        try:
            result: ReplaceResult = await self.ocs.replace_job(swapping, failed, spare)
        except OcsError as err:
            return await self.replacement_failed(swapping, err, outcome)
        done = swapping.with_(epoch=swapping.epoch + 1, replacing=None, wiring_deadline_ms=0)
        reason = (
            f"block {failed} replaced by block {spare} at position {_pos(position)}: "
            f"{result.moved} {result.unit} moved, {result.untouched} untouched"
        )
        txn = self.store.txn()
        txn.expect_job(swapping.job_id, [RUNNING], swapping.epoch)
        txn.hdel(keys.wired, [failed])
        txn.write_job(done, old_state=RUNNING, reason=reason, now_ms=self.now_ms())
        try:
            await self.store.commit(txn)
        except Conflict:
            # Completed or cancelled meanwhile: its release removes the slice, and the
            # failed block's mark with it.
            return Outcome(action=f"block {failed} replaced, but the job ended meanwhile")
        self.log.info("job %s: %s", swapping.job_id, reason, extra={"job_id": swapping.job_id})
        outcome.action = reason
        outcome.replacement = {
            "job": swapping.job_id,
            "failed": failed,
            "new": spare,
            "position": list(position),
            "moved": result.moved,
            "untouched": result.untouched,
            "unit": result.unit,
        }
        return outcome

    async def replacement_failed(
        self, swapping: SliceJob, err: OcsError, outcome: Outcome
    ) -> Outcome:
        """The OCS could not swap the block: the slice is lost like with no spare."""
        state = await self.snapshot()
        job = state.jobs.get(swapping.job_id)
        if job is None or job.state != RUNNING or job.epoch != swapping.epoch:
            return Outcome(action=f"replacement failed ({err}); the job changed meanwhile")
        assert swapping.replacing is not None
        res = await self._lose_slice(state, job, swapping.replacing[0])
        res.action = f"replacement failed ({err}); " + res.action
        res.preempted = outcome.preempted
        return res
