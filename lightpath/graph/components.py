"""The component library and the contract a folded process calls (GF-5).

A component is called, never calls back: the folded process (executor.py)
calls `compute(port, record)` for each work element arriving on an input
port, and the component passes results downstream by calling the emitter of
an output port (`self.outputs["out"](record)`), which is a direct call into the
next member's compute when that member shares the process, or a buffered
channel when it does not. Work elements are records: dicts of field name to
text, read from and written to tab-separated files with a header line.

A component may also take work elements a batch at a time:
`compute_batch(port, records)` gets a list of records that arrived on one
port, in order, and passes results on as lists through
`self.batch_outputs[port]`, again a direct call into the next member. In
CPython a call costs about as much as a record's own work, so a folded set
whose members take batches moves each batch through the set with a few
calls rather than a few calls per record. `compute` stays the contract every
component honours; `compute_batch` is optional (by default it calls compute
for each record) and the library components implement both with the same
effect. A batch is lent, not given: a member must not modify a list it
receives, nor the records in it (replicate hands one list to several flows),
and copies what it keeps (`list.extend` does).

Roots are driven by sources, the seed's root compute with its return codes:
a `Source.compute()` pushes some records through the set and answers
KEEP_GOING, ERROR (message in `source.error`), REACHED_EOF or GOT_BLIP
(control message in `source.blip`).

Beyond compute, a component may buffer until shutdown (`shutdown` may emit,
as a hash rollup does), react to blips (`process_blip`), and save and restore
its state for checkpoints (`snapshot` / `restore`, GF-5).
"""

from __future__ import annotations

import enum
import operator
import os
import select
import shlex
import subprocess
import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import compress, repeat
from typing import Any, ClassVar

Record = dict[str, str]
Emit = Callable[[Record], None]
EmitBatch = Callable[[list[Record]], None]

# Records per batch where a component makes the batches (a file's lines, a
# sort's output at shutdown); batches arriving from upstream keep their size.
BATCH = 1024


class ReturnCode(enum.IntEnum):
    """What a root's compute answers the folded process (seed §2.2.3)."""

    KEEP_GOING = 0
    ERROR = 1
    REACHED_EOF = 2
    GOT_BLIP = 3


@dataclass(frozen=True)
class Blip:
    """A control message in the stream of work elements (e.g. a checkpoint)."""

    kind: str
    id: int

    CHECKPOINT: ClassVar[str] = "checkpoint"


class ComponentError(Exception):
    """Raised by a component's code: the folded process reports it as ERROR of that component."""


def record_size(record: Record) -> int:
    """Bytes of the record as a line of its tab-separated file (GF-6 flow bytes)."""
    return sum(map(len, record.values())) + len(record)


@lru_cache(maxsize=256)
def record_parser(fields: tuple[str, ...]) -> Callable[[list[str]], list[Record]]:
    """A function making records with `fields` of tab-separated lines, one list
    comprehension per batch (unpacking checks each line's width: ValueError if
    one has another, see `first_bad_line`). Generated for these fields: the
    names are written in as literals (repr), so a record is built in one step
    rather than by zip."""
    names = [f"v{i}" for i in range(len(fields))]
    target = "".join(f"{n}, " for n in names)
    items = ", ".join(f"{f!r}: {n}" for f, n in zip(fields, names, strict=True))
    source = (
        "def parse(lines):\n"
        f"    return [{{{items}}} for ({target}) in map(split, lines, repeat(TAB))]\n"
    )
    namespace: dict[str, Any] = {"split": str.split, "repeat": repeat, "TAB": "\t"}
    exec(compile(source, f"<records of {len(fields)} fields>", "exec"), namespace)
    parse: Callable[[list[str]], list[Record]] = namespace["parse"]
    return parse


def first_bad_line(lines: Sequence[str], width: int) -> tuple[int, int]:
    """Index and width of the first line without `width` tab-separated fields."""
    tabs = width - 1
    for i, line in enumerate(lines):
        if line.count("\t") != tabs:
            return i, line.count("\t") + 1
    raise ValueError("every line has the width")


@dataclass
class Context:
    """What a component knows of where it runs."""

    component: str
    instance: int = 0
    degree: int = 1
    # A file_input root sends a checkpoint blip every this many records (0: never).
    checkpoint_every: int = 0
    # Records per batch a root makes (a file's lines).
    batch: int = BATCH


