"""The instants at which the reserved cores of a set of devices fall, sorted, for
the earliest-start search (issue 15): free cores over a window can only grow
as its start passes such an instant (an allocation ends there and fewer cores
start again: the end of one reservation where a back-to-back one of as many
cores begins is none), so the candidates of `skyline.earliest_start` are
these, visited in order. Asking the rows of every device for its next end
after t costs O(k log m) per step; here it is one binary search.

An `EndSet` holds, for one set of devices, a sorted array of those instants
with how many of the devices fall at each (built from the rows once), plus the
changes since (`side`: instant -> change of that count), which every
allocation added to or removed from a member device updates in O(1), assumed
or not (`skyline._Bucket.insert_span` says where a device's falls changed). A
query merges the two: the first k distinct instants after t whose count is
positive, O(log n + k + s) for the s pending changes; once there are many, the
set is rebuilt from the rows.

`EndSets` keeps the sets of the last few device sets searched (all devices,
all of a kind, the named devices of a request), keyed by the device indices,
the least recently used evicted first.
"""

from __future__ import annotations

from bisect import bisect_right, insort

import numpy as np

MAX_SIDE = 512  # pending changes before a set is rebuilt from the rows
MAX_SETS = 8


class EndSet:
    def __init__(self, member: np.ndarray, ends: np.ndarray, counts: np.ndarray):
        self.member = member  # bool per device index (devices added later: not members)
        self.ends = ends  # sorted distinct instants (int64)
        self.counts = counts  # devices of the set falling at each
        self.side: dict[int, int] = {}  # instant -> change of its count since the build
        self.side_keys: list[int] = []  # the keys of side, sorted

    def change(self, end: int, delta: int) -> None:
        old = self.side.get(end)
        if old is None:
            self.side[end] = delta
            insort(self.side_keys, end)
            return
        new = old + delta
        if new == 0:
            del self.side[end]
            self.side_keys.pop(bisect_right(self.side_keys, end) - 1)
        else:
            self.side[end] = new

    def next_ends(self, t: int, k: int) -> list[int]:
        """The first k distinct times after t at which some device of the set falls."""
        i = int(np.searchsorted(self.ends, t, side="right"))
        if not self.side:
            return self.ends[i : i + k].tolist()
        side, keys = self.side, self.side_keys
        j = bisect_right(keys, t)
        n = k
        while True:
            # every instant up to the last of the next n built ones is among those and
            # the changes up to it: enough if k of them count, else look twice as far
            base_t = self.ends[i : i + n].tolist()
            more = len(base_t) == n
            changed = keys[j : bisect_right(keys, base_t[-1]) if more else len(keys)]
            if not changed:
                return base_t[:k]
            base = dict(zip(base_t, self.counts[i : i + n].tolist(), strict=True))
            out = []
            for c in sorted(base.keys() | set(changed)):
                if base.get(c, 0) + side.get(c, 0) > 0:
                    out.append(c)
                    if len(out) == k:
                        return out
            if not more:
                return out
            n *= 2


class EndSets:
    def __init__(self) -> None:
        self.sets: dict[bytes, EndSet] = {}

    def change(self, device: int, end: int, delta: int) -> None:
        for s in self.sets.values():
            if device < s.member.shape[0] and s.member[device]:
                s.change(end, delta)

    def get(self, key: bytes) -> EndSet | None:
        s = self.sets.pop(key, None)
        if s is None or len(s.side) > MAX_SIDE:
            return None
        self.sets[key] = s  # the most recently used last: evicted last
        return s

    def put(self, key: bytes, s: EndSet) -> None:
        if len(self.sets) >= MAX_SETS:
            del self.sets[next(iter(self.sets))]
        self.sets[key] = s
