"""The switches of a pod's optical fabric as its southbound sees them (issue 20, OCS-8).

Pure: no I/O. protos/lightpath/v1/optical_switch.proto addresses a switch by id
and knows two kinds: an OCS (`ocs-<dim>-<axis>-<k>`, ports 0..radix-1, the same
numbering as the port map in torus.py) and a bank of 1xK switches. The 1xK
switches of one building block (one per (dim, logical axis), K >= 2 only) form
the bank `otm-<block>`; input i of the bank is the switch of the (dim, axis)
whose flat axis index `axis_offset[dim] + axis` is i, so
`Fabric.one_to_many_index(block, d, a) == block * total_axes + input`.

An agent serving a pod's switches and the ocs_manager's agent driver derive the
same devices from the same fabric configuration.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Literal

from lightpath.domain.torus import Fabric

OCS: Literal["OCS"] = "OCS"
ONE_TO_K: Literal["ONE_TO_K"] = "ONE_TO_K"


@dataclass(frozen=True, slots=True)
class SouthboundDevice:
    """One switch of the southbound: an OCS or a block's bank of 1xK switches."""

    id: str
    kind: Literal["OCS", "ONE_TO_K"]
    ports: int  # OCS: radix; bank: inputs (the block's logical axes, all dimensions)
    outputs: int  # bank: K; OCS: 0
    index: int  # OCS index in the fabric, or the bank's block


def bank_id(block: int) -> str:
    return f"otm-{block}"


def devices(fabric: Fabric) -> tuple[SouthboundDevice, ...]:
    """Every switch of the fabric: its OCS by index, then (K >= 2) a 1xK bank per block."""
    out = [
        SouthboundDevice(oid, OCS, fabric.config.ocs_radix, 0, i)
        for i, oid in enumerate(fabric.ocs_ids)
    ]
    if fabric.k > 1:
        out += [
            SouthboundDevice(bank_id(b), ONE_TO_K, fabric.total_axes, fabric.k, b)
            for b in range(fabric.block_count)
        ]
    return tuple(out)


def select(
    all_devices: tuple[SouthboundDevice, ...], patterns: str
) -> tuple[SouthboundDevice, ...]:
    """The devices whose id matches one of the comma-separated globs of `patterns`
    (`*`, `ocs-x-*`, `otm-*`, `ocs-x-0-0,ocs-y-3-1`)."""
    globs = [p.strip() for p in patterns.split(",") if p.strip()]
    return tuple(d for d in all_devices if any(fnmatch.fnmatchcase(d.id, g) for g in globs))


def parse_endpoint_map(raw: str) -> tuple[tuple[str, str], ...]:
    """`host:port` (every switch) or `glob=host:port,glob=host:port` (first match wins)
    -> ((glob, address), ...). ValueError naming the rule."""
    out: list[tuple[str, str]] = []
    for item in (p.strip() for p in raw.split(",")):
        if not item:
            continue
        glob, sep, address = item.rpartition("=")
        if not sep:
            glob, address = "*", item
        host, colon, port = address.rpartition(":")
        if not glob or not colon or not host or not port.isdigit():
            raise ValueError(
                f"{item!r}: give host:port for every switch, or glob=host:port entries "
                "separated by commas (e.g. ocs-x-*=10.0.0.5:50063,*=10.0.0.6:50063)"
            )
        out.append((glob, address))
    return tuple(out)
