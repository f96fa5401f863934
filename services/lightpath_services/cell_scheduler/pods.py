"""The registered pods as the cell sees them (CS-1, CS-6), and the calls it makes to them.

`PodDirectory` owns the read side of the registry: the registry snapshot
(cached for submissions for at most REGISTRY_TTL_S, with this replica's own
placements and releases assumed in it), the decoded registrations and
capacity reports, each pod's status (ready, suspect after a failed call,
silent past the pod timeout) and the capacity views planning chooses from.
It also owns the way to a pod: its endpoint (the replica heard from last) and
one unary call with the cell's retry rule. Writes to the registry (register,
report) are the cell's (cell.py); job state is jobs.py's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from lightpath.errors import NotFound
from lightpath.v1 import cell_scheduler_pb2
from lightpath_services.cell_scheduler.choice import PodCapacityView, chips_key
from lightpath_services.cell_scheduler.podclient import PodClients, PodRefused, classify
from lightpath_services.cell_scheduler.request import PodModel
from lightpath_services.cell_scheduler.store import CellStore, RegistrySnapshot, unb64

REGISTRY_TTL_S = 0.2
CACHE_LIMIT = 20_000


class PodDirectory:
    def __init__(
        self,
        *,
        store: CellStore,
        clients: PodClients,
        pod_timeout_s: float,
        clock: Callable[[], float],
    ):
        self.store = store
        self.clients = clients
        self.pod_timeout_ms = int(pod_timeout_s * 1000)
        self._clock = clock
        self._models: dict[str, PodModel] = {}  # by registration (base64)
        self._capacities: dict[str, cell_scheduler_pb2.PodCapacity] = {}  # by report (base64)
        self._endpoints: dict[str, str] = {}
        self._snap: RegistrySnapshot | None = None
        self.snap_at = 0.0  # when the read of the cached snapshot began (monotonic)

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def registry(self, *, fresh: bool = False) -> RegistrySnapshot:
        """The registry and the cell queue, read at most every REGISTRY_TTL_S for
        submissions (what this replica places and ends meanwhile is assumed in it; the
        claim script checks what a decision needs: free blocks, an empty queue)."""
        if fresh or self._snap is None or time.monotonic() - self.snap_at > REGISTRY_TTL_S:
            read_at = time.monotonic()  # the data is at least this new
            self._snap = await self.store.snapshot()
            self.snap_at = read_at
        return self._snap

    def forget_snapshot(self) -> None:
        """A change this replica made to the registry itself (a pod registered or came
        back): the next submission reads it, not the cached snapshot from before it."""
        self._snap = None

    def assume(self, pod: str, needs: Mapping[str, int], sign: int) -> None:
        """Blocks this replica just took (-1) or freed (+1) on a pod, in its cached registry."""
        if self._snap is not None:
            for t, n in needs.items():
                key = f"{pod}|{t}"
                if key in self._snap.free:
                    self._snap.free[key] += sign * n

    def model(self, registration_b64: str) -> PodModel:
        m = self._models.get(registration_b64)
        if m is None:
            reg = cell_scheduler_pb2.PodRegistration.FromString(unb64(registration_b64))
            m = PodModel.of(reg)
            if len(self._models) > CACHE_LIMIT:
                self._models.clear()
            self._models[registration_b64] = m
        return m

    def capacity(self, capacity_b64: str) -> cell_scheduler_pb2.PodCapacity:
        c = self._capacities.get(capacity_b64)
        if c is None:
            c = cell_scheduler_pb2.PodCapacity.FromString(unb64(capacity_b64))
            if len(self._capacities) > CACHE_LIMIT:
                self._capacities.clear()
            self._capacities[capacity_b64] = c
        return c

    def models_of(self, snap: RegistrySnapshot) -> dict[str, PodModel]:
        self._endpoints.update(snap.endpoint)
        return {p: self.model(r) for p, r in sorted(snap.registrations.items())}

    async def silent_for(self, pod_id: str) -> float | None:
        """Seconds since a pod's last heartbeat when it is silent (marked so, or past the
        pod timeout, as ListPods says SILENT); None when it is not."""
        seen, down = await self.store.heard_from(pod_id)
        now = self.now_ms()
        if down or now - seen > self.pod_timeout_ms:
            return max(0.0, (now - seen) / 1000)
        return None

    def status_of(self, snap: RegistrySnapshot, pod_id: str, now: int) -> tuple[int, str]:
        """(PodStatus, why) of a registered pod."""
        seen = snap.seen.get(pod_id, 0)
        if pod_id in snap.down or now - seen > self.pod_timeout_ms:
            return (
                cell_scheduler_pb2.POD_STATUS_SILENT,
                f"no heartbeat for {(now - seen) / 1000:.1f} s",
            )
        if snap.suspect.get(pod_id, 0) > now:
            return (
                cell_scheduler_pb2.POD_STATUS_SUSPECT,
                "a call to it just failed; waiting for its next heartbeat",
            )
        return cell_scheduler_pb2.POD_STATUS_READY, ""

    def views_of(self, snap: RegistrySnapshot, now: int) -> dict[str, PodCapacityView]:
        """What planning knows about each pod: free blocks and chips (minus forwards in
        flight), what lower priorities would give up, and whether it may be chosen."""
        out: dict[str, PodCapacityView] = {}
        for pod_id in sorted(snap.registrations):
            status, why = self.status_of(snap, pod_id, now)
            view = PodCapacityView(
                pod_id,
                usable=status == cell_scheduler_pb2.POD_STATUS_READY,
                why_not=why,
                version=snap.versions.get(pod_id, ""),
                block_chips=math.prod(self.model(snap.registrations[pod_id]).block_shape),
            )
            raw = snap.capacities.get(pod_id)
            if raw is None:
                view.usable, view.why_not = False, "has not reported its capacity yet"
            else:
                for t in self.capacity(raw).types:
                    capacity_view(view, t, snap)
            out[pod_id] = view
        return out

    async def block_chips(self, pod_id: str) -> int:
        """Chips in one block of a registered pod (0 when it is not registered)."""
        snap = self._snap
        raw = snap.registrations.get(pod_id) if snap is not None else None
        if raw is None:
            raw = await self.store.registration(pod_id)
        return math.prod(self.model(raw).block_shape) if raw is not None else 0

    def heard_from(self, pod_id: str, endpoint: str) -> None:
        """The replica of a pod that reported last: where calls go."""
        self._endpoints[pod_id] = endpoint

    async def endpoint(self, pod_id: str, *, fresh: bool = False) -> str:
        addr = None if fresh else self._endpoints.get(pod_id)
        if addr is None:
            addr = await self.store.endpoint(pod_id)
            if addr is None:
                raise NotFound("pod", pod_id, hint="no workload scheduler registered it")
            self._endpoints[pod_id] = addr
        return addr

    async def call(self, pod_id: str, method: str, request: Any, *, timeout: float = 10.0) -> Any:
        """One unary call to a pod's workload scheduler; PodRefused / PodUnreachable on error.
        An unreachable replica is retried once at the endpoint the registry now has, if it
        changed (every call the cell makes is idempotent at the pod: AdmitJob by job id)."""
        for attempt in range(2):
            endpoint = await self.endpoint(pod_id, fresh=attempt > 0)
            try:
                stub = self.clients.stub(endpoint, pod_id)
                return await getattr(stub, method)(request, timeout=timeout)
            except grpc.aio.AioRpcError as err:
                failure = classify(pod_id, err)
                if isinstance(failure, PodRefused) or attempt:
                    raise failure from None
                if await self.store.endpoint(pod_id) == endpoint:
                    raise failure from None
        raise AssertionError("unreachable")

    async def registration(self, pod_id: str) -> str:
        raw = await self.store.registration(pod_id)
        if raw is None:
            raise NotFound("pod", pod_id, hint="no workload scheduler registered it")
        return raw


def reported_chips(t: cell_scheduler_pb2.NodeTypeCapacity, block_chips: int) -> tuple[int, int]:
    """(chips_free, largest_free_box) of one node type as reported; a report without chip
    figures (a workload scheduler from before issue 28) counts its free blocks' chips."""
    if t.chips_total:
        return t.chips_free, t.largest_free_box
    return t.free * block_chips, block_chips if t.free else 0


