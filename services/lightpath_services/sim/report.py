"""What a run reports: one JSON summary, a per-job CSV, PNG plots (issue 29).

Utilisation: chips held by RUNNING slices ÷ healthy chips (chips of hosts that are
up), and ÷ all chips, time-averaged over the arrival window (first to last
arrival: the drain after the last arrival, when nothing new comes, is left out).
Fragmentation: free healthy chips while jobs wait (after each event and its passes,
so none of the waiting jobs could take them, or the EASY reservation keeps them
for the first), ÷ healthy chips, over the same window. `idle_by_cause`: the healthy
chips not working, over the window, each by the first of engine.IDLE_CAUSES that holds
(the pod's geometry, then what the waiting jobs need and their quotas allow; they add
up to one minus the utilisation of healthy chips). Waits (first start −
arrival) and job completion times (end − arrival) by job size. Goodput lost:
chip-seconds of work redone after a checkpoint-restart or lost with a terminated
or failed job, ÷ the chip-seconds the workload asked for.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from lightpath_services.sim.engine import DONE, JobRun, Result, SimConfig

SIZES = (
    ("sub-block", 1, 63),
    ("1-4 blocks", 64, 256),
    ("5-16 blocks", 257, 1024),
    ("17-64 blocks", 1025, 4096),
    (">1 pod", 4097, 1 << 40),
)


def size_class(chips: int) -> str:
    for name, lo, hi in SIZES:
        if lo <= chips <= hi:
            return name
    return SIZES[-1][0]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "mean": sum(values) / len(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values),
    }


def summary(result: Result, config: SimConfig, label: str = "") -> dict[str, Any]:
    jobs = result.jobs
    demand = sum(r.chips * r.trace.duration_s for r in jobs)
    started = [r for r in jobs if r.first_start is not None]
    done = [r for r in jobs if r.state == DONE and r.end is not None]
    waits = [r.first_start - r.trace.arrival_s for r in started]  # type: ignore[operator]
    jcts = [r.end - r.trace.arrival_s for r in done]  # type: ignore[operator]
    by_size: dict[str, dict[str, Any]] = {}
    for name, _, _ in SIZES:
        mine = [r for r in jobs if size_class(r.chips) == name]
        if not mine:
            continue
        w = [r.first_start - r.trace.arrival_s for r in mine if r.first_start is not None]
        j = [r.end - r.trace.arrival_s for r in mine if r.state == DONE and r.end is not None]
        by_size[name] = {"jobs": len(mine), "wait_s": _stats(w), "jct_s": _stats(j)}
    largest = max((r.chips for r in jobs), default=0)
    largest_waits = [
        r.first_start - r.trace.arrival_s
        for r in jobs
        if r.first_start is not None and r.chips >= largest
    ]
    stats = result.stats
    lo, hi = stats["window_s"]
    counters = stats["counters"]
    lost_f = sum(r.lost_failure for r in jobs)
    lost_p = sum(r.lost_preemption for r in jobs)
    lost_d = sum(r.lost_defrag for r in jobs)
    f = config.failures
    return {
        "label": label or config.policy.name,
        "policy": config.policy.name,
        "pods": config.pods,
        "chips": result.stats.get("chips_total", config.pods * 4096),
        "jobs": len(jobs),
        "offered_load": demand / ((hi - lo) * config.pods * 4096) if hi > lo else math.nan,
        "host_availability": f.availability if f else 1.0,
        "restart_s": config.restart_s,
        "reconfig_s": config.reconfig_s,
        "utilisation_healthy": stats["utilisation_healthy"],
        "utilisation_all": stats["utilisation_all"],
        "utilisation_healthy_whole_run": stats["utilisation_healthy_whole_run"],
        "utilisation_no_wait": no_wait_utilisation(jobs, lo, hi, config.pods * 4096),
        "fragmentation": stats["fragmentation"],
        "idle_by_cause": stats["idle_by_cause"],
        "wait_s": _stats(waits),
        "jct_s": _stats(jcts),
        "by_size": by_size,
        "largest_wait_s": _stats(largest_waits),
        "goodput_lost_failures": lost_f / demand if demand else 0.0,
        "goodput_lost_preemption": lost_p / demand if demand else 0.0,
        "goodput_lost_defrag": lost_d / demand if demand else 0.0,
        "completed": counters.get("completed", 0),
        "preempted_terminated": counters.get("preempted", 0),
        "failed": counters.get("failed", 0),
        "preemptions": counters.get("preemptions", 0),
        "suspensions_by_failure": counters.get("suspensions", 0),
        "swaps": counters.get("swaps", 0),
        "moves": counters.get("moves", 0),
        "defrag_moves": counters.get("defrag_moves", 0),
        "ocs_reconfigurations": counters.get("reconfigurations", 0),
        "host_failures": counters.get("host_failures", 0),
        "makespan_s": stats["makespan_s"],
        "window_s": [lo, hi],
    } | ({"quotas": stats["quotas"]} if "quotas" in stats else {})


def no_wait_utilisation(jobs: list[JobRun], lo: float, hi: float, chips: int) -> float:
    """The utilisation (÷ all chips, over the arrival window) if every job started on
    arrival and ran undisturbed, as on a machine too large to make anyone wait: no
    scheduler does more work by the window's end (a job cannot have worked longer than
    since it arrived), so without failures it bounds `utilisation_all`. With
    heavy-tailed durations it lies well below the offered load: much of the work of
    late arrivals falls after the window."""
    if hi <= lo:
        return math.nan
    done = sum(r.chips * min(r.trace.duration_s, max(0.0, hi - r.trace.arrival_s)) for r in jobs)
    return done / (chips * (hi - lo))


CSV_FIELDS = (
    "id",
    "tenant",
    "shape",
    "twisted",
    "chips",
    "size",
    "priority",
    "arrival_s",
    "duration_s",
    "first_start_s",
    "end_s",
    "state",
    "wait_s",
    "jct_s",
    "pod",
    "preemptions",
    "suspensions",
    "swaps",
    "moves",
    "lost_chip_s_failures",
    "lost_chip_s_preemption",
)


def _row(r: JobRun) -> list[Any]:
    t = r.trace
    wait = "" if r.first_start is None else f"{r.first_start - t.arrival_s:.3f}"
    jct = "" if r.end is None or r.state != DONE else f"{r.end - t.arrival_s:.3f}"
    return [
        t.job_id,
        t.tenant,
        "x".join(map(str, t.chips)),
        str(t.twisted).lower(),
        r.chips,
        size_class(r.chips),
        t.priority,
        f"{t.arrival_s:.3f}",
        f"{t.duration_s:.3f}",
        "" if r.first_start is None else f"{r.first_start:.3f}",
        "" if r.end is None else f"{r.end:.3f}",
        r.state,
        wait,
        jct,
        r.pod,
        r.preemptions,
        r.suspensions,
        r.swaps,
        r.moves,
        f"{r.lost_failure:.1f}",
        f"{r.lost_preemption + r.lost_defrag:.1f}",
    ]


def write_jobs_csv(result: Result, path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for r in result.jobs:
            w.writerow(_row(r))


# -- plots -------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series(result: Result, points: int) -> tuple[list[float], list[float]]:
    """Utilisation of healthy chips averaged over `points` equal time bins (days)."""
    s = result.series
    if not s:
        return [], []
    end = s[-1][0]
    width = end / points if end > 0 else 1.0
    busy = [0.0] * points
    healthy = [0.0] * points
    for (t, b, h), (t2, _, _) in zip(s, [*s[1:], (end, 0, 0)], strict=True):
        while t < t2:
            i = min(int(t / width), points - 1)
            edge = min(t2, (i + 1) * width)
            if edge <= t:  # float rounding at a bin's edge
                edge = t2
            busy[i] += b * (edge - t)
            healthy[i] += h * (edge - t)
            t = edge
    xs = [(i + 0.5) * width / 86400 for i in range(points)]
    ys = [b / h if h else 0.0 for b, h in zip(busy, healthy, strict=True)]
    return xs, ys


def plot_utilisation(results: dict[str, Result], path: Path, points: int = 300) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for label, res in results.items():
        xs, ys = _series(res, points)
        ax.plot(xs, [100 * y for y in ys], label=label, linewidth=1.2)
    ax.set_xlabel("simulated time (days)")
    ax.set_ylabel("chips busy (% of healthy chips)")
    ax.set_ylim(0, 105)
    ax.set_title("Utilisation over time")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_cdfs(results: dict[str, Result], path: Path) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for label, res in results.items():
        waits = sorted(
            (r.first_start - r.trace.arrival_s) / 3600
            for r in res.jobs
            if r.first_start is not None
        )
        jcts = sorted(
            (r.end - r.trace.arrival_s) / 3600
            for r in res.jobs
            if r.state == DONE and r.end is not None
        )
        for ax, vals in ((axes[0], waits), (axes[1], jcts)):
            if vals:
                ys = [(i + 1) / len(vals) for i in range(len(vals))]
                ax.plot([max(v, 1e-3) for v in vals], ys, label=label, linewidth=1.2)
    for ax, what in ((axes[0], "wait (hours)"), (axes[1], "job completion time (hours)")):
        ax.set_xscale("log")
        ax.set_xlabel(what + ", log scale")
        ax.set_ylabel("fraction of jobs")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    axes[0].set_title("Queueing delay CDF")
    axes[1].set_title("Job completion time CDF")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bars(summaries: list[dict[str, Any]], path: Path) -> None:
    plt = _pyplot()
    labels = [s["label"] for s in summaries]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.5))
    util = [100 * s["utilisation_healthy"] for s in summaries]
    wait = [s["wait_s"].get("mean", 0) / 3600 for s in summaries]
    lost = [
        100 * (s["goodput_lost_failures"] + s["goodput_lost_preemption"] + s["goodput_lost_defrag"])
        for s in summaries
    ]
    for ax, vals, title, fmt in (
        (axes[0], util, "utilisation (% of healthy chips)", "{:.0f}"),
        (axes[1], wait, "mean wait (hours)", "{:.1f}"),
        (axes[2], lost, "goodput lost (% of work asked)", "{:.1f}"),
    ):
        bars = ax.bar(range(len(vals)), vals, color="#4a7fb5")
        ax.set_xticks(range(len(vals)), labels, rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        for b, v in zip(bars, vals, strict=True):
            ax.annotate(
                fmt.format(v),
                (b.get_x() + b.get_width() / 2, b.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
