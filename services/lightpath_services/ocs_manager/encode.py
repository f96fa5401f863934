"""Protobuf wire format for the big repeated fields of a wiring answer (the hot path).

A full-pod slice answers 3,072 CrossConnect messages (and with K >= 2 as many
OneToManySetting); building them one Python object at a time took most of a
WireSlice. Instead the bytes of every repeated entry are joined from pieces
cached per fabric (an OCS id, a segment reference) and merged into the response
with `MergeFromString`, which upb parses in C. Proto3 field order does not
matter to a parser and the response is re-serialized canonically anyway.
"""

from __future__ import annotations

from collections.abc import Iterable

from lightpath.domain.torus import FIRST, SECOND, Fabric
from lightpath.limits import varint as _varint
from lightpath_services.ocs_manager.wiring import Link, link_ports, one_to_many_settings

_SMALL = [_varint(i) for i in range(4096)]


def varint(n: int) -> bytes:
    return _SMALL[n] if n < 4096 else _varint(n)


def field_varint(number: int, value: int) -> bytes:
    """A proto3 scalar field (omitted when 0, as proto3 does)."""
    return varint(number << 3) + varint(value) if value else b""


def field_bytes(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


class WiringEncoder:
    """Encodes CrossConnect / OneToManySetting entries of one fabric, with cached pieces."""

    def __init__(self, fabric: Fabric):
        self.fabric = fabric
        ids = [oid.encode() for oid in fabric.ocs_ids]
        self._ocs_f1 = [field_bytes(1, i) for i in ids]  # CrossConnect.ocs_id
        self._ocs_f4 = [field_bytes(4, i) for i in ids]  # OneToManySetting.ocs_id
        self._seg: dict[tuple[int, int, int, int, int], bytes] = {}
        self._switch: dict[tuple[int, int, int], bytes] = {}

    def _segment(self, field: int, block: int, dim: int, axis: int, end: int) -> bytes:
        key = (field, block, dim, axis, end)
        got = self._seg.get(key)
        if got is None:
            body = (
                field_varint(1, block)
                + field_varint(2, dim)
                + field_varint(3, axis)
                + field_varint(4, end)
            )
            got = self._seg[key] = field_bytes(field, body)
        return got

    def _switch_id(self, block: int, dim: int, axis: int) -> bytes:
        key = (block, dim, axis)
        got = self._switch.get(key)
        if got is None:
            sid = self.fabric.one_to_many_id(block, dim, axis).encode()
            got = self._switch[key] = field_bytes(1, sid)
        return got

    def cross_connects(self, field: int, wiring: Iterable[Link], job: str) -> bytes:
        """Repeated CrossConnect entries (field number `field` of the parent) for `wiring`."""
        f = self.fabric
        tag = varint(field << 3 | 2)
        job_f = field_bytes(6, job.encode()) if job else b""
        seg, ocs_f = self._segment, self._ocs_f1
        out: list[bytes] = []
        for lk in wiring:
            k, pa, pb = link_ports(f, lk)
            tail = field_varint(2, pa) + field_varint(3, pb) + job_f
            d, src, dst = lk.dim, lk.src, lk.dst
            base = f.axis_offset[d]
            for a in range(f.axes[d]):
                body = (
                    ocs_f[(base + a) * f.k + k]
                    + seg(4, src, d, a, SECOND)
                    + seg(5, dst, d, a, FIRST)
                    + tail
                )
                out.append(tag + varint(len(body)) + body)
        return b"".join(out)

    def one_to_many(self, field: int, wiring: Iterable[Link], job: str) -> bytes:
        """Repeated OneToManySetting entries: every 1xK switch `wiring` sets (K >= 2)."""
        f = self.fabric
        tag = varint(field << 3 | 2)
        job_f = field_bytes(5, job.encode()) if job else b""
        out: list[bytes] = []
        for g in one_to_many_settings(f, wiring):
            assert g.after is not None
            tail = field_varint(3, g.after) + job_f
            base = f.axis_offset[g.dim]
            for a in range(f.axes[g.dim]):
                body = (
                    self._switch_id(g.block, g.dim, a)
                    + self._segment(2, g.block, g.dim, a, SECOND)
                    + self._ocs_f4[(base + a) * f.k + g.after]
                    + tail
                )
                out.append(tag + varint(len(body)) + body)
        return b"".join(out)
