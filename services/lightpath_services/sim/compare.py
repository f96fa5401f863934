"""Several configurations on the same workload and failure seed, side by side, and
the files a run writes (issue 29)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from lightpath_services.sim import report
from lightpath_services.sim.engine import POLICIES, Result, SimConfig, simulate
from lightpath_services.sim.workload import TraceJob


def run_many(
    jobs: list[TraceJob], base: SimConfig, policies: list[str], progress=None
) -> tuple[dict[str, Result], list[dict[str, Any]]]:
    results: dict[str, Result] = {}
    summaries = []
    for name in policies:
        config = replace(base, policy=POLICIES[name])
        if progress:
            progress(f"simulating {len(jobs)} jobs with policy {name} …")
        res = simulate(jobs, config)
        results[name] = res
        summaries.append(report.summary(res, config, name))
    return results, summaries


def write_outputs(
    out: Path, results: dict[str, Result], summaries: list[dict[str, Any]], extra: dict
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    path = out / "summary.json"
    path.write_text(json.dumps({**extra, "runs": summaries}, indent=2, default=_nan) + "\n")
    written.append(path)
    for label, res in results.items():
        p = out / f"jobs-{label}.csv"
        report.write_jobs_csv(res, p)
        written.append(p)
    p = out / "utilisation.png"
    report.plot_utilisation(results, p)
    written.append(p)
    p = out / "wait_jct_cdf.png"
    report.plot_cdfs(results, p)
    written.append(p)
    if len(summaries) > 1:
        p = out / "policies.png"
        report.plot_bars(summaries, p)
        written.append(p)
    return written


def _nan(x: Any) -> Any:
    if isinstance(x, float) and math.isnan(x):
        return None
    raise TypeError(f"not JSON: {x!r}")


def table(summaries: list[dict[str, Any]]) -> list[list[str]]:
    """Rows for a person: one per configuration."""
    rows = [
        [
            "policy",
            "util healthy",
            "util all",
            "wait mean h",
            "wait p50 h",
            "wait p99 h",
            "largest wait h",
            "largest max h",
            "JCT p99 h",
            "lost %",
            "frag %",
            "preempt",
            "swaps",
        ]
    ]
    for s in summaries:
        lost = s["goodput_lost_failures"] + s["goodput_lost_preemption"] + s["goodput_lost_defrag"]
        rows.append(
            [
                s["label"],
                f"{100 * s['utilisation_healthy']:.1f} %",
                f"{100 * s['utilisation_all']:.1f} %",
                _h(s["wait_s"].get("mean")),
                _h(s["wait_s"].get("p50")),
                _h(s["wait_s"].get("p99")),
                _h(s["largest_wait_s"].get("mean")),
                _h(s["largest_wait_s"].get("max")),
                _h(s["jct_s"].get("p99")),
                f"{100 * lost:.2f}",
                f"{100 * s['fragmentation']:.1f}",
                str(s["preemptions"]),
                str(s["swaps"]),
            ]
        )
    return rows


# idle_by_cause's causes in a person's words, in their order (engine.IDLE_CAUSES): a
# column's name and what it means
IDLE_WORDS = {
    "wiring": ("wiring", "held by slices being wired"),
    "queue_empty": ("no job waits", "free, and no job waits for them"),
    "down_host_blocks": (
        "down-host blocks",
        "free in blocks with a down host: only sub-block slices fit",
    ),
    "shared_blocks": ("shared blocks", "free in blocks of sub-block slices: only those fit"),
    "blocks_kept": (
        "blocks kept",
        "free blocks enough for a waiting job, kept out by the policy (a reservation, FIFO's head)",
    ),
    "quota": ("quota refuses", "free blocks enough for a job its tenant's quota refuses"),
    "jobs_above_nominal": (
        "above nominal",
        "too few free blocks, and every waiting job is larger than its tenant's nominal quota",
    ),
    "blocks_too_few": ("too few blocks", "fewer free blocks than any waiting job needs"),
    "static_fragments": ("no box fits", "the static torus: free, and no waiting job's box fits"),
}


def _idle_causes_shown(summaries: list[dict[str, Any]]) -> list[str]:
    return [c for c in IDLE_WORDS if any(s["idle_by_cause"].get(c) for s in summaries)]


def idle_rows(summaries: list[dict[str, Any]]) -> list[list[str]]:
    """Per configuration, its idle healthy chips by cause (the causes some run has)."""
    causes = _idle_causes_shown(summaries)
    rows = [["policy", *(IDLE_WORDS[c][0] for c in causes), "idle in all"]]
    for s in summaries:
        idle = s["idle_by_cause"]
        rows.append(
            [
                s["label"],
                *(f"{100 * idle.get(c, 0.0):.1f}" for c in causes),
                f"{100 * sum(idle.values()):.1f}",
            ]
        )
    return rows


def idle_legend(summaries: list[dict[str, Any]]) -> list[str]:
    """What each column of idle_rows means."""
    return [f"{IDLE_WORDS[c][0]}: {IDLE_WORDS[c][1]}" for c in _idle_causes_shown(summaries)]


def _h(seconds: float | None) -> str:
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    return f"{seconds / 3600:.2f}"
