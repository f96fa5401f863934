"""Benchmark: the wall and CPU time of `python3 dev.py test` (issue 31: at most 4 minutes
on a quiet 2-core machine from a warm venv).

    python3 dev.py bench suite_time [--profile] [PYTEST ARGS ...]

Runs the test command as CI does (extra arguments go to pytest) and prints one JSON line:
`wall_s`, `cpu_s` (user + system of every process the run waited for: pytest, its
workers and what they started; the compose stack's containers run under the engine and
are not in it), `cpu_cores` (cpu_s / wall_s), `goal_s` and `met`, the 1-minute load
before the run (`load_before`: what others ran; the goal is for a quiet machine, so a
figure taken above ~2 says little) and while it ran (`load_median`, `load_max`, this run
included), `cores`, and pytest's `passed`, `failed`, `errors`, `skipped` and the ids of
the tests that failed (`failures`), and when the run failed `log`, a file with pytest's
output (else null).
CPU seconds grow with the load too (two workers a core sharing caches with other jobs):
compare runs taken at similar loads.

`--profile` adds where the time went (tests/suite_profile.py records each test): `profile`
with `worker_cpu_s` (CPU the workers spent in tests), `children_cpu_s` (the processes the
tests started and reaped), per worker its busy seconds and when it ran out of work
(`workers`), `idle_tail_s` (the run's end minus the first worker's last test: how long
some worker sat idle before the end), the `files` that cost most (CPU in the worker and in
children, wall summed over their tests, tests) and the `longest` tests with when they
started (seconds into the run): a long test that starts late makes the tail.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

from _common import emit

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 240.0


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def profile(directory: Path, top: int = 15) -> dict:
    """Where the time went, from tests/suite_profile.py's rows (see the module doc)."""
    rows = [json.loads(line) for f in directory.glob("*.jsonl") for line in f.open()]
    if not rows:
        return {}
    begin, end = min(r["start"] for r in rows), max(r["end"] for r in rows)
    workers: dict[str, dict[str, float]] = defaultdict(lambda: {"busy_s": 0.0, "done_s": 0.0})
    files: dict[str, dict[str, float]] = defaultdict(
        lambda: {"cpu_s": 0.0, "children_cpu_s": 0.0, "wall_s": 0.0, "tests": 0}
    )
    for r in rows:
        w = workers[r["worker"]]
        w["busy_s"] += r["end"] - r["start"]
        w["done_s"] = max(w["done_s"], r["end"] - begin)
        f = files[r["id"].split("::")[0]]
        f["cpu_s"] += r["cpu_s"]
        f["children_cpu_s"] += r["children_cpu_s"]
        f["wall_s"] += r["end"] - r["start"]
        f["tests"] += 1
    costly = sorted(files.items(), key=lambda kv: -(kv[1]["cpu_s"] + kv[1]["children_cpu_s"]))
    longest = sorted(rows, key=lambda r: r["start"] - r["end"])[:top]
    return {
        "worker_cpu_s": sum(r["cpu_s"] for r in rows),
        "children_cpu_s": sum(r["children_cpu_s"] for r in rows),
        "workers": dict(sorted(workers.items())),
        "idle_tail_s": end - begin - min(w["done_s"] for w in workers.values()),
        "files": dict(costly[:top]),
        "longest": [
            {"id": r["id"], "wall_s": r["end"] - r["start"], "started_s": r["start"] - begin}
            for r in longest
        ],
    }


def main(args: list[str]) -> int:
    profiling = "--profile" in args
    args = [a for a in args if a != "--profile"]
    env = dict(os.environ)
    if profiling:
        env["LIGHTPATH_SUITE_PROFILE"] = tempfile.mkdtemp(prefix="lightpath-suite-")
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
        env=env,
    )
    wall = time.monotonic() - start
    done.set()
    watcher.join()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = used.ru_utime + used.ru_stime
    where: dict = {}
    if profiling:
        where = profile(Path(env["LIGHTPATH_SUITE_PROFILE"]))
        shutil.rmtree(env["LIGHTPATH_SUITE_PROFILE"], ignore_errors=True)
    log = None
    if run.returncode != 0:  # what failed and why, kept for whoever reads the JSON
        fd, log = tempfile.mkstemp(prefix="lightpath-suite-", suffix=".log")
        with os.fdopen(fd, "w") as f:
            f.write(run.stdout + run.stderr)
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
            "log": log,
            **({"profile": where} if profiling else {}),
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
