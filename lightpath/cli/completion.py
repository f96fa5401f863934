"""`lightpath completion bash|zsh`: shell completion of commands, flags and their choices.

    source <(lightpath completion bash)      # ~/.bashrc
    source <(lightpath completion zsh)       # ~/.zshrc

The script asks `lightpath __complete WORD...` for the candidates after the words
typed so far, so completion follows the parser itself (every topic's commands,
flags, and flag choices such as `--class high`), never a list kept by hand.
"""

from __future__ import annotations

import argparse
import sys

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


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("completion", help="print a shell completion script (bash or zsh)")
    p.add_argument("shell", choices=["bash", "zsh"], help="the shell to complete in")
    p.set_defaults(func=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    print(BASH if args.shell == "bash" else ZSH, end="")
    return 0


def candidates(parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
    """What may come after `words`: the subcommands and flags of the command they reach,
    or the choices of the flag they end with."""
    for word in words:
        sub = _subcommands(parser)
        if word in sub:
            parser = sub[word]
    if words:
        last = parser._option_string_actions.get(words[-1])
        if last is not None and last.nargs != 0:
            return [str(c) for c in last.choices or ()]
    out = [name for name in _subcommands(parser) if not name.startswith("__")]
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        out += [o for o in action.option_strings if o.startswith("--")]
    return out


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
