"""Buffered channels between processes: how flows cross folded sets (GF-5).

The seed's unfolded execution (§2.1): the first component stores its output
in a buffer and passes the buffer to the second with an operating-system call.
A channel is one OS pipe (or, between phases, one spill file) per flow and
pair of process instances. Frames: 1 type byte, 4-byte big-endian length,
payload. `R` holds a batch of records (marshal: records are dicts of str),
`B` a blip, `E` the end of the data.
"""

from __future__ import annotations

import marshal
import os
import select
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from lightpath.graph.components import (
    Blip,
    ComponentError,
    EmitBatch,
    Record,
    ReturnCode,
    Source,
)

_HEADER = struct.Struct("!cI")
RECORDS, BLIP, END = b"R", b"B", b"E"


def _write_all(fd: int, header: bytes, payload: bytes) -> int:
    data = memoryview(header + payload)
    while data:
        n = os.write(fd, data)
        data = data[n:]
    return len(header) + len(payload)


class ChannelWriter:
    """Producer end: buffers records and writes a frame per `batch` records."""

    def __init__(self, fd: int, *, batch: int = 1024):
        self.fd = fd
        self.batch = batch
        self.bytes = 0
        self._buf: list[Record] = []
        self._append = self._buf.append

    def __call__(self, record: Record) -> None:
        self._append(record)
        if len(self._buf) >= self.batch:
            self.flush()

    def write_batch(self, records: list[Record]) -> None:
        """Records of a batch: framed `batch` at a time, like records one by one."""
        buf = self._buf
        buf.extend(records)
        batch = self.batch
        if len(buf) >= batch:
            if len(buf) == batch:
                self.flush()
                return
            for i in range(0, len(buf) - batch + 1, batch):
                self._frame(buf[i : i + batch])
            del buf[: len(buf) - len(buf) % batch]

    def _frame(self, records: list[Record]) -> None:
        payload = marshal.dumps(records)
        self.bytes += _write_all(self.fd, _HEADER.pack(RECORDS, len(payload)), payload)

    def flush(self) -> None:
        if self._buf:
            self._frame(self._buf)
            self._buf.clear()

    def blip(self, blip: Blip) -> None:
        self.flush()
        payload = marshal.dumps((blip.kind, blip.id))
        self.bytes += _write_all(self.fd, _HEADER.pack(BLIP, len(payload)), payload)

    def end(self) -> None:
        self.flush()
        self.bytes += _write_all(self.fd, _HEADER.pack(END, 0), b"")
        os.close(self.fd)
        self.fd = -1

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class PartitionedWriter:
    """Producer end of a repartitioning flow: one channel per target partition,
    chosen by a stable hash of `key` (round robin without a key)."""

    def __init__(self, writers: Sequence[ChannelWriter], key: str):
        self.writers = list(writers)
        self.key = key
        self._next = 0

    def __call__(self, record: Record) -> None:
        n = len(self.writers)
        if self.key:
            try:
                value = record[self.key]
            except KeyError:
                raise ComponentError(f'record has no field "{self.key}" to partition on') from None
            self.writers[zlib.crc32(value.encode()) % n](record)
        else:
            self.writers[self._next](record)
            self._next = (self._next + 1) % n

    def write_batch(self, records: list[Record]) -> None:
        n = len(self.writers)
        parts: list[list[Record]] = [[] for _ in self.writers]
        if self.key:
            key = self.key
            try:
                for record in records:
                    parts[zlib.crc32(record[key].encode()) % n].append(record)
            except KeyError:
                raise ComponentError(f'record has no field "{key}" to partition on') from None
        else:
            for record in records:
                parts[self._next].append(record)
                self._next = (self._next + 1) % n
        for w, part in zip(self.writers, parts, strict=True):
            if part:
                w.write_batch(part)

    def flush(self) -> None:
        for w in self.writers:
            w.flush()

    def blip(self, blip: Blip) -> None:
        for w in self.writers:
            w.blip(blip)

    def end(self) -> None:
        for w in self.writers:
            w.end()

    def close(self) -> None:
        for w in self.writers:
            w.close()

    @property
    def bytes(self) -> int:
        return sum(w.bytes for w in self.writers)


