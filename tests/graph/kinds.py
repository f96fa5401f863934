"""Components used only by the tests, named by import path ("tests.graph.kinds:Recorder")."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, ClassVar

from lightpath.graph.components import Blip, Component, ComponentError, Record


class Recorder(Component):
    """Passes records on; logs every call into `log` (a list the test injects)."""

    log: ClassVar[list[tuple]] = []

    def start(self) -> None:
        self._outs = list(self.outputs.values())
        self.seen = 0

    def compute(self, port: str, record: Record) -> None:
        self.log.append(("compute", self.id, port, record.get(self.params.get("log_field", "id"))))
        self.seen += 1
        keep_even = self.params.get("even_only") == "true"
        if keep_even and int(record["id"]) % 2:
            return
        for out in self._outs:
            out(record)

    def shutdown(self) -> None:
        self.log.append(("shutdown", self.id))
        if self.params.get("emit_on_shutdown"):
            for out in self._outs:
                out({"id": f"{self.id}-final", "seen": str(self.seen)})

    def process_blip(self, blip: Blip) -> None:
        self.log.append(("blip", self.id, blip.id))

    def snapshot(self) -> Any:
        return self.seen

    def restore(self, state: Any) -> None:
        self.seen = state


class Pass(Component):
    """Passes every record to every output port."""

    def start(self) -> None:
        self._outs = list(self.outputs.values())

    def compute(self, port: str, record: Record) -> None:
        for out in self._outs:
            out(record)


class Spin(Component):
    """Burns CPU per record (`loops`), then passes it on: a member that should own most CPU."""

    def start(self) -> None:
        self._out = self.outputs["out"]
        self._loops = int(self.params.get("loops", "2000"))

    def compute(self, port: str, record: Record) -> None:
        x = 0
        for i in range(self._loops):
            x += i * i
        self._out(record)


def _wait_for_checkpoints(wait_for: str, timeout: float = 30.0) -> None:
    directory, _, instances = wait_for.rpartition(":")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        saved = {p.name.rsplit(".", 2)[0] for p in Path(directory).glob("*.ckpt")}
        if len(saved) >= int(instances):
            return
        time.sleep(0.01)


class CrashOnce(Component):
    """Passes records on; at record `at`, if the file `flag` exists, removes it and
    fails: with `how` = "error" by raising, "exit" by killing its process.

    With `wait_for` = "<checkpoint dir>:<instances>" it first waits (up to 30 s)
    until that many set instances have each saved a checkpoint, so the crash
    surely comes after a complete checkpoint rather than racing the blips."""

    def start(self) -> None:
        self._out = self.outputs["out"]
        self._at = int(self.params["at"])
        self._flag = self.params["flag"]
        self.count = 0

    def compute(self, port: str, record: Record) -> None:
        self.count += 1
        if self.count == self._at and os.path.exists(self._flag):
            if "wait_for" in self.params:
                _wait_for_checkpoints(self.params["wait_for"])
            try:  # several instances may get here: the one that removes the flag crashes
                os.unlink(self._flag)
            except FileNotFoundError:
                pass
            else:
                if self.params.get("how") == "exit":
                    os._exit(9)
                raise ComponentError(f"crashed on purpose at record {self._at}")
        self._out(record)

    def snapshot(self) -> Any:
        return self.count

    def restore(self, state: Any) -> None:
        self.count = state


class BatchRecorder(Recorder):
    """A Recorder that takes batches: logs each call with the ids of its batch."""

    def compute_batch(self, port: str, records: list[Record]) -> None:
        self.log.append(("batch", self.id, port, [r["id"] for r in records]))
        self.seen += len(records)
        for out in self.batch_outputs.values():
            out(records)
