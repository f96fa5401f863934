"""Shared by the benchmarks: percentiles, a private Redis, the one-JSON-line output.

Benchmarks are not tests: they print what they measure and never assert a time.
Run one with `python3 dev.py bench NAME`.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lightpath.embedded_redis import EmbeddedRedis


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of `samples`."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """A real redis-server on a free port for the benchmark's lifetime (AOF off, like the tests)."""
    with (
        tempfile.TemporaryDirectory(prefix="lightpath-bench-") as tmp,
        EmbeddedRedis(tmp, appendonly=False) as server,
    ):
        yield server.url


def redis_pid(url: str) -> int | None:
    """The process id of the redis-server at `url` (for CPU accounting)."""
    import redis

    with redis.Redis.from_url(url) as r:
        return int(r.info("server")["process_id"])


def cpu_seconds(procs: dict[str, int]) -> dict[str, float]:
    """CPU time (user + system) so far of each named process id; "client" is this process."""
    import os

    import psutil

    out = {}
    for name, pid in procs.items():
        t = psutil.Process(pid).cpu_times()
        out[name] = t.user + t.system
    t = psutil.Process(os.getpid()).cpu_times()
    out["client"] = t.user + t.system
    return out


def stack_pids(stack, redis_url: str) -> dict[str, int]:
    """Process ids of a started Stack's services and of its Redis."""
    pids = {name: proc.pid for name, proc in stack.procs.items()}
    pid = redis_pid(redis_url)
    if pid:
        pids["redis"] = pid
    return pids


def cpu_ms_per(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, float]:
    """CPU ms per unit of work (n units) of each process between two `cpu_seconds` readings."""
    return {k: round((after[k] - before[k]) * 1000.0 / max(1, n), 2) for k in after}


def emit(result: dict) -> None:
    """Print the benchmark's result as one JSON line (floats rounded for people)."""

    def tidy(v):
        if isinstance(v, float):
            return round(v, 4)
        if isinstance(v, dict):
            return {k: tidy(x) for k, x in v.items()}
        return v

    print(json.dumps(tidy(result), sort_keys=True), flush=True)
