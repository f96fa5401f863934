"""How routing tables and 1xK states sit in Redis, and the Lua that changes them.

Shared by the store (the manager's committed state, `lp:{pod}:ocs:...`) and the
default switch driver (the simulated switches' own state, `lp:{pod}:dev:...`).

Layout. One hash per (dimension, k) holds the routing tables of every OCS of
that dimension's axes with that k: field `axis * port_stride + port` (decimal,
"5017" = axis 5, port 17) -> peer port; a dark port has no field. One hash per
dimension holds the 1xK switches: field `block * axis_stride + axis` -> output;
an idle switch has no field. Why grouped, and why each hash holds a `layout`
field longer than 64 bytes describing its fields: Redis keeps a small hash (up
to 512 fields of up to 64 bytes) as a ziplist, where every HSET / HMGET scans
the list — 48 per-OCS tables of 128 ports cost a full-pod wire ~15 ms of Redis
time, and a few 2-block slices on a ziplist table doubled Redis' CPU per wire.
The long `layout` value makes every table a hash table from its creation, and
keeps the key when the last cross-connect goes.

Arguments. A change travels as links ("d k port_a port_b": the same two ports
on every axis of d), so a full-pod slice is 192 links rather than 3,072
cross-connects, and 1xK groups ("d block before after", -1 = idle).
"""

from __future__ import annotations

from dataclasses import dataclass

from services.ocs_manager.fabric import Fabric, dim_name
from services.ocs_manager.invariants import FabricState
from services.ocs_manager.wiring import FabricChange, Link, link_ports


def table_keys(fabric: Fabric, prefix: str) -> list[str]:
    """The (dim, k) table hashes in the order scripts index them: d * K + k."""
    return [f"{prefix}:xc:{dim_name(d)}:{k}" for d in range(fabric.dims) for k in range(fabric.k)]


def otm_keys(fabric: Fabric, prefix: str) -> list[str]:
    """The per-dimension 1xK hashes (index d)."""
    return [f"{prefix}:otm:{dim_name(d)}" for d in range(fabric.dims)]


@dataclass(frozen=True)
class EncodedChange:
    """ARGV strings: `disconnect` / `connect` "d k pa pb ...", `otm` "d block before after ..."."""

    disconnect: str
    connect: str
    otm: str


def _links(fabric: Fabric, group: tuple[Link, ...]) -> str:
    parts: list[str] = []
    for lk in group:
        k, pa, pb = link_ports(fabric, lk)
        parts.append(f"{lk.dim} {k} {pa} {pb}")
    return " ".join(parts)


def encode_change(fabric: Fabric, change: FabricChange) -> EncodedChange:
    otm = " ".join(
        f"{g.dim} {g.block} {-1 if g.before is None else g.before} "
        f"{-1 if g.after is None else g.after}"
        for g in change.one_to_many
    )
    return EncodedChange(_links(fabric, change.disconnect), _links(fabric, change.connect), otm)


def fabric_header(fabric: Fabric) -> list[str]:
    """K, axes per dim, port stride, axis stride, dim names, blocks, first ends per k."""
    return [
        str(fabric.k),
        " ".join(map(str, fabric.axes)),
        str(fabric.port_stride),
        str(fabric.axis_stride),
        " ".join(dim_name(d) for d in range(fabric.dims)),
        str(fabric.block_count),
        " ".join(map(str, fabric.first_ends)),
    ]


HEADER_ARGS = 7

