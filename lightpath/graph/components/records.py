"""Record logic, one record in and at most one out per flow: filter, reformat,
replicate, gather.

filter and reformat compile their parameters once into Python functions (for
a record and for a batch); replicate and gather pass each record or batch on
unchanged (the copying and merging are in the flows).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from itertools import compress, repeat
from typing import Any

from lightpath.graph.components.base import (
    Component,
    ComponentError,
    Record,
    discard_batch,
    discard_record,
    field_list,
    number_or_none,
    numbers,
)

_TOKENS = ("<=", ">=", "==", "!=", "~", "<", ">")
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}


def _compile(name: str, source: str, constants: Mapping[str, Any]) -> Any:
    """Compile generated `source` (constants bound by name, never pasted in) and return `name`."""
    namespace = dict(constants)
    exec(compile(source, f"<{name}>", "exec"), namespace)
    return namespace[name]


class Filter(Component):
    """filter: `where` is "field op value" (op: == != < <= > >= or ~ for contains);
    numbers compare as numbers. Selected records go to out, the others to reject.

    The test is written out as one expression (for a record, and as a list
    comprehension for a batch) rather than calling an operator per record."""

    def start(self) -> None:
        where = self.param("where")
        for token in _TOKENS:
            left, found, right = where.partition(f" {token} ")
            if found:
                break
        else:
            raise ComponentError(f'where "{where}" is not "field op value"')
        name, value = left.strip(), right.strip()
        self._out = self.outputs.get("out", discard_record)
        self._reject = self.outputs.get("reject", discard_record)
        self._out_batch = self.batch_outputs.get("out", discard_batch)
        self._reject_batch = self.batch_outputs.get("reject", discard_batch)
        number = number_or_none(value) if token != "~" else None
        if token == "~":
            expr = "V in r[N]"
        elif number is not None:
            expr = f"float(r[N]) {token} V"
        else:
            expr = f"r[N] {token} V"
        constants = {"N": name, "V": value if number is None else number}
        self._pred = _compile("test", f"def test(r):\n    return {expr}\n", constants)
        if number is not None:
            # A batch's numbers are read in one go (see `numbers`), then compared.
            get, op = operator.itemgetter(name), _OPS[token]
            self._mask = lambda rs: list(map(op, numbers(list(map(get, rs))), repeat(number)))
        else:
            self._mask = _compile(
                "mask", f"def mask(rs):\n    return [{expr} for r in rs]\n", constants
            )

    @staticmethod
    def _tested(test: Callable[[Any], Any], arg: Any) -> Any:
        try:
            return test(arg)
        except KeyError as exc:
            raise ComponentError(f"record has no field {exc}") from None
        except ValueError as exc:
            raise ComponentError(f"cannot compare: {exc}") from None

    def compute(self, port: str, record: Record) -> None:
        if self._tested(self._pred, record):
            self._out(record)
        else:
            self._reject(record)

    def compute_batch(self, port: str, records: list[Record]) -> None:
        mask = self._tested(self._mask, records)
        out, reject = self._out_batch, self._reject_batch
        if out is not discard_batch:
            selected = list(compress(records, mask))
            if selected:
                out(selected)
        if reject is not discard_batch:
            rejected = list(compress(records, map(operator.not_, mask)))
            if rejected:
                reject(rejected)


class Reformat(Component):
    """reformat: `rename` "a:b,..", `set` "k=v,..", `upper` / `lower` field lists,
    then `keep` (fields in order; default all). Makes a new record.

    The steps are written out as straight-line code for these parameters (a
    loop body for a batch); with only `set` and `keep` the new record is built
    in one expression, without copying the old one."""

    def start(self) -> None:
        rename = [tuple(p.split(":", 1)) for p in field_list(self.params.get("rename", ""))]
        sets = [tuple(p.split("=", 1)) for p in field_list(self.params.get("set", ""))]
        upper = field_list(self.params.get("upper", ""))
        lower = field_list(self.params.get("lower", ""))
        keep = field_list(self.params.get("keep", ""))
        self._out = self.outputs["out"]
        self._out_batch = self.batch_outputs["out"]
        for pair in (*rename, *sets):
            if len(pair) != 2:
                raise ComponentError(f"malformed pair {pair[0]!r} in rename/set")
        # Names and values are bound as constants F0, F1, ... rather than pasted in.
        constants: dict[str, str] = {}

        def const(text: str) -> str:
            name = f"F{len(constants)}"
            constants[name] = text
            return name

        if keep and not rename and not upper and not lower:
            value = {k: const(v) for k, v in sets}  # the last `set` of a field wins
            expr = (
                "{"
                + ", ".join(f"{const(f)}: {value.get(f) or f'r[{const(f)}]'}" for f in keep)
                + "}"
            )
            self._one = _compile("one", f"def one(r):\n    return {expr}\n", constants)
            self._many = _compile(
                "many", f"def many(rs):\n    return [{expr} for r in rs]\n", constants
            )
            return
        steps = ["r = dict(r)"]
        steps += [f"r[{const(new)}] = r.pop({const(old)})" for old, new in rename]
        steps += [f"r[{const(k)}] = {const(v)}" for k, v in sets]
        for f in upper:
            steps.append(f"r[{(c := const(f))}] = r[{c}].upper()")
        for f in lower:
            steps.append(f"r[{(c := const(f))}] = r[{c}].lower()")
        result = "{" + ", ".join(f"{(c := const(f))}: r[{c}]" for f in keep) + "}" if keep else "r"
        body = "".join(f"        {step}\n" for step in steps)
        self._one = _compile(
            "one",
            "def one(r):\n" + body.replace("        ", "    ") + f"    return {result}\n",
            constants,
        )
        self._many = _compile(
            "many",
            "def many(rs):\n    out = []\n    append = out.append\n    for r in rs:\n"
            + body
            + f"        append({result})\n    return out\n",
            constants,
        )

    def compute(self, port: str, record: Record) -> None:
        try:
            r = self._one(record)
        except KeyError as exc:
            raise ComponentError(f"record has no field {exc}") from None
        self._out(r)

    def compute_batch(self, port: str, records: list[Record]) -> None:
        try:
            out = self._many(records)
        except KeyError as exc:
            raise ComponentError(f"record has no field {exc}") from None
        self._out_batch(out)


class Replicate(Component):
    """replicate: every flow of its out port gets each record (a batch is lent to each)."""

    def start(self) -> None:
        self._out = self.outputs["out"]
        self._out_batch = self.batch_outputs["out"]

    def compute(self, port: str, record: Record) -> None:
        self._out(record)

    def compute_batch(self, port: str, records: list[Record]) -> None:
        self._out_batch(records)


class Gather(Replicate):
    """gather: merges its input flows into one (each record or batch passes on as
    replicate passes it: the merging is in the flows, not the component)."""
