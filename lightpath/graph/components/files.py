"""file_input and file_output: tab-separated files with a header line.

`FileReader` is the root source of a file_input (records in batches, a
checkpoint blip every so many records, its offset saved and restored);
`FileWriter` writes a file_output's records and flushes them at checkpoints.
The executor uses both directly as well.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Sequence
from typing import Any

from lightpath.graph import confine
from lightpath.graph.components.base import (
    BATCH,
    Blip,
    Component,
    ComponentError,
    EmitBatch,
    Record,
    ReturnCode,
    Source,
    first_bad_line,
    record_parser,
)


def _opener(root: str | None) -> Callable[[str, int], int] | None:
    """In a confined run, open without following a symbolic link in the last step (the
    path was resolved just before: a link put there since is refused, not followed)."""
    if root is None or not hasattr(os, "O_NOFOLLOW"):
        return None
    return lambda path, flags: os.open(path, flags | os.O_NOFOLLOW, 0o666)


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
        root = confine.data_root()
        try:
            self._file = open(confine.resolve(self.path, root), "rb", opener=_opener(root))
        except confine.PathOutside as exc:
            raise ComponentError(f"cannot read: {exc}") from None
        except OSError as exc:
            raise ComponentError(
                f"cannot read {confine.shown(self.path, root)}: {exc.strerror}"
            ) from exc
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
        root = confine.data_root()
        try:
            path = confine.resolve(self.path, root)
            parent = os.path.dirname(path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            mode = "wb" if self._truncate_at is None else "r+b"
            self._file = open(confine.resolve(path, root), mode, opener=_opener(root))
        except confine.PathOutside as exc:
            raise ComponentError(f"cannot write: {exc}") from None
        except OSError as exc:
            raise ComponentError(
                f"cannot write {confine.shown(self.path, root)}: {exc.strerror}"
            ) from exc
        if self._truncate_at is not None:
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
