"""The capacity map (CB-1, CB-8, seed 001 ¶23): devices, their cores, and the
schedule of reserved cores over time.

Pure and I/O free. Times are integer milliseconds since the Unix epoch and
every interval is half-open, [start, end): a reservation ending at t and one
starting at t never overlap.

The schedule is kept twice, both updated at every change: a table of
allocation rows (device, start, end, cores) keyed by allocation key
(`<reservation>:<part>`, so changes arriving from Redis apply idempotently),
which answers listings; and `skyline.Skyline`, each device's reserved cores
as a step function of time, which answers every question a decision asks —
"how many cores are free on these devices during [a, b)" (`free_over`) and
"when do they first have n free for d" (`earliest_start`) — in
O(k log m) for k devices of m breakpoints each, whatever the number of
reservations elsewhere (issue 15).

Decisions try allocations out with `assume` inside a `savepoint()` and
`rollback()` to it afterwards: no copy of the schedule per decision. A round
that commits what it decided keeps its grants assumed until the commit
answers and then `settle`s: the stored ones become keyed rows where they are,
the rest are taken back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from lightpath_services.core_broker import skyline
from lightpath_services.core_broker.skyline import Skyline

# Row fields of a dead (removed) allocation: never overlaps anything.
_DEAD = -(1 << 62)
_TIME_BITS = 42  # ranges up to ~139 years in ms
MAX_DEVICES = skyline.MAX_ROWS
MAX_SPAN_MS = (1 << _TIME_BITS) - 1

DEVICE_KINDS = ("GPU", "TPU", "EDGE_TPU", "NPU", "FPGA")


@dataclass(frozen=True)
class Device:
    """A specialised processing unit whose cores are rented (CB-1)."""

    device_id: str
    kind: str
    cores: int
    site: str = ""
    x_km: float = 0.0
    y_km: float = 0.0
    task_affinities: tuple[str, ...] = ()


@dataclass(frozen=True)
class Allocation:
    """`cores` of one device for [start, end) (CB-4: each grant names devices, cores, start, end)."""

    device_id: str
    cores: int
    start: int
    end: int


@dataclass(frozen=True)
class ScheduledRow:
    key: str
    start: int
    end: int
    cores: int

    @property
    def reservation_id(self) -> str:
        return self.key.split(":", 1)[0]


@dataclass
class _Devices:
    """Device attributes as arrays indexed by device index (shared by forks)."""

    ids: list[str] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)
    records: list[Device | None] = field(default_factory=list)
    cores: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    alive: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    x: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    y: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    rank: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    cache: dict[tuple, np.ndarray] = field(default_factory=dict)
    generation: int = 0  # bumped by every change of a device's record


@dataclass(frozen=True)
class _Found:
    """An earliest-start search's answer, kept as a lower bound for later searches."""

    devices: bytes  # the device indices searched, as bytes
    mask: np.ndarray  # the same, as a mask over the device indices then
    need: int
    duration: int
    after: int
    start: int
    depth: int  # allocations assumed when it was found
    generation: int


_FIELDS = ("need", "duration", "after", "start", "depth", "generation")