# Lua prelude: reads the fabric header from ARGV[h .. h+6] (h = the `H` a script sets first).
LUA_HELPERS = r"""
local function nums(s)
  local t = {}
  for n in string.gmatch(s, '-?%d+') do t[#t + 1] = tonumber(n) end
  return t
end
local function words(s)
  local t = {}
  for w in string.gmatch(s, '%S+') do t[#t + 1] = w end
  return t
end

local K = tonumber(ARGV[H])
local axes = nums(ARGV[H + 1])
local S = tonumber(ARGV[H + 2])
local A = tonumber(ARGV[H + 3])
local names = words(ARGV[H + 4])
local N = tonumber(ARGV[H + 5])
local first_ends = nums(ARGV[H + 6])
local M = #axes

-- a stored value -> number, or nil for a missing field (dark port, idle switch)
local function val(v)
  if not v or v == '' then return nil end
  return tonumber(v)
end

-- links "d k pa pb" over every axis of d -> {key index -> {f = fields, p = peers}}
-- (both directions); `touched` collects d * K + k of every link (all the OCS of d's
-- axes with that k). Fields and peers are strings, each number converted once: Redis
-- would convert a number argument on every call it is passed to.
local function expand(flat, base, touched)
  local g = {}
  for i = 1, #flat, 4 do
    local d, k, pa, pb = flat[i], flat[i + 1], flat[i + 2], flat[i + 3]
    local idx = base + d * K + k
    local t = g[idx]
    if not t then t = {f = {}, p = {}}; g[idx] = t end
    local f, p = t.f, t.p
    local spa, spb = tostring(pa), tostring(pb)
    for a = 0, axes[d + 1] - 1 do
      local n = #f
      f[n + 1] = tostring(a * S + pa); p[n + 1] = spb
      f[n + 2] = tostring(a * S + pb); p[n + 2] = spa
    end
    if touched then touched[d * K + k] = true end
  end
  return g
end

-- 1xK groups "d block before after" -> {key index -> {f, before, after}} (-1 = idle)
local function expand_otm(flat, base)
  local g = {}
  for i = 1, #flat, 4 do
    local d, b, before, after = flat[i], flat[i + 1], flat[i + 2], flat[i + 3]
    local idx = base + d
    local t = g[idx]
    if not t then t = {f = {}, before = {}, after = {}}; g[idx] = t end
    for a = 0, axes[d + 1] - 1 do
      local n = #t.f + 1
      t.f[n] = b * A + a; t.before[n] = before; t.after[n] = after
    end
  end
  return g
end

local CHUNK = 3000  -- stay well under Lua's unpack limit
local function hmget(key, f)
  local out = {}
  for i = 1, #f, CHUNK do
    local part = redis.call('HMGET', key, unpack(f, i, math.min(#f, i + CHUNK - 1)))
    for x = 1, #part do out[#out + 1] = part[x] end
  end
  return out
end
local function hset(key, f, v)
  for i = 1, #f, CHUNK do
    local kv = {}
    for x = i, math.min(#f, i + CHUNK - 1) do kv[#kv + 1] = f[x]; kv[#kv + 1] = v[x] end
    redis.call('HSET', key, unpack(kv))
  end
end
local function hdel(key, f)
  for i = 1, #f, CHUNK do
    redis.call('HDEL', key, unpack(f, i, math.min(#f, i + CHUNK - 1)))
  end
end
-- apply 1xK groups: set the output, or drop the field for idle
local function apply_otm(groups)
  for idx, t in pairs(groups) do
    local sf, sv, idle = {}, {}, {}
    for i = 1, #t.f do
      if t.after[i] < 0 then idle[#idle + 1] = t.f[i]
      else sf[#sf + 1] = t.f[i]; sv[#sv + 1] = t.after[i] end
    end
    hdel(KEYS[idx], idle)
    hset(KEYS[idx], sf, sv)
  end
end

-- Every hash carries a `layout` field, so it outlives its last entry; its value is
-- longer than 64 bytes (Redis' hash-max-ziplist-value / -listpack-value), so the hash
-- is a hash table from the start, however few cross-connects it holds.
local function init_layout(xc_base, otm_base)
  for i = xc_base, xc_base + M * K - 1 do
    redis.call('HSET', KEYS[i], 'layout', 'routing tables: field axis*' .. S ..
      '+port -> peer port, both directions; a dark port has no field')
  end
  if K > 1 then
    for d = 0, M - 1 do
      redis.call('HSET', KEYS[otm_base + d], 'layout', '1xK switches: field block*' .. A ..
        '+axis -> output it is set to; an idle switch has no field')
    end
  end
end
"""


def read_layout(fabric: Fabric, replies: list[dict[str, str]]) -> FabricState:
    """HGETALL of table_keys + otm_keys (in that order) -> the state they hold."""
    state = FabricState()
    n_tables = fabric.dims * fabric.k
    for i, raw in enumerate(replies[:n_tables]):
        d, k = divmod(i, fabric.k)
        for field, peer in raw.items():
            if field.isdigit():
                a, port = divmod(int(field), fabric.port_stride)
                state.tables.setdefault(fabric.ocs_index(d, a, k), {})[port] = int(peer)
    for d, raw in enumerate(replies[n_tables:]):
        for field, output in raw.items():
            if field.isdigit():
                block, a = divmod(int(field), fabric.axis_stride)
                state.one_to_many[fabric.one_to_many_index(block, d, a)] = int(output)
    return state


def script(body: str, header_at: int) -> str:
    """A script whose fabric header starts at ARGV[header_at]."""
    return f"local H = {header_at}\n" + LUA_HELPERS + body
