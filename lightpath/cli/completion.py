"""`lightpath completion bash|zsh|fish`: shell completion of commands, flags, their
choices, and the names of the stack's jobs, pods and processes.

    source <(lightpath completion bash)                  # ~/.bashrc
    source <(lightpath completion zsh)                   # ~/.zshrc
    lightpath completion fish | source                   # ~/.config/fish/config.fish

The script asks `lightpath __complete WORD...` for the candidates after the words
typed so far, so completion follows the parser itself (every topic's commands,
flags, and flag choices such as `--class high`), never a list kept by hand. Where a
job id goes (`job`, `cancel`, `watch`, `update`, `--job`) it offers the cell's jobs,
where a pod goes (`pod`, `block`, `--pod`) its pods, after `logs` the stack's
processes: asked of the stack the command would use, in at most NAMES_TIMEOUT_S.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable

BASH = """\
_lightpath_complete() {
    local cur="${COMP_WORDS[COMP_CWORD]}"
    local IFS=$'\\n'
    COMPREPLY=($(compgen -W "$(lightpath __complete "${COMP_WORDS[@]:1:COMP_CWORD-1}" \
2>/dev/null)" -- "$cur"))
}
complete -o default -F _lightpath_complete lightpath
"""

ZSH = "autoload -U +X bashcompinit && bashcompinit\n" + BASH

FISH = """\
function __lightpath_complete
    set -l words (commandline -opc)
    lightpath __complete $words[2..-1] 2>/dev/null
end
complete -c lightpath -f -a '(__lightpath_complete)'
"""

SCRIPTS = {"bash": BASH, "zsh": ZSH, "fish": FISH}
NAMES_TIMEOUT_S = 2.0
# Which names go where: a positional argument's or a flag's dest.
JOB_DESTS = {"job_id", "job"}
POD_DESTS = {"pod_id", "pod"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("completion", help="print a shell completion script (bash, zsh or fish)")
    p.add_argument("shell", choices=sorted(SCRIPTS), help="the shell to complete in")
    p.set_defaults(func=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    print(SCRIPTS[args.shell], end="")
    return 0


def candidates(
    parser: argparse.ArgumentParser,
    words: list[str],
    names: Callable[[str], list[str]] | None = None,
) -> list[str]:
    """What may come after `words`: the subcommands and flags of the command they reach,
    the choices of the flag they end with, or (`names(dest)`) the jobs, pods or
    processes that fit the argument that comes next."""
    names = names or stack_names
    positionals = 0
    skip = False
    for word in words:
        sub = _subcommands(parser)
        if skip:
            skip = False
        elif word in sub:
            parser, positionals = sub[word], 0
        elif word.startswith("-"):
            action = parser._option_string_actions.get(word)
            skip = action is not None and action.nargs != 0
        else:
            positionals += 1
    if words:
        last = parser._option_string_actions.get(words[-1])
        if last is not None and last.nargs != 0:
            if last.choices:
                return [str(c) for c in last.choices]
            if last.dest == "output":
                from lightpath.cli._common import OUTPUT_FORMATS

                return [*OUTPUT_FORMATS[:-1], "jsonpath="]
            return names(last.dest)
    out = [name for name in _subcommands(parser) if not name.startswith("__")]
    args = [
        a
        for a in parser._actions
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction)
    ]
    if positionals < len(args):
        out += names(args[positionals].dest)
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        out += [o for o in action.option_strings if o.startswith("--")]
    return out


def stack_names(dest: str) -> list[str]:
    """The job ids, pod ids or process names that fit the argument `dest`, from the stack
    the command would use ([] when none answers in NAMES_TIMEOUT_S)."""
    if dest not in JOB_DESTS | POD_DESTS | {"process"}:
        return []
    from lightpath.stack import DEFAULT_PORT_FALLBACK, running_stack

    if dest == "process":
        stack = running_stack()
        if stack is None:
            return []
        return [*sorted(stack.endpoints), *(["console"] if stack.console else [])]
    DEFAULT_PORT_FALLBACK.append(False)  # never a guessed port
    try:
        return asyncio.run(asyncio.wait_for(_cell_names(dest), NAMES_TIMEOUT_S))
    except Exception:
        return []
    finally:
        DEFAULT_PORT_FALLBACK.pop()


async def _cell_names(dest: str) -> list[str]:
    from lightpath.sdk.cell import AsyncCell

    async with AsyncCell(timeout=NAMES_TIMEOUT_S, max_attempts=1) as cell:
        if dest in POD_DESTS:
            return sorted(p.registration.pod_id for p in await cell.pods())
        page = await cell.list_jobs_page(page_size=500)
        return [j.job_id for j in page.jobs]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def complete(parser: argparse.ArgumentParser, words: list[str]) -> int:
    """`lightpath __complete WORD...` (what the script calls; main() answers it before
    parsing, since the words are a half-typed command line): one candidate a line."""
    sys.stdout.write("".join(c + "\n" for c in candidates(parser, words)))
    return 0
