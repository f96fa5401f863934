"""Components that buffer until shutdown: hash_rollup (counts and sums per key)
and sort (by key fields). Both emit at shutdown and checkpoint what they hold.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from lightpath.graph.components.base import (
    BATCH,
    Component,
    ComponentError,
    Record,
    field_list,
    numbers,
)


def _add(a: int | float, text: str) -> int | float:
    try:
        return a + int(text)
    except ValueError:
        return a + float(text)


class HashRollup(Component):
    """hash_rollup: per value of `key` (comma list) the count and the sums of `sum`
    fields; emitted, sorted by key, at shutdown."""

    def start(self) -> None:
        self._key = field_list(self.param("key"))
        self._sum = field_list(self.params.get("sum", ""))
        self._acc: dict[Any, list[Any]] = {}  # key: a str, or a tuple of several
        self._getkey = operator.itemgetter(*self._key)

    def compute(self, port: str, record: Record) -> None:
        try:
            k = self._getkey(record)
            acc = self._acc.get(k)
            if acc is None:
                acc = self._acc[k] = [0] * (1 + len(self._sum))
            acc[0] += 1
            for i, f in enumerate(self._sum, 1):
                acc[i] = _add(acc[i], record[f])
        except KeyError as exc:
            raise ComponentError(f"record has no field {exc}") from None
        except ValueError as exc:
            raise ComponentError(f"cannot sum: {exc}") from None

    def compute_batch(self, port: str, records: list[Record]) -> None:
        acc, getkey = self._acc, self._getkey
        get = acc.get
        width = 1 + len(self._sum)
        sums = tuple(enumerate(self._sum, 1))
        try:
            for record in records:
                k = getkey(record)
                a = get(k)
                if a is None:
                    a = acc[k] = [0] * width
                a[0] += 1
                for i, f in sums:
                    text = record[f]
                    try:
                        a[i] += int(text)
                    except ValueError:
                        a[i] += float(text)
        except KeyError as exc:
            raise ComponentError(f"record has no field {exc}") from None
        except ValueError as exc:
            raise ComponentError(f"cannot sum: {exc}") from None

    def shutdown(self) -> None:
        rolled: list[Record] = []
        for k in sorted(self._acc):
            acc = self._acc[k]
            keys = (k,) if len(self._key) == 1 else k
            r: Record = dict(zip(self._key, keys, strict=True))
            r["count"] = str(acc[0])
            for i, f in enumerate(self._sum, 1):
                r[f"sum_{f}"] = str(acc[i])
            rolled.append(r)
        self._acc.clear()
        if rolled:
            self.batch_outputs["out"](rolled)

    def snapshot(self) -> Any:
        return self._acc

    def restore(self, state: Any) -> None:
        self._acc = state


class Sort(Component):
    """sort: by `key` fields (comma list), `numeric` and `reverse` ("true"/"false");
    a stable sort emitted at shutdown.

    Each record's sort key is computed as it arrives (a key the records lack,
    or a number that is not one, fails there), so shutdown, which everything
    downstream waits for, only orders the keys and emits."""

    def start(self) -> None:
        keys = field_list(self.param("key"))
        numeric = self.params.get("numeric", "false") == "true"
        self._reverse = self.params.get("reverse", "false") == "true"
        get = operator.itemgetter(*keys)
        if numeric and len(keys) == 1:
            self._keys_of: Callable[[list[Record]], list[Any]] = lambda rs: numbers(
                list(map(get, rs))
            )
        elif numeric:
            self._keys_of = lambda rs: [tuple(map(float, k)) for k in map(get, rs)]
        else:
            self._keys_of = lambda rs: list(map(get, rs))
        self._records: list[Record] = []
        self._keys: list[Any] = []
        self._emitted: tuple[list[Record], list[Any], list[int]] | None = None

    def _add(self, records: list[Record]) -> None:
        try:
            keys = self._keys_of(records)
        except (KeyError, ValueError) as exc:
            raise ComponentError(f"cannot sort: {exc!r}") from None
        self._records.extend(records)
        self._keys.extend(keys)

    def compute(self, port: str, record: Record) -> None:
        self._add([record])

    def compute_batch(self, port: str, records: list[Record]) -> None:
        self._add(records)

    def shutdown(self) -> None:
        records, keys = self._records, self._keys
        self._records, self._keys = [], []
        order = sorted(range(len(keys)), key=keys.__getitem__, reverse=self._reverse)
        out = self.batch_outputs["out"]
        for i in range(0, len(order), BATCH):
            out(list(map(records.__getitem__, order[i : i + BATCH])))
        # Not freed here, where everything downstream waits (freeing a million
        # records takes a tenth of a second or more), but with the component.
        self._emitted = (records, keys, order)

    def snapshot(self) -> Any:
        return self._records

    def restore(self, state: Any) -> None:
        self._records, self._keys = [], []
        self._add(state)


# ---------------------------------------------------------------- external program
