"""The in-process view of the capacity map, kept in step with Redis.

Loading every device's schedule per decision would not keep up (10,000
reservations over 1,000 devices), so each broker replica holds a
`CapacityMap` and follows the change stream: every script that changes broker
state appends one entry with a consecutive version, its capacity deltas
(`ops`) and its events. Entries apply in version order and idempotently
(allocations are keyed); a gap in versions (the stream was trimmed past us)
reloads the whole snapshot. Redis stays the arbiter: a decision made on a
view a little behind is refused by the commit script and decided again.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from lightpath_services.core_broker.capacity import CapacityMap, Device
from lightpath_services.core_broker.store import BrokerStore, Change

log = logging.getLogger("lightpath.core_broker.view")

EventListener = Callable[[Change], None]


def device_from_doc(doc: dict[str, Any]) -> Device:
    return Device(
        device_id=doc["device_id"],
        kind=doc["kind"],
        cores=int(doc["cores"]),
        site=doc.get("site", ""),
        x_km=float(doc.get("x_km", 0.0)),
        y_km=float(doc.get("y_km", 0.0)),
        task_affinities=tuple(doc.get("task_affinities") or ()),
    )


def device_doc(device: Device) -> dict[str, Any]:
    return {
        "device_id": device.device_id,
        "kind": device.kind,
        "cores": device.cores,
        "site": device.site,
        "x_km": device.x_km,
        "y_km": device.y_km,
        "task_affinities": list(device.task_affinities),
    }


def stream_position(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def parse_member(member: str) -> tuple[int, int]:
    """(end, cores) of an allocation member `<reservation>:<part>:<end>:<cores>`."""
    _, _, end, cores = member.split(":")
    return int(end), int(cores)


class LiveView:
    """A replica's capacity map plus the stream position it reflects."""

    def __init__(self, store: BrokerStore):
        self.store = store
        self.capacity = CapacityMap()
        self.version = -1
        self.stream_id = "0-0"
        self._listeners: list[EventListener] = []
        self._reset_listeners: list[Callable[[], None]] = []
        self._load_lock = asyncio.Lock()

    def on_events(self, listener: EventListener) -> None:
        self._listeners.append(listener)

    def on_reset(self, listener: Callable[[], None]) -> None:
        self._reset_listeners.append(listener)

    async def load(self) -> None:
        """Replace the view by a consistent snapshot of Redis."""
        async with self._load_lock:
            snap = await self.store.snapshot()
            cap = CapacityMap()
            for doc in snap.devices.values():
                cap.upsert_device(device_from_doc(doc))
            for device_id, rows in snap.allocations.items():
                for member, start in rows:
                    end, cores = parse_member(member)
                    cap.add(member, device_id, start, end, cores)
            for (site, device_id), ms in snap.latency.items():
                cap.set_latency(site, device_id, ms)
            first = self.version < 0
            self.capacity = cap
            self.version = snap.version
            self.stream_id = snap.stream_id
            log.info(
                "capacity view loaded: %d devices, %d allocations, version %d",
                len(snap.devices),
                len(cap),
                snap.version,
                extra={"devices": len(snap.devices), "version": snap.version},
            )
        if not first:
            for listener in self._reset_listeners:
                listener()

    async def catch_up(self) -> None:
        """Apply every change up to now (one read when there is nothing new)."""
        while True:
            changes = await self.store.read_changes(self.stream_id, count=2000)
            if not self.apply(changes):
                await self.load()
                return
            if len(changes) < 2000:
                return

    async def follow(self, block_ms: int = 1000) -> None:
        """Apply changes as they come, for ever (a background task)."""
        task = asyncio.current_task()
        while task is None or not task.cancelling():
            changes = await self.store.read_changes(self.stream_id, block_ms=block_ms, count=2000)
            if not self.apply(changes):
                await self.load()

    def apply(self, changes: Sequence[Change]) -> bool:
        """Apply entries in stream order; False on a gap or a reset (the caller reloads).

        An entry at or before our position was applied already (two readers
        may fetch the same entries). After it, the next version must follow
        ours: a jump means the stream was trimmed past us, a step back that
        Redis lost its state (restarted empty) — either way, reload."""
        for c in changes:
            if stream_position(c.stream_id) <= stream_position(self.stream_id):
                continue
            if c.version != self.version + 1:
                log.warning(
                    "change stream out of step: at version %d, next entry is %d; reloading",
                    self.version,
                    c.version,
                )
                return False
            self._apply_ops(c.ops)
            self.version = c.version
            self.stream_id = c.stream_id
            for listener in self._listeners:
                listener(c)
        return True

    def note_commit(self, change: Change) -> None:
        """Our own commit: apply it now if it is the next version, else assume
        its new allocations until the stream brings it (adds are idempotent)."""
        if change.version == self.version + 1:
            self.apply([change])
            return
        for op in change.ops:
            if op[0] == "+":
                self._add(op)

    def _add(self, op: list[Any]) -> None:
        _, device_id, member, start, end, cores = op
        try:
            self.capacity.add(member, device_id, int(start), int(end), int(cores))
        except KeyError:
            log.warning("allocation %s on unknown device %s ignored", member, device_id)

    def _apply_ops(self, ops: Sequence[list[Any]]) -> None:
        cap = self.capacity
        for op in ops:
            kind = op[0]
            if kind == "+":
                self._add(op)
            elif kind == "-":
                cap.remove(op[2])
            elif kind == "d":
                doc = op[1] if isinstance(op[1], dict) else json.loads(op[1])
                cap.upsert_device(device_from_doc(doc))
            elif kind == "D":
                cap.remove_device(op[1])
            elif kind == "l":
                _, site, device_id, ms = op
                cap.set_latency(site, device_id, None if float(ms) < 0 else float(ms))
