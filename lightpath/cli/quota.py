"""Tenants' quotas in the cell (issue 35), through the cell scheduler.

    lightpath quota list                          # every quota with its usage
    lightpath quota usage [TENANT]                # chips held, borrowed, jobs waiting
    lightpath quota set acme --tpu-chips 512 --no-borrowing
    lightpath quota set beta --tpu-chips 256 --cohort lab --borrow tpu=128 --weight 2
    lightpath quota set acme --tpu-chips 128 --pod pod-1   # at most 128 on pod-1
    lightpath quota delete acme [--pod pod-1]

Each with -o table|wide|json|yaml|name|jsonpath=TEMPLATE (`set` and `delete`: the
tenant's row after / as it was). Operators set and delete; a tenant's credential
(`--as acme`) lists its own quota and usage only. A quota with `--pod` caps the
tenant's chips on that pod (besides its cell-wide quota): each row's scope says which.
`list` and `usage` also say which pod the cell holds for a job within its tenant's
nominal quota that no pod could make room for, since when (JSON: `hold`, null when
none; whose job only to operators and to that tenant).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from lightpath.cli._common import (
    CliError,
    age_of,
    output_format,
    print_json,
    print_list,
    structured,
    table,
)
from lightpath.cli.cell import _cell_flag, _run
from lightpath.sdk.cell import AsyncCell
from lightpath.v1 import cell_scheduler_pb2 as cs

NODE_TYPES = ("tpu", "gpu", "npu")


def _chips(raw: str) -> int:
    try:
        n = int(raw, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{raw!r} is not a whole number of chips (e.g. 512)"
        ) from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n} chips: a quota is 0 chips or more")
    return n


def _typed(raw: str) -> tuple[str, int]:
    node_type, sep, n = raw.partition("=")
    if not sep or not node_type:
        raise argparse.ArgumentTypeError(f"{raw!r}: give TYPE=CHIPS, e.g. tpu=128")
    return node_type, _chips(n)


def _per_type_flag(
    p: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup, flag: str, help: str
) -> None:
    p.add_argument(
        flag,
        type=_typed,
        action="append",
        default=[],
        metavar="TYPE=N",
        help=help + " (repeatable)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quota", help="tenants' quotas in the cell: chips per node type")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    v = verbs.add_parser("list", help="every quota with its usage")
    _cell_flag(v, listing=True)
    v.set_defaults(func=cmd_list)

    v = verbs.add_parser("usage", help="chips each tenant holds and borrows, jobs waiting")
    v.add_argument("tenant", nargs="?", default="", help="only this tenant")
    _cell_flag(v, listing=True)
    v.set_defaults(func=cmd_list)

    v = verbs.add_parser("set", help="create or replace a tenant's quota (operators)")
    v.add_argument("tenant", help="the tenant, e.g. acme")
    for t in NODE_TYPES:
        v.add_argument(f"--{t}-chips", type=_chips, metavar="N", help=f"nominal quota in {t} chips")
    _per_type_flag(v, "--chips", "nominal quota of another node type")
    v.add_argument("--cohort", default="", help="tenants of one cohort lend each other idle quota")
    borrow = v.add_mutually_exclusive_group()
    _per_type_flag(
        borrow,
        "--borrow",
        "most chips of TYPE held above the nominal (default: what the cohort lends)",
    )
    borrow.add_argument("--no-borrowing", action="store_true", help="never above the nominal")
    _per_type_flag(
        v, "--lend", "most chips of TYPE lent to the cohort (default: all unused nominal)"
    )
    v.add_argument(
        "--weight", type=float, default=0.0, help="fair-share weight, 0.001 to 1000 (default 1)"
    )
    _pod_flag(v, "cap the tenant's chips on this pod only (no cohort, borrowing or weight)")
    _cell_flag(v)
    v.set_defaults(func=cmd_set)

    v = verbs.add_parser("delete", help="remove a tenant's quota (operators)")
    v.add_argument("tenant", help="the tenant")
    _pod_flag(v, "its quota on this pod (default: the cell-wide one)")
    _cell_flag(v)
    v.set_defaults(func=cmd_delete)


def _pod_flag(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--pod", default="", metavar="POD", help=help)


def quota_of(args: argparse.Namespace) -> cs.Quota:
    nominal = {t: n for t in NODE_TYPES if (n := getattr(args, f"{t}_chips")) is not None}
    nominal.update(dict(args.chips))
    if not nominal:
        raise CliError(
            "give the nominal quota: --tpu-chips N (or --gpu-chips, --npu-chips, --chips TYPE=N)"
        )
    return cs.Quota(
        tenant=args.tenant,
        nominal_chips=nominal,
        cohort=args.cohort,
        borrowing_limit=dict(args.borrow),
        no_borrowing=args.no_borrowing,
        lending_limit=dict(args.lend),
        weight=args.weight,
        pod=args.pod,
    )


# A field of SetQuota's request as the flag that sets it, for errors.
FLAGS: Mapping[str, str] = {
    **{f"quota.nominal_chips[{t}]": f"--{t}-chips" for t in NODE_TYPES},
    "quota.nominal_chips": "--chips",
    "quota.tenant": "TENANT",
    "quota.cohort": "--cohort",
    "quota.borrowing_limit": "--borrow",
    "quota.no_borrowing": "--no-borrowing",
    "quota.lending_limit": "--lend",
    "quota.weight": "--weight",
    "quota.pod": "--pod",
}


def _per_type(chips: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {t}" for t, n in sorted(chips.items())) or "-"


def _limit(q: cs.Quota) -> str:
    if q.no_borrowing:
        return "none"
    return _per_type(q.borrowing_limit) if q.borrowing_limit else "cohort's idle"


def _columns(rows: list[cs.TenantQuota]):
    def columns(wide: bool) -> tuple[list[str], list]:
        out = []
        for r in rows:
            q = r.quota if r.HasField("quota") else None
            row = [
                r.tenant,
                _scope(r.pod),
                _per_type(q.nominal_chips) if q else "(no quota)",
                _per_type(r.used_chips),
                _per_type(r.borrowed_chips),
                (q.cohort or "-") if q and not r.pod else "-",
                _limit(q) if q and not r.pod else "-",
                "-" if r.pod else f"{r.waiting_jobs} ({r.waiting_for_quota} for quota)",
            ]
            if wide:
                row += (
                    ["-", "-", "-"]  # a pod's cap: lending, weight and share are the cell's
                    if r.pod
                    else [
                        _per_type(q.lending_limit) if q and q.lending_limit else "all idle",
                        f"{q.weight:g}" if q else "-",
                        f"{r.share:.3f}",
                    ]
                )
            out.append(row)
        headers = [
            "tenant",
            "scope",
            "quota",
            "used",
            "borrowed",
            "cohort",
            "may borrow",
            "waiting",
        ]
        if wide:
            headers += ["lends", "weight", "share"]
        return headers, out

    return columns


def _scope(pod: str) -> str:
    return f"pod {pod}" if pod else "cell"


def cmd_list(args: argparse.Namespace) -> int:
    async def act(cell: AsyncCell) -> int:
        view = await cell.quota_view(getattr(args, "tenant", ""))
        rows = list(view.quotas)
        hold = view.hold if view.HasField("hold") else None
        print_list(
            args,
            "quotas",
            rows,
            _columns(rows),
            lambda r: r.tenant + (f"@{r.pod}" if r.pod else ""),
            data={"quotas": rows, "hold": hold, "next_page_token": ""},
        )
        if structured(output_format(args)) or output_format(args) == "name":
            return 0
        if not rows:
            print("no quotas yet: `lightpath quota set TENANT --tpu-chips N` sets one")
        if hold is not None:
            print(held_pod_text(hold))
        return 0

    return _run(args, act)


def held_pod_text(hold: cs.PodHold, now: float | None = None) -> str:
    """What a held pod means to the reader, and what to do (an operator, or the tenant
    whose job it is, sees the job; another tenant does not)."""
    since = f"for {age_of(hold.since, now)}"
    if not hold.job_id:
        return (
            f"pod {hold.pod} is held {since} for another tenant's job within its nominal "
            "quota that no pod could make room for: your jobs that would borrow quota go "
            "to other pods or wait until that job starts; jobs within your nominal quota "
            "still go there"
        )
    return (
        f"pod {hold.pod} is held {since} for {hold.tenant}'s job {hold.job_id}: within "
        "its nominal quota, no pod could make room for it, so jobs that would borrow "
        "quota stay off this pod and the room its jobs leave as they end gathers for it. "
        f"It ends by itself when {hold.job_id} starts or leaves the cell queue "
        f"(`lightpath job {hold.job_id}` says why it waits; `lightpath cancel "
        f"{hold.job_id}` ends the hold at once)"
    )


def _one(args: argparse.Namespace, row: cs.TenantQuota, what: str) -> None:
    from lightpath.cli._common import OUTPUT

    if structured(OUTPUT.format):
        print_json(row)
        return
    headers, rows = _columns([row])(False)
    print(what)
    print(table(rows, headers))


def cmd_set(args: argparse.Namespace) -> int:
    quota = quota_of(args)

    async def act(cell: AsyncCell) -> int:
        row = await cell.set_quota(quota)
        on = f" on pod {args.pod}" if args.pod else ""
        _one(args, row, f"quota of {args.tenant}{on} set; it applies to the next admission")
        return 0

    return _run(args, act, flags=FLAGS)


def cmd_delete(args: argparse.Namespace) -> int:
    async def act(cell: AsyncCell) -> int:
        row = await cell.delete_quota(args.tenant, args.pod)
        on = f" on pod {args.pod}" if args.pod else ""
        _one(
            args,
            row,
            f"quota of {args.tenant}{on} deleted (its jobs are no longer limited by it); it was:",
        )
        return 0

    return _run(args, act, flags={"tenant": "TENANT", "pod": "--pod"})
