"""`lightpath audit`: who did what, from the services' audit logs.

    lightpath audit [--principal acme] [--method CancelJob] [--since 10m] [--denied] [--json]

Reads `<state dir>/audit/*.jsonl` (or --file), also when the stack is stopped,
merges the files by time and filters them; each line is one entry written by
lightpath_services.common.audit (docs/security.md says what an entry holds).
"""

from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import json
import re
import sys
from pathlib import Path
from typing import Any

from lightpath.cli._common import CliError, add_list_output, clip, output_format, print_list
from lightpath.cli.security import state_dir_flag, state_dir_of
from lightpath.security.credentials import identity_of
from lightpath.security.identity import IdentityError

DEFAULT_TABLE_LIMIT = 50
DENIED_CODES = ("PERMISSION_DENIED", "UNAUTHENTICATED")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "audit",
        help="who did what: the audit log of the local stack, merged and filtered",
        description=(
            "Every mutating call and every denied call, from <state dir>/audit/*.jsonl "
            "(or --file), oldest first. Filters combine (AND); a repeated filter matches any of "
            "its values."
        ),
    )
    p.add_argument(
        "--principal",
        action="append",
        default=[],
        help="kind:name, a tenant's name (acme = tenant:acme), or a pattern like 'tenant:*'",
    )
    p.add_argument(
        "--method",
        action="append",
        default=[],
        help="method name or part of it, case-insensitive: SubmitJob, CellScheduler/, cancel",
    )
    p.add_argument("--service", action="append", default=[], help="service or process name")
    p.add_argument("--code", action="append", default=[], help="status code, e.g. NOT_FOUND")
    p.add_argument(
        "--denied",
        action="store_true",
        help="only refused calls (PERMISSION_DENIED, UNAUTHENTICATED)",
    )
    p.add_argument("--since", help="10m, 2h, 1d ago, or an ISO time (UTC unless it says)")
    p.add_argument("--until", help="as --since")
    p.add_argument(
        "--limit",
        type=int,
        help=f"the N most recent matches (default {DEFAULT_TABLE_LIMIT} in the table, "
        "all with --json; 0: all)",
    )
    p.add_argument(
        "--file",
        type=Path,
        action="append",
        default=[],
        help="read these audit files instead of the stack's (repeatable)",
    )
    state_dir_flag(p)
    add_list_output(p)
    p.set_defaults(func=cmd_audit)


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?\s*")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_when(raw: str, now: dt.datetime | None = None) -> dt.datetime:
    """`10m`, `2h`, `1d`, `90s` (that long ago), `now`, or an ISO 8601 time (UTC unless it says)."""
    now = now or dt.datetime.now(dt.UTC)
    if raw.strip() == "now":
        return now
    m = _DURATION.fullmatch(raw)
    if m:
        return now - dt.timedelta(seconds=float(m.group(1)) * _UNIT_S[m.group(2) or "s"])
    try:
        when = dt.datetime.fromisoformat(raw.strip())
    except ValueError:
        raise CliError(
            f"{raw!r} is not a time: give 10m, 2h, 1d (ago) or an ISO time like "
            "2026-01-31T12:00:00Z",
            code=2,
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def entry_time(entry: dict[str, Any]) -> dt.datetime | None:
    try:
        when = dt.datetime.fromisoformat(str(entry["ts"]))
    except (KeyError, ValueError):
        return None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def read_audit(paths: list[Path]) -> tuple[list[dict[str, Any]], int]:
    """Every entry of `paths`, merged oldest first; and how many lines were not entries."""
    timed: list[tuple[dt.datetime, int, dict[str, Any]]] = []
    bad = 0
    n = 0
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    if not line.strip():
                        continue
                    try:
                        entry = json.loads(line)
                    except ValueError:
                        bad += 1  # e.g. a line cut by a crash mid-write
                        continue
                    when = entry_time(entry) if isinstance(entry, dict) else None
                    if when is None:
                        bad += 1
                        continue
                    timed.append((when, n, entry))
                    n += 1
        except OSError as exc:
            raise CliError(f"cannot read the audit log {path}: {exc.strerror}") from None
    timed.sort(key=lambda t: (t[0], t[1]))
    return [e for _, _, e in timed], bad


def _principal_pattern(raw: str) -> str:
    if ":" in raw or any(ch in raw for ch in "*?["):
        return raw
    try:
        return str(identity_of(raw))
    except IdentityError as exc:
        raise CliError(f"--principal {raw!r}: {exc}", code=2) from None


def _matches_method(method: str, wanted: str) -> bool:
    """`SubmitJob`, `submit`, `CellScheduler/` (a part, any case), or a pattern like
    `CellScheduler/*Job` (matching the end of the method)."""
    method_l, wanted_l = method.lower(), wanted.lower()
    if any(ch in wanted for ch in "*?["):
        return fnmatch.fnmatchcase(method_l, "*" + wanted_l)
    return wanted_l in method_l


def filter_audit(entries: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    principals = [_principal_pattern(p) for p in args.principal]
    codes = {c.strip().upper() for c in args.code}
    if args.denied:
        codes = (codes & set(DENIED_CODES)) if codes else set(DENIED_CODES)
        if not codes:
            return []
    since = parse_when(args.since) if args.since else None
    until = parse_when(args.until) if args.until else None
    services = [s.lower() for s in args.service]
    out = []
    for e in entries:
        when = entry_time(e)
        if since and when and when < since:
            continue
        if until and when and when > until:
            continue
        if principals and not any(
            fnmatch.fnmatchcase(str(e.get("principal", "")), p) for p in principals
        ):
            continue
        if args.method and not any(
            _matches_method(str(e.get("method", "")), m) for m in args.method
        ):
            continue
        if codes and str(e.get("code", "")).upper() not in codes:
            continue
        if services and not any(
            s in (str(e.get("service", "")).lower(), str(e.get("instance", "")).lower())
            for s in services
        ):
            continue
        out.append(e)
    return out


def _audit_files(args: argparse.Namespace) -> list[Path]:
    if args.file:
        missing = [str(p) for p in args.file if not p.is_file()]
        if missing:
            raise CliError(f"no audit file {', '.join(missing)}")
        return list(args.file)
    directory = state_dir_of(args) / "audit"
    files = sorted(directory.glob("*.jsonl")) if directory.is_dir() else []
    if not files:
        raise CliError(
            f"no audit log in {directory}: the stack's services write it there once started "
            "with `lightpath up` (point --state-dir at the stack's directory, or give --file)"
        )
    return files


def _resources(value: Any) -> str:
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items()) or "-"
    return str(value or "-")


def cmd_audit(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 0:
        raise CliError("--limit must be 0 (all) or more", code=2)
    files = _audit_files(args)
    entries, bad = read_audit(files)
    matched = filter_audit(entries, args)
    structured = output_format(args) in ("json", "yaml", "name")
    limit = args.limit if args.limit is not None else (0 if structured else DEFAULT_TABLE_LIMIT)
    shown = matched[-limit:] if limit else matched
    if bad:
        print(f"warning: {bad} line(s) of the audit log are not entries; skipped", file=sys.stderr)
    if not shown and not structured:
        print(f"no audit entries match ({len(entries)} read from {len(files)} file(s))")
        return 0

    def columns(wide: bool) -> tuple[list[str], list]:
        rows = [
            (
                str(e.get("ts", "")),
                str(e.get("instance") or e.get("service", "")),
                str(e.get("principal", "")) or "-",
                str(e.get("method", "")).rsplit("/", 1)[-1],
                _resources(e.get("resources")),
                str(e.get("code", "")),
                str(e.get("message", "")) if wide else clip(str(e.get("message", "")), 70),
            )
            for e in shown
        ]
        return ["time", "process", "principal", "method", "resources", "code", "message"], rows

    # the complete entries as one JSON array (-o name: each entry's trace id)
    print_list(args, "entries", shown, columns, lambda e: str(e.get("trace_id", "")), data=shown)
    if len(shown) < len(matched):
        print(
            f"(the last {len(shown)} of {len(matched)} matching entries; --limit 0 shows all)",
            file=sys.stderr,
        )
    return 0
