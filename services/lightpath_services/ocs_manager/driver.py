"""The switch-driver boundary (OCS-8).

The manager never touches a switch itself: it hands a `FabricChange` to a
`SwitchDriver`. A driver applies it idempotently with absolute semantics (a
disconnect of a pair that is not connected is a no-op; a connect makes the
two ports each other's only peer; a 1xK move sets the output), so the manager
can always undo a failed or interrupted change by applying its inverse.
On each switch the order is disconnects, then 1xK moves, then connects; across
switches a driver may program in any order or all at once (each cross-connect
lives on one switch, and nothing carries traffic before the change is committed).

Every change is made under the slice's change lease and carries its `Fence` (the job id
and the lease's token, issue 32): a switch refuses a change under a lower token than
one it has seen for that job (`SwitchDriverError.stale`, nothing applied), so a manager
that was paused past its lease while another took the change over and rolled it back
cannot move a mirror from its stale view when it wakes.

On failure a driver raises `SwitchDriverError`, saying what it had applied if
it knows (`applied`), and whether retrying later may help (`transient`: the
manager answers UNAVAILABLE, else ABORTED). `applied` is a `FabricChange`
covering at least everything that took effect (None: unknown, the manager undoes
all of it); the manager applies `applied.inverse()` through the same driver, so a
driver may answer a subclass that narrows the change to the switches it touched
(agent_driver.ScopedChange) and honour that narrowing when it gets the inverse.

Two drivers:

* `RedisSwitchDriver`, the default, simulates the switches: each OCS's own
  cross-connects and each block's 1xK outputs live in Redis under
  `lp:{pod}:dev:...`, apart from the manager's committed tables, and an optional
  settling delay mimics MEMS mirrors moving (OCS_DRIVER_SETTLE_MS). One Lua
  script applies a whole change: it never fails half-way.
* `agent_driver.AgentSwitchDriver` (LIGHTPATH_OCS_SWITCH_AGENTS) speaks the
  open southbound, protos/lightpath/v1/optical_switch.proto, to switch agents
  (services/lightpath_services/switch_agent, or a vendor's adapter): one batch per switch, all
  switches in parallel; reconcile.py keeps the switches as committed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

import redis.asyncio as aioredis

from lightpath.domain.torus import Fabric
from lightpath_services.common.keys import pod_key
from lightpath_services.ocs_manager.invariants import FabricState
from lightpath_services.ocs_manager.lua import (
    device_script,
    encode_change,
    fabric_header,
    otm_keys,
    read_layout,
    table_keys,
)
from lightpath_services.ocs_manager.wiring import FabricChange


@dataclass(frozen=True)
class Fence:
    """The lease a change is made under: its name (the slice's job id) and token."""

    lease_id: str
    token: int


class LeasedRequest(Protocol):
    """A request that changes a job's wiring or rings under the caller's lease."""

    lease_token: int
    lease_id: str


def caller_lease(request: LeasedRequest, job: str) -> Fence | None:
    """The caller's lease on the job the request changes (fencing, issue 32); None: unfenced."""
    if not request.lease_token:
        return None
    return Fence(request.lease_id or job, request.lease_token)


class SwitchDriverError(Exception):
    """A switch refused or did not answer. `applied`: the part of the change known to have
    taken effect (None: unknown, the manager undoes all of it). `stale`: refused for a
    fence token older than one the switch has seen (a newer holder took the change over)."""

    def __init__(
        self,
        message: str,
        *,
        applied: FabricChange | None = None,
        transient: bool = True,
        stale: bool = False,
    ):
        super().__init__(message)
        self.applied = applied
        self.transient = transient
        self.stale = stale


class SwitchDriver(Protocol):
    async def apply(self, change: FabricChange, fence: Fence | None = None) -> None:
        """Program the switches: disconnects, then 1xK moves, then connects (refused whole
        when `fence` is older than one seen for its lease)."""
        ...

    async def read(self) -> FabricState | None:
        """The switches' own state (tables and 1xK outputs), or None if unreadable."""
        ...


_DEVICE_APPLY, _DEVICE_INIT = device_script("apply"), device_script("init")


class RedisSwitchDriver:
    """Simulated switches with their state in Redis (the default driver, OCS-8)."""

    def __init__(
        self, redis: aioredis.Redis, pod_id: str, fabric: Fabric, *, settle_s: float = 0.0
    ):
        self._redis = redis
        self._fabric = fabric
        self._settle_s = settle_s
        prefix = pod_key(pod_id, "dev")
        self._keys = [*table_keys(fabric, prefix), *otm_keys(fabric, prefix)]
        self.k_fences = pod_key(pod_id, "dev", "fences")
        self.k_refused = pod_key(pod_id, "dev", "stale_refused")
        self._header = fabric_header(fabric)
        self._apply = redis.register_script(_DEVICE_APPLY)
        self._init = redis.register_script(_DEVICE_INIT)

    async def init(self) -> None:
        """Lay out the switches' state hashes (idempotent; keeps what is set)."""
        await self._init(keys=self._keys, args=self._header)

    async def apply(self, change: FabricChange, fence: Fence | None = None) -> None:
        if change.empty:
            return
        enc = encode_change(self._fabric, change)
        lease, token = (fence.lease_id, fence.token) if fence else ("", 0)
        try:
            ok = await self._apply(
                keys=[*self._keys, self.k_fences, self.k_refused],
                args=[*self._header, enc.disconnect, enc.connect, enc.otm, lease, token],
            )
        except aioredis.RedisError as exc:
            raise SwitchDriverError(f"switch state store failed: {exc}") from exc
        if not int(ok):
            raise SwitchDriverError(
                f"the switches refused the change: lease {lease} has a newer holder than "
                f"token {token}",
                applied=FabricChange((), (), ()),
                transient=False,
                stale=True,
            )
        if self._settle_s > 0:
            await asyncio.sleep(self._settle_s)

    async def read(self) -> FabricState:
        async with self._redis.pipeline(transaction=True) as pipe:
            for key in self._keys:
                pipe.hgetall(key)
            replies = await pipe.execute()
        return read_layout(self._fabric, replies)
