"""Compact encoding of a FabricChange for Lua, and the Lua that expands it.

Shared by the store (the manager's committed tables) and the default switch
driver (the simulated switches' own state): both keep one Redis hash per OCS
(port -> peer port) and one hash per block for its 1xK switches
("<dim>.<axis>" -> output).

A full-pod slice is 3,072 cross-connects but only 192 links, and a link has the
same two ports on every logical axis of its dimension, so a script receives
links ("d k port_a port_b" numbers) and expands them over the axes itself:
a few kB of arguments instead of tens of thousands.

KEYS of a script using this: its own fixed keys, then the table of every OCS
of the fabric in OCS-index order starting at KEYS[tables_base], then the 1xK
hashes of the blocks the change names, in the order `otm_blocks` gives.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.ocs_manager.fabric import Fabric
from services.ocs_manager.wiring import FabricChange, Link, link_ports


@dataclass(frozen=True)
class EncodedChange:
    """ARGV strings: `disconnect` / `connect` "d k pa pb ...", `otm` "keyslot d before after ..."
    (-1 = idle; keyslot is the 0-based position of the block in `otm_blocks`)."""

    disconnect: str
    connect: str
    otm: str
    otm_blocks: tuple[int, ...]


def _links(fabric: Fabric, group: tuple[Link, ...]) -> str:
    parts: list[str] = []
    for lk in group:
        k, pa, pb = link_ports(fabric, lk)
        parts.append(f"{lk.dim} {k} {pa} {pb}")
    return " ".join(parts)


def encode_change(fabric: Fabric, change: FabricChange) -> EncodedChange:
    blocks = tuple(sorted({g.block for g in change.one_to_many}))
    slot = {b: i for i, b in enumerate(blocks)}
    otm = " ".join(
        f"{slot[g.block]} {g.dim} {-1 if g.before is None else g.before} "
        f"{-1 if g.after is None else g.after}"
        for g in change.one_to_many
    )
    return EncodedChange(
        _links(fabric, change.disconnect), _links(fabric, change.connect), otm, blocks
    )


def fabric_header(fabric: Fabric) -> tuple[str, str, str]:
    """(K, axes per dim, axis offsets) as Lua reads them."""
    return (
        str(fabric.k),
        " ".join(map(str, fabric.axes)),
        " ".join(map(str, fabric.axis_offset)),
    )


# Lua helpers prepended to the scripts that apply changes.
#   nums(s)                         -> array of the integers in s
#   per_table(flat, base, K, axes, off) -> {key index -> {pa, pb, pa, pb, ...}} expanding
#                                      "d k pa pb" links over every axis of d
#   apply_otm(flat, otm_base, axes, on_bad) -> sets / clears 1xK fields; returns count
LUA_HELPERS = r"""
local function nums(s)
  local t = {}
  for n in string.gmatch(s, '-?%d+') do t[#t + 1] = tonumber(n) end
  return t
end

local function per_table(flat, base, K, axes, off)
  local per = {}
  for i = 1, #flat, 4 do
    local d, k, pa, pb = flat[i], flat[i + 1], flat[i + 2], flat[i + 3]
    for a = 0, axes[d + 1] - 1 do
      local idx = base + (off[d + 1] + a) * K + k
      local t = per[idx]
      if not t then t = {}; per[idx] = t end
      t[#t + 1] = pa
      t[#t + 1] = pb
    end
  end
  return per
end

local function otm_fields(d, n)
  local f = {}
  for a = 0, n - 1 do f[#f + 1] = d .. '.' .. a end
  return f
end
"""