class _FloorSet:
    """The bounds found on one device set, as columns (one numpy pass answers)."""

    def __init__(self, mask: np.ndarray) -> None:
        self.mask = mask
        self.n = 0
        self.cols = np.zeros((len(_FIELDS), 16), np.int64)

    def covers(self, devices: bytes, key: bytes, idx: np.ndarray) -> bool:
        """Searched every one of the devices `idx` (and maybe more)."""
        if devices == key:
            return True
        return idx.shape[0] > 0 and int(idx[-1]) < self.mask.shape[0] and bool(self.mask[idx].all())

    def best(self, need: int, duration: int, after: int, generation: int) -> int | None:
        need_, dur, aft, start, _, gen = self.cols[:, : self.n]
        ok = (need_ <= need) & (dur <= duration) & (aft <= after) & (gen == generation)
        return int(start[ok].max()) if ok.any() else None

    def note(self, f: _Found, limit: int) -> None:
        new = np.array([getattr(f, name) for name in _FIELDS], np.int64)
        need_, dur, aft, start, depth, gen = self.cols[:, : self.n]
        same = gen == f.generation
        # one already here that bounds every search this one bounds, as far, as long
        if (
            same
            & (need_ <= f.need)
            & (dur <= f.duration)
            & (aft <= f.after)
            & (start >= f.start)
            & (depth <= f.depth)
        ).any():
            return
        # keep only those this one does not outdo (and none of a past generation)
        keep = same & ~(
            (need_ >= f.need)
            & (dur >= f.duration)
            & (aft >= f.after)
            & (start <= f.start)
            & (depth >= f.depth)
        )
        kept = self.cols[:, : self.n][:, keep]
        if kept.shape[1] >= limit:
            kept = kept[:, 1:]  # the oldest goes first
        n = kept.shape[1]
        if n + 1 > self.cols.shape[1]:
            self.cols = np.zeros((len(_FIELDS), 2 * (n + 1)), np.int64)
        self.cols[:, :n] = kept
        self.cols[:, n] = new
        self.n = n + 1

    def rolled_back(self, depth: int) -> None:
        keep = self.cols[4, : self.n] <= depth
        kept = self.cols[:, : self.n][:, keep]
        self.n = kept.shape[1]
        self.cols[:, : self.n] = kept


class _Floors:
    """Lower bounds for earliest-start searches from the answers of earlier ones.

    A search that found `start` for `need` cores over `duration` after `after`, on a
    schedule where `after` itself was no start, says that no instant in (after,
    start) is one. Each later search on the same devices (or some of them) that
    asks for at least as many cores, for at least as long, from no earlier, on a
    schedule holding at least the same allocations, has no start before `start`
    either: a start of it would be one of the earlier search (its window is longer
    and fuller, on fewer devices, and free cores over a window grow only where an
    allocation ends, so the last end before it, or `after`, would have been). So
    the later search begins at `start`.

    The bounds hold while allocations are only added: a removal (or a rollback
    past what was assumed when one was found, or a device's record changing)
    drops them.

    Kept per device set, without the ones another makes useless (one that applies
    to every search this one applies to, bounds them at least as far, and lasts
    as long): a batch of searches on a few device sets with a few sizes keeps a
    bound for nearly every search, not only for those like the last few."""

    LIMIT = 256  # per device set; the oldest goes first
    SETS = 16  # device sets; the one noted least lately goes first

    def __init__(self) -> None:
        self.found: dict[bytes, _FloorSet] = {}

    def floor(
        self, devices: bytes, idx: np.ndarray, need: int, duration: int, after: int, generation: int
    ) -> int:
        best = after
        for key, found in self.found.items():
            if found.n and found.covers(devices, key, idx):
                b = found.best(need, duration, after, generation)
                if b is not None and b > best:
                    best = b
        return best

    def note(self, found: _Found) -> None:
        kept = self.found.pop(found.devices, None)
        if kept is None:
            if len(self.found) >= self.SETS:
                del self.found[next(iter(self.found))]
            kept = _FloorSet(found.mask)
        self.found[found.devices] = kept  # the most lately noted last
        kept.note(found, self.LIMIT)

    def rolled_back(self, depth: int) -> None:
        for found in self.found.values():
            found.rolled_back(depth)

    def clear(self) -> None:
        self.found.clear()


