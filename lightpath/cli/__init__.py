"""The `lightpath` command line (X-6): for people, and for scripts with `--json`.

Each topic registers its subcommands from its own module, listed in
COMMAND_MODULES, so topics grow without touching each other. `--as IDENTITY`
is global: accepted before the command or after it, at any depth.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from pathlib import Path

from lightpath import __version__

COMMAND_MODULES = (
    "lightpath.cli.stack",
    "lightpath.cli.security",
    "lightpath.cli.audit",
    "lightpath.cli.ocs",
    "lightpath.cli.switches",
    "lightpath.cli.pod",
    "lightpath.cli.agg",
    "lightpath.cli.cores",
    "lightpath.cli.graph",
    "lightpath.cli.cell",
    "lightpath.cli.quota",
    "lightpath.cli.completion",
    "lightpath.cli.contexts",
    "lightpath.cli.lifecycle",
    "lightpath.cli.sim",
)

AS_HELP = (
    "act as IDENTITY with the local stack's credential: operator (the default), "
    "a tenant (acme or tenant:acme, after `lightpath tenant create acme`) or kind:name"
)

EPILOG = """\
who you are (every command that calls a service):
  --as IDENTITY          the local stack's certificate of IDENTITY (see above); for the
                         command it sets aside LIGHTPATH_TLS_* and LIGHTPATH_TOKEN*
  --state-dir DIR, LIGHTPATH_STATE_DIR
                         the local stack's directory; its pki/ holds the CA and the
                         certificates `lightpath up` issued. Default: the current
                         context's (`lightpath up` makes its stack the current context,
                         so commands find it from any directory), else ./.lightpath
  LIGHTPATH_IDENTITY     as --as, for every command (the local stack's certificate of it)
  LIGHTPATH_TLS_CA, LIGHTPATH_TLS_CERT, LIGHTPATH_TLS_KEY
                         your own PKI: the CA to trust, your certificate and its key
  LIGHTPATH_TOKEN, LIGHTPATH_TOKEN_FILE
                         a bearer token (`lightpath token create`), sent on every call;
                         the principal it names is the caller, certificate or not
  LIGHTPATH_PLAINTEXT=true
                         no TLS (a plaintext deployment)
  LIGHTPATH_CONFIG, LIGHTPATH_CONTEXT
                         contexts: remote stacks' addresses and credentials in a config
                         file (default ~/.config/lightpath/config.toml), and the one to use
`lightpath whoami` shows what a command presents; `lightpath audit` shows who did what.
"""


def build_parser() -> argparse.ArgumentParser:
    # imported here, not at the top: grpc (which _common imports) must not load before
    # main() has set GRPC_VERBOSITY
    from lightpath.cli._common import OUTPUT_FORMATS, add_json_flag, output_type

    parser = argparse.ArgumentParser(
        prog="lightpath",
        description="Lightpath control plane CLI",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"lightpath {__version__}")
    parser.add_argument("--as", dest="as_identity", metavar="IDENTITY", help=AS_HELP)
    parser.add_argument(
        "--context",
        metavar="NAME",
        help="use the context NAME of the config file (a local stack's directory, or a remote "
        "stack's addresses and credentials; `lightpath contexts` lists them); default "
        "$LIGHTPATH_CONTEXT, else the file's current_context (set by `lightpath up`)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="the local stack's directory (default $LIGHTPATH_STATE_DIR, else the current "
        "context's, else ./.lightpath)",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=output_type,
        metavar="FORMAT",
        default=None,
        help="output format of the command (" + ", ".join(OUTPUT_FORMATS) + ")",
    )
    add_json_flag(parser)
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print the command's trace id on stderr (errors always print it): find its "
        "spans and the services' log lines of it by that id",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    _accept_global_flags(parser, set())
    return parser


# Accepted after the command too (`lightpath submit j1 --as acme --state-dir X`).
_EVERYWHERE: dict[str, dict] = {
    "--as": {"dest": "as_identity", "metavar": "IDENTITY", "help": "act as IDENTITY"},
    "--context": {"metavar": "NAME", "help": "use the config file's context NAME"},
    "--state-dir": {"type": Path, "metavar": "DIR", "help": "the local stack's directory"},
}
# The global flags whose value a subcommand's own flag of the same name must not reset.
GLOBAL_FLAGS = (*_EVERYWHERE, "-o", "--json", "-v")


def _accept_global_flags(parser: argparse.ArgumentParser, seen: set[int]) -> None:
    """The global flags after the command too, at every level; a subcommand's own flag of
    the same name (`jobs -o wide`) defaults to SUPPRESS, so a subcommand that is not given
    it leaves the value given before the command alone."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for child in action.choices.values():
            if id(child) in seen:
                continue
            seen.add(id(child))
            for flag in GLOBAL_FLAGS:
                own = child._option_string_actions.get(flag)
                if own is not None:
                    own.default = argparse.SUPPRESS
                elif flag in _EVERYWHERE:
                    spec = dict(_EVERYWHERE[flag])
                    spec["help"] += " (see `lightpath --help`)"
                    child.add_argument(flag, default=argparse.SUPPRESS, **spec)
            _accept_global_flags(child, seen)


def main(argv: list[str] | None = None) -> int:
    """Run one command in its own trace (lightpath.cli.tracing); its exit code.

    As the process's entry point (no `argv`: the console script, `python -m lightpath`)
    its imports run without the garbage collector (lightpath.startup); called with
    `argv` (in-process, by tests) it leaves the collector alone."""
    from lightpath.startup import imports_without_gc

    entry = argv is None
    argv = sys.argv[1:] if argv is None else argv
    if not {"-v", "--verbose"} & set(argv):
        # gRPC's C core logs handshake details on stderr ("ssl_transport_security.cc ...
        # Handshake failed"); the CLI's own error says what failed and what to do. -v, or
        # GRPC_VERBOSITY set by the user, keeps them. (Set before any channel exists.)
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    with imports_without_gc() if entry else contextlib.nullcontext():
        from lightpath.cli.tracing import command_span, command_words, failed, print_trace_id

        parser = build_parser()
    if argv[:1] == ["__complete"]:
        from lightpath.cli.completion import complete

        return complete(parser, argv[1:])
    args = parser.parse_args(argv)
    try:
        with command_span(command_words(parser, argv)) as span:
            code = _run(args)
            failed(span, code)
            if args.verbose:
                print_trace_id()
            return code
    except BrokenPipeError:
        return _stdout_closed()


def _stdout_closed() -> int:
    """The reader of stdout went away (`lightpath jobs --json | head`): stop quietly.
    stdout now points at /dev/null, so the interpreter's last flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no real file (captured in tests)
        pass
    finally:
        os.close(devnull)
    return 0


def _run(args: argparse.Namespace) -> int:
    """The command's exit code; the CLI's own errors on stderr, with the trace id (one
    JSON object on stderr when the command prints JSON)."""
    from lightpath.cli._common import (
        OUTPUT,
        CliError,
        acting_as,
        environ_restored,
        output_format,
        print_error,
        report_credentials_error,
        structured,
        wants_json,
    )
    from lightpath.cli.tracing import print_trace_id
    from lightpath.config import ConfigError
    from lightpath.paths import STATE_DIR_FLAG
    from lightpath.security.credentials import CredentialsError
    from lightpath.security.identity import IdentityError
    from lightpath.stack import DEFAULT_PORT_FALLBACK, NoStack

    OUTPUT.json = wants_json(args)
    OUTPUT.format = output_format(args)
    if structured(OUTPUT.format):
        args.json = True  # the command prints its answer's data (print_json renders it)
    try:
        with (
            environ_restored(["LIGHTPATH_CONTEXT", "LIGHTPATH_STATE_DIR"]),
            acting_as(getattr(args, "as_identity", None)),
        ):
            if args.context:
                os.environ["LIGHTPATH_CONTEXT"] = args.context
                if not args.state_dir:  # the context named on the command line wins
                    os.environ.pop("LIGHTPATH_STATE_DIR", None)
            if args.state_dir:
                os.environ["LIGHTPATH_STATE_DIR"] = str(args.state_dir.resolve())
                STATE_DIR_FLAG.append("--state-dir")
            DEFAULT_PORT_FALLBACK.append(False)
            try:
                return int(args.func(args) or 0)
            finally:
                STATE_DIR_FLAG.clear()
                DEFAULT_PORT_FALLBACK.pop()
    except ConfigError as exc:
        print_error("CONFIG", str(exc))
        return 2
    except NoStack as exc:
        print_error("NO_STACK", str(exc))
        return 1
    except CliError as exc:
        print_error("CLI", exc.message)
        if not OUTPUT.json:
            print_trace_id()
        return exc.code
    except (CredentialsError, IdentityError) as exc:
        report_credentials_error(exc)
        if not OUTPUT.json:
            print_trace_id()
        return 2


if __name__ == "__main__":
    sys.exit(main())
