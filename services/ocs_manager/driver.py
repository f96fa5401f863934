"""The switch-driver boundary (OCS-8).

The manager never touches a switch itself: it hands a `FabricChange` to a
`SwitchDriver`. A driver applies it idempotently with absolute semantics (a
disconnect of a pair that is not connected is a no-op; a connect makes the
two ports each other's only peer; a 1xK move sets the output), so the manager
can always undo a failed or interrupted change by applying its inverse.

On failure a driver raises `SwitchDriverError`, saying what it had applied if
it knows (`applied`), and whether retrying later may help (`transient`: the
manager answers UNAVAILABLE, else ABORTED).

`RedisSwitchDriver`, the default, simulates the switches: each OCS's own
cross-connects and each block's 1xK outputs live in Redis under
`lp:{pod}:dev:...`, apart from the manager's committed tables, and an optional
settling delay mimics MEMS mirrors moving (OCS_DRIVER_SETTLE_MS).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import redis.asyncio as aioredis

from services.common.keys import pod_key
from services.ocs_manager.fabric import Fabric
from services.ocs_manager.invariants import FabricState
from services.ocs_manager.lua import LUA_HELPERS, encode_change, fabric_header
from services.ocs_manager.wiring import FabricChange


class SwitchDriverError(Exception):
    """A switch refused or did not answer. `applied`: the part of the change known to have
    taken effect (None: unknown, the manager undoes all of it)."""

    def __init__(
        self, message: str, *, applied: FabricChange | None = None, transient: bool = True
    ):
        super().__init__(message)
        self.applied = applied
        self.transient = transient


class SwitchDriver(Protocol):
    async def apply(self, change: FabricChange) -> None:
        """Program the switches: disconnects, then 1xK moves, then connects."""
        ...

    async def read(self) -> FabricState | None:
        """The switches' own state (tables and 1xK outputs), or None if unreadable."""
        ...


_DEVICE_APPLY = (
    LUA_HELPERS
    + r"""
-- KEYS: every device OCS table (OCS-index order), then the 1xK hashes of the named blocks.
-- ARGV: K, axes, offsets, n_ocs, disconnect, connect, otm
local K = tonumber(ARGV[1])
local axes, off = nums(ARGV[2]), nums(ARGV[3])
local otm_base = tonumber(ARGV[4]) + 1

for idx, t in pairs(per_table(nums(ARGV[5]), 1, K, axes, off)) do
  local cur = redis.call('HMGET', KEYS[idx], unpack(t))
  local del = {}
  for i = 1, #t, 2 do
    if cur[i] == tostring(t[i + 1]) then del[#del + 1] = t[i] end
    if cur[i + 1] == tostring(t[i]) then del[#del + 1] = t[i + 1] end
  end
  if #del > 0 then redis.call('HDEL', KEYS[idx], unpack(del)) end
end

local otm = nums(ARGV[7])
for i = 1, #otm, 4 do
  local key, d, after = KEYS[otm_base + otm[i]], otm[i + 1], otm[i + 3]
  local f = otm_fields(d, axes[d + 1])
  if after < 0 then
    redis.call('HDEL', key, unpack(f))
  else
    local kv = {}
    for _, x in ipairs(f) do kv[#kv + 1] = x; kv[#kv + 1] = after end
    redis.call('HSET', key, unpack(kv))
  end
end

for idx, t in pairs(per_table(nums(ARGV[6]), 1, K, axes, off)) do
  local cur = redis.call('HMGET', KEYS[idx], unpack(t))
  local del = {}
  for i = 1, #t do
    local peer = (i % 2 == 1) and t[i + 1] or t[i - 1]
    if cur[i] and cur[i] ~= tostring(peer) then del[#del + 1] = cur[i] end
  end
  if #del > 0 then redis.call('HDEL', KEYS[idx], unpack(del)) end
  local kv = {}
  for i = 1, #t, 2 do
    kv[#kv + 1] = t[i]; kv[#kv + 1] = t[i + 1]; kv[#kv + 1] = t[i + 1]; kv[#kv + 1] = t[i]
  end
  redis.call('HSET', KEYS[idx], unpack(kv))
end
return 1
"""
)


class RedisSwitchDriver:
    """Simulated switches with their state in Redis (the default driver, OCS-8)."""

    def __init__(
        self, redis: aioredis.Redis, pod_id: str, fabric: Fabric, *, settle_s: float = 0.0
    ):
        self._redis = redis
        self._fabric = fabric
        self._pod = pod_id
        self._settle_s = settle_s
        self._tables = [pod_key(pod_id, "dev", "ocs", oid) for oid in fabric.ocs_ids]
        self._header = fabric_header(fabric)
        self._script = redis.register_script(_DEVICE_APPLY)

    def _otm_key(self, block: int) -> str:
        return pod_key(self._pod, "dev", "otm", block)

    async def apply(self, change: FabricChange) -> None:
        if change.empty:
            return
        enc = encode_change(self._fabric, change)
        keys = [*self._tables, *(self._otm_key(b) for b in enc.otm_blocks)]
        try:
            await self._script(
                keys=keys,
                args=[*self._header, len(self._tables), enc.disconnect, enc.connect, enc.otm],
            )
        except aioredis.RedisError as exc:
            raise SwitchDriverError(f"switch state store failed: {exc}") from exc
        if self._settle_s > 0:
            await asyncio.sleep(self._settle_s)

    async def read(self) -> FabricState:
        async with self._redis.pipeline(transaction=True) as pipe:
            for key in self._tables:
                pipe.hgetall(key)
            for b in range(self._fabric.block_count):
                pipe.hgetall(self._otm_key(b))
            replies = await pipe.execute()
        state = FabricState()
        n = len(self._tables)
        for i, table in enumerate(replies[:n]):
            if table:
                state.tables[i] = {int(p): int(q) for p, q in table.items()}
        for b, otm in enumerate(replies[n:]):
            for f, out in otm.items():
                d, a = map(int, f.split("."))
                state.one_to_many[self._fabric.one_to_many_index(b, d, a)] = int(out)
        return state
