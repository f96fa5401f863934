"""The `lightpath` command line (X-6): for people, and for scripts with `--json`.

Each topic registers its subcommands from its own module, listed in
COMMAND_MODULES, so topics grow without touching each other. `--as IDENTITY`
is global: accepted before the command or after it, at any depth.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

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
  LIGHTPATH_STATE_DIR    the local stack's directory (default .lightpath); its pki/
                         holds the CA and the certificates `lightpath up` issued
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
        help="use the context NAME of the config file (addresses and credentials of a remote "
        "stack; `lightpath contexts` lists them); default $LIGHTPATH_CONTEXT, else the "
        "file's current_context",
    )
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
    _accept_as_everywhere(parser, set())
    return parser


def _accept_as_everywhere(parser: argparse.ArgumentParser, seen: set[int]) -> None:
    """`--as` after the command too (`lightpath submit j1 --as acme`), at every level.
    SUPPRESS: a subcommand that is not given it leaves the global value alone."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for child in action.choices.values():
            if id(child) in seen:
                continue
            seen.add(id(child))
            if "--as" not in child._option_string_actions:
                child.add_argument(
                    "--as",
                    dest="as_identity",
                    metavar="IDENTITY",
                    default=argparse.SUPPRESS,
                    help="act as IDENTITY (see `lightpath --help`)",
                )
            _accept_as_everywhere(child, seen)


def main(argv: list[str] | None = None) -> int:
    """Run one command in its own trace (lightpath.cli.tracing); its exit code."""
    from lightpath.cli.tracing import command_span, command_words, failed, print_trace_id

    argv = sys.argv[1:] if argv is None else argv
    if not {"-v", "--verbose"} & set(argv):
        # gRPC's C core logs handshake details on stderr ("ssl_transport_security.cc ...
        # Handshake failed"); the CLI's own error says what failed and what to do. -v, or
        # GRPC_VERBOSITY set by the user, keeps them. (Set before any channel exists.)
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
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
        print_error,
        report_credentials_error,
        wants_json,
    )
    from lightpath.cli.tracing import print_trace_id
    from lightpath.config import ConfigError
    from lightpath.security.credentials import CredentialsError
    from lightpath.security.identity import IdentityError

    OUTPUT.json = wants_json(args)
    try:
        with environ_restored(["LIGHTPATH_CONTEXT"]), acting_as(getattr(args, "as_identity", None)):
            if args.context:
                os.environ["LIGHTPATH_CONTEXT"] = args.context
            return int(args.func(args) or 0)
    except ConfigError as exc:
        print_error("CONFIG", str(exc))
        return 2
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
