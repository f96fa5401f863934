"""interface: records piped through an external program (not foldable).

The program reads tab-separated lines on stdin and writes them on stdout;
its output is a source of the folded process, read without blocking.
"""

from __future__ import annotations

import operator
import os
import select
import shlex
import subprocess
from collections.abc import Sequence
from typing import Any

from lightpath.graph.components.base import (
    BATCH,
    Blip,
    Component,
    ComponentError,
    Record,
    ReturnCode,
    Source,
    field_list,
    first_bad_line,
    record_parser,
)


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
        self._out_fields: tuple[str, ...] = tuple(field_list(self.params.get("fields", "")))
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
