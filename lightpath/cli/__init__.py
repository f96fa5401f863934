"""The `lightpath` command line (X-6): for people, and for scripts with `--json`.

Each topic registers its subcommands from its own module, listed in
COMMAND_MODULES, so topics grow without touching each other.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from lightpath import __version__

COMMAND_MODULES = (
    "lightpath.cli.stack",
    "lightpath.cli.ocs",
    "lightpath.cli.pod",
    "lightpath.cli.agg",
    "lightpath.cli.cores",
    "lightpath.cli.graph",
    "lightpath.cli.cell",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lightpath", description="Lightpath control plane CLI")
    parser.add_argument("--version", action="version", version=f"lightpath {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
