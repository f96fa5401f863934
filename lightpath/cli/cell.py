"""The job system's daily commands, all through the cell scheduler (CS-5, X-6), built on
the SDK's cell client (lightpath.sdk.AsyncCell).

    lightpath submit JOB --shape 8x8x4 [--priority 80 | --class high] [--tenant T] ...
    lightpath submit JOB --shape 2x2x1                 # a box inside one block (issue 28)
    lightpath submit JOB --shape 4x4x8 --twisted       # a twisted torus
    lightpath submit JOB --flops 2e20 --deadline 2h [--type tpu]     # shape derived (CS-4)
    lightpath submit JOB --shape 8x8x4 --data 8 --pipeline 4 --layer 8   # SWITCHED pod
    lightpath jobs [--tenant T] [--state running] [--pod pod-1] [--limit 50 | --all]
    lightpath jobs -l team=ml --sort-by .priority -w     # labels, order, then changes
    lightpath job JOB            lightpath watch JOB
    lightpath cancel JOB         lightpath complete JOB
    lightpath pods               lightpath block POD BLOCK --failed | --healthy [--host H]

Each with --json (`watch --json`: one object a line) and -o
table|wide|json|yaml|name|jsonpath=TEMPLATE; `jobs` and `pods` also with --no-headers
and --sort-by. The cell is the local stack's
`cell-scheduler`, or --cell / $LIGHTPATH_CELL_ADDR; no command needs a pod's address.
"""

from __future__ import annotations

import argparse
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime

from lightpath.cli._common import (
    CliError,
    add_json_flag,
    add_list_output,
    add_parallelism_flags,
    age_of,
    clip,
    output_format,
    print_json,
    print_json_line,
    print_list,
    run_rpc,
    short_name,
    structured,
    table,
)
from lightpath.sdk.cell import (
    PREEMPTION_POLICIES,
    PRIORITY_CLASSES,
    AsyncCell,
    fill_degrees,
    job_state,
    parse_shape,
    state_name,
)
from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import workload_scheduler_pb2 as ws

STATUS = {
    cs.POD_STATUS_READY: "READY",
    cs.POD_STATUS_SUSPECT: "SUSPECT",
    cs.POD_STATUS_SILENT: "SILENT",
}
REASON_WIDTH = 60  # the reason column of `jobs`; -o wide shows it whole
# The flag that sets each request field: a refusal naming the field names the flag too.
SUBMIT_FLAGS = {
    "spec.shape": "--shape",
    "spec.unit": "--blocks",
    "spec.twisted": "--twisted",
    "spec.wrap": "--no-wrap",
    "spec.shrink_to": "--shrink-to",
    "spec.priority": "--priority",
    "spec.priority_class": "--class",
    "spec.preemption_policy": "--policy",
    "spec.node_types": "--type",
    "spec.node_type_counts": "--types",
    "spec.parallelism": "--data/--pipeline/--layer",
    "spec.labels": "--label",
    "spec.job_id": "JOB_ID",
    "tenant": "--tenant",
    "preferred_pod": "--pod",
    "require_preferred_pod": "--require-pod",
    "demand.flops": "--flops",
    "demand.chip_hours": "--chip-hours",
    "demand.deadline": "--deadline",
    "demand.node_type": "--type",
    "node_type": "--type",
    "shape": "--shape",
}
BLOCK_FLAGS = {"host": "--host", "health": "--failed/--healthy", "pod_id": "POD"}


def cell_address(addr: str | None) -> str:
    from lightpath.stack import endpoint

    return addr or endpoint("cell-scheduler", "LIGHTPATH_CELL_ADDR")