class CapacityMap:
    """Devices plus the schedule of reserved cores (CB-1).

    `assume` adds allocations without keys; `savepoint()` / `rollback(mark)`
    take back what was assumed since the mark (a decision trying grants out on
    the live map, then leaving it as it was). `copy()` gives a fork that shares
    the devices and owns a copy of the schedule (O(n): for tests and tools).
    """

    def __init__(
        self, *, grid_cell_ms: int = skyline.CELL_MS, grid_cells: int = skyline.CELLS
    ) -> None:
        self._d = _Devices()
        self._latency: dict[str, dict[str, float]] = {}
        self._n = 0
        cap = 1024
        self._dev = np.zeros(cap, np.int64)
        self._start = np.full(cap, _DEAD, np.int64)
        self._end = np.full(cap, _DEAD, np.int64)
        self._cores = np.zeros(cap, np.int64)
        self._rows: dict[str, int] | None = {}
        self._key_of: list[str | None] = []
        self._parts: dict[str, int] = {}  # allocations held per reservation id (keyed rows)
        self._spare: list[int] = []
        self._sky = Skyline(grid_cell_ms, grid_cells)
        self._assumed: list[int] = []  # rows added by assume(), in order
        self._floors = _Floors()

    # -- devices --------------------------------------------------------------

    def upsert_device(self, device: Device) -> None:
        d = self._d
        i = d.index.get(device.device_id)
        if i is None:
            if len(d.ids) >= MAX_DEVICES:
                raise ValueError(f"at most {MAX_DEVICES} devices")
            i = len(d.ids)
            d.ids.append(device.device_id)
            d.index[device.device_id] = i
            d.records.append(None)
            d.cores = np.append(d.cores, 0)
            d.alive = np.append(d.alive, False)
            d.x = np.append(d.x, 0.0)
            d.y = np.append(d.y, 0.0)
            self._sky.add_device(i)
            order = np.argsort(np.array(d.ids, dtype=object), kind="stable")
            d.rank = np.empty(len(d.ids), np.int64)
            d.rank[order] = np.arange(len(d.ids))
        d.records[i] = device
        d.cores[i] = device.cores
        d.alive[i] = True
        d.x[i] = device.x_km
        d.y[i] = device.y_km
        d.cache.clear()
        d.generation += 1

    def remove_device(self, device_id: str) -> None:
        d = self._d
        i = d.index.get(device_id)
        if i is None:
            return
        d.records[i] = None
        d.cores[i] = 0
        d.alive[i] = False
        d.cache.clear()
        d.generation += 1

    def device(self, device_id: str) -> Device | None:
        i = self._d.index.get(device_id)
        return None if i is None else self._d.records[i]

    def devices(self) -> list[Device]:
        return [r for r in self._d.records if r is not None]

    def index_of(self, device_id: str) -> int | None:
        i = self._d.index.get(device_id)
        return i if i is not None and self._d.alive[i] else None

    def device_at(self, index: int) -> Device:
        record = self._d.records[index]
        assert record is not None, index
        return record

    @property
    def cores(self) -> np.ndarray:
        """Cores per device index (0 for a removed device)."""
        return self._d.cores

    @property
    def alive(self) -> np.ndarray:
        return self._d.alive

    @property
    def rank(self) -> np.ndarray:
        """Order of device ids: the deterministic tie-breaker of placement."""
        return self._d.rank

    def kind_mask(self, kind: str | None) -> np.ndarray:
        if not kind:
            return self._d.alive
        return self._cached(
            ("kind", kind),
            lambda: np.array([r is not None and r.kind == kind for r in self._d.records], bool),
        )

    def affinity_mask(self, task_type: str) -> np.ndarray:
        return self._cached(
            ("affinity", task_type),
            lambda: np.array(
                [r is not None and task_type in r.task_affinities for r in self._d.records], bool
            ),
        )

    def distance_from(self, x_km: float, y_km: float) -> np.ndarray:
        return np.hypot(self._d.x - x_km, self._d.y - y_km)

    # -- latency table (CB-7) -------------------------------------------------

    def set_latency(self, site: str, device_id: str, latency_ms: float | None) -> None:
        row = self._latency.setdefault(site, {})
        if latency_ms is None:
            row.pop(device_id, None)
        else:
            row[device_id] = float(latency_ms)
        self._d.cache.pop(("latency", site), None)

    def latency_from(self, site: str) -> np.ndarray:
        """Latency from `site` to every device, +inf where the table has no entry."""

        def build() -> np.ndarray:
            row = self._latency.get(site, {})
            return np.array([row.get(i, np.inf) for i in self._d.ids], np.float64)

        return self._cached(("latency", site), build)

    def _cached(self, key: tuple, build) -> np.ndarray:
        hit = self._d.cache.get(key)
        if hit is None or hit.shape[0] != len(self._d.ids):
            hit = self._d.cache[key] = build()
        return hit

    # -- schedule ---------------------------------------------------------------

    def add(self, key: str, device_id: str, start: int, end: int, cores: int) -> bool:
        """Add an allocation row; False (and no change) if `key` is present already."""
        if self._rows is None:
            raise TypeError("a fork tracks no keys; use assume()")
        if key in self._rows:
            return False
        i = self._d.index.get(device_id)
        if i is None:
            raise KeyError(device_id)
        self._keyed(self._put(i, start, end, cores), key)
        return True

    def _keyed(self, row: int, key: str) -> None:
        """Row `row` is the allocation `key` (`<reservation>:<part>`)."""
        assert self._rows is not None
        self._rows[key] = row
        self._key_of[row] = key
        rid = key.split(":", 1)[0]
        self._parts[rid] = self._parts.get(rid, 0) + 1

    def remove(self, key: str) -> bool:
        if self._rows is None:
            raise TypeError("a fork tracks no keys")
        row = self._rows.pop(key, None)
        if row is None:
            return False
        self._kill(row)
        self._key_of[row] = None
        self._floors.clear()
        rid = key.split(":", 1)[0]
        left = self._parts[rid] - 1
        if left:
            self._parts[rid] = left
        else:
            del self._parts[rid]
        if len(self._spare) > 4096 and len(self._spare) * 2 > self._n and not self._assumed:
            self._compact()
        return True

    def _kill(self, row: int, *, assumed: bool = False) -> None:
        self._sky.remove(
            int(self._dev[row]),
            int(self._start[row]),
            int(self._end[row]),
            int(self._cores[row]),
            assumed=assumed,
        )
        self._start[row] = _DEAD
        self._end[row] = _DEAD
        self._cores[row] = 0
        self._spare.append(row)

    def assume(self, allocations: Iterable[Allocation]) -> None:
        """Add allocations without keys (a decision trying grants out)."""
        for a in allocations:
            self._assumed.append(
                self._put(self._d.index[a.device_id], a.start, a.end, a.cores, assumed=True)
            )

    def savepoint(self) -> int:
        """A mark to `rollback` to: what is assumed after it can be taken back."""
        return len(self._assumed)

    def rollback(self, mark: int) -> None:
        """Take back every allocation assumed since `mark`, newest first."""
        if len(self._assumed) > mark:
            self._floors.rolled_back(mark)
        while len(self._assumed) > mark:
            self._kill(self._assumed.pop(), assumed=True)

    def settle(self, mark: int, stored: Iterable[tuple[str, str, int, int, int]]) -> int:
        """After a commit of allocations assumed since `mark`: those it stored become
        keyed rows, as `add` with their keys would have made them (without taking
        them out and putting them back), and the rest are taken back. `stored`:
        (key, device id, start, end, cores) of each allocation stored; one with no
        such assumed allocation, or whose key is held already (the change stream
        brought it first), is left to `add`. Returns how many became keyed."""
        rows = self._rows
        if rows is None:
            raise TypeError("a fork tracks no keys")
        want: dict[tuple[int, int, int, int], list[str]] = {}
        for key, device_id, start, end, cores in stored:
            i = self._d.index.get(device_id)
            if i is not None and key not in rows:
                want.setdefault((i, int(start), int(end), int(cores)), []).append(key)
        if len(self._assumed) > mark:
            self._floors.rolled_back(mark)
        kept = 0
        while len(self._assumed) > mark:
            row = self._assumed.pop()
            dev, start, end = int(self._dev[row]), int(self._start[row]), int(self._end[row])
            cores = int(self._cores[row])
            keys = want.get((dev, start, end, cores))
            if not keys:
                self._kill(row, assumed=True)
                continue
            self._keyed(row, keys.pop())
            self._sky.settle(dev, start, end, cores)
            kept += 1
        return kept

    def __contains__(self, key: str) -> bool:
        return self._rows is not None and key in self._rows

    def __len__(self) -> int:
        """Allocation rows held."""
        return self._n - len(self._spare)

    def keys(self) -> Iterator[str]:
        return iter(self._rows or ())

    def reservations(self) -> int:
        """Reservations with an allocation held (keys `<reservation id>:...`; 0 for a fork)."""
        return len(self._parts)

    def _sky_of(self) -> Skyline:
        """The index, with a row for every device (a fork shares the devices of
        its parent, which may have gained some since)."""
        if len(self._d.ids) > self._sky.devices:
            self._sky.add_device(len(self._d.ids) - 1)
        return self._sky

    def _put(
        self, device_index: int, start: int, end: int, cores: int, *, assumed: bool = False
    ) -> int:
        if end <= start or cores <= 0:
            raise ValueError(f"empty allocation [{start}, {end}) x {cores}")
        self._sky_of().add(device_index, start, end, cores, assumed=assumed)
        if self._spare:
            row = self._spare.pop()
        else:
            if self._n == self._dev.shape[0]:
                self._grow()
            row = self._n
            self._n += 1
            if self._rows is not None:
                self._key_of.append(None)
        self._dev[row] = device_index
        self._start[row] = start
        self._end[row] = end
        self._cores[row] = cores
        return row

    def _grow(self) -> None:
        cap = self._dev.shape[0] * 2
        self._dev = np.resize(self._dev, cap)
        self._start = np.concatenate((self._start, np.full(cap - self._start.shape[0], _DEAD)))
        self._end = np.concatenate((self._end, np.full(cap - self._end.shape[0], _DEAD)))
        self._cores = np.concatenate((self._cores, np.zeros(cap - self._cores.shape[0], np.int64)))

    def _compact(self) -> None:
        assert self._rows is not None
        keys = list(self._rows)
        rows = np.array([self._rows[k] for k in keys], np.int64)
        m = rows.shape[0]
        cap = max(1024, 1 << int(m * 2).bit_length())
        for name, fill in (("_dev", 0), ("_start", _DEAD), ("_end", _DEAD), ("_cores", 0)):
            old = getattr(self, name)
            new = np.full(cap, fill, np.int64)
            new[:m] = old[rows]
            setattr(self, name, new)
        self._rows = {k: i for i, k in enumerate(keys)}
        self._key_of = list(keys)
        self._n = m
        self._spare = []

    def copy(self) -> CapacityMap:
        """A fork: same devices and latency table, its own copy of the schedule."""
        fork = CapacityMap.__new__(CapacityMap)
        fork._d = self._d
        fork._latency = self._latency
        n = self._n
        room = n + 256
        fork._dev = np.zeros(room, np.int64)
        fork._start = np.full(room, _DEAD, np.int64)
        fork._end = np.full(room, _DEAD, np.int64)
        fork._cores = np.zeros(room, np.int64)
        fork._dev[:n] = self._dev[:n]
        fork._start[:n] = self._start[:n]
        fork._end[:n] = self._end[:n]
        fork._cores[:n] = self._cores[:n]
        fork._n = n
        fork._rows = None
        fork._key_of = []
        fork._parts = {}
        fork._floors = _Floors()
        fork._spare = []
        fork._sky = self._sky.copy()
        fork._assumed = []
        return fork

    # -- queries ----------------------------------------------------------------

    def peak_used(self, start: int, end: int, devices: np.ndarray | None = None) -> np.ndarray:
        """Most cores reserved at any instant of [start, end), per device index
        (for the devices of mask `devices`, default all; 0 for the others)."""
        if end <= start:
            raise ValueError("empty range")
        if end - start > MAX_SPAN_MS:
            raise ValueError("range too long")
        ndev = len(self._d.ids)
        if devices is None:
            idx = np.arange(ndev)
        else:
            idx = np.flatnonzero(devices)
        out = np.zeros(ndev, np.int64)
        out[idx] = Skyline.peak(self._sky_of().groups(idx), idx.shape[0], start, end)
        return out

    def free_over(self, start: int, end: int, devices: np.ndarray | None = None) -> np.ndarray:
        """Cores free during the whole of [start, end), per device index (0 for
        removed devices; exact for the devices of mask `devices`, default all)."""
        free = self._d.cores - self.peak_used(start, end, devices)
        free[~self._d.alive] = 0
        return free

    def offers(self, start: int, end: int, devices: np.ndarray) -> np.ndarray:
        """Cores free during the whole of [start, end) on each device of mask `devices`,
        never below 0 (0 for the other devices): what a decision can place there.

        Equal to `max(free_over(...), 0)` on the mask, but a device whose cores the
        coarse grid shows all reserved in some cell wholly inside [start, end) offers
        0 without a search of its row (the grid holds a lower bound of each cell's
        most reserved), so near saturation only the few others are searched."""
        if end <= start:
            raise ValueError("empty range")
        if end - start > MAX_SPAN_MS:
            raise ValueError("range too long")
        d = self._d
        out = np.zeros(len(d.ids), np.int64)
        idx = np.flatnonzero(devices & d.alive)
        sky = self._sky_of()
        full = sky.saturated(idx, d.cores[idx], start, end)
        if full is not None:
            idx = idx[~full]
        if idx.shape[0]:
            peak = Skyline.peak(sky.groups(idx), idx.shape[0], start, end)
            out[idx] = np.maximum(d.cores[idx] - peak, 0)
        return out

    def used_at(self, t: int) -> np.ndarray:
        return self.peak_used(t, t + 1)

    def earliest_start(
        self,
        need: int,
        duration: int,
        after: int,
        last_start: int | None,
        devices: np.ndarray,
        *,
        no_start_at_after: bool = False,
    ) -> tuple[int, np.ndarray] | None:
        """Earliest start t in (after, last_start] at which the devices of mask
        `devices` have `need` cores free, in all, for [t, t + duration); with
        the free cores per device then. None if there is no such t.
        `no_start_at_after`: the caller knows that `after` itself is no such
        start (else it is checked, for the answer to bound later searches).

        Free cores over [t, t + duration) can only grow when t passes an
        allocation's end, so t is the first of those ends (on these devices)
        that leaves room (`skyline.earliest_start`). The search begins at the
        answer of an earlier one it cannot precede (`_Floors`)."""
        idx = np.flatnonzero(devices)
        key = idx.tobytes()
        generation = self._d.generation
        floor = self._floors.floor(key, idx, need, duration, after, generation)
        if last_start is not None and floor > last_start:
            return None
        # Known that no instant up to the search's first candidate but `after` is a start
        # (a floor's span) and `after` is none: then the answer is an instant at which the
        # reserved cores of a device fall (`skyline.earliest_start`'s `drops`).
        after_is_none = no_start_at_after or floor > after + 1
        if not after_is_none:
            after_is_none = int(self.offers(after, after + duration, devices).sum()) < need
        found = skyline.earliest_start(
            self._sky_of(),
            self._d.cores,
            idx,
            need,
            duration,
            after,
            last_start,
            floor=floor - 1 if floor > after else None,
            drops=after_is_none,
        )
        if found is None:
            return None
        t, free_idx = found
        if after_is_none or floor > after:
            # `after` is no start (checked, or inside a floor's span of none): the
            # answer bounds later searches
            self._floors.note(
                _Found(
                    key, devices.copy(), need, duration, after, t, len(self._assumed), generation
                )
            )
        free = np.zeros(len(self._d.ids), np.int64)
        free[idx] = free_idx
        return t, free

    def schedules(self, start: int, end: int) -> dict[str, list[ScheduledRow]]:
        """The keyed allocations overlapping [start, end), per device id, by start."""
        out: dict[str, list[ScheduledRow]] = {}
        if self._rows is None:
            return out
        n = self._n
        idx = np.flatnonzero((self._start[:n] < end) & (self._end[:n] > start))
        for r in idx.tolist():
            key = self._key_of[r]
            if key is None:
                continue
            out.setdefault(self._d.ids[int(self._dev[r])], []).append(
                ScheduledRow(key, int(self._start[r]), int(self._end[r]), int(self._cores[r]))
            )
        for rows in out.values():
            rows.sort(key=lambda x: (x.start, x.key))
        return out

    def allocations(self) -> list[tuple[str, Allocation]]:
        """Every keyed allocation (for checks and tests)."""
        if self._rows is None:
            return []
        return [
            (
                k,
                Allocation(
                    self._d.ids[int(self._dev[r])],
                    int(self._cores[r]),
                    int(self._start[r]),
                    int(self._end[r]),
                ),
            )
            for k, r in self._rows.items()
        ]
