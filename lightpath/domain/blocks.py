"""The static side of a superpod as the workload scheduler sees it (seed 000 ¶47-48, ¶107).

The block count, block shape and K (OCS per logical axis) come from the pod's
ocs_manager (GetFabric): one source of truth for the optics. The node type of
each building block is the scheduler's own setting, LIGHTPATH_BLOCK_TYPES:

    "tpu"              every block is a tpu block
    "tpu:60,gpu:4"     blocks 0-59 are tpu, 60-63 gpu (¶47: 60 TPU blocks + 4 others)
    "tpu:60,gpu"       the last entry without a count takes the remaining blocks

Blocks are numbered 0..N-1 (¶107) and the types are laid out in that order.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from lightpath.domain.switched import SwitchedFabric
from lightpath.errors import FailedPrecondition

_TYPE_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
TYPE_NAME_RULE = "a node type is 1-32 characters of a-z 0-9 _ - starting with a letter"


@dataclass(frozen=True)
class BlockTypeEntry:
    node_type: str
    count: int | None  # None: every block not named by another entry


def parse_block_types(raw: str) -> tuple[BlockTypeEntry, ...]:
    """Parse LIGHTPATH_BLOCK_TYPES; ValueError names the rule a bad value breaks."""
    entries: list[BlockTypeEntry] = []
    seen: set[str] = set()
    parts = [p.strip() for p in raw.split(",")]
    if not raw.strip() or any(not p for p in parts):
        raise ValueError('must be a comma-separated list like "tpu" or "tpu:60,gpu:4"')
    for i, part in enumerate(parts):
        name, sep, count_raw = part.partition(":")
        name = name.strip()
        if not _TYPE_NAME.match(name):
            raise ValueError(f"{name!r}: {TYPE_NAME_RULE}")
        if name in seen:
            raise ValueError(f"node type {name!r} is listed twice")
        seen.add(name)
        if not sep:
            if i != len(parts) - 1:
                raise ValueError(
                    f"only the last entry may omit its count ({name!r} takes the remaining blocks)"
                )
            entries.append(BlockTypeEntry(name, None))
            continue
        if not count_raw.strip().isdigit() or int(count_raw) < 1:
            raise ValueError(f"the count of {name!r} must be an integer >= 1")
        entries.append(BlockTypeEntry(name, int(count_raw)))
    return tuple(entries)


def host_shape_error(host_shape: Sequence[int], block_shape: Sequence[int]) -> str | None:
    """Why hosts of `host_shape` cannot tile blocks of `block_shape`, or None."""
    if len(host_shape) != len(block_shape):
        return f"has {len(host_shape)} extents; the blocks have {len(block_shape)}"
    if any(h < 1 or b % h for h, b in zip(host_shape, block_shape, strict=True)):
        return (
            "every extent must divide the block's "
            f"({'x'.join(map(str, block_shape))}): the hosts tile the block"
        )
    return None


def block_types_for(entries: Sequence[BlockTypeEntry], block_count: int) -> tuple[str, ...]:
    """The node type of each block 0..block_count-1; FailedPrecondition when the counts do not fit."""
    named = sum(e.count or 0 for e in entries)
    rest = block_count - named
    has_rest = any(e.count is None for e in entries)
    spec = ",".join(e.node_type + (f":{e.count}" if e.count else "") for e in entries)
    if rest < 0 or (rest > 0 and not has_rest) or (rest == 0 and has_rest):
        raise FailedPrecondition(
            f"LIGHTPATH_BLOCK_TYPES={spec}",
            f"names {named} blocks{' plus the rest' if has_rest else ''}, but the fabric of the "
            f"ocs_manager has {block_count} blocks",
            reason="BLOCK_TYPES_MISMATCH",
        )
    types: list[str] = []
    for e in entries:
        types.extend([e.node_type] * (e.count if e.count is not None else rest))
    return tuple(types)


@dataclass(frozen=True)
class PodFabric:
    """What placement needs to know about the pod: static for the life of a process."""

    pod_id: str
    block_shape: tuple[int, ...]  # chips per block along each dimension (4, 4, 4)
    node_types: tuple[str, ...]  # per block id
    ocs_per_axis: int = 1  # K
    # With K >= 2, the index (0..K-1) of the OCS that each block's first ends land on
    # (WS-3: spread a slice over them so fewer ports are contended). All 0 when K = 1.
    first_end_group: tuple[int, ...] = ()
    # SWITCHED pods (seed 002): blocks are the processor groups of this fabric, and
    # these groups are reserved for small jobs (SW-2).
    switched: SwitchedFabric | None = field(default=None, compare=False, repr=False)
    small_groups: frozenset[int] = frozenset()
    # The chips of one host (issue 28: hosts are reported failed one by one); the
    # block's hosts tile it, row-major with x fastest. Empty: one host per block.
    host_shape: tuple[int, ...] = ()
    _type_counts: Counter[str] = field(default_factory=Counter, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.first_end_group:
            object.__setattr__(self, "first_end_group", (0,) * len(self.node_types))
        if not self.host_shape:
            object.__setattr__(self, "host_shape", tuple(self.block_shape))
        self._type_counts.update(self.node_types)

    @property
    def kind(self) -> str:
        """The fabric kind (common.proto FabricKind without its prefix)."""
        return "OCS_TORUS" if self.switched is None else "SWITCHED"

    @property
    def block_count(self) -> int:
        return len(self.node_types)

    @property
    def dims(self) -> int:
        return len(self.block_shape)

    @property
    def chips_per_block(self) -> int:
        return math.prod(self.block_shape)

    @property
    def host_grid(self) -> tuple[int, ...]:
        """Hosts per block along each dimension (4x4x4 blocks of 2x2x1 hosts: 2x2x4)."""
        return tuple(b // h for b, h in zip(self.block_shape, self.host_shape, strict=True))

    @property
    def hosts_per_block(self) -> int:
        return math.prod(self.host_grid)

    @property
    def chips_per_host(self) -> int:
        return math.prod(self.host_shape)

    @functools.cached_property
    def chip_hosts(self) -> dict[tuple[int, ...], int]:
        """Each chip of a block (its coordinates in the block) -> its host (`host_of`),
        computed once: placement's counts and GetPod's free chips read it for every block
        with a failed host or a sub-block slice."""
        return {
            chip: self.host_of(chip)
            for chip in itertools.product(*(range(n) for n in self.block_shape))
        }

    def host_of(self, chip: Sequence[int]) -> int:
        """The host (index, row-major x fastest) of a chip given by its coordinates in its block."""
        index, stride = 0, 1
        for c, h, g in zip(chip, self.host_shape, self.host_grid, strict=True):
            index += (c // h) * stride
            stride *= g
        return index

    @property
    def type_counts(self) -> Counter[str]:
        """Blocks of each node type in the pod."""
        return self._type_counts

    @property
    def primary_type(self) -> str:
        """The node type a request that names none gets: the first in LIGHTPATH_BLOCK_TYPES."""
        return self.node_types[0]

    def describe(self) -> str:
        shape = "x".join(map(str, self.block_shape))
        kinds = ", ".join(f"{n} {t}" for t, n in self.type_counts.items())
        if self.switched is not None:
            return (
                f"SWITCHED: {self.block_count} groups of {shape} processors ({kinds}), "
                f"{len(self.small_groups)} reserved for small jobs; {self.switched.config.spec()}"
            )
        return f"{self.block_count} blocks of {shape} chips ({kinds}), K={self.ocs_per_axis}"
