"""CS-1 from the pod's side: register with the cell scheduler, then report on a heartbeat.

Runs only when LIGHTPATH_CELL_ADDR is set. Once the pod's fabric is known the
scheduler registers its pod (id, its own address, fabric kind, block shape,
node types) — again after every start, and whenever the cell says it does not
know the pod. Then it reports, every LIGHTPATH_CELL_HEARTBEAT_S and shortly
after anything changes in the pod (an entry in the pod's event stream):

* capacity: per node type total, healthy free, allocated, failed, and the
  blocks running jobs of each priority would give up under their own
  preemption policy (what a higher priority may take, CS-3);
* the job transitions the cell has not acknowledged yet, read from the pod's
  event stream with their per-job numbers, so the cell applies each once and
  in order, also when several replicas of this scheduler report.

Every replica reports; the cell keeps the newest capacity (versioned by the
event stream) and hears the pod as long as one replica does.

`CellReporter.run` is a supervised task: when it fails (Redis restarting and
answering LOADING, say) it is started again and goes on from the last
transition the cell acknowledged, without registering again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from typing import Any

import grpc

from lightpath import limits
from lightpath.client import channel
from lightpath.domain.blocks import PodFabric
from lightpath.security.identity import service_principal
from lightpath.v1 import cell_scheduler_pb2, cell_scheduler_pb2_grpc, common_pb2
from lightpath_services.common import supervisor
from lightpath_services.common.convert import job_event_pb
from lightpath_services.common.server import Runtime
from lightpath_services.workload_scheduler.fabric_kinds import FabricPlanner
from lightpath_services.workload_scheduler.placement import PodState
from lightpath_services.workload_scheduler.preemption import max_freeable
from lightpath_services.workload_scheduler.settings import WorkloadSchedulerSettings

# After a change in the pod, wait this long so a burst of transitions goes in one report,
# and under steady change report at most every REPORT_MIN_GAP_S (the cell counts the
# blocks of jobs it places and ends itself meanwhile).
REPORT_DEBOUNCE_S = 0.02
REPORT_MIN_GAP_S = 0.25
# Transitions per report at most; a backlog is sent in several reports back to back.
MAX_TRANSITIONS = limits.FIELDS["ReportPodStatusRequest.transitions"]
CALL_TIMEOUT_S = 5.0


def registration_pb(
    fabric: PodFabric, endpoint: str, instance_id: str, events_tip: str
) -> cell_scheduler_pb2.PodRegistration:
    reg = cell_scheduler_pb2.PodRegistration(
        pod_id=fabric.pod_id,
        endpoint=endpoint,
        fabric_kind=common_pb2.FabricKind.Value("FABRIC_KIND_" + fabric.kind),
        block_shape=common_pb2.Shape(dims=fabric.block_shape),
        ocs_per_axis=fabric.ocs_per_axis,
        instance_id=instance_id,
        events_tip=events_tip,
    )
    for t in fabric.node_types:  # runs in block-id order
        if reg.node_types and reg.node_types[-1].node_type == t:
            reg.node_types[-1].blocks += 1
        else:
            reg.node_types.add(node_type=t, blocks=1)
    return reg


def capacity_pb(
    state: PodState, version: str, planner: FabricPlanner
) -> cell_scheduler_pb2.PodCapacity:
    """What the cell plans with (CS-1, CS-3)."""
    free = state.free_counts()
    preemptible: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    running = state.running()
    for job in running:
        if job.placement and job.offset is None:  # a sub-block slice frees chips, not blocks
            for t, n in max_freeable(state, job).items():
                preemptible[t][job.priority] += n
    cap = cell_scheduler_pb2.PodCapacity(
        queued_jobs=len(state.queue()), running_jobs=len(running), version=version
    )
    for t, c in state.counts_by_type().items():
        cap.types.add(
            node_type=t,
            total=c["total"],
            free=free[t],
            allocated=c["allocated"],
            failed=c["failed"],
            preemptible_by_priority=dict(preemptible.get(t, {})),
            chips_total=c["chips_total"],
            chips_free=c["chips_free"],
            largest_free_box=planner.largest_free_box(state, t),
        )
    cap.at.GetCurrentTime()
    return cap


def transition_pb(entry_id: str, event: dict, pod_id: str):
    pb = job_event_pb(event, pod_id)
    pb.reason = limits.clip(pb.reason, "JobEvent.reason")  # what the cell takes
    return cell_scheduler_pb2.PodJobTransition(
        event=pb,
        seq=int(event.get("n", 0)),
        stream_id=entry_id,
        released=bool(event.get("released")),
    )


def _newer(a: str, b: str) -> bool:
    """Stream id a > b."""
    am, _, asq = a.partition("-")
    bm, _, bsq = b.partition("-")
    return (int(am), int(asq or 0)) > (int(bm), int(bsq or 0))


class CellReporter:
    def __init__(self, runtime: Runtime[WorkloadSchedulerSettings], pod: Any):
        self._rt = runtime
        self._pod = pod  # server.PodHandle
        self._settings = runtime.settings
        self._channel: grpc.aio.Channel | None = None
        self._ack = "0-0"
        self._registered = False
        self._failures = 0
        runtime.on_stop(self._close)

    async def _close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    def _stub(self) -> cell_scheduler_pb2_grpc.CellSchedulerStub:
        if self._channel is None:
            self._channel = channel(
                self._settings.cell_addr,
                tracer_provider=self._rt.tracer_provider,
                max_attempts=1,
                credentials=self._rt.credentials,
                expect=service_principal("cell_scheduler"),
            )
        return cell_scheduler_pb2_grpc.CellSchedulerStub(self._channel)

    async def _fresh_channel(self) -> None:
        """After failures: a new channel (the old one's reconnect backoff grows to minutes)."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    @property
    def endpoint(self) -> str:
        return self._settings.advertise_addr or f"127.0.0.1:{self._rt.port}"

    async def run(self) -> None:
        sched = await self._pod.started()
        await self._rt.listening.wait()
        stream = sched.store.keys.events
        redis = sched.store.redis
        if not self._registered:
            await self._register(sched)
        seen = self._ack
        await self._report(sched)  # the cell plans with capacity: report it right away
        last = time.monotonic()
        while True:
            got = await redis.xread(
                {stream: seen}, block=int(self._settings.cell_heartbeat_s * 1000), count=1000
            )
            for _s, entries in got or []:
                if entries:
                    seen = entries[-1][0]
            if got:
                wait = max(REPORT_DEBOUNCE_S, last + REPORT_MIN_GAP_S - time.monotonic())
                await asyncio.sleep(wait)
            last = time.monotonic()
            for _ in range(20):
                if not await self._report(sched):
                    break  # else a backlog of transitions, or the cell wants older ones: again

    async def _register(self, sched) -> None:
        delay = 0.2
        while True:
            tip = await sched.store.tip()
            reg = registration_pb(sched.fabric, self.endpoint, self._rt.instance_id, tip)
            try:
                await self._stub().RegisterPod(
                    cell_scheduler_pb2.RegisterPodRequest(pod=reg), timeout=CALL_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as err:
                self._failed("register with", err)
                await self._fresh_channel()
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)
                continue
            self._ack = tip
            self._registered = True
            self._failures = 0
            self._rt.log.info(
                "registered pod %s with the cell at %s as %s",
                sched.pod_id,
                self._settings.cell_addr,
                self.endpoint,
            )
            return

    def _failed(self, what: str, err: grpc.aio.AioRpcError) -> None:
        self._failures += 1
        if self._failures == 1 or self._failures % 30 == 0:
            self._rt.log.warning(
                "cannot %s the cell at %s (%d failures): %s: %s",
                what,
                self._settings.cell_addr,
                self._failures,
                err.code().name,
                err.details(),
            )

    async def _report(self, sched) -> bool:
        """One heartbeat; True when more transitions wait to be sent."""
        redis = sched.store.redis
        stream = sched.store.keys.events
        # The version is read with the state, atomically: read apart, a report could
        # carry an older state under the same version as a newer one and, arriving
        # after it, replace it at the cell (seen as stale preemptible capacity).
        state, version = await sched.store.snapshot_and_tip(sched.fabric)
        after = self._ack
        entries = await redis.xrange(stream, min=f"({after}", max="+", count=MAX_TRANSITIONS)
        resync = False
        if after != "0-0":
            oldest = await redis.xrange(stream, min="-", max="+", count=1)
            resync = bool(oldest) and _newer(oldest[0][0], after)
        jobs = [(eid, json.loads(f["e"])) for eid, f in entries if f.get("kind", "job") == "job"]
        events = await sched.store.with_notes([e for _, e in jobs])
        transitions = [
            transition_pb(eid, event, sched.pod_id)
            for (eid, _), event in zip(jobs, events, strict=True)
        ]
        until = entries[-1][0] if entries else after
        request = cell_scheduler_pb2.ReportPodStatusRequest(
            pod_id=sched.pod_id,
            instance_id=self._rt.instance_id,
            endpoint=self.endpoint,
            capacity=capacity_pb(state, version, sched.planner),
            transitions=transitions,
            events_after=after,
            events_until=until,
            resync=resync,
        )
        try:
            resp = await self._stub().ReportPodStatus(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                await self._register(sched)
                return True
            self._failed("report to", err)
            if self._failures % 3 == 0:
                await self._fresh_channel()
            return False
        if self._failures:
            self._rt.log.info("reporting to the cell again after %d failures", self._failures)
        self._failures = 0
        self._ack = resp.events_ack or after
        supervisor.ready()  # the cell hears this pod again
        return self._ack != until or len(entries) == MAX_TRANSITIONS
