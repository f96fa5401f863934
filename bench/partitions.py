#!/usr/bin/env python3
"""Faults across leaseholders (issue 32): clients submit, complete and cancel jobs
through two cell replicas while processes holding leases are paused past them
(SIGSTOP, then SIGCONT), the pod is cut off from the cells or from Redis, and its link
drops packets; then the history of acknowledged operations is checked against the
final state (lightpath.testing.history).

    python3 dev.py bench partitions [--faults 20] [--clients 4] [--seed 1]
        [--failovers 0] [--no-network] [--kinds slow_lossy_ocs_link,...]

The stack runs as deployed (TLS, mTLS, separate processes) on its own redis-server:
cell replicas cell-a and cell-b, one pod (pod-1: two ocs_manager replicas of 16 blocks
of 4x4x4 programming one switch agent, whose simulated switches settle each batch in
20 ms, one batch at a time per switch) served by replicas ws-a and ws-b, each
calling its own ocs_manager replica. The managers' reconcile loop is off (it would
put the switches back to the committed tables and hide a stale write that got
through). The pod's five processes run in a network namespace of their own
(lightpath.testing.netns: a veth pair with addresses of ours), the cells and Redis on
this side of its link; without root (or with --no-network) everything runs on
loopback and only the pauses are injected. Leases are short through the services'
settings: the ocs_manager's change lease 1.5 s (shorter than the wiring lease, so a
replica that takes a wiring over finds the change's lease run out), the wiring lease
2 s, the cell's pod timeout 3 s and forward deadline 3 s. The faults, in turn (seeded
order):

* pause_scheduler: one scheduler replica paused 3.5 s, past its wiring lease (the other
  takes its wirings over);
* pause_ocs_manager: ws-a's ocs_manager replica paused 2.5 s, past its change lease (the next call
  takes an in-flight change over and rolls it back; the woken manager is fenced out);
* pause_pod: both scheduler replicas paused 4.5 s: the cell sees the pod silent past its
  pod timeout while jobs are submitted, then the pod answers again;
* pause_cell: one cell replica paused 4 s, past its forward deadline (the other cell
  takes its forwards over; its clients' calls time out: indeterminate, not acknowledged);
* pause_host: ws-a and the ocs_manager replica it calls paused together 3.5 s (a host or
  VM frozen): ws-b takes the wirings over through the other ocs_manager replica, which
  takes the changes in flight over; the frozen manager wakes fenced out (the pause
  lands while ws-a has a job WIRING, when there is one within 5 s);
* stale_ocs_change: a stale write forced, and its refusal counted: OCS_B paused (so
  the next batch to reach the switches is OCS's), the switches holding every batch
  2 s; as soon as one arrives, ws-a and OCS are paused together past both leases
  (5.5 s), the switches are quick again and OCS_B resumes, so ws-b takes the job over
  through OCS_B (which takes the change over under a higher token); then ws-a and OCS
  wake, OCS past its switch deadline with the old token: its undo must be refused by
  the switches (or its commit by the script). A RUNNING job is completed through the
  cell meanwhile, so there is a change to catch when the pod is full and quiet; when
  no batch comes from OCS within 5 s, the same with the hosts' roles swapped. `stale_forced` counts the attempts
  (`injected`), the changes caught in flight (`in_flight`) and the faults after which
  a refusal was counted (`refused_after`);
* partition_cell_pod: the cells and the pod's schedulers cut apart 4.5 s (nftables in
  the namespace drops what crosses to or from their ports), past the pod timeout, while
  jobs are submitted; both sides run on, the pod keeps its Redis;
* partition_pod_redis: the pod's schedulers and ocs_managers cut off from Redis 3.5 s
  while they hold wiring and change leases, past both; the cells keep theirs;
* loss_pod_link: 5 % of the packets dropped each way on the pod's link (to the cells
  and Redis) for 6 s;
* slow_lossy_ocs_link: 200 ms of delay each way and 5 % loss each way between the
  schedulers and their ocs_manager replicas for 6 s, under the clients' load. Each
  scheduler reaches its ocs_manager through a relay on this side of the link
  (lightpath.testing.relay: this kernel has no tc netem), so that traffic crosses the
  veth twice; the relay runs from the start with its delay off and SIGUSR1 turns it on
  for the spell, while nftables drops 5 % of what crosses to and from the ocs_managers'
  ports (the relay's leg to them). The relay's limits (bytes, not packets, delayed; no
  jitter) are in its module doc and docs/faults.md.
  `partitions_observed` counts the faults seen from outside as they end (the cell
  lists the pod not READY; ws-a cannot list its jobs; a health check of an
  ocs_manager through the relay takes 2 x 200 ms or more).

After each fault ends, `s_to_definite_state` is how long until every job the cell
knows is in a definite state (not UNKNOWN, WIRING or FORWARDING); the worst is
`worst_s_to_definite_state`. At the end (the stack settled: two reads alike, no job
WIRING at the pod and the cell showing each job as the pod does; bounded), the
checker's `lost` (acknowledged, absent), `contradicted` (acknowledged complete /
cancel, now something else), `undefined` and `double_booked` (a block in two live
jobs or slices, or a slice of no RUNNING job); `stale_writes_refused` counts the writes refused
for an older token, measured where they were refused (`stale_writes_by_where`): the
ocs_managers' lightpath.ocs.stale_writes_refused for `lease` (a caller's older lease)
and `commit` (a manager's own commit after a take-over), and the switch agent's
stale_batches_refused for `switch` (batches the switches refused: one per switch a
change touches; `stale_changes_refused_by_switches` is the managers' count of their
changes so refused), and the schedulers' lightpath.pod.stale_commits_refused for
`scheduler` (a replica's commit of a wiring whose lease it had lost to a take-over);
`stale_writes_applied` the switches that disagree with the committed tables
(CheckInvariants with compare_switches: a stale write that got through). `failovers` / `failover_lost` come from bench/sentinel_failover.py's
`measure` (`--failovers 0`: not run, null), with its other figures (its own time and
load as `failover_seconds` and `failover_load`).

Prints one JSON line: faults, faults_by_kind, partitions_observed, ops, acknowledged,
lost, contradicted, undefined, double_booked, stale_writes_refused,
stale_writes_by_where, stale_forced, stale_changes_refused_by_switches,
stale_writes_applied, failovers, failover_lost, worst_s_to_definite_state,
s_to_definite_state, not_injected, still_moving (what had not settled when the final
state was read: empty when it had), violation_details, codes, error_samples,
load_average, seconds, seed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import importlib
import os
import random
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import chaos
import grpc
import redis as redis_py
from _common import emit
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lightpath.client import channel
from lightpath.embedded_redis import EmbeddedRedis, free_port
from lightpath.security.identity import service_principal
from lightpath.stack import ProcessSpec, Stack
from lightpath.testing import netns
from lightpath.testing.history import DEFINITE, Final, History
from lightpath.testing.relay import RelayProcess
from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import (
    cell_scheduler_pb2_grpc,
    ocs_manager_pb2_grpc,
    optical_switch_pb2_grpc,
    workload_scheduler_pb2_grpc,
)
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import ocs_manager_pb2 as om
from lightpath.v1 import optical_switch_pb2 as sb
from lightpath.v1 import workload_scheduler_pb2 as ws

POD = chaos.POD
CELLS = chaos.CELLS
SCHEDULERS = chaos.SCHEDULERS
OCS = chaos.OCS
OCS_B = "ocs-b-pod-1"  # a second replica of the pod's ocs_manager, ws-b's
AGENT = "switches-pod-1"  # the pod's switches: one switch agent behind both managers
HOSTS = ((SCHEDULERS[0], OCS), (SCHEDULERS[1], OCS_B))  # each scheduler and its manager
WIRING_LEASE_S = 2.0
CHANGE_LEASE_S = 1.5
POD_TIMEOUT_S = 3.0
FORWARD_TIMEOUT_S = 3.0
# fault kind -> (processes paused, seconds): each past the lease it tests
FAULTS = {
    "pause_scheduler": (None, WIRING_LEASE_S + 1.5),  # None: one replica, chosen at random
    "pause_ocs_manager": ((OCS,), CHANGE_LEASE_S + 1.0),
    "pause_pod": (SCHEDULERS, POD_TIMEOUT_S + 1.5),
    "pause_cell": (None, FORWARD_TIMEOUT_S + 1.0),
    # a host running ws-a and its ocs_manager replica frozen whole (a VM paused): ws-b
    # takes its wirings over through the other ocs_manager, which takes the changes in
    # flight over; on waking, the frozen manager's undo is refused by the switches
    "pause_host": ((SCHEDULERS[0], OCS), CHANGE_LEASE_S + WIRING_LEASE_S),
}
# faults that force a stale write and count its refusal -> how long the switches hold
# the batches of the change caught in flight (past the manager's switch deadline)
FORCED = {"stale_ocs_change": 2.0}
SWITCH_TIMEOUT_S = 0.7  # an ocs_manager's deadline per switch call: below lease / 2
SETTLE_MS = 20  # the simulated mirrors settle per batch, one batch at a time per switch
FABRIC = {
    "LIGHTPATH_POD_ID": POD,
    "LIGHTPATH_FABRIC_BLOCK_SHAPE": "4x4x4",
    "LIGHTPATH_FABRIC_BLOCKS": "16",
    "LIGHTPATH_FABRIC_OCS_PER_AXIS": "1",
    "LIGHTPATH_FABRIC_OCS_RADIX": "48",
}
# network faults (the pod in a namespace of its own: lightpath.testing.netns) -> seconds
NET_FAULTS = {
    # the cell replicas and the pod (both schedulers) cut apart past the pod timeout,
    # while jobs are submitted; the pod keeps its Redis
    "partition_cell_pod": POD_TIMEOUT_S + 1.5,
    # the pod's schedulers and ocs_managers cut off from Redis while they hold wiring
    # and change leases, past both; the cells keep theirs
    "partition_pod_redis": CHANGE_LEASE_S + WIRING_LEASE_S,
    # 5 % of the packets dropped each way on the pod's link (to the cells and Redis)
    "loss_pod_link": 6.0,
    # 200 ms each way (the relay) and 5 % loss each way (nftables) between the
    # schedulers and their ocs_manager replicas, under load
    "slow_lossy_ocs_link": 6.0,
}
LOSS_PERCENT = 5
DELAY_MS = 200
POD_PROCESSES = (*SCHEDULERS, OCS, OCS_B, AGENT)
# the refusals' series in the processes' scrapes
STALE_WRITES = "lightpath_ocs_stale_writes_refused_total"  # ocs_managers, by where
STALE_COMMITS = "lightpath_pod_stale_commits_refused_total"  # schedulers
NOT_DEFINITE = {c.JobState.Name(s) for s in (c.JOB_STATE_UNKNOWN, c.JOB_STATE_WIRING)}


def specs(ns: netns.Namespace | None = None) -> tuple[list[ProcessSpec], dict[str, str]]:
    """The processes and the delay relay's routes (listen -> target); with `ns`, the
    pod's processes run in it (on its address) and the cells on this side of its link
    (on ours), so that link can be cut, port by port, and each scheduler reaches its
    ocs_manager through the relay on this side (its certificate is checked by name, not
    by the address dialled). Without `ns`: no relay, no routes."""
    out = _specs()
    if ns is None:
        return out, {}
    out = [
        dataclasses.replace(s, host=ns.ip, netns=ns.name)
        if s.name in POD_PROCESSES
        else dataclasses.replace(s, host=ns.host_ip)
        for s in out
    ]
    ports = {s.name: s.port for s in out}
    routes: dict[str, str] = {}
    for i, s in enumerate(out):
        ocs = s.peers.get("LIGHTPATH_OCS_ADDR")
        if s.service == "workload_scheduler" and ocs is not None:
            listen = f"{ns.host_ip}:{free_port()}"
            routes[listen] = f"{ns.ip}:{ports[ocs]}"
            peers = {k: v for k, v in s.peers.items() if k != "LIGHTPATH_OCS_ADDR"}
            env = {**s.env, "LIGHTPATH_OCS_ADDR": listen}
            out[i] = dataclasses.replace(s, env=env, peers=peers)
    return out, routes


def _specs() -> list[ProcessSpec]:
    cell_env = {
        "LIGHTPATH_CELL_POD_TIMEOUT_S": str(POD_TIMEOUT_S),
        "LIGHTPATH_CELL_FORWARD_TIMEOUT_S": str(FORWARD_TIMEOUT_S),
    }
    out = [ProcessSpec(name, "cell_scheduler", free_port(), cell_env) for name in CELLS]
    out.append(
        ProcessSpec(
            AGENT,
            "switch_agent",
            free_port(),
            {**FABRIC, "LIGHTPATH_AGENT_SETTLE_MS": str(SETTLE_MS)},
        )
    )
    out += [
        ProcessSpec(
            name,
            "ocs_manager",
            free_port(),
            {
                **FABRIC,
                "LIGHTPATH_OCS_CHANGE_LEASE_S": str(CHANGE_LEASE_S),
                "LIGHTPATH_OCS_SWITCH_TIMEOUT_S": str(SWITCH_TIMEOUT_S),
                # no repair from the switches' own state: what the switches hold at the
                # end is what fencing let through (stale_writes_applied)
                "LIGHTPATH_OCS_RECONCILE_S": "3600",
            },
            {"LIGHTPATH_OCS_SWITCH_AGENTS": AGENT},
            metrics_port=free_port(),
        )
        for name in (OCS, OCS_B)
    ]
    for name, cell, ocs in zip(SCHEDULERS, CELLS, (OCS, OCS_B), strict=True):
        out.append(
            ProcessSpec(
                name,
                "workload_scheduler",
                free_port(),
                {
                    "LIGHTPATH_POD_ID": POD,
                    "LIGHTPATH_CELL_HEARTBEAT_S": "0.5",
                    "LIGHTPATH_WS_RECONCILE_S": "0.5",
                    "LIGHTPATH_WS_WIRING_TIMEOUT_S": str(WIRING_LEASE_S),
                    "LIGHTPATH_WS_OCS_TIMEOUT_S": "5",
                },
                {
                    "LIGHTPATH_OCS_ADDR": ocs,
                    "LIGHTPATH_CELL_ADDR": cell,
                    "LIGHTPATH_ADVERTISE_ADDR": name,
                },
                metrics_port=free_port(),
            )
        )
    return out


class Faults:
    """Pauses (SIGSTOP past a lease, then SIGCONT) and, with a namespace, partitions and
    loss on the pod's link (nftables in the namespace, healed at the end of each)."""

    def __init__(
        self,
        stack: Stack,
        rng: random.Random,
        host_scheduler=None,
        ns: netns.Namespace | None = None,
        redis_port: int = 0,
        *,
        cells: list | None = None,
        relay: RelayProcess | None = None,
        record: chaos.Record | None = None,
    ):
        self.stack = stack
        self.record = record
        self.relay = relay
        self.rng = rng
        self.ns = ns
        self.redis_port = redis_port
        self.host_scheduler = host_scheduler  # ws-a's stub: pause_host waits for a wiring
        self.kinds: collections.Counter[str] = collections.Counter()
        # partitions seen from outside as they end (cells: the cell replicas' stubs)
        self.observed: collections.Counter[str] = collections.Counter()
        self.cells = cells
        self.paused: set[str] = set()
        # forced stale writes: attempts, changes caught in flight, refusals seen after
        self.forced: collections.Counter[str] = collections.Counter()

    def _signal(self, name: str, sig: int) -> None:
        os.kill(self.stack.procs[name].pid, sig)

    async def fault(self, kind: str) -> list[str]:
        """Inject fault `kind`, past its lease, then end it: what it touched."""
        if kind in NET_FAULTS:
            return await self._network(kind)
        if kind in FORCED:
            return await self._stale_change(FORCED[kind])
        names, seconds = FAULTS[kind]
        if kind == "pause_host" and self.host_scheduler is not None:
            await self._wiring_in_flight()
        if names is None:
            names = (self.rng.choice(CELLS if kind == "pause_cell" else SCHEDULERS),)
        self._pause(*names)
        try:
            await asyncio.sleep(seconds)
        finally:
            self.resume_all()
        self.kinds[kind] += 1
        return list(names)

    async def _network(self, kind: str) -> list[str]:
        assert self.ns is not None
        ports = {s.name: s.port for s in self.stack.specs}
        if kind == "partition_cell_pod":
            self.ns.cut_ports(ports[name] for name in CELLS)
            self.ns.cut_listeners(ports[name] for name in SCHEDULERS)
            touched = [*CELLS, *SCHEDULERS]
        elif kind == "partition_pod_redis":
            self.ns.cut_ports([self.redis_port])
            touched = [*POD_PROCESSES, "redis"]
        elif kind == "slow_lossy_ocs_link":
            assert self.relay is not None
            self.ns.lose(LOSS_PERCENT, listeners=[ports[OCS], ports[OCS_B]])
            self.relay.slow(True)
            touched = ["schedulers <-> ocs_managers"]
        else:
            self.ns.lose(LOSS_PERCENT)
            touched = ["pod link"]
        try:
            await asyncio.sleep(NET_FAULTS[kind])
            if await self._cut_observed(kind):
                self.observed[kind] += 1
        finally:
            if self.relay is not None:
                self.relay.slow(False)
            self.ns.heal()
        self.kinds[kind] += 1
        return touched

    async def _cut_observed(self, kind: str) -> bool:
        """Whether the partition shows, as it ends: the cell no longer lists the pod READY
        (cell <-> pod), or ws-a cannot list its jobs from Redis (pod <-> Redis)."""
        try:
            if kind == "partition_cell_pod":
                pods = (await self.cells[0].ListPods(cs.ListPodsRequest(), timeout=2)).pods
                return not any(
                    p.registration.pod_id == POD and p.status == cs.POD_STATUS_READY for p in pods
                )
            if kind == "partition_pod_redis":
                await self.host_scheduler.ListJobs(ws.ListJobsRequest(page_size=1), timeout=2)
            if kind == "slow_lossy_ocs_link" and self.relay is not None:
                return await self._slow_through_relay()
            return False
        except grpc.aio.AioRpcError:
            return kind == "partition_pod_redis"

    async def _slow_through_relay(self) -> bool:
        """Whether a health check of an ocs_manager through the relay (a channel of its
        own: the TLS handshake crosses it too) takes a round trip's delay or more."""
        assert self.relay is not None
        listen = next(iter(self.relay.routes))
        expect = service_principal("ocs_manager", POD)
        started = time.monotonic()
        async with channel(listen, credentials=self.stack.operator, expect=expect) as ch:
            await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
        return time.monotonic() - started >= 2 * DELAY_MS / 1000

    async def _wiring_in_flight(self, limit_s: float = 5.0) -> None:
        """Until ws-a has a job WIRING (its change is in flight at its ocs_manager), for
        `limit_s` at most: the moment a frozen host hurts most."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                listed = await self.host_scheduler.ListJobs(
                    ws.ListJobsRequest(states=[c.JOB_STATE_WIRING], page_size=1), timeout=1
                )
                if listed.jobs:
                    await asyncio.sleep(0.1)  # into its switches' settling
                    return
            await asyncio.sleep(0.02)

    def _pause(self, *names: str) -> None:
        for name in names:
            self._signal(name, signal.SIGSTOP)
            self.paused.add(name)

    def _resume(self, *names: str) -> None:
        for name in names:
            with contextlib.suppress(ProcessLookupError):
                self._signal(name, signal.SIGCONT)
            self.paused.discard(name)

    async def refusals(self) -> dict[str, float]:
        """Stale writes refused so far: by the ocs_managers' scripts (`lease`: a caller's
        older lease; `commit`: a manager's own commit after a take-over) and by the
        switches themselves (`switch`: batches under an older token, the switch agent's
        own count)."""
        out: dict[str, float] = {}
        for name in (OCS, OCS_B):
            seen = await asyncio.to_thread(stale_refused, self.stack.metrics_endpoints[name])
            for where, n in seen.items():
                if where != "switch":
                    out[where] = out.get(where, 0.0) + n
        out["scheduler"] = 0.0
        for name in SCHEDULERS:
            seen = await asyncio.to_thread(
                stale_refused, self.stack.metrics_endpoints[name], STALE_COMMITS
            )
            out["scheduler"] += sum(seen.values())
        async with self._agent() as ch:
            admin = optical_switch_pb2_grpc.OpticalSwitchAdminStub(ch)
            stats = await admin.GetSwitchStats(sb.GetSwitchStatsRequest(), timeout=5)
        out["switch"] = float(stats.stale_batches_refused)
        return out

    def _agent(self):
        return channel(self.stack.endpoints[AGENT], credentials=self.stack.operator)

    async def _hold_batches(self, seconds: float) -> None:
        """The switches hold every batch `seconds` more (0: as they were)."""
        faults = sb.SwitchFaults()
        if seconds:
            faults.extra_delay.FromMilliseconds(int(seconds * 1000))
        async with self._agent() as ch:
            await optical_switch_pb2_grpc.OpticalSwitchAdminStub(ch).InjectFault(
                sb.InjectFaultRequest(switch_id="*", faults=faults), timeout=5
            )

    async def _stale_change(self, hold_s: float) -> list[str]:
        """Force a stale write and see it refused. Hosts are (ws-a, OCS) and (ws-b,
        OCS_B), each scheduler calling its own manager. The other host's manager is
        paused, so the next batch to reach the switches is this host's manager's (a
        wire, a release or a block swap: the managers' reconcile loop is off); the
        switches hold it; once it has arrived this host (scheduler and manager) is
        frozen past both leases while the switches are quick again and the other
        manager resumes: the other scheduler takes the job over through it (a wiring
        past its lease, or a leftover wiring released), which takes the change over
        under a higher token. Then the frozen host wakes, its manager past its switch
        deadline with the change's old token: its undo must be refused by the switches
        (or its commit by the script). To have a change to catch when the pod is full
        and quiet, a RUNNING job is completed through the cell meanwhile (its
        acknowledgement checked with the clients'). When no batch comes from ws-a's
        manager within 5 s, ws-b's host is tried. `stale_forced` counts the attempts, the changes
        caught in flight and the faults after which a refusal was counted."""
        self.forced["injected"] += 1
        before = await self.refusals()
        touched: list[str] = []
        completing: list[asyncio.Future] = []
        try:
            await self._hold_batches(hold_s)
            for (sched, mine), (_, theirs) in (HOSTS, HOSTS[::-1]):
                self._pause(theirs)
                touched.append(theirs)
                # a change to catch even when the pod is full and quiet
                completing.append(asyncio.ensure_future(self._complete_one()))
                if await self._batch_arrives():
                    self._pause(sched, mine)
                    self.forced["in_flight"] += 1
                    touched += [sched, mine]
                    await self._hold_batches(0)
                    self._resume(theirs)
                    # the wiring lease, a reconcile round, the change lease run out
                    await asyncio.sleep(WIRING_LEASE_S + CHANGE_LEASE_S + 2.0)
                    break
                self._resume(theirs)
        finally:
            self.resume_all()
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self._hold_batches(0)
            await asyncio.gather(*completing)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            after = await self.refusals()
            if sum(after.values()) > sum(before.values()):
                self.forced["refused_after"] += 1
                break
            await asyncio.sleep(0.2)
        self.kinds["stale_ocs_change"] += 1
        return touched

    async def _complete_one(self) -> None:
        """Complete a RUNNING job through the cell (its release is a change at the pod's
        ocs_manager), recorded as the clients' acknowledgements are."""
        assert self.cells is not None
        with contextlib.suppress(grpc.aio.AioRpcError, TimeoutError):
            jobs = await asyncio.wait_for(chaos.list_cell_jobs(self.cells[0]), 5)
            running = sorted(j for j, job in jobs.items() if job.state == c.JOB_STATE_RUNNING)
            if not running:
                return
            job_id = self.rng.choice(running)
            resp = await self.cells[0].CompleteJob(
                cs.CompleteCellJobRequest(job_id=job_id), timeout=15
            )
            if self.record is not None:
                self.record.acked[job_id] = resp.state

    async def _batch_arrives(self, limit_s: float = 5.0) -> bool:
        """Whether a batch reaches the switches within `limit_s` (their apply calls)."""
        async with self._agent() as ch:
            admin = optical_switch_pb2_grpc.OpticalSwitchAdminStub(ch)

            async def calls() -> int:
                stats = await admin.GetSwitchStats(sb.GetSwitchStatsRequest(), timeout=2)
                return stats.apply_calls

            seen = await calls()
            deadline = time.monotonic() + limit_s
            while time.monotonic() < deadline:
                if await calls() > seen:
                    return True
                await asyncio.sleep(0.01)
        return False

    def resume_all(self) -> None:
        self._resume(*self.paused)


async def not_definite(cells: list) -> list[str]:
    """Jobs some live cell replica shows in no definite state."""
    for cell in cells:
        try:
            jobs = await asyncio.wait_for(chaos.list_cell_jobs(cell), 2.0)
        except (TimeoutError, Exception):  # that replica is paused or busy: ask the other
            continue
        return [
            f"{j.job_id} {c.JobState.Name(j.state)}"
            for j in jobs.values()
            if c.JobState.Name(j.state) in NOT_DEFINITE
            or c.JobState.Name(j.state)[len("JOB_STATE_") :] not in DEFINITE
        ]
    return ["no cell answered"]


async def time_to_definite(cells: list, limit_s: float = 60.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if not await not_definite(cells):
            return time.monotonic() - t0
        await asyncio.sleep(0.2)
    return float("inf")


def history_of(record: chaos.Record, at: float) -> History:
    """The chaos clients' acknowledgements as a history (the last one of each job)."""
    h = History()
    for job_id, state in record.acked.items():
        name = c.JobState.Name(state)[len("JOB_STATE_") :]
        kind = {"COMPLETED": "complete", "CANCELLED": "cancel"}.get(name, "submit")
        h.ack(kind, job_id, at, name)
    return h


async def final_state(cell, sched, ocs) -> tuple[Final, list[str]]:
    """The final state (the cell's jobs with the pod's blocks, the ocs_manager's slices)
    and what is still moving in it: a job WIRING at the pod, or one the cell shows in
    another state than the pod (its news not reported yet)."""
    jobs = await chaos.list_cell_jobs(cell)
    blocks: dict[str, tuple[int, ...]] = {}
    at_pod: dict[str, c.JobState.ValueType] = {}
    token = ""
    while True:
        page = await sched.ListJobs(ws.ListJobsRequest(page_size=1000, page_token=token))
        blocks.update((j.job_id, tuple(b.block_id for b in j.blocks)) for j in page.jobs)
        at_pod.update((j.job_id, j.state) for j in page.jobs)
        token = page.next_page_token
        if not token:
            break
    slices: dict[str, tuple[int, ...]] = {}
    token = ""
    while True:
        listed = await ocs.ListSlices(om.ListSlicesRequest(page_size=1000, page_token=token))
        slices.update((s.job_id, tuple(s.block_ids)) for s in listed.slices)
        token = listed.next_page_token
        if not token:
            break
    moving = [
        f"{j} {c.JobState.Name(s)} at the pod, {c.JobState.Name(jobs[j].state)} at the cell"
        for j, s in at_pod.items()
        if s == c.JOB_STATE_WIRING or (j in jobs and jobs[j].state != s)
    ]
    final = Final(
        jobs={
            j: (c.JobState.Name(job.state)[len("JOB_STATE_") :], blocks.get(j, ()))
            for j, job in jobs.items()
        },
        slices=slices,
    )
    return final, moving


def stale_refused(metrics_url: str, series: str = STALE_WRITES) -> dict[str, float]:
    """A counter of refused stale writes by its `where` label ("" without one), from a
    process's scrape: the ocs_manager's STALE_WRITES, a scheduler's STALE_COMMITS."""
    with urllib.request.urlopen(metrics_url, timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(series + "{"):
            labels, value = line.rsplit(" ", 1)
            where = labels.split('where="', 1)[1].split('"', 1)[0] if 'where="' in labels else ""
            out[where] = out.get(where, 0.0) + float(value)
    return out


def failover_figures(failovers: int) -> dict:
    """Sentinel failovers (bench/sentinel_failover.py), or nulls saying why not."""
    if failovers == 0:
        return {"failovers": 0, "failover_lost": None, "failover_reason": "--failovers 0"}
    try:
        module = importlib.import_module("sentinel_failover")
    except ImportError as err:
        return {
            "failovers": None,
            "failover_lost": None,
            "failover_reason": f"bench/sentinel_failover.py not importable ({err})",
        }
    figures = module.measure(failovers)
    # its own run's time and load, not to be taken for this run's
    figures["failover_seconds"] = figures.pop("seconds")
    figures["failover_load"] = figures.pop("load")
    return figures


async def drive(
    stack: Stack,
    args,
    ns: netns.Namespace | None = None,
    redis_port: int = 0,
    relay: RelayProcess | None = None,
) -> dict:
    rng = random.Random(args.seed)
    for name in CELLS:
        await chaos.wait_registered(stack, name)
    creds = stack.operator
    async with contextlib.AsyncExitStack() as chans:

        async def ch(name: str):
            return await chans.enter_async_context(
                channel(stack.endpoints[name], credentials=creds)
            )

        cells = [cell_scheduler_pb2_grpc.CellSchedulerStub(await ch(n)) for n in CELLS]
        sched = workload_scheduler_pb2_grpc.WorkloadSchedulerStub(await ch(SCHEDULERS[0]))
        ocs = ocs_manager_pb2_grpc.OcsManagerStub(await ch(OCS))
        record = chaos.Record()
        host = workload_scheduler_pb2_grpc.WorkloadSchedulerStub(await ch(SCHEDULERS[0]))
        pauser = Faults(stack, rng, host, ns, redis_port, cells=cells, relay=relay, record=record)
        kinds = [*FAULTS, *FORCED, *(NET_FAULTS if ns is not None else ())]
        if args.kinds:
            kinds = [k for k in kinds if k in args.kinds.split(",")]
            if not kinds:
                raise SystemExit(f"--kinds {args.kinds}: none can run here (no namespace)")
        plan = [kinds[i % len(kinds)] for i in range(args.faults)]
        rng.shuffle(plan)
        settle: list[float] = []
        started = time.monotonic()
        stop = asyncio.Event()

        async def faults() -> None:
            try:
                for kind in plan:
                    await asyncio.sleep(rng.uniform(0.5, 1.5))  # load between the faults
                    touched = await pauser.fault(kind)
                    settle.append(await time_to_definite(cells))
                    print(  # progress, for people (the JSON line is on stdout)
                        f"fault {len(settle)}/{len(plan)} {kind} ({', '.join(touched)}):"
                        f" definite {settle[-1]:.1f} s after",
                        file=sys.stderr,
                        flush=True,
                    )
            finally:
                pauser.resume_all()
                if ns is not None:
                    ns.heal()
                stop.set()

        async def clients() -> None:
            # the chaos clients in rounds of 5 s for as long as the faults last (each
            # round's clients have ids of their own: job ids are never reused)
            rounds = 0
            while not stop.is_set():
                deadline = time.monotonic() + 5.0
                await asyncio.gather(
                    *(
                        chaos.chaos_client(
                            rounds * args.clients + i,
                            cells,
                            record,
                            random.Random(rng.random()),
                            deadline,
                        )
                        for i in range(args.clients)
                    )
                )
                rounds += 1

        await asyncio.gather(faults(), clients())
        await chaos.Chaos(stack, None, rng).all_up()  # type: ignore[arg-type]
        last = await time_to_definite(cells, limit_s=90.0)
        # Two reads alike with nothing moving (bounded: 30 s): the listings are not one
        # atomic read, the cell may still be forwarding jobs from its queue, and a
        # slice is listed while it is being wired, before its job is RUNNING.
        final, moving = await final_state(cells[0], sched, ocs)
        for _ in range(60):
            await asyncio.sleep(0.5)
            again, moving = await final_state(cells[0], sched, ocs)
            if again == final and not moving:
                break
            final = again
        report = history_of(record, time.monotonic()).check(final)
        invariants = await ocs.CheckInvariants(om.CheckInvariantsRequest(compare_switches=True))
        applied = sum(1 for v in invariants.violations if v.rule == "SWITCH_STATE_DISAGREES")
        refused = await pauser.refusals()
        fenced_changes = 0.0  # the managers' own count of their changes the switches refused
        for name in (OCS, OCS_B):
            fenced_changes += stale_refused(stack.metrics_endpoints[name]).get("switch", 0.0)
        # for people: each double-booked job's transitions at the cell and the pod
        named = {w for line in report.double_booked for w in line.split() if w in final.jobs}
        stories = [f"{j}: {await chaos.histories(cells[0], sched, j)}" for j in sorted(named)[:4]]
    return {
        "faults": sum(pauser.kinds.values()),
        "faults_by_kind": dict(pauser.kinds),
        "partitions_observed": dict(pauser.observed),
        "ops": record.ops,
        "acknowledged": report.acknowledged,
        "lost": len(report.lost),
        "contradicted": len(report.contradicted),
        "undefined": len(report.undefined),
        "double_booked": len(report.double_booked),
        "stale_writes_refused": int(sum(refused.values())),
        "stale_writes_by_where": refused,
        "stale_forced": dict(pauser.forced),
        "stale_changes_refused_by_switches": int(fenced_changes),
        "stale_writes_applied": applied,
        "worst_s_to_definite_state": max([*settle, last]),
        "s_to_definite_state": settle,
        "still_moving": moving[:10],
        "violation_details": report.details()
        + [f"{v.rule}: {v.detail}" for v in invariants.violations][:10]
        + stories,
        "codes": dict(record.codes),
        "error_samples": record.messages,
        "seconds": time.monotonic() - started,
    }


@contextlib.contextmanager
def own_stack(
    ns: netns.Namespace | None,
) -> Iterator[tuple[Stack, EmbeddedRedis, RelayProcess | None]]:
    """The stack on a redis-server of its own (AOF, fsync always) on this side of the
    namespace's link (on loopback without one), in a temporary directory, with the
    delay relay (its delay off) in front of the ocs_managers when there is a
    namespace; all stopped at the end."""
    with tempfile.TemporaryDirectory(prefix="lightpath-partitions-") as tmp:
        host = ns.host_ip if ns is not None else "127.0.0.1"
        redis = EmbeddedRedis(Path(tmp) / "redis", port=free_port(), host=host)
        redis.start()
        relay = None
        try:
            with redis_py.Redis(host=host, port=redis.port) as r:
                r.config_set("appendfsync", "always")
            process_specs, routes = specs(ns)
            if routes:
                relay = RelayProcess(routes, delay_ms=DELAY_MS, on=False)
                relay.start(Path(tmp) / "relay.log")
            stack = Stack(
                Path(tmp) / "state", specs=process_specs, redis_url=redis.url, log=lambda *_: None
            )
            stack.start()
            try:
                yield stack, redis, relay
            finally:
                stack.stop()
        finally:
            if relay is not None:
                relay.stop()
            redis.stop()


def run(args) -> dict:
    why = netns.unavailable() if args.network else "--no-network"
    ns = None if why else netns.Namespace()
    try:
        if ns is not None:
            ns.create()
        with own_stack(ns) as (stack, redis, relay):
            result = asyncio.run(drive(stack, args, ns, redis.port, relay))
    finally:
        if ns is not None:
            ns.destroy()
    result["not_injected"] = [f"partitions, loss and delay: {why}"] if why else []
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--faults",
        type=int,
        default=20,
        help="faults over the run (each kind in turn, seeded order)",
    )
    parser.add_argument(
        "--kinds",
        default="",
        help="only these fault kinds, comma-separated (default: all; network kinds need "
        f"a namespace): {', '.join([*FAULTS, *FORCED, *NET_FAULTS])}",
    )
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument(
        "--failovers", type=int, default=20, help="Sentinel failovers (0: Sentinel not run)"
    )
    parser.add_argument(
        "--network",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="partitions and loss in a network namespace (needs root; pauses only without)",
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    unknown = set(filter(None, args.kinds.split(","))) - {*FAULTS, *FORCED, *NET_FAULTS}
    if unknown:
        parser.error(f"--kinds: no fault kind {', '.join(sorted(unknown))}")
    result = run(args)
    result.update(failover_figures(args.failovers))
    result.update(load_average=list(os.getloadavg()), seed=args.seed)
    emit(result)
    return result


if __name__ == "__main__":
    main()
