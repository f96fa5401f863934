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
from importlib import resources

from lightpath.domain.torus import Fabric, dim_name
from lightpath_services.ocs_manager.invariants import FabricState
from lightpath_services.ocs_manager.wiring import FabricChange, Link


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


def device_script(name: str) -> str:
    """The default driver's script device_<name>.lua, after device.lua and tables.lua."""
    files = ("device.lua", "tables.lua", f"device_{name}.lua")
    return "".join(resources.files(__package__).joinpath(f).read_text() for f in files)


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
