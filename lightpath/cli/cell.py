"""The job system's daily commands, all through the cell scheduler (CS-5, X-6).

    lightpath submit JOB --shape 8x8x4 [--priority 80 | --class high] [--tenant T] ...
    lightpath submit JOB --flops 2e20 --deadline 2h [--type tpu]     # shape derived (CS-4)
    lightpath jobs [--tenant T] [--state running] [--pod pod-1] [--limit 50]
    lightpath job JOB            lightpath watch JOB
    lightpath cancel JOB         lightpath complete JOB
    lightpath pods               lightpath block POD BLOCK --failed | --healthy

Each with --json. The cell is the local stack's `cell-scheduler`, or --cell /
$LIGHTPATH_CELL_ADDR; no command needs a pod's address.
"""

from __future__ import annotations

import argparse
import math
import re
import time
from datetime import UTC, datetime
from math import prod

from lightpath.cli._common import add_json_flag, print_json, run_rpc, table
from lightpath.client import channel
from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import cell_scheduler_pb2_grpc
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import workload_scheduler_pb2 as ws

POLICIES = {
    "terminate": c.PREEMPTION_POLICY_TERMINATE,
    "delay": c.PREEMPTION_POLICY_DELAY,
    "shrink": c.PREEMPTION_POLICY_SHRINK,
}
CLASSES = {
    "low": c.PRIORITY_CLASS_LOW,
    "medium": c.PRIORITY_CLASS_MEDIUM,
    "high": c.PRIORITY_CLASS_HIGH,
}
STATUS = {
    cs.POD_STATUS_READY: "ready",
    cs.POD_STATUS_SUSPECT: "suspect",
    cs.POD_STATUS_SILENT: "silent",
}


def cell_address(addr: str | None) -> str:
    from lightpath.stack import endpoint

    return addr or endpoint("cell-scheduler", "LIGHTPATH_CELL_ADDR")


