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

This module holds that contract (Component, Source, Context, Blip, the return
codes) and what every family shares: records and their parsing, the
parameter helpers, the sink of an output port without flows. The families
are beside it, one module each (lightpath.graph.kinds lists the kinds).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
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


# ---------------------------------------------------------------- shared helpers


def number_or_none(text: str) -> float | None:
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


def field_list(text: str) -> list[str]:
    return [f.strip() for f in text.split(",") if f.strip()]


def discard_record(record: Record) -> None:
    pass


def discard_batch(records: list[Record]) -> None:
    """Where the batches of an output port without flows go."""
