"""How routing tables and 1xK states sit in Redis, and the Lua that changes them.

Shared by the store (the manager's committed state, `lp:{pod}:ocs:...`) and the
default switch driver (the simulated switches' own state, `lp:{pod}:dev:...`).

Layout. A change is made of links (wiring.py): a link cross-connects the same
two ports on the OCS of EVERY logical axis of its dimension, and sets the 1xK
switches of every axis of its block alike. So the OCS of one (dimension, k)
always hold the same table, whatever the axis, and the 1xK switches of one
(block, dimension) the same output; the layout stores each once:

* one hash per (dimension, k), `xc2:<dim>:<k>`: field port -> peer port (both
  directions), the routing table of each of that dimension's OCS with that k
  (ocs-<dim>-<axis>-<k> for every axis); a dark port has no field;
* one hash per dimension, `otm2:<dim>`: field block -> the output every 1xK
  switch of that block along that dimension is set to; idle: no field.

A full 1,024-block pod is then 6,144 fields written and checked per change, not
the 98,304 of one field per OCS and port, which would cost Redis ~1 µs each in Lua.

Why each hash holds a `layout` field longer than 64 bytes: Redis keeps a small
hash (up to 512 fields of up to 64 bytes) as a ziplist, where every HSET / HMGET
scans the list — a few 2-block slices on a ziplist table doubled Redis' CPU per
wire. The long value makes every table a hash table from its creation, and keeps
the key when the last cross-connect goes.

Arguments. A change travels as links ("d k port_a port_b") and 1xK groups
("d block before after", -1 = idle).
"""

from __future__ import annotations

from dataclasses import dataclass

from lightpath.domain.torus import Fabric, dim_name
from services.ocs_manager.invariants import FabricState
from services.ocs_manager.wiring import FabricChange, Link


def table_keys(fabric: Fabric, prefix: str) -> list[str]:
    """The (dim, k) table hashes in the order scripts index them: d * K + k."""
    return [f"{prefix}:xc2:{dim_name(d)}:{k}" for d in range(fabric.dims) for k in range(fabric.k)]


def otm_keys(fabric: Fabric, prefix: str) -> list[str]:
    """The per-dimension 1xK hashes (index d)."""
    return [f"{prefix}:otm2:{dim_name(d)}" for d in range(fabric.dims)]


@dataclass(frozen=True)
class EncodedChange:
    """ARGV strings: `disconnect` / `connect` "d k pa pb ...", `otm` "d block before after ..."."""

    disconnect: str
    connect: str
    otm: str


def _links(fabric: Fabric, group: tuple[Link, ...]) -> str:
    # link_ports, inlined: a full 1,024-block pod is 3,072 links, encoded for the driver
    # and again for the commit
    big_k, first_ends = fabric.k, fabric.first_ends
    parts: list[str] = []
    for lk in group:
        k = lk.dst % big_k
        parts.append(f"{lk.dim} {k} {first_ends[k] + lk.src} {lk.dst // big_k}")
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

-- links "d k pa pb" -> {key index -> {f = fields, p = peers}} (both directions, as the
-- argument's own decimal strings); `touched` collects d * K + k of every link (all the
-- OCS of d's axes with that k).
local function expand(s, base, touched)
  local g = {}
  local w = words(s)
  for i = 1, #w, 4 do
    local d, k, pa, pb = tonumber(w[i]), tonumber(w[i + 1]), w[i + 2], w[i + 3]
    local idx = base + d * K + k
    local t = g[idx]
    if not t then t = {f = {}, p = {}, d = d, k = k}; g[idx] = t end
    local f, p = t.f, t.p
    local n = #f
    f[n + 1] = pa; p[n + 1] = pb
    f[n + 2] = pb; p[n + 2] = pa
    if touched then touched[d * K + k] = true end
  end
  return g
end

-- where a table field is, for messages: "port 17 of ocs-x-{0..15}-0"
local function port_of(t, field)
  return 'port ' .. field .. ' of ocs-' .. names[t.d + 1] .. '-{0..' .. (axes[t.d + 1] - 1) ..
    '}-' .. t.k
end

-- 1xK groups "d block before after" -> {key index -> {f, before, after, d}} (-1 = idle)
local function expand_otm(s, base)
  local g = {}
  local w = nums(s)
  for i = 1, #w, 4 do
    local d = w[i]
    local idx = base + d
    local t = g[idx]
    if not t then t = {f = {}, before = {}, after = {}, d = d}; g[idx] = t end
    local n = #t.f + 1
    t.f[n] = w[i + 1]; t.before[n] = w[i + 2]; t.after[n] = w[i + 3]
  end
  return g
end

local CHUNK = 3000  -- stay well under Lua's unpack limit
local function hmget(key, f)
  if #f == 0 then return {} end
  if #f <= CHUNK then return redis.call('HMGET', key, unpack(f)) end
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
    redis.call('HSET', KEYS[i], 'layout', 'routing tables of every axis: field port -> ' ..
      'peer port, both directions; a dark port has no field')
  end
  if K > 1 then
    for d = 0, M - 1 do
      redis.call('HSET', KEYS[otm_base + d], 'layout', '1xK switches of every axis: field ' ..
        'block -> output they are set to; an idle switch has no field')
    end
  end
end
"""


def read_layout(fabric: Fabric, replies: list[dict[str, str]]) -> FabricState:
    """HGETALL of table_keys + otm_keys (in that order) -> the state they hold, per OCS / switch."""
    state = FabricState()
    n_tables = fabric.dims * fabric.k
    for i, raw in enumerate(replies[:n_tables]):
        d, k = divmod(i, fabric.k)
        table = {int(port): int(peer) for port, peer in raw.items() if port.isdigit()}
        for a in range(fabric.axes[d]):
            if table:
                state.tables[fabric.ocs_index(d, a, k)] = dict(table)
    for d, raw in enumerate(replies[n_tables:]):
        for field, output in raw.items():
            if field.isdigit():
                block = int(field)
                for a in range(fabric.axes[d]):
                    state.one_to_many[fabric.one_to_many_index(block, d, a)] = int(output)
    return state


def script(body: str, header_at: int) -> str:
    """A script whose fabric header starts at ARGV[header_at]."""
    return f"local H = {header_at}\n" + LUA_HELPERS + body
