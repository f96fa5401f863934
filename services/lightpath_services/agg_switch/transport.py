"""Which shared-memory buffers one switch holds for which command, and when they
go back (the SHM transport of the data path; see lightpath.aggregation.shm).

The invariant: no reader ever reads a buffer after it was reused. Buffers are
reused only when every reader said it is done, or — when that can no longer
be known — unlinked for good instead (a reader that mapped it keeps its
bytes; nobody gets the name again).

1. A partial this switch computes for (command, chunk) — its fold, the
   timeout aggregation node's work, a copy of the result at the root — is
   read by its parent or the timeout aggregation node, always before the
   chunk's result comes back down: it returns to the pool when the RESULT of
   that chunk passes this switch (`chunk_passed`).
2. A RESULT sent by reference is read after the command ended here: every
   receiver (child switch or compute node) answers RELEASE, and the buffer
   returns once all did (`pin` / `released`). A switch below forwards the
   parent's buffer as it got it (borrowed) and sends its own RELEASE up once
   its receivers did.
3. A command that fails here discards every buffer it held (`fail`).
4. A completed command whose receivers never answered (a node died) discards
   what is left at its deadline plus `DISCARD_AFTER_S` (`drop`); readers stop
   reading at the deadline plus `READ_MARGIN_S`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lightpath.aggregation.shm import Lease, ShmDomain

if TYPE_CHECKING:
    import numpy as np


@dataclass
class _Pin:
    """A RESULT buffer some receivers still read: ours, or borrowed from `upstream`."""

    lease: Lease | None
    upstream: str
    waiting: set[str] = field(default_factory=set)


@dataclass
class _CommandBuffers:
    chunks: dict[int, list[Lease]] = field(default_factory=dict)
    pins: dict[int, _Pin] = field(default_factory=dict)
    ended: bool = False

    @property
    def empty(self) -> bool:
        return not self.chunks and not self.pins


class Buffers:
    """One switch's shared-memory buffers per command (see the module docstring)."""

    def __init__(self, domain: ShmDomain | None, remember: int = 4096):
        self.domain = domain
        self._commands: dict[str, _CommandBuffers] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._remember = remember

    def _of(self, command_id: str) -> _CommandBuffers | None:
        """The command's record; None once it ended here (nothing new is held for it)."""
        rec = self._commands.get(command_id)
        if rec is None:
            if command_id in self._ended:
                return None
            rec = self._commands[command_id] = _CommandBuffers()
        return None if rec.ended else rec

    def _end(self, command_id: str) -> None:
        self._ended[command_id] = None
        while len(self._ended) > self._remember:
            self._ended.popitem(last=False)

    def holds(self, command_id: str) -> bool:
        return command_id in self._commands

    # -- rule 1: partials ----------------------------------------------------------

    def alloc(self, command_id: str, chunk: int, count: int, dtype: np.dtype) -> np.ndarray:
        """A new partial of `chunk` (SwitchCore's `alloc`), held until its result passes."""
        import numpy as np

        dtype = np.dtype(dtype)
        rec = self._of(command_id) if self.domain is not None else None
        if rec is None or self.domain is None:
            return np.empty(count, dtype)
        lease = self.domain.lease(count * dtype.itemsize)
        rec.chunks.setdefault(chunk, []).append(lease)
        return lease.array(count, dtype)

    def own_copy(self, command_id: str, chunk: int, data: np.ndarray) -> np.ndarray:
        """`data` in a buffer of ours (a result that came from elsewhere, to send on)."""
        import numpy as np

        out = self.alloc(command_id, chunk, data.size, data.dtype)
        np.copyto(out, data)
        return out

    def owns(self, data: np.ndarray) -> bool:
        return self.domain is not None and self.domain.lease_of(data) is not None

    def chunk_passed(self, command_id: str, chunk: int) -> None:
        rec = self._commands.get(command_id)
        if rec is None:
            return
        for lease in rec.chunks.pop(chunk, ()):
            self._unref(lease)
        self._forget_if_done(command_id, rec)

    # -- rule 2: results sent by reference -----------------------------------------------

    def pin(
        self, command_id: str, chunk: int, receiver: str, data: np.ndarray, upstream: str
    ) -> bool:
        """`receiver` will read `data` (a RESULT) by reference until it says RELEASE.
        False when `data` is in no shared buffer (send the bytes)."""
        if self.domain is None:
            return False
        found = self.domain.locate(data)
        rec = self._of(command_id)
        if found is None or rec is None:
            return False
        pin = rec.pins.get(chunk)
        if pin is None:
            pin = rec.pins[chunk] = _Pin(self.domain.lease_of(data), upstream)
        if receiver not in pin.waiting:
            pin.waiting.add(receiver)
            if pin.lease is not None:
                pin.lease.refs += 1
        return True

    def released(self, command_id: str, chunk: int, receiver: str) -> str | None:
        """`receiver` is done with the RESULT of `chunk`. Returns the switch to tell
        in turn when that was the last reader of a borrowed buffer."""
        rec = self._commands.get(command_id)
        pin = rec.pins.get(chunk) if rec else None
        if rec is None or pin is None or receiver not in pin.waiting:
            return None
        pin.waiting.discard(receiver)
        if pin.lease is not None:
            self._unref(pin.lease)
        if pin.waiting:
            return None
        del rec.pins[chunk]
        self._forget_if_done(command_id, rec)
        return pin.upstream if pin.lease is None else None

    def settled(self, command_id: str, chunk: int) -> bool:
        """Whether nobody here reads the borrowed RESULT of `chunk` any more (so this
        switch may tell its parent)."""
        rec = self._commands.get(command_id)
        return rec is None or chunk not in rec.pins

    def receiver_gone(self, command_id: str, receiver: str) -> list[tuple[int, str]]:
        """A receiver's streams ended abnormally: it reads nothing more. Returns the
        (chunk, upstream) RELEASEs this frees in turn."""
        rec = self._commands.get(command_id)
        if rec is None:
            return []
        out = []
        for chunk in list(rec.pins):
            upstream = self.released(command_id, chunk, receiver)
            if upstream:
                out.append((chunk, upstream))
        return out

    # -- rules 3 and 4 -----------------------------------------------------------------

    def fail(self, command_id: str) -> None:
        """The command failed here: discard everything it held."""
        self.drop(command_id)

    def complete(self, command_id: str) -> bool:
        """The command completed here. True when buffers still wait for readers
        (the caller schedules `drop` for the deadline plus the margin)."""
        self._end(command_id)
        rec = self._commands.get(command_id)
        if rec is None:
            return False
        rec.ended = True
        self._forget_if_done(command_id, rec)
        return command_id in self._commands

    def drop(self, command_id: str) -> None:
        """Discard whatever the command still holds (unlinked, never reused)."""
        self._end(command_id)
        rec = self._commands.pop(command_id, None)
        if rec is None or self.domain is None:
            return
        leases = {id(x): x for c in rec.chunks.values() for x in c}
        leases.update({id(p.lease): p.lease for p in rec.pins.values() if p.lease is not None})
        for lease in leases.values():
            self.domain.discard(lease)

    # -- internals -------------------------------------------------------------------------

    def _unref(self, lease: Lease) -> None:
        lease.refs -= 1
        if lease.refs <= 0 and self.domain is not None:
            self.domain.release(lease)

    def _forget_if_done(self, command_id: str, rec: _CommandBuffers) -> None:
        if rec.ended and rec.empty:
            del self._commands[command_id]

    @property
    def commands(self) -> int:
        return len(self._commands)
