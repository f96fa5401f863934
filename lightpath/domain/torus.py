"""The optical fabric of one superpod, built from configuration (OCS-1).

Pure: no I/O. A `Fabric` is the static topology (Kueue's "static tree"): which
OCS exist, which port of which OCS each segment end is cabled to. Everything
that changes (cross-connects, 1xK settings, slices) is state on top of it.

Seed 000 ¶89-94, ¶133-139, ¶159-163. Along dimension d a building block has
one segment per logical axis a (the row-major index of the segment's
coordinates in the other dimensions, x fastest). For every (d, a) there are K
OCS:

* K = 1 (Fig. 8/9): both ends of block b's (d, a) segment go to the one OCS of
  (d, a): 2 ports per block, 128 for 64 blocks (¶134).
* K >= 2 (Fig. 12): the first ends are split evenly over the K OCS (block b's
  first end lands on OCS k = b mod K: blocks 1211/1213 on 1271, 1212/1214 on
  1272); each second end goes to the input of its own 1xK switch whose output
  i reaches OCS i (¶161-163). 4 blocks, K = 2: 6 ports used per OCS, not 8.

Port numbering on OCS (d, a, k), 0-based and the same for every axis a:

* first end of block b (b mod K == k)  -> port b // K          (ports 0 .. F_k-1)
* second end of block b (1xK output k) -> port F_k + b         (ports F_k .. F_k+N-1)

where F_k = number of blocks whose first end lands on OCS k. With K = 1 that is
"first ends on 0..N-1, second ends on N..2N-1". An OCS needs F_0 + N ports
(the busiest one); a radix below that is refused with the number needed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from lightpath.errors import FieldViolation, InvalidArgument

DIM_NAMES = ("x", "y", "z")
MAX_DIMS = 6
FIRST: Literal[1] = 1  # SegmentEnd.SEGMENT_END_FIRST
SECOND: Literal[2] = 2  # SegmentEnd.SEGMENT_END_SECOND


def dim_name(d: int) -> str:
    """x, y, z, then d3, d4, ... (OCS and 1xK switch ids use these)."""
    return DIM_NAMES[d] if d < len(DIM_NAMES) else f"d{d}"


def parse_shape(raw: str) -> tuple[int, ...]:
    """`4x4x4` -> (4, 4, 4); every extent >= 1, 1..6 dimensions."""
    parts = raw.strip().lower().replace("×", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError("must look like 4x4x4 (extents >= 1 joined by x)") from None
    if not 1 <= len(dims) <= MAX_DIMS or any(d < 1 for d in dims):
        raise ValueError(f"must have 1..{MAX_DIMS} extents, each >= 1, like 4x4x4")
    return dims


def format_shape(dims: tuple[int, ...] | list[int]) -> str:
    return "x".join(str(d) for d in dims)


@dataclass(frozen=True)
class FabricConfig:
    """What an operator configures (OCS-1): block shape, block count, K, radix."""

    block_shape: tuple[int, ...]
    block_count: int
    ocs_per_axis: int = 1
    ocs_radix: int = 136

    def to_json(self) -> str:
        """Canonical form, persisted per pod and compared on every change."""
        return json.dumps(
            {
                "block_shape": list(self.block_shape),
                "block_count": self.block_count,
                "ocs_per_axis": self.ocs_per_axis,
                "ocs_radix": self.ocs_radix,
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, raw: str) -> FabricConfig:
        d = json.loads(raw)
        return cls(tuple(d["block_shape"]), d["block_count"], d["ocs_per_axis"], d["ocs_radix"])

    def describe(self) -> str:
        return (
            f"{format_shape(self.block_shape)} blocks × {self.block_count}, "
            f"K={self.ocs_per_axis}, radix {self.ocs_radix}"
        )


def ports_needed(block_count: int, ocs_per_axis: int) -> int:
    """Ports on the busiest OCS: its first ends (ceil(N/K)) plus one per block's second end."""
    return math.ceil(block_count / ocs_per_axis) + block_count


# Bounds far above any real superpod, so a typo cannot make the service allocate without end.
MAX_BLOCKS = 65536
MAX_CHIPS_PER_BLOCK = 65536
MAX_OCS_PER_AXIS = 64
MAX_RADIX = 1_000_000


