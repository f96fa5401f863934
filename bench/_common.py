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


def emit(result: dict) -> None:
    """Print the benchmark's result as one JSON line (floats rounded for people)."""

    def tidy(v):
        if isinstance(v, float):
            return round(v, 4)
        if isinstance(v, dict):
            return {k: tidy(x) for k, x in v.items()}
        return v

    print(json.dumps(tidy(result), sort_keys=True), flush=True)
