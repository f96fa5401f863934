"""The arithmetic of in-network aggregation, shared by the switches and the
compute-node SDK (a compute node may be the timeout aggregation node).

Pure: numpy only, no I/O. Names follow seed 003: a *partial* is what a switch
sends up, *timeout nodes* are the children it lacks, *late* data is a timeout
node's data flagged for the `TimeoutAggregator`.

Order (AG-8):

* Integers, bool, min and max are order-free (integer sums wrap modulo 2^32 /
  2^64, which is associative), so they combine in arrival order.
* Float sum and product depend on the order. Under ``PRESET`` every switch
  folds its children's inputs left to right in topology order, skipping the
  late ones (`Fold`), and the timeout aggregation node folds the root's
  partial first, then the late contributions in preorder of their nodes
  (`TimeoutAggregator`). The same inputs with the same late nodes therefore
  give a bit-identical result, whatever the arrival order and trigger mode.
  A different late set regroups the sum, which changes the last bits.
* ``EXACT`` rounds each float input once to a multiple of 2^-f (f =
  ``fraction_bits``) and sums int64s, which is exact and associative: the
  bits no longer depend on arrival order or on which nodes were late. The
  price is a rounding of each input to 2^-f (not to float precision) and a
  range limit of ±2^(62 - f - ceil(log2 n)) for n participants.
* ``ARRIVAL`` folds floats as they come (the seed's AI-cluster case).

Where new partials live is the caller's choice (`Alloc`): the switches and the
SDK hand out shared-memory buffers so partials travel by reference between
co-located peers; the bits are the same either way, since only the output
array of the same ufunc call changes.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from lightpath.errors import FieldViolation

if TYPE_CHECKING:
    # numpy is imported where it is used, not with this module: an agg_switch imports
    # this at start and needs numpy only once it runs a command (issue 31)
    import numpy as np


class DType(enum.StrEnum):
    INT32 = "int32"
    INT64 = "int64"
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    BOOL = "bool"

    @property
    def numpy(self) -> np.dtype:
        import numpy as np

        return np.dtype(_NUMPY[self])

    @property
    def is_float(self) -> bool:
        return self in (DType.FLOAT32, DType.FLOAT64)


_NUMPY = {
    DType.INT32: "<i4",
    DType.INT64: "<i8",
    DType.FLOAT32: "<f4",
    DType.FLOAT64: "<f8",
    DType.BOOL: "?",
}


class Op(enum.StrEnum):
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    PROD = "prod"
    AND = "and"
    OR = "or"


class OrderPolicy(enum.StrEnum):
    ARRIVAL = "arrival"
    PRESET = "preset"
    EXACT = "exact"


class Trigger(enum.StrEnum):
    """AG-3: aggregate once all arrived or the threshold passed, or on every arrival."""

    ALL_OR_THRESHOLD = "all_or_threshold"
    INCREMENTAL = "incremental"


# Where a new partial of n elements of a dtype goes (an uninitialised array);
# None = numpy's own allocation.
Alloc = Callable[[int, "np.dtype"], "np.ndarray"]
# The same, per chunk (the timeout aggregation node works on many chunks).
ChunkAlloc = Callable[[int, int, "np.dtype"], "np.ndarray"]


@functools.cache
def _ufuncs() -> dict[Op, np.ufunc]:
    import numpy as np

    return {
        Op.SUM: np.add,
        Op.PROD: np.multiply,
        Op.MIN: np.minimum,
        Op.MAX: np.maximum,
        Op.AND: np.logical_and,
        Op.OR: np.logical_or,
    }


DEFAULT_FRACTION_BITS = 32
MAX_FRACTION_BITS = 60
# Elements per block of EXACT's conversions: the float64 intermediate stays a
# small cached temporary instead of a chunk-sized allocation. Each element sees
# the same operations as in a whole-array pass, so the bits are the same.
BLOCK = 1 << 16


def _empty(count: int, dtype: np.dtype) -> np.ndarray:
    import numpy as np

    return np.empty(count, dtype)


def _blocks(count: int) -> range:
    return range(0, count, BLOCK)


@dataclass(frozen=True)
class Reduction:
    """What one command computes: dtype, op and order policy (AG-2, AG-8)."""

    dtype: DType
    op: Op
    order: OrderPolicy = OrderPolicy.PRESET
    fraction_bits: int = DEFAULT_FRACTION_BITS
    participants: int = 1

    def violations(self) -> list[FieldViolation]:
        """The rules this combination breaks (empty when valid)."""
        out: list[FieldViolation] = []
        if self.dtype is DType.BOOL and self.op not in (Op.AND, Op.OR, Op.MIN, Op.MAX):
            out.append(FieldViolation("op", "bool vectors combine with and, or, min or max"))
        if self.dtype is not DType.BOOL and self.op in (Op.AND, Op.OR):
            out.append(FieldViolation("op", f"{self.op} applies to bool vectors only"))
        if self.order is OrderPolicy.EXACT and self.dtype.is_float and self.op is Op.PROD:
            out.append(
                FieldViolation(
                    "order_policy",
                    "EXACT has no fixed-point form for a float product; use PRESET",
                )
            )
        if not 0 <= self.fraction_bits <= MAX_FRACTION_BITS:
            out.append(
                FieldViolation("exact_fraction_bits", f"must be within 0..{MAX_FRACTION_BITS}")
            )
        elif self.fixed_point and self.range_exponent < 1:
            out.append(
                FieldViolation(
                    "exact_fraction_bits",
                    f"leaves no integer range for {self.participants} participants; use fewer bits",
                )
            )
        return out

    @property
    def itemsize(self) -> int:
        return self.dtype.numpy.itemsize

    @property
    def ufunc(self) -> np.ufunc:
        return _ufuncs()[self.op]

    @property
    def order_sensitive(self) -> bool:
        """Whether the bits of the result depend on the grouping (float sum / product)."""
        return self.dtype.is_float and self.op in (Op.SUM, Op.PROD)

    @property
    def preset(self) -> bool:
        """Fold in the preset order (AG-8) rather than in arrival order."""
        return self.order_sensitive and self.order is OrderPolicy.PRESET

    @property
    def fixed_point(self) -> bool:
        """EXACT float sum: partials are int64 multiples of 2^-fraction_bits."""
        return self.order is OrderPolicy.EXACT and self.dtype.is_float and self.op is Op.SUM

    @property
    def range_exponent(self) -> int:
        """EXACT inputs must satisfy |x| <= 2^range_exponent so no int64 sum overflows."""
        return 62 - self.fraction_bits - math.ceil(math.log2(max(1, self.participants)))

    def check_input(self, values: np.ndarray) -> str | None:
        """Why `values` cannot enter this reduction, or None (EXACT range, finiteness)."""
        if not self.fixed_point or values.size == 0:
            return None
        limit = math.ldexp(1.0, self.range_exponent)
        hi, lo = float(values.max()), float(values.min())
        if not (hi <= limit and lo >= -limit):  # also catches NaN
            return (
                f"EXACT needs finite values within ±2^{self.range_exponent} "
                f"({self.fraction_bits} fraction bits, {self.participants} participants); "
                f"got [{lo}, {hi}]"
            )
        return None

    # -- the arithmetic --------------------------------------------------------

    def absorb(
        self, values: np.ndarray, fixed_point: bool = False, alloc: Alloc | None = None
    ) -> np.ndarray:
        """An input (a compute node's data, or a partial) in the partial encoding.

        Raw data is used as is (a read-only view is fine: `combine` never writes
        into an array it does not own); under EXACT raw floats are rounded to
        int64 fixed point, once (into `alloc`'s array).
        """
        if not self.fixed_point or fixed_point:
            return values
        import numpy as np

        scale = math.ldexp(1.0, self.fraction_bits)
        out = (alloc or _empty)(values.size, np.dtype(np.int64))
        for lo in _blocks(values.size):
            scaled = np.multiply(values[lo : lo + BLOCK], scale, dtype=np.float64)
            np.rint(scaled, out=scaled)
            out[lo : lo + BLOCK] = scaled
        return out

    def combine(
        self, acc: np.ndarray, owned: bool, x: np.ndarray, alloc: Alloc | None = None
    ) -> np.ndarray:
        """acc ⊕ x; in place when the accumulator is ours, else into a new array
        (from `alloc` when given)."""
        if owned:
            return self.ufunc(acc, x, out=acc)
        if alloc is None:
            return self.ufunc(acc, x)
        import numpy as np

        return self.ufunc(acc, x, out=alloc(acc.size, np.result_type(acc, x)))

    def accumulate(
        self,
        acc: np.ndarray | None,
        owned: bool,
        x: np.ndarray | None,
        alloc: Alloc | None = None,
    ) -> tuple[np.ndarray | None, bool]:
        """One step of a fold: (accumulator, whether we own it) after taking `x`.
        The first input is kept as is (no copy); the second makes a new array
        (from `alloc`) that later inputs are added into in place."""
        if x is None:
            return acc, owned
        if acc is None:
            return x, False
        return self.combine(acc, owned, x, alloc), True

    def finish(self, partial: np.ndarray, alloc: Alloc | None = None) -> np.ndarray:
        """The final value in the command's dtype (into `alloc`'s array under EXACT)."""
        if not self.fixed_point:
            return partial
        import numpy as np

        out = (alloc or _empty)(partial.size, self.dtype.numpy)
        for lo in _blocks(partial.size):
            out[lo : lo + BLOCK] = np.ldexp(
                partial[lo : lo + BLOCK].astype(np.float64), -self.fraction_bits
            )
        return out

    def partial_dtype(self) -> np.dtype:
        import numpy as np

        return np.dtype("<i8") if self.fixed_point else self.dtype.numpy

    def reference(self, inputs: Sequence[np.ndarray]) -> np.ndarray:
        """Left fold of `inputs` in the given order (what tests compare with)."""
        import numpy as np

        acc: np.ndarray | None = None
        owned = False
        for x in inputs:
            acc, owned = self.accumulate(acc, owned, self.absorb(np.asarray(x, self.dtype.numpy)))
        assert acc is not None, "no input"
        return self.finish(acc)


class Fold:
    """One switch's combination of its children's inputs for one chunk (AG-3, AG-8).

    ``incremental`` (TRIGGER_MODE_INCREMENTAL) combines on every arrival;
    otherwise inputs wait for `finish` (all arrived, or the threshold). Under
    PRESET the inputs combine left to right in `order` whatever the arrival
    order: incrementally that means folding the longest arrived prefix and
    holding the rest; missing inputs are skipped at `finish`.
    """

    __slots__ = (
        "_acc",
        "_alloc",
        "_held",
        "_incremental",
        "_next",
        "_order",
        "_owned",
        "_preset",
        "_r",
    )

    def __init__(
        self,
        reduction: Reduction,
        order: Sequence[str],
        incremental: bool,
        alloc: Alloc | None = None,
    ):
        self._r = reduction
        self._alloc = alloc
        self._order = list(order)
        self._preset = reduction.preset
        self._incremental = incremental
        self._acc: np.ndarray | None = None
        self._owned = False
        self._held: dict[str, np.ndarray | None] = {}
        self._next = 0

    def _take(self, x: np.ndarray | None) -> None:
        self._acc, self._owned = self._r.accumulate(self._acc, self._owned, x, self._alloc)

    def add(self, key: str, x: np.ndarray | None) -> None:
        """An input (already `absorb`ed) from child `key`; None: the child
        arrived without data (an empty partial), which only unblocks the order."""
        if not self._incremental or self._preset:
            self._held[key] = x
            if self._incremental:
                self._advance()
            return
        self._take(x)

    def _advance(self) -> None:
        while self._next < len(self._order) and self._order[self._next] in self._held:
            self._take(self._held.pop(self._order[self._next]))
            self._next += 1

    def finish(self) -> np.ndarray | None:
        """Everything held, combined (children that never arrived are skipped)."""
        if self._preset:
            for key in self._order[self._next :]:
                if key in self._held:
                    self._take(self._held.pop(key))
            self._next = len(self._order)
        else:
            for x in self._held.values():  # insertion order = arrival order
                self._take(x)
            self._held.clear()
        acc, self._acc = self._acc, None
        return acc

    @property
    def pending(self) -> int:
        """Inputs held, not yet combined (observability)."""
        return len(self._held)


# -- packets -----------------------------------------------------------------


class Kind(enum.IntEnum):
    """AggChunkKind of the proto."""

    CONTRIBUTION = 1
    PARTIAL = 2
    ROOT_PARTIAL = 3
    LATE = 4
    FINAL = 5
    RESULT = 6


@dataclass
class Packet:
    """One chunk of one command on its way (the domain form of AggChunk).

    `raw` keeps the encoded bytes a packet arrived as, so a switch that
    forwards it unchanged (flagged late data, results going down) does not
    encode it again.
    """

    command_id: str
    chunk: int
    kind: Kind
    source: str
    data: np.ndarray | None = None
    destination: str = ""
    timeout_nodes: tuple[str, ...] = ()
    timeout_flag: bool = False
    fixed_point: bool = False
    parameters: bool = False
    raw: bytes | None = field(default=None, repr=False, compare=False)
    # The same message with a shared-memory reference instead of the bytes.
    raw_ref: bytes | None = field(default=None, repr=False, compare=False)

    def but(self, **changes) -> Packet:
        """A modified copy (which no longer matches `raw` or `raw_ref`)."""
        return replace(self, raw=None, raw_ref=None, **changes)


# -- the timeout aggregation node (AG-7) --------------------------------------


@dataclass
class _TaChunk:
    index: int
    partial_seen: bool = False
    expected: set[str] = field(default_factory=set)
    received: dict[str, tuple[np.ndarray | None, tuple[str, ...]]] = field(default_factory=dict)
    folded: set[str] = field(default_factory=set)
    acc: np.ndarray | None = None
    owned: bool = False
    partial: np.ndarray | None = None
    partial_folded: bool = False
    done: bool = False


class TimeoutAggregator:
    """Completes one command's chunks from the root's partial and the late data (AG-7, S305).

    The root's partial names the timeout nodes it lacks; each late
    contribution accounts for its node and may name more (a late switch's
    partial carries its own late children, AG-11). A chunk is complete once
    the partial arrived and every named node's data did.

    ``incremental``: combine each contribution as soon as it is known to be
    needed (the seed's condition two), else once everything is there
    (condition one). Under PRESET the partial comes first and the late data
    follows in `position` order of the nodes; a late switch precedes its
    descendants in preorder, so the incremental fold can always proceed in
    that order and equals the after-all fold bit for bit.
    """

    def __init__(
        self,
        reduction: Reduction,
        position: Mapping[str, int] | Callable[[str], int],
        incremental: bool,
        alloc: ChunkAlloc | None = None,
    ):
        self._r = reduction
        self._pos = position.__getitem__ if isinstance(position, Mapping) else position
        self._incremental = incremental
        self._alloc = alloc
        self._chunks: dict[int, _TaChunk] = {}

    def outstanding(self, chunk: int) -> set[str]:
        """Timeout nodes of `chunk` whose data has not arrived yet."""
        st = self._chunks.get(chunk)
        return set() if st is None else st.expected - st.received.keys()

    def folded(self, chunk: int) -> set[str]:
        """Late nodes already combined into `chunk` (incremental mode folds as they come)."""
        st = self._chunks.get(chunk)
        return set() if st is None else st.folded - {""}

    @property
    def open_chunks(self) -> list[int]:
        return sorted(i for i, st in self._chunks.items() if not st.done)

    def on_partial(
        self, chunk: int, data: np.ndarray | None, timeout_nodes: Iterable[str], fixed_point: bool
    ) -> np.ndarray | None:
        """The root's partial (S302). Returns the final chunk when this completes it."""
        st = self._chunks.setdefault(chunk, _TaChunk(chunk))
        if st.partial_seen or st.done:
            return None  # a duplicate
        st.partial_seen = True
        st.partial = None if data is None else self._r.absorb(data, fixed_point, self._at(chunk))
        st.expected.update(timeout_nodes)
        self._close_expected(st)
        return self._progress(st)

    def on_late(
        self,
        chunk: int,
        node: str,
        data: np.ndarray | None,
        timeout_nodes: Iterable[str],
        fixed_point: bool,
    ) -> np.ndarray | None:
        """A timeout node's flagged data (S304). Returns the final chunk when complete."""
        st = self._chunks.setdefault(chunk, _TaChunk(chunk))
        if st.done or node in st.received:
            return None  # a duplicate
        st.received[node] = (
            None if data is None else self._r.absorb(data, fixed_point, self._at(chunk)),
            tuple(timeout_nodes),
        )
        self._close_expected(st)
        return self._progress(st)

    @staticmethod
    def _close_expected(st: _TaChunk) -> None:
        """A received late switch partial names more timeout nodes: they are expected too."""
        grew = True
        while grew:
            grew = False
            for node, (_, carried) in st.received.items():
                if node in st.expected and not set(carried) <= st.expected:
                    st.expected.update(carried)
                    grew = True

    def _at(self, chunk: int) -> Alloc | None:
        alloc = self._alloc
        return None if alloc is None else lambda n, dt: alloc(chunk, n, dt)

    def _take(self, st: _TaChunk, x: np.ndarray | None) -> None:
        st.acc, st.owned = self._r.accumulate(st.acc, st.owned, x, self._at(st.index))

    def _progress(self, st: _TaChunk) -> np.ndarray | None:
        if not st.partial_seen:
            return None
        complete = st.expected <= st.received.keys()
        if not (complete or self._incremental):
            return None
        if not st.partial_folded:
            self._take(st, st.partial)
            st.partial, st.partial_folded = None, True
        waiting = sorted(st.expected - st.folded, key=self._pos)
        for node in waiting:
            if node not in st.received:
                if self._r.preset:
                    break  # PRESET: nothing after a missing node may be folded yet
                continue
            self._take(st, st.received[node][0])
            st.received[node] = (None, st.received[node][1])
            st.folded.add(node)
        if not complete:
            return None
        st.done = True
        acc, st.acc = st.acc, None
        st.received.clear()
        if acc is None:
            raise ValueError("a chunk completed without any data")
        return self._r.finish(acc, self._at(st.index))


def split_chunks(length: int, chunk_elems: int) -> int:
    """How many chunks a vector of `length` elements travels in (AG-14)."""
    return max(1, -(-length // chunk_elems))


def chunk_bounds(index: int, length: int, chunk_elems: int) -> tuple[int, int]:
    start = index * chunk_elems
    return start, min(length, start + chunk_elems)


class NodeCommand:
    """A compute node's side of one command (pure).

    Assembles the broadcast result chunk by chunk; when the node is the
    command's timeout aggregation node it also completes chunks from the
    root's partial and the flagged late data, and returns the FINAL packet to
    send to the root (AG-7, S305-S306).
    """

    def __init__(
        self,
        node_id: str,
        command_id: str,
        reduction: Reduction,
        length: int,
        chunk_elems: int,
        *,
        timeout_aggregator: bool = False,
        position: Mapping[str, int] | None = None,
        incremental: bool = False,
        root: str = "",
        out: np.ndarray | None = None,
        alloc: ChunkAlloc | None = None,
    ):
        import numpy as np

        self.node_id = node_id
        self.command_id = command_id
        self.length = length
        self.chunk_elems = chunk_elems
        self.chunks = split_chunks(length, chunk_elems)
        if out is not None and (out.shape != (length,) or out.dtype != reduction.dtype.numpy):
            raise ValueError(f"out must be a {reduction.dtype} vector of {length} elements")
        self.result = np.empty(length, dtype=reduction.dtype.numpy) if out is None else out
        self.parameters = False
        self._seen = bytearray(self.chunks)
        self._count = 0
        self._root = root
        self._ta = (
            TimeoutAggregator(reduction, position or {}, incremental, alloc)
            if timeout_aggregator
            else None
        )

    @property
    def done(self) -> bool:
        return self._count == self.chunks

    @property
    def received(self) -> int:
        return self._count

    def accept(self, pkt: Packet) -> Packet | None:
        """A packet from the leaf switch; returns a FINAL packet to send, if any."""
        if not 0 <= pkt.chunk < self.chunks:
            raise ValueError(f"chunk {pkt.chunk} out of range")
        if pkt.kind is Kind.RESULT:
            if not self._seen[pkt.chunk]:
                lo, hi = chunk_bounds(pkt.chunk, self.length, self.chunk_elems)
                assert pkt.data is not None and pkt.data.size == hi - lo
                self.result[lo:hi] = pkt.data
                self._seen[pkt.chunk] = 1
                self._count += 1
                self.parameters = self.parameters or pkt.parameters
            return None
        if self._ta is None or pkt.kind not in (Kind.ROOT_PARTIAL, Kind.LATE):
            raise ValueError(f"{self.node_id} cannot take a {pkt.kind.name} packet")
        if pkt.kind is Kind.ROOT_PARTIAL:
            final = self._ta.on_partial(pkt.chunk, pkt.data, pkt.timeout_nodes, pkt.fixed_point)
        else:
            final = self._ta.on_late(
                pkt.chunk, pkt.source, pkt.data, pkt.timeout_nodes, pkt.fixed_point
            )
        if final is None:
            return None
        return Packet(
            self.command_id, pkt.chunk, Kind.FINAL, self.node_id, final, destination=self._root
        )
