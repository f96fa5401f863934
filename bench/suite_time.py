"""Benchmark: the wall and CPU time of `python3 dev.py test` (issue 31: at most 4 minutes
on a quiet 2-core machine from a warm venv).

    python3 dev.py bench suite_time [PYTEST ARGS ...]

Runs the test command as CI does (extra arguments go to pytest) and prints one JSON line:
`wall_s`, `cpu_s` (user + system of every process the run waited for: pytest, its
workers and what they started; the compose stack's containers run under the engine and
are not in it), `cpu_cores` (cpu_s / wall_s), `goal_s` and `met`, the 1-minute load
before the run (`load_before`: what others ran; the goal is for a quiet machine, so a
figure taken above ~2 says little) and while it ran (`load_median`, `load_max`, this run
included), `cores`, and pytest's `passed`, `failed`, `errors`, `skipped` and the ids of
the tests that failed (`failures`).
CPU seconds grow with the load too (two workers a core sharing caches with other jobs):
compare runs taken at similar loads.
"""

from __future__ import annotations

import os
import re
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from _common import emit

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 240.0


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def main(args: list[str]) -> int:
    samples: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(5):
            samples.append(_load())

    load_before = _load()
    watcher = threading.Thread(target=sample, daemon=True)
    start = time.monotonic()
    watcher.start()
    run = subprocess.run(
        [sys.executable, str(ROOT / "dev.py"), "test", "-q", *args],
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - start
    done.set()
    watcher.join()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = used.ru_utime + used.ru_stime
    tail = run.stdout.strip().splitlines()[-1:] or [""]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped)", tail[0])}
    emit(
        {
            "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1),
            "cpu_cores": round(cpu / wall, 2),
            "goal_s": GOAL_S,
            "met": wall <= GOAL_S and run.returncode == 0,
            "load_before": load_before,
            "load_median": statistics.median(samples) if samples else load_before,
            "load_max": max(samples, default=load_before),
            "cores": os.cpu_count(),
            "passed": counts.get("passed", 0),
            "failed": counts.get("failed", 0),
            "errors": counts.get("errors", counts.get("error", 0)),
            "skipped": counts.get("skipped", 0),
            "exit": run.returncode,
            "failures": re.findall(r"^(?:FAILED|ERROR) (\S+)", run.stdout, re.M),
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
