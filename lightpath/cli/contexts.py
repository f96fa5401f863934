"""`lightpath contexts`: the config file's contexts (remote stacks), the one in use marked.

See lightpath.config for the file; `lightpath --context NAME COMMAND` uses one.
"""

from __future__ import annotations

import argparse
import os

from lightpath.cli._common import add_list_output, print_list


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "contexts",
        help="the config file's contexts (local stacks `lightpath up` recorded, remote stacks), "
        "the one in use marked",
    )
    add_list_output(p)
    p.set_defaults(func=cmd_contexts)


def cmd_contexts(args: argparse.Namespace) -> int:
    from lightpath.config import config_path, current_context, load_contexts

    path = config_path()
    file_current, contexts = load_contexts(path)
    in_use = current_context()
    rows = sorted(contexts.values(), key=lambda c: c.name)
    data = {
        "config": str(path),
        "current_context": in_use.name if in_use else "",
        "file_current_context": file_current,
        "env_context": os.environ.get("LIGHTPATH_CONTEXT", ""),
        "contexts": [
            {
                "name": c.name,
                "addresses": c.addresses,
                "state_dir": c.state_dir,
                "tls_ca": c.tls_ca,
                "tls_cert": c.tls_cert,
                "tls_key": c.tls_key,
                "token_file": c.token_file,
            }
            for c in rows
        ],
    }

    def columns(wide: bool) -> tuple[list[str], list]:
        return ["current", "name", "stack", "certificate", "token file"], [
            (
                "*" if in_use and c.name == in_use.name else "",
                c.name,
                " ".join(f"{k}={v}" for k, v in sorted(c.addresses.items())) or c.state_dir or "-",
                c.tls_cert or "-",
                c.token_file or "-",
            )
            for c in rows
        ]

    if not rows and not args.json and args.output in (None, "table", "wide"):
        print(f"no contexts in {path}: see `lightpath --help` (LIGHTPATH_CONFIG) and docs/sdk.md")
        return 0
    print_list(args, "contexts", rows, columns, lambda c: c.name, data=data)
    return 0