def validate_config(config: FabricConfig, prefix: str = "") -> None:
    """Refuse an impossible fabric (OCS-1), every broken rule at once, naming the need."""
    bad: list[FieldViolation] = []
    shape = config.block_shape
    if not 1 <= len(shape) <= MAX_DIMS:
        bad.append(FieldViolation(f"{prefix}block_shape", f"must have 1..{MAX_DIMS} dimensions"))
    elif any(e < 1 for e in shape):
        bad.append(FieldViolation(f"{prefix}block_shape", "every extent must be >= 1"))
    elif math.prod(shape) > MAX_CHIPS_PER_BLOCK:
        bad.append(
            FieldViolation(f"{prefix}block_shape", f"at most {MAX_CHIPS_PER_BLOCK} chips per block")
        )
    if not 1 <= config.block_count <= MAX_BLOCKS:
        bad.append(FieldViolation(f"{prefix}block_count", f"must be 1..{MAX_BLOCKS}"))
    if not 1 <= config.ocs_per_axis <= MAX_OCS_PER_AXIS:
        bad.append(FieldViolation(f"{prefix}ocs_per_axis", f"K must be 1..{MAX_OCS_PER_AXIS}"))
    if config.ocs_radix > MAX_RADIX:
        bad.append(FieldViolation(f"{prefix}ocs_radix", f"must be <= {MAX_RADIX}"))
    elif 1 <= config.block_count <= MAX_BLOCKS and config.ocs_per_axis > config.block_count:
        bad.append(
            FieldViolation(
                f"{prefix}ocs_per_axis",
                f"K={config.ocs_per_axis} exceeds the {config.block_count} blocks: "
                "some OCS would get no first end",
            )
        )
    if not bad:
        need = ports_needed(config.block_count, config.ocs_per_axis)
        if config.ocs_radix < need:
            k = config.ocs_per_axis
            first = math.ceil(config.block_count / k)
            how = (
                f"{config.block_count} first ends + {config.block_count} second ends"
                if k == 1
                else f"{first} first ends + {config.block_count} outputs of 1x{k} switches"
            )
            bad.append(
                FieldViolation(
                    f"{prefix}ocs_radix",
                    f"{config.ocs_radix} ports are too few: {config.block_count} blocks with "
                    f"K={k} need {need} ports per OCS ({how})",
                )
            )
    if bad:
        raise InvalidArgument.of(bad, reason="FABRIC_IMPOSSIBLE")


@dataclass(frozen=True)
class PortMapEntry:
    """Where one segment end is cabled (OCS-1, ¶109)."""

    block: int
    dim: int
    axis: int
    end: int  # FIRST or SECOND
    ports: tuple[tuple[int, int], ...]  # (OCS index, port); K of them for a second end behind a 1xK
    one_to_many: int | None  # 1xK switch index, None when cabled straight


_OCS_ID = re.compile(r"^ocs-([a-z][0-9]*)-([0-9]{1,9})-([0-9]{1,9})\Z")
_OTM_ID = re.compile(r"^otm-([0-9]{1,9})-([a-z][0-9]*)-([0-9]{1,9})\Z")