def capacity_view(
    view: PodCapacityView, t: cell_scheduler_pb2.NodeTypeCapacity, snap: RegistrySnapshot
) -> None:
    """One node type's report in `view`, corrected by what the cell assumes since it
    (placements and ends through the cell, forwards in flight).

    Blocks and chips are assumed apart (a block slice's need is blocks, a sub-block
    slice's chips): the blocks taken since the report take their chips too, a
    sub-block box may have started a free block (no more blocks are free than the
    chips left make), and the largest free box holds at most the chips left."""
    key = f"{view.pod_id}|{t.node_type}"
    ckey = f"{view.pod_id}|{chips_key(t.node_type)}"
    per_block = view.block_chips
    free = snap.free.get(key, t.free) - snap.held.get(key, 0)
    reported, largest = reported_chips(t, per_block)
    taken = t.free - free  # blocks taken since the report (< 0: freed)
    chips = snap.free.get(ckey, reported) - snap.held.get(ckey, 0) - taken * per_block
    chips = max(0, chips)
    free = max(0, min(free, chips // per_block) if per_block else free)
    largest = min(largest, chips)
    if free and largest < per_block:  # a block freed since: any box fits in it
        largest = per_block
    view.free[t.node_type] = free
    view.chips_free[t.node_type] = chips
    view.largest_box[t.node_type] = largest
    view.preemptible[t.node_type] = dict(t.preemptible_by_priority)