def _cell_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cell", help="cell scheduler host:port (default: the local stack's)")
    add_json_flag(p)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="submit a job to the cell (it picks the superpod)")
    p.add_argument("job_id")
    p.add_argument("--shape", help="slice shape in chips, e.g. 8x8x4 (or in blocks with --blocks)")
    p.add_argument("--blocks", action="store_true", help="--shape counts blocks, not chips")
    p.add_argument("--type", dest="node_type", help="node type of every block (default: the pod's)")
    p.add_argument("--types", help='blocks per node type, e.g. "tpu:2,gpu:2"')
    p.add_argument("--priority", type=int, default=0, help="1..100, higher wins")
    p.add_argument("--class", dest="priority_class", choices=sorted(CLASSES))
    p.add_argument("--policy", choices=sorted(POLICIES), help="when preempted (default delay)")
    p.add_argument("--shrink-to", action="append", default=[], help="with --policy shrink")
    p.add_argument("--no-wrap", action="store_true", help="a mesh: no wraparound links")
    p.add_argument("--tenant", default="")
    p.add_argument("--label", action="append", default=[], help="key=value, kept with the job")
    p.add_argument("--no-wait", action="store_true", help="refuse rather than queue")
    p.add_argument("--flops", type=float, default=0.0, help="compute demand in FLOPs (CS-4)")
    p.add_argument("--chip-hours", type=float, default=0.0, help="... or in chip-hours")
    p.add_argument("--deadline", help="with a demand: 2h, 90m, 3600s or an ISO time")
    p.add_argument("--validate-only", action="store_true", help="say what would happen")
    _cell_flag(p)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("jobs", help="jobs in the cell, newest first")
    p.add_argument("--tenant", default="")
    p.add_argument("--state", action="append", default=[], help="e.g. running (repeatable)")
    p.add_argument("--pod", default="")
    p.add_argument("--limit", type=int, default=50)
    _cell_flag(p)
    p.set_defaults(func=cmd_jobs)

    for name, helptext, func in (
        ("job", "one job: state, pod, blocks, history", cmd_job),
        ("cancel", "cancel a job (in the cell queue or on its pod)", cmd_cancel),
        ("complete", "report that a job's workload finished", cmd_complete),
        ("watch", "follow a job's transitions until it ends", cmd_watch),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("job_id")
        if name == "cancel":
            p.add_argument("--reason", default="")
        _cell_flag(p)
        p.set_defaults(func=func)

    p = sub.add_parser("pods", help="the cell's superpods: status, capacity, jobs")
    _cell_flag(p)
    p.set_defaults(func=cmd_pods)

    p = sub.add_parser("block", help="report a block of a pod FAILED or recovered (HEALTHY)")
    p.add_argument("pod_id")
    p.add_argument("block_id", type=int)
    health = p.add_mutually_exclusive_group(required=True)
    health.add_argument("--failed", action="store_true")
    health.add_argument("--healthy", action="store_true")
    p.add_argument("--reason", default="")
    _cell_flag(p)
    p.set_defaults(func=cmd_block)


def _dims(raw: str) -> list[int]:
    try:
        return [int(p) for p in raw.lower().split("x")]
    except ValueError:
        raise SystemExit(f"shape {raw!r} must look like 8x8x4") from None


def parse_deadline(raw: str, now: float | None = None) -> datetime:
    """`2h`, `90m`, `3600s`, `1d` from now, or an ISO 8601 time. A duration counts from
    the next whole second plus one, so the time left when the cell sizes the slice is
    not a few milliseconds short of what was asked (which could cost a chip)."""
    now = time.time() if now is None else now
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", raw)
    if m:
        seconds = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        return datetime.fromtimestamp(math.ceil(now) + 1 + seconds, UTC)
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        raise SystemExit(f"deadline {raw!r} must look like 2h, 90m, 3600s or an ISO time") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def submit_request(args: argparse.Namespace) -> cs.SubmitJobRequest:
    spec = ws.JobSpec(job_id=args.job_id, priority=args.priority)
    if args.shape:
        dims = _dims(args.shape)
        spec.shape.CopyFrom(c.Shape(dims=dims))
        if args.blocks:
            spec.unit = c.SHAPE_UNIT_BLOCKS
        if args.no_wrap:
            spec.wrap.extend([False] * len(dims))
    if args.priority_class:
        spec.priority_class = CLASSES[args.priority_class]
    if args.policy:
        spec.preemption_policy = POLICIES[args.policy]
    for s in args.shrink_to:
        spec.shrink_to.add(dims=_dims(s))
    if args.types:
        for part in args.types.split(","):
            name, _, n = part.partition(":")
            spec.node_type_counts[name.strip()] = int(n or 1)
    elif args.node_type and args.shape and args.blocks:
        spec.node_type_counts[args.node_type] = prod(_dims(args.shape))
    for kv in args.label:
        k, _, v = kv.partition("=")
        spec.labels[k] = v
    if args.no_wait:
        spec.when_no_capacity = ws.WHEN_NO_CAPACITY_FAIL
    req = cs.SubmitJobRequest(spec=spec, tenant=args.tenant, validate_only=args.validate_only)
    if args.flops or args.chip_hours or args.deadline:
        req.demand.flops = args.flops
        req.demand.chip_hours = args.chip_hours
        if args.node_type:
            req.demand.node_type = args.node_type
        if args.deadline:
            req.demand.deadline.FromDatetime(parse_deadline(args.deadline))
    return req


def _state(s: int) -> str:
    return c.JobState.Name(s).removeprefix("JOB_STATE_")  # type: ignore[arg-type]


def describe_job(job: cs.CellJob) -> str:
    where = f"on {job.pod_id}" if job.pod_id else "in the cell queue"
    if job.state == c.JOB_STATE_PENDING and job.cell_queue_position:
        where += f" at position {job.cell_queue_position}"
    shape = "x".join(map(str, job.chips.dims))
    lines = [
        f"job {job.job_id} ({job.tenant}): {_state(job.state)} {where}, priority {job.priority}"
        + (f", {shape} chips ({job.block_count} blocks)" if shape else "")
        + (" derived from its demand" if job.shape_derived else ""),
        f"  reason: {job.reason}" if job.reason else "",
        f"  placed: {job.placement_reason}" if job.placement_reason and job.pod_id else "",
    ]
    if job.pod_job.blocks:
        lines.append(
            "  blocks: "
            + " ".join(
                f"{b.block_id}@({','.join(map(str, b.position.coords))})"
                for b in job.pod_job.blocks
            )
        )
    for e in job.pod_job.history:
        lines.append(
            f"  {e.at.ToJsonString()}  {_state(e.from_state) if e.from_state else '-'} -> "
            f"{_state(e.to_state)}  {e.reason}"
        )
    return "\n".join(line for line in lines if line)


def _run(args: argparse.Namespace, action, *, stream: bool = False) -> int:
    address = cell_address(args.cell)

    async def run() -> int:
        async with channel(address, default_timeout=None if stream else 60.0) as ch:
            return await action(cell_scheduler_pb2_grpc.CellSchedulerStub(ch))

    try:
        return run_rpc(run)
    except KeyboardInterrupt:
        return 0


async def _blocks_of_type(cell, req: cs.SubmitJobRequest, node_type: str) -> None:
    """--type with a shape in chips: the block count from the block shape of the pods
    that have that type (they must agree)."""
    pods = (await cell.ListPods(cs.ListPodsRequest())).pods
    shapes = {
        tuple(p.registration.block_shape.dims)
        for p in pods
        if any(t.node_type == node_type for t in p.registration.node_types)
    }
    if len(shapes) != 1:
        raise SystemExit(
            f"no single block shape for node type {node_type!r} in the cell ({len(shapes)} found);"
            " give --shape in blocks with --blocks"
        )
    (block,) = shapes
    dims = list(req.spec.shape.dims)
    if len(dims) != len(block) or any(d % b for d, b in zip(dims, block, strict=True)):
        raise SystemExit(f"--shape must be a multiple of the {node_type} block {block}")
    req.spec.node_type_counts[node_type] = prod(d // b for d, b in zip(dims, block, strict=True))


def cmd_submit(args: argparse.Namespace) -> int:
    req = submit_request(args)

    async def act(cell) -> int:
        if args.node_type and args.shape and not args.blocks and not args.types:
            await _blocks_of_type(cell, req, args.node_type)
        resp = await cell.SubmitJob(req)
        if args.json:
            print_json(resp)
            return 0
        print(describe_job(resp.job))
        print(f"  {resp.outcome}")
        for v in resp.preempted:
            action = c.PreemptionPolicy.Name(v.action).removeprefix("PREEMPTION_POLICY_").lower()
            print(f"  preempted {v.job_id} (priority {v.victim_priority}): {action}")
        return 0

    return _run(args, act)


def cmd_jobs(args: argparse.Namespace) -> int:
    states = []
    for s in args.state:
        name = "JOB_STATE_" + s.upper()
        if name not in c.JobState.keys():
            raise SystemExit(f"unknown state {s!r}")
        states.append(c.JobState.Value(name))

    async def act(cell) -> int:
        resp = await cell.ListJobs(
            cs.ListCellJobsRequest(
                tenant=args.tenant, states=states, pod_id=args.pod, page_size=args.limit
            )
        )
        if args.json:
            print_json(resp)
            return 0
        rows = [
            (
                j.job_id,
                j.tenant,
                _state(j.state),
                j.pod_id or "(cell queue)",
                j.priority,
                "x".join(map(str, j.chips.dims)) or "-",
                j.reason[:60],
            )
            for j in resp.jobs
        ]
        print(table(rows, ["job", "tenant", "state", "pod", "priority", "chips", "reason"]))
        return 0

    return _run(args, act)


def _one(method: str, make):
    def cmd(args: argparse.Namespace) -> int:
        async def act(cell) -> int:
            job = await getattr(cell, method)(make(args))
            if args.json:
                print_json(job)
            else:
                print(describe_job(job))
            return 0

        return _run(args, act)

    return cmd


cmd_job = _one("GetJob", lambda a: cs.GetCellJobRequest(job_id=a.job_id))
cmd_cancel = _one("CancelJob", lambda a: cs.CancelCellJobRequest(job_id=a.job_id, reason=a.reason))
cmd_complete = _one("CompleteJob", lambda a: cs.CompleteCellJobRequest(job_id=a.job_id))


def cmd_watch(args: argparse.Namespace) -> int:
    async def act(cell) -> int:
        async for e in cell.WatchJob(cs.WatchCellJobRequest(job_id=args.job_id)):
            if args.json:
                print_json(e)
            else:
                where = e.pod_id or "cell"
                print(
                    f"{e.at.ToJsonString()}  [{where}] "
                    f"{_state(e.from_state) if e.from_state else '-'} -> {_state(e.to_state)}"
                    f"  {e.reason}",
                    flush=True,
                )
        return 0

    return _run(args, act, stream=True)


def describe_pods(pods: list[cs.Pod]) -> str:
    rows = []
    for p in pods:
        r = p.registration
        kind = c.FabricKind.Name(r.fabric_kind).removeprefix("FABRIC_KIND_").lower()  # type: ignore[arg-type]
        blocks = ", ".join(f"{t.blocks} {t.node_type}" for t in r.node_types)
        free = ", ".join(f"{t.free}/{t.total} {t.node_type}" for t in p.capacity.types)
        failed = sum(t.failed for t in p.capacity.types)
        beat = p.last_heartbeat.ToDatetime(tzinfo=UTC) if p.HasField("last_heartbeat") else None
        age = f"{(datetime.now(UTC) - beat).total_seconds():.1f}s ago" if beat else "-"
        status = STATUS.get(p.status, "?")
        if p.status_reason:
            status += f" ({p.status_reason})"
        rows.append(
            (
                r.pod_id,
                status,
                kind,
                "x".join(map(str, r.block_shape.dims)),
                blocks,
                free or "-",
                failed,
                p.capacity.running_jobs,
                p.cell_jobs,
                age,
                r.endpoint,
            )
        )
    return table(
        rows,
        [
            "pod",
            "status",
            "fabric",
            "block",
            "blocks",
            "free",
            "failed",
            "running",
            "cell jobs",
            "heartbeat",
            "scheduler",
        ],
    )


def cmd_pods(args: argparse.Namespace) -> int:
    async def act(cell) -> int:
        resp = await cell.ListPods(cs.ListPodsRequest())
        if args.json:
            print_json(resp)
        else:
            print(describe_pods(list(resp.pods)))
        return 0

    return _run(args, act)


def cmd_block(args: argparse.Namespace) -> int:
    health = c.BLOCK_HEALTH_FAILED if args.failed else c.BLOCK_HEALTH_HEALTHY

    async def act(cell) -> int:
        resp = await cell.ReportBlockHealth(
            cs.ReportCellBlockHealthRequest(
                pod_id=args.pod_id, block_id=args.block_id, health=health, reason=args.reason
            )
        )
        if args.json:
            print_json(resp)
        else:
            print(f"pod {args.pod_id} block {args.block_id}: {resp.action}")
        return 0

    return _run(args, act)
