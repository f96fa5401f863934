"""The broker's search before the capacity-over-time index (services/lightpath_services/core_broker/
capacity.py up to issue 15), kept as the oracle the new search must agree with.

`LegacySchedule` is the old allocation table (device, start, end, cores rows)
with the old `_peak` sweep and the old `earliest_start`: an O(n log n) exact
check for each candidate end that a bound over the summed schedule admits.
`brute_earliest_start` drops that bound and checks every candidate exactly.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

_TIME_BITS = 42
_DEV_SHIFT = _TIME_BITS + 1


class LegacySchedule:
    def __init__(self, cores: Iterable[int], rows: Iterable[tuple[int, int, int, int]]):
        """`cores` per device index; rows (device index, start, end, cores)."""
        self.cores = np.array(list(cores), np.int64)
        rows = list(rows)
        self.dev = np.array([r[0] for r in rows], np.int64)
        self.start = np.array([r[1] for r in rows], np.int64)
        self.end = np.array([r[2] for r in rows], np.int64)
        self.held = np.array([r[3] for r in rows], np.int64)

    def peak(self, start: int, end: int, rows: np.ndarray | None = None) -> np.ndarray:
        ndev = self.cores.shape[0]
        if rows is None:
            s, e, dev, c = self.start, self.end, self.dev, self.held
        else:
            s, e, dev, c = self.start[rows], self.end[rows], self.dev[rows], self.held[rows]
        at_start = (s <= start) & (e > start)
        used = np.bincount(dev[at_start], weights=c[at_start], minlength=ndev).astype(np.int64)
        starts = np.flatnonzero((s > start) & (s < end))
        if starts.size == 0:
            return used
        ends = np.flatnonzero((e > start) & (e < end))
        ev_dev = np.concatenate((dev[ends], dev[starts]))
        keys = np.concatenate(
            (
                (dev[ends] << _DEV_SHIFT) | ((e[ends] - start) << 1),
                (dev[starts] << _DEV_SHIFT) | ((s[starts] - start) << 1) | 1,
            )
        )
        delta = np.concatenate((-c[ends], c[starts]))
        order = np.argsort(keys)
        ev_dev = ev_dev[order]
        running = np.cumsum(delta[order])
        first = np.flatnonzero(np.concatenate(([True], ev_dev[1:] != ev_dev[:-1])))
        base = np.repeat(
            running[first] - delta[order][first], np.diff(np.append(first, ev_dev.size))
        )
        level = used[ev_dev] + running - base
        np.maximum.at(used, ev_dev, level)
        return used

    def earliest_start(
        self, need: int, duration: int, after: int, last_start: int | None, devices: np.ndarray
    ) -> tuple[int, np.ndarray] | None:
        rows = np.flatnonzero((self.end > after) & devices[self.dev])
        if rows.size == 0:
            return None
        s, e, c = self.start[rows], self.end[rows], self.held[rows]
        cands = np.unique(e if last_start is None else e[e <= last_start])
        if cands.size == 0:
            return None
        total = int(self.cores[devices].sum())
        keys = np.concatenate((e << 1, (s << 1) | 1))
        order = np.argsort(keys)
        keys = keys[order]
        used = np.cumsum(np.concatenate((-c, c))[order])
        lo = np.searchsorted(keys, (cands << 1) | 1, side="right") - 1
        hi = np.searchsorted(keys, (cands + duration) << 1, side="left")
        peak = _range_max(used, lo, hi)
        for i in np.flatnonzero(total - peak >= need).tolist():
            t = int(cands[i])
            free = np.where(
                devices, np.maximum(self.cores - self.peak(t, t + duration, rows), 0), 0
            )
            if int(free.sum()) >= need:
                return t, free
        return None

    def brute_earliest_start(
        self, need: int, duration: int, after: int, last_start: int | None, devices: np.ndarray
    ) -> tuple[int, np.ndarray] | None:
        """Every candidate end checked exactly, in order (no bound)."""
        m = (self.end > after) & devices[self.dev]
        if last_start is not None:
            m &= self.end <= last_start
        for t in np.unique(self.end[m]).tolist():
            free = np.where(devices, np.maximum(self.cores - self.peak(t, t + duration), 0), 0)
            if int(free.sum()) >= need:
                return t, free
        return None


def _range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    hi = np.maximum(hi, lo + 1)
    width = hi - lo
    levels = [values]
    span = 1
    while span * 2 <= int(width.max()):
        prev = levels[-1]
        levels.append(np.maximum(prev[:-span], prev[span:]))
        span *= 2
    k = np.floor(np.log2(width)).astype(np.int64)
    out = np.empty(lo.shape[0], values.dtype)
    for level in np.unique(k).tolist():
        sel = k == level
        table = levels[level]
        out[sel] = np.maximum(table[lo[sel]], table[hi[sel] - (1 << level)])
    return out
