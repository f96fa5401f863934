"""`lightpath pod <id>` for a SWITCHED pod (seed 002): the cluster of processor
groups — which large job holds each group, which groups host small jobs, which
failed — and the use of the row, column and tier-1 switches (SW-6)."""

from __future__ import annotations

from collections import defaultdict

from lightpath.sdk.cell import state_name
from lightpath.v1 import common_pb2, workload_scheduler_pb2

FREE, FAILED = ".", "X"


def render_switched_pod(view: workload_scheduler_pb2.PodView, symbols: str) -> str:
    sw = view.switched
    cfg = sw.fabric.config
    rows, cols = cfg.cluster_rows, cfg.cluster_cols
    shape = "x".join(map(str, cfg.group_shape.dims))
    letters: dict[str, str] = {}
    for j in view.live_jobs:
        if j.job_id not in sw.small_tiles and any(b.job_id == j.job_id for b in view.blocks):
            letters[j.job_id] = symbols[len(letters) % len(symbols)]
    small_in: dict[int, list[str]] = defaultdict(list)
    for job_id, tile in sorted(sw.small_tiles.items()):
        small_in[tile.group].append(job_id)
    reserved = set(sw.small_groups)
    lines = [
        f"pod {view.pod_id} (SWITCHED): {view.block_count} groups of {shape} processors "
        f"in a {rows}x{cols} cluster, {sw.fabric.processors} processors",
        f"  {sw.fabric.spec}",
        "",
        ("group  " + "".join(f"c{c:<3}" for c in range(cols))).rstrip(),
    ]
    for r in range(rows):
        cells = []
        for c in range(cols):
            b = view.blocks[r * cols + c]
            if b.health == common_pb2.BLOCK_HEALTH_FAILED:
                cell = FAILED
            elif b.job_id:
                cell = letters.get(b.job_id, "?")
            elif b.block_id in reserved:
                cell = f"s{len(small_in[b.block_id]) or ''}"
            else:
                cell = FREE
            cells.append(f"{cell:<4}")
        lines.append(f"  r{r:<4}" + "".join(cells).rstrip())
    lines.append("")
    lines.append(
        f"legend: {FREE} free   {FAILED} failed   s<n> reserved for small jobs (n running)   "
        "letters: large jobs"
    )
    states = {j.job_id: j for j in view.live_jobs}
    for job_id, sym in letters.items():
        j = states[job_id]
        lines.append(
            f"  {sym}  {job_id}  {state_name(j.state)}  priority {j.priority}  {j.block_count} groups"
        )
    for job_id, tile in sorted(sw.small_tiles.items()):
        lines.append(
            f"  s  {job_id}  {tile.group_name} rows {tile.row}-{tile.row + tile.height - 1}, "
            f"columns {tile.col}-{tile.col + tile.width - 1}"
        )
    queued = [
        j
        for j in view.live_jobs
        if j.state in (common_pb2.JOB_STATE_PENDING, common_pb2.JOB_STATE_SUSPENDED)
    ]
    if queued:
        lines.append("queue:  " + ", ".join(f"{j.job_id} (p{j.priority})" for j in queued))
    lines.append("")
    lines.extend(render_switch_use(sw.switches))
    return "\n".join(lines)


def render_switch_use(switches) -> list[str]:
    """Per cluster row / column (all planes) and per tier-1 dimension: links carrying a ring."""
    if not switches:
        return ["switch use: the pod's fabric manager did not answer"]
    acc: dict[tuple[int, str, int], list[int]] = {}
    planes: dict[tuple[int, str, int], int] = defaultdict(int)
    for s in switches:
        key = (s.tier, s.dim, s.index if s.tier == 0 else -1)
        a = acc.setdefault(key, [0, 0, 0, 0, 0])
        a[0] += s.down_in_use
        a[1] += s.down_links
        a[2] += s.up_in_use
        a[3] += s.up_links
        a[4] += s.free_uplinks
        planes[key] += 1
    out = [
        "switch use (links carrying a ring / links):",
        f"  {'switches':<22}{'down':>12}{'up':>12}{'free up':>9}",
    ]
    names = {"r": "row", "c": "column"}
    for key in sorted(acc, key=lambda k: (k[0], k[1] != "r", k[2])):
        tier, dim, index = key
        d_use, d_all, u_use, u_all, free = acc[key]
        if tier == 0:
            label = f"{dim}{index}/p* ({planes[key]} {names[dim]})"
        else:
            label = f"t1{dim}/* ({planes[key]} tier-1)"
        out.append(f"  {label:<22}{d_use:>5} / {d_all:<4}{u_use:>5} / {u_all:<4}{free:>7}")
    return out
