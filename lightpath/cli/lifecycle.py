"""`lightpath down` and `lightpath logs`: stop the local stack, read its processes' logs.

    lightpath down                         stop the stack `lightpath up` runs (SIGTERM to it)
    lightpath logs                         every process's log, merged in time order
    lightpath logs cell-scheduler          one process's log
    lightpath logs --trace ID              the lines of one trace (the id an error prints)
    lightpath logs ws-pod-1 -f             follow: new lines as they are written
    lightpath logs --tail 20 --json        the last 20 lines, as the JSON lines they are

A stack's processes write JSON lines to `<state dir>/logs/<process>.log` (stderr of
each process, lightpath.stack); `logs` reads those files, so it needs no service up.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from lightpath.cli._common import CliError, add_json_flag
from lightpath.paths import default_state_dir
from lightpath.stack import running_stack

FOLLOW_POLL_S = 0.2


def register(sub: argparse._SubParsersAction) -> None:
    down = sub.add_parser(
        "down", help="stop the local stack `lightpath up` runs (all its processes and Redis)"
    )
    _state_dir_flag(down)
    down.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds to wait for every process to stop (default 30)",
    )
    add_json_flag(down)
    down.set_defaults(func=cmd_down)

    logs = sub.add_parser(
        "logs",
        help="the local stack's logs: one process's, or all merged; --trace ID for one trace",
    )
    logs.add_argument(
        "process", nargs="?", help="a process (cell-scheduler, ws-pod-1, console, ...); all if none"
    )
    logs.add_argument(
        "--trace", metavar="ID", help="only the lines of this trace (the id an error prints)"
    )
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new lines until Ctrl-C"
    )
    logs.add_argument(
        "--tail", type=int, metavar="N", help="only the last N lines (before following)"
    )
    _state_dir_flag(logs)
    add_json_flag(logs)
    logs.set_defaults(func=cmd_logs)


def _state_dir_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        type=Path,
        help="the stack's directory (default $LIGHTPATH_STATE_DIR or .lightpath)",
    )


# -- down ------------------------------------------------------------------------------


def cmd_down(args: argparse.Namespace) -> int:
    directory = (args.state_dir or default_state_dir()).resolve()
    stack = running_stack(directory)
    if stack is None:
        _say(
            args,
            {"stopped": False, "state_dir": str(directory)},
            f"no stack running in {directory}: nothing to stop",
        )
        return 0
    try:
        os.kill(stack.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    except PermissionError:
        raise CliError(
            f"the stack in {directory} runs as another user (pid {stack.pid}): stop it as them"
        ) from None
    deadline = time.monotonic() + args.timeout
    while _alive(stack.pid):
        if time.monotonic() > deadline:
            raise CliError(
                f"the stack in {directory} (pid {stack.pid}) did not stop in {args.timeout:g} s; "
                f"its processes' logs are in {directory / 'logs'}; `kill -9 {stack.pid}` ends it "
                "(its processes die with it)"
            )
        time.sleep(0.1)
    _say(
        args,
        {"stopped": True, "pid": stack.pid, "state_dir": str(directory)},
        f"stack stopped (pid {stack.pid}, {directory})",
    )
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A child of ours that exited but was not reaped (tests start `up` themselves).
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def _say(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    if args.json:
        print(json.dumps(data))
    else:
        print(text)


# -- logs ------------------------------------------------------------------------------


def cmd_logs(args: argparse.Namespace) -> int:
    directory = (args.state_dir or default_state_dir()).resolve()
    logs = directory / "logs"
    known = sorted(p.name.removesuffix(".log") for p in logs.glob("*.log"))
    if not known:
        raise CliError(
            f"no logs in {logs}: no stack has run in {directory} (`lightpath up` starts one; "
            "--state-dir or LIGHTPATH_STATE_DIR names another directory)"
        )
    if args.process and args.process not in known:
        raise CliError(f"no process {args.process!r} in {directory}: one of {', '.join(known)}")
    names = [args.process] if args.process else known
    files = {name: logs / f"{name}.log" for name in names}
    offsets = {name: 0 for name in names}
    lines: list[tuple[str, str, dict[str, Any] | None]] = []
    for name, path in files.items():
        chunk, offsets[name] = _read_from(path, 0)
        lines += [(name, line, _parse(line)) for line in chunk]
    if len(names) > 1:
        lines.sort(key=lambda entry: (entry[2] or {}).get("ts", ""))
    lines = [entry for entry in lines if _wanted(entry[2], args.trace)]
    if args.tail is not None:
        lines = lines[-args.tail :] if args.tail > 0 else []
    for entry in lines:
        _print_line(args, *entry, prefix=len(names) > 1)
    sys.stdout.flush()
    if not args.follow:
        if args.trace and not lines:
            print(f"no log line of trace {args.trace} in {logs}", file=sys.stderr)
            return 1
        return 0
    try:
        while True:
            time.sleep(FOLLOW_POLL_S)
            for name, path in files.items():
                chunk, offsets[name] = _read_from(path, offsets[name])
                for line in chunk:
                    parsed = _parse(line)
                    if _wanted(parsed, args.trace):
                        _print_line(args, name, line, parsed, prefix=len(names) > 1)
            sys.stdout.flush()
    except KeyboardInterrupt:
        return 0


def _read_from(path: Path, offset: int) -> tuple[list[str], int]:
    """Whole lines of `path` from byte `offset` on, and the offset after the last one
    (a line still being written waits for the next read). A file that shrank (a new
    stack in the same directory truncates nothing, but a rotated log may) is read again
    from its start."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return [], 0
    if size < offset:
        offset = 0
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    text = data[:end].decode("utf-8", errors="replace")
    return [line for line in text.splitlines() if line.strip()], offset + end


def _parse(line: str) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None  # a line not written by the JSON formatter (an interpreter's last words)
    return value if isinstance(value, dict) else None


def _wanted(record: dict[str, Any] | None, trace: str | None) -> bool:
    if not trace:
        return True
    return record is not None and record.get("trace_id") == trace.strip().lower()


def _print_line(
    args: argparse.Namespace,
    name: str,
    line: str,
    record: dict[str, Any] | None,
    *,
    prefix: bool,
) -> None:
    if args.json:
        if record is not None and prefix:
            record = {"process": name, **record}
            line = json.dumps(record, ensure_ascii=False)
        print(line)
        return
    head = f"{name:<16} " if prefix else ""
    if record is None:
        print(head + line)
        return
    trace = f"  trace={record['trace_id']}" if record.get("trace_id") and not args.trace else ""
    extra = f"\n{record['exc']}" if record.get("exc") else ""
    print(
        f"{head}{record.get('ts', '')} {record.get('level', '').upper():<7} "
        f"{record.get('msg', '')}{trace}{extra}"
    )