def _cell_flag(p: argparse.ArgumentParser, *, listing: bool = False) -> None:
    p.add_argument(
        "--cell",
        metavar="HOST:PORT",
        help="cell scheduler address (default: $LIGHTPATH_CELL_ADDR, else the local stack's)",
    )
    if listing:
        add_list_output(p)
    else:
        add_json_flag(p)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="submit a job to the cell (it picks the superpod)")
    p.add_argument(
        "job_id", help="your id for the job, unique in the cell; submitting it again is safe"
    )
    p.add_argument(
        "--shape",
        help="slice shape in chips, e.g. 8x8x4 (or in blocks with --blocks); a box inside "
        "one block, e.g. 2x2x1, shares a block with other small slices",
    )
    p.add_argument("--blocks", action="store_true", help="--shape counts blocks, not chips")
    p.add_argument(
        "--type",
        dest="node_type",
        help="node type of every block, e.g. gpu (default: the pod's first type)",
    )
    p.add_argument("--types", help='blocks per node type, e.g. "tpu:2,gpu:2"')
    p.add_argument("--priority", type=int, default=0, help="1..100, higher wins")
    p.add_argument(
        "--class",
        dest="priority_class",
        type=str.lower,
        choices=sorted(PRIORITY_CLASSES),
        help="priority by class (low 20, medium 50, high 80) when --priority is not given",
    )
    p.add_argument(
        "--policy",
        type=str.lower,
        choices=sorted(PREEMPTION_POLICIES),
        help="what the job accepts when preempted (default delay: suspended, then resumed)",
    )
    p.add_argument(
        "--shrink-to",
        action="append",
        default=[],
        metavar="SHAPE",
        help="with --policy shrink: a smaller shape it accepts (repeatable)",
    )
    p.add_argument("--no-wrap", action="store_true", help="a mesh: no wraparound links")
    p.add_argument(
        "--twisted",
        action="store_true",
        help="a twisted torus: shapes k x k x 2k or k x 2k x 2k in chips, k a multiple of "
        "the block edge, any axis order (4x4x8, 4x8x8 with 4x4x4 blocks)",
    )
    add_parallelism_flags(
        p,
        default=0,
        note=" (a SWITCHED pod's job needs them; those not given: what makes the product, then 1)",
    )
    p.add_argument(
        "--tenant",
        default="",
        help='whose job it is (default: none, the operators\' reserved tenant "default")',
    )
    p.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE", help="kept with the job"
    )
    p.add_argument("--no-wait", action="store_true", help="refuse rather than queue")
    p.add_argument("--flops", type=float, default=0.0, help="compute demand in FLOPs")
    p.add_argument("--chip-hours", type=float, default=0.0, help="... or in chip-hours")
    p.add_argument("--deadline", help="with a demand: 2h, 90m, 3600s or an ISO time")
    p.add_argument(
        "--pod",
        default="",
        metavar="NAME",
        help="put it on this pod when that pod can host it (else on another, as usual)",
    )
    p.add_argument(
        "--require-pod",
        action="store_true",
        help="with --pod: that pod only; the job waits in the cell queue for it",
    )
    p.add_argument(
        "--validate-only", action="store_true", help="say what would happen; submit nothing"
    )
    _cell_flag(p)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser(
        "update", help="change a submitted job's priority or labels (no resubmit needed)"
    )
    p.add_argument("job_id", help="the job's id")
    p.add_argument("--priority", type=int, help="new priority 1..100, higher wins")
    p.add_argument(
        "--class",
        dest="priority_class",
        type=str.lower,
        choices=sorted(PRIORITY_CLASSES),
        help="new priority by class (low 20, medium 50, high 80)",
    )
    p.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE|KEY-",
        help="set a label, or remove it with KEY- (repeatable)",
    )
    p.add_argument(
        "--replace-labels",
        action="store_true",
        help="the --label ones become all the job's labels (none given: remove every label)",
    )
    _cell_flag(p)
    p.set_defaults(func=cmd_update)

    valid = ", ".join(state_name(v) for v in c.JobState.values() if v)
    p = sub.add_parser("jobs", help="jobs in the cell, newest first")
    p.add_argument("--tenant", default="", help="only this tenant's")
    p.add_argument(
        "--state",
        action="append",
        default=[],
        help=f"only jobs in this state (repeatable; any case): {valid}",
    )
    p.add_argument("--pod", default="", help="only jobs on this pod")
    p.add_argument("--limit", type=int, default=50, help="at most this many (one page)")
    p.add_argument("--all", action="store_true", help="every job, page after page")
    p.add_argument("--page-token", default="", help="the next page, from a previous listing")
    p.add_argument(
        "-l",
        "--selector",
        action="append",
        default=[],
        metavar="SELECTOR",
        help="only jobs whose labels match (kubectl's): team=ml, team!=ml, team, !team; "
        "comma-separated or repeated, all must hold (looks at every job, not one page)",
    )
    p.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help="after the list, print each job again when it changes (Ctrl-C ends)",
    )
    _cell_flag(p, listing=True)
    p.set_defaults(func=cmd_jobs)

    for name, helptext, func in (
        ("job", "one job: state, pod, blocks, history", cmd_job),
        ("cancel", "cancel a job (in the cell queue or on its pod)", cmd_cancel),
        ("complete", "report that a job's workload finished", cmd_complete),
        ("watch", "follow a job's transitions until it ends", cmd_watch),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("job_id", help="the job's id")
        if name == "cancel":
            p.add_argument("--reason", default="", help="why, kept with the job")
        _cell_flag(p)
        p.set_defaults(func=func)

    p = sub.add_parser("pods", help="the cell's superpods: status, capacity, jobs")
    _cell_flag(p, listing=True)
    p.set_defaults(func=cmd_pods)

    p = sub.add_parser(
        "block", help="report a block (or one host of it) of a pod FAILED or recovered (HEALTHY)"
    )
    p.add_argument("pod_id", help="the pod, e.g. pod-1")
    p.add_argument("block_id", type=int, help="the block's id in the pod")
    health = p.add_mutually_exclusive_group(required=True)
    health.add_argument("--failed", action="store_true", help="the block (or host) failed")
    health.add_argument("--healthy", action="store_true", help="the block (or host) recovered")
    p.add_argument(
        "--host",
        type=_host_index,
        metavar="H",
        help="one host of the block only: 0..hosts-1, x fastest over the block's hosts "
        "(16 hosts of 2x2x1 chips in a 4x4x4 block)",
    )
    p.add_argument("--reason", default="", help="why, kept with the event")
    _cell_flag(p)
    p.set_defaults(func=cmd_block)


def _host_index(raw: str) -> int:
    try:
        host = int(raw)
    except ValueError:
        host = -1
    if host < 0:
        raise argparse.ArgumentTypeError(
            f"{raw!r} is not a host index (a whole number >= 0, x fastest over the block's hosts)"
        )
    return host


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


def submit_options(args: argparse.Namespace) -> dict:
    """AsyncCell.submit's keyword arguments from the command line."""
    try:
        shrink_to = [parse_shape(s) for s in args.shrink_to]
        shape = parse_shape(args.shape) if args.shape else None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    types: dict[str, int] = {}
    if args.types:
        for part in args.types.split(","):
            name, _, n = part.partition(":")
            types[name.strip()] = int(n or 1)
    degrees = (args.data, args.pipeline, args.layer)
    return {
        "shape": shape,
        "blocks": args.blocks,
        "node_type": None if args.types else args.node_type,
        "node_types": types,
        "priority": args.priority,
        "priority_class": args.priority_class,
        "preemption": args.policy,
        "shrink_to": shrink_to,
        "wrap": not args.no_wrap,
        "parallelism": _degrees(shape, args.blocks, degrees) if any(degrees) else None,
        "labels": dict(kv.partition("=")[::2] for kv in args.label),
        "tenant": args.tenant,
        "wait": not args.no_wait,
        "flops": args.flops,
        "chip_hours": args.chip_hours,
        "deadline": parse_deadline(args.deadline) if args.deadline else None,
        "validate_only": args.validate_only,
        "pod": args.pod,
        "require_pod": args.require_pod,
        "twisted": args.twisted,
    }


def label_changes(raw: list[str]) -> dict[str, str | None]:
    """`--label` arguments: KEY=VALUE sets, KEY- removes (None)."""
    out: dict[str, str | None] = {}
    for item in raw:
        key, eq, value = item.partition("=")
        if eq:
            out[key] = value
        elif item.endswith("-") and len(item) > 1:
            out[item[:-1]] = None
        else:
            raise CliError(f"--label {item!r}: give KEY=VALUE to set a label or KEY- to remove it")
    return out


def _degrees(
    shape: list[int] | None, blocks: bool, degrees: tuple[int, int, int]
) -> tuple[int, int, int]:
    """The degrees given, those not given filled in for a chip shape (`fill_degrees`)."""
    if shape is None or blocks:
        return fill_degrees(0, *degrees)
    return fill_degrees(math.prod(shape), *degrees)


def _coords(values) -> str:
    return "(" + ",".join(map(str, values)) + ")"


def describe_box(box) -> str:
    """A sub-block slice's box: "chips 2x2x1 at (0,2,0) of block 17, a mesh, no OCS change"."""
    return (
        f"chips {'x'.join(map(str, box.chips.dims))} at {_coords(box.offset.coords)} "
        f"of block {box.block_id}, a mesh, no OCS change"
    )


def _held(job: cs.CellJob) -> str:
    """What the slice holds, for the job's first line ("" in the cell queue)."""
    if job.block_count:
        return f" ({job.block_count} blocks)"
    if job.pod_job.HasField("box") or job.pod_id:  # on a pod with no whole block: a box
        return " (a box inside one block)"
    return ""


def describe_job(job: cs.CellJob) -> str:
    where = f"on {job.pod_id}" if job.pod_id else "in the cell queue"
    if job.state == c.JOB_STATE_PENDING and job.cell_queue_position:
        where += f" at position {job.cell_queue_position}"
    shape = "x".join(map(str, job.chips.dims))
    twisted = job.spec.twisted or job.pod_job.spec.twisted
    lines = [
        f"job {job.job_id} ({job.tenant}): {state_name(job.state)} {where}, priority {job.priority}"
        + (f", {shape} chips{_held(job)}" if shape else "")
        + (", a twisted torus" if twisted else "")
        + (" derived from its demand" if job.shape_derived else ""),
        f"  reason: {job.reason}" if job.reason else "",
        f"  placed: {job.placement_reason}" if job.placement_reason and job.pod_id else "",
    ]
    if job.pod_job.HasField("box"):
        lines.append(f"  box:    {describe_box(job.pod_job.box)}")
    elif job.pod_job.blocks:
        lines.append(
            "  blocks: "
            + " ".join(
                f"{b.block_id}@({','.join(map(str, b.position.coords))})"
                for b in job.pod_job.blocks
            )
        )
    for e in job.pod_job.history:
        lines.append(
            f"  {e.at.ToJsonString()}  {state_name(e.from_state) if e.from_state else '-'} -> "
            f"{state_name(e.to_state)}  {e.reason}"
        )
    return "\n".join(line for line in lines if line)


def _run(
    args: argparse.Namespace,
    action: Callable[[AsyncCell], Awaitable[int]],
    flags: Mapping[str, str] | None = None,
) -> int:
    """Run `action` with the SDK's cell client; a failed call is reported (_common), a
    field one of `flags` sets named with its flag."""

    async def run() -> int:
        async with AsyncCell(args.cell or None, timeout=60.0) as cell:
            return await action(cell)

    try:
        return run_rpc(run, flags=flags)
    except KeyboardInterrupt:
        return 0


def cmd_submit(args: argparse.Namespace) -> int:
    options = submit_options(args)

    async def act(cell: AsyncCell) -> int:
        resp = await cell.submit(args.job_id, **options)
        if args.json:
            print_json(resp)
            return 0
        if args.validate_only:
            print(f"nothing submitted (--validate-only): {resp.outcome}")
            return 0
        print(describe_job(resp.job))
        print(f"  {resp.outcome}")
        for v in resp.preempted:
            action = short_name(c.PreemptionPolicy, v.action)
            print(f"  preempted {v.job_id} (priority {v.victim_priority}): {action}")
        return 0

    return _run(args, act, SUBMIT_FLAGS)


def cmd_update(args: argparse.Namespace) -> int:
    labels = label_changes(args.label)
    if args.priority is None and args.priority_class is None and not labels:
        if not args.replace_labels:
            raise CliError("nothing to change: give --priority, --class or --label")

    async def act(cell: AsyncCell) -> int:
        job = await cell.update(
            args.job_id,
            priority=args.priority,
            priority_class=args.priority_class,
            labels=labels,
            replace_labels=args.replace_labels,
        )
        if args.json:
            print_json(job)
            return 0
        print(describe_job(job))
        shown = ", ".join(f"{k}={v}" for k, v in sorted(job.spec.labels.items()))
        print(f"  labels: {shown or '(none)'}")
        return 0

    return _run(args, act)


def _job_columns(jobs: list[cs.CellJob]) -> Callable[[bool], tuple[list[str], list]]:
    def columns(wide: bool) -> tuple[list[str], list]:
        headers = ["job", "tenant", "state", "pod", "priority", "chips", "reason", "age"]
        if wide:
            headers[-2:-2] = ["blocks", "queue", "created"]
        rows = []
        for j in jobs:
            row = [
                j.job_id,
                j.tenant,
                state_name(j.state),
                j.pod_id or "(cell queue)",
                j.priority,
                "x".join(map(str, j.chips.dims)) or "-",
            ]
            if wide:
                row += [
                    j.block_count,
                    j.cell_queue_position or "-",
                    j.created_at.ToJsonString() if j.HasField("created_at") else "-",
                    j.reason,
                ]
            else:
                row.append(clip(j.reason, REASON_WIDTH))
            row.append(age_of(j.created_at))
            rows.append(row)
        return headers, rows

    return columns


def cmd_jobs(args: argparse.Namespace) -> int:
    try:
        states = [job_state(s) for s in args.state]
    except ValueError as exc:
        raise CliError(str(exc)) from None

    selector = parse_selector(args.selector)

    async def act(cell: AsyncCell) -> int:
        filters = {"tenant": args.tenant, "states": states, "pod": args.pod}

        async def every() -> list[cs.CellJob]:
            jobs = [j async for j in cell.list_jobs(page_token=args.page_token, **filters)]
            return [j for j in jobs if selector_matches(selector, j.spec.labels)]

        if args.all or selector or args.watch:
            jobs, token = await every(), ""
        else:
            page = await cell.list_jobs_page(
                page_size=args.limit, page_token=args.page_token, **filters
            )
            jobs, token = list(page.jobs), page.next_page_token
        print_list(
            args, "jobs", jobs, _job_columns(jobs), lambda j: j.job_id, next_page_token=token
        )
        if args.watch:
            await _watch_jobs(args, jobs, every)
        return 0

    return _run(args, act)


def parse_selector(raw: list[str]) -> list[tuple[str, str, str]]:
    """`-l` arguments as (key, op, value) with op =, != , exists or !exists."""
    out = []
    for part in (p.strip() for item in raw for p in item.split(",")):
        if not part:
            continue
        m = re.fullmatch(r"(!?)([A-Za-z0-9_./-]+)(?:\s*(==|=|!=)\s*([A-Za-z0-9_./-]*))?", part)
        if not m or (m.group(1) and m.group(3)):
            raise CliError(
                f"-l {part!r}: give key=value, key!=value, key (has it) or !key (has it not), "
                "e.g. -l team=ml"
            )
        bang, key, op, value = m.groups()
        if op:
            out.append((key, "!=" if op == "!=" else "=", value or ""))
        else:
            out.append((key, "!exists" if bang else "exists", ""))
    return out


def selector_matches(selector: list[tuple[str, str, str]], labels: Mapping[str, str]) -> bool:
    for key, op, value in selector:
        have = labels.get(key)
        if (
            (op == "=" and have != value)
            or (op == "!=" and have == value)
            or (op == "exists" and have is None)
            or (op == "!exists" and have is not None)
        ):
            return False
    return True


WATCH_POLL_S = 1.0  # how often `jobs -w` lists the jobs again


async def _watch_jobs(
    args: argparse.Namespace,
    jobs: list[cs.CellJob],
    every: Callable[[], Awaitable[list[cs.CellJob]]],
) -> None:
    """`jobs -w`: each job again, one row (or one JSON line, or its name) a change."""
    import asyncio

    def seen(j: cs.CellJob) -> bytes:
        copy = cs.CellJob()
        copy.CopyFrom(j)
        copy.ClearField("updated_at")
        copy.ClearField("pod_job")
        return copy.SerializeToString(deterministic=True)

    last = {j.job_id: seen(j) for j in jobs}
    fmt = output_format(args)
    while True:
        await asyncio.sleep(WATCH_POLL_S)
        changed = []
        for j in await every():
            if last.get(j.job_id) != seen(j):
                last[j.job_id] = seen(j)
                changed.append(j)
        for j in reversed(changed):  # oldest change first
            if fmt == "name":
                print(j.job_id, flush=True)
            elif structured(fmt):
                print_json_line(j)
            else:
                headers, rows = _job_columns([j])(fmt == "wide")
                print(table(rows, headers, show_headers=False), flush=True)


def _one(method: str) -> Callable[[argparse.Namespace], int]:
    def cmd(args: argparse.Namespace) -> int:
        async def act(cell: AsyncCell) -> int:
            if method == "cancel":
                job = await cell.cancel(args.job_id, args.reason)
            else:
                job = await getattr(cell, method)(args.job_id)
            if args.json:
                print_json(job)
            else:
                print(describe_job(job))
            return 0

        return _run(args, act)

    return cmd


cmd_job = _one("get")
cmd_cancel = _one("cancel")
cmd_complete = _one("complete")


def cmd_watch(args: argparse.Namespace) -> int:
    async def act(cell: AsyncCell) -> int:
        async for e in cell.watch(args.job_id):
            if args.json:
                print_json_line(e)
            else:
                where = e.pod_id or "cell"
                print(
                    f"{e.at.ToJsonString()}  [{where}] "
                    f"{state_name(e.from_state) if e.from_state else '-'} -> {state_name(e.to_state)}"
                    f"  {e.reason}",
                    flush=True,
                )
        return 0

    return _run(args, act)


def _pod_columns(pods: list[cs.Pod]) -> Callable[[bool], tuple[list[str], list]]:
    def columns(wide: bool) -> tuple[list[str], list]:
        rows = []
        for p in pods:
            r = p.registration
            kind = short_name(c.FabricKind, r.fabric_kind)
            blocks = ", ".join(f"{t.blocks} {t.node_type}" for t in r.node_types)
            free = ", ".join(f"{t.free}/{t.total} {t.node_type}" for t in p.capacity.types)
            # Chips free for sub-block slices, and the largest box one can get (issue 28).
            chips = ", ".join(
                f"{t.chips_free}/{t.chips_total} (box {t.largest_free_box})"
                for t in p.capacity.types
                if t.chips_total
            )
            failed = sum(t.failed for t in p.capacity.types)
            beat = p.last_heartbeat.ToDatetime(tzinfo=UTC) if p.HasField("last_heartbeat") else None
            age = f"{(datetime.now(UTC) - beat).total_seconds():.1f}s ago" if beat else "-"
            status = STATUS.get(p.status, "?")
            if p.status_reason:
                status += f" ({p.status_reason if wide else clip(p.status_reason, REASON_WIDTH)})"
            row = [
                r.pod_id,
                status,
                kind,
                "x".join(map(str, r.block_shape.dims)),
                blocks,
                free or "-",
                chips or "-",
                failed,
                p.capacity.running_jobs,
                p.cell_jobs,
                age,
                r.endpoint,
            ]
            if wide:
                row += [p.capacity.queued_jobs, ",".join(p.endpoints) or "-"]
            rows.append(row)
        headers = [
            "pod",
            "status",
            "fabric",
            "block",
            "blocks",
            "free",
            "chips free",
            "failed",
            "running",
            "cell jobs",
            "heartbeat",
            "scheduler",
        ]
        if wide:
            headers += ["queued", "replicas"]
        return headers, rows

    return columns


def describe_pods(pods: list[cs.Pod]) -> str:
    from lightpath.cli._common import table

    headers, rows = _pod_columns(pods)(False)
    return table(rows, headers)


def cmd_pods(args: argparse.Namespace) -> int:
    async def act(cell: AsyncCell) -> int:
        pods = await cell.pods()
        print_list(args, "pods", pods, _pod_columns(pods), lambda p: p.registration.pod_id)
        return 0

    return _run(args, act)


def describe_block_report(
    pod_id: str, block_id: int, host: int | None, resp: ws.ReportBlockHealthResponse
) -> str:
    """A block (or host) report's outcome: the pod's action, the slices it moved."""
    what = f"pod {pod_id} block {block_id}" + (f" host {host}" if host is not None else "")
    lines = [f"{what}: {resp.action}"]
    for m in resp.moved:
        was = getattr(m, "from")  # (a Python keyword)
        lines.append(
            f"  moved {m.job_id}: chips {'x'.join(map(str, was.chips.dims))} at "
            f"{_coords(was.offset.coords)} of block {was.block_id} -> "
            f"{_coords(m.to.offset.coords)} of block {m.to.block_id}"
        )
    b = resp.block
    if b.failed_hosts:
        lines.append(
            f"  block {b.block_id}: hosts {', '.join(map(str, b.failed_hosts))} failed, "
            f"{b.chips_free} chips free for sub-block slices"
        )
    if resp.affected_jobs:
        lines.append(f"  affected: {', '.join(resp.affected_jobs)}")
    return "\n".join(lines)


def cmd_block(args: argparse.Namespace) -> int:
    async def act(cell: AsyncCell) -> int:
        resp = await cell.report_block_health(
            args.pod_id, args.block_id, failed=args.failed, reason=args.reason, host=args.host
        )
        if args.json:
            print_json(resp)
        else:
            print(describe_block_report(args.pod_id, args.block_id, args.host, resp))
        return 0

    return _run(args, act, BLOCK_FLAGS)