class Component:
    """Base of every component. Subclasses override what they need."""

    def __init__(self, params: Mapping[str, str], context: Context):
        self.params = dict(params)
        self.context = context
        # Set by the executor before start(): output port -> emitter of one
        # record, and of a batch (a list) of records.
        self.outputs: dict[str, Emit] = {}
        self.batch_outputs: dict[str, EmitBatch] = {}

    @property
    def id(self) -> str:
        return self.context.component

    def param(self, name: str, default: str | None = None) -> str:
        value = self.params.get(name, default)
        if value is None:
            raise ComponentError(f'parameter "{name}" is required')
        return value

    def start(self) -> None:
        """Called once outputs are wired, before any data."""

    def sources(self) -> Sequence[Source]:
        """Roots this component drives besides calls from upstream (its own input, responses)."""
        return ()

    def compute(self, port: str, record: Record) -> None:
        raise ComponentError(f"{type(self).__name__} takes no input (port {port})")

    def compute_batch(self, port: str, records: list[Record]) -> None:
        """`records` arrived on `port`, in order (optional; the same as compute on each).

        A component that overrides this gets one call per batch; the executor
        then counts and times calls of batches (GF-6)."""
        compute = self.compute
        for record in records:
            compute(port, record)

    def flush(self) -> None:
        """Called after each batch a source pushed: send what is buffered for the outside."""

    def shutdown(self) -> None:
        """All upstream is done; may emit."""

    def process_blip(self, blip: Blip) -> None:
        """A blip passes through, upstream first; may emit."""

    def snapshot(self) -> Any:
        """State to save in a checkpoint (picklable)."""
        return None

    def restore(self, state: Any) -> None:
        """Resume from what snapshot() returned."""

    def close(self) -> None:
        """Release resources (always called, also after an error)."""

    def pair(self, other: Component) -> None:
        """Called on the request half of a split component with its response half."""


class Source:
    """The compute of a root as the folded process drives it (GF-5 return codes)."""

    # Member this source belongs to, for CPU attribution.
    owner: str = ""
    # Members whose shutdown waits for this source to reach EOF.
    feeds: frozenset[str] = frozenset()
    # Checkpoint blips come from sources that say so; the set aligns them.
    emits_blips: bool = False

    def __init__(self) -> None:
        self.blip: Blip | None = None
        self.error = ""

    def filenos(self) -> Sequence[int]:
        """Descriptors to wait on; none means call compute whenever `ready`."""
        return ()

    @property
    def ready(self) -> bool:
        """True when compute should be called without waiting for a descriptor."""
        return not self.filenos()

    def compute(self) -> ReturnCode:
        raise NotImplementedError

    def snapshot(self) -> Any:
        return None

    def restore(self, state: Any) -> None:
        pass

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- files


