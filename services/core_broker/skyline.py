"""The capacity-over-time index of the broker (CB-1, CB-4, CB-9): each device's
reserved cores as a step function of time (its "skyline"), kept incrementally.

Per device the index holds the breakpoints of the step function, sorted, with
the level (cores reserved) from each breakpoint to the next, a sparse table of
range maxima over those levels, and for each breakpoint the next one at which
some allocation ends. Adding or removing an allocation touches one device's
row: O(m log m) for the m breakpoints of that device, independent of the
other devices' reservations. Every query asks about a set of devices at once,
vectorised over them:

* `peak(devices, a, b)` — the most cores reserved at any instant of [a, b)
  on each device: two binary searches and a range maximum, O(k log m) for k
  devices;
* `next_end(devices, t)` — the first instant after t at which an allocation
  on one of the devices ends (O(k log m)).

Rows of similar length live together in one 2-D block (`_Bucket`, widths a
power of two), so a device with many more reservations than the others does
not widen every row. A row's keys carry the row number in their high bits, so
each block flattened is one sorted array and one `np.searchsorted` finds a
time on every row at once.

Times are integer milliseconds; intervals are half-open [start, end). A key
packs a time relative to `_ORIGIN` into the low `_TBITS` bits; a breakpoint
must lie strictly inside that range (about year 1900 to 2180 in ms since the
epoch, or small test times), queries are clipped to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_TBITS = 43
_TMAX = (1 << _TBITS) - 1  # key of the padding after a row's last breakpoint
_TMASK = _TMAX
_ORIGIN = -(1 << 41)
MIN_TIME = _ORIGIN + 2
MAX_TIME = _ORIGIN + _TMAX - 2
MAX_ROWS = 1 << (63 - _TBITS)
_MIN_WIDTH = 16


def _tk(t: int) -> int:
    if not MIN_TIME <= t <= MAX_TIME:
        raise ValueError(f"time {t} lies outside the schedule's range")
    return t - _ORIGIN


def _clip(t: np.ndarray | int) -> np.ndarray:
    """Query times as key offsets, clipped into (sentinel, padding)."""
    return np.clip(np.asarray(t, np.int64) - _ORIGIN, 1, _TMAX - 1)


class _Bucket:
    """Rows of `width` columns: column 0 is a sentinel at -inf with level 0,
    then the breakpoints, then padding (key `_TMAX`). A row always keeps one
    padding column, so a search never runs off its row."""

    def __init__(self, width: int):
        self.w = width
        self.levels = width.bit_length()  # sparse table spans 1, 2, ..., <= width
        self.cap = 0
        self.key = np.zeros((0, width), np.int64)
        self.sp = np.zeros((self.levels, 0, width), np.int64)
        self.nend = np.zeros((0, width), np.int32)
        self.nref = np.zeros((0, width), np.int32)
        self.nxt = np.zeros((0, width), np.int64)
        self.cnt = np.zeros(0, np.int64)
        self.spare: list[int] = []
        self.used = 0
        self._views()

    def _views(self) -> None:
        self.keyflat = self.key.reshape(-1)
        self.spflat = self.sp.reshape(-1)
        self.nxtflat = self.nxt.reshape(-1)
        self.plane = self.cap * self.w  # offset of one sparse level in spflat

    def copy(self) -> _Bucket:
        b = _Bucket.__new__(_Bucket)
        b.w, b.levels, b.cap, b.used = self.w, self.levels, self.cap, self.used
        b.key, b.sp, b.nend = self.key.copy(), self.sp.copy(), self.nend.copy()
        b.nref, b.nxt, b.cnt = self.nref.copy(), self.nxt.copy(), self.cnt.copy()
        b.spare = list(self.spare)
        b._views()
        return b

    def alloc(self) -> int:
        if self.spare:
            r = self.spare.pop()
        else:
            if self.used == self.cap:
                self._grow(max(16, self.cap * 2))
            r = self.used
            self.used += 1
        self._clear(r)
        return r

    def free(self, r: int) -> None:
        self._clear(r)
        self.spare.append(r)

    def _grow(self, cap: int) -> None:
        if cap > MAX_ROWS:
            raise ValueError(f"at most {MAX_ROWS} devices")
        old = self.cap

        def grown(a: np.ndarray, axis: int) -> np.ndarray:
            shape = list(a.shape)
            shape[axis] = cap
            out = np.zeros(shape, a.dtype)
            if axis == 0:
                out[:old] = a
            else:
                out[:, :old] = a
            return out

        self.key = grown(self.key, 0)
        self.sp = grown(self.sp, 1)
        self.nend = grown(self.nend, 0)
        self.nref = grown(self.nref, 0)
        self.nxt = grown(self.nxt, 0)
        self.cnt = np.concatenate((self.cnt, np.zeros(cap - old, np.int64)))
        self.cap = cap
        for r in range(old, cap):
            self.key[r] = (r << _TBITS) | _TMAX
        self._views()

    def _clear(self, r: int) -> None:
        self.key[r] = (r << _TBITS) | _TMAX
        self.key[r, 0] = r << _TBITS
        self.sp[:, r] = 0
        self.nend[r] = 0
        self.nref[r] = 0
        self.nxt[r] = self.w - 1
        self.cnt[r] = 1

    # -- one row ---------------------------------------------------------------

    def find(self, r: int, tk: int) -> int:
        """Column of the breakpoint at key offset `tk` (which must exist)."""
        n = int(self.cnt[r])
        j = int(np.searchsorted(self.key[r, :n], (r << _TBITS) | tk))
        assert j < n and int(self.key[r, j]) & _TMASK == tk, "no such breakpoint"
        return j

    def insert(self, r: int, tk: int, end: bool) -> int:
        """Count one start (or end) at `tk`, adding the breakpoint if new; its column."""
        n = int(self.cnt[r])
        k = (r << _TBITS) | tk
        row = self.key[r]
        j = int(np.searchsorted(row[:n], k))
        if j >= n or int(row[j]) != k:
            assert n + 1 < self.w, "row full"
            row[j + 1 : n + 1] = row[j:n]
            row[j] = k
            lv = self.sp[0, r]
            lv[j + 1 : n + 1] = lv[j:n]
            lv[j] = lv[j - 1]
            for a in (self.nend[r], self.nref[r]):
                a[j + 1 : n + 1] = a[j:n]
                a[j] = 0
            self.cnt[r] = n + 1
        self.nref[r, j] += 1
        if end:
            self.nend[r, j] += 1
        return j

    def release(self, r: int, j: int, end: bool) -> None:
        """Uncount one start (or end) at column j, dropping the breakpoint when unused."""
        self.nref[r, j] -= 1
        if end:
            self.nend[r, j] -= 1
        if self.nref[r, j] > 0:
            return
        n = int(self.cnt[r])
        row = self.key[r]
        row[j : n - 1] = row[j + 1 : n]
        row[n - 1] = (r << _TBITS) | _TMAX
        lv = self.sp[0, r]
        lv[j : n - 1] = lv[j + 1 : n]
        lv[n - 1] = 0
        for a in (self.nend[r], self.nref[r]):
            a[j : n - 1] = a[j + 1 : n]
            a[n - 1] = 0
        self.cnt[r] = n - 1

    def rebuild(self, r: int) -> None:
        """The row's sparse table of maxima and its next-end pointers."""
        w = self.w
        sp = self.sp
        span = 1
        for lvl in range(1, self.levels):
            prev, cur = sp[lvl - 1, r], sp[lvl, r]
            cur[: w - span] = np.maximum(prev[: w - span], prev[span:])
            cur[w - span :] = prev[w - span :]
            span *= 2
        idx = np.where(self.nend[r] > 0, np.arange(w), w - 1)
        self.nxt[r] = np.minimum.accumulate(idx[::-1])[::-1]

    def load_row(self, r: int, tks: np.ndarray, levels: np.ndarray, nend, nref) -> None:
        n = tks.shape[0]
        self._clear(r)
        self.key[r, 1 : n + 1] = (r << _TBITS) | tks
        self.sp[0, r, 1 : n + 1] = levels
        self.nend[r, 1 : n + 1] = nend
        self.nref[r, 1 : n + 1] = nref
        self.cnt[r] = n + 1
        self.rebuild(r)

    def row_data(self, r: int):
        n = int(self.cnt[r])
        return (
            self.key[r, 1:n] & _TMASK,
            self.sp[0, r, 1:n].copy(),
            self.nend[r, 1:n].copy(),
            self.nref[r, 1:n].copy(),
        )

    # -- many rows at once ------------------------------------------------------

    def peak(self, rows: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Most cores reserved at any instant of [a, b) on each row (a < b after clipping,
        or both clipped alike: then the level there)."""
        base = rows << _TBITS
        lo = np.searchsorted(self.keyflat, base | _clip(a), side="right") - 1
        hi = np.searchsorted(self.keyflat, base | _clip(b), side="left")
        hi = np.maximum(hi, lo + 1)
        k = _LOG2[hi - lo]
        off = k * self.plane
        return np.maximum(self.spflat[off + lo], self.spflat[off + hi - (1 << k)])

    def next_end(self, rows: np.ndarray, t: int) -> np.ndarray:
        """Key offset of the first end after `t` on each row (`_TMAX` where none)."""
        pos = np.searchsorted(self.keyflat, (rows << _TBITS) | _clip(t), side="right")
        start = rows * self.w
        col = self.nxtflat[pos]
        return self.keyflat[start + col] & _TMASK


_LOG2 = np.zeros(2, np.int64)


def _log2_table(width: int) -> None:
    global _LOG2
    if _LOG2.shape[0] > width:
        return
    n = np.arange(width + 1)
    n[0] = 1
    _LOG2 = np.floor(np.log2(n)).astype(np.int64)


@dataclass
class Group:
    """The devices of one query that live in one bucket."""

    bucket: _Bucket
    pos: np.ndarray  # positions in the query's device array
    rows: np.ndarray


class Skyline:
    """Every device's reserved cores over time (see the module docstring)."""

    def __init__(self) -> None:
        self.buckets: dict[int, _Bucket] = {}
        self.bucket_of = np.zeros(0, np.int64)  # width of each device's bucket
        self.row_of = np.zeros(0, np.int64)

    def copy(self) -> Skyline:
        s = Skyline.__new__(Skyline)
        s.buckets = {w: b.copy() for w, b in self.buckets.items()}
        s.bucket_of = self.bucket_of.copy()
        s.row_of = self.row_of.copy()
        return s

    @property
    def devices(self) -> int:
        return int(self.bucket_of.shape[0])

    def _bucket(self, width: int) -> _Bucket:
        b = self.buckets.get(width)
        if b is None:
            b = self.buckets[width] = _Bucket(width)
            _log2_table(width)
        return b

    def add_device(self, device: int) -> None:
        """Make room for device index `device` (indices are dense, from 0)."""
        while self.bucket_of.shape[0] <= device:
            b = self._bucket(_MIN_WIDTH)
            self.bucket_of = np.append(self.bucket_of, _MIN_WIDTH)
            self.row_of = np.append(self.row_of, b.alloc())

    # -- changes ------------------------------------------------------------------

    def add(self, device: int, start: int, end: int, cores: int) -> None:
        ks, ke = _tk(start), _tk(end)
        b, r = self._room(device)
        js = b.insert(r, ks, end=False)
        je = b.insert(r, ke, end=True)
        b.sp[0, r, js:je] += cores
        b.rebuild(r)

    def remove(self, device: int, start: int, end: int, cores: int) -> None:
        ks, ke = _tk(start), _tk(end)
        b = self.buckets[int(self.bucket_of[device])]
        r = int(self.row_of[device])
        js, je = b.find(r, ks), b.find(r, ke)
        b.sp[0, r, js:je] -= cores
        b.release(r, je, end=True)
        b.release(r, js, end=False)
        b.rebuild(r)

    def _room(self, device: int) -> tuple[_Bucket, int]:
        """The device's bucket and row, moved to a wider bucket if two more
        breakpoints might not fit."""
        w = int(self.bucket_of[device])
        b = self.buckets[w]
        r = int(self.row_of[device])
        if int(b.cnt[r]) + 2 < w:
            return b, r
        data = b.row_data(r)
        b.free(r)
        nb = self._bucket(w * 2)
        nr = nb.alloc()
        nb.load_row(nr, *data)
        self.bucket_of[device] = w * 2
        self.row_of[device] = nr
        return nb, nr

    # -- queries ------------------------------------------------------------------

    def groups(self, devices: np.ndarray) -> list[Group]:
        """`devices` (device indices) split by bucket, for the queries below."""
        widths = self.bucket_of[devices]
        if devices.shape[0] == 0:
            return []
        first = int(widths[0])
        if (widths == first).all():
            return [Group(self.buckets[first], np.arange(devices.shape[0]), self.row_of[devices])]
        out = []
        for w in np.unique(widths).tolist():
            pos = np.flatnonzero(widths == w)
            out.append(Group(self.buckets[w], pos, self.row_of[devices[pos]]))
        return out

    @staticmethod
    def peak(groups: list[Group], n: int, a, b) -> np.ndarray:
        """Most cores reserved during [a, b) on each of the n devices of `groups`
        (a and b scalars, or arrays of n)."""
        out = np.empty(n, np.int64)
        va, vb = np.broadcast_to(a, (n,)), np.broadcast_to(b, (n,))
        for g in groups:
            out[g.pos] = g.bucket.peak(g.rows, va[g.pos], vb[g.pos])
        return out

    @staticmethod
    def next_end(groups: list[Group], t: int) -> int | None:
        """The first instant after `t` at which an allocation on one of the devices ends."""
        best = _TMAX
        for g in groups:
            best = min(best, int(g.bucket.next_end(g.rows, t).min()))
        return None if best >= _TMAX else best + _ORIGIN

    def breakpoints(self, device: int) -> int:
        """Breakpoints of a device's step function (for tests and sizing)."""
        b = self.buckets[int(self.bucket_of[device])]
        return int(b.cnt[int(self.row_of[device])]) - 1


def earliest_start(
    sky: Skyline,
    cores: np.ndarray,
    devices: np.ndarray,
    need: int,
    duration: int,
    after: int,
    last_start: int | None,
) -> tuple[int, np.ndarray] | None:
    """Earliest end time t of an allocation on `devices` with after < t <= last_start
    at which the devices have `need` cores free, in all, for [t, t + duration);
    with the free cores of each of `devices` (in their order) then.

    Free cores over [t, t + duration) grow only when t passes an allocation's
    end, so the candidates are those ends, visited in order. Between two
    exact checks the search skips a block (c, c + L] of candidates whenever
    even the window every one of them shares, [c + L, c + duration + 1), leaves
    too few cores free (an upper bound for each device); the block doubles
    while that holds (up to the duration) and halves when it does not. Each
    step is a handful of vectorised O(k log m) queries over the k devices.
    """
    n = devices.shape[0]
    if n == 0:
        return None
    groups = sky.groups(devices)
    twice = sky.groups(np.concatenate((devices, devices)))
    caps = cores[devices]
    block = 1
    t = after
    while True:
        c = Skyline.next_end(groups, t)
        if c is None or (last_start is not None and c > last_start):
            return None
        room = duration if last_start is None else min(duration, last_start - c)
        step = min(block, room)
        if step >= 1:
            # the exact window at c and the window shared by (c, c + step], in one query
            both = Skyline.peak(
                twice,
                2 * n,
                np.repeat(np.array([c, c + step], np.int64), n),
                np.repeat(np.array([c + duration, c + duration + 1], np.int64), n),
            )
            free = np.maximum(caps - both[:n], 0)
            if int(free.sum()) >= need:
                return c, free
            bound = int(np.maximum(caps - both[n:], 0).sum())
        else:
            free = np.maximum(caps - Skyline.peak(groups, n, c, c + duration), 0)
            if int(free.sum()) >= need:
                return c, free
            return None  # c is the last start allowed
        if bound < need:
            t = c + step
            block = min(block * 2, max(duration, 1))
        else:
            t = c
            block = max(1, block // 2)