@dataclass
class Channel:
    """Consumer end of one pipe or spill file."""

    fd: int
    emit: EmitBatch  # called with the records of each frame
    label: str  # e.g. "204D.out -> 204I.in from instance 0", for errors
    buf: bytearray = field(default_factory=bytearray)
    ended: bool = False
    eof: bool = False
    blocked_at: int | None = None  # a blip id this channel waits at
    # Frames read before a blip that are still to deliver now the blip is aligned.
    resume: bool = False


class ChannelInput(Source):
    """All channels into one process instance, as one root source.

    Records are delivered as they arrive. A blip is aligned: a channel that
    brought blip k is not read further until every open channel has brought
    it, then the set gets GOT_BLIP (so a checkpoint holds exactly the records
    before blip k from every upstream process).
    """

    emits_blips = True
    READ = 1 << 20

    def __init__(
        self,
        channels: Sequence[Channel],
        *,
        owner: str,
        feeds: frozenset[str],
    ):
        super().__init__()
        self.channels = list(channels)
        self.owner = owner
        self.feeds = feeds
        self._poll = select.poll()
        self._fds = {c.fd: c for c in self.channels}
        for c in self.channels:
            self._poll.register(c.fd, select.POLLIN)
        self._pending_blip: Blip | None = None

    def filenos(self) -> Sequence[int]:
        return [c.fd for c in self.channels if not c.eof and c.blocked_at is None]

    @property
    def ready(self) -> bool:
        # Frames already read but held back by a blip that is now aligned.
        return any(c.resume for c in self.channels) or all(c.ended for c in self.channels)

    def compute(self) -> ReturnCode:
        for c in self.channels:
            if c.resume and c.blocked_at is None:
                c.resume = False
                code = self._drain(c)
                if code is not None:
                    return code
        for fd, _ in self._poll.poll(0):
            c = self._fds[fd]
            if c.blocked_at is not None or c.eof:
                continue
            chunk = os.read(fd, self.READ)
            if not chunk:
                c.eof = True
                self._poll.unregister(fd)
                if not c.ended:
                    self.error = (
                        f"channel {c.label} closed before its end: the upstream process died"
                    )
                    return ReturnCode.ERROR
                continue
            c.buf += chunk
            code = self._drain(c)
            if code is not None:
                return code
        if all(c.ended for c in self.channels):
            return ReturnCode.REACHED_EOF
        return ReturnCode.KEEP_GOING

    def _drain(self, c: Channel) -> ReturnCode | None:
        buf = c.buf
        pos = 0
        size = _HEADER.size
        try:
            while len(buf) - pos >= size:
                kind, length = _HEADER.unpack_from(buf, pos)
                if len(buf) - pos - size < length:
                    break
                payload = buf[pos + size : pos + size + length]
                pos += size + length
                if kind == RECORDS:
                    c.emit(marshal.loads(payload))
                elif kind == BLIP:
                    blip_kind, blip_id = marshal.loads(payload)
                    c.blocked_at = blip_id
                    self._pending_blip = Blip(blip_kind, blip_id)
                    return self._aligned()
                elif kind == END:
                    c.ended = True
                    if pos != len(buf):
                        self.error = f"channel {c.label} has data after its end"
                        return ReturnCode.ERROR
                    if any(o.blocked_at is not None for o in self.channels):
                        return self._aligned()  # one fewer channel to wait for
                    return None
                else:
                    self.error = f"channel {c.label} carries an unknown frame {kind!r}"
                    return ReturnCode.ERROR
            return None
        finally:
            del buf[:pos]

    def _aligned(self) -> ReturnCode:
        open_channels = [c for c in self.channels if not c.ended]
        if all(c.blocked_at is not None for c in open_channels):
            assert self._pending_blip is not None
            self.blip = self._pending_blip
            for c in open_channels:
                c.blocked_at = None
                c.resume = bool(c.buf)
            return ReturnCode.GOT_BLIP
        return ReturnCode.KEEP_GOING

    def close(self) -> None:
        for c in self.channels:
            try:
                os.close(c.fd)
            except OSError:
                pass
