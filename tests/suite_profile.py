"""Where the suite's time goes, for bench/suite_time.py (issue 31): loaded by conftest only
when LIGHTPATH_SUITE_PROFILE names a directory. Each process that runs tests (each xdist
worker, or pytest itself with `-n 0`) writes there one JSON line per test: its id, the
worker, when it started and ended (seconds since the epoch: one clock for all workers),
the CPU the worker itself spent on it (setup, call and teardown) and the CPU of the child
processes it started and reaped in that time (services, CLI runs, redis-servers). It
measures; it asserts nothing."""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import IO

import pytest

_out: IO[str] | None = None
_started: dict[str, tuple[float, float, float]] = {}


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def pytest_configure(config: pytest.Config) -> None:
    global _out
    controller = getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput")
    if controller:  # xdist's controller runs no test: its workers write
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    directory = Path(os.environ["LIGHTPATH_SUITE_PROFILE"])
    directory.mkdir(parents=True, exist_ok=True)
    _out = open(directory / f"{worker}-{os.getpid()}.jsonl", "a", buffering=1, encoding="utf-8")


def pytest_runtest_logstart(nodeid: str) -> None:
    if _out is not None:
        _started[nodeid] = (time.time(), time.process_time(), _children_cpu())


def pytest_runtest_logfinish(nodeid: str) -> None:
    if _out is None or nodeid not in _started:
        return
    start, cpu, children = _started.pop(nodeid)
    row = {
        "id": nodeid,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "start": start,
        "end": time.time(),
        "cpu_s": time.process_time() - cpu,
        "children_cpu_s": _children_cpu() - children,
    }
    _out.write(json.dumps(row) + "\n")
