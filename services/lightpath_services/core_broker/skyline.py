"""The capacity-over-time index of the broker (CB-1, CB-4, CB-9, issue 15): each
device's reserved cores as a step function of time (its "skyline"), kept
incrementally, and the search for the earliest start that uses it.

Per device the index holds the breakpoints of the step function, sorted, with
the level (cores reserved) from each breakpoint to the next, a sparse table of
range maxima over those levels, and for each breakpoint the next one at which
some allocation ends. Adding or removing an allocation touches one device's
row: O(m) for its m breakpoints (the sparse table is rebuilt, O(m log m), for
all changed rows at once before the next query), whatever the reservations on
other devices. Every query asks about a set of k devices at once, vectorised
over them: `peak` (the most cores reserved during [a, b) on each, two binary
searches and a range maximum: O(k log m)) and the next ends after an instant
(`_Probe.next_ends`, O(k log m)).

Rows of similar length live together in one 2-D block (`_Bucket`, widths 64,
256, 1,024, ...: few widths, so a query over many devices meets few blocks, each
one numpy pass), so a device with many more reservations than the others does
not widen every row. A row's keys carry the row number in their high bits, so
each block flattened is one sorted array and one `np.searchsorted` finds a
time on every row at once.

Beside the rows, a coarse grid (`_Grid`: one-minute cells, about 17 hours,
sliding forward with the searches) holds for each device and cell a lower
bound of the most cores reserved in the cell, exact for committed
allocations. It lets the search bound whole stretches of candidate starts in
one pass over k x cells numbers (no per-reservation work) and skip those
where no window of the duration can find the cores, and tells which devices
could offer any core at all near a candidate.

`earliest_start` visits the candidates (the ends of allocations where a
device's reserved cores fall: only there can free cores grow) in order,
skipping with the grid and with bounds over blocks of candidates, and checks
the remaining ones exactly. Its answers are those of
the brute-force search it replaced (tests/core_broker/test_capacity_oracle.py).
The cost of one step is O(k log m) for the k devices; the number of steps is
not bounded by a constant (a pathological schedule can make it walk many
candidates), but on the schedules measured (bench/scale_broker.py) it is a
handful.

Times are integer milliseconds; intervals are half-open [start, end). A key
packs a time relative to `_ORIGIN` into the low `_TBITS` bits; a breakpoint
must lie strictly inside that range (about year 1900 to 2180 in ms since the
epoch, or small test times), queries are clipped to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightpath_services.core_broker.endtimes import EndSet, EndSets

_TBITS = 43
_TMAX = (1 << _TBITS) - 1  # key of the padding after a row's last breakpoint
_TMASK = _TMAX
_ORIGIN = -(1 << 41)
MIN_TIME = _ORIGIN + 2
MAX_TIME = _ORIGIN + _TMAX - 2
MAX_ROWS = 1 << (63 - _TBITS)
_MIN_WIDTH = 64
_GROWTH = 4  # a full row moves to a block this many times wider
CELL_MS = 60_000  # the coarse grid: one-minute cells ...
CELLS = 1024  # ... about 17 hours of them


def _tk(t: int) -> int:
    if not MIN_TIME <= t <= MAX_TIME:
        raise ValueError(f"time {t} lies outside the schedule's range")
    return t - _ORIGIN


def _clip(t: np.ndarray) -> np.ndarray:
    """Query times as key offsets, clipped into (sentinel, padding) (np.minimum and
    np.maximum: np.clip costs several times more per call; `_offset` for one int)."""
    return np.minimum(np.maximum(np.asarray(t, np.int64) - _ORIGIN, 1), _TMAX - 1)


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
        self.dirty: set[int] = set()  # rows whose derived tables are stale
        self._views()

    def _views(self) -> None:
        self.keyflat = self.key.reshape(-1)
        self.spflat = self.sp.reshape(-1)
        self.nxtflat = self.nxt.reshape(-1)
        self.nendflat = self.nend.reshape(-1)
        self.plane = self.cap * self.w  # offset of one sparse level in spflat

    def copy(self) -> _Bucket:
        b = _Bucket.__new__(_Bucket)
        b.w, b.levels, b.cap, b.used = self.w, self.levels, self.cap, self.used
        b.key, b.sp, b.nend = self.key.copy(), self.sp.copy(), self.nend.copy()
        b.nref, b.nxt, b.cnt = self.nref.copy(), self.nxt.copy(), self.cnt.copy()
        b.spare = list(self.spare)
        b.dirty = set(self.dirty)
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
        self.dirty.discard(r)
        self.key[r] = (r << _TBITS) | _TMAX
        self.key[r, 0] = r << _TBITS
        self.sp[:, r] = 0
        self.nend[r] = 0
        self.nref[r] = 0
        self.nxt[r] = self.w - 1
        self.cnt[r] = 1

    # -- one row ---------------------------------------------------------------

    def insert_span(self, r: int, ks: int, ke: int, cores: int) -> tuple[int, int]:
        """Add `cores` over [ks, ke) (key offsets, ks < ke): `insert` of the start and
        of the end, and the level between them raised, with one search and one
        shift of each array. Returns how the row's drops (breakpoints where the
        level falls) changed at the start and at the end: -1, 0 or +1 each."""
        n = int(self.cnt[r])
        base = r << _TBITS
        row = self.key[r]
        js, je = row[:n].searchsorted(np.array((base | ks, base | ke), np.int64)).tolist()
        new_s = js >= n or int(row[js]) != base | ks
        new_e = je >= n or int(row[je]) != base | ke
        lv, nd, nr = self.sp[0, r], self.nend[r], self.nref[r]
        # the start: a drop before iff its level is below the one before it; raised by
        # `cores` it may stop being one (a new breakpoint is none, before or after)
        ds = 0
        if not new_s:
            at, before = int(lv[js]), int(lv[js - 1])
            ds = -(at < before <= at + cores)
        # the end: the level before it rises by `cores`, so it may become a drop
        if new_e:
            de = 1
        else:
            at, before = int(lv[je]), int(lv[je - 1])
            de = int(before <= at < before + cores)
        if new_s or new_e:
            assert n + new_s + new_e < self.w, "row full"
            arrays = (row, lv, nd, nr)
            if new_s and new_e:  # the start goes to js, the end to je + 1
                for a in arrays:
                    a[je + 2 : n + 2] = a[je:n]
                    a[js + 1 : je + 1] = a[js:je]
                row[js], row[je + 1] = base | ks, base | ke
                nd[js] = nr[js] = nd[je + 1] = nr[je + 1] = 0
                lv[js] = lv[js - 1]
                lv[je + 1] = lv[je]  # the level just before the end: the column before it
                je += 1
            elif new_s:
                for a in arrays:
                    a[js + 1 : n + 1] = a[js:n]
                row[js] = base | ks
                nd[js] = nr[js] = 0
                lv[js] = lv[js - 1]
                je += 1
            else:
                for a in arrays:
                    a[je + 1 : n + 1] = a[je:n]
                row[je] = base | ke
                nd[je] = nr[je] = 0
                lv[je] = lv[je - 1]
            self.cnt[r] = n + new_s + new_e
        nr[js] += 1
        nr[je] += 1
        nd[je] += 1
        lv[js:je] += cores
        self.dirty.add(r)
        return ds, de

    def release_span(self, r: int, ks: int, ke: int, cores: int) -> tuple[int, int]:
        """Take back `insert_span(r, ks, ke, cores)`: the level between the two
        breakpoints lowered, each uncounted and dropped when unused (one search,
        one shift of each array). Returns the change of drops at the start and at
        the end, as `insert_span`."""
        n = int(self.cnt[r])
        base = r << _TBITS
        row = self.key[r]
        js, je = row[:n].searchsorted(np.array((base | ks, base | ke), np.int64)).tolist()
        assert je < n and int(row[js]) == base | ks and int(row[je]) == base | ke, "no such span"
        lv, nd, nr = self.sp[0, r], self.nend[r], self.nref[r]
        # the level from the start lowered: it may become a drop; the level before
        # the end lowered: it may stop being one (a breakpoint left unused is none)
        at, before = int(lv[js]), int(lv[js - 1])
        ds = int(at - cores < before <= at)
        at, before = int(lv[je]), int(lv[je - 1])
        de = -(at < before <= at + cores)
        lv[js:je] -= cores
        nr[js] -= 1
        nr[je] -= 1
        nd[je] -= 1
        drop_s, drop_e = bool(nr[js] == 0), bool(nr[je] == 0)
        if not (drop_s or drop_e):
            self.dirty.add(r)
            return ds, de
        arrays = (row, lv, nd, nr)
        if drop_s and drop_e:
            for a in arrays:
                a[js : je - 1] = a[js + 1 : je]
                a[je - 1 : n - 2] = a[je + 1 : n]
        else:
            j = js if drop_s else je
            for a in arrays:
                a[j : n - 1] = a[j + 1 : n]
        m = n - drop_s - drop_e
        row[m:n] = base | _TMAX
        lv[m:n] = 0
        nd[m:n] = 0
        nr[m:n] = 0
        self.cnt[r] = m
        self.dirty.add(r)
        return ds, de

    def rebuild(self) -> None:
        """The sparse tables of maxima and the next-end pointers of the rows
        changed since the last rebuild, all at once (one numpy pass per level)."""
        if not self.dirty:
            return
        rows = np.fromiter(self.dirty, np.int64)
        self.dirty.clear()
        w = self.w
        # A query reads a row's range [lo, hi) with hi at most its column count, so
        # only its first `top` columns and the levels of spans up to `top` (and the
        # next-end pointer of its first padding column) are ever read: the rest
        # is left as it was.
        top = int(self.cnt[rows].max())
        wc = min(w, top + 1)
        prev = self.sp[0, rows, :wc]
        span = 1
        for lvl in range(1, top.bit_length()):
            cur = prev.copy()
            np.maximum(prev[:, : wc - span], prev[:, span:], out=cur[:, : wc - span])
            self.sp[lvl, rows, :wc] = cur
            prev = cur
            span *= 2
        idx = np.where(self.nend[rows, :wc] > 0, np.arange(wc), w - 1)
        self.nxt[rows, :wc] = np.minimum.accumulate(idx[:, ::-1], axis=1)[:, ::-1]

    def load_row(self, r: int, tks: np.ndarray, levels: np.ndarray, nend, nref) -> None:
        n = tks.shape[0]
        self._clear(r)
        self.key[r, 1 : n + 1] = (r << _TBITS) | tks
        self.sp[0, r, 1 : n + 1] = levels
        self.nend[r, 1 : n + 1] = nend
        self.nref[r, 1 : n + 1] = nref
        self.cnt[r] = n + 1
        self.dirty.add(r)

    def row_data(self, r: int):
        n = int(self.cnt[r])
        return (
            self.key[r, 1:n] & _TMASK,
            self.sp[0, r, 1:n].copy(),
            self.nend[r, 1:n].copy(),
            self.nref[r, 1:n].copy(),
        )

    # -- many rows at once ------------------------------------------------------

    def peak(self, rows: np.ndarray, a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray:
        """Most cores reserved at any instant of [a, b) on each row (a < b after clipping,
        or both clipped alike: then the level there)."""
        base = rows << _TBITS
        qa = _offset(a) if isinstance(a, int) else _clip(a)
        qb = _offset(b) if isinstance(b, int) else _clip(b)
        lo = np.searchsorted(self.keyflat, base | qa, side="right") - 1
        hi = np.searchsorted(self.keyflat, base | qb, side="left")
        hi = np.maximum(hi, lo + 1)
        k = _LOG2[hi - lo]
        off = k * self.plane
        return np.maximum(self.spflat[off + lo], self.spflat[off + hi - (1 << k)])


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


class _Grid:
    """Each device's most cores reserved in each cell of a coarse time grid
    (cells of `cell` ms from `origin`; the first and the last cell reach to
    minus and plus infinity). Kept with the rows: an allocation adds its cores
    to the cells it covers whole and has the (at most two) cells it covers in
    part re-read from its row. The grid slides forward with the searches
    (`anchor`), re-reading only the cells that come into view."""

    def __init__(self, cell: int, cells: int):
        self.cell = cell
        self.cells = cells
        self.origin: int | None = None
        # m[j, d]: the most cores device d has reserved in cell j (cells first: a
        # search reads a run of cells of every device at once)
        self.m = np.zeros((cells, 0), np.int32)
        self.stale: list[int] = []  # device * cells + cell: partly covered by a change

    def copy(self) -> _Grid:
        g = _Grid(self.cell, self.cells)
        g.origin = self.origin
        g.m = self.m.copy()
        g.stale = list(self.stale)
        return g

    def grow(self, devices: int) -> None:
        if self.m.shape[1] >= devices:
            return
        m = np.zeros((self.cells, max(16, 2 * devices)), np.int32)
        m[:, : self.m.shape[1]] = self.m
        self.m = m

    def index(self, t: int) -> int:
        assert self.origin is not None
        return min(max((t - self.origin) // self.cell, 0), self.cells - 1)

    def edges(self, j0: int, j1: int) -> tuple[np.ndarray, np.ndarray]:
        """[lo, hi) of cells j0 .. j1-1 as key offsets (the end cells unbounded)."""
        assert self.origin is not None
        j = np.arange(j0, j1, dtype=np.int64)
        lo = _clip(self.origin + j * self.cell)
        hi = _clip(self.origin + (j + 1) * self.cell)
        lo[j == 0] = 1
        hi[j == self.cells - 1] = _TMAX - 1
        return lo, hi


class Skyline:
    """Every device's reserved cores over time (see the module docstring)."""

    def __init__(self, cell: int = CELL_MS, cells: int = CELLS) -> None:
        self.buckets: dict[int, _Bucket] = {}
        self.bucket_of = np.zeros(0, np.int64)  # width of each device's bucket
        self.row_of = np.zeros(0, np.int64)
        self.grid = _Grid(cell, cells)
        self.assumed = 0  # assumed allocations in the rows (not in the grid)
        self.endsets = EndSets()  # the sorted ends of the device sets searched lately
        self.moves = 0  # devices given or moved to a row so far
        self._layouts: dict[bytes, tuple] = {}  # see `layout`

    def copy(self) -> Skyline:
        s = Skyline.__new__(Skyline)
        s.buckets = {w: b.copy() for w, b in self.buckets.items()}
        s.bucket_of = self.bucket_of.copy()
        s.row_of = self.row_of.copy()
        s.grid = self.grid.copy()
        s.assumed = self.assumed
        s.endsets = EndSets()
        s.moves = 0
        s._layouts = {}
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
            self.moves += 1
        self.grid.grow(device + 1)

    def _row(self, device: int) -> tuple[np.ndarray, np.ndarray]:
        """Key offsets and levels of a device's breakpoints, the sentinel first."""
        b = self.buckets[int(self.bucket_of[device])]
        r = int(self.row_of[device])
        n = int(b.cnt[r])
        return b.key[r, :n] & _TMASK, b.sp[0, r, :n]

    def _reread(self, device: int, j0: int, j1: int) -> None:
        """Cells j0 .. j1-1 of a device's grid row, from its breakpoints."""
        if j1 <= j0:
            return
        keys, levels = self._row(device)
        lo, hi = self.grid.edges(j0, j1)
        a = np.searchsorted(keys, lo, side="right") - 1
        z = np.maximum(np.searchsorted(keys, hi, side="left"), a + 1)
        if j1 - j0 <= 2:
            out = [int(levels[x:y].max()) for x, y in zip(a.tolist(), z.tolist(), strict=True)]
        else:
            # max of levels[a:z] per cell: the cells' spans overlap by at most the one
            # breakpoint z - 1 that also opens the next cell
            ext = np.append(levels, 0)
            seg = np.maximum.reduceat(ext, np.append(a, z[-1]))[:-1]
            out = np.maximum(seg, ext[z - 1])
        self.grid.m[j0:j1, device] = out

    def _grid_change(
        self,
        device: int,
        start: int,
        end: int,
        cores: int,
        *,
        assumed: bool = False,
        whole: bool = True,
    ) -> None:
        """`cores` more (or fewer) on a device over [start, end) in the grid: added to
        the cells it covers whole (unless not `whole`: they hold it already) and,
        unless `assumed`, the cells it covers in part marked for a re-read."""
        g = self.grid
        if g.origin is None:
            return
        jf, jl = g.index(start), g.index(end - 1)
        whole0 = jf if jf > 0 and g.origin + jf * g.cell == start else jf + 1
        whole1 = jl if jl < g.cells - 1 and g.origin + (jl + 1) * g.cell == end else jl - 1
        if whole and whole1 >= whole0:
            g.m[whole0 : whole1 + 1, device] += cores
        if assumed:
            # taken back before long, by the same change negated: the cells it covers in
            # part are left alone both ways (a lower bound), and never re-read meanwhile
            return
        base = device * g.cells
        for j in (jf,) if jl == jf else (jf, jl):
            if whole0 <= j <= whole1:
                continue
            # a cell covered in part: its most can have grown by at most what was
            # added and fallen by at most what was taken, so it stays a lower bound
            # (unchanged after an add, less the cores after a removal) until re-read
            if cores < 0:
                g.m[j, device] = max(0, int(g.m[j, device]) + cores)
            g.stale.append(base + j)

    def _grid_fresh(self) -> None:
        """Re-read the cells that changes covered in part (all at once, from the
        rows' range maxima); not while assumed allocations are in the rows (the
        grid leaves them out)."""
        g = self.grid
        if not g.stale or self.assumed:
            return
        pairs = np.unique(np.array(g.stale, np.int64))
        g.stale.clear()
        devices, cells = np.divmod(pairs, g.cells)
        assert g.origin is not None
        lo = np.where(cells == 0, MIN_TIME - 1, g.origin + cells * g.cell)
        hi = np.where(cells == g.cells - 1, MAX_TIME + 1, g.origin + (cells + 1) * g.cell)
        g.m[cells, devices] = Skyline.peak(self.groups(devices), devices.shape[0], lo, hi)

    def saturated(
        self, devices: np.ndarray, cores: np.ndarray, start: int, end: int
    ) -> np.ndarray | None:
        """Which of `devices` (with `cores` each) the grid shows with every core
        reserved in some cell wholly inside [start, end): those have none free
        during it (the grid's cells are lower bounds). None: no such cell."""
        g = self.grid
        if g.origin is None:
            return None
        j0 = max(1, -((g.origin - start) // g.cell))  # the first cell starting at or after start
        j1 = min(g.cells - 2, (end - g.origin) // g.cell - 1)  # the last ending by end
        if j1 < j0:
            return None
        if j1 == j0:
            most = g.m[j0, devices]
        else:
            most = g.m[j0 : j1 + 1].max(axis=0)[devices]
        return most >= cores

    def anchor(self, t: int) -> None:
        """Slide the grid so that `t` lies in its first cells, if t has moved out
        of its first quarter (time went on) or lies before it."""
        g = self.grid
        want = (t // g.cell) * g.cell - 2 * g.cell
        if g.origin is not None and g.origin <= t < g.origin + (g.cells // 4) * g.cell:
            return
        if self.assumed:  # the rows hold assumed allocations, which the grid leaves out
            return
        n = self.devices
        self._grid_fresh()
        if g.origin is None or abs(want - g.origin) // g.cell >= g.cells // 2:
            g.origin = want
            for d in range(n):
                self._reread(d, 0, g.cells)
            return
        shift = (want - g.origin) // g.cell
        g.origin = want
        if shift > 0:
            g.m[1 : g.cells - shift] = g.m[1 + shift :].copy()
            fresh = (0, g.cells - shift - 1, g.cells)
        else:
            g.m[1 - shift :] = g.m[1 : g.cells + shift].copy()
            fresh = (0, 1, 1 - shift)
        for d in range(n):
            self._reread(d, 0, 1)
            self._reread(d, fresh[1], fresh[2])

    # -- changes ------------------------------------------------------------------

    def add(self, device: int, start: int, end: int, cores: int, *, assumed: bool = False) -> None:
        """Add an allocation. An `assumed` one (a decision trying a grant out,
        taken back before long by `remove(..., assumed=True)`) changes only the
        grid cells it covers whole: the grid then holds a lower bound of the
        cores reserved in each cell, which is all its bounds need."""
        ks, ke = _tk(start), _tk(end)
        b, r = self._room(device)
        ds, de = b.insert_span(r, ks, ke, cores)
        self.assumed += assumed
        self._grid_change(device, start, end, cores, assumed=assumed)
        if ds:
            self.endsets.change(device, start, ds)
        if de:
            self.endsets.change(device, end, de)

    def remove(
        self, device: int, start: int, end: int, cores: int, *, assumed: bool = False
    ) -> None:
        ks, ke = _tk(start), _tk(end)
        b = self.buckets[int(self.bucket_of[device])]
        r = int(self.row_of[device])
        ds, de = b.release_span(r, ks, ke, cores)
        self.assumed -= assumed
        self._grid_change(device, start, end, -cores, assumed=assumed)
        if ds:
            self.endsets.change(device, start, ds)
        if de:
            self.endsets.change(device, end, de)

    def settle(self, device: int, start: int, end: int, cores: int) -> None:
        """An assumed allocation stays, as if `add`ed: its row and its whole grid cells
        hold it already; the cells it covers in part are marked for a re-read."""
        self.assumed -= 1
        self._grid_change(device, start, end, cores, whole=False)

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
        nb = self._bucket(w * _GROWTH)
        nr = nb.alloc()
        nb.load_row(nr, *data)
        self.bucket_of[device] = w * _GROWTH
        self.row_of[device] = nr
        self.moves += 1
        return nb, nr

    # -- queries ------------------------------------------------------------------

    def groups(self, devices: np.ndarray) -> list[Group]:
        """`devices` (device indices) split by bucket, for the queries below
        (which see every change made before this call)."""
        for bucket in self.buckets.values():
            bucket.rebuild()
        widths = self.bucket_of[devices]
        if devices.shape[0] == 0:
            return []
        first = int(widths[0])
        if (widths == first).all():
            return [Group(self.buckets[first], np.arange(devices.shape[0]), self.row_of[devices])]
        out = []
        for w in sorted(self.buckets):  # a handful of widths: no sort of the devices
            pos = np.flatnonzero(widths == w)
            if pos.shape[0]:
                out.append(Group(self.buckets[w], pos, self.row_of[devices[pos]]))
        return out

    @staticmethod
    def peak(groups: list[Group], n: int, a, b) -> np.ndarray:
        """Most cores reserved during [a, b) on each of the n devices of `groups`
        (a and b scalars, or arrays of n)."""
        out = np.empty(n, np.int64)
        if np.ndim(a) == 0 and np.ndim(b) == 0:  # one range for every device
            for g in groups:
                out[g.pos] = g.bucket.peak(g.rows, a, b)
            return out
        va, vb = np.broadcast_to(a, (n,)), np.broadcast_to(b, (n,))
        for g in groups:
            out[g.pos] = g.bucket.peak(g.rows, va[g.pos], vb[g.pos])
        return out

    def layout(self, devices: np.ndarray) -> tuple[slice | np.ndarray, list[tuple]]:
        """What a search over `devices` reads where: their columns of the grid (a slice,
        a view, when they are evenly spaced, as every device or every device of a kind
        often is) and per bucket (bucket, positions, row keys, row starts) sorted by
        row (so the keys of every query come sorted: numpy's binary search narrows
        from the previous answer). Kept for the last few device sets until a device
        changes rows (which sees every change made before this call, as `groups`)."""
        key = devices.tobytes()
        hit = self._layouts.get(key)
        if hit is not None and hit[0] == self.moves:
            for bucket in self.buckets.values():
                bucket.rebuild()
            return hit[1], hit[2]
        n = devices.shape[0]
        columns: slice | np.ndarray = devices
        if n > 1:
            step = int(devices[1] - devices[0])
            if step > 0 and (np.diff(devices) == step).all():
                columns = slice(int(devices[0]), int(devices[-1]) + 1, step)
        elif n == 1:
            columns = slice(int(devices[0]), int(devices[0]) + 1)
        parts = []
        for g in self.groups(devices):
            order = np.argsort(g.rows)
            rows, pos = g.rows[order], g.pos[order]
            parts.append((g.bucket, pos, rows << _TBITS, rows * g.bucket.w))
        if len(self._layouts) >= 8:
            del self._layouts[next(iter(self._layouts))]
        self._layouts[key] = (self.moves, columns, parts)
        return columns, parts

    def end_set(self, devices: np.ndarray) -> EndSet:
        """The instants at which the reserved cores of one of `devices` fall (an
        allocation ends there and fewer start), with how many of the devices each:
        the only instants after which free cores can grow (kept up to date with
        every later change while it stays cached)."""
        key = devices.tobytes()
        found = self.endsets.get(key)
        if found is not None:
            return found
        times = []
        for g in self.groups(devices):
            lv = g.bucket.sp[0][g.rows]
            drop = np.zeros(lv.shape, bool)
            drop[:, 1:] = lv[:, 1:] < lv[:, :-1]  # the padding after a row's last breakpoint: 0, 0
            times.append((g.bucket.key[g.rows][drop] & _TMASK) + _ORIGIN)
        every = np.concatenate(times) if times else np.zeros(0, np.int64)
        ends, counts = np.unique(every, return_counts=True)
        member = np.zeros(self.devices, bool)
        member[devices] = True
        made = EndSet(member, ends.astype(np.int64), counts.astype(np.int64))
        self.endsets.put(key, made)
        return made

    def breakpoints(self, device: int) -> int:
        """Breakpoints of a device's step function (for tests and sizing)."""
        b = self.buckets[int(self.bucket_of[device])]
        return int(b.cnt[int(self.row_of[device])]) - 1


def _offset(t: int) -> int:
    """A query time as a key offset, clipped into (sentinel, padding)."""
    return min(max(t - _ORIGIN, 1), _TMAX - 1)


class _Probe:
    """The devices of one search, split by bucket and sorted by row (so that the
    keys of every query come sorted: numpy's binary search narrows from the
    previous answer), with what every step reuses."""

    def __init__(self, sky: Skyline, devices: np.ndarray, caps: np.ndarray):
        self.n = devices.shape[0]
        self.devices = devices
        self.caps = caps
        self.caps32 = caps.astype(np.int32)  # as the grid's cells: offers without widening
        self.grid = sky.grid
        self.ends: EndSet | None = None
        self.columns, layout = sky.layout(devices)
        self.parts = [(b, pos, base, start, caps[pos]) for b, pos, base, start in layout]
        # one part, its rows in the devices' order: masks by device need no reordering
        self.in_order = len(layout) == 1 and bool((layout[0][1] == np.arange(self.n)).all())

    def next_ends(self, t: int, k: int) -> list[int]:
        """The first k distinct instants after t at which an allocation on one of
        the devices ends (fewer if there are fewer): from the sorted ends of the
        device set when the search has them, else from the rows."""
        if self.ends is not None:
            return self.ends.next_ends(t, k)
        return self.next_ends_rows(t, k)

    def next_end(self, t: int) -> int | None:
        """The first instant after t at which an allocation on one of the devices ends."""
        best = _TMAX
        q = _offset(t)
        for b, _, base, start, _ in self.parts:
            pos = np.searchsorted(b.keyflat, base | q, side="right")
            best = min(best, int((b.keyflat[start + b.nxtflat[pos]] & _TMASK).min()))
        return None if best >= _TMAX else best + _ORIGIN

    def next_ends_rows(self, t: int, k: int) -> list[int]:
        """`next_ends` read from the devices' rows."""
        if k == 1:
            first = self.next_end(t)
            return [] if first is None else [first]
        q = _offset(t)
        firsts = []
        for b, _, base, start, _ in self.parts:
            col = b.nxtflat[np.searchsorted(b.keyflat, base | q, side="right")]
            firsts.append((b, start, col, b.keyflat[start + col] & _TMASK))
        # Only the devices whose next end is at most the k-th smallest of those next
        # ends (`limit`) can hold one of the first k: their next 2k breakpoints are
        # read at once. Every instant returned is at most `limit` and at most the
        # last breakpoint read of each of those devices, so every end before it
        # has been seen.
        round0 = np.concatenate([f[3] for f in firsts])
        i = min(k, round0.shape[0]) - 1
        limit = int(np.partition(round0, i)[i])
        span = np.arange(2 * k)
        found = []
        for b, start, col, times in firsts:
            near = times <= limit
            if not near.any():
                continue
            idx = (start[near] + np.minimum(col[near], b.w - 1))[:, None] + span
            idx = np.minimum(idx, (start[near] + b.w - 1)[:, None])
            keys = b.keyflat[idx] & _TMASK
            limit = min(limit, int(keys[:, -1].min()))
            found.append(keys[b.nendflat[idx] > 0])
        every = np.concatenate(found)
        times = np.unique(every[every <= limit])
        return (times[times < _TMAX][:k] + _ORIGIN).tolist()

    def free(self, a: list[int], b: list[int], only: np.ndarray | None = None) -> np.ndarray:
        """Cores free during the whole of [a[i], b[i]) on each device: shape (len(a), n).
        `a` and `b` must each be increasing. With `only` (a mask over the devices),
        the other devices are left out (0)."""
        m = len(a)
        out = (
            np.zeros((m, self.n), np.int64) if only is not None else np.empty((m, self.n), np.int64)
        )
        qa = _clip(np.array(a, np.int64))
        qb = _clip(np.array(b, np.int64))
        for bk, pos, base, _, caps in self.parts:
            if only is not None:
                sel = only[pos]
                pos, base, caps = pos[sel], base[sel], caps[sel]
                if pos.shape[0] == 0:
                    continue
            col = base[:, None]
            lo = np.searchsorted(bk.keyflat, (col | qa).ravel(), side="right") - 1
            hi = np.searchsorted(bk.keyflat, (col | qb).ravel(), side="left")
            np.maximum(hi, lo + 1, out=hi)
            k = _LOG2[hi - lo]
            off = k * bk.plane
            peak = np.maximum(bk.spflat[off + lo], bk.spflat[off + hi - (1 << k)])
            out[:, pos] = np.maximum(caps[:, None] - peak.reshape(-1, m), 0).T
        return out

    def free_where(self, a: list[int], b: list[int], sel: np.ndarray) -> np.ndarray:
        """`free`, read only where `sel` (shape (n, len(a)): device, then window) is
        set: 0 elsewhere."""
        m = len(a)
        out = np.zeros((m, self.n), np.int64)
        qa = _clip(np.array(a, np.int64))
        qb = _clip(np.array(b, np.int64))
        for bk, pos, base, _, caps in self.parts:
            # (device, window) pairs by row, then window: the keys come sorted
            di, wi = np.nonzero(sel if self.in_order else sel[pos])
            if di.shape[0] == 0:
                continue
            rb = base[di]
            lo = np.searchsorted(bk.keyflat, rb | qa[wi], side="right") - 1
            hi = np.searchsorted(bk.keyflat, rb | qb[wi], side="left")
            np.maximum(hi, lo + 1, out=hi)
            k = _LOG2[hi - lo]
            off = k * bk.plane
            peak = np.maximum(bk.spflat[off + lo], bk.spflat[off + hi - (1 << k)])
            out[wi, pos[di]] = np.maximum(caps[di] - peak, 0)
        return out

    # -- the coarse grid -----------------------------------------------------------

    def coarse(self, duration: int, need: int) -> None:
        """Prepare `first_open` for windows of `duration` (cells wholly inside
        every window that starts in a cell: `width` of them)."""
        self.need = need
        self.width = duration // self.grid.cell - 1 if self.grid.origin is not None else 0
        self.chunk_start = -1
        self.chunk_open = np.zeros(0, bool)
        self.chunk_offer = np.zeros((0, self.n), np.int32)

    def first_open(self, j: int) -> int:
        """The first cell from j on whose candidates might leave `need` cores
        free: a window starting in cell i holds cells i+1 .. i+width whole, so a
        device offers at most its cores less its peak in those cells."""
        g = self.grid
        w = self.width
        last = g.cells - 2 - w  # later cells would reach the open-ended last cell
        while True:
            if w < 1 or j <= 0 or j > last:
                return j
            k = j - self.chunk_start
            if 0 <= k < self.chunk_open.shape[0]:
                hit = np.flatnonzero(self.chunk_open[k:])
                if hit.size:
                    return j + int(hit[0])
                j = self.chunk_start + self.chunk_open.shape[0]
                continue
            self._chunk(j, min(_CHUNK, last - j + 1))

    def _chunk(self, j: int, n: int) -> None:
        """Bound cells j .. j+n-1 (each a start cell of windows of `width`).

        A device offers a window starting in cell i at most its cores less its
        most in any of cells i+1 .. i+width, and all of them together at most
        `total` of any one of those cells (what they have free in it, summed). So
        first the cells whose windows fall short of `need` by that cheap bound
        (one sum per cell) are closed, their per-device offers left 0: whatever
        they are, together they are short of `need`, so the windows of those
        cells are never checked. The per-device bound is worked out from the
        first cell that may be open."""
        w = self.width
        free = self.caps32 - self.grid.m[j + 1 : j + n + w, self.columns]
        total = np.maximum(free, 0).sum(axis=1)
        maybe = np.flatnonzero(_sliding_min(total, w, n) >= self.need)
        offer = np.zeros((n, self.n), np.int32)
        if maybe.size:
            f = int(maybe[0])
            offer[f:] = np.maximum(_sliding_min(free[f:], w, n - f), 0)
        self.chunk_start = j
        self.chunk_offer = offer
        self.chunk_open = offer.sum(axis=1) >= self.need

    def bounds(self, cells: list[int], ends: list[int], need: int) -> np.ndarray | None:
        """For windows each starting in cell `cells[i]` (the candidates) or somewhere in
        cells `cells[i]` .. `ends[i - c]` (the blocks after the c candidates): a mask
        (n, len(cells)) of the devices that might offer a core to each, empty for a
        window to which all of them together cannot offer `need` (None: the grid
        cannot tell)."""
        if self.width < 1 or not cells:
            return None
        cs, rows = self.chunk_start, self.chunk_offer.shape[0]
        lo = min(cells)
        hi = max(max(cells), max(ends)) if ends else max(cells)
        if lo <= 0:
            return None
        if lo < cs or hi - cs >= rows:
            last = self.grid.cells - 2 - self.width  # as in first_open
            if hi > last:
                return None
            self._chunk(lo, max(hi - lo + 1, min(_CHUNK, last - lo + 1)))
            cs = lo
        bound = self.chunk_offer[np.array(cells, np.int64) - cs]  # a window in one cell: its offers
        c = len(cells) - len(ends)
        for i, c1 in enumerate(ends):
            if c1 > cells[c + i]:
                bound[c + i] = self.chunk_offer[cells[c + i] - cs : c1 - cs + 1].max(axis=0)
        # by device, then window (C order): what `free_where` reads
        out = np.greater(bound.T, 0, order="C")
        out &= bound.sum(axis=1) >= need
        return out


_CHUNK = 32  # cells bounded at once by the coarse grid (more cost more than they save)


def _sliding_min(x: np.ndarray, w: int, n: int) -> np.ndarray:
    """min(x[i : i + w]) along the first axis, for i < n (x has n + w - 1 rows):
    windows of doubling spans, then the two that cover each window."""
    span = 1  # x[i] becomes the least of x[i .. i + 2 * span - 1]
    while span * 2 <= w:
        x = np.minimum(x[:-span], x[span:])
        span *= 2
    return np.minimum(x[:n], x[w - span : w - span + n])


LOOKAHEAD = 2  # blocks bounded per step besides the candidates checked exactly
# candidates checked exactly per step: KMIN, KJUMP after the grid skipped ahead (a
# cell that might fit: near a crossing its candidates come thick), doubling to KMAX
KMIN, KJUMP, KMAX = 2, 8, 16


def earliest_start(
    sky: Skyline,
    cores: np.ndarray,
    devices: np.ndarray,
    need: int,
    duration: int,
    after: int,
    last_start: int | None,
    *,
    floor: int | None = None,
    drops: bool = False,
) -> tuple[int, np.ndarray] | None:
    """Earliest end time t of an allocation on `devices` with after < t <= last_start
    at which the devices have `need` cores free, in all, for [t, t + duration);
    with the free cores of each of `devices` (in their order) then.

    Free cores over [t, t + duration) grow only when t passes an allocation's
    end, so the candidates are those ends, visited in order. With `drops` (the
    caller knows that no instant in (after, floor] is a start, or `after`
    itself when there is no floor) only the ends at which a device's reserved
    cores fall are visited: the end of one allocation where another of as many
    cores starts (back-to-back reservations) changes nothing, and at an
    instant t where no device's cores fall, a window starting at t - 1 has at
    least as many free (it gains [t - 1, t), no fuller than t, and loses its
    last instant), so by induction back to the last fall, or to `after`, t is
    no earliest start. Each step:

    1. the coarse grid skips every grid cell in which no window can start
       with `need` cores (`_Probe.first_open`);
    2. the next few candidates c1 < ... < cK are checked exactly, and after cK
       the blocks (cK + i·h, cK + (i+1)·h], i < LOOKAHEAD, are bounded: every
       window starting in such a block contains [cK + (i+1)·h, cK + i·h +
       duration + 1), so what each device has free during that shared stretch
       bounds what it can offer anywhere in the block. Blocks short of `need`
       are skipped; h doubles (up to the duration) while they are and halves
       when the first one is not, and then more candidates are checked at once;
    3. each window (candidate or block) reads only the devices the grid says
       might offer it a core, and none at all when those together cannot
       offer `need` (`_Probe.bounds`, `_Probe.free_where`): a window's grid
       bound is at least what each device has free in it, so the devices
       left out have none and a window left out cannot hold `need`;
    4. the candidates come from the device set's sorted instants of falling
       cores (`endtimes.EndSet`, with `drops`): one binary search, not a walk
       over every row.

    One step is one vectorised query, O(k log m) per window for the k devices.
    """
    n = devices.shape[0]
    if n == 0:
        return None
    sky.anchor(after)
    sky._grid_fresh()
    probe = _Probe(sky, devices, cores[devices])
    probe.ends = sky.end_set(devices) if drops else None  # None: every end, from the rows
    probe.coarse(duration, need)
    grid = sky.grid
    h = max(1, duration // 8)
    k = KMIN  # candidates checked exactly per step: more while the blocks after them stay open
    t = after if floor is None else max(after, floor)  # floor: known to hold no start up to it
    while True:
        cands = probe.next_ends(t, k)
        if not cands or (last_start is not None and cands[0] > last_start):
            return None
        c = cands[0]
        j = grid.index(c) if grid.origin is not None else 0  # 0: the grid cannot tell
        jo = probe.first_open(j)
        if jo > j:  # no candidate of cells j .. jo-1 can leave room
            assert grid.origin is not None
            t = grid.origin + jo * grid.cell - 1
            k = KJUMP  # a cell that might fit: its candidates come thick near a crossing
            continue
        if last_start is not None:
            cands = [x for x in cands if x <= last_start]
        cl = cands[-1]
        h = min(h, duration)
        blocks = LOOKAHEAD
        if last_start is not None:  # no block wholly after the last start allowed
            blocks = min(blocks, -(-(last_start - cl) // h))
        a = [*cands, *(cl + (i + 1) * h for i in range(blocks))]
        b = [*(x + duration for x in cands), *(cl + i * h + duration + 1 for i in range(blocks))]
        # only the devices the grid says might offer cores to these windows: the
        # others offer none, to the candidates or to the blocks
        # only the devices the grid says might offer cores to each window (the
        # others offer none), and none where together they cannot offer `need`
        sel = None
        if grid.origin is not None:
            o, w, top = grid.origin, grid.cell, grid.cells - 1
            # a candidate's window starts in its cell; a block's somewhere in (cl + i·h, cl + (i+1)·h]
            cells = [min(max((x - o) // w, 0), top) for x in cands]
            cells += [min(max((cl + i * h + 1 - o) // w, 0), top) for i in range(blocks)]
            ends = [min(max((cl + (i + 1) * h - o) // w, 0), top) for i in range(blocks)]
            sel = probe.bounds(cells, ends, need)
        free = probe.free(a, b) if sel is None else probe.free_where(a, b, sel)
        room = np.flatnonzero(free[: len(cands)].sum(axis=1) >= need)
        if room.size:
            return cands[int(room[0])], free[int(room[0])]
        if blocks == 0:
            return None  # the last candidate checked was the last start allowed
        open_ = np.flatnonzero(free[len(cands) :].sum(axis=1) >= need)
        if open_.size == 0:
            t = cl + blocks * h
            h = min(h * 2, duration)
            k = KMIN
        elif open_[0] == 0:
            t = cl
            h = max(1, h // 2)
            k = min(k * 2, KMAX)
        else:
            t = cl + int(open_[0]) * h