@dataclass(frozen=True)
class Fabric:
    """The static port map of one pod (OCS-1). Build with `Fabric.build(config)`.

    OCS are numbered densely: index = (axis_offset[d] + a) * K + k. 1xK switches
    (K >= 2) likewise: index = block * total_axes + axis_offset[d] + a.
    """

    config: FabricConfig
    axes: tuple[int, ...] = field(init=False)  # logical axes per dimension
    axis_offset: tuple[int, ...] = field(init=False)
    first_ends: tuple[int, ...] = field(init=False)  # F_k per k

    @classmethod
    def build(cls, config: FabricConfig) -> Fabric:
        validate_config(config)
        return cls(config)

    def __post_init__(self) -> None:
        shape = self.config.block_shape
        total = math.prod(shape)
        axes = tuple(total // e for e in shape)
        offsets = tuple(sum(axes[:d]) for d in range(len(axes)))
        n, k = self.config.block_count, self.config.ocs_per_axis
        object.__setattr__(self, "axes", axes)
        object.__setattr__(self, "axis_offset", offsets)
        object.__setattr__(self, "first_ends", tuple((n - i + k - 1) // k for i in range(k)))

    # -- sizes -----------------------------------------------------------------

    @property
    def dims(self) -> int:
        return len(self.config.block_shape)

    @property
    def block_count(self) -> int:
        return self.config.block_count

    @property
    def k(self) -> int:
        return self.config.ocs_per_axis

    @property
    def total_axes(self) -> int:
        return sum(self.axes)

    @property
    def ocs_count(self) -> int:
        return self.total_axes * self.k

    @property
    def one_to_many_count(self) -> int:
        return self.block_count * self.total_axes if self.k > 1 else 0

    def ports_cabled(self, k: int) -> int:
        """Ports of OCS k (of any axis) with a fibre: its first ends plus N 1xK outputs / second ends."""
        return self.first_ends[k] + self.block_count

    @property
    def max_ports_used_per_ocs(self) -> int:
        return max(self.ports_cabled(k) for k in range(self.k))

    # -- the port arithmetic (OCS-1) --------------------------------------------

    def first_ocs(self, block: int) -> int:
        """k of the OCS a block's first ends land on (¶161-162: split evenly)."""
        return block % self.k

    def first_port(self, block: int) -> int:
        return block // self.k

    def second_port(self, block: int, k: int) -> int:
        """Port on OCS k reached by block's second end (through 1xK output k when K >= 2)."""
        return self.first_ends[k] + block

    def ocs_index(self, dim: int, axis: int, k: int) -> int:
        return (self.axis_offset[dim] + axis) * self.k + k

    def ocs_of_index(self, index: int) -> tuple[int, int, int]:
        """index -> (dim, axis, k)."""
        flat, k = divmod(index, self.k)
        for d in range(self.dims - 1, -1, -1):
            if flat >= self.axis_offset[d]:
                return d, flat - self.axis_offset[d], k
        raise IndexError(index)

    def segment_at(self, k: int, port: int) -> tuple[int, int] | None:
        """(block, end) cabled to `port` of an OCS with index k, or None if the port is dark."""
        if 0 <= port < self.first_ends[k]:
            return port * self.k + k, FIRST
        block = port - self.first_ends[k]
        if self.first_ends[k] <= port and block < self.block_count:
            return block, SECOND
        return None

    def one_to_many_index(self, block: int, dim: int, axis: int) -> int:
        return block * self.total_axes + self.axis_offset[dim] + axis

    def one_to_many_of_index(self, index: int) -> tuple[int, int, int]:
        """index -> (block, dim, axis)."""
        block, flat = divmod(index, self.total_axes)
        for d in range(self.dims - 1, -1, -1):
            if flat >= self.axis_offset[d]:
                return block, d, flat - self.axis_offset[d]
        raise IndexError(index)

    # -- storage layout -------------------------------------------------------------

    @cached_property
    def port_stride(self) -> int:
        """Layout 1's tables (lua.py; read only to move them to layout 2) grouped all axes of
        one (dim, k): field = axis * port_stride + port, "5017" = axis 5, port 17 (radix 136)."""
        return 10 ** len(str(max(self.config.ocs_radix - 1, 1)))

    @cached_property
    def axis_stride(self) -> int:
        """Layout 1's 1xK states (read only to move them): field = block * axis_stride + axis."""
        return 10 ** len(str(max(max(self.axes) - 1, 1)))

    # -- names -------------------------------------------------------------------

    @cached_property
    def ocs_ids(self) -> tuple[str, ...]:
        """ "ocs-<dim>-<axis>-<k>" by OCS index (e.g. "ocs-x-5-0")."""
        return tuple(
            f"ocs-{dim_name(d)}-{a}-{k}"
            for d in range(self.dims)
            for a in range(self.axes[d])
            for k in range(self.k)
        )

    @cached_property
    def _ocs_by_id(self) -> dict[str, int]:
        return {oid: i for i, oid in enumerate(self.ocs_ids)}

    def parse_ocs_id(self, ocs_id: str) -> int | None:
        """OCS index of `ocs_id`, or None when this fabric has no such OCS."""
        return self._ocs_by_id.get(ocs_id)

    def one_to_many_id(self, block: int, dim: int, axis: int) -> str:
        """ "otm-<block>-<dim>-<axis>" (e.g. "otm-7-x-5")."""
        return f"otm-{block}-{dim_name(dim)}-{axis}"

    def parse_one_to_many_id(self, switch_id: str) -> tuple[int, int, int] | None:
        m = _OTM_ID.match(switch_id)
        if not m or self.k == 1:
            return None
        block, name, axis = int(m.group(1)), m.group(2), int(m.group(3))
        names = [dim_name(d) for d in range(self.dims)]
        if name not in names or block >= self.block_count:
            return None
        d = names.index(name)
        return (block, d, axis) if axis < self.axes[d] else None

    def segment_coords(self, dim: int, axis: int) -> tuple[int, ...]:
        """Chip coordinates (in the other dimensions, x fastest) of logical axis `axis` of `dim`."""
        out = []
        rest = axis
        for e, extent in enumerate(self.config.block_shape):
            if e == dim:
                continue
            rest, c = divmod(rest, extent)
            out.append(c)
        return tuple(out)

    # -- the port map (OCS-7) ----------------------------------------------------------

    def port_map_entry(self, block: int, dim: int, axis: int, end: int) -> PortMapEntry:
        if end == FIRST:
            k = self.first_ocs(block)
            return PortMapEntry(
                block,
                dim,
                axis,
                end,
                ((self.ocs_index(dim, axis, k), self.first_port(block)),),
                None,
            )
        ports = tuple(
            (self.ocs_index(dim, axis, k), self.second_port(block, k)) for k in range(self.k)
        )
        otm = self.one_to_many_index(block, dim, axis) if self.k > 1 else None
        return PortMapEntry(block, dim, axis, end, ports, otm)

    def port_map(
        self, block: int | None = None, dim: int | None = None, ocs: int | None = None
    ) -> Iterator[PortMapEntry]:
        """Every (block, dim, axis, end) -> port(s), optionally filtered; deterministic order."""
        only_dim, only_axis, only_k = (
            self.ocs_of_index(ocs) if ocs is not None else (None, None, None)
        )
        blocks = range(self.block_count) if block is None else (block,)
        dims = range(self.dims) if dim is None else (dim,)
        for b in blocks:
            for d in dims:
                if only_dim is not None and d != only_dim:
                    continue
                axes = range(self.axes[d]) if only_axis is None else (only_axis,)
                for a in axes:
                    for end in (FIRST, SECOND):
                        if end == FIRST and only_k is not None and self.first_ocs(b) != only_k:
                            continue
                        yield self.port_map_entry(b, d, a, end)
