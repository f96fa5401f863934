"""`lightpath up | status | demo`: the local stack (X-7)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from lightpath.cli._common import add_json_flag, print_json, table
from lightpath.config import (
    LOCAL_CONTEXT,
    ConfigError,
    config_path,
    load_contexts,
    save_local_context,
)
from lightpath.embedded_redis import free_port
from lightpath.paths import local_state_dir, pki_dir, state_dir_and_source
from lightpath.security.credentials import Credentials
from lightpath.stack import (
    CONSOLE_NAME,
    CONSOLE_PORT,
    Stack,
    StackError,
    console_health,
    default_state_dir,
    default_topology,
    ensure_stack,
    health_status,
    running_stack,
    with_ephemeral_ports,
)


def register(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser("up", help="start Redis and every service on loopback; Ctrl-C stops all")
    up.add_argument(
        "--state-dir",
        type=Path,
        help="Redis data, logs, stack.json (default $LIGHTPATH_STATE_DIR or .lightpath)",
    )
    up.add_argument(
        "--ephemeral-ports", action="store_true", help="free ports instead of the fixed 500xx ones"
    )
    up.add_argument(
        "--no-console",
        action="store_true",
        help="do not start the web console (by default on https://127.0.0.1:8443/)",
    )
    up.add_argument(
        "--switch-agents",
        action="store_true",
        default=None,
        help="run each OCS pod's optical switches as a switch agent process that its "
        "ocs_manager programs over the open southbound (default $LIGHTPATH_SWITCH_AGENTS, "
        "else the ocs_manager's own simulation)",
    )
    up.set_defaults(func=cmd_up)

    status = sub.add_parser("status", help="health of each service of the running stack")
    status.add_argument(
        "--state-dir",
        type=Path,
        help="the stack's directory (default $LIGHTPATH_STATE_DIR or .lightpath)",
    )
    add_json_flag(status)
    status.set_defaults(func=cmd_status)

    demo = sub.add_parser(
        "demo", help="run a scenario exercising every service (starts a stack if none runs)"
    )
    demo.add_argument(
        "--state-dir",
        type=Path,
        help="the stack's directory (default $LIGHTPATH_STATE_DIR or .lightpath)",
    )
    demo.set_defaults(func=cmd_demo)


def cmd_up(args: argparse.Namespace) -> int:
    agents = args.switch_agents
    if agents is None:
        raw = os.environ.get("LIGHTPATH_SWITCH_AGENTS", "").strip().lower()
        agents = raw in {"1", "true", "yes", "on"}
        if not agents and raw not in {"", "0", "false", "no", "off"}:
            print(
                f"LIGHTPATH_SWITCH_AGENTS={raw!r} is not a yes or no: set it to 1 or 0",
                file=sys.stderr,
            )
            return 2
    specs = default_topology(switch_agents=agents)
    if args.ephemeral_ports:
        specs = with_ephemeral_ports(specs)
    state_dir = _up_state_dir(args)
    if running_stack(state_dir):
        print(
            f"a stack is already running from {state_dir}; `lightpath status` shows it",
            file=sys.stderr,
        )
        return 1
    console_port = (
        None if args.no_console else (free_port() if args.ephemeral_ports else CONSOLE_PORT)
    )
    stack = Stack(
        state_dir,
        specs=specs,
        redis_port=0 if args.ephemeral_ports else 6390,
        console_port=console_port,
    )
    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        stack.start()
    except StackError as exc:
        print(f"lightpath up failed: {exc}", file=sys.stderr)
        return 1
    print(
        table(
            [(s.name, s.service, f"127.0.0.1:{s.port}", s.metrics_url or "-") for s in stack.specs],
            ["process", "service", "endpoint", "metrics"],
        )
    )
    if stack.console_url:
        print(
            f"\nweb console: {stack.console_url}  (read-only; your browser must trust the "
            f"local CA {stack.ca.cert_path}, or accept its warning once)"
        )
    print(
        f"\nPrometheus: prometheus --config.file={stack.prometheus_file}  (these ports, "
        "the alert rules)"
    )
    context = args.context or LOCAL_CONTEXT
    try:
        config = save_local_context(context, state_dir)
        print(
            f"\ncurrent context: {context} (in {config}): commands from any directory use "
            "this stack"
        )
    except (OSError, ConfigError) as exc:
        print(
            f"\ncould not record the context {context} ({exc}): other directories reach "
            f"this stack with --state-dir {state_dir}",
            file=sys.stderr,
        )
    print(f"\nlogs in {state_dir / 'logs'}; all healthy; Ctrl-C stops everything", flush=True)
    code = 0
    while not stopping:
        dead = stack.dead_processes()
        if dead:
            print(f"stopping the stack: {', '.join(dead)} exited; see the logs", file=sys.stderr)
            code = 1
            break
        time.sleep(0.2)
    stack.stop()
    print("stack stopped", flush=True)
    return code


def _up_state_dir(args: argparse.Namespace) -> Path:
    """Where `up` starts its stack: --state-dir / LIGHTPATH_STATE_DIR, else the directory
    of the context named by --context (when it has one), else ./.lightpath."""
    if args.context and not os.environ.get("LIGHTPATH_STATE_DIR"):
        _, contexts = load_contexts(config_path())
        known = contexts.get(args.context)
        if known is not None and known.state_dir:
            return Path(known.state_dir)
    return local_state_dir()


def no_stack_message() -> str:
    """ "no stack at <dir> (<where that came from>); start one with `lightpath up`"."""
    directory, source = state_dir_and_source()
    return (
        f"no stack at {directory} ({source}); start one with `lightpath up`, or name "
        "another with --context / --state-dir"
    )


def cmd_status(args: argparse.Namespace) -> int:
    stack = running_stack(args.state_dir)
    if stack is None:
        if args.json:
            directory, source = state_dir_and_source()
            print_json(
                {
                    "running": False,
                    "services": {},
                    "state_dir": str(directory),
                    "state_dir_source": source,
                }
            )
        else:
            print(no_stack_message())
        return 1
    creds = Credentials.default(state_dir=args.state_dir)
    statuses = {
        name: {
            "endpoint": addr,
            "health": health_status(addr, credentials=creds),
            "metrics": stack.metrics.get(name, ""),
        }
        for name, addr in stack.endpoints.items()
    }
    console = {
        "url": stack.console,
        "health": console_health(stack.console, pki_dir(args.state_dir) / "ca.crt")
        if stack.console
        else "",
        "metrics": stack.metrics.get(CONSOLE_NAME, ""),
    }
    security = {
        "tls": stack.tls,
        "client_auth": "certificates required" if stack.tls else "bearer tokens (plaintext)",
        "pki_dir": str(pki_dir(args.state_dir)),
        "audit_dir": str((args.state_dir or default_state_dir()) / "audit"),
        "credentials": creds.source,
    }
    if args.json:
        print_json(
            {
                "running": True,
                "pid": stack.pid,
                "redis_url": stack.redis_url,
                "security": security,
                "services": statuses,
                "console": console,
                "prometheus_config": stack.prometheus_config,
            }
        )
    else:
        print(f"stack pid {stack.pid}, redis {stack.redis_url}")
        print(
            ("TLS on, client certificates required" if stack.tls else "plaintext on loopback")
            + f"; calling as {creds.source}; audit log in {security['audit_dir']}"
        )
        print(
            table(
                [(n, s["endpoint"], s["health"], s["metrics"] or "-") for n, s in statuses.items()],
                ["process", "endpoint", "health", "metrics"],
            )
        )
        if stack.console:
            metrics = f"  metrics {console['metrics']}" if console["metrics"] else ""
            print(f"\nweb console: {stack.console}  {console['health']}{metrics}")
        else:
            print("\nno web console (started without it: `lightpath up --no-console`)")
        if stack.prometheus_config:
            print(f"Prometheus: prometheus --config.file={stack.prometheus_config}")
    healthy = all(s["health"] == "SERVING" for s in statuses.values())
    return 0 if healthy and console["health"] in ("", "SERVING") else 1


def cmd_demo(args: argparse.Namespace) -> int:
    import asyncio

    from lightpath.demo import run_demo

    try:
        with ensure_stack(args.state_dir) as endpoints:
            return asyncio.run(run_demo(endpoints))
    except StackError as exc:
        print(f"lightpath demo: the stack did not start: {exc}", file=sys.stderr)
        return 1