class FileReader(Source):
    """Reads a tab-separated file with a header line and emits its records in
    batches; a checkpoint blip every `checkpoint_every` records (0: never).
    Flow bytes are exact."""

    emits_blips = True
    CHUNK = 1 << 18

    def __init__(
        self,
        path: str,
        emit: EmitBatch,
        *,
        owner: str,
        feeds: frozenset[str],
        checkpoint_every: int = 0,
        counter: list[int] | None = None,
        batch: int = BATCH,
    ):
        super().__init__()
        self.path = path
        # Called with each batch of (at most `batch`) records, in file order.
        self.emit = emit
        self.batch = max(1, batch)
        self.owner = owner
        self.feeds = feeds
        self.checkpoint_every = checkpoint_every
        # [records, bytes] shared with the flow's metrics.
        self.counter = counter if counter is not None else [0, 0]
        self._file: Any = None
        self._fields: tuple[str, ...] = ()
        self._parse = record_parser(())
        self._lines: list[str] = []
        self._pos = 0  # next line in _lines
        self._offset = 0  # byte offset of the next unread line
        self._chunk_start = 0  # byte offset of _lines[0]
        self._eof = False
        self._blips = 0
        self._restored = False

    def _open(self) -> None:
        try:
            self._file = open(self.path, "rb")
        except OSError as exc:
            raise ComponentError(f"cannot read {self.path}: {exc.strerror}") from exc
        header = self._file.readline()
        if not header:
            self._fields = ()
            self._eof = True
            return
        self._fields = tuple(header.decode().rstrip("\n").split("\t"))
        self._parse = record_parser(self._fields)
        if not self._restored:
            self._offset = self._chunk_start = len(header)
            self.counter[1] += len(header)
        else:
            self._file.seek(self._offset)
            self._chunk_start = self._offset

    def compute(self) -> ReturnCode:
        if self._file is None:
            self._open()
        if self._pos >= len(self._lines):
            if self._eof or not self._refill():
                return ReturnCode.REACHED_EOF
        lines, pos = self._lines, self._pos
        end = len(lines)
        every = self.checkpoint_every
        blip_due = False
        if every:
            to_blip = every - (self.counter[0] % every)
            if end - pos >= to_blip:
                end, blip_due = pos + to_blip, True
        parse, emit, counter, batch = self._parse, self.emit, self.counter, self.batch
        for start in range(pos, end, batch):
            stop = min(start + batch, end)
            chunk = lines[start:stop]
            try:
                records = parse(chunk)
            except ValueError:
                return self._bad_line(start, chunk)
            emit(records)
            counter[0] += stop - start
        self._pos = end
        if end == len(lines):
            self._offset = self._chunk_end
        else:
            self._offset = self._byte_offset(end)
        if blip_due:
            self._blips += 1
            self.blip = Blip(Blip.CHECKPOINT, self._blips)
            return ReturnCode.GOT_BLIP
        return ReturnCode.KEEP_GOING

    def _bad_line(self, start: int, chunk: list[str]) -> ReturnCode:
        """Emit the lines before the first malformed one, then answer ERROR naming it."""
        width = len(self._fields)
        i, found = first_bad_line(chunk, width)
        if i:
            self.emit(self._parse(chunk[:i]))
            self.counter[0] += i
        self._pos = start + i
        self.error = (
            f"{self.path}: line after byte {self._byte_offset(start + i)} has {found} "
            f"fields, the header {width}"
        )
        return ReturnCode.ERROR

    def _byte_offset(self, line: int) -> int:
        consumed = self._lines[:line]
        return self._chunk_start + len("\n".join(consumed).encode()) + (1 if consumed else 0)

    def _refill(self) -> bool:
        data = self._file.read(self.CHUNK)
        if not data:
            self._eof = True
            return False
        if not data.endswith(b"\n"):
            rest = self._file.readline()
            data += rest
            if not rest.endswith(b"\n"):
                data += b"\n"  # last line without newline
        self._chunk_start = self._offset
        self._chunk_end = self._offset + len(data)
        self.counter[1] += len(data)
        self._lines = data.decode().split("\n")
        self._lines.pop()  # after the final newline
        self._pos = 0
        return True

    def snapshot(self) -> Any:
        return {"offset": self._offset, "records": self.counter[0], "blips": self._blips}

    def restore(self, state: Any) -> None:
        self._offset = state["offset"]
        self.counter[0] = state["records"]
        self.counter[1] = state["offset"]
        self._blips = state["blips"]
        self._restored = True

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class FileWriter:
    """Appends records to a tab-separated file; the header is the first record's fields."""

    BUFFER = 1 << 16

    def __init__(self, path: str):
        self.path = path
        self._file: Any = None
        self._fields: tuple[str, ...] = ()
        self._get: Callable[[Record], Any] | None = None
        self._buf: list[str] = []
        self._size = 0
        self._truncate_at: int | None = None

    def _open(self) -> None:
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        if self._truncate_at is None:
            self._file = open(self.path, "wb")
        else:
            self._file = open(self.path, "r+b")
            self._file.truncate(self._truncate_at)
            self._file.seek(self._truncate_at)

    def _header(self, record: Record) -> Callable[[Record], Any]:
        """The first record names the columns (also when restored before any was written)."""
        self._fields = tuple(record)
        get = self._get = operator.itemgetter(*self._fields)
        self._buf.append("\t".join(self._fields) + "\n")
        return get

    def _line(self, record: Record) -> str:
        """One record as a line; a field it lacks is written empty."""
        return "\t".join([record.get(f, "") for f in self._fields]) + "\n"

    def __call__(self, record: Record) -> None:
        get = self._get or self._header(record)
        try:
            values = get(record)
        except KeyError:
            line = self._line(record)
        else:
            line = "\t".join(values) + "\n" if len(self._fields) > 1 else f"{values}\n"
        self._buf.append(line)
        self._size += len(line)
        if self._size >= self.BUFFER:
            self.flush()

    def write_batch(self, records: list[Record]) -> None:
        """Append a batch of records (one join per batch)."""
        if not records:
            return
        get = self._get or self._header(records[0])
        try:
            if len(self._fields) > 1:
                text = "\n".join(map("\t".join, map(get, records))) + "\n"
            else:
                text = "\n".join(map(str, map(get, records))) + "\n"
        except KeyError:
            text = "".join(map(self._line, records))
        self._buf.append(text)
        self._size += len(text)
        if self._size >= self.BUFFER:
            self.flush()

    def flush(self) -> None:
        if self._file is None:
            self._open()
        if self._buf:
            self._file.write("".join(self._buf).encode())
            self._buf.clear()
            self._size = 0

    def finish(self) -> None:
        self.flush()
        self._file.close()

    def snapshot(self) -> Any:
        self.flush()
        self._file.flush()
        os.fsync(self._file.fileno())
        return {"offset": self._file.tell(), "fields": self._fields}

    def restore(self, state: Any) -> None:
        self._truncate_at = state["offset"]
        if state["fields"]:
            self._fields = tuple(state["fields"])
            self._get = operator.itemgetter(*self._fields)

    def close(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()


class FileInput(Component):
    """file_input: a root reading a tab-separated file (partition i of "{part}" paths)."""

    def sources(self) -> Sequence[Source]:
        path = self.param("path")
        if self.context.degree > 1:
            path = path.replace("{part}", str(self.context.instance))
        self._reader = FileReader(
            path,
            self.batch_outputs["out"],
            owner=self.id,
            feeds=frozenset({self.id}),
            checkpoint_every=self.context.checkpoint_every,
            batch=self.context.batch,
        )
        return (self._reader,)


class FileOutput(Component):
    """file_output: writes its records to a tab-separated file."""

    def start(self) -> None:
        path = self.param("path")
        if self.context.degree > 1:
            path = path.replace("{part}", str(self.context.instance))
        self.writer = FileWriter(path)

    def compute(self, port: str, record: Record) -> None:
        self.writer(record)

    def compute_batch(self, port: str, records: list[Record]) -> None:
        self.writer.write_batch(records)

    def shutdown(self) -> None:
        self.writer.finish()

    def snapshot(self) -> Any:
        return self.writer.snapshot()

    def restore(self, state: Any) -> None:
        self.writer.restore(state)

    def close(self) -> None:
        self.writer.close()


# ---------------------------------------------------------------- record logic

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


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


# An integer written in at most this many characters has at most 15 digits,
# so float() reads it exactly (below 2**53).
_EXACT_INT_CHARS = 15


def numbers(texts: list[str]) -> list[int] | list[float]:
    """The numbers float() reads in `texts`, for comparing and ordering.

    int() reads a short integer about twice as fast as float(); when every
    text is an integer of at most 15 characters the ints are exactly the
    floats float() would give (and compare with any number alike), so they
    are returned instead. Otherwise, float() of each: the same values, and the
    same ValueError for a text that is no number."""
    try:
        if texts and max(map(len, texts)) <= _EXACT_INT_CHARS:
            return list(map(int, texts))
    except (TypeError, ValueError):
        pass
    return list(map(float, texts))


def _fields(text: str) -> list[str]:
    return [f.strip() for f in text.split(",") if f.strip()]


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
        self._out = self.outputs.get("out", _discard)
        self._reject = self.outputs.get("reject", _discard)
        self._out_batch = self.batch_outputs.get("out", discard_batch)
        self._reject_batch = self.batch_outputs.get("reject", discard_batch)
        number = _number(value) if token != "~" else None
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


def _discard(record: Record) -> None:
    pass


def discard_batch(records: list[Record]) -> None:
    """Where the batches of an output port without flows go."""


class Reformat(Component):
    """reformat: `rename` "a:b,..", `set` "k=v,..", `upper` / `lower` field lists,
    then `keep` (fields in order; default all). Makes a new record.

    The steps are written out as straight-line code for these parameters (a
    loop body for a batch); with only `set` and `keep` the new record is built
    in one expression, without copying the old one."""

    def start(self) -> None:
        rename = [tuple(p.split(":", 1)) for p in _fields(self.params.get("rename", ""))]
        sets = [tuple(p.split("=", 1)) for p in _fields(self.params.get("set", ""))]
        upper = _fields(self.params.get("upper", ""))
        lower = _fields(self.params.get("lower", ""))
        keep = _fields(self.params.get("keep", ""))
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


def _add(a: int | float, text: str) -> int | float:
    try:
        return a + int(text)
    except ValueError:
        return a + float(text)


class HashRollup(Component):
    """hash_rollup: per value of `key` (comma list) the count and the sums of `sum`
    fields; emitted, sorted by key, at shutdown."""

    def start(self) -> None:
        self._key = _fields(self.param("key"))
        self._sum = _fields(self.params.get("sum", ""))
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
        keys = _fields(self.param("key"))
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


class _ProgramOutput(Source):
    def __init__(self, owner: Interface):
        super().__init__()
        self.iface = owner
        self.owner = owner.id

    def filenos(self) -> Sequence[int]:
        return () if self.iface.drained else (self.iface.stdout_fd,)

    @property
    def ready(self) -> bool:
        return self.iface.drained

    def compute(self) -> ReturnCode:
        if self.iface.drained:
            return ReturnCode.REACHED_EOF
        self.iface.read_available()
        return ReturnCode.KEEP_GOING


class Interface(Component):
    """interface: pipes records, as tab-separated lines, through an external
    program (`command`) and emits what it prints, split into the input's fields
    (or `fields`). Not foldable: the program is not a function a folded process
    can call.

    The program's state cannot be saved, so at a checkpoint blip the interface
    closes the program's input, emits everything it printed, and starts it
    afresh: right for programs that treat their input line by line (tr, sed,
    awk filters), whatever they buffer.
    """

    def start(self) -> None:
        self._argv = shlex.split(self.param("command"))
        if not self._argv:
            raise ComponentError("command is empty")
        self._out_fields: tuple[str, ...] = tuple(_fields(self.params.get("fields", "")))
        self._in_fields: tuple[str, ...] = ()
        self._pending: list[str] = []
        self._pending_size = 0
        self._emit = self.batch_outputs["out"]
        self._launch()

    def _launch(self) -> None:
        try:
            self._proc = subprocess.Popen(
                self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
            )
        except OSError as exc:
            raise ComponentError(f"cannot start {self._argv[0]}: {exc.strerror}") from exc
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self.stdin_fd = self._proc.stdin.fileno()
        self.stdout_fd = self._proc.stdout.fileno()
        os.set_blocking(self.stdin_fd, False)
        os.set_blocking(self.stdout_fd, False)
        self._partial = b""
        self.drained = False

    def _finish_program(self) -> None:
        """Close the program's input, emit all it prints, and check how it ended."""
        self.flush()
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.close()
        while not self.drained:
            self._wait_output()
        if self._partial:
            self._emit_lines([self._partial.decode().rstrip("\n")])
            self._partial = b""
        self._proc.stdout.close()
        code = self._proc.wait()
        if code != 0:
            raise ComponentError(f"{self.param('command')!r} exited with status {code}")

    def sources(self) -> Sequence[Source]:
        return (_ProgramOutput(self),)

    def _first(self, record: Record) -> None:
        self._in_fields = tuple(record)
        if not self._out_fields:
            self._out_fields = self._in_fields

    def compute(self, port: str, record: Record) -> None:
        if not self._in_fields:
            self._first(record)
        line = "\t".join([record.get(f, "") for f in self._in_fields]) + "\n"
        self._pending.append(line)
        self._pending_size += len(line)
        if self._pending_size >= 1 << 16:
            self.flush()

    def compute_batch(self, port: str, records: list[Record]) -> None:
        if not records:
            return
        if not self._in_fields:
            self._first(records[0])
        fields = self._in_fields
        try:
            if len(fields) > 1:
                text = "\n".join(map("\t".join, map(operator.itemgetter(*fields), records))) + "\n"
            else:
                text = "\n".join([r[fields[0]] for r in records]) + "\n"
        except KeyError:  # a field it lacks goes as empty
            text = "".join(["\t".join([r.get(f, "") for f in fields]) + "\n" for r in records])
        self._pending.append(text)
        self._pending_size += len(text)
        if self._pending_size >= 1 << 16:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        data = memoryview("".join(self._pending).encode())
        self._pending.clear()
        self._pending_size = 0
        while data:
            try:
                n = os.write(self.stdin_fd, data)
                data = data[n:]
            except BlockingIOError:
                # The program may be waiting for us to read its output.
                readable, _, _ = select.select([self.stdout_fd], [self.stdin_fd], [])
                if readable:
                    self.read_available()
            except BrokenPipeError:
                raise ComponentError(self._exit_message("stopped reading its input")) from None

    def read_available(self) -> None:
        """Read what the program has printed, without waiting."""
        try:
            chunk = os.read(self.stdout_fd, 1 << 16)
        except BlockingIOError:
            return  # readiness seen earlier was consumed by a flush since
        if not chunk:
            self.drained = True
            return
        data = self._partial + chunk
        cut = data.rfind(b"\n") + 1
        self._partial = data[cut:]
        if cut:
            self._emit_lines(data[:cut].decode().split("\n")[:-1])

    def _wait_output(self) -> None:
        select.select([self.stdout_fd], [], [])
        self.read_available()

    def _emit_lines(self, lines: list[str]) -> None:
        fields = self._out_fields
        parse = record_parser(fields)
        for start in range(0, len(lines), BATCH):
            chunk = lines[start : start + BATCH]
            try:
                records = parse(chunk)
            except ValueError:
                i, found = first_bad_line(chunk, len(fields))
                if i:
                    self._emit(parse(chunk[:i]))
                raise ComponentError(
                    f"the program printed {found} fields, expected {len(fields)} "
                    f"({', '.join(fields)}): {chunk[i][:80]!r}"
                ) from None
            self._emit(records)

    def _exit_message(self, what: str) -> str:
        code = self._proc.poll()
        return f"{self.param('command')!r} {what}" + (f" (exit {code})" if code is not None else "")

    def process_blip(self, blip: Blip) -> None:
        if blip.kind != Blip.CHECKPOINT:
            self.flush()
            return
        # Every answer to the records before the checkpoint goes downstream before it.
        self._finish_program()
        self._launch()

    def shutdown(self) -> None:
        self._finish_program()

    def snapshot(self) -> Any:
        return {"in_fields": self._in_fields, "out_fields": self._out_fields}

    def restore(self, state: Any) -> None:
        self._in_fields = tuple(state["in_fields"])
        self._out_fields = tuple(state["out_fields"]) or self._out_fields

    def close(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------- external service


class _LookupSession:
    """What the two halves of a kv_lookup share: connections and requests in flight."""

    def __init__(self, params: Mapping[str, str]):
        import redis

        url = params.get("redis_url")
        if not url:
            raise ComponentError('parameter "redis_url" is required')
        kwargs = redis.connection.parse_url(url)
        self.connections = [
            redis.Connection(**kwargs) for _ in range(max(1, int(params.get("connections", "4"))))
        ]
        try:
            for c in self.connections:
                c.connect()
        except redis.RedisError as exc:
            raise ComponentError(f"cannot reach {url}: {exc}") from exc
        self.key_field = params.get("key_field", "id")
        self.key_prefix = params.get("key_prefix", "")
        self.into = params.get("into", "value")
        self.missing = params.get("missing", "")
        self.ordered = params.get("ordered", "true") == "true"
        # Per connection: the requests sent, oldest first (sequence number, record).
        self.in_flight: list[deque[tuple[int, Record]]] = [deque() for _ in self.connections]
        self.outbox: list[list[bytes]] = [[] for _ in self.connections]
        self.unsent: list[list[tuple[int, Record]]] = [[] for _ in self.connections]
        self.next_seq = 0
        self.next_out = 0
        self.done_early: dict[int, Record] = {}
        self.closed = False
        self.pending = 0
        self._rr = 0

    def request(self, record: Record) -> None:
        i = self._rr
        self._rr = (i + 1) % len(self.connections)
        try:
            key = self.key_prefix + record[self.key_field]
        except KeyError as exc:
            raise ComponentError(f"record has no field {exc}") from None
        self.outbox[i].extend(self.connections[i].pack_command("GET", key))
        self.unsent[i].append((self.next_seq, record))
        self.next_seq += 1
        self.pending += 1
        if len(self.unsent[i]) >= 128:
            self.send(i)

    def send(self, i: int) -> None:
        if self.unsent[i]:
            self.connections[i].send_packed_command(self.outbox[i], check_health=False)
            self.in_flight[i].extend(self.unsent[i])
            self.outbox[i] = []
            self.unsent[i] = []

    def send_all(self) -> None:
        for i in range(len(self.connections)):
            self.send(i)

    def receive(self, i: int, emit: Emit) -> None:
        """Read one answer on connection i and emit its record (in input order if ordered)."""
        value = self.connections[i].read_response()
        seq, record = self.in_flight[i].popleft()
        out = dict(record)
        out[self.into] = value.decode() if isinstance(value, bytes) else self.missing
        self.pending -= 1
        if not self.ordered:
            emit(out)
            return
        self.done_early[seq] = out
        while self.next_out in self.done_early:
            emit(self.done_early.pop(self.next_out))
            self.next_out += 1

    def drain(self, emit: Emit) -> None:
        self.send_all()
        for i, q in enumerate(self.in_flight):
            while q:
                self.receive(i, emit)

    def close(self) -> None:
        for c in self.connections:
            c.disconnect()


class _Responses(Source):
    def __init__(self, half: KvLookupResponse, session: _LookupSession):
        super().__init__()
        self.half = half
        self.session = session
        self.owner = half.id
        self.feeds = frozenset({half.id})

    def filenos(self) -> Sequence[int]:
        out: list[int] = []
        for c, q in zip(self.session.connections, self.session.in_flight, strict=True):
            sock = c._sock
            if q and sock is not None:
                out.append(sock.fileno())
        return out

    @property
    def ready(self) -> bool:
        return self.session.closed and self.session.pending == 0

    def compute(self) -> ReturnCode:
        s = self.session
        if s.closed and s.pending == 0:
            return ReturnCode.REACHED_EOF
        if s.closed:
            s.drain(self.half.emit)
            return ReturnCode.KEEP_GOING
        for i, (c, q) in enumerate(zip(s.connections, s.in_flight, strict=True)):
            while q and c.can_read(timeout=0):
                s.receive(i, self.half.emit)
        return ReturnCode.KEEP_GOING


class KvLookupRequest(Component):
    """kv_lookup, request half: sends GET <key_prefix><key_field> for each record,
    pipelined over a pool of connections; the answers come back to the response
    half, another root of the same folded set (GF-5, seed §2.2.3)."""

    response: KvLookupResponse

    def pair(self, other: Component) -> None:
        assert isinstance(other, KvLookupResponse)
        self.response = other
        other.request = self

    def start(self) -> None:
        self.session = _LookupSession(self.params)

    def compute(self, port: str, record: Record) -> None:
        self.session.request(record)

    def flush(self) -> None:
        self.session.send_all()

    def process_blip(self, blip: Blip) -> None:
        # Every answer to a record before the blip goes downstream before the blip.
        self.session.drain(self.response.emit)

    def shutdown(self) -> None:
        self.session.send_all()
        self.session.closed = True

    def close(self) -> None:
        session = getattr(self, "session", None)
        if session is not None:
            session.close()


class KvLookupResponse(Component):
    """kv_lookup, response half: a root fed by the service's answers."""

    request: KvLookupRequest

    def start(self) -> None:
        self.emit = self.outputs["out"]

    def sources(self) -> Sequence[Source]:
        return (_Responses(self, self.request.session),)


LIBRARY_CLASSES: dict[str, type[Component]] = {
    "file_input": FileInput,
    "file_output": FileOutput,
    "filter": Filter,
    "reformat": Reformat,
    "replicate": Replicate,
    "gather": Gather,
    "hash_rollup": HashRollup,
    "sort": Sort,
    "interface": Interface,
}
SPLIT_CLASSES: dict[str, tuple[type[Component], type[Component]]] = {
    "kv_lookup": (KvLookupRequest, KvLookupResponse),
}


def partition_of(key: str, partitions: int) -> int:
    """Target partition of a repartitioning flow: stable across processes (unlike hash())."""
    return zlib.crc32(key.encode()) % partitions
