from __future__ import annotations

import argparse

import pytest

from lightpath.cli import build_parser, main
from tests.helpers import PATENT_REFERENCE


def test_help_lists_the_stack_commands(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for command in ("up", "status", "demo"):
        assert command in out


def test_status_without_a_stack_says_so(tmp_path, capsys):
    assert main(["status", "--state-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"no stack at {tmp_path} (--state-dir); start one with `lightpath up`" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["--as", "acme", "jobs"],
        ["jobs", "--as", "acme"],
        ["submit", "j1", "--shape", "4x4x4", "--as", "acme"],
        ["tenant", "list", "--as", "acme"],
        ["agg", "topology", "--as", "acme"],
    ],
)
def test_as_is_global_before_or_after_the_command(argv):
    assert build_parser().parse_args(argv).as_identity == "acme"


def test_without_as_there_is_no_identity():
    assert build_parser().parse_args(["jobs"]).as_identity is None
    # given before the command and not after, the subcommand keeps it
    assert build_parser().parse_args(["--as", "beta", "tenant", "list"]).as_identity == "beta"


def test_help_names_the_identity_settings(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for name in (
        "--as IDENTITY",
        "LIGHTPATH_TLS_CA",
        "LIGHTPATH_TOKEN_FILE",
        "LIGHTPATH_STATE_DIR",
    ):
        assert name in out
    for command in ("tenant", "token", "audit", "whoami"):
        assert command in out


def test_with_nothing_listening_the_error_names_the_address_its_setting_and_lightpath_up(
    monkeypatch, capsys
):
    from lightpath.embedded_redis import free_port

    address = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("LIGHTPATH_CELL_ADDR", address)
    assert main(["jobs"]) == 1
    err = capsys.readouterr().err
    assert err.count("error: UNAVAILABLE") == 1
    assert f"next: nothing answers at {address}, taken from LIGHTPATH_CELL_ADDR\n" in err
    assert "next: start a local stack with `lightpath up`" in err


def test_the_default_address_says_where_it_came_from(tmp_path, monkeypatch):
    from lightpath.stack import located

    monkeypatch.delenv("LIGHTPATH_CELL_ADDR", raising=False)
    address, source = located("cell-scheduler", "LIGHTPATH_CELL_ADDR", tmp_path)
    assert address == "127.0.0.1:50051"
    assert source == (
        f"the local stack's default port: no stack is running in {tmp_path} "
        "and LIGHTPATH_CELL_ADDR is unset"
    )
    monkeypatch.setenv("LIGHTPATH_CELL_ADDR", "cell.example:443")
    assert located("cell-scheduler", "LIGHTPATH_CELL_ADDR", tmp_path) == (
        "cell.example:443",
        "LIGHTPATH_CELL_ADDR",
    )


def _arguments(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, what, help text) of every command and argument, at every depth."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield (*path, choice.dest), "command", choice.help
            for name, child in action.choices.items():
                yield from _arguments(child, (*path, name))
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield path, "/".join(action.option_strings) or action.dest, action.help


def test_every_argument_has_help_and_no_help_cites_the_patents():
    seen = list(_arguments(build_parser()))
    assert len(seen) > 200  # every command of every topic was walked
    missing = [(" ".join(p), what) for p, what, text in seen if not text]
    assert missing == []
    cited = [
        (" ".join(p), what, text)
        for p, what, text in seen
        if text and text != argparse.SUPPRESS and PATENT_REFERENCE.search(text)
    ]
    assert cited == []


def test_completion_follows_the_parser(capsys):
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert "complete -o default -F _lightpath_complete lightpath" in script
    assert "lightpath __complete" in script
    assert main(["completion", "zsh"]) == 0
    assert capsys.readouterr().out.startswith("autoload -U +X bashcompinit")

    def complete(*words: str) -> list[str]:
        assert main(["__complete", *words]) == 0
        return capsys.readouterr().out.splitlines()

    top = complete()
    assert {"submit", "jobs", "cores", "agg", "completion", "--as"} <= set(top)
    assert "__complete" not in top
    assert {"reserve", "extend", "release", "list"} <= set(complete("cores"))
    assert {"--all", "--page-token", "--output", "--no-headers", "--state"} <= set(complete("jobs"))
    assert complete("submit", "j1", "--class") == ["high", "low", "medium"]
    assert complete("jobs", "-o") == ["table", "wide", "json", "yaml", "name", "jsonpath="]
    assert complete("-o", "yaml", "job", "-o") == complete("jobs", "-o")
    assert main(["completion", "fish"]) == 0
    assert "complete -c lightpath -f -a '(__lightpath_complete)'" in capsys.readouterr().out
    assert {"--all", "--page-token"} <= set(complete("--as", "acme", "cores", "list"))


def test_up_on_a_taken_port_fails_at_once_naming_the_port_and_its_holder(tmp_path, capsys):
    import os
    import socket

    from lightpath.stack import ProcessSpec, Stack, StackError

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        stack = Stack(
            tmp_path,
            specs=[ProcessSpec("cell-scheduler", "cell_scheduler", port)],
            redis_port=0,
            log=lambda *_: None,
        )
        with pytest.raises(StackError) as err:
            stack.start()
    message = str(err.value)
    assert f"port {port} (cell-scheduler) is held by pid {os.getpid()} (" in message
    assert "`lightpath up --ephemeral-ports`" in message
    assert not (tmp_path / "logs").exists()  # nothing was started


def test_one_spelling_per_value_in_the_cli_and_the_console():
    """Issue 33: a value reads the same in a table, a message and the console (the enum's
    name without its prefix), and the aggregation commands no longer say state_running."""
    from lightpath.cli._common import short_name
    from lightpath.sdk.cell import job_state, state_name
    from lightpath.v1 import agg_switch_pb2, cell_scheduler_pb2, common_pb2
    from services.console.views import enum_name

    for enum, prefix in (
        (common_pb2.JobState, "JOB_STATE_"),
        (common_pb2.FabricKind, "FABRIC_KIND_"),
        (cell_scheduler_pb2.PodStatus, "POD_STATUS_"),
        (agg_switch_pb2.AggNodeKind, "AGG_NODE_KIND_"),
        (agg_switch_pb2.AggCommandState, "AGG_COMMAND_STATE_"),
    ):
        for value in enum.values():
            assert short_name(enum, value) == enum_name(enum, value, prefix)
    assert short_name(agg_switch_pb2.AggNodeKind, agg_switch_pb2.AGG_NODE_KIND_SWITCH) == "SWITCH"
    assert state_name(common_pb2.JOB_STATE_RUNNING) == "RUNNING"
    assert job_state("running") == job_state("RUNNING") == common_pb2.JOB_STATE_RUNNING
