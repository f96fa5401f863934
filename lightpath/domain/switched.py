"""SW-1: the fabric of a switched superpod, built once from configuration.

Processor groups (seed 002 ¶32-33 1-D chains of p processors, ¶39 and ¶45 r×c
arrays) sit in a cluster of `cluster_rows` × `cluster_cols` groups. Every
processor is joined to its neighbours by `lanes` parallel links (¶45: three of
a processor's twelve ports face each neighbour); the edge processors' outward
ports go to tier-0 switches:

* row switch ``r{R}/p{k}``: for plane k = i·lanes + lane, the west port of
  processor (i, 0) and the east port of processor (i, c-1) of every group in
  cluster row R (¶41, ¶46, ¶49: 24 groups × 2 = 48 down ports);
* column switch ``c{C}/p{k}`` (2-D groups only): for plane k = j·lanes + lane,
  the north port of (0, j) and the south port of (r-1, j) of every group in
  cluster column C (¶42, ¶51).

A 1-D group has only row switches: its two chain ends (¶33). Tier-0 switches
have `tier0_down_ports` down ports and `tier0_up_ports` up ports (64 = 48 + 16,
3:1 oversubscribed, ¶48, ¶61). Up ports go to tier-1 switches ``t1r/p{k}/{t}``
(``t1c/...`` for column planes), the same number of links to each (¶47, ¶50,
¶52: 2 links to each of 8 tier-1 switches), and optionally straight to the
other tier-0 switches of the plane (`tier0_mesh_links`, Fig. 7). Tier-1 row and
column switches of a plane may be linked (`row_column_links`, ¶54).

Links are full duplex (¶47, ¶50: one link carries uplink and downlink traffic
without congestion): each direction is a *channel* (link·2 for a→b, link·2+1
for b→a) and a ring holds one channel of every link it crosses, so a link can
carry one ring each way.

The topology is static (STYLE.md): a networkx graph of processors and switches
whose edges are bundles of concrete links with their capacity, plus flat
adjacency lists of channels that the ring router walks. Reservation state
lives elsewhere (one byte per channel).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from lightpath.errors import FieldViolation, InvalidArgument

if TYPE_CHECKING:
    import networkx as nx

# Link kinds.
PROCESSOR, DOWN, UP, MESH, CROSS = range(5)
LINK_KIND_NAMES = ("processor", "down", "up", "mesh", "cross")

# Processor port directions; a port is (direction, lane).
WEST, EAST, NORTH, SOUTH = range(4)
DIRECTION_NAMES = "WENS"

ROW, COLUMN = "r", "c"


@dataclass(frozen=True)
class SwitchedFabricConfig:
    """What an operator writes down about a switched superpod (SW-1)."""

    # (p,) for a 1-D chain of p processors, (r, c) for an r×c array.
    group_shape: tuple[int, ...] = (4, 4)
    cluster_rows: int = 1
    cluster_cols: int = 1
    # Switch planes per dimension: processor rows × lanes (¶46: 4 rows × 3 = 12).
    planes: int = 4
    tier0_down_ports: int = 48
    tier0_up_ports: int = 16
    # Tier-1 switches per plane and dimension; 0 = none.
    tier1_switches: int = 0
    tier1_ports: int = 64
    # Links between every pair of tier-0 switches of a plane and dimension (Fig. 7).
    tier0_mesh_links: int = 0
    # Links between tier-1 row switch t and tier-1 column switch t of a plane (¶54).
    row_column_links: int = 0

    @property
    def two_d(self) -> bool:
        return len(self.group_shape) == 2

    @property
    def rows(self) -> int:
        """Processor rows of a group (1 for a chain)."""
        return self.group_shape[0] if self.two_d else 1

    @property
    def cols(self) -> int:
        return self.group_shape[-1]

    @property
    def lanes(self) -> int:
        """Parallel links between neighbouring processors, and ports per processor edge."""
        return self.planes // self.rows

    @property
    def column_planes(self) -> int:
        return self.cols * self.lanes if self.two_d else 0

    @property
    def group_size(self) -> int:
        return self.rows * self.cols

    @property
    def group_count(self) -> int:
        return self.cluster_rows * self.cluster_cols

    @property
    def processor_count(self) -> int:
        return self.group_count * self.group_size

    def uplinks_per_tier1(self, tier0_in_plane: int) -> int:
        mesh = self.tier0_mesh_links * (tier0_in_plane - 1)
        if self.tier1_switches == 0:
            return 0
        return (self.tier0_up_ports - mesh) // self.tier1_switches

    def violations(self) -> list[FieldViolation]:
        """Every rule the configuration breaks, in plain words (X-3)."""
        out: list[FieldViolation] = []
        add = lambda f, rule: out.append(FieldViolation(f, rule))  # noqa: E731
        if len(self.group_shape) not in (1, 2) or any(d < 1 for d in self.group_shape):
            add("group_shape", "must be (p,) or (r, c) with positive sizes")
            return out
        for name in ("cluster_rows", "cluster_cols", "planes"):
            if getattr(self, name) < 1:
                add(name, "must be at least 1")
        for name in (
            "tier0_down_ports",
            "tier0_up_ports",
            "tier1_switches",
            "tier1_ports",
            "tier0_mesh_links",
            "row_column_links",
        ):
            if getattr(self, name) < 0:
                add(name, "must not be negative")
        if out:
            return out
        if self.planes % self.rows:
            add(
                "planes",
                f"must be a multiple of the group's {self.rows} processor rows "
                f"(one plane per processor row and lane), got {self.planes}",
            )
            return out
        need_row = 2 * self.cluster_cols
        if need_row > self.tier0_down_ports:
            add(
                "tier0_down_ports",
                f"tier-0 switch r0/p0 needs {need_row} down ports for the "
                f"{self.cluster_cols} groups of a cluster row (2 each), has {self.tier0_down_ports}",
            )
        if self.two_d and 2 * self.cluster_rows > self.tier0_down_ports:
            add(
                "tier0_down_ports",
                f"tier-0 switch c0/p0 needs {2 * self.cluster_rows} down ports for the "
                f"{self.cluster_rows} groups of a cluster column (2 each), has {self.tier0_down_ports}",
            )
        dims = [("r", self.cluster_rows)] + ([("c", self.cluster_cols)] if self.two_d else [])
        for dim, n in dims:
            mesh = self.tier0_mesh_links * (n - 1)
            if mesh > self.tier0_up_ports:
                add(
                    "tier0_mesh_links",
                    f"tier-0 switch {dim}0/p0 needs {mesh} up ports for mesh links to the "
                    f"other {n - 1} switches of its plane, has {self.tier0_up_ports}",
                )
                continue
            if self.tier1_switches:
                per = self.uplinks_per_tier1(n)
                if per < 1:
                    add(
                        "tier1_switches",
                        f"tier-0 switch {dim}0/p0 has {self.tier0_up_ports - mesh} up ports "
                        f"for tier-1, fewer than the {self.tier1_switches} tier-1 switches",
                    )
                    continue
                rc = self.row_column_links if self.two_d else 0
                used = n * per + rc
                if used > self.tier1_ports:
                    add(
                        "tier1_ports",
                        f"tier-1 switch t1{dim}/p0/0 needs {used} ports ({n} tier-0 switches × "
                        f"{per} links + {rc} row-column links), has {self.tier1_ports}",
                    )
        if self.row_column_links and not (self.two_d and self.tier1_switches):
            add("row_column_links", "needs 2-D groups and tier-1 switches")
        return out

    def validate(self) -> SwitchedFabricConfig:
        bad = self.violations()
        if bad:
            raise InvalidArgument.of(bad, reason="BAD_SWITCHED_FABRIC")
        return self

    def spec(self) -> str:
        """The one-line form operators write (see `parse`)."""
        shape = "x".join(map(str, self.group_shape))
        parts = [
            f"group={shape}",
            f"cluster={self.cluster_rows}x{self.cluster_cols}",
            f"planes={self.planes}",
            f"ports={self.tier0_down_ports}/{self.tier0_up_ports}",
        ]
        if self.tier1_switches:
            parts.append(f"tier1={self.tier1_switches}x{self.tier1_ports}")
        if self.tier0_mesh_links:
            parts.append(f"mesh={self.tier0_mesh_links}")
        if self.row_column_links:
            parts.append(f"rowcol={self.row_column_links}")
        return " ".join(parts)

    @classmethod
    def parse(cls, text: str) -> SwitchedFabricConfig:
        """`group=3x3 cluster=2x2 planes=9 ports=48/16 tier1=2x64 mesh=0 rowcol=0`
        (space or comma separated; group is `p` or `rxc`; tier1 is count x ports).
        Raises InvalidArgument naming the bad key; does not validate sizes."""
        kw: dict[str, object] = {}
        for item in text.replace(",", " ").split():
            key, sep, value = item.partition("=")
            try:
                if not sep:
                    raise ValueError
                if key == "group":
                    kw["group_shape"] = tuple(int(x) for x in value.lower().split("x"))
                elif key == "cluster":
                    r, c = value.lower().split("x")
                    kw["cluster_rows"], kw["cluster_cols"] = int(r), int(c)
                elif key == "planes":
                    kw["planes"] = int(value)
                elif key == "ports":
                    d, u = value.split("/")
                    kw["tier0_down_ports"], kw["tier0_up_ports"] = int(d), int(u)
                elif key == "tier1":
                    n, _, ports = value.lower().partition("x")
                    kw["tier1_switches"] = int(n)
                    if ports:
                        kw["tier1_ports"] = int(ports)
                elif key == "mesh":
                    kw["tier0_mesh_links"] = int(value)
                elif key == "rowcol":
                    kw["row_column_links"] = int(value)
                else:
                    raise InvalidArgument(
                        key or item,
                        "is not one of group, cluster, planes, ports, tier1, mesh, rowcol",
                    )
            except ValueError:
                raise InvalidArgument(
                    key or item,
                    f"cannot read {item!r} (e.g. group=4x4 cluster=24x24 planes=12 "
                    "ports=48/16 tier1=8x64)",
                ) from None
        return cls(**kw)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, object]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["group_shape"] = list(self.group_shape)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> SwitchedFabricConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InvalidArgument(unknown[0], f"is not a switched fabric setting ({sorted(known)})")
        kw = dict(d)
        if "group_shape" in kw:
            shape = kw["group_shape"]
            if not isinstance(shape, list | tuple):
                raise InvalidArgument("group_shape", "must be a list of 1 or 2 sizes")
            kw["group_shape"] = tuple(int(x) for x in shape)
        try:
            return cls(**kw)  # type: ignore[arg-type]
        except TypeError as e:  # pragma: no cover - fields are checked above
            raise InvalidArgument("fabric", str(e)) from e


# Seed 002 ¶46-52, Fig. 14-18: 24x24 groups of 4x4 processors (9,216), 12 planes per
# dimension (4 rows x 3 ports per edge), 64-port tier-0 switches with 48 down / 16 up
# (3:1), 8 tier-1 switches per plane each using 48 of its 64 ports.
FIG18_FABRIC = SwitchedFabricConfig(
    group_shape=(4, 4),
    cluster_rows=24,
    cluster_cols=24,
    planes=12,
    tier0_down_ports=48,
    tier0_up_ports=16,
    tier1_switches=8,
    tier1_ports=64,
)


class SwitchedFabric:
    """The static graph of one switched superpod (SW-1).

    Node ids: processors 0 … P-1 (group g, row i, column j → g·r·c + i·c + j),
    then switches. Links are numbered 0 … L-1; a bundle is the tuple of parallel
    links between two nodes. `graph` is the networkx view (nodes with `kind`,
    edges with `capacity` and `links`); the router uses the flat lists.
    """

    def __init__(self, config: SwitchedFabricConfig):
        self.config = config.validate()
        cfg = config
        self.rows, self.cols, self.lanes = cfg.rows, cfg.cols, cfg.lanes
        self.group_size = cfg.group_size
        self.group_count = cfg.group_count
        self.processor_count = cfg.processor_count
        # switches
        self.switch_names: list[str] = []
        self.switch_tier: list[int] = []
        self.switch_dim: list[str] = []
        self.switch_plane: list[int] = []
        self.switch_index: list[int] = []  # cluster row/column (tier 0) or t (tier 1)
        self._switch_id: dict[str, int] = {}
        # links
        self.link_a: list[int] = []
        self.link_b: list[int] = []
        self.link_kind: list[int] = []
        self.link_port_a: list[int] = []  # processor: dir*lanes+lane; switch: port number
        self.link_port_b: list[int] = []
        # adjacency for the router
        P = self.processor_count
        # channels out of each node, bundled per neighbour
        self.proc_ports: list[list[tuple[int, tuple[int, ...]]]] = [[] for _ in range(P)]
        self.proc_nbrs: list[dict[int, tuple[int, ...]]] = [{} for _ in range(P)]
        self.sw_down: list[dict[int, list[tuple[int, tuple[int, ...]]]]] = []
        self.sw_up: list[list[tuple[int, tuple[int, ...]]]] = []
        self.sw_down_links: list[list[int]] = []
        self.sw_up_links: list[list[int]] = []
        self._sw_next_port: list[int] = []
        self.group_switches: list[list[int]] = [[] for _ in range(self.group_count)]
        self.group_link_base: list[int] = []
        self.links_per_group = 0
        self._build()
        self.link_count = len(self.link_a)
        self.graph = self._networkx()

    # -- construction ---------------------------------------------------------

    def _add_switch(self, name: str, tier: int, dim: str, plane: int, index: int) -> int:
        sid = self.processor_count + len(self.switch_names)
        self.switch_names.append(name)
        self.switch_tier.append(tier)
        self.switch_dim.append(dim)
        self.switch_plane.append(plane)
        self.switch_index.append(index)
        self._switch_id[name] = sid
        self.sw_down.append({})
        self.sw_up.append([])
        self.sw_down_links.append([])
        self.sw_up_links.append([])
        self._sw_next_port.append(self.config.tier0_down_ports if tier == 0 else 0)
        return sid

    def _add_link(self, a: int, b: int, kind: int, pa: int, pb: int) -> int:
        lid = len(self.link_a)
        self.link_a.append(a)
        self.link_b.append(b)
        self.link_kind.append(kind)
        self.link_port_a.append(pa)
        self.link_port_b.append(pb)
        return lid

    def _build(self) -> None:
        cfg = self.config
        R, C, r, c, lanes = cfg.cluster_rows, cfg.cluster_cols, self.rows, self.cols, self.lanes
        row_sw = {
            (cr, k): self._add_switch(f"r{cr}/p{k}", 0, ROW, k, cr)
            for cr in range(R)
            for k in range(cfg.planes)
        }
        col_sw = (
            {
                (cc, k): self._add_switch(f"c{cc}/p{k}", 0, COLUMN, k, cc)
                for cc in range(C)
                for k in range(cfg.column_planes)
            }
            if cfg.two_d
            else {}
        )
        for g in range(self.group_count):
            cr, cc = divmod(g, C)
            base = g * r * c
            self.group_link_base.append(len(self.link_a))
            # processor-processor links (lanes each)
            for i in range(r):
                for j in range(c):
                    u = base + i * c + j
                    if j + 1 < c:
                        self._link_procs(u, u + 1, EAST, WEST)
                    if cfg.two_d and i + 1 < r:
                        self._link_procs(u, u + c, SOUTH, NORTH)
            # edge ports to tier-0 switches
            touched: list[int] = []
            for i in range(r):
                for lane in range(lanes):
                    s = row_sw[(cr, i * lanes + lane)]
                    self._link_port(base + i * c, WEST, lane, s, 2 * cc, g)
                    self._link_port(base + i * c + c - 1, EAST, lane, s, 2 * cc + 1, g)
                    touched.append(s)
            if cfg.two_d:
                for j in range(c):
                    for lane in range(lanes):
                        s = col_sw[(cc, j * lanes + lane)]
                        self._link_port(base + j, NORTH, lane, s, 2 * cr, g)
                        self._link_port(base + (r - 1) * c + j, SOUTH, lane, s, 2 * cr + 1, g)
                        touched.append(s)
            self.group_switches[g] = list(dict.fromkeys(touched))
        # every group's links (inside it and to its switches) are numbered
        # contiguously and alike: its channels are one slice of the state
        self.links_per_group = (len(self.link_a) // self.group_count) if self.group_count else 0
        # up links
        dims: list[tuple[str, int, int, dict[tuple[int, int], int]]] = [
            (ROW, R, cfg.planes, row_sw)
        ]
        if cfg.two_d:
            dims.append((COLUMN, C, cfg.column_planes, col_sw))
        tier1: dict[tuple[str, int, int], int] = {}
        for dim, n, planes, sw in dims:
            per_t1 = cfg.uplinks_per_tier1(n)
            for k in range(planes):
                for x in range(n):
                    for y in range(x + 1, n):
                        for _ in range(cfg.tier0_mesh_links):
                            self._link_switches(sw[(x, k)], sw[(y, k)], MESH)
                for t in range(cfg.tier1_switches):
                    t1 = self._add_switch(f"t1{dim}/p{k}/{t}", 1, dim, k, t)
                    tier1[(dim, k, t)] = t1
                    for x in range(n):
                        for _ in range(per_t1):
                            self._link_switches(sw[(x, k)], t1, UP)
        if cfg.two_d and cfg.row_column_links:
            for k in range(min(cfg.planes, cfg.column_planes)):
                for t in range(cfg.tier1_switches):
                    for _ in range(cfg.row_column_links):
                        self._link_switches(tier1[(ROW, k, t)], tier1[(COLUMN, k, t)], CROSS)

    def _link_procs(self, u: int, v: int, du: int, dv: int) -> None:
        links = [
            self._add_link(u, v, PROCESSOR, du * self.lanes + lane, dv * self.lanes + lane)
            for lane in range(self.lanes)
        ]
        self.proc_nbrs[u][v] = tuple(2 * link for link in links)
        self.proc_nbrs[v][u] = tuple(2 * link + 1 for link in links)

    def _link_port(self, proc: int, direction: int, lane: int, sw: int, port: int, g: int) -> None:
        lid = self._add_link(proc, sw, DOWN, direction * self.lanes + lane, port)
        si = sw - self.processor_count
        self.sw_down_links[si].append(lid)
        # a 1-wide chain has both ends on one processor: merge into one bundle
        _add_to_bundle(self.proc_ports[proc], sw, 2 * lid)
        _add_to_bundle(self.sw_down[si].setdefault(g, []), proc, 2 * lid + 1)

    def _link_switches(self, a: int, b: int, kind: int) -> None:
        ia, ib = a - self.processor_count, b - self.processor_count
        lid = self._add_link(a, b, kind, self._sw_next_port[ia], self._sw_next_port[ib])
        self._sw_next_port[ia] += 1
        self._sw_next_port[ib] += 1
        self.sw_up_links[ia].append(lid)
        self.sw_up_links[ib].append(lid)
        _add_to_bundle(self.sw_up[ia], b, 2 * lid)
        _add_to_bundle(self.sw_up[ib], a, 2 * lid + 1)

    def _networkx(self) -> nx.Graph:
        # Imported here: only a switched pod's processes build this graph, and networkx
        # costs every other process that imports the domain ~0.2 CPU-s at start.
        import networkx as nx

        g = nx.Graph()
        cfg = self.config
        g.add_nodes_from(
            (p, {"kind": "processor", "group": p // self.group_size, "name": self.node_name(p)})
            for p in range(self.processor_count)
        )
        g.add_nodes_from(
            (
                self.processor_count + i,
                {
                    "kind": f"tier{self.switch_tier[i]}",
                    "name": name,
                    "ports": (cfg.tier0_down_ports + cfg.tier0_up_ports)
                    if self.switch_tier[i] == 0
                    else cfg.tier1_ports,
                },
            )
            for i, name in enumerate(self.switch_names)
        )
        bundles: dict[tuple[int, int], list[int]] = {}
        for lid in range(self.link_count):
            a, b = self.link_a[lid], self.link_b[lid]
            bundles.setdefault((min(a, b), max(a, b)), []).append(lid)
        g.add_edges_from(
            (
                a,
                b,
                {
                    "links": tuple(ls),
                    "capacity": len(ls),
                    "kind": LINK_KIND_NAMES[self.link_kind[ls[0]]],
                },
            )
            for (a, b), ls in bundles.items()
        )
        return g

    # -- names ----------------------------------------------------------------

    def group_position(self, g: int) -> tuple[int, int]:
        """(cluster row, cluster column) of group g."""
        return divmod(g, self.config.cluster_cols)

    def group_name(self, g: int) -> str:
        cr, cc = self.group_position(g)
        return f"g{cr}.{cc}"

    def group_id(self, name: str) -> int:
        """Inverse of group_name; raises KeyError."""
        try:
            cr, cc = (int(x) for x in name.removeprefix("g").split("."))
        except ValueError:
            raise KeyError(name) from None
        if not (
            name.startswith("g")
            and 0 <= cr < self.config.cluster_rows
            and 0 <= cc < self.config.cluster_cols
        ):
            raise KeyError(name)
        return cr * self.config.cluster_cols + cc

    def processor(self, g: int, i: int, j: int) -> int:
        return g * self.group_size + i * self.cols + j

    def processor_position(self, p: int) -> tuple[int, int, int]:
        """(group, row, column) of processor p."""
        g, k = divmod(p, self.group_size)
        i, j = divmod(k, self.cols)
        return g, i, j

    def node_name(self, node: int) -> str:
        if node >= self.processor_count:
            return self.switch_names[node - self.processor_count]
        g, i, j = self.processor_position(node)
        if not self.config.two_d:
            return f"{self.group_name(g)}/pr{j + 1}"
        if self.rows < 10 and self.cols < 10:
            return f"{self.group_name(g)}/pr{i + 1}{j + 1}"
        return f"{self.group_name(g)}/pr{i + 1}.{j + 1}"

    def tier0_switch(self, dim: str, index: int, plane: int) -> int:
        """Node id of tier-0 switch r{index}/p{plane} (dim ROW) or c{index}/p{plane}."""
        cfg = self.config
        if dim == ROW:
            return self.processor_count + index * cfg.planes + plane
        return (
            self.processor_count + cfg.cluster_rows * cfg.planes + index * cfg.column_planes + plane
        )

    def switch_id(self, name: str) -> int:
        return self._switch_id[name]

    @property
    def switch_count(self) -> int:
        return len(self.switch_names)

    def switches(self) -> Iterator[int]:
        return iter(range(self.processor_count, self.processor_count + self.switch_count))

    def is_switch(self, node: int) -> bool:
        return node >= self.processor_count

    def tier(self, switch: int) -> int:
        return self.switch_tier[switch - self.processor_count]

    def port_name(self, lid: int, end: int) -> str:
        node = self.link_a[lid] if end == 0 else self.link_b[lid]
        port = self.link_port_a[lid] if end == 0 else self.link_port_b[lid]
        if node < self.processor_count:
            d, lane = divmod(port, self.lanes)
            return f"{self.node_name(node)}:{DIRECTION_NAMES[d]}{lane}"
        return f"{self.node_name(node)}#{port}"

    @property
    def channel_count(self) -> int:
        return 2 * self.link_count

    def channel_ends(self, channel: int) -> tuple[int, int]:
        """(from node, to node) of a channel."""
        lid = channel >> 1
        a, b = self.link_a[lid], self.link_b[lid]
        return (b, a) if channel & 1 else (a, b)

    def channel_name(self, channel: int) -> str:
        lid, back = channel >> 1, channel & 1
        return f"{self.port_name(lid, back)} -> {self.port_name(lid, 1 - back)}"

    # -- relations ------------------------------------------------------------

    def share_tier0(self, g1: int, g2: int) -> bool:
        """True when the two groups hang off one tier-0 switch (same cluster row or column)."""
        (r1, c1), (r2, c2) = self.group_position(g1), self.group_position(g2)
        return r1 == r2 or (self.config.two_d and c1 == c2)

    def uplinks(self, switch: int) -> list[int]:
        """Links from a switch towards tier 1 or other switches."""
        return self.sw_up_links[switch - self.processor_count]

    def up_channels(self, switch: int) -> list[int]:
        """The channels leaving `switch` upwards (towards tier 1 / other tier-0 switches)."""
        return [2 * link + (self.link_a[link] != switch) for link in self.uplinks(switch)]

    def downlinks(self, switch: int) -> list[int]:
        return self.sw_down_links[switch - self.processor_count]

    def describe(self) -> dict[str, int]:
        """Derived sizes, for GetInfo / the CLI."""
        return {
            "groups": self.group_count,
            "processors": self.processor_count,
            "tier0_switches": sum(1 for t in self.switch_tier if t == 0),
            "tier1_switches": sum(1 for t in self.switch_tier if t == 1),
            "links": self.link_count,
            "lanes": self.lanes,
        }


def _add_to_bundle(adj: list[tuple[int, tuple[int, ...]]], node: int, channel: int) -> None:
    for n, (v, bundle) in enumerate(adj):
        if v == node:
            adj[n] = (v, (*bundle, channel))
            return
    adj.append((node, (channel,)))


@functools.lru_cache(maxsize=8)
def build_fabric(config: SwitchedFabricConfig) -> SwitchedFabric:
    """The fabric for a configuration, built once per process (it is static)."""
    return SwitchedFabric(config)
