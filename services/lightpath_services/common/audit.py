"""The audit log: one JSON line per mutating call and per denied call.

    {"ts": "2026-11-25T10:00:00.123Z", "service": "cell_scheduler",
     "instance": "cell-scheduler", "method": "/lightpath.v1.CellScheduler/CancelJob",
     "principal": "tenant:acme", "resources": {"job_id": "train-1"},
     "code": "OK", "trace_id": "4bf9...", "level": "Metadata"}

Levels (Kubernetes' names): `none`; `metadata` (the line above); `request`
(also the request message as JSON, cut at 4 KiB). Where it goes
(LIGHTPATH_AUDIT_LOG): a file, appended to (the local stack writes
`<state dir>/audit/<process>.jsonl`, which `lightpath audit` reads), or `-`
for the service's log stream (logger `lightpath.audit`), which is what a
container platform collects.

A call shed at the door (RESOURCE_EXHAUSTED, reason OVERLOADED: refused before
anything was done, docs/security.md) is counted instead of written on its own: one
line per method and caller with the count, `since` the first of them, written
SHED_EVERY_S after that first (and at close). Under overload most calls are shed, and
a line each was CPU taken from the calls served (issue 30). Denied calls are each
written, whatever the load.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

log = logging.getLogger("lightpath.audit")

REQUEST_LIMIT = 4096
# Shed calls are written as counts, at most this long after the first (module doc).
SHED_EVERY_S = 1.0
# Scalar request fields that name what a call acts on.
_RESOURCE_NAMES = {"tenant", "tree", "tree_id", "name"}
_SCALARS = {
    FieldDescriptor.TYPE_STRING,
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64,
}


def _is_repeated(f: FieldDescriptor) -> bool:
    flag = getattr(f, "is_repeated", None)
    if flag is not None:
        return bool(flag)
    return getattr(f, "label", None) == FieldDescriptor.LABEL_REPEATED


def _names_resource(f: FieldDescriptor) -> bool:
    return (
        f.type in _SCALARS
        and not _is_repeated(f)
        and (f.name.endswith("_id") or f.name in _RESOURCE_NAMES)
    )


def _resource_paths(desc: Any) -> tuple[tuple[str, ...], ...]:
    """Paths of the fields that name resources: top level, and one message deep
    (`spec.job_id` of SubmitJob, `pod.pod_id` of RegisterPod)."""
    cached = _PATHS.get(desc.full_name)
    if cached is None:
        paths: list[tuple[str, ...]] = []
        for f in desc.fields:
            if _names_resource(f):
                paths.append((f.name,))
            elif f.type == FieldDescriptor.TYPE_MESSAGE and not _is_repeated(f):
                paths.extend((f.name, g.name) for g in f.message_type.fields if _names_resource(g))
        cached = _PATHS[desc.full_name] = tuple(paths)
    return cached


_PATHS: dict[str, tuple[tuple[str, ...], ...]] = {}


def resources_of(request: Any) -> dict[str, Any]:
    """The ids a request names (top-level `*_id`, `tenant`, `tree`, `name` fields that are set)."""
    if not isinstance(request, Message):
        return {}
    out: dict[str, Any] = {}
    for path in _resource_paths(request.DESCRIPTOR):
        if len(path) == 2:
            if not request.HasField(path[0]):
                continue
            value = getattr(getattr(request, path[0]), path[1])
        else:
            value = getattr(request, path[0])
        if value:
            out[".".join(path)] = value
    return out


class AuditLog:
    def __init__(self, service: str, instance: str, destination: str, level: str = "metadata"):
        self.service = service
        self.instance = instance
        self.level = level
        self.destination = destination
        self._file = None
        # (method, principal) -> [calls shed, when the first was] (module doc)
        self._shed: dict[tuple[str, str], list] = {}
        if level != "none" and destination not in {"", "-"}:
            path = Path(destination)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._file = os.fdopen(fd, "a", buffering=1, encoding="utf-8")

    @property
    def enabled(self) -> bool:
        return self.level != "none" and self.destination != ""

    def record(
        self,
        *,
        method: str,
        principal: str,
        code: str,
        request: Any,
        trace_id: str,
        message: str = "",
    ) -> None:
        if not self.enabled:
            return
        entry: dict[str, Any] = {
            "ts": _timestamp(time.time()),
            "service": self.service,
            "instance": self.instance,
            "method": method,
            "principal": principal,
            "resources": resources_of(request),
            "code": code,
            "trace_id": trace_id,
            "level": "Request" if self.level == "request" else "Metadata",
        }
        if message:
            entry["message"] = message
        if self.level == "request" and isinstance(request, Message):
            text = json_format.MessageToJson(request, indent=None)
            entry["request"] = (
                json.loads(text) if len(text) <= REQUEST_LIMIT else text[:REQUEST_LIMIT]
            )
        self._write(entry)

    def shed(self, *, method: str, principal: str) -> None:
        """Count a call of `method` by `principal` shed at the door (module doc)."""
        if not self.enabled:
            return
        pending = self._shed.get((method, principal))
        if pending is not None:
            pending[0] += 1
            return
        first = not self._shed
        self._shed[(method, principal)] = [1, time.time()]
        if first:
            try:
                asyncio.get_running_loop().call_later(SHED_EVERY_S, self.flush_shed)
            except RuntimeError:  # no loop to wait on: written now
                self.flush_shed()

    def flush_shed(self) -> None:
        """Write the counts of shed calls kept since the last flush."""
        pending, self._shed = self._shed, {}
        for (method, principal), (count, since) in pending.items():
            self._write(
                {
                    "ts": _timestamp(time.time()),
                    "service": self.service,
                    "instance": self.instance,
                    "method": method,
                    "principal": principal,
                    "resources": {},
                    "code": "RESOURCE_EXHAUSTED",
                    "reason": "OVERLOADED",
                    "count": count,
                    "since": _timestamp(since),
                    "trace_id": "",
                    "level": "Request" if self.level == "request" else "Metadata",
                    "message": f"{count} call(s) shed as overloaded since {_timestamp(since)}: "
                    "nothing was done",
                }
            )

    def _write(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry, ensure_ascii=False, default=str)
        try:
            if self._file is not None:
                self._file.write(line + "\n")
            else:
                log.info(line, extra={"audit": True})
        except OSError:
            # A full disk must not fail the calls themselves; the service log says so.
            logging.getLogger("lightpath.server").exception(
                "cannot write the audit log %s", self.destination
            )

    def close(self) -> None:
        self.flush_shed()
        if self._file is not None:
            self._file.close()
            self._file = None


def _timestamp(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when)) + f".{int(when % 1 * 1000):03d}Z"
