"""SW-6: what the fabric manager answers about a switched pod — link use per
switch, free uplinks, each ring's path — as pure functions of the static
fabric and the reserved channels."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lightpath.domain.switched import SwitchedFabric
from lightpath.domain.switched_rings import Ring

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class SwitchLinkUse:
    """One switch's links. A link is in use when a ring holds either of its
    channels; `down` links face processors (tier 0) or tier-0 switches (tier 1),
    `up` links face tier 1 or other switches of the same tier."""

    switch: str
    tier: int
    dim: str
    plane: int
    index: int
    down_links: int
    down_in_use: int
    up_links: int
    up_in_use: int
    # uplinks with the channel away from this switch free / towards it free
    up_out_free: int
    up_in_free: int

    @property
    def free_uplinks(self) -> int:
        """Uplinks with both channels free."""
        return self.up_links - self.up_in_use


class SwitchIndex:
    """Per-switch link and channel arrays, built once per fabric (static)."""

    def __init__(self, fabric: SwitchedFabric):
        # numpy is imported on first use, not with the module: only a switched pod's
        # manager builds an index, and every ocs_manager imports this one (issue 31)
        import numpy as np

        self.fabric = fabric
        P = fabric.processor_count
        self._down: list[np.ndarray] = []
        self._up: list[np.ndarray] = []
        self._up_out: list[np.ndarray] = []
        for s in fabric.switches():
            tier = fabric.tier(s)
            down, up = list(fabric.downlinks(s)), []
            for link in fabric.uplinks(s):
                other = fabric.link_b[link] if fabric.link_a[link] == s else fabric.link_a[link]
                if tier == 1 and other >= P and fabric.tier(other) == 0:
                    down.append(link)
                else:
                    up.append(link)
            self._down.append(np.array(down, dtype=np.int64))
            self._up.append(np.array(up, dtype=np.int64))
            self._up_out.append(
                np.array([2 * link + (fabric.link_a[link] != s) for link in up], dtype=np.int64)
            )

    def use(
        self, used: bytes | bytearray, switches: Iterable[int] | None = None
    ) -> list[SwitchLinkUse]:
        import numpy as np

        fab = self.fabric
        P = fab.processor_count
        arr = np.frombuffer(bytes(used), dtype=np.uint8)
        if len(arr) < fab.channel_count:
            arr = np.concatenate([arr, np.zeros(fab.channel_count - len(arr), np.uint8)])
        link_busy = arr[0::2] | arr[1::2]
        out = []
        for s in fab.switches() if switches is None else switches:
            i = s - P
            down, up, up_out = self._down[i], self._up[i], self._up_out[i]
            up_in = up_out ^ 1
            out.append(
                SwitchLinkUse(
                    switch=fab.switch_names[i],
                    tier=fab.switch_tier[i],
                    dim=fab.switch_dim[i],
                    plane=fab.switch_plane[i],
                    index=fab.switch_index[i],
                    down_links=len(down),
                    down_in_use=int(link_busy[down].sum()),
                    up_links=len(up),
                    up_in_use=int(link_busy[up].sum()),
                    up_out_free=int(len(up) - arr[up_out].sum()),
                    up_in_free=int(len(up) - arr[up_in].sum()),
                )
            )
        return out


@dataclass(frozen=True)
class HopPath:
    """A hop for people: node names, and each channel as "port -> port"."""

    nodes: tuple[str, ...]
    channels: tuple[str, ...]
    channel_ids: tuple[int, ...]


def ring_path(fabric: SwitchedFabric, ring: Ring) -> list[HopPath]:
    return [
        HopPath(
            tuple(fabric.node_name(n) for n in hop.nodes),
            tuple(fabric.channel_name(c) for c in hop.channels),
            hop.channels,
        )
        for hop in ring.hops
    ]
